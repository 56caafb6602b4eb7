"""Sum of the top-k weighted expert outputs per token, in a fixed order (deterministic).

    out[t, :] = bf16( sum_{j < k, id[t, j] local} y[t * k + j, :] )                (weighted=False)
    out[t, :] = bf16( sum_{j < k, id[t, j] local} w[t, j] * y[t * k + j, :] )      (weighted=True)

Weighted: the GEMM leaves the router weight to the reduce, which reads it beside the route's
id (no extra round trip); a GEMM epilogue would need each token's weight by its pair index,
a dependent load after its own load of that index.

y is bf16 [T * k, H] with rows of non-local routes never written: they are skipped by id, not
read. A token's sum is fp32, rounded to bf16 once at the end. y is bf16, not fp32, because its
round trip (FC2 writes it, this kernel reads it) is 2 T k H values: in fp32 they were 0.79x
the layer's weight bytes at Qwen3-30B-A3B T=2048 (docs/DESIGN.md section 5).

y's columns are in the paired order of B-column blocks (`paired` = B, 16 or 32, H a multiple of
B): within each block, columns j, j + 8, ... sit side by side (column j + 8 i at position
(B / 8) j + i), the order in which MMA fragments hold them (a thread has rows r and r + 8 of
each 16-row group it computes, B / 16 groups), so the GEMM writes a token's values with one 4-
or 8-byte store. A thread here owns one 16-byte chunk (8 values) of one token's y row: one
16-byte load per route, and 4- or 8-byte stores of its 8 sums (chunk_stores).

Steps per thread, the routes taken ROUTE_BATCH at a time:
1. load the batch's expert ids (and router weights): independent loads, one round trip;
2. load the y chunks of its local routes (predicated: a route routed elsewhere or past k reads
   nothing, which keeps an expert-parallel rank's reads to its own routes): one round trip;
3. add them to the fp32 sums in route order, the others as +0.0 (the same sums, bit for bit,
   as skipping them).
One route at a time (a thread per block of B columns) took two dependent round trips per route,
16 at k = 8, with one CTA per SM at the band's token counts (T x H / B threads: 128 CTAs of 256
at Qwen3-30B-A3B T = 512, now 512).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from . import jit, ptx

THREADS = 256
# routes whose loads are in flight together (4 registers each; k <= 8: one batch)
ROUTE_BATCH = 8
# Compiled for at least 2 CTAs per SM (a cap of 128 registers): without a bound ptxas held the
# kernel to 32 registers by issuing each route's id and y loads after the previous route's
# adds, two dependent round trips per route again (the batch's loads together need 64-78;
# tests/test_topk_reduce_sass.py). The carveout keeps the DSL from asking the device for its
# shared memory at compile time.
LAUNCH_BOUNDS = dict(min_blocks_per_mp=2, max_number_threads=[THREADS, 1, 1],
                     preferred_smem_carveout=100)


def paired_position(h: int, block: int) -> int:
    """Where column h of a y row sits in the paired order of `block`-column blocks."""
    return h - h % block + (block // 8) * (h % 8) + (h % block) // 8


def fragment_position(row0, r, gi: int, h: int, groups: int):
    """The writer's side of paired_position: where the MMA thread of fragment row r puts row
    row0 + 16 gi + r + 8 h (rows r and r + 8 of each of its `groups` consecutive 16-row
    groups, the first at row0, a multiple of 16 groups) in the paired order of 16 x groups
    blocks. A thread's 2 groups values are consecutive, so one store writes them."""
    return row0 + 2 * groups * r + 2 * gi + h


def chunk_columns(block: int) -> list:
    """The y columns of the 8 values of a 16-byte chunk of the paired order, relative to the
    chunk's first column: chunk q of a block holds columns q x 64 / block + these (the
    inverse of paired_position, the same for every q)."""
    where = {paired_position(h, block): h for h in range(block)}
    return [where[v] for v in range(8)]


def chunk_stores(block: int) -> list:
    """How a chunk's 8 sums go out: (first column, [value indices]) per run of consecutive
    columns (`block` 32: four bf16x2 stores 8 columns apart; 16: two 4-column stores)."""
    cols = chunk_columns(block)
    runs = []
    for v in sorted(range(8), key=lambda v: cols[v]):
        if runs and cols[v] == cols[runs[-1][1][-1]] + 1:
            runs[-1][1].append(v)
        else:
            runs.append((cols[v], [v]))
    return runs


