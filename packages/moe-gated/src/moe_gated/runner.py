"""Host side of moe-gated: routing, the two persistent grouped GEMMs, the top-k reduce.

A call is: routing into tiles of the chosen geometry's width (moe_common's routing kernel) ->
[w4a4: quantized token rows] -> token rows scattered into tile-blocked B -> FC1 + activation
(persistent, queue-driven), writing the intermediate tile-blocked -> [w4a4: requantized
intermediate] -> FC2 into y [T * k, H] bf16 -> fixed-order top-k reduce with the router weights
-> bf16 out. Every step is asynchronous on the current stream and nothing syncs with the host,
so the call can be captured in a CUDA graph once compiled and its workspace allocated. The work
queues' counters are zeroed once at allocation and left at zero by every launch.
"""
from __future__ import annotations

import math

import torch

from moe_common.cute import jit
from moe_common.fragments import TILE_K
from moe_common.formats import get_format
from moe_common.kernel_package import (
    call_facts, quantize_rows, route_pairs, router_weights, w4a4_fc1_rows,
)
from moe_common.types import Activation
from moe_common.weights import MoEWeights

from . import compile_cache
from .kernel import GEOMETRIES, GatedOperands, row_tile, y_block
from .limits import KERNEL_NAME

# Mean routed pairs per local expert from which the wide geometry (288-token tiles) is used.
# Measured on the H200 (BENCHMARKS.md, 1ed3350), each geometry forced, wide
# against tall: at 256 pairs per expert 2.5-7% faster (Qwen3-30B-A3B T=4096, DeepSeek-V3 and
# gpt-oss-120b T=8192); at 128, 1-3% slower (DeepSeek-V3, gpt-oss-120b T=4096, Qwen3-30B-A3B
# T=2048); at 64, 24-26% slower (DeepSeek-V3, gpt-oss-120b T=2048).
WIDE_MIN_PAIRS_PER_EXPERT = 256


def geometry_for(pairs: int, local_experts: int) -> str:
    return "wide" if pairs >= WIDE_MIN_PAIRS_PER_EXPERT * local_experts else "tall"


