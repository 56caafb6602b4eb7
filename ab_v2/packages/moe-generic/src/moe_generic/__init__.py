"""moe-generic: the fused MoE CuTe DSL kernel for every case, on Hopper (sm_90a).

Callable directly when the package is installed alone:

    from moe_generic import fused_moe
    out = fused_moe(x, weights, topk_weights, topk_ids, activation="silu")
"""
from __future__ import annotations

from moe_common.kernel_package import direct_call

from .limits import KERNEL_NAME, unsupported_reason

fused_moe = direct_call(KERNEL_NAME, unsupported_reason, "moe_generic.runner")

__all__ = ["fused_moe", "KERNEL_NAME"]
