"""What moe-static supports and when it bids (no DSL import here)."""
from __future__ import annotations

from moe_common.kernel_package import dims_reason, hopper_reason
from moe_common.types import PRIORITY_GENERIC, PRIORITY_STATIC

KERNEL_NAME = "moe-static"
MAX_LOCAL_EXPERTS = 512  # shared-memory routing tables (kernel.MAX_LOCAL_EXPERTS)
MAX_PAIRS = 2048  # routed pairs T * top_k held in shared memory (kernel.MAX_PAIRS)
DIM_MULTIPLE = 32
# When moe-static bids above every kernel: for small experts (H x I below SMALL_EXPERT_ELEMENTS)
# up to CUTOVER_TOKENS tokens or CUTOVER_ROWS_PER_EXPERT mean routed rows per expert (T * k / E,
# E all experts: a slice's local experts get the same mean), for large ones below
# LARGE_EXPERT_ROWS rows per expert. A long weight stream per expert keeps moe-generic's bulk-copy
# ring full (268912f); a short one is latency, which moe-static's fixed grid hides. Measured on
# the H200, each kernel forced in one run of b7f4ca8 (`tools/gpu_steps.sh dispatch-points`,
# benchmarks/2026-12-02-h200-b7f4ca8-static-points.json), moe-static against moe-generic, us:
# - small: Qwen3-30B-A3B (1.6M) T=32 103.0 / 106.9, T=64 (4 rows) 128.1 / 117.7; Qwen3.5-35B
#   (1.0M) T=32 97.4 / 106.3, T=64 (2 rows) 136.7 / 138.0;
# - large, at 1-1.5 rows (T=32): DeepSeek-V3 (14.7M) 1135.8 / 1060.1, gpt-oss-120b (8.3M)
#   322.0 / 311.1, nemotron-relu2 (5.0M) 180.8 / 178.8; at 2-3 rows (T=64) 4-8% behind;
# - T=128 (4-6 rows): behind on all five, 10-48%.
# - large, below one row (T = 8, 16; a run of dbc99f5,
#   benchmarks/2026-12-02-h200-dbc99f5-static-small.json): ahead by 4-20% on gpt-oss-120b and
#   nemotron-relu2, level on DeepSeek-V3 (T=8 391.8 / 396.4; T=16, half a row, 696.8 / 679.5).
CUTOVER_TOKENS = 32
CUTOVER_ROWS_PER_EXPERT = 3
SMALL_EXPERT_ELEMENTS = 4 * 2**20
LARGE_EXPERT_ROWS = 1


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
    """Above every kernel up to the cutovers (see CUTOVER_TOKENS), else below moe-generic."""
    rows_per_expert = shape.tokens * shape.top_k / max(1, shape.num_experts)
    if shape.hidden * shape.intermediate < SMALL_EXPERT_ELEMENTS:
        highest = shape.tokens <= CUTOVER_TOKENS or rows_per_expert <= CUTOVER_ROWS_PER_EXPERT
    else:
        highest = rows_per_expert < LARGE_EXPERT_ROWS
    if highest:
        return PRIORITY_STATIC
    return PRIORITY_GENERIC - 5  # still above the reference, below moe-generic
