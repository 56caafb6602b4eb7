"""CTA-wide exclusive prefix sums for routing tables (device side, trace-time helper).

Warp shuffles scan within each warp, one shared-memory slot per warp carries the warp totals,
and every thread adds the totals of the warps before its own: two CTA barriers for any CTA
size, where a Hillis-Steele scan over shared memory takes two per level (20 for 1024 threads).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

from . import ptx


def exclusive_scan2(a, b, tid, threads: int, s_warp):
    """Exclusive sums over thread order of two int32 values per thread, and their CTA totals:
    (prefix_a, prefix_b, total_a, total_b). s_warp: shared scratch of 2 * threads // 32 int32
    (free again after the caller's next CTA barrier)."""
    warps = threads // 32
    lane = tid % 32
    warp = tid // 32
    ia, ib = Int32(a), Int32(b)
    for d in (1, 2, 4, 8, 16):
        ua = ptx.shfl_up_i32(ia, d)
        ub = ptx.shfl_up_i32(ib, d)
        ia = ia + cutlass.select_(lane >= d, ua, Int32(0))
        ib = ib + cutlass.select_(lane >= d, ub, Int32(0))
    # every lane stores the same value (its warp's total, broadcast from lane 31)
    ptx.st_shared_u32(s_warp + warp * 4, ptx.shfl_idx_i32(ia, 31))
    ptx.st_shared_u32(s_warp + (warps + warp) * 4, ptx.shfl_idx_i32(ib, 31))
    cute.arch.sync_threads()
    oa, ob, ta, tb = Int32(0), Int32(0), Int32(0), Int32(0)
    for w in range(warps):
        va = ptx.ld_shared_u32(s_warp + w * 4)
        vb = ptx.ld_shared_u32(s_warp + (warps + w) * 4)
        oa = oa + cutlass.select_(Int32(w) < warp, va, Int32(0))
        ob = ob + cutlass.select_(Int32(w) < warp, vb, Int32(0))
        ta = ta + va
        tb = tb + vb
    return oa + ia - Int32(a), ob + ib - Int32(b), ta, tb
