"""What moe-static supports and when it bids (no DSL import here)."""
from __future__ import annotations

from moe_common.kernel_package import dims_reason, hopper_reason
from moe_common.types import PRIORITY_GENERIC, PRIORITY_STATIC

KERNEL_NAME = "moe-static"
MAX_LOCAL_EXPERTS = 512  # shared-memory routing tables (kernel.MAX_LOCAL_EXPERTS)
MAX_PAIRS = 2048  # routed pairs T * top_k held in shared memory (kernel.MAX_PAIRS)
DIM_MULTIPLE = 32
# Tokens up to which moe-static bids above the other kernels. Measured on the H200 (BENCHMARKS.md,
# 2026-11-30 eighth session, 1e914f6, same run against moe-generic, T = 1..128, five presets):
# at T=1 moe-static is ahead on every preset (Qwen3-30B-A3B 18.0 vs 24.4 us, Qwen3.5 17.1 vs
# 21.5, Nemotron 24.4 vs 30.3, DeepSeek-V3 73.5 vs 74.7, gpt-oss-120b 36.2 vs 36.7); at T=2 it
# is ahead on four but 12% behind on gpt-oss-120b (56.7 vs 50.6), and from T=4 behind on most.
# A cutover in routed pairs (T x top_k) cannot draw that line: gpt-oss's T=2 is 8 pairs, as is
# the 1.36x win at Qwen3 T=1. So the cutover counts tokens: single-token decode.
CUTOVER_TOKENS = 1


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
