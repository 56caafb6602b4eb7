"""The moe-static CuTe DSL kernel: a whole MoE layer in one persistent, cooperative launch.

For small routed batches the layer is a weight stream: every active expert's 4-bit weights are
read once, and the FLOPs are negligible. One launch does it all:

1. Routing, redundantly in every CTA (P = T * k <= MAX_PAIRS ids, a few KiB from L2): a shared
   histogram of local experts, a scan, the ascending list of active experts and the routed pairs
   of each expert. Every CTA derives the same task list, so no grid-wide step is needed yet.
2. Tasks (active expert a, intermediate slice s of SLICE = 128 columns), taken statically by
   CTA (task = blockIdx + i * gridDim). A task streams
     - FC1 rows of its slice (gated: 128 gate + 128 up rows, as 16 groups of [8 gate; 8 up];
       relu2: 128 rows) over all of H, against the expert's token rows (gathered from x), and
       applies scale_2, bias and the activation in the epilogue -> bf16 intermediate slice
       [tokens, 128] in shared memory (it never leaves the SM);
     - FC2 columns s of w2 (one 128-deep K-tile of every H row) against that slice, giving the
       slice's partial FC2 sums part[pair, s, :] (fp32, unscaled) in a global workspace.
   FC1 K-tiles and FC2 row stages run through one cp.async ring, so FC2's weights are already
   in flight while FC1 finishes (the kernel is memory-bound: nothing may wait on a bubble).
   (A warp-specialized variant, one producer warp issuing cp.async.bulk copies with an mbarrier
   per slot and no CTA barrier in the stream, measured 25-45% slower: commits b7ba1a2, bbb57a4,
   BENCHMARKS.md. ncu of this one: issue-bound on the integer-pipe decode plus the per-stage
   barrier.)
   An expert with more than BN tokens is done in chunks of BN (weights re-read, from L2).
3. Grid barrier (cooperative launch: every CTA is resident), then every CTA reduces a share of
   out[t, h] = bf16( sum_j w[t, j] * (alpha2[e] * sum_s part[t*k+j, s, h] + b2[e, h]) ) in a
   fixed order: bitwise deterministic, one rounding, every element written (0 when no route of
   token t is local).
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from moe_common.cute import activation as act
from moe_common.cute import fragment_mma as fm
from moe_common.cute import ptx

# 16 warps, one weight group each per stage: the e2m1 decode (~20 integer instructions per 8
# weights) is most of the issue work at full bandwidth, so the SM needs many warps to hide its
# latency (4 warps x 4 groups measured 1.1-1.6 TB/s on DeepSeek-V3 at T=1..64).
WARPS = 16
THREADS = WARPS * 32
TILE_K = fm.TILE_K
SLICE = 128  # intermediate columns per task (= one FC2 K-tile)
FC2_GROUPS_PER_WARP = 1  # an FC2 stage covers 16 warps x 1 group x 16 = 256 rows of H
REDUCE_LANES = 8  # lanes per output quad in the final reduce (each takes every 8th route)
REDUCE_UNROLL = 8  # slice partials loaded together (independent loads in flight)
MAX_LOCAL_EXPERTS = 512
MAX_PAIRS = 2048
EXPERTS_PER_THREAD = MAX_LOCAL_EXPERTS // THREADS
SCAN_LEVELS = THREADS.bit_length() - 1


@dataclass(frozen=True)
class StaticConfig:
    weight_format: str  # "nvfp4" | "mxfp4"
    activation: str  # silu | gelu_tanh | swigluoai | relu2
    ids_bytes: int = 4  # topk_ids int32 or int64
    # tokens per chunk (multiple of 8). 8 measured faster than 16 at every point (DeepSeek-V3
    # T=1/8/64: 101/695/2636 us vs 110/737/2866 us): half the MMAs and ldmatrix per weight byte,
    # and an expert with more tokens re-reads its slice from L2, not HBM.
    bn: int = 8
    stages: int = 6  # cp.async ring depth: ~5 stages x 25 KiB of weights in flight per SM
    run_tasks: bool = True  # False: routing, barrier and reduce only (timing the fixed cost)

    @property
    def gated(self) -> bool:
        return self.activation != "relu2"

    @property
    def fc1_groups(self) -> int:  # 16-row weight groups of FC1 per task
        return 2 * SLICE // 16 if self.gated else SLICE // 16

    @property
    def mw1(self) -> int:  # FC1 groups per warp
        return max(1, self.fc1_groups // WARPS)

    @property
    def fc1_warps(self) -> int:  # warps with FC1 work (relu2: 8 groups, 8 warps)
        return self.fc1_groups // self.mw1


class StaticMoE:
    def __init__(self, cfg: StaticConfig):
        assert cfg.bn % 8 == 0 and cfg.bn <= 32
        self.cfg = cfg
        self.nb = cfg.bn // 8
        self.gtb = fm.group_tile_bytes(cfg.weight_format)
        self.b_bytes = cfg.bn * fm.B_ROW_BYTES
        fc1_stage = self.b_bytes + cfg.fc1_groups * self.gtb
        fc2_stage = WARPS * FC2_GROUPS_PER_WARP * self.gtb
        self.stage_bytes = max(fc1_stage, fc2_stage)
        self.b_chunks = cfg.bn * (TILE_K // 8)  # 16-byte pieces of one B stage
        self.b_iters = -(-self.b_chunks // THREADS)
        # shared memory: ring | intermediate slice | routing tables
        self.inter_off = cfg.stages * self.stage_bytes
        self.route_off = self.inter_off + self.b_bytes
        self.route_bytes = (4 * MAX_LOCAL_EXPERTS + MAX_PAIRS + 2 * THREADS + 4) * 4
        self.smem_bytes = self.route_off + self.route_bytes

    # ------------------------------------------------------------------ host entry
    @cute.jit
    def __call__(
        self,
        w13: Int64, s13: Int64, alpha1: Int64, b13: Int64,
        w2: Int64, s2: Int64, alpha2: Int64, b2: Int64,
        ids: Int64, route_w: Int64, x: Int64, x_stride: Int32,
        tokens: Int32, top_k: Int32, expert_offset: Int32, experts: Int32,
        hidden: Int32, k_tiles1: Int32, groups1: Int32, groups2: Int32, slices: Int32,
        part: Int64, out: Int64, barrier: Int64,
        act_alpha: Float32, act_beta: Float32, act_limit: Float32,
        grid: Int32, stream,
    ):
        self.kernel(
            w13, s13, alpha1, b13, w2, s2, alpha2, b2, ids, route_w, x, x_stride,
            tokens, top_k, expert_offset, experts, hidden, k_tiles1, groups1, groups2, slices,
            part, out, barrier, act_alpha, act_beta, act_limit,
        ).launch(grid=[grid, 1, 1], block=[THREADS, 1, 1], smem=self.smem_bytes, stream=stream,
                 cooperative=True)

    # ------------------------------------------------------------------ device
    @cute.kernel
    def kernel(
        self,
        w13: Int64, s13: Int64, alpha1: Int64, b13: Int64,
        w2: Int64, s2: Int64, alpha2: Int64, b2: Int64,
        ids: Int64, route_w: Int64, x: Int64, x_stride: Int32,
        tokens: Int32, top_k: Int32, expert_offset: Int32, experts: Int32,
        hidden: Int32, k_tiles1: Int32, groups1: Int32, groups2: Int32, slices: Int32,
        part: Int64, out: Int64, barrier: Int64,
        act_alpha: Float32, act_beta: Float32, act_limit: Float32,
    ):
        cfg = self.cfg
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        smem = cutlass.memory.SmemAllocator()
        sbuf = smem.allocate_array(cutlass.Uint8, self.smem_bytes, byte_alignment=128)
        s_base = Int32(sbuf.toint())
        s_cnt = s_base + self.route_off           # [E] routed pairs per local expert
        s_off = s_cnt + MAX_LOCAL_EXPERTS * 4     # [E] first position of each expert
        s_cur = s_off + MAX_LOCAL_EXPERTS * 4     # [E] position cursor
        s_act = s_cur + MAX_LOCAL_EXPERTS * 4     # [n_act] active experts, ascending
        s_ord = s_act + MAX_LOCAL_EXPERTS * 4     # [P] pair indices grouped by expert
        s_scan = s_ord + MAX_PAIRS * 4            # [2][THREADS] scan scratch
        s_nact = s_scan + 2 * THREADS * 4         # number of active experts
        pairs = tokens * top_k

        self._route(ids, pairs, expert_offset, experts, tid, s_cnt, s_off, s_cur, s_act, s_ord,
                    s_scan, s_nact)
        n_tasks = ptx.ld_shared_u32(s_nact) * slices
        if cutlass.const_expr(not cfg.run_tasks):
            n_tasks = Int32(0)
        for task in cutlass.range(bid, n_tasks, grid, unroll=1):
            a = task // slices
            sl = task - a * slices
            e = ptx.ld_shared_u32(s_act + a * 4)
            cnt = ptx.ld_shared_u32(s_cnt + e * 4)
            first = ptx.ld_shared_u32(s_off + e * 4)
            for c0 in cutlass.range(0, cnt, cfg.bn, unroll=1):
                self._chunk(w13, s13, alpha1, b13, w2, s2, x, x_stride, top_k, hidden, k_tiles1,
                            groups1, groups2, slices, part, act_alpha, act_beta, act_limit,
                            s_base, s_ord, e, sl, first + c0, cutlass.min(cnt - c0, cfg.bn), tid)

        # every partial is written: wait for the whole grid, then reduce
        cute.arch.sync_threads()
        if tid == 0:
            ptx.grid_barrier_arrive_wait(barrier, grid - 1)
        cute.arch.sync_threads()
        self._reduce(ids, route_w, alpha2, b2, part, out, tokens, top_k, expert_offset, experts,
                     hidden, groups2, slices, bid, grid, tid)

    # ------------------------------------------------------------------ routing (per CTA)
    @cute.jit
    def _local_expert(self, ids, p, expert_offset):
        if cutlass.const_expr(self.cfg.ids_bytes == 4):
            e = ptx.ld_nc_u32(ids + Int64(p) * 4)
        else:
            e = ptx.ld_nc_s64_as_s32(ids + Int64(p) * 8)
        return e - expert_offset  # local id; valid iff 0 <= e < experts (unsigned compare)

    @cute.jit
    def _route(self, ids, pairs, expert_offset, experts, tid, s_cnt, s_off, s_cur, s_act, s_ord,
               s_scan, s_nact):
        for i in cutlass.range_constexpr(EXPERTS_PER_THREAD):
            ptx.st_shared_u32(s_cnt + (tid + i * THREADS) * 4, 0)
        cute.arch.sync_threads()
        for p in cutlass.range(tid, pairs, THREADS, unroll=1):
            e = self._local_expert(ids, p, expert_offset)
            if cutlass.Uint32(e) < cutlass.Uint32(experts):
                ptx.atom_add_shared(s_cnt + e * 4, 1)
        cute.arch.sync_threads()
        # thread tid owns experts [tid * EPT, tid * EPT + EPT): pair and active-expert totals
        e0 = tid * EXPERTS_PER_THREAD
        n_pairs = Int32(0)
        n_act = Int32(0)
        for i in cutlass.range_constexpr(EXPERTS_PER_THREAD):
            c = ptx.ld_shared_u32(s_cnt + (e0 + i) * 4)
            n_pairs = n_pairs + c
            n_act = n_act + cutlass.min(c, 1)
        ptx.st_shared_u32(s_scan + tid * 4, n_pairs)
        ptx.st_shared_u32(s_scan + (THREADS + tid) * 4, n_act)
        cute.arch.sync_threads()
        for lvl in cutlass.range_constexpr(SCAN_LEVELS):  # inclusive Hillis-Steele scans
            off = 1 << lvl
            da = Int32(0)
            db = Int32(0)
            if tid >= off:
                da = ptx.ld_shared_u32(s_scan + (tid - off) * 4)
                db = ptx.ld_shared_u32(s_scan + (THREADS + tid - off) * 4)
            cute.arch.sync_threads()
            if tid >= off:
                ptx.st_shared_u32(s_scan + tid * 4, ptx.ld_shared_u32(s_scan + tid * 4) + da)
                ptx.st_shared_u32(s_scan + (THREADS + tid) * 4,
                                  ptx.ld_shared_u32(s_scan + (THREADS + tid) * 4) + db)
            cute.arch.sync_threads()
        pos = ptx.ld_shared_u32(s_scan + tid * 4) - n_pairs
        slot = ptx.ld_shared_u32(s_scan + (THREADS + tid) * 4) - n_act
        for i in cutlass.range_constexpr(EXPERTS_PER_THREAD):
            e = e0 + i
            c = ptx.ld_shared_u32(s_cnt + e * 4)
            ptx.st_shared_u32(s_off + e * 4, pos)
            ptx.st_shared_u32(s_cur + e * 4, pos)
            if c > 0:
                ptx.st_shared_u32(s_act + slot * 4, e)
                slot = slot + 1
            pos = pos + c
        if tid == THREADS - 1:
            ptx.st_shared_u32(s_nact, slot)
        cute.arch.sync_threads()
        for p in cutlass.range(tid, pairs, THREADS, unroll=1):
            e = self._local_expert(ids, p, expert_offset)
            if cutlass.Uint32(e) < cutlass.Uint32(experts):
                at = ptx.atom_add_shared(s_cur + e * 4, 1)
                ptx.st_shared_u32(s_ord + at * 4, p)
        cute.arch.sync_threads()

    # ------------------------------------------------------------------ one task chunk
    @cute.jit
    def _chunk(self, w13, s13, alpha1, b13, w2, s2, x, x_stride, top_k, hidden, k_tiles1,
               groups1, groups2, slices, part, act_alpha, act_beta, act_limit,
               s_base, s_ord, e, sl, pos0, n, tid):
        """FC1 slice sl of expert e for the n <= BN pairs at sorted positions pos0.., then their
        FC2 partials for the slice, through one cp.async ring of n1 + n2 stages."""
        cfg = self.cfg
        warp = tid // 32
        lane = tid % 32
        r = lane // 4
        q = lane % 4
        sbpr = fm.scale_bytes_per_row(cfg.weight_format)
        n1 = k_tiles1
        n2 = (groups2 + WARPS * FC2_GROUPS_PER_WARP - 1) // (WARPS * FC2_GROUPS_PER_WARP)
        items = n1 + n2
        k_tiles2 = slices
        # FC1 groups of this warp: blob groups sl * G1 + warp * mw1 + g, tiles over kt
        g1 = sl * cfg.fc1_groups + warp * cfg.mw1
        t1 = (Int64(e) * Int64(groups1) + Int64(g1)) * Int64(k_tiles1)
        w1_warp = w13 + t1 * 1024
        s1_warp = s13 + t1 * (16 * sbpr)
        w1_gstride = Int64(k_tiles1) * 1024
        s1_gstride = Int64(k_tiles1) * (16 * sbpr)
        # FC2: group gg of expert e at K-tile sl
        t2 = Int64(e) * Int64(groups2) * Int64(k_tiles2) + Int64(sl)
        w2_e = w2 + t2 * 1024
        s2_e = s2 + t2 * (16 * sbpr)
        w2_gstride = Int64(k_tiles2) * 1024
        s2_gstride = Int64(k_tiles2) * (16 * sbpr)

        # token rows (x[pair // top_k]) of the chunk: addresses computed once, outside the K loop
        sources = [self._row_source(tid + it * THREADS, n, s_ord, pos0, top_k, x, x_stride)
                   for it in range(self.b_iters)]

        acc1 = cute.make_rmem_tensor(cute.make_layout((cfg.mw1, self.nb, 4)), Float32)
        acc1.fill(0.0)
        acc2 = cute.make_rmem_tensor(cute.make_layout((FC2_GROUPS_PER_WARP, self.nb, 4)), Float32)
        b_lane = fm.ldmatrix_lane_offset(lane)
        s_inter = s_base + self.inter_off

        for st in cutlass.range_constexpr(cfg.stages - 1):
            if st < items:
                self._issue(Int32(st), s_base + st * self.stage_bytes, n1, lane, warp, sources, x,
                            hidden, w1_warp, s1_warp, w1_gstride, s1_gstride,
                            w2_e, s2_e, w2_gstride, s2_gstride, groups2)
            ptx.cp_async_commit()
        for i in cutlass.range(items, unroll=1):
            ptx.cp_async_wait(cfg.stages - 2)
            cute.arch.sync_threads()  # stage i landed everywhere; stage i - 1 is free
            nxt = i + cfg.stages - 1
            if nxt < items:
                self._issue(nxt, s_base + (nxt % cfg.stages) * self.stage_bytes, n1, lane, warp,
                            sources, x, hidden, w1_warp, s1_warp, w1_gstride, s1_gstride,
                            w2_e, s2_e, w2_gstride, s2_gstride, groups2)
            ptx.cp_async_commit()
            stage = s_base + (i % cfg.stages) * self.stage_bytes
            if i < n1:
                if warp < cfg.fc1_warps:
                    self._fc1_step(acc1, stage, b_lane, warp, lane)
                    if i == n1 - 1:
                        self._fc1_epilogue(acc1, alpha1, b13, e, groups1, sl, warp, r, q, s_inter,
                                           act_alpha, act_beta, act_limit)
            else:
                gg0 = (i - n1) * (WARPS * FC2_GROUPS_PER_WARP) + warp * FC2_GROUPS_PER_WARP
                if gg0 < groups2:
                    self._fc2_step(acc2, stage, s_inter + b_lane, warp, lane)
                    self._fc2_store(acc2, part, s_ord, pos0, n, gg0, sl, slices, hidden, r, q)
        ptx.cp_async_wait(0)
        cute.arch.sync_threads()  # the ring and the intermediate are free for the next chunk

    @cute.jit
    def _row_source(self, c, n, s_ord, pos0, top_k, x, x_stride):
        """B piece c (16 bytes ch of token row tok of each K-tile): source row and destination."""
        tok = c // 16
        ch = c % 16
        base = x
        ok = Int32(-1)  # -1: no piece; 0: zero-fill (row past the chunk); 1: copy
        if c < self.b_chunks:
            ok = Int32(0)
            if tok < n:
                pair = ptx.ld_shared_u32(s_ord + (pos0 + tok) * 4)
                base = x + (Int64(pair // top_k) * Int64(x_stride) + Int64(ch * 8)) * 2
                ok = Int32(1)
        return base, tok * fm.B_ROW_BYTES + ch * 16, ch, ok

    @cute.jit
    def _fc1_step(self, acc1, stage, b_lane, warp, lane):
        cfg = self.cfg
        words = [fm.load_group_words(stage + self.b_bytes + (warp * cfg.mw1 + g) * self.gtb,
                                     lane, cfg.weight_format) for g in range(cfg.mw1)]
        fm.mma_ktile(acc1, words, stage + b_lane, self.nb, cfg.weight_format)

    @cute.jit
    def _fc2_step(self, acc2, stage, b_addr, warp, lane):
        cfg = self.cfg
        acc2.fill(0.0)
        words = [fm.load_group_words(stage + (warp * FC2_GROUPS_PER_WARP + g) * self.gtb,
                                     lane, cfg.weight_format) for g in range(FC2_GROUPS_PER_WARP)]
        fm.mma_ktile(acc2, words, b_addr, self.nb, cfg.weight_format)

    @cute.jit
    def _issue(self, i, stage, n1, lane, warp, sources, x, hidden,
               w1_warp, s1_warp, w1_gstride, s1_gstride, w2_e, s2_e, w2_gstride, s2_gstride,
               groups2):
        if i < n1:
            self._issue_fc1(i, stage, lane, warp, sources, x, hidden, w1_warp, s1_warp,
                            w1_gstride, s1_gstride)
        else:
            self._issue_fc2(i - n1, stage, lane, warp, w2_e, s2_e, w2_gstride, s2_gstride, groups2)

    @cute.jit
    def _issue_fc1(self, kt, stage, lane, warp, sources, x, hidden, w1_warp, s1_warp,
                   w1_gstride, s1_gstride):
        """FC1 K-tile kt: the chunk's token rows (whole CTA) and this warp's weight groups."""
        cfg = self.cfg
        sbpr = fm.scale_bytes_per_row(cfg.weight_format)
        for it in cutlass.range_constexpr(self.b_iters):
            self._copy_row_piece(sources[it], kt, stage, x, hidden)
        if warp < cfg.fc1_warps:
            for g in cutlass.range_constexpr(cfg.mw1):
                dst = stage + self.b_bytes + (warp * cfg.mw1 + g) * self.gtb
                self._copy_group(dst, w1_warp + Int64(g) * w1_gstride + Int64(kt) * 1024,
                                 s1_warp + Int64(g) * s1_gstride + Int64(kt) * (16 * sbpr), lane)

    @cute.jit
    def _copy_row_piece(self, source, kt, stage, x, hidden):
        base, dst, ch, ok = source
        if ok >= Int32(0):  # -1: this thread has no piece (THREADS > pieces per stage)
            nbytes = Int32(0)
            gaddr = x  # a valid address when nothing is read (zero-fill)
            if ok > Int32(0):
                if kt * TILE_K + ch * 8 < hidden:
                    gaddr = base + Int64(kt) * (TILE_K * 2)
                    nbytes = Int32(16)
            ptx.cp_async_16_zfill(stage + dst, gaddr, nbytes)

    @cute.jit
    def _issue_fc2(self, j, stage, lane, warp, w2_e, s2_e, w2_gstride, s2_gstride, groups2):
        """FC2 row stage j: this warp's 4 groups of w2 rows at the task's K-tile."""
        gg0 = j * (WARPS * FC2_GROUPS_PER_WARP) + warp * FC2_GROUPS_PER_WARP
        if gg0 < groups2:
            for g in cutlass.range_constexpr(FC2_GROUPS_PER_WARP):
                dst = stage + (warp * FC2_GROUPS_PER_WARP + g) * self.gtb
                gg = Int64(gg0 + g)
                self._copy_group(dst, w2_e + gg * w2_gstride, s2_e + gg * s2_gstride, lane)

    @cute.jit
    def _copy_group(self, dst, wsrc, ssrc, lane):
        """One group tile (1 KiB codes + 16 rows of bf16 scales) into shared memory, by a warp."""
        ptx.cp_async_16(dst + lane * 32, wsrc + Int64(lane) * 32)
        ptx.cp_async_16(dst + lane * 32 + 16, wsrc + Int64(lane) * 32 + 16)
        if lane < fm.scale_bytes_per_row(self.cfg.weight_format):
            ptx.cp_async_16(dst + 1024 + lane * 16, ssrc + Int64(lane) * 16)

    @cute.jit
    def _fc1_epilogue(self, acc1, alpha1, b13, e, groups1, sl, warp, r, q, s_inter,
                      act_alpha, act_beta, act_limit):
        """scale_2 x acc + bias, activation, bf16 -> s_inter[token][column of the slice]."""
        cfg = self.cfg
        gs = ptx.ld_nc_f32(alpha1 + Int64(e) * 4)
        for g in cutlass.range_constexpr(cfg.mw1):
            gl = warp * cfg.mw1 + g  # group inside the slice
            row0 = (sl * cfg.fc1_groups + gl) * 16 + r  # blob row of acc[..., 0/1]
            brow = b13 + (Int64(e) * Int64(groups1 * 16) + Int64(row0)) * 4
            b_lo = ptx.ld_nc_f32(brow)
            b_hi = ptx.ld_nc_f32(brow + 32)
            for nb in cutlass.range_constexpr(self.nb):
                for c in cutlass.range_constexpr(2):
                    tok = nb * 8 + 2 * q + c
                    v_lo = acc1[g, nb, c] * gs + b_lo
                    v_hi = acc1[g, nb, 2 + c] * gs + b_hi
                    row = s_inter + tok * fm.B_ROW_BYTES
                    if cutlass.const_expr(cfg.gated):
                        h = act.gated(cfg.activation, v_lo, v_hi, act_alpha, act_beta, act_limit)
                        ptx.st_shared_u16(row + (gl * 8 + r) * 2, ptx.bf16x2_from_f32(h, h))
                    else:
                        lo, hi = act.relu2(v_lo), act.relu2(v_hi)
                        ptx.st_shared_u16(row + (gl * 16 + r) * 2, ptx.bf16x2_from_f32(lo, lo))
                        ptx.st_shared_u16(row + (gl * 16 + 8 + r) * 2, ptx.bf16x2_from_f32(hi, hi))

    @cute.jit
    def _fc2_store(self, acc2, part, s_ord, pos0, n, gg0, sl, slices, hidden, r, q):
        """part[pair, sl, h] = the slice's unscaled FC2 sum, for this warp's rows h < H."""
        for g in cutlass.range_constexpr(FC2_GROUPS_PER_WARP):
            h0 = (gg0 + g) * 16 + r
            for nb in cutlass.range_constexpr(self.nb):
                for c in cutlass.range_constexpr(2):
                    tok = nb * 8 + 2 * q + c
                    if tok < n:
                        pair = ptx.ld_shared_u32(s_ord + (pos0 + tok) * 4)
                        dst = part + (Int64(pair * slices + sl) * Int64(hidden) + Int64(h0)) * 4
                        if h0 < hidden:
                            ptx.st_f32(dst, acc2[g, nb, c])
                        if h0 + 8 < hidden:
                            ptx.st_f32(dst + 32, acc2[g, nb, 2 + c])

    # ------------------------------------------------------------------ final reduce
    @cute.jit
    def _reduce(self, ids, route_w, alpha2, b2, part, out, tokens, top_k, expert_offset, experts,
                hidden, groups2, slices, bid, grid, tid):
        """out[t, h0:h0+4] by REDUCE_LANES lanes: lane u sums routes j = u, u + 8, .. (each
        route's slice partials loaded REDUCE_UNROLL at a time, so the L2 round trips overlap),
        then a butterfly over the lanes. Every order is fixed: bitwise deterministic."""
        quads = hidden // 4
        items = tokens * quads
        lane = tid % 32
        sub = lane % REDUCE_LANES
        mask = Int32(((1 << REDUCE_LANES) - 1)) << (lane - sub)
        per_cta = THREADS // REDUCE_LANES
        for it in cutlass.range(bid * per_cta + tid // REDUCE_LANES, items, grid * per_cta,
                                unroll=1):
            t = it // quads
            h0 = (it - t * quads) * 4
            acc = cute.make_rmem_tensor(cute.make_layout(4), Float32)
            acc.fill(0.0)
            for j in cutlass.range(sub, top_k, REDUCE_LANES, unroll=1):
                pair = t * top_k + j
                e = self._local_expert(ids, pair, expert_offset)
                if cutlass.Uint32(e) < cutlass.Uint32(experts):
                    self._route_sum(acc, pair, e, h0, part, route_w, alpha2, b2, hidden,
                                    groups2, slices)
            for m in cutlass.range_constexpr(REDUCE_LANES.bit_length() - 1):
                for c in cutlass.range_constexpr(4):
                    acc[c] = acc[c] + ptx.shfl_bfly_f32(acc[c], 1 << m, mask)
            if sub == 0:
                ptx.st_v2(out + (Int64(t) * Int64(hidden) + Int64(h0)) * 2,
                          ptx.bf16x2_from_f32(acc[0], acc[1]), ptx.bf16x2_from_f32(acc[2], acc[3]))

    @cute.jit
    def _route_sum(self, acc, pair, e, h0, part, route_w, alpha2, b2, hidden, groups2, slices):
        """acc += w[pair] * (alpha2[e] * sum_s part[pair, s, h0:h0+4] + b2[e, h0:h0+4])."""
        v = cute.make_rmem_tensor(cute.make_layout(4), Float32)
        v.fill(0.0)
        src = part + (Int64(pair * slices) * Int64(hidden) + Int64(h0)) * 4
        step = Int64(hidden) * 4
        for s0 in cutlass.range(0, slices, REDUCE_UNROLL, unroll=1):
            d = [ptx.ld_cg_v4(src + Int64(cutlass.min(s0 + u, slices - 1)) * step)
                 for u in range(REDUCE_UNROLL)]
            for u in cutlass.range_constexpr(REDUCE_UNROLL):
                if s0 + u < slices:
                    for c in cutlass.range_constexpr(4):
                        v[c] = v[c] + ptx.f32_bits(d[u][c])
        w = ptx.ld_nc_f32(route_w + Int64(pair) * 4)
        gs = ptx.ld_nc_f32(alpha2 + Int64(e) * 4)
        bb = ptx.ld_nc_v4(b2 + (Int64(e) * Int64(groups2 * 16) + Int64(h0)) * 4)
        for c in cutlass.range_constexpr(4):
            acc[c] = acc[c] + w * (v[c] * gs + ptx.f32_bits(bb[c]))
