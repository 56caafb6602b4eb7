"""What moe-generic supports, as one function every entry point asks (no DSL import here)."""
from __future__ import annotations

from moe_common.kernel_package import dims_reason, hopper_reason, size_reason

KERNEL_NAME = "moe-generic"
MAX_TOP_K = 32
MAX_LOCAL_EXPERTS = 1024
MAX_TOKENS = 65536
DIM_MULTIPLE = 32  # H and I: multiples of 128 run natively, other multiples of 32 are zero-padded


def unsupported_reason(shape, activation):
    """None when the kernel can run this call, else a one-line reason."""
    reason = hopper_reason(shape)
    if reason is not None:
        return reason
    reason = dims_reason(shape, DIM_MULTIPLE)
    if reason is not None:
        return reason
    return size_reason(shape, max_top_k=MAX_TOP_K, max_local_experts=MAX_LOCAL_EXPERTS,
                       max_tokens=MAX_TOKENS)
