"""moe-static: a whole fused MoE layer in one persistent launch, for decode-sized batches (sm_90a).

Callable directly when the package is installed alone:

    from moe_static import fused_moe
    out = fused_moe(x, weights, topk_weights, topk_ids, activation="silu")
"""
from __future__ import annotations

from moe_common.types import Activation
from moe_common.validation import validate_inputs

from .limits import KERNEL_NAME, unsupported_reason


def fused_moe(x, weights, topk_weights, topk_ids, *, activation="silu", quant_mode="w4a16",
              swiglu_alpha=1.702, swiglu_beta=1.0, swiglu_limit=7.0, out=None, workspace=None,
              deterministic=True):
    """Run the layer with moe-static; ValueError when it cannot (with the reason)."""
    act = activation if isinstance(activation, Activation) else Activation(
        activation, swiglu_alpha, swiglu_beta, swiglu_limit)
    shape = validate_inputs(x, weights, topk_weights, topk_ids, activation=act,
                            quant_mode=quant_mode, out=out)
    reason = unsupported_reason(shape, act)
    if reason is not None:
        raise ValueError(f"{KERNEL_NAME} cannot run this call: {reason}")
    from .runner import run

    return run(x, weights, topk_weights, topk_ids, activation=act, quant_mode=quant_mode,
               out=out, workspace=workspace, deterministic=deterministic)


__all__ = ["fused_moe", "KERNEL_NAME"]
