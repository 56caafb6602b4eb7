"""Can FC1 gather its token rows with one tensor-map copy per row (development tool, GPU)?

    python tools/tma_row_probe.py [--hidden 7168] [--tokens 1024] [--slots 48] [--reps 400]

moe-gated's FC1 reads B from tile-blocked buffers that a separate launch (moe_gated.row_scatter)
fills: every routed pair's token row is written once and read back once (DeepSeek-V3 T=1024:
117 MB each way, a 40-50 us launch). Hopper's TMA has no gather, but a 2-D tensor map over x
[T, H] with a box of one row and 64 columns (128 bytes) and the 128-byte swizzle could place
each token slot's half K-tile straight into a stage, if the swizzle follows the destination's
shared-memory address (slot n's 16-byte chunk c at n x 128 + (c ^ (n % 8)) x 16, what the row
scatter writes and the wgmma descriptor reads) when the destination is 128-byte aligned but not
1024. A K-tile then takes 2 copies per token slot instead of 2 per tile. This probe answers:
1. placement: one CTA copies `--slots` random token rows (repeats allowed) of K-tile 0 and of
   the K-tile that holds column H - 1 (past H: the tensor map's zero fill) into two 64-column
   halves, one copy per row and half issued by the slot's lane, and writes the stage out; the
   host compares every byte with the swizzled layout above;
2. rate: one CTA per SM repeats that for `--reps` stages (expect_tx, copies), issued by 1 or 4
   warps, with 1 stage in flight (each waited for: the copies' latency) or a ring of 4 (a stage
   reused once its copies landed: the issue and the TMA unit's rate); the time per copy per SM
   is printed, to set beside what FC1 needs (DeepSeek-V3 T=1024 on an H100: ~96 copies per
   K-tile of ~0.9 us, 1766 K-tiles per SM in ~1.6 ms).
At 4c44bb6 on an H100 (benchmarks/HISTORY.md, 2026-12-06): the placement is right, past H too;
ptxas issues per-lane tensor copies one lane at a time (ELECT, two R2UR, two PLOP3, UTMALDG,
BRA), ~21 ns per copy per warp; four warps reach 7.3 ns per copy per SM without finding the TMA
unit's limit. FC1 built on it (three spare warps issuing, cddb2b4) was 7.5-26% slower at
DeepSeek-V3 and Qwen3-30B-A3B T = 1024-2048 (BENCHMARKS.md, "Measured decisions").
"""
from __future__ import annotations

import argparse
import json

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64
from cutlass.cutlass_dsl import dsl_user_op

from moe_common.cute import jit, ptx

TMA_2D = ("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
          "[$0], [$1, {$2, $3}], [$4];")


@dsl_user_op
def tma_row(dst, tmap, col, row, bar, *, loc=None, ip=None):
    """One box (64 columns of one row) of the tensor map at tmap (global) to shared dst."""
    ptx._stmt([Int32(dst).ir_value(loc=loc, ip=ip), Int64(tmap).ir_value(loc=loc, ip=ip),
               Int32(col).ir_value(loc=loc, ip=ip), Int32(row).ir_value(loc=loc, ip=ip),
               Int32(bar).ir_value(loc=loc, ip=ip)], TMA_2D, "r,l,r,r,r")


@dsl_user_op
def tensormap_acquire(tmap, *, loc=None, ip=None):
    ptx._stmt([Int64(tmap).ir_value(loc=loc, ip=ip)],
              "fence.proxy.tensormap::generic.acquire.gpu [$0], 128;", "l")


