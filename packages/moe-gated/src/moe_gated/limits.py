"""What moe-gated supports and when it bids (no DSL import here)."""
from __future__ import annotations

from moe_common.kernel_package import dims_reason, hopper_reason, size_reason
# FC1's activations (ACTIVATIONS), all of them: gated ones pair gate and up rows in one
# fragment; relu2 takes its rows as intermediate columns (moe_common.packed)
from moe_common.types import ACTIVATIONS, PRIORITY_GATED, PRIORITY_GENERIC

KERNEL_NAME = "moe-gated"
MAX_TOP_K = 32
MAX_LOCAL_EXPERTS = 1024  # the shared routing kernel's limit (one thread per expert)
MAX_TOKENS = 65536
# H and I: multiples of 128 run natively, other multiples of 32 are zero-padded (FC2's paired y
# order, moe_common.cute.topk_reduce, needs H a multiple of 32 with the tall geometry)
DIM_MULTIPLE = 32
# Mean routed rows per local expert (T * top_k / E) from which moe-gated bids above moe-generic.
# Below 256 rows per expert its tiles are 128 tokens wide (MMA 32..128 wide, the tall geometry);
# below about a fifth of a tile per expert moe-generic's narrow tiles win. Measured on the H200,
# each kernel forced in one run of dfc0c62 (`tools/gpu_steps.sh cutover-mid`,
# benchmarks/2026-12-05-h200-dfc0c62-cutover-mid.json), moe-gated's time over moe-generic's
# on the five presets: at 20 rows 1.01-1.08, at 24 rows 0.92-1.00 (DeepSeek-V3 T=768 2339.8
# against 2529.1 us, Qwen3.5-35B T=768 205.8 against 206.4), at 28 rows 0.84-0.92; at 16 rows
# 1.07-1.14 and at 32 rows 0.84-0.90 (7ea0869, `cutover-points`,
# benchmarks/2026-12-05-h200-7ea0869-cutover.json). relu2 layers take the same cutover
# (nemotron-relu2: 1.065 / 0.985 / 0.915 at 20 / 24 / 28 rows). It was 32 until nemotron-relu2
# T=512 (24 rows) ran 3.6% faster on moe-gated (7ea0869), and 48 before moe-gated's producer
# issued its copies from one elected lane (b7f4ca8). Checked again after the weights went
# evict-first in L2 (672f63a; an H100, `cutover-mid` at 436c8c7,
# benchmarks/2026-12-05-h100-436c8c7-cutover-mid-*.json): at 24 rows 0.968-1.026 (Qwen3.5-35B
# T=768 231.8 against 225.8), at 20 rows 1.025-1.070, at 28 rows 0.894-0.992; 28 would give up
# 3.3% at gpt-oss-120b T=768. And after FC2 went beside FC1 (b39fa11; an H100, `cutover-points
# cutover-mid` at e2745f5, benchmarks/2026-12-06-h100-e2745f5-cutover-*.json): at 24 rows
# 0.949-1.014, at 20 rows 1.009-1.048, at 16 rows 1.038-1.071, at 28 rows 0.873-0.967. And
# after moe-generic's FC2 went beside FC1 too (c3c6e9c; an H100, `cutover-mid` at 14ac7c2,
# benchmarks/2026-12-06-h100-14ac7c2-cutover-mid-*.json): at 24 rows 0.949-1.016 (Qwen3-30B-A3B
# T=384 163.5 against 161.0), at 20 rows 1.019-1.072, at 28 rows 0.875-0.984.
CUTOVER_ROWS_PER_EXPERT = 24


def unsupported_reason(shape, activation):
    """None when the kernel can run this call, else a one-line reason."""
    reason = hopper_reason(shape)
    if reason is not None:
        return reason
    if activation.name not in ACTIVATIONS:
        return f"activation {activation.name!r}; allowed: {', '.join(ACTIVATIONS)}"
    reason = dims_reason(shape, DIM_MULTIPLE)
    if reason is not None:
        return reason
    return size_reason(shape, max_top_k=MAX_TOP_K, max_local_experts=MAX_LOCAL_EXPERTS,
                       max_tokens=MAX_TOKENS)


def priority(shape) -> int:
    """Above moe-generic once experts get about a tile of rows each; below it for small batches
    (moe-static, when it bids high, is above both)."""
    rows_per_expert = shape.tokens * shape.top_k / max(1, shape.num_local_experts)
    if rows_per_expert >= CUTOVER_ROWS_PER_EXPERT:
        return PRIORITY_GATED
    return PRIORITY_GENERIC - 2
