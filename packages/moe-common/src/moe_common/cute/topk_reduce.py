"""Sum of the top-k weighted expert outputs per token, in a fixed order (deterministic).

    out[t, :] = bf16( sum_{j < k, id[t, j] local} y[t * k + j, :] )                (weighted=False)
    out[t, :] = bf16( sum_{j < k, id[t, j] local} w[t, j] * y[t * k + j, :] )      (weighted=True)

Weighted: the GEMM leaves the router weight to the reduce, which reads it beside the route's
id (no extra round trip); a GEMM epilogue would need each token's weight by its pair index,
a dependent load after its own load of that index.

y is fp32 [T * k, H] with rows of non-local routes never written: they are skipped by id, not
read. Each thread owns 8 consecutive h of one token: two 16-byte loads per route, one 16-byte
store, one rounding to bf16.

Paired order (`paired` = B, 16 or 32, H a multiple of B): within each B-column block of a y
row, columns j, j + 8, ... sit side by side (column j + 8 i at position (B / 8) j + i), the
order in which warpgroup-MMA fragments hold them (a thread has rows r and r + 8 of each 16-row
group it computes, B / 16 groups), so the GEMM writes a token's values with one 8- or 16-byte
store. A thread here then owns one whole block: B / 4 16-byte loads per route, B / 8 16-byte
stores.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from . import jit, ptx

THREADS = 256


def paired_position(h: int, block: int) -> int:
    """Where column h of a y row sits in the paired order of `block`-column blocks."""
    return h - h % block + (block // 8) * (h % 8) + (h % block) // 8


class TopkReduce:
    def __init__(self, ids_bytes: int, paired: int = 0, weighted: bool = False):
        assert paired in (0, 16, 32)
        self.ids_bytes = ids_bytes
        self.paired = paired
        self.weighted = weighted
        self.cols = paired if paired else 8  # y columns per thread

    @cute.jit
    def __call__(self, y: Int64, ids: Int64, route_w: Int64, out: Int64, tokens: Int32,
                 top_k: Int32, hidden: Int32, expert_offset: Int32, experts: Int32, stream):
        items = tokens * (hidden // self.cols)
        self.kernel(y, ids, route_w, out, items, top_k, hidden, expert_offset, experts).launch(
            grid=[(items + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream,
            use_pdl=jit.PDL)

    @cute.kernel
    def kernel(self, y: Int64, ids: Int64, route_w: Int64, out: Int64, items: Int32, top_k: Int32,
               hidden: Int32, expert_offset: Int32, experts: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        ptx.grid_dependency_wait()  # first: see jit.PDL
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * THREADS + tidx
        cols = self.cols
        if i < items:
            t = i // (hidden // cols)
            h0 = (i - t * (hidden // cols)) * cols
            acc = cute.make_rmem_tensor(cute.make_layout(cols), Float32)
            acc.fill(0.0)
            for j in cutlass.range(top_k, unroll=1):
                pair = t * top_k + j
                if cutlass.const_expr(self.ids_bytes == 4):
                    e = ptx.ld_nc_u32(ids + Int64(pair) * 4)
                else:
                    e = ptx.ld_nc_s64_as_s32(ids + Int64(pair) * 8)
                if cutlass.const_expr(self.weighted):
                    wt = ptx.ld_nc_f32(route_w + Int64(pair) * 4)
                if cutlass.Uint32(e - expert_offset) < cutlass.Uint32(experts):
                    src = y + (Int64(pair) * Int64(hidden) + Int64(h0)) * 4
                    vals = [ptx.ld_v4(src + 16 * q) for q in range(cols // 4)]
                    for c in cutlass.range_constexpr(cols):
                        v = ptx.f32_bits(vals[c // 4][c % 4])
                        if cutlass.const_expr(self.weighted):
                            v = wt * v
                        acc[c] = acc[c] + v
            # column h0 + c is acc[position of c]
            pos = [paired_position(c, cols) if self.paired else c for c in range(cols)]
            dst = out + (Int64(t) * Int64(hidden) + Int64(h0)) * 2
            for q in cutlass.range_constexpr(cols // 8):
                words = [ptx.bf16x2_from_f32(acc[pos[8 * q + 2 * w]], acc[pos[8 * q + 2 * w + 1]])
                         for w in range(4)]
                ptx.st_v4(dst + 16 * q, *words)
