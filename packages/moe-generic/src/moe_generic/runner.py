"""Host side of moe-generic: weight preparation, compile cache and the layer call.

A call is: routing (one CuTe DSL kernel) -> [w4a4: NVFP4/MXFP4 quantization of the routed
token rows, torch ops] -> FC1 grouped GEMM (+ activation) -> [w4a4: quantization of the
intermediate, torch ops] -> FC2 grouped GEMM (+ router weight) into y[pair, H] bf16 -> top-k
reduce (CuTe DSL, fixed order, fp32 sum) -> bf16 out.
Every step is asynchronous on the current stream; nothing syncs with the host, so the call can
be captured in a CUDA graph once its kernels are compiled and its workspace allocated.
"""
from __future__ import annotations

import math

import torch

from moe_common.cute import jit
from moe_common.fragments import TILE_K
from moe_common.kernel_package import (
    call_facts, route_pairs, router_weights, w4a4_fc1_rows, w4a4_requantize_intermediate,
)
from moe_common.types import Activation
from moe_common.weights import MoEWeights

from . import compile_cache
from .compile_cache import BN_CHOICES
from .grouped_gemm import INTERMEDIATE_ROW, SMEM_ROW_BYTES, Y_BLOCK, GemmOperands
from .limits import KERNEL_NAME

# Mean routed rows per expert from which the tiles are 64 tokens wide; from MID_MIN_ROWS they
# are 48 wide, below it 32, whatever the rows. The 32- and 48-token tiles stream by bulk copies
# (compile_cache: the producer warp), which the narrower and wider tiles do not; at 2 to 24 rows
# per expert on the five presets the 32-token tiles ran fastest of every width at all points but
# one (Qwen3.5-35B T=64, 2 rows, which moe-static takes: 135.9 against 130.5 us at 8). Measured
# on the H200 at 2d9a234, each width forced (`tools/band_probe.py --bn 8 16 32`, BENCHMARKS.md
# "Measured decisions"): DeepSeek-V3 T=128 (4 rows) 1638.3 us at 32 against 1893.2 at 8, T=64
# (2 rows) 1408.3 against 1595.1; nemotron-relu2 T=128 (6 rows) 229.7 against 268.2. A tile
# skips the MMAs and copies of its empty columns (GemmConfig.live_widths), so a 32-token tile
# with 4 live rows costs about an 8-token one.
# At ~32 rows half the experts overflow a 32-token tile, and the second tile decodes the
# expert's weights again; one 48-token tile decodes them once. Each width forced at 32 rows
# (`tools/gpu_steps.sh mid-widths`, ea2bbc3 + the 48-token producer): 48 against 32, us,
# DeepSeek-V3 T=1024 3274.4 / 3574.8, Qwen3-30B-A3B T=512 222.3 / 232.2, Qwen3.5-35B T=1024
# 321.5 / 330.3, gpt-oss-120b T=1024 968.8 / 1035.6; at 24 rows (nemotron-relu2 T=512) 363.2
# against 346.2 and at 16 rows 7-11% slower. MID_MIN_ROWS lies between 24 and 32, where the
# share of experts past 32 rows grows from ~5% to ~50% (unmeasured between).
WIDE_MIN_ROWS = 64
MID_MIN_ROWS = 28


def pick_bn(pairs: int, experts: int) -> int:
    """Tokens per tile: 32, 48 from MID_MIN_ROWS mean routed rows per expert, 64 from
    WIDE_MIN_ROWS.

    `experts` is the layer's expert count over all ranks: under uniform routing each expert gets
    pairs / experts routed rows, and on an expert-parallel slice the routes to other ranks'
    experts are dropped, so counting only the local experts would double a 2-rank slice's
    mean and pick too wide a tile.
    """
    mean = pairs / max(1, min(experts, pairs))
    if mean >= WIDE_MIN_ROWS:
        return 64
    return 48 if mean >= MID_MIN_ROWS else 32