class TopkReduce:
    def __init__(self, ids_bytes: int, paired: int, weighted: bool):
        assert paired in (16, 32)
        self.ids_bytes = ids_bytes
        self.weighted = weighted
        self.paired = paired

    @cute.jit
    def __call__(self, y: Int64, ids: Int64, route_w: Int64, out: Int64, tokens: Int32,
                 top_k: Int32, hidden: Int32, expert_offset: Int32, experts: Int32, stream):
        items = tokens * (hidden // 8)
        self.kernel(y, ids, route_w, out, items, top_k, hidden, expert_offset, experts).launch(
            grid=[(items + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream,
            use_pdl=jit.PDL, **LAUNCH_BOUNDS)

    @cute.kernel
    def kernel(self, y: Int64, ids: Int64, route_w: Int64, out: Int64, items: Int32, top_k: Int32,
               hidden: Int32, expert_offset: Int32, experts: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        ptx.grid_dependency_wait()  # first: see jit.PDL
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * THREADS + tidx
        if i < items:
            t = i // (hidden // 8)
            c0 = (i - t * (hidden // 8)) * 8  # the chunk's first position in the y row
            # the chunk's first column: its block's, plus 64 / paired per chunk before it
            col0 = c0 - c0 % self.paired + (c0 % self.paired) // 8 * (64 // self.paired)
            acc = cute.make_rmem_tensor(cute.make_layout(8), Float32)
            acc.fill(0.0)
            for j0 in cutlass.range(0, top_k, ROUTE_BATCH, unroll=1):
                # 1. the batch's ids and weights (a route past k reads route k - 1's, unused)
                routes = []
                for b in cutlass.range_constexpr(ROUTE_BATCH):
                    pair = t * top_k + cutlass.min(j0 + b, top_k - 1)
                    if cutlass.const_expr(self.ids_bytes == 4):
                        e = ptx.ld_nc_u32(ids + Int64(pair) * 4)
                    else:
                        e = ptx.ld_nc_s64_as_s32(ids + Int64(pair) * 8)
                    w_bits = ptx.ld_nc_u32(route_w + Int64(pair) * 4) if cutlass.const_expr(
                        self.weighted) else None
                    routes.append((pair, j0 + b, e, w_bits))
                # 2. the local routes' chunks (zeros for the others)
                loads = []
                for pair, j, e, w_bits in routes:
                    keep = Int32(0)
                    if cutlass.Uint32(e - expert_offset) < cutlass.Uint32(experts) and j < top_k:
                        keep = Int32(-1)
                    v = ptx.ld_cg_v4_if(y + (Int64(pair) * Int64(hidden) + Int64(c0)) * 2, keep)
                    # a skipped route's weight is +0.0, whatever the caller passed (inf, NaN)
                    wt = ptx.f32_bits(w_bits & keep) if cutlass.const_expr(self.weighted) else None
                    loads.append((wt, v))
                # 3. the sums, in route order: a skipped route adds +0.0, which leaves every sum
                # as it was (a sum from +0.0 is never -0.0 under round-to-nearest)
                for wt, v in loads:
                    for c in cutlass.range_constexpr(8):
                        if cutlass.const_expr(c % 2 == 0):
                            x = ptx.bf16_lo_to_f32(v[c // 2])
                        else:
                            x = ptx.bf16_hi_to_f32(v[c // 2])
                        if cutlass.const_expr(self.weighted):
                            x = wt * x
                        acc[c] = acc[c] + x
            dst = out + (Int64(t) * Int64(hidden) + Int64(col0)) * 2
            for first, run in chunk_stores(self.paired):
                words = [ptx.bf16x2_from_f32(acc[run[w]], acc[run[w + 1]])
                         for w in range(0, len(run), 2)]
                if cutlass.const_expr(len(words) == 1):
                    ptx.st_u32(dst + 2 * first, words[0])
                else:
                    ptx.st_v2(dst + 2 * first, *words)
