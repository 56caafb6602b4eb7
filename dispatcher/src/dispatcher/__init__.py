"""dispatcher: runs the best installed fused-MoE kernel plugin for each call.

    from dispatcher import fused_moe, explain, FusedMoE

Kernel packages register a module in the entry-point group ``fused_moe.kernels`` that
implements the ``can_handle(shape, activation)`` hook (see ``dispatcher.hookspecs``); the
dispatcher asks them all and runs the highest-priority offer (ties: kernel name). The torch
reference (moe-common) always offers, at the lowest priority.
"""
from moe_common.types import make_activation

from .api import FusedMoE, explain, fused_moe
from .manager import ENV_KERNEL, Answer, Explanation, KernelManager, LoadFailure, get_manager, reload
from .op import fused_moe_op, register_weights
from .options import CallOptions

__all__ = [
    "fused_moe",
    "explain",
    "FusedMoE",
    "fused_moe_op",
    "register_weights",
    "make_activation",
    "CallOptions",
    "Explanation",
    "Answer",
    "LoadFailure",
    "KernelManager",
    "get_manager",
    "reload",
    "ENV_KERNEL",
]