def tiles_capacity(pairs: int, local_experts: int, bn: int) -> int:
    """Bound on the routing's tile count (sum over experts of ceil(c / bn)); grows with P."""
    return -(-pairs // bn) + min(pairs, local_experts)


def _table_tiles(pairs: int, local_experts: int) -> int:
    """Routing-table tiles, enough for either geometry (the narrower tiles are more), for the
    same reason as _token_slots."""
    return max(tiles_capacity(pairs, local_experts, bn) for bn, _ in GEOMETRIES.values())


def _token_slots(pairs: int, local_experts: int) -> int:
    """Token slots of the tile-blocked buffers, enough for either geometry (a workspace warmed
    at one T may later serve a call that takes the other geometry)."""
    return max(tiles_capacity(pairs, local_experts, bn) * bn for bn, _ in GEOMETRIES.values())


def _persistent_grid(device, max_items: int) -> int:
    # one CTA per SM (each holds ~210 KB of shared memory); never more CTAs than work items
    sms = jit.device_properties(device).multi_processor_count
    return max(1, min(sms, max_items))


def run(x, weights: MoEWeights, topk_weights, topk_ids, *, activation: Activation,
        quant_mode: str = "w4a16", out=None, workspace=None, deterministic: bool = True):
    """The layer call: routing, FC1, FC2, top-k reduce on the current stream, no host sync.
    Always deterministic (each output element has one writer and a fixed summation order)."""
    prep, T, k, P, E, off, bufs, stream, ids = call_facts(KERNEL_NAME, x, weights, topk_ids,
                                                          workspace)
    dev = x.device
    H, Hp, Ip = prep.hidden, prep.hidden_padded, prep.intermediate_padded
    idb = ids.element_size()
    geometry = geometry_for(P, E)
    bn, _ = GEOMETRIES[geometry]
    cap = tiles_capacity(P, E, bn)
    slots = _token_slots(P, E)

    # 1. routing tables: (expert, up to bn sorted pairs) tiles
    table_tiles = _table_tiles(P, E)
    routed = route_pairs(bufs, ids, off, E, bn, table_tiles, stream)
    tiles = routed.tiles
    queues = bufs.get("queues", (2, 2), torch.int32, zeroed=True)
    # w4a16: FC2 starts beside FC1's last items, waiting per token tile for FC1's count of its
    # items (GatedConfig.overlap); in w4a4 the intermediate's requantization runs between them
    overlap = quant_mode == "w4a16"
    tile_done = bufs.get("tile_done", (table_tiles,), torch.int32, zeroed=True)
    fc1_row_tiles = -(-prep.fc1_rows // row_tile(geometry))

    # 2. token rows scattered into tile-blocked B (two bulk copies per tile and K-tile): each
    # token row (w4a4: each pair's quantized row) to its routed copies' token slots
    if quant_mode == "w4a4":
        src = w4a4_fc1_rows(x, weights, ids, bufs.get("xq", (P, H), torch.bfloat16))
        copies = 1
    else:
        src, copies = x, k
    kt1, kt2 = Hp // TILE_K, Ip // TILE_K
    x_blocked = bufs.get("x_blocked", (slots // bn, kt1, bn * TILE_K), torch.bfloat16)
    compile_cache.row_scatter(bn)(src.data_ptr(), src.stride(0), H, src.shape[0], copies,
                                  routed.slots.data_ptr(), x_blocked.data_ptr(), kt1, stream)

    # 3. FC1 + activation -> intermediate, written in FC2's tile-blocked B layout
    inter = bufs.get("inter_blocked", (slots // bn, kt2, bn * TILE_K), torch.bfloat16)
    limit = activation.limit if activation.limit is not None else math.inf
    _, fc1 = compile_cache.get("fc1", weights.weight_format, activation.name, geometry, overlap)
    grid1 = _persistent_grid(dev, cap * fc1_row_tiles)
    fc1(jit.operands(GatedOperands, records=prep.w13.data_ptr(),
                     gscale=prep.fc1_alpha[quant_mode].data_ptr(), bias=prep.w13_bias.data_ptr(),
                     **routed.tile_operands, b_blocked=x_blocked.data_ptr(), k_tiles=kt1,
                     row_groups=prep.fc1_rows // 16, out=inter.data_ptr(), out_stride=kt2,
                     out_rows=Ip, act_alpha=activation.alpha, act_beta=activation.beta,
                     act_limit=limit, queue=queues[0].data_ptr(), grid=grid1,
                     tile_done=tile_done.data_ptr(), tile_items=fc1_row_tiles), stream)

    if quant_mode == "w4a4":
        w4a4_requantize_blocked(inter[:cap], weights, tiles[0][:cap], bn)

    # 4. FC2 -> y [P, H] bf16 in original pair order, each row's columns in the paired order of
    # y_block(geometry) (moe_common.cute.topk_reduce)
    y = bufs.get("y", (P, H), torch.bfloat16)
    _, fc2 = compile_cache.get("fc2", weights.weight_format, "none", geometry, overlap)
    grid2 = _persistent_grid(dev, cap * -(-prep.fc2_rows // row_tile(geometry)))
    fc2(jit.operands(GatedOperands, records=prep.w2.data_ptr(),
                     gscale=prep.fc2_alpha[quant_mode].data_ptr(), bias=prep.w2_bias.data_ptr(),
                     **routed.tile_operands, b_blocked=inter.data_ptr(), k_tiles=kt2,
                     row_groups=prep.fc2_rows // 16, out=y.data_ptr(), out_stride=H, out_rows=H,
                     act_alpha=1.0, act_beta=1.0, act_limit=math.inf,
                     queue=queues[1].data_ptr(), grid=grid2, tile_done=tile_done.data_ptr(),
                     tile_items=fc1_row_tiles), stream)

    # 5. out[t] = sum over the top-k of router weight x y in fp32, fixed order, rounded once
    if out is None:
        out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    route_w = router_weights(topk_weights)
    reduce = jit.topk_reduce(idb, paired=y_block(geometry), weighted=True)
    reduce(y.data_ptr(), ids.data_ptr(), route_w.data_ptr(), out.data_ptr(), T, k, H, off, E,
           stream)
    return out


def swizzled_to_rows(blocked, bn: int):
    """FC1's B layout [tiles, K-tiles, 2 halves x bn tokens x 8 chunks (swizzled) x 8]
    (moe_gated.row_scatter) as rows [tiles * bn, K-tiles * 128] (a copy)."""
    cap, kt, _ = blocked.shape
    v = blocked.view(cap, kt, 2, bn, 8, 8)
    n = torch.arange(bn, device=blocked.device).view(bn, 1)
    c = torch.arange(8, device=blocked.device).view(1, 8)
    phys = (c ^ (n % 8)).view(1, 1, 1, bn, 8, 1).expand(cap, kt, 2, bn, 8, 8)
    return torch.gather(v, 4, phys).permute(0, 3, 1, 2, 4, 5).reshape(cap * bn, kt * TILE_K)


def blocked_to_rows(blocked, bn: int):
    """FC2's B layout [tiles, K-tiles, 2 halves x bn / 8 token groups x 8 chunks x 8 tokens x 8]
    (the intermediate FC1 writes, moe_gated.kernel.HALF_BYTES) as rows [tiles * bn,
    K-tiles * 128] (a copy)."""
    cap, kt, _ = blocked.shape
    return (blocked.view(cap, kt, 2, bn // 8, 8, 8, 8).permute(0, 3, 5, 1, 2, 4, 6)
            .reshape(cap * bn, kt * TILE_K))


def rows_to_blocked(rows, tiles: int, bn: int):
    """Inverse of blocked_to_rows: [tiles * bn, K] rows -> [tiles, K / 128, bn * 128]."""
    kt = rows.shape[1] // TILE_K
    return (rows.reshape(tiles, bn // 8, 8, kt, 2, 8, 8).permute(0, 3, 4, 1, 5, 2, 6)
            .reshape(tiles, kt, bn * TILE_K))


def w4a4_requantize_blocked(inter, weights, tile_expert, bn: int):
    """w4a4 FC2 input: the tile-blocked intermediate requantized in place, row by row, with
    each tile's expert fc2_input_scale (NVFP4). Token slots a tile does not use hold stale
    values; their columns are never stored."""
    cap = inter.shape[0]
    rows = blocked_to_rows(inter, bn)
    gs = None
    if weights.weight_format == "nvfp4":
        e = tile_expert.long().clamp(0, weights.num_local_experts - 1)
        gs = weights.fc2_input_scale.float()[e].repeat_interleave(bn)
    q = quantize_rows(torch.nan_to_num(rows), get_format(weights.weight_format), gs)
    inter.copy_(rows_to_blocked(q, cap, bn))
