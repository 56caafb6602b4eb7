"""Token rows gathered into moe-gated's tile-blocked B layout, so the GEMM loads a whole
(token tile, K-tile) B operand with one bulk copy.

    blocked[t, kt] (bn x 128 bf16)         = rows src[order[p] // row_div] for p in tile t,
                                             columns kt*128 .. kt*128+127,
    chunk ch (8 columns) of token n at byte (n // 8) * 2048 + ch * 128 + (n % 8) * 16: wgmma's
    K-major core matrices, each 8-token group's 128 columns contiguous (kernel.B_GROUP_BYTES).

Columns past the real K are written as zeros (they meet zero-padded weights, and 0 x garbage
could be NaN). Token slots past a tile's pairs are not written: a token slot is one MMA column,
so whatever they hold reaches only output columns that FC1 and FC2 never store (in an expert's
last tile often half the block: DeepSeek-V3 at T=2048 has ~64 pairs per expert). One CTA per
(tile, K-tile); CTAs of tiles past the device-side tile count return at once.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from moe_common.cute import jit, ptx

from .kernel import B_GROUP_BYTES, TILE_K

THREADS = 256


class TileGather:
    def __init__(self, bn: int):
        self.bn = bn  # tokens per tile
        self.chunks = bn * TILE_K // 8  # 16-byte chunks per block
        assert self.chunks % THREADS == 0
        # a thread's chunk i lies in 8-token group (warp + 8 i) % (bn / 8): with 8 warps its
        # token repeats every bn / 64 chunks, so it loads only that many token ids
        assert THREADS == 256 and bn % 64 == 0

    @cute.jit
    def __call__(self, src: Int64, src_stride: Int32, k_real: Int32, order: Int64, row_div: Int32,
                 tile_start: Int64, tile_end: Int64, num_tiles: Int64, blocked: Int64,
                 k_tiles: Int32, max_tiles: Int32, stream):
        self.kernel(src, src_stride, k_real, order, row_div, tile_start, tile_end, num_tiles,
                    blocked, k_tiles).launch(grid=[k_tiles, max_tiles, 1], block=[THREADS, 1, 1],
                                             stream=stream, use_pdl=jit.PDL)

    @cute.kernel
    def kernel(self, src: Int64, src_stride: Int32, k_real: Int32, order: Int64, row_div: Int32,
               tile_start: Int64, tile_end: Int64, num_tiles: Int64, blocked: Int64, k_tiles: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        ptx.grid_dependency_wait()  # first: see jit.PDL
        kt, t, _ = cute.arch.block_idx()
        if t < ptx.ld_u32(num_tiles):
            p0 = ptx.ld_u32(tile_start + Int64(t) * 4)
            p1 = ptx.ld_u32(tile_end + Int64(t) * 4)
            dst_block = blocked + (Int64(t) * Int64(k_tiles) + Int64(kt)) * (self.chunks * 16)
            # Thread chunk i: c = tidx + i * THREADS, in 8-token group blk = c // 32, token n,
            # 8-column chunk ch; a warp instruction moves 8 tokens x 4 chunks (64 contiguous
            # bytes of each of 8 token rows in, 512 contiguous bytes out). A thread meets only
            # bn / 64 distinct tokens. Every load is issued before the first store: with a
            # chunk's id load, row load and store in turn, each chunk paid two dependent round
            # trips and the gather ran at ~2 TB/s of writes (BENCHMARKS.md, fourteenth session).
            # The row loads are coherent (ld.global), not .nc: ptxas may not move a store above
            # a load that might alias it, so the loads stay batched; with .nc loads it
            # interleaved them with the stores (45 registers, 1-3 loads in flight per thread).
            # Per CTA (one 64 KiB block) the tile bounds and the token ids stay two dependent
            # round trips: 4 K-tiles per CTA, which paid them once for four blocks, measured
            # slower (125.5 against 122.5 us at Qwen3-30B-A3B T=8192: 104 registers, 2 CTAs per
            # SM). The stores stream (st.cs, evict-first): FC1 reads the blocks much later, and
            # the source rows, each read by k tiles, keep their place in L2 (118 against 122.5
            # us).
            n_of = []
            ch_of = []
            for i in cutlass.range_constexpr(self.chunks // THREADS):
                c = tidx + i * THREADS
                blk = c // 32
                n_of.append((blk % (self.bn // 8)) * 8 + c % 8)
                ch_of.append((blk // (self.bn // 8)) * 4 + (c % 32) // 8)
            distinct = self.bn // 64  # chunk i's token is chunk i % distinct's
            rows = []
            for i in cutlass.range_constexpr(distinct):
                row = Int32(0)
                if p0 + n_of[i] < p1:
                    row = ptx.ld_u32(order + Int64(p0 + n_of[i]) * 4) // row_div
                rows.append(row)
            vals = []
            for i in cutlass.range_constexpr(self.chunks // THREADS):
                k0 = kt * TILE_K + ch_of[i] * 8
                v0, v1, v2, v3 = Int32(0), Int32(0), Int32(0), Int32(0)
                if p0 + n_of[i] < p1:
                    if k0 < k_real:
                        v = ptx.ld_v4(src + (Int64(rows[i % distinct]) * Int64(src_stride)
                                                + Int64(k0)) * 2)
                        v0, v1, v2, v3 = v[0], v[1], v[2], v[3]
                vals.append((v0, v1, v2, v3))
            for i in cutlass.range_constexpr(self.chunks // THREADS):
                n = n_of[i]
                if p0 + n < p1:
                    ptx.st_cs_v4(dst_block + Int64((n // 8) * B_GROUP_BYTES + ch_of[i] * 128
                                                   + (n % 8) * 16), *vals[i])


# ---------------------------------------------------------------- source-major (swizzled B)
SCATTER_WARPS = 8
SEG = 8  # 16-byte chunks per lane per pass: a warp moves 4 KiB of its row per pass


class RowScatter:
    """Token rows scattered into tile-blocked B with wgmma's 128-byte swizzle (K-major):

        blocked[t, kt] (bn x 128 bf16) = two halves of 64 columns, each bn rows of 128 bytes;
        token n's 16-byte chunk c (columns 8c .. 8c + 7 of the half) at byte
        h * bn * 128 + n * 128 + (c ^ (n % 8)) * 16,

    which is what a 128B-swizzled wgmma descriptor reads from a 1024-byte aligned stage. A
    warp takes one source row, loads it once (512 contiguous bytes per instruction) and
    stores it to each routed copy's token slot (slots[row * copies + j] = tile * bn + n, or
    -1 for a copy routed elsewhere), every 8 lanes one whole 128-byte line."""

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
                                ptx.st_cs_v4(line + Int64(kt) * (self.bn * TILE_K * 2), *vals[i])
