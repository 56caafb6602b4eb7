"""What moe-static supports and when it bids (no DSL import here)."""
from __future__ import annotations

from moe_common.kernel_package import dims_reason, hopper_reason
from moe_common.types import PRIORITY_GENERIC, PRIORITY_STATIC

KERNEL_NAME = "moe-static"
MAX_LOCAL_EXPERTS = 512  # shared-memory routing tables (kernel.MAX_LOCAL_EXPERTS)
MAX_PAIRS = 2048  # routed pairs T * top_k held in shared memory (kernel.MAX_PAIRS)
DIM_MULTIPLE = 32
# Routed pairs (T * top_k) up to which moe-static bids above the other kernels. Measured on the
# H200 (BENCHMARKS.md, 2026-11-30 sixth session, d1bf645, T = 1..128): moe-static is ahead of
# moe-generic at Qwen3-30B-A3B T=1 (21.7 vs 24.3 us) and level at DeepSeek-V3 T=2 (142.5 vs
# 143.8), but 3% behind at DeepSeek-V3 T=1 with the same 8 routed pairs (76.7 vs 74.4 us) and
# behind elsewhere; the other presets were last timed on an older moe-static (gpt-oss-120b T=1
# 15% behind). So the measured cutover is 0: it offers below moe-generic and runs only when
# forced (kernel="moe-static"). Raise this when a faster moe-static measures ahead on every preset.
CUTOVER_PAIRS = 0


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
    """Above every kernel while routed pairs are at or below the cutover, else below moe-generic."""
    if shape.tokens * shape.top_k <= CUTOVER_PAIRS:
        return PRIORITY_STATIC
    return PRIORITY_GENERIC - 5  # still above the reference, below moe-generic
