"""Sum of the top-k weighted expert outputs per token, in a fixed order (deterministic).

    out[t, :] = bf16( sum_{j < k, id[t, j] local} y[t * k + j, :] )                (weighted=False)
    out[t, :] = bf16( sum_{j < k, id[t, j] local} w[t, j] * y[t * k + j, :] )      (weighted=True)

Weighted: the GEMM leaves the router weight to the reduce, which reads it beside the route's
id (no extra round trip); a GEMM epilogue would need each token's weight by its pair index,
a dependent load after its own load of that index.

y is fp32 [T * k, H] with rows of non-local routes never written: they are skipped by id, not
read. Work item (token t, block of `cols` columns); the k routes of an item are loaded in
parallel, so a thread waits for two round trips (the ids, then the y rows), not 2 k:

1. ROUTE_LANES lanes of a warp hold one item. Lane j loads route j's expert id (and router
   weight) and, if the route is local, its `cols` y values (cols / 4 16-byte loads issued
   together) into its row of shared memory.
2. After a warp barrier lane j sums its cols / 8 positions of the block over the routes in the
   order 0..k-1 (the route's id test and weight come by warp shuffle from the lane that loaded
   it), skipping non-local routes: the same fp32 operations in the same order as one thread
   summing a whole item, so the result is bitwise that of the serial loop.
3. It rounds once to bf16 and stores its columns. With k > ROUTE_LANES, steps 1-2 repeat per
   ROUTE_LANES routes, the sums carried over.

At T = 512 of a 2048-wide layer with 32-column blocks the old one-thread-per-item loop had 32K
threads (one 256-thread CTA per SM) each waiting on 2 k = 16 serial round trips.

Paired order (`paired` = B, 16 or 32, H a multiple of B): within each B-column block of a y
row, columns j, j + 8, ... sit side by side (column j + 8 i at position (B / 8) j + i), the
order in which warpgroup-MMA fragments hold them (a thread has rows r and r + 8 of each 16-row
group it computes, B / 16 groups), so the GEMM writes a token's values with one 8- or 16-byte
store. Lane j's positions (B / 8) j + i are then columns j + 8 i: B / 8 2-byte stores, the
item's lanes together covering the block. Row order (paired = 0): 8 columns, one each.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from . import jit, ptx

THREADS = 256
ROUTE_LANES = 8  # lanes per item: one route each, then each sums cols / 8 columns


def paired_position(h: int, block: int) -> int:
    """Where column h of a y row sits in the paired order of `block`-column blocks."""
    return h - h % block + (block // 8) * (h % 8) + (h % block) // 8


class TopkReduce:
    def __init__(self, ids_bytes: int, paired: int = 0, weighted: bool = False):
        assert paired in (0, 16, 32)
        self.ids_bytes = ids_bytes
        self.paired = paired
        self.weighted = weighted
        self.cols = paired if paired else 8  # y columns per item
        self.per_lane = self.cols // ROUTE_LANES  # positions each lane sums
        # a lane's shared row: its route's cols values, padded by 16 bytes so that the 8 lanes
        # of a quarter-warp phase hit distinct banks when they store and when they read
        self.row_bytes = 4 * self.cols + 16

    @cute.jit
    def __call__(self, y: Int64, ids: Int64, route_w: Int64, out: Int64, tokens: Int32,
                 top_k: Int32, hidden: Int32, expert_offset: Int32, experts: Int32, stream):
        lanes = tokens * (hidden // self.cols) * ROUTE_LANES
        self.kernel(y, ids, route_w, out, tokens * (hidden // self.cols), top_k, hidden,
                    expert_offset, experts).launch(
            grid=[(lanes + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream,
            use_pdl=jit.PDL)

    @cute.kernel
    def kernel(self, y: Int64, ids: Int64, route_w: Int64, out: Int64, items: Int32, top_k: Int32,
               hidden: Int32, expert_offset: Int32, experts: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        ptx.grid_dependency_wait()  # first: see jit.PDL
        bidx, _, _ = cute.arch.block_idx()
        cols, n = self.cols, self.per_lane
        smem = cutlass.memory.SmemAllocator()
        buf = smem.allocate_array(cutlass.Int8, THREADS * self.row_bytes, byte_alignment=16)
        s_base = Int32(buf.toint())
        s_mine = s_base + tidx * self.row_bytes  # this lane's route row
        j = tidx % ROUTE_LANES
        first = tidx - j  # the item's lane 0 (a CTA holds whole items: THREADS % ROUTE_LANES == 0)
        first_lane = first % 32
        i = bidx * (THREADS // ROUTE_LANES) + tidx // ROUTE_LANES
        t = i // (hidden // cols)
        h0 = (i - t * (hidden // cols)) * cols
        acc = cute.make_rmem_tensor(cute.make_layout(n), Float32)
        acc.fill(0.0)
        for r0 in cutlass.range(0, top_k, ROUTE_LANES, unroll=1):
            # 1. lane j: route r0 + j's id (weight), and its y values into its shared row
            local = Int32(0)
            wbits = Int32(0)
            if i < items and r0 + j < top_k:
                pair = t * top_k + r0 + j
                if cutlass.const_expr(self.ids_bytes == 4):
                    e = ptx.ld_nc_u32(ids + Int64(pair) * 4)
                else:
                    e = ptx.ld_nc_s64_as_s32(ids + Int64(pair) * 8)
                if cutlass.const_expr(self.weighted):
                    wbits = ptx.ld_nc_u32(route_w + Int64(pair) * 4)
                if cutlass.Uint32(e - expert_offset) < cutlass.Uint32(experts):
                    local = Int32(1)
                    src = y + (Int64(pair) * Int64(hidden) + Int64(h0)) * 4
                    vals = [ptx.ld_v4(src + 16 * q) for q in range(cols // 4)]
                    for q in cutlass.range_constexpr(cols // 4):
                        ptx.st_shared_v4(s_mine + 16 * q, *vals[q])
            ptx.sync_warp()
            # 2. lane j sums positions n j .. n j + n - 1 over the routes, in route order
            for r in cutlass.range_constexpr(ROUTE_LANES):  # routes past k: local = 0
                r_local = ptx.shfl_idx_i32(local, first_lane + r)
                r_wbits = ptx.shfl_idx_i32(wbits, first_lane + r)
                if r_local != 0:
                    s_pos = s_base + (first + r) * self.row_bytes + 4 * n * j
                    words = _ld_shared_words(s_pos, n)
                    for q in cutlass.range_constexpr(n):
                        v = ptx.f32_bits(words[q])
                        if cutlass.const_expr(self.weighted):
                            v = ptx.f32_bits(r_wbits) * v
                        acc[q] = acc[q] + v
            ptx.sync_warp()  # the rows are read before the next routes overwrite them
        # 3. position n j + q is column j + 8 q of the block (row order: n = 1, column j)
        if i < items:
            dst = out + (Int64(t) * Int64(hidden) + Int64(h0) + Int64(j)) * 2
            for q in cutlass.range_constexpr(n):
                ptx.st_u16(dst + 16 * q, ptx.bf16x2_from_f32(acc[q], acc[q]))


def _ld_shared_words(addr, n: int):
    """n consecutive 32-bit words of shared memory (n = 1, 2 or 4: one load)."""
    if n == 4:
        return ptx.ld_shared_v4(addr)
    if n == 2:
        return ptx.ld_shared_v2(addr)
    return (ptx.ld_shared_u32(addr),)
