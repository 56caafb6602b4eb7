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
or 8-byte store. A thread here owns one whole block of one token: B / 8 16-byte loads per
route, B / 8 16-byte stores.
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


def fragment_position(row0, r, gi: int, h: int, groups: int):
    """The writer's side of paired_position: where the MMA thread of fragment row r puts row
    row0 + 16 gi + r + 8 h (rows r and r + 8 of each of its `groups` consecutive 16-row
    groups, the first at row0, a multiple of 16 groups) in the paired order of 16 x groups
    blocks. A thread's 2 groups values are consecutive, so one store writes them."""
    return row0 + 2 * groups * r + 2 * gi + h


class TopkReduce:
    def __init__(self, ids_bytes: int, paired: int, weighted: bool):
        assert paired in (16, 32)
        self.ids_bytes = ids_bytes
        self.weighted = weighted
        self.cols = paired  # y columns per thread

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
                    src = y + (Int64(pair) * Int64(hidden) + Int64(h0)) * 2
                    vals = [ptx.ld_v4(src + 16 * q) for q in range(cols // 8)]
                    for c in cutlass.range_constexpr(cols):
                        word = vals[c // 8][(c % 8) // 2]
                        if cutlass.const_expr(c % 2 == 0):
                            v = ptx.bf16_lo_to_f32(word)
                        else:
                            v = ptx.bf16_hi_to_f32(word)
                        if cutlass.const_expr(self.weighted):
                            v = wt * v
                        acc[c] = acc[c] + v
            # column h0 + c is acc[position of c]
            pos = [paired_position(c, cols) for c in range(cols)]
            dst = out + (Int64(t) * Int64(hidden) + Int64(h0)) * 2
            for q in cutlass.range_constexpr(cols // 8):
                words = [ptx.bf16x2_from_f32(acc[pos[8 * q + 2 * w]], acc[pos[8 * q + 2 * w + 1]])
                         for w in range(4)]
                ptx.st_v4(dst + 16 * q, *words)