class RowProbe:
    """Per CTA: `reps` stages of `slots` token rows x 2 halves through a ring of `ring` stages
    (a stage is reused once its previous copies have landed), copied by `warps` warps (slot j by
    lane j % 32 of warp j // 32 % warps), CTA 0 writing its last stage to `out`."""

    def __init__(self, slots: int, warps: int, ring: int = 1):
        self.slots, self.warps, self.ring = slots, warps, ring
        self.half = -(-slots * 128 // 1024) * 1024
        self.stage = 2 * self.half
        self.smem = ring * self.stage + 1024

    @cute.jit
    def __call__(self, tmap: Int64, rows: Int64, out: Int64, col0: Int32, reps: Int32,
                 grid: Int32, stream):
        self.kernel(tmap, rows, out, col0, reps).launch(
            grid=[grid, 1, 1], block=[32 * self.warps, 1, 1], smem=self.smem, stream=stream)

    @cute.kernel
    def kernel(self, tmap: Int64, rows: Int64, out: Int64, col0: Int32, reps: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        buf = smem.allocate_array(cutlass.Uint8, self.smem, byte_alignment=1024)
        base = Int32(buf.toint())
        bars = base + self.ring * self.stage
        if tidx == 0:
            for s in cutlass.range_constexpr(self.ring):
                ptx.mbarrier_init(bars + 8 * s, 1)
            ptx.fence_mbarrier_init()
        tensormap_acquire(tmap)
        cute.arch.sync_threads()
        per = -(-self.slots // (32 * self.warps))
        slot = [cutlass.min(tidx + 32 * self.warps * u, self.slots - 1) for u in range(per)]
        toks = [ptx.ld_u32(rows + Int64(j) * 4) for j in slot]
        for r in cutlass.range(reps, unroll=1):
            s = r % self.ring
            bar = bars + 8 * s
            if r >= self.ring:  # the stage's previous copies have landed
                ptx.mbarrier_wait(bar, (r // self.ring - 1) % 2)
            cute.arch.sync_threads()
            if tidx == 0:
                ptx.mbarrier_arrive_expect_tx(bar, self.slots * 256)
            cute.arch.sync_threads()  # the expected bytes before any copy completes
            at = base + s * self.stage
            for u in cutlass.range_constexpr(per):
                j = tidx + 32 * self.warps * u
                if j < self.slots:
                    for h in cutlass.range_constexpr(2):
                        tma_row(at + h * self.half + j * 128, tmap, col0 + 64 * h, toks[u], bar)
        for r in cutlass.range(cutlass.max(reps - self.ring, 0), reps, unroll=1):
            ptx.mbarrier_wait(bars + 8 * (r % self.ring), (r // self.ring) % 2)
        cute.arch.sync_threads()
        if bid == 0:
            last = base + ((reps - 1) % self.ring) * self.stage
            for i in cutlass.range(tidx, self.stage // 16, 32 * self.warps, unroll=1):
                v = ptx.ld_shared_v4(last + i * 16)
                ptx.st_v4(out + Int64(i) * 16, v[0], v[1], v[2], v[3])


def tensor_map(x: torch.Tensor) -> torch.Tensor:
    """x [T, H] bf16 (rows 16-byte aligned) as a CUtensorMap: boxes of 64 columns x 1 row, the
    128-byte swizzle, zero fill past H; its 128 bytes in a device tensor."""
    from cuda.bindings import driver as d

    t, h = x.shape
    err, tm = d.cuTensorMapEncodeTiled(
        d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, d.cuuint32_t(2), x.data_ptr(),
        [d.cuuint64_t(h), d.cuuint64_t(t)], [d.cuuint64_t(x.stride(0) * 2)],
        [d.cuuint32_t(64), d.cuuint32_t(1)], [d.cuuint32_t(1), d.cuuint32_t(1)],
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    assert err == d.CUresult.CUDA_SUCCESS, err
    words = [w - (1 << 64) if w >= 1 << 63 else w for w in (int(v) for v in tm.opaque)]
    return torch.tensor(words, dtype=torch.int64, device=x.device)


def expected(x: torch.Tensor, rows: torch.Tensor, col0: int, half_bytes: int) -> torch.Tensor:
    """The stage as bytes: half hb, slot n, physical chunk c ^ (n % 8) = columns col0 + 64 hb +
    8 c .. + 7 of row rows[n] (zeros past H)."""
    t, h = x.shape
    xp = torch.zeros(t, max(h, col0 + 128), dtype=x.dtype, device=x.device)
    xp[:, :h] = x
    want = torch.zeros(2, half_bytes // 2, dtype=x.dtype, device=x.device)
    for hb in range(2):
        for n, r in enumerate(rows.tolist()):
            for c in range(8):
                p = (c ^ (n % 8))
                at = (n * 128 + p * 16) // 2
                want[hb, at:at + 8] = xp[r, col0 + 64 * hb + 8 * c: col0 + 64 * hb + 8 * c + 8]
    return want.view(torch.uint8).flatten()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--slots", type=int, nargs="+", default=[32, 48, 96])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    x = torch.randn(args.tokens, args.hidden, device=dev).to(torch.bfloat16)
    tmap = tensor_map(x)
    # the placement also at a hidden size that is not a multiple of 128 (gpt-oss-120b's), whose
    # last K-tile's copies read past H (the tensor map's zero fill)
    x_odd = torch.randn(args.tokens, 2880, device=dev).to(torch.bfloat16)
    checks = [(x, tmap), (x_odd, tensor_map(x_odd))]
    sms = jit.device_properties(dev).multi_processor_count
    stream = jit.current_stream(dev)
    results = []
    for slots in args.slots:
        rows = torch.randint(0, args.tokens, (slots,), dtype=torch.int32, device=dev)
        for warps, ring in ((1, 1), (4, 1), (1, 4), (4, 4)):
            probe = RowProbe(slots, warps, ring)
            fn = jit.compile_kernel(probe, Int64(0), Int64(0), Int64(0), Int32(0), Int32(1),
                                    Int32(1), jit.example_stream())
            out = torch.full((probe.stage,), 0xFF, dtype=torch.uint8, device=dev)
            ok = True
            for xc, tc in checks:
                for col0 in (0, (xc.shape[1] - 1) // 128 * 128):  # the first and last K-tile
                    out.fill_(0xFF)
                    fn(tc.data_ptr(), rows.data_ptr(), out.data_ptr(), col0, 1, 1, stream)
                    torch.cuda.synchronize()
                    ok &= bool(torch.equal(out, expected(xc, rows, col0, probe.half)))
            fn(tmap.data_ptr(), rows.data_ptr(), out.data_ptr(), 0, args.reps, sms, stream)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(tmap.data_ptr(), rows.data_ptr(), out.data_ptr(), 0, args.reps, sms, stream)
            end.record()
            torch.cuda.synchronize()
            us = start.elapsed_time(end) * 1e3
            r = {"slots": slots, "warps": warps, "ring": ring, "placement_ok": ok,
                 "reps": args.reps, "ctas": sms, "us": us, "us_per_stage": us / args.reps,
                 "ns_per_copy_per_sm": us * 1e3 / (args.reps * 2 * slots),
                 "GBps": sms * args.reps * slots * 256 / (us * 1e3)}
            results.append(r)
            print(f"slots {slots} warps {warps} ring {ring}: "
                  f"placement {'right' if ok else 'WRONG'}; "
                  f"{r['us_per_stage']:.3f} us per stage of {2 * slots} copies "
                  f"({r['ns_per_copy_per_sm']:.1f} ns per copy per SM, {r['GBps']:.0f} GB/s "
                  f"over {sms} SMs)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
