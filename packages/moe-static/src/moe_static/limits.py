"""What moe-static supports and when it bids (no DSL import here)."""
from __future__ import annotations

from moe_common.kernel_package import dims_reason, hopper_reason
from moe_common.types import PRIORITY_GENERIC, PRIORITY_STATIC

KERNEL_NAME = "moe-static"
MAX_LOCAL_EXPERTS = 512  # shared-memory routing tables (kernel.MAX_LOCAL_EXPERTS)
MAX_PAIRS = 2048  # routed pairs T * top_k held in shared memory (kernel.MAX_PAIRS)
DIM_MULTIPLE = 32
# When moe-static bids above every kernel: for experts of H x I below SMALL_EXPERT_ELEMENTS up to
# CUTOVER_TOKENS tokens, for larger ones below LARGE_EXPERT_ROWS mean routed rows per expert
# (T * k / E, E all experts: a slice's local experts get the same mean). There the call is a
# fixed latency, which moe-static's single launch hides best; past them moe-generic's bulk-copy
# ring streams as fast or faster. Measured on an H100, each kernel forced in one run of d073081
# (`tools/gpu_steps.sh static-small static-points`,
# benchmarks/2026-12-05-h100-d073081-static-{small,points}.json), moe-static / moe-generic:
# - Qwen3-30B-A3B (1.5M) and Qwen3.5-35B (1.0M): T = 1-8 0.73-1.01 (Qwen3.5-35B T=1 13.2 /
#   18.1, Qwen3-30B-A3B T=8, half a row, 67.8 / 69.8); T=16 1.03 / 1.06, T = 24-64 1.04-1.12
#   (Qwen3-30B-A3B T=32 136.4 / 122.0, Qwen3.5-35B T=64 167.2 / 157.2);
# - gpt-oss-120b (7.9M), nemotron-relu2 (4.8M): T = 1-8 0.96-1.02 (nemotron-relu2 T=4 64.3 /
#   62.9), T=16 1.02 / 1.07; DeepSeek-V3 (14.0M): below a quarter row (T = 1-4) 1.00-1.01, at a
#   quarter (T=8) 1.03 (550.0 / 533.7), from half a row 1.03-1.08;
# - T=128: 1.12-1.51 on all five. The rows rule does not order the small experts (Qwen3-30B-A3B
#   at half a row ahead, Qwen3.5-35B at half a row 6% behind); the token count does.
# On the H200 the T=8 points the H100 finds level are not: moe-generic at f35f74c took 123.3 us
# at gpt-oss-120b and 85.4 at nemotron-relu2 (benchmarks/2026-12-05-h200-f35f74c-auto-all.json),
# moe-static 115.7 / 78.1 at dfc0c62 (its kernel the same but for the weights' L2 policy;
# forced at dbc99f5, 114.6 / 79.3); DeepSeek-V3 370.6 against 389.0 (391.8). Those are other
# runs (one tree's runs differ by 2-3%), but 6-9% apart, so the token rule covers experts up to
# 10M elements (between gpt-oss-120b and DeepSeek-V3) and DeepSeek-V3 keeps the rows rule.
# One H200 run at 3cbddb3 (`tools/gpu_steps.sh dispatch-points`), moe-static / moe-generic at
# T=8: gpt-oss-120b 113.3 / 123.0, nemotron-relu2 76.5 / 83.9, Qwen3.5-35B 40.7 / 40.4,
# Qwen3-30B-A3B 50.4 / 57.3, DeepSeek-V3 385.9 / 369.4; at T=4 DeepSeek-V3 213.5 / 207.8.
CUTOVER_TOKENS = 8
SMALL_EXPERT_ELEMENTS = 10 * 2**20
LARGE_EXPERT_ROWS = 0.25


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
    if shape.hidden * shape.intermediate < SMALL_EXPERT_ELEMENTS:
        highest = shape.tokens <= CUTOVER_TOKENS
    else:
        highest = shape.routed_rows < LARGE_EXPERT_ROWS * max(1, shape.num_experts)
    if highest:
        return PRIORITY_STATIC
    return PRIORITY_GENERIC - 5  # still above the reference, below moe-generic
