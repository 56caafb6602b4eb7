"""The moe-gated CuTe DSL kernel: a persistent grouped GEMM with 128-token tiles on warpgroup MMA.

    FC1: inter[p, j]  = act(scale_2[e] * (src[order[p] // row_div] @ w13[e]^T) + b13[e])  (bf16)
    FC2: y[order[p], h] = w[order[p]] * (scale_2[e] * (inter[p] @ w2[e]^T) + b2[e])      (fp32)

p runs over routed pairs sorted by expert (moe_common.cute.routing, 128-pair tiles).

Branch pairing: the packed w13 (moe_common.packed) holds each 16-row group as [8 gate rows;
8 up rows] of the same 8 intermediate columns, so the MMA puts gate (row r) and up (row r + 8)
of one (column, token) in the same thread's accumulators and the activation is applied in the
FC1 epilogue, with no second pass and no gate/up round trip through memory.

Work: items (token tile, 256-row weight tile), taken from a device-side atomic queue by
persistent CTAs (one per SM), so an expert with many tokens is spread over every SM and skewed
routing stays balanced. Consecutive tickets are the row tiles of one token tile, so the
concurrently running CTAs share that tile's token rows in L2.

Per CTA: 2 warpgroups; warp w owns weight groups (16 rows each) 2w and 2w + 1 of the row tile.
Per 128-deep K-tile each warpgroup issues, per k16 slab, two wgmma m64n128k16 with A (the
weights, decoded e2m1 -> bf16 and scaled in registers) from registers and B (the 128 tokens)
from shared memory. 128 tokens per tile spend the decode (~20 integer instructions per 8
weights) on 4x the FLOPs of moe-generic's 32-token tiles, which is what bounds moe-generic's
prefill (BENCHMARKS.md).

Pipeline: a STAGES-deep cp.async ring per K-tile (token rows gathered by row address, zero-
filled past the tile and past the real K; each warp's weight tiles); one CTA barrier per K-tile.
wgmma runs asynchronously: each slab is its own commit group and at most PENDING slabs stay in
flight across the K-tile boundary, so the tensor cores work while the next tile's barrier,
shared-memory reads and first decode run. A stage is refilled two K-tiles after its use
(look-ahead STAGES - 2), when no wgmma can still be reading it.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from moe_common.cute import activation as act
from moe_common.cute import fragment_mma as fm
from moe_common.cute import ptx
from moe_common.cute.wgmma_decode import wgmma_decode_k128

TILE_K = 128
BN = 128  # tokens per tile = wgmma N
WARPGROUPS = 2
WARPS = 4 * WARPGROUPS
THREADS = 32 * WARPS
GROUPS_PER_WARP = 2  # 16-row weight groups per warp = wgmmas per warpgroup per slab
ROW_TILE = WARPS * GROUPS_PER_WARP * 16  # 256 weight rows per work item
STAGES = 4  # NVFP4: 4 x 52 KiB of shared memory, one CTA per SM
LOOK = STAGES - 2  # K-tiles loaded ahead (one stage is still read by in-flight wgmmas)


@dataclass(frozen=True)
class GatedConfig:
    phase: str  # "fc1" | "fc2"
    weight_format: str  # "nvfp4" | "mxfp4"
    activation: str = "silu"  # fc1: silu | gelu_tanh | swigluoai (alpha/beta/limit at run time)
    pending: int = 2  # wgmma slabs left in flight when a K-tile's block returns
    # timing-only variants (wrong results): "nodecode" feeds raw codes to the MMA, "nomma" skips it
    variant: str = "full"


class GatedGemm:
    def __init__(self, cfg: GatedConfig):
        assert cfg.phase in ("fc1", "fc2")
        assert cfg.phase == "fc2" or cfg.activation in ("silu", "gelu_tanh", "swigluoai")
        self.cfg = cfg
        self.b_bytes = BN * TILE_K * 2
        self.a_group_bytes = fm.group_tile_bytes(cfg.weight_format)
        self.stage_bytes = self.b_bytes + WARPS * GROUPS_PER_WARP * self.a_group_bytes
        self.smem_bytes = STAGES * self.stage_bytes + 16  # + two ticket slots
        assert 2 * BN == THREADS  # two threads per token row, 8 chunks each per K-tile

    # ------------------------------------------------------------------ host entry
    @cute.jit
    def __call__(
        self,
        wblob: Int64, sblob: Int64, gscale: Int64, bias: Int64,
        tile_expert: Int64, tile_start: Int64, tile_end: Int64, num_tiles: Int64,
        order: Int64, row_div: Int32, src: Int64, src_stride: Int32, k_real: Int32,
        k_tiles: Int32, row_groups: Int32,
        out: Int64, out_stride: Int32, out_rows: Int32, route_w: Int64,
        act_alpha: Float32, act_beta: Float32, act_limit: Float32,
        queue: Int64, grid: Int32, stream,
    ):
        self.kernel(
            wblob, sblob, gscale, bias, tile_expert, tile_start, tile_end, num_tiles,
            order, row_div, src, src_stride, k_real, k_tiles, row_groups,
            out, out_stride, out_rows, route_w, act_alpha, act_beta, act_limit, queue, grid,
        ).launch(grid=[grid, 1, 1], block=[THREADS, 1, 1], smem=self.smem_bytes, stream=stream)

    # ------------------------------------------------------------------ device
    @cute.kernel
    def kernel(
        self,
        wblob: Int64, sblob: Int64, gscale: Int64, bias: Int64,
        tile_expert: Int64, tile_start: Int64, tile_end: Int64, num_tiles: Int64,
        order: Int64, row_div: Int32, src: Int64, src_stride: Int32, k_real: Int32,
        k_tiles: Int32, row_groups: Int32,
        out: Int64, out_stride: Int32, out_rows: Int32, route_w: Int64,
        act_alpha: Float32, act_beta: Float32, act_limit: Float32,
        queue: Int64, grid: Int32,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        smem = cutlass.memory.SmemAllocator()
        sbuf = smem.allocate_array(cutlass.Uint8, self.smem_bytes, byte_alignment=128)
        s_base = Int32(sbuf.toint())
        slots = s_base + STAGES * self.stage_bytes

        row_tiles = (row_groups + (ROW_TILE // 16 - 1)) // (ROW_TILE // 16)
        total = Int32(ptx.ld_u32(num_tiles)) * row_tiles
        # queue[0]: next ticket; queue[1]: CTAs finished. The last CTA to finish sets both back
        # to 0, so the next launch (or CUDA-graph replay) starts from a clean queue.
        if tidx == 0:
            ptx.st_shared_u32(slots, ptx.atom_add_global(queue, 1))
        cute.arch.sync_threads()
        item = ptx.ld_shared_u32(slots)
        it = Int32(0)
        while item < total:
            self._work_item(item // row_tiles, item % row_tiles, s_base, tidx,
                            wblob, sblob, gscale, bias, tile_expert, tile_start, tile_end,
                            order, row_div, src, src_stride, k_real, k_tiles, row_groups,
                            out, out_stride, out_rows, route_w, act_alpha, act_beta, act_limit)
            it = it + 1
            slot = slots + (it % 2) * 4  # two slots: a slot is rewritten two barriers after its read
            if tidx == 0:
                ptx.st_shared_u32(slot, ptx.atom_add_global(queue, 1))
            cute.arch.sync_threads()
            item = ptx.ld_shared_u32(slot)
        if tidx == 0:
            if ptx.atom_add_global(queue + 4, 1) == grid - 1:
                ptx.st_u32(queue, 0)
                ptx.st_u32(queue + 4, 0)

    @cute.jit
    def _work_item(self, tile, rt, s_base, tidx,
                   wblob, sblob, gscale, bias, tile_expert, tile_start, tile_end,
                   order, row_div, src, src_stride, k_real, k_tiles, row_groups,
                   out, out_stride, out_rows, route_w, act_alpha, act_beta, act_limit):
        cfg = self.cfg
        e = ptx.ld_u32(tile_expert + Int64(tile) * 4)
        p0 = ptx.ld_u32(tile_start + Int64(tile) * 4)
        p1 = ptx.ld_u32(tile_end + Int64(tile) * 4)
        warp = tidx // 32
        lane = tidx % 32
        r = lane // 4
        q = lane % 4

        # ---- this warp's weight groups (a warpgroup past the real rows sits out: rows are
        # padded to 128 = one warpgroup's share, so the test is warpgroup-uniform)
        group0 = rt * (ROW_TILE // 16) + warp * GROUPS_PER_WARP
        active = group0 < row_groups
        sbpr = fm.scale_bytes_per_row(cfg.weight_format)
        tile_idx0 = (Int64(e) * Int64(row_groups) + Int64(group0)) * Int64(k_tiles)
        w_warp = wblob + tile_idx0 * 1024
        s_warp = sblob + tile_idx0 * (16 * sbpr)
        group_w_stride = Int64(k_tiles) * 1024
        group_s_stride = Int64(k_tiles) * (16 * sbpr)
        a_warp_off = self.b_bytes + warp * GROUPS_PER_WARP * self.a_group_bytes

        # ---- this thread's token row and half: rows n and chunk parity h chosen so each
        # 8-lane phase of a copy writes 8 distinct 16-byte bank groups and lanes (n, 0), (n, 1)
        # read one 32-byte sector together
        j = lane % 16
        a = j // 4
        h = (a ^ (a // 2)) % 2
        n = warp * 16 + (lane // 16) * 8 + (j % 4) + 4 * (a % 2)
        p = p0 + n
        row_base = src
        row_ok = Int32(0)
        if p < p1:
            row = p  # FC2 reads the intermediate in sorted order
            if cutlass.const_expr(cfg.phase == "fc1"):
                row = ptx.ld_u32(order + Int64(p) * 4) // row_div
            row_base = src + Int64(row) * Int64(src_stride) * 2
            row_ok = Int32(1)

        acc = cute.make_rmem_tensor(cute.make_layout((GROUPS_PER_WARP, BN // 8, 4)), Float32)
        acc.fill(0.0)

        for st in cutlass.range_constexpr(LOOK):
            if st < k_tiles:
                self._issue_stage(Int32(st), s_base + st * self.stage_bytes, lane, n, h, row_base,
                                  row_ok, src, k_real, active, w_warp, s_warp, group_w_stride,
                                  group_s_stride, a_warp_off)
            ptx.cp_async_commit()
        for kt in cutlass.range(k_tiles, unroll=1):
            ptx.cp_async_wait(LOOK - 1)
            ptx.fence_proxy_async_shared()  # cp.async writes -> wgmma (async proxy) reads
            cute.arch.sync_threads()  # K-tile kt landed everywhere; K-tile kt-2's wgmmas are done
            nxt = kt + LOOK
            if nxt < k_tiles:
                self._issue_stage(nxt, s_base + (nxt % STAGES) * self.stage_bytes, lane, n, h,
                                  row_base, row_ok, src, k_real, active, w_warp, s_warp,
                                  group_w_stride, group_s_stride, a_warp_off)
            ptx.cp_async_commit()
            if active:
                stage = s_base + (kt % STAGES) * self.stage_bytes
                words = [fm.load_group_words(stage + a_warp_off + g * self.a_group_bytes, lane,
                                             cfg.weight_format) for g in range(GROUPS_PER_WARP)]
                if cutlass.const_expr(cfg.variant == "nomma"):
                    for g in cutlass.range_constexpr(GROUPS_PER_WARP):
                        acc[g, 0, 0] = acc[g, 0, 0] + Float32(ptx.f32_bits(words[g][0] ^ words[g][9]))
                else:
                    accs = [[acc[g, i // 4, i % 4] for i in range(BN // 2)] for g in range(GROUPS_PER_WARP)]
                    res = wgmma_decode_k128(accs, [w[:8] for w in words], [w[8:] for w in words],
                                            cfg.weight_format, stage, BN, pending=cfg.pending,
                                            decode=cfg.variant != "nodecode")
                    for g in cutlass.range_constexpr(GROUPS_PER_WARP):
                        for i in cutlass.range_constexpr(BN // 2):
                            acc[g, i // 4, i % 4] = res[g][i]
        ptx.cp_async_wait(0)
        ptx.wgmma_wait(0)

        # ---- epilogue: global scale, bias, then the activation (FC1) or router weight (FC2)
        if active:
            gs = ptx.ld_nc_f32(gscale + Int64(e) * 4)
            for g in cutlass.range_constexpr(GROUPS_PER_WARP):
                row0 = (group0 + g) * 16 + r  # blob row of acc[g, ., 0/1]; + 8 for acc[g, ., 2/3]
                brow = bias + (Int64(e) * Int64(row_groups * 16) + Int64(row0)) * 4
                b_lo = ptx.ld_nc_f32(brow)
                b_hi = ptx.ld_nc_f32(brow + 32)
                for nb in cutlass.range_constexpr(BN // 8):
                    for c in cutlass.range_constexpr(2):
                        pp = p0 + nb * 8 + 2 * q + c
                        if pp < p1:
                            v_lo = acc[g, nb, c] * gs + b_lo
                            v_hi = acc[g, nb, 2 + c] * gs + b_hi
                            if cutlass.const_expr(cfg.phase == "fc1"):
                                hv = act.gated(cfg.activation, v_lo, v_hi, act_alpha, act_beta, act_limit)
                                dst = out + (Int64(pp) * Int64(out_stride) + Int64((group0 + g) * 8 + r)) * 2
                                ptx.st_u16(dst, ptx.bf16x2_from_f32(hv, hv))
                            else:
                                pair = ptx.ld_u32(order + Int64(pp) * 4)
                                wgt = ptx.ld_nc_f32(route_w + Int64(pair) * 4)
                                dst = out + (Int64(pair) * Int64(out_stride)) * 4
                                if row0 < out_rows:
                                    ptx.st_f32(dst + Int64(row0) * 4, v_lo * wgt)
                                if row0 + 8 < out_rows:
                                    ptx.st_f32(dst + Int64(row0 + 8) * 4, v_hi * wgt)

    # ------------------------------------------------------------------ pieces
    @cute.jit
    def _issue_stage(self, kt, stage, lane, n, h, row_base, row_ok, src, k_real, active,
                     w_warp, s_warp, group_w_stride, group_s_stride, a_warp_off):
        """cp.async K-tile kt's token rows (whole CTA) and this warp's weight tiles into a stage.

        B layout: K-major 8 x 16-byte core matrices, chunk ch of token n at (ch * BN + n) * 16,
        as wgmma_decode_k128 describes it to the tensor cores.
        """
        cfg = self.cfg
        for i in cutlass.range_constexpr(TILE_K // 16):
            ch = 2 * i + h
            k0 = kt * TILE_K + ch * 8
            nbytes = Int32(0)
            gaddr = src  # any valid address when nothing is read (zero-fill)
            if row_ok != Int32(0):
                if k0 < k_real:
                    gaddr = row_base + Int64(k0) * 2
                    nbytes = Int32(16)
            ptx.cp_async_16_zfill(stage + (ch * BN + n) * 16, gaddr, nbytes)
        if active:
            scale_chunks = fm.scale_bytes_per_row(cfg.weight_format)  # 16 rows x sbpr bytes
            for g in cutlass.range_constexpr(GROUPS_PER_WARP):
                dst = stage + a_warp_off + g * self.a_group_bytes
                wsrc = w_warp + Int64(g) * group_w_stride + Int64(kt) * 1024 + Int64(lane) * 32
                ptx.cp_async_16(dst + lane * 32, wsrc)
                ptx.cp_async_16(dst + lane * 32 + 16, wsrc + 16)
                if lane < scale_chunks:
                    ssrc = s_warp + Int64(g) * group_s_stride + Int64(kt) * (16 * scale_chunks)
                    ptx.cp_async_16(dst + 1024 + lane * 16, ssrc + Int64(lane) * 16)
