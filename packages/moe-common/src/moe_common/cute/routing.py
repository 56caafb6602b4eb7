"""Device-side routing preparation in CuTe DSL (no host sync, CUDA-graph capturable).

Input: topk_ids [T, k] (int32 or int64), the local expert range. Output, for grouped GEMMs that
work on (expert, up to `bn` routed pairs) tiles:
  order[P]            sorted position -> original pair index t * k + j, grouped by local expert
  slots[P]            pair index -> its token slot tile * bn + (position in the tile), -1 for a
                      pair routed outside the local range (moe-gated's row scatter)
  tile_expert/start/end[max_tiles], num_tiles[1]
  counts[E]           routed pairs per local expert
Pairs whose expert is outside the local range are dropped (never given a position).

Two ways, the same tables:
- RoutingKernel, one CTA of 1024 threads (one launch; up to ONE_CTA_MAX_PAIRS pairs): each
  thread loads its BATCH ids at once; a histogram with shared-memory atomics, whose returns are
  the pairs' ranks inside their experts; a warp-shuffle scan over the experts (one thread per
  expert, E <= 1024) for the pair and tile offsets and the tile table; then each pair's position
  is its expert's first position plus its rank, `order` gathered in shared memory and written
  out in position order.
- Split over G CTAs (large batches, `split_ctas`): RoutingSlices counts each CTA's slice of
  the pairs into hist[g][e]; RoutingScan (one CTA) turns hist into each (CTA, expert)'s first
  position, writes the tile table and each expert's slot shift into hist[MAX_SPLIT_CTAS][e];
  RoutingSlices(scatter=True) places each slice's pairs from those bases. One CTA was bound by
  issuing every pair's shared atomic and scattered 4-byte `order` store from a single SM: 71 us
  for 65536 pairs (Qwen3-30B-A3B at T=8192).
The order of pairs inside one expert varies from run to run either way; results do not,
because every routed pair's output is computed on its own (its own MMA column, its own output
row) and reduced afterwards in a fixed order.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from . import jit, ptx
from .scan import exclusive_scan2
from .storage import SharedStorage, shared_storage

THREADS = 1024
MAX_EXPERTS = THREADS
# ids loaded per thread before the first is used: one load in flight per warp made each pass
# latency-bound (88 us for 65536 pairs, Qwen3-30B-A3B at T=8192, tools/profile_split.py)
BATCH = 8
SPLIT_THREADS = 512  # per CTA of the histogram and scatter kernels
MAX_SPLIT_CTAS = 32  # RoutingScan holds one hist value per CTA in registers (1024 threads)
ONE_CTA_MAX_PAIRS = THREADS * BATCH  # RoutingKernel: one batch of ids per thread
# The split path past the one-CTA kernel's capacity only: `tools/routing_bench.py` (CUDA-graph
# replay, E = 128 / 256) since 4329626 (`order` staged in shared memory) one CTA 4.4 / 4.5 us at
# 4096 pairs, 4.8 / 4.9 at 6144, 5.3 / 5.4 at 8192, against split 8.5 / 8.7 at each (one CTA
# before: 7.1 / 7.2, 9.1 / 9.4, 11.3 / 11.7, when the split path started at 6144)
SPLIT_MIN_PAIRS = ONE_CTA_MAX_PAIRS + 1
PAIRS_PER_SPLIT_CTA = 2048
# RoutingKernel keeps a pair's rank (< ONE_CTA_MAX_PAIRS) and expert (< MAX_EXPERTS) in one
# register: the expert in the low RANK_SHIFT bits, all ones for a pair not routed here
RANK_SHIFT = 11
NO_EXPERT = (1 << RANK_SHIFT) - 1
assert MAX_EXPERTS < NO_EXPERT and ONE_CTA_MAX_PAIRS << RANK_SHIFT < 1 << 31


@functools.lru_cache(maxsize=None)
def _storage(kernel: str) -> SharedStorage:
    """The shared memory of each routing kernel, int32 arrays: per expert its pair count
    (`counts`), first sorted position (`first`) and slot shift (`shift`); `scan`, the expert
    scan's scratch (exclusive_scan2); RoutingKernel's `order` staged whole (`order`, its
    length in `total`)."""
    mem = cute.struct.MemRange
    regions = {"one_cta": (("counts", THREADS), ("scan", 2 * THREADS // 32), ("first", THREADS),
                           ("shift", THREADS), ("total", 4), ("order", ONE_CTA_MAX_PAIRS)),
               "slices": (("counts", MAX_EXPERTS), ("shift", MAX_EXPERTS)),
               "scan": (("counts", THREADS), ("scan", THREADS))}[kernel]
    fields = {name: mem[cutlass.Int32, n] for name, n in regions}
    return shared_storage(f"Routing_{kernel}", {**fields, "end": mem[cutlass.Uint8, 0]})


def _shared(kernel: str) -> dict:
    """The kernel's shared-memory buffer (trace-time helper): each region's 32-bit address."""
    offsets = _storage(kernel).offsets
    smem = cutlass.memory.SmemAllocator()
    buf = smem.allocate_array(cutlass.Int32, offsets["end"] // 4, byte_alignment=16)
    base = Int32(buf.toint())
    return {name: base + off for name, off in offsets.items() if name != "end"}


def split_ctas(pairs: int) -> int:
    """CTAs of the split path for `pairs` routed pairs; 0 = use the single-CTA kernel."""
    if pairs < SPLIT_MIN_PAIRS:
        return 0
    return min(MAX_SPLIT_CTAS, -(-pairs // PAIRS_PER_SPLIT_CTA))


def local_expert(ids, p, expert_offset, ids_bytes: int):
    """Routed pair p's expert as a local id, from topk_ids of `ids_bytes`-byte ints; valid iff
    0 <= id < experts (one unsigned compare). Trace-time helper."""
    if ids_bytes == 4:
        e = ptx.ld_nc_u32(ids + Int64(p) * 4)
    else:
        e = ptx.ld_nc_s64_as_s32(ids + Int64(p) * 8)
    return e - expert_offset


class _PairIds:
    """Reads expert ids of routed pairs as local ids (invalid ones as values >= experts)."""

    def __init__(self, ids_bytes: int):
        assert ids_bytes in (4, 8)
        self.ids_bytes = ids_bytes

    @cute.jit
    def _expert(self, ids, p, expert_offset, experts):
        return local_expert(ids, p, expert_offset, self.ids_bytes)

    @cute.jit
    def _experts(self, ids, p0, step: cutlass.Constexpr, end, expert_offset, experts):
        """Local ids of pairs p0 + u * step, u < BATCH, all loads issued before any is used;
        pairs at or past `end` read pair 0 and come back as -1 (invalid)."""
        ps = [p0 + u * step for u in range(BATCH)]
        raw = [self._expert(ids, cutlass.select_(p < end, p, Int32(0)), expert_offset, experts)
               for p in ps]
        return [cutlass.select_(p < end, e, Int32(-1)) for p, e in zip(ps, raw)]


class RoutingTables(NamedTuple):
    """Where the routing writes its tables (int32 arrays): the pairs per local expert [E], each
    tile's expert, first and end sorted position [capacity], and the tile count [1]. Built by
    jit.route (jit.operands); RoutingKernel and RoutingScan take it whole (see jit: why their
    kernels leave it unannotated)."""
    counts: Int64
    tile_expert: Int64
    tile_start: Int64
    tile_end: Int64
    num_tiles: Int64


@cute.jit
def _expert_table(tid, cnt, s_scratch, experts, bn, tables):
    """Thread e of 1024 holds expert e's pair count: scan counts and tiles over the experts,
    write counts[e], e's tile-table entries and num_tiles; return e's first sorted position
    and its slot shift (first tile * bn - first position: a position's token slot is position +
    shift). s_scratch: 64 int32 of shared memory no thread reads meanwhile (free again after
    the caller's next CTA barrier)."""
    tiles = (cnt + bn - 1) // bn
    start, first_tile, _, _ = exclusive_scan2(cnt, tiles, tid, THREADS, s_scratch)
    if tid < experts:
        ptx.st_u32(tables.counts + Int64(tid) * 4, cnt)
        for j in cutlass.range(tiles, unroll=1):
            t = Int64(first_tile + j) * 4
            ts = start + j * bn
            ptx.st_u32(tables.tile_expert + t, tid)
            ptx.st_u32(tables.tile_start + t, ts)
            ptx.st_u32(tables.tile_end + t, cutlass.min(ts + bn, start + cnt))
    if tid == experts - 1:
        ptx.st_u32(tables.num_tiles, first_tile + tiles)
    return start, first_tile * bn - start


@cute.jit
def _place(order, slots, pos, shift, pair):
    """Routed pair `pair` at sorted position pos: order[pos] = pair, slots[pair] = its slot."""
    ptx.st_u32(order + Int64(pos) * 4, pair)
    ptx.st_u32(slots + Int64(pair) * 4, pos + shift)


class RoutingKernel(_PairIds):
    @cute.jit
    def __call__(self, ids: Int64, pairs: Int32, expert_offset: Int32, experts: Int32, bn: Int32,
                 order: Int64, slots: Int64, tables: RoutingTables, stream):
        self.kernel(ids, pairs, expert_offset, experts, bn, order, slots, tables).launch(
            grid=[1, 1, 1], block=[THREADS, 1, 1], stream=stream, use_pdl=jit.PDL)

    @cute.kernel
    def kernel(self, ids: Int64, pairs: Int32, expert_offset: Int32, experts: Int32, bn: Int32,
               order: Int64, slots: Int64, tables):
        tid, _, _ = cute.arch.thread_idx()
        ptx.grid_dependency_wait()  # first: see jit.PDL
        sh = _shared("one_cta")
        s_cnt, s_til, s_first, s_shift = sh["counts"], sh["scan"], sh["first"], sh["shift"]
        s_total, s_order = sh["total"], sh["order"]
        ptx.st_shared_u32(s_cnt + tid * 4, 0)
        cute.arch.sync_threads()
        # 1. one batch of ids per thread (pairs <= ONE_CTA_MAX_PAIRS); the histogram's atomic
        #    returns each pair's rank among its expert's pairs, kept in registers as
        #    (rank << RANK_SHIFT) | expert, NO_EXPERT for a pair not routed here (8 registers,
        #    not 16: the kernel is held to 64). As fast as the second pass of id loads and
        #    cursor atomics it replaced (BENCHMARKS.md), in one pass of code
        es = self._experts(ids, tid, THREADS, pairs, expert_offset, experts)
        held = []
        for u in cutlass.range_constexpr(BATCH):
            h = Int32(NO_EXPERT)
            if cutlass.Uint32(es[u]) < cutlass.Uint32(experts):
                h = (ptx.atom_add_shared(s_cnt + es[u] * 4, 1) << RANK_SHIFT) | es[u]
            held.append(h)
        cute.arch.sync_threads()
        # 2. the expert table, each expert's first position and slot shift
        cnt = ptx.ld_shared_u32(s_cnt + tid * 4)
        start, shift = _expert_table(tid, cnt, s_til, experts, bn, tables)
        ptx.st_shared_u32(s_first + tid * 4, start)
        ptx.st_shared_u32(s_shift + tid * 4, shift)
        if tid == experts - 1:
            ptx.st_shared_u32(s_total, start + cnt)
        cute.arch.sync_threads()
        # 3. each pair at its expert's first position + its rank: its slot straight to memory
        #    (slots is in pair order, so a warp's stores are contiguous), its `order` entry
        #    into shared memory, where positions are scattered
        for u in cutlass.range_constexpr(BATCH):
            p = tid + u * THREADS
            e = held[u] & NO_EXPERT
            if e != NO_EXPERT:
                pos = ptx.ld_shared_u32(s_first + e * 4) + (held[u] >> RANK_SHIFT)
                ptx.st_shared_u32(s_order + pos * 4, p)
                ptx.st_u32(slots + Int64(p) * 4, pos + ptx.ld_shared_u32(s_shift + e * 4))
            else:
                if p < pairs:
                    ptx.st_u32(slots + Int64(p) * 4, -1)
        cute.arch.sync_threads()
        # 4. `order` out in position order, a warp's stores contiguous. Scattered from each
        #    pair's thread they were one 32-byte write each, all issued by this one SM
        total = ptx.ld_shared_u32(s_total)
        for u in cutlass.range_constexpr(BATCH):
            q = tid + u * THREADS
            if q < total:
                ptx.st_u32(order + Int64(q) * 4, ptx.ld_shared_u32(s_order + q * 4))


# ---------------------------------------------------------------- split path (G CTAs)
class RoutingSlices(_PairIds):
    """CTA g of `ctas` takes pairs [g * chunk, min(pairs, (g + 1) * chunk)), chunk =
    ceil(pairs / ctas). scatter=False (the histogram pass): hist[g][e] = its pairs routed to
    local expert e. scatter=True (after RoutingScan turned hist into each (CTA, expert)'s first
    sorted position and its slot shifts): order[hist[g][e] + rank] = p and slots[p] for its
    pairs p."""

    def __init__(self, ids_bytes: int, scatter: bool):
        super().__init__(ids_bytes)
        self.scatter = scatter

    @cute.jit
    def __call__(self, ids: Int64, pairs: Int32, expert_offset: Int32, experts: Int32,
                 ctas: Int32, hist: Int64, order: Int64, slots: Int64, stream):
        self.kernel(ids, pairs, expert_offset, experts, ctas, hist, order, slots).launch(
            grid=[ctas, 1, 1], block=[SPLIT_THREADS, 1, 1], stream=stream, use_pdl=jit.PDL)

    @cute.kernel
    def kernel(self, ids: Int64, pairs: Int32, expert_offset: Int32, experts: Int32,
               ctas: Int32, hist: Int64, order: Int64, slots: Int64):
        tid, _, _ = cute.arch.thread_idx()
        ptx.grid_dependency_wait()  # first: see jit.PDL
        g, _, _ = cute.arch.block_idx()
        sh = _shared("slices")
        s_cnt = sh["counts"]  # per-expert counter: from 0, or from the CTA's bases
        s_shift = sh["shift"]  # (scatter)
        row = hist + Int64(g) * Int64(experts) * 4
        shifts = hist + Int64(MAX_SPLIT_CTAS) * Int64(experts) * 4
        for e in cutlass.range(tid, experts, SPLIT_THREADS, unroll=1):
            first = Int32(0)
            if cutlass.const_expr(self.scatter):
                first = ptx.ld_u32(row + Int64(e) * 4)
                ptx.st_shared_u32(s_shift + e * 4, ptx.ld_u32(shifts + Int64(e) * 4))
            ptx.st_shared_u32(s_cnt + e * 4, first)
        cute.arch.sync_threads()
        chunk = (pairs + ctas - 1) // ctas
        p1 = cutlass.min(g * chunk + chunk, pairs)
        for base in cutlass.range(g * chunk, p1, SPLIT_THREADS * BATCH, unroll=1):
            es = self._experts(ids, base + tid, SPLIT_THREADS, p1, expert_offset, experts)
            for u in cutlass.range_constexpr(BATCH):
                p = base + tid + u * SPLIT_THREADS
                if cutlass.Uint32(es[u]) < cutlass.Uint32(experts):
                    pos = ptx.atom_add_shared(s_cnt + es[u] * 4, 1)
                    if cutlass.const_expr(self.scatter):
                        _place(order, slots, pos, ptx.ld_shared_u32(s_shift + es[u] * 4), p)
                if cutlass.const_expr(self.scatter):
                    if cutlass.Uint32(es[u]) >= cutlass.Uint32(experts):
                        if p < p1:
                            ptx.st_u32(slots + Int64(p) * 4, -1)
        if cutlass.const_expr(not self.scatter):
            cute.arch.sync_threads()
            for e in cutlass.range(tid, experts, SPLIT_THREADS, unroll=1):
                ptx.st_u32(row + Int64(e) * 4, ptx.ld_shared_u32(s_cnt + e * 4))


class RoutingScan:
    """One CTA: expert e's count = sum over CTAs of hist[g][e]; the expert table as in
    RoutingKernel; then hist[g][e] <- e's first position + pairs of e in CTAs before g, and
    hist[MAX_SPLIT_CTAS][e] <- e's slot shift."""

    @cute.jit
    def __call__(self, hist: Int64, ctas: Int32, experts: Int32, bn: Int32,
                 tables: RoutingTables, stream):
        self.kernel(hist, ctas, experts, bn, tables).launch(
            grid=[1, 1, 1], block=[THREADS, 1, 1], stream=stream, use_pdl=jit.PDL)

    @cute.kernel
    def kernel(self, hist: Int64, ctas: Int32, experts: Int32, bn: Int32, tables):
        tid, _, _ = cute.arch.thread_idx()
        ptx.grid_dependency_wait()  # first: see jit.PDL
        sh = _shared("scan")
        s_cnt, s_til = sh["counts"], sh["scan"]
        # every CTA's count of expert `tid` loaded at once (ctas <= MAX_SPLIT_CTAS)
        col = hist + Int64(cutlass.min(tid, experts - 1)) * 4
        vals = [cutlass.select_(Int32(g) < ctas, ptx.ld_u32(
                    col + Int64(cutlass.min(Int32(g), ctas - 1)) * Int64(experts) * 4), Int32(0))
                for g in range(MAX_SPLIT_CTAS)]
        cnt = Int32(0)
        for g in cutlass.range_constexpr(MAX_SPLIT_CTAS):
            cnt = cnt + vals[g]
        cnt = cutlass.select_(tid < experts, cnt, Int32(0))
        start, shift = _expert_table(tid, cnt, s_til, experts, bn, tables)
        if tid < experts:
            ptx.st_u32(col + Int64(MAX_SPLIT_CTAS) * Int64(experts) * 4, shift)
            run = start
            for g in cutlass.range_constexpr(MAX_SPLIT_CTAS):
                if Int32(g) < ctas:
                    ptx.st_u32(col + Int64(g) * Int64(experts) * 4, run)
                run = run + vals[g]
