"""moe_common: what the fused-MoE packages share.

Problem description (Activation, MoEShape, Offer, Decline), weights (MoEWeights, NVFP4, MXFP4),
workspaces, the fp32 torch reference and input validation.
"""
from .types import Activation, Decline, MoEShape, Offer
from .weights import MoEWeights
from .workspace import Workspace
from .formats import MXFP4, NVFP4
from .reference import reference_moe
from .validation import validate_inputs
from .reference_plugin import hookimpl

__all__ = [
    "Activation",
    "MoEShape",
    "Offer",
    "Decline",
    "MoEWeights",
    "Workspace",
    "NVFP4",
    "MXFP4",
    "reference_moe",
    "validate_inputs",
    "hookimpl",
]
