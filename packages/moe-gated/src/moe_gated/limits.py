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
# below a tile or so per expert moe-generic's narrow tiles win. Measured on the H200, each
# kernel forced in one run of b7f4ca8 (`tools/gpu_steps.sh dispatch-points`,
# benchmarks/2026-12-02-h200-b7f4ca8-cutover.json), moe-gated's time over moe-generic's (whose
# 32-token tiles stream by bulk copies): at 32 rows 1.05-1.10 on all four presets there
# (DeepSeek-V3 3886.2 against 3663.6 us, gpt-oss-120b 1163.9 / 1055.4, Qwen3-30B-A3B 252.6 /
# 235.7, Qwen3.5-35B 349.0 / 333.0); at 48 rows 0.89 (nemotron-relu2 548.5 / 619.5); at 64 rows
# and more 0.59-0.72 on all five. relu2 layers take the same cutover (nemotron-relu2).
CUTOVER_ROWS_PER_EXPERT = 48


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
