"""What moe-gated supports and when it bids (no DSL import here)."""
from __future__ import annotations

from moe_common.kernel_package import dims_reason, hopper_reason, size_reason
from moe_common.types import PRIORITY_GATED, PRIORITY_GENERIC

KERNEL_NAME = "moe-gated"
# FC1's activations: gated ones pair gate and up rows in one fragment; relu2 takes its rows as
# intermediate columns (moe_common.packed)
ACTIVATIONS = ("silu", "gelu_tanh", "swigluoai", "relu2")
MAX_TOP_K = 32
MAX_LOCAL_EXPERTS = 1024  # the shared routing kernel's limit (one thread per expert)
MAX_TOKENS = 65536
# H and I: multiples of 128 run natively, other multiples of 32 are zero-padded (FC2's paired y
# order, moe_common.cute.topk_reduce, needs H a multiple of 32 with the tall geometry)
DIM_MULTIPLE = 32
# Mean routed rows per local expert (T * top_k / E) from which moe-gated bids above moe-generic.
# Below 256 rows per expert its tiles are 128 tokens wide (MMA 32..128 wide, the tall geometry);
# below a tile or so per expert moe-generic's narrow tiles win. Measured on the H200
# (BENCHMARKS.md, commit 1ed3350), moe-gated against moe-generic:
# at 4-8 rows 47-105% slower (every gated preset at T=128); at 16 rows 9-23% slower (T=512); at
# 64-128 rows 1.30-1.49x faster (T=2048). relu2 layers take the same cutover: nemotron-relu2 at
# ded395c, 24 rows (T=512) 493.4 against 387.3 us, 48 rows (T=1024) 550.2 against 617.0
# (benchmarks/2026-12-02-h200-ded395c-relu2.json).
CUTOVER_ROWS_PER_EXPERT = 32
# At 32 rows the winner depends on the expert's size, once moe-generic's 32-token tiles stream
# through a producer warp (256bc33, `fused-moe bench --tokens 512 1024 --kernels moe-generic
# moe-gated`, benchmarks/2026-12-02-h200-256bc33-cutover.json), moe-gated against moe-generic:
# DeepSeek-V3 (H x I = 14.7M) 3922.3 against 3814.5 us, gpt-oss-120b (8.3M) 1159.0 against
# 1114.1, Qwen3-30B-A3B (1.6M) 251.9 against 250.9, Qwen3.5-35B (1.0M) 347.8 against 360.1.
# Long K loops amortize moe-generic's per-CTA pipeline fill; short ones favour moe-gated's
# persistent tiles. So experts of at least LARGE_EXPERT_ELEMENTS weights per matrix cut over at
# 48 rows, where nemotron-relu2 (5.0M) already runs moe-gated 11% faster (above).
LARGE_EXPERT_ELEMENTS = 4 * 2**20
LARGE_EXPERT_CUTOVER_ROWS = 48

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


def cutover_rows(shape) -> int:
    """Mean routed rows per local expert from which moe-gated bids above moe-generic."""
    if shape.hidden * shape.intermediate >= LARGE_EXPERT_ELEMENTS:
        return LARGE_EXPERT_CUTOVER_ROWS
    return CUTOVER_ROWS_PER_EXPERT


def priority(shape) -> int:
    """Above moe-generic once experts get about a tile of rows each; below it for small batches
    (moe-static, when it bids high, is above both)."""
    rows_per_expert = shape.tokens * shape.top_k / max(1, shape.num_local_experts)
    if rows_per_expert >= cutover_rows(shape):
        return PRIORITY_GATED
    return PRIORITY_GENERIC - 2
