"""What moe-static supports and when it bids (no DSL import here)."""
from __future__ import annotations

from moe_common.kernel_package import dims_reason, hopper_reason
from moe_common.types import PRIORITY_GENERIC, PRIORITY_STATIC

KERNEL_NAME = "moe-static"
MAX_LOCAL_EXPERTS = 512  # shared-memory routing tables (kernel.MAX_LOCAL_EXPERTS)
MAX_PAIRS = 2048  # routed pairs T * top_k held in shared memory (kernel.MAX_PAIRS)
DIM_MULTIPLE = 32
# Tokens up to which moe-static bids above the other kernels. Measured on the H200 (BENCHMARKS.md,
# 5b8dce0, one run against moe-generic, T = 1..128, five presets; generic time / static time):
# ahead at every T <= 16 point (1.01-1.54), at T=32 ahead or level on all five (0.99-1.08),
# mixed at T=64 (0.95-1.08), behind on four of five at T=128 (0.87-0.99). Checked again at
# 840fc42: ahead at every T <= 32 point (1.02-1.54), mixed at T=64 (0.99-1.07), behind at T=128
# on all five (0.87-0.99); and at b122685: ahead at every T <= 32 point (1.02-1.56), mixed at
# T=64 (0.99-1.06), behind at T=128 (0.88-0.98). It was 16 at 1ef1a68 (T=32 then 0.97-1.05).
# Past 32 tokens it still bids highest while the experts get few routed rows each (T * k / E,
# E all experts: a slice's local experts get the same mean): at b122685, T=64, with 2 rows per
# expert it was ahead (DeepSeek-V3 1634.9 against 1661.1 us, gpt-oss-120b 460.7 against 488.6,
# Qwen3.5-35B 132.6 against 135.4), at 3 level (nemotron-relu2 232.9 both), from 4 behind
# (Qwen3-30B-A3B T=64 124.7 against 123.2; every preset at T=128, 1.6-14%). Tokens alone left
# gpt-oss-120b T=64 6% slow; routed pairs alone would not separate it (k=4) from Qwen3-30B-A3B
# (k=8) at T=32 and 64. Since moe-generic's 32-token tiles stream by bulk copies, that holds
# only for small experts: at 2d9a234, T=64 (`tools/gpu_steps.sh bulk-band`: moe-generic's
# 32-token tiles forced, moe-static as the dispatcher's choice, one run), moe-generic was ahead
# on DeepSeek-V3 (H x I = 14.7M; 2 rows, 1408.3 against 1515.5 us) and nemotron-relu2 (5.0M; 3
# rows, 211.2 against 221.2), level on gpt-oss-120b (8.3M; 437.8 against 437.0), behind on
# Qwen3.5-35B (1.0M; 2 rows, 135.9 against 128.9): a long weight stream per expert fills the
# bulk-copy ring, a short one is latency, which moe-static's fixed grid hides.
CUTOVER_TOKENS = 32
CUTOVER_ROWS_PER_EXPERT = 3
SMALL_EXPERT_ELEMENTS = 4 * 2**20  # H x I below which CUTOVER_ROWS_PER_EXPERT applies


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
    """Above every kernel up to the cutover's tokens, or for small experts its routed rows per
    expert, else below moe-generic."""
    rows_per_expert = shape.tokens * shape.top_k / max(1, shape.num_experts)
    small = shape.hidden * shape.intermediate < SMALL_EXPERT_ELEMENTS
    if shape.tokens <= CUTOVER_TOKENS or (small and rows_per_expert <= CUTOVER_ROWS_PER_EXPERT):
        return PRIORITY_STATIC
    return PRIORITY_GENERIC - 5  # still above the reference, below moe-generic
