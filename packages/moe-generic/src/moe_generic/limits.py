"""What moe-generic supports, as one function every entry point asks (no DSL import here)."""
from __future__ import annotations

from moe_common.kernel_package import dims_reason, hopper_reason

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
    if shape.top_k > MAX_TOP_K:
        return f"top_k={shape.top_k} exceeds the supported maximum {MAX_TOP_K}"
    if shape.num_local_experts > MAX_LOCAL_EXPERTS:
        return f"{shape.num_local_experts} local experts exceed the supported maximum {MAX_LOCAL_EXPERTS}"
    if shape.tokens > MAX_TOKENS:
        return f"tokens={shape.tokens} exceeds the supported maximum {MAX_TOKENS}"
    return None
