"""What moe-static supports and when it bids (no DSL import here)."""
from __future__ import annotations

from moe_common.kernel_package import dims_reason, hopper_reason
from moe_common.types import PRIORITY_GENERIC, PRIORITY_STATIC

KERNEL_NAME = "moe-static"
MAX_LOCAL_EXPERTS = 512  # shared-memory routing tables (kernel.MAX_LOCAL_EXPERTS)
MAX_PAIRS = 2048  # routed pairs T * top_k held in shared memory (kernel.MAX_PAIRS)
DIM_MULTIPLE = 32
# Tokens up to which moe-static bids above the other kernels. Measured on the H200 (BENCHMARKS.md,
# 2026-11-30 ninth session, edf81db, one run against moe-generic, T = 1..128, five presets,
# static / generic us): at T <= 4 moe-static is ahead on 13 of 15 points (Qwen3.5-35B T=2 20.1 /
# 25.3, T=4 29.4 / 34.5; Qwen3-30B-A3B T=1 17.9 / 24.3) and at most 2.6% behind on the other two
# (gpt-oss-120b T=2 51.6 / 50.3, T=4 81.1 / 80.3); at T=8 it is 0.7-2.8% behind on four of five,
# and further behind from T=16. The cutover counts tokens, not routed pairs: gpt-oss's T=2 is 8
# pairs, as is Qwen3's T=1.
CUTOVER_TOKENS = 4


def unsupported_reason(shape, activation):
    """None when the kernel can run this call, else a one-line reason."""
    reason = hopper_reason(shape)
    if reason is not None:
        return reason
    if shape.quant_mode != "w4a16":
        return f"quant_mode={shape.quant_mode!r} is not supported (w4a16 only; moe-generic runs w4a4)"
    reason = dims_reason(shape, DIM_MULTIPLE)
    if reason is not None:
        return reason
    pairs = shape.tokens * shape.top_k
    if pairs > MAX_PAIRS:
        return f"tokens x top_k = {pairs} routed pairs exceed the supported maximum {MAX_PAIRS}"
    if shape.num_local_experts > MAX_LOCAL_EXPERTS:
        return f"{shape.num_local_experts} local experts exceed the supported maximum {MAX_LOCAL_EXPERTS}"
    return None


def priority(shape) -> int:
    """Above every kernel up to the cutover's tokens, else below moe-generic."""
    if shape.tokens <= CUTOVER_TOKENS:
        return PRIORITY_STATIC
    return PRIORITY_GENERIC - 5  # still above the reference, below moe-generic
