"""Sum of the top-k weighted expert outputs per token, in a fixed order (deterministic).

    out[t, :] = bf16( sum_{j < k, id[t, j] local} y[t * k + j, :] )

y is fp32 [T * k, H] with rows of non-local routes never written: they are skipped by id, not
read. Each thread owns 8 consecutive h of one token: two 16-byte loads per route, one 16-byte
store, one rounding to bf16.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from . import ptx

THREADS = 256


class TopkReduce:
    def __init__(self, ids_bytes: int):
        self.ids_bytes = ids_bytes

    @cute.jit
    def __call__(self, y: Int64, ids: Int64, out: Int64, tokens: Int32, top_k: Int32, hidden: Int32,
                 expert_offset: Int32, experts: Int32, stream):
        items = tokens * (hidden // 8)
        self.kernel(y, ids, out, items, top_k, hidden, expert_offset, experts).launch(
            grid=[(items + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, y: Int64, ids: Int64, out: Int64, items: Int32, top_k: Int32, hidden: Int32,
               expert_offset: Int32, experts: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * THREADS + tidx
        if i < items:
            t = i // (hidden // 8)
            h0 = (i - t * (hidden // 8)) * 8
            acc = cute.make_rmem_tensor(cute.make_layout(8), Float32)
            acc.fill(0.0)
            for j in cutlass.range(top_k, unroll=1):
                pair = t * top_k + j
                if cutlass.const_expr(self.ids_bytes == 4):
                    e = ptx.ld_nc_u32(ids + Int64(pair) * 4)
                else:
                    e = ptx.ld_nc_s64_as_s32(ids + Int64(pair) * 8)
                if cutlass.Uint32(e - expert_offset) < cutlass.Uint32(experts):
                    src = y + (Int64(pair) * Int64(hidden) + Int64(h0)) * 4
                    lo = ptx.ld_v4(src)
                    hi = ptx.ld_v4(src + 16)
                    for c in cutlass.range_constexpr(4):
                        acc[c] = acc[c] + ptx.f32_bits(lo[c])
                        acc[4 + c] = acc[4 + c] + ptx.f32_bits(hi[c])
            ptx.st_v4(out + (Int64(t) * Int64(hidden) + Int64(h0)) * 2,
                      ptx.bf16x2_from_f32(acc[0], acc[1]), ptx.bf16x2_from_f32(acc[2], acc[3]),
                      ptx.bf16x2_from_f32(acc[4], acc[5]), ptx.bf16x2_from_f32(acc[6], acc[7]))
