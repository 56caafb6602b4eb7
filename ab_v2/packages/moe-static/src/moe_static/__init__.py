"""moe-static: a whole fused MoE layer in one persistent launch, for decode-sized batches (sm_90a).

Callable directly when the package is installed alone:

    from moe_static import fused_moe
    out = fused_moe(x, weights, topk_weights, topk_ids, activation="silu")
"""
from __future__ import annotations

from moe_common.kernel_package import direct_call

from .limits import KERNEL_NAME, unsupported_reason

fused_moe = direct_call(KERNEL_NAME, unsupported_reason, "moe_static.runner")

__all__ = ["fused_moe", "KERNEL_NAME"]
