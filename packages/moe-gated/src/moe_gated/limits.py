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
# below about a quarter tile per expert moe-generic's narrow tiles win. Measured on the H200,
# each kernel forced in one run of fc08658 (`tools/gpu_steps.sh cutover-points`,
# benchmarks/2026-12-04-h200-fc08658-cutover.json), moe-gated's time over moe-generic's: at 16
# rows 1.09-1.16 (DeepSeek-V3, gpt-oss-120b, Qwen3.5-35B), at 24 rows 0.97 (nemotron-relu2
# T=512; one point, within the dispatcher's 3%), at 32 rows 0.84-0.88 on all four presets there
# (DeepSeek-V3 T=1024 2720 against 3112 us), at 48 rows and more 0.51-0.70. relu2 layers take
# the same cutover. It was 48 before moe-gated's producer issued its copies from one elected
# lane (at 32 rows 1.05-1.10, b7f4ca8; 0.88-0.93 at 361f507, just after).
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