def max_tiles_bound(pairs: int, local_experts: int, bn: int) -> int:
    """Host-side bound on the device-side tile count: sum over non-empty experts of
    ceil(c / bn) <= ceil(P / bn) + (number of non-empty experts)."""
    return -(-pairs // bn) + min(pairs, local_experts)


def tiles_capacity(pairs: int, local_experts: int) -> int:
    """Tile-table entries to allocate for P pairs: >= max_tiles_bound for every bn, and
    non-decreasing in P (so buffers sized at the largest T serve every smaller T)."""
    return max_tiles_bound(pairs, local_experts, BN_CHOICES[0])


def requantize_blocks(inter, requantize):
    """requantize(rows) in place on the intermediate's rows [P, Ip], which lie in K-tile blocks
    [Ip / TILE_K, P, INTERMEDIATE_ROW]: on a row-major copy written back into the blocks, or
    where Ip is one K-tile on a view of them (`reshape` gives one there, and copying a view
    back onto itself is an overlapping copy, which torch refuses: found by
    dispatcher/tests/test_properties.py at H = 32, w4a4)."""
    kt, P, _ = inter.shape
    blocks = inter[:, :, :TILE_K]
    rows = blocks.permute(1, 0, 2).reshape(P, kt * TILE_K)
    requantize(rows)
    if rows.untyped_storage().data_ptr() != inter.untyped_storage().data_ptr():
        blocks.copy_(rows.view(P, kt, TILE_K).permute(1, 0, 2))


def run(x, weights: MoEWeights, topk_weights, topk_ids, *, activation: Activation,
        quant_mode: str = "w4a16", out=None, workspace=None, deterministic: bool = True):
    """The layer call: 4 launches in w4a16 (routing, FC1, FC2, top-k reduce; the routing is 3
    past 8192 routed pairs), all on the current stream, no host sync. Always deterministic
    (`deterministic` is accepted for the common runner signature): each output element has one
    writer and a fixed summation order."""
    prep, T, k, P, E, off, bufs, stream, ids = call_facts(KERNEL_NAME, x, weights, topk_ids,
                                                          workspace)
    dev = x.device
    H, Hp, Ip = prep.hidden, prep.hidden_padded, prep.intermediate_padded
    idb = ids.element_size()
    bn = pick_bn(P, weights.num_experts)
    max_tiles = max_tiles_bound(P, E, bn)
    if max_tiles > 65535:
        raise ValueError(f"topk_ids: {max_tiles} tiles exceed the grid limit 65535")

    # 1. routing tables on the device
    # The tile table is sized by the smallest tile width, not this call's: max_tiles is not
    # monotone in P (it drops where a larger bn starts), and a workspace warmed at one T must
    # hold every smaller T.
    routed = route_pairs(bufs, ids, off, E, bn, tiles_capacity(P, E), stream)
    order = routed.order
    # w4a16: FC2 starts beside FC1's last CTAs, waiting per token tile for FC1's count of its
    # CTAs (GemmConfig.overlap, at the widths with the bulk producer); in w4a4 the
    # intermediate's requantization runs between them. The router weights are made before FC1
    # (a copy where the caller's are not fp32), so no other kernel runs between FC1 and FC2.
    overlap = quant_mode == "w4a16"
    route_w = router_weights(topk_weights)
    tile_done = bufs.get("tile_done", (tiles_capacity(P, E),), torch.int32, zeroed=True)

    # 2. FC1 (+ activation) -> intermediate [Ip / 128, P, INTERMEDIATE_ROW] bf16 in sorted order
    # (grouped_gemm.INTERMEDIATE_ROW: K-tile blocks of padded rows, so that FC2 copies a tile's
    # rows of a K-tile in one run)
    if quant_mode == "w4a4":
        # one quantized row per routed pair (each pair uses its expert's global scale)
        src, row_div = w4a4_fc1_rows(x, weights, ids, bufs.get("xq", (P, H), torch.bfloat16)), 1
    else:
        src, row_div = x, k
    inter = bufs.get("inter", (Ip // TILE_K, P, INTERMEDIATE_ROW), torch.bfloat16)
    inter_kt_bytes = P * SMEM_ROW_BYTES
    limit = activation.limit if activation.limit is not None else math.inf
    cfg1, fc1 = compile_cache.get("fc1", weights.weight_format, activation.name, bn,
                                  prep.fc1_rows, Hp // TILE_K, k_tail=H != Hp, overlap=overlap)
    cfg2, fc2 = compile_cache.get("fc2", weights.weight_format, "none", bn, prep.fc2_rows,
                                  Ip // TILE_K, overlap=overlap)
    if cfg1.overlap != cfg2.overlap:  # one counting without the other: a hang or stale counts
        raise ValueError(f"moe-generic: FC1 and FC2 disagree on the overlap ({cfg1}, {cfg2})")
    fc1_row_tiles = prep.fc1_rows // cfg1.cta_rows
    fc1(jit.operands(GemmOperands, records=prep.w13.data_ptr(),
                     gscale=prep.fc1_alpha[quant_mode].data_ptr(), bias=prep.w13_bias.data_ptr(),
                     **routed.tile_operands, row_div=row_div, src=src.data_ptr(),
                     src_stride=src.stride(0), src_kt_bytes=TILE_K * 2, k_real=H,
                     k_tiles=Hp // TILE_K, row_groups=prep.fc1_rows // 16, out=inter.data_ptr(),
                     out_stride=INTERMEDIATE_ROW, out_kt_bytes=inter_kt_bytes, out_rows=Ip,
                     pair_orig=0, route_w=0, act_alpha=activation.alpha,
                     act_beta=activation.beta, act_limit=limit, tile_done=tile_done.data_ptr(),
                     tile_items=fc1_row_tiles),
        fc1_row_tiles, max_tiles, stream)

    if quant_mode == "w4a4":
        requantize_blocks(inter, lambda rows: w4a4_requantize_intermediate(rows, weights, ids,
                                                                           order))

    # 3. FC2 (+ router weight) -> y [P, H] bf16 in original pair order, each row's columns in
    # the paired order of Y_BLOCK (moe_common.cute.topk_reduce)
    y = bufs.get("y", (P, H), torch.bfloat16)
    fc2(jit.operands(GemmOperands, records=prep.w2.data_ptr(),
                     gscale=prep.fc2_alpha[quant_mode].data_ptr(), bias=prep.w2_bias.data_ptr(),
                     **routed.tile_operands, row_div=1, src=inter.data_ptr(),
                     src_stride=INTERMEDIATE_ROW, src_kt_bytes=inter_kt_bytes, k_real=Ip,
                     k_tiles=Ip // TILE_K, row_groups=prep.fc2_rows // 16, out=y.data_ptr(),
                     out_stride=H, out_kt_bytes=0, out_rows=H, pair_orig=order.data_ptr(),
                     route_w=route_w.data_ptr(), act_alpha=1.0, act_beta=1.0, act_limit=math.inf,
                     tile_done=tile_done.data_ptr(), tile_items=fc1_row_tiles),
        prep.fc2_rows // cfg2.cta_rows, max_tiles, stream)

    # 4. out[t] = sum over the top-k in fp32, fixed order, rounded once
    if out is None:
        out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    reduce = jit.topk_reduce(idb, paired=Y_BLOCK, weighted=False)
    reduce(y.data_ptr(), ids.data_ptr(), 0, out.data_ptr(), T, k, H, off, E, stream)
    return out
