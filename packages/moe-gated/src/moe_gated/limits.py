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
# 32 rows level (Qwen3-30B-A3B T=512: 278.0 against 277.3 us); at 64-128 rows 1.30-1.49x faster
# (T=2048). The cutover was 48 rows at 05b2530 and 32 since 49e7d0d. relu2 layers take the same
# cutover: nemotron-relu2 at ded395c, moe-gated against moe-generic, 24 rows (T=512) 493.4
# against 387.3 us, 48 rows (T=1024) 550.2 against 617.0
# (benchmarks/2026-12-02-h200-ded395c-relu2.json).
CUTOVER_ROWS_PER_EXPERT = 32


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
