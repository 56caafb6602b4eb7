"""moe-gated: the prefill fused MoE on sm_90a (gated activations silu, gelu_tanh, swigluoai; relu2).

Callable directly when the package is installed alone:

    from moe_gated import fused_moe
    out = fused_moe(x, weights, topk_weights, topk_ids, activation="swigluoai")
"""
from __future__ import annotations

from moe_common.kernel_package import direct_call

from .limits import KERNEL_NAME, unsupported_reason

fused_moe = direct_call(KERNEL_NAME, unsupported_reason, "moe_gated.runner")

__all__ = ["fused_moe", "KERNEL_NAME"]
