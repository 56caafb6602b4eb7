"""Token rows scattered into FC1's tile-blocked B (RowScatter), so the GEMM loads a tile's
(token tile, K-tile) B operand with two bulk copies.

    blocked[t, kt] (bn x 128 bf16) = two halves of 64 columns, each bn rows of 128 bytes;
    token n's 16-byte chunk c (columns 8c .. 8c + 7 of the half) at byte
    h * bn * 128 + n * 128 + (c ^ (n % 8)) * 16,

the order a 128B-swizzled wgmma descriptor reads from a 1024-byte aligned stage, with the
tile's first n tokens in the first n rows of each half (a partly filled tile copies only its
MMA width). Columns past the real K are written as zeros (they meet zero-padded weights, and
0 x garbage could be NaN). Token slots past a tile's pairs are not written: a token slot is one
MMA column, so whatever they hold reaches only output columns that FC1 never stores.

Source-major: a warp takes one source row (a token, or in w4a4 a routed pair's quantized
row), loads it once and stores it to each routed copy's slot (the routing's slots table). The
tile-major gather it replaced (one CTA per (tile, K-tile) block into token-group-major core
matrices) read each pair's 256 bytes of a K-tile from L2 in 64-byte pieces; it took 118.5 us
at Qwen3-30B-A3B T=8192 against this kernel's 93.9 (DeepSeek-V3: 486.3 against 350.7; both
run on one routing at 9de5e42 for d02a8c7, benchmarks/HISTORY.md). This one reads 1/k of the
bytes; its stores, whole 128-byte lines scattered over the blocks, write at ~2.9 TB/s.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from moe_common.cute import jit, ptx

from moe_common.fragments import TILE_K

SCATTER_WARPS = 8
SEG = 8  # 16-byte chunks per lane per pass: a warp moves 4 KiB of its row per pass


class RowScatter:
    """blocked (the module's layout) <- src rows: row r to each slot slots[r * copies + j]
    (tile * bn + n; -1: that copy is routed elsewhere). A warp per row loads it 512 contiguous
    bytes per instruction and stores it one whole 128-byte line per 8 lanes. The stores are
    plain, not streaming (st.cs allocates its lines evict-first): FC1 reads the blocks next,
    and with the weights' copies evict-first (ptx.BulkCopy) they can wait for it in L2."""

    def __init__(self, bn: int):
        self.bn = bn

    @cute.jit
    def __call__(self, src: Int64, src_stride: Int32, k_real: Int32, rows: Int32, copies: Int32,
                 slots: Int64, blocked: Int64, k_tiles: Int32, stream):
        self.kernel(src, src_stride, k_real, rows, copies, slots, blocked, k_tiles).launch(
            grid=[(rows + SCATTER_WARPS - 1) // SCATTER_WARPS, 1, 1],
            block=[32 * SCATTER_WARPS, 1, 1], stream=stream, use_pdl=jit.PDL)

    @cute.kernel
    def kernel(self, src: Int64, src_stride: Int32, k_real: Int32, rows: Int32, copies: Int32,
               slots: Int64, blocked: Int64, k_tiles: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        ptx.grid_dependency_wait()  # first: see jit.PDL
        bidx, _, _ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        row = bidx * SCATTER_WARPS + warp
        if row < rows:
            slot = Int32(-1)
            if lane < copies:
                slot = ptx.ld_u32(slots + (Int64(row) * Int64(copies) + Int64(lane)) * 4)
            chunks = k_tiles * (TILE_K // 8)
            src_row = src + Int64(row) * Int64(src_stride) * 2
            # a warp instruction covers 32 chunks = 2 K-tiles: lanes 0-7 and 16-23 the first
            # half of K-tile 2i and 2i + 1, lanes 8-15 and 24-31 the second
            half = (lane // 8) % 2
            c8 = lane % 8
            for s0 in cutlass.range(0, chunks, 32 * SEG, unroll=1):
                vals = []
                for i in cutlass.range_constexpr(SEG):
                    q = s0 + i * 32 + lane
                    v0, v1, v2, v3 = Int32(0), Int32(0), Int32(0), Int32(0)
                    if q * 8 < k_real:
                        v = ptx.ld_v4(src_row + Int64(q) * 16)
                        v0, v1, v2, v3 = v[0], v[1], v[2], v[3]
                    vals.append((v0, v1, v2, v3))
                for j in cutlass.range(copies, unroll=1):
                    sl = cute.arch.shuffle_sync(slot, j)
                    if sl >= 0:
                        t = sl // self.bn
                        n = sl % self.bn
                        line = blocked + Int64(t) * Int64(k_tiles) * (self.bn * TILE_K * 2) \
                            + Int64(half * self.bn * 128 + n * 128 + ((c8 ^ (n % 8)) * 16))
                        for i in cutlass.range_constexpr(SEG):
                            q = s0 + i * 32 + lane
                            if q < chunks:
                                kt = q // (TILE_K // 8)
                                ptx.st_v4(line + Int64(kt) * (self.bn * TILE_K * 2), *vals[i])
