"""Device-side routing preparation as one CuTe DSL kernel (no host sync, one launch).

Input: topk_ids [T, k] (int32 or int64), the local expert range. Output, for grouped GEMMs that
work on (expert, up to `bn` routed pairs) tiles:
  order[P]            sorted position -> original pair index t * k + j, grouped by local expert
  tile_expert/start/end[max_tiles], num_tiles[1]
  counts[E]           routed pairs per local expert
Pairs whose expert is outside the local range are dropped (never given a position).

One CTA of 1024 threads: histogram with shared-memory atomics, a Hillis-Steele scan over the
experts (one thread per expert, E <= 1024) for the pair and tile offsets, the tile table, then
positions by a second pass of atomics. The order of pairs inside one expert therefore varies
from run to run; results do not, because every routed pair's output is computed on its own
(its own MMA column, its own output row) and reduced afterwards in a fixed order.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from . import ptx

THREADS = 1024
MAX_EXPERTS = THREADS
# ids loaded per thread before the first is used: one load in flight per warp made each pass
# latency-bound (88 us for 65536 pairs, Qwen3-30B-A3B at T=8192, tools/profile_split.py)
BATCH = 8


class RoutingKernel:
    def __init__(self, ids_bytes: int):
        assert ids_bytes in (4, 8)
        self.ids_bytes = ids_bytes

    @cute.jit
    def __call__(self, ids: Int64, pairs: Int32, expert_offset: Int32, experts: Int32, bn: Int32,
                 order: Int64, counts_out: Int64, tile_expert: Int64, tile_start: Int64,
                 tile_end: Int64, num_tiles: Int64, stream):
        self.kernel(ids, pairs, expert_offset, experts, bn, order, counts_out, tile_expert,
                    tile_start, tile_end, num_tiles).launch(grid=[1, 1, 1], block=[THREADS, 1, 1],
                                                            stream=stream)

    @cute.jit
    def _expert(self, ids, p, expert_offset, experts):
        if cutlass.const_expr(self.ids_bytes == 4):
            e = ptx.ld_nc_u32(ids + Int64(p) * 4)
        else:
            e = ptx.ld_nc_s64_as_s32(ids + Int64(p) * 8)
        return e - expert_offset  # local id; valid iff 0 <= e < experts (unsigned compare)

    @cute.jit
    def _experts(self, ids, p0, pairs, expert_offset, experts):
        """Local ids of pairs p0 + u * THREADS, u < BATCH, all loads issued before any is used;
        pairs past the end read pair 0 and come back as -1 (invalid)."""
        ps = [p0 + u * THREADS for u in range(BATCH)]
        raw = [self._expert(ids, cutlass.select_(p < pairs, p, Int32(0)), expert_offset, experts)
               for p in ps]
        return [cutlass.select_(p < pairs, e, Int32(-1)) for p, e in zip(ps, raw)]

    @cute.kernel
    def kernel(self, ids: Int64, pairs: Int32, expert_offset: Int32, experts: Int32, bn: Int32,
               order: Int64, counts_out: Int64, tile_expert: Int64, tile_start: Int64,
               tile_end: Int64, num_tiles: Int64):
        tid, _, _ = cute.arch.thread_idx()
        smem = cutlass.memory.SmemAllocator()
        buf = smem.allocate_array(cutlass.Int32, 3 * THREADS, byte_alignment=16)
        s_cnt = Int32(buf.toint())          # counts, then inclusive pair offsets
        s_til = s_cnt + THREADS * 4          # tiles per expert, then inclusive tile offsets
        s_cur = s_cnt + 2 * THREADS * 4      # per-expert cursor for the position pass
        ptx.st_shared_u32(s_cnt + tid * 4, 0)
        cute.arch.sync_threads()
        for base in cutlass.range(0, pairs, THREADS * BATCH, unroll=1):
            es = self._experts(ids, base + tid, pairs, expert_offset, experts)
            for u in cutlass.range_constexpr(BATCH):
                if cutlass.Uint32(es[u]) < cutlass.Uint32(experts):
                    ptx.atom_add_shared(s_cnt + es[u] * 4, 1)
        cute.arch.sync_threads()
        cnt = ptx.ld_shared_u32(s_cnt + tid * 4)
        tiles = (cnt + bn - 1) // bn
        ptx.st_shared_u32(s_til + tid * 4, tiles)
        cute.arch.sync_threads()
        # inclusive scans of counts and tiles
        for lvl in cutlass.range_constexpr(10):
            off = 1 << lvl
            a = Int32(0)
            b = Int32(0)
            if tid >= off:
                a = ptx.ld_shared_u32(s_cnt + (tid - off) * 4)
                b = ptx.ld_shared_u32(s_til + (tid - off) * 4)
            cute.arch.sync_threads()
            if tid >= off:
                ptx.st_shared_u32(s_cnt + tid * 4, ptx.ld_shared_u32(s_cnt + tid * 4) + a)
                ptx.st_shared_u32(s_til + tid * 4, ptx.ld_shared_u32(s_til + tid * 4) + b)
            cute.arch.sync_threads()
        start = ptx.ld_shared_u32(s_cnt + tid * 4) - cnt
        first_tile = ptx.ld_shared_u32(s_til + tid * 4) - tiles
        ptx.st_shared_u32(s_cur + tid * 4, start)
        if tid < experts:
            ptx.st_u32(counts_out + Int64(tid) * 4, cnt)
            for j in cutlass.range(tiles, unroll=1):
                t = Int64(first_tile + j) * 4
                ts = start + j * bn
                ptx.st_u32(tile_expert + t, tid)
                ptx.st_u32(tile_start + t, ts)
                ptx.st_u32(tile_end + t, cutlass.min(ts + bn, start + cnt))
        if tid == experts - 1:
            ptx.st_u32(num_tiles, first_tile + tiles)
        cute.arch.sync_threads()
        for base in cutlass.range(0, pairs, THREADS * BATCH, unroll=1):
            es = self._experts(ids, base + tid, pairs, expert_offset, experts)
            for u in cutlass.range_constexpr(BATCH):
                if cutlass.Uint32(es[u]) < cutlass.Uint32(experts):
                    pos = ptx.atom_add_shared(s_cur + es[u] * 4, 1)
                    ptx.st_u32(order + Int64(pos) * 4, base + tid + u * THREADS)
