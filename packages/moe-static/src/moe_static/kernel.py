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
   One producer warp streams FC1 K-tiles and then FC2 row stages through a ring of STAGES
   shared-memory slots with bulk copies (cp.async.bulk, completion on an mbarrier per slot), so
   FC2's weights are already in flight while FC1 finishes; 8 consumer warps decode and multiply
   and release each slot on a second mbarrier. No CTA-wide barrier in the stream: a warp waits
   only for its data (the kernel is memory-bound and decode-heavy; a __syncthreads per stage
   measured 1.8-2.0 TB/s at DeepSeek-V3 T=1..64).
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

TILE_K = fm.TILE_K
SLICE = 128  # intermediate columns per task (= one FC2 K-tile)
STAGE_GROUPS = 16  # weight groups (16 rows x 128 K each) per ring slot: 1 per consumer warp
# Independent accumulator sets per warp (slab s adds into set s % split): a warp holds one group
# and <= 16 tokens, so without them its 8 MMAs per K-tile form one dependent chain (~8 x 33
# cycles), and that chain, not memory, set the pace (1.4-1.5 TB/s at DeepSeek-V3 T=1..128).
CHAINS = 4  # independent MMA chains per warp and token block (groups x accumulator sets)
REDUCE_LANES = 8  # lanes per output quad in the final reduce (each takes every 8th route)
REDUCE_UNROLL = 8  # slice partials loaded together (independent loads in flight)
MAX_LOCAL_EXPERTS = 512
MAX_PAIRS = 2048


@dataclass(frozen=True)
class StaticConfig:
    weight_format: str  # "nvfp4" | "mxfp4"
    activation: str  # silu | gelu_tanh | swigluoai | relu2
    ids_bytes: int = 4  # topk_ids int32 or int64
    bn: int = 16  # tokens per chunk (multiple of 8, at most 32: one producer lane per row)
    stages: int = 7  # ring slots of ~25 KiB: ~150 KiB of weights in flight per SM
    # consumer warps (+ 1 producer warp); STAGE_GROUPS / consumer_warps groups each per slot
    consumer_warps: int = 16
    run_tasks: bool = True  # False: routing, barrier and reduce only (timing the fixed cost)

    @property
    def gated(self) -> bool:
        return self.activation != "relu2"

    @property
    def fc1_groups(self) -> int:  # 16-row weight groups of FC1 per task
        return 2 * SLICE // 16 if self.gated else SLICE // 16

    @property
    def mw1(self) -> int:  # FC1 groups per consumer warp
        return max(1, self.fc1_groups // self.consumer_warps)

    @property
    def fc1_warps(self) -> int:  # consumer warps with FC1 work
        return self.fc1_groups // self.mw1


class StaticMoE:
    def __init__(self, cfg: StaticConfig):
        assert cfg.bn % 8 == 0 and cfg.bn <= 32
        self.cfg = cfg
        self.nb = cfg.bn // 8
        self.cw = cfg.consumer_warps
        assert STAGE_GROUPS % self.cw == 0
        self.producer_warp = self.cw  # the last warp issues every bulk copy
        self.threads = (self.cw + 1) * 32
        self.route_threads = self.cw * 32  # the consumer threads build the routing tables
        self.experts_per_thread = MAX_LOCAL_EXPERTS // self.route_threads
        self.scan_levels = self.route_threads.bit_length() - 1
        self.mw2 = STAGE_GROUPS // self.cw
        self.split1 = max(1, CHAINS // cfg.mw1)
        self.split2 = max(1, CHAINS // self.mw2)
        self.sbpr = fm.scale_bytes_per_row(cfg.weight_format)
        self.gtb = fm.group_tile_bytes(cfg.weight_format)
        self.b_bytes = cfg.bn * fm.B_ROW_BYTES
        self.stage_bytes = self.b_bytes + STAGE_GROUPS * self.gtb
        # shared memory: ring | intermediate slice | mbarriers | routing tables
        self.inter_off = cfg.stages * self.stage_bytes
        self.mbar_off = self.inter_off + self.b_bytes
        self.route_off = self.mbar_off + 2 * cfg.stages * 8
        self.route_bytes = (4 * MAX_LOCAL_EXPERTS + MAX_PAIRS + 2 * self.route_threads + 4) * 4
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
        ).launch(grid=[grid, 1, 1], block=[self.threads, 1, 1], smem=self.smem_bytes, stream=stream,
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
        s_scan = s_ord + MAX_PAIRS * 4            # [2][self.route_threads] scan scratch
        s_nact = s_scan + 2 * self.route_threads * 4   # number of active experts
        s_full = s_base + self.mbar_off           # [stages] mbarriers: slot filled
        s_empty = s_full + cfg.stages * 8         # [stages] mbarriers: slot released
        if tid == 0:
            for st in cutlass.range_constexpr(cfg.stages):
                ptx.mbarrier_init(s_full + st * 8, 1)
                ptx.mbarrier_init(s_empty + st * 8, self.cw)
            ptx.fence_mbarrier_init()
        pairs = tokens * top_k

        self._route(ids, pairs, expert_offset, experts, tid, s_cnt, s_off, s_cur, s_act, s_ord,
                    s_scan, s_nact)
        n_tasks = ptx.ld_shared_u32(s_nact) * slices
        n1 = k_tiles1
        n2 = (groups2 + STAGE_GROUPS - 1) // STAGE_GROUPS
        warp = tid // 32
        lane = tid % 32
        g = Int32(0)  # ring items so far (slot = g % stages, phase = (g // stages) & 1)
        if cutlass.const_expr(not cfg.run_tasks):
            n_tasks = Int32(0)
        for task in cutlass.range(bid, n_tasks, grid, unroll=1):
            a = task // slices
            sl = task - a * slices
            e = ptx.ld_shared_u32(s_act + a * 4)
            cnt = ptx.ld_shared_u32(s_cnt + e * 4)
            first = ptx.ld_shared_u32(s_off + e * 4)
            for c0 in cutlass.range(0, cnt, cfg.bn, unroll=1):
                n = cutlass.min(cnt - c0, cfg.bn)
                if warp == self.producer_warp:
                    self._produce(g, n1, n2, lane, w13, s13, w2, s2, x, x_stride, top_k, hidden,
                                  groups1, groups2, slices, s_base, s_full, s_empty, s_ord,
                                  e, sl, first + c0, n)
                else:
                    self._consume(g, n1, n2, warp, lane, alpha1, b13, groups1, groups2, slices,
                                  hidden, part, act_alpha, act_beta, act_limit, s_base, s_full,
                                  s_empty, s_ord, e, sl, first + c0, n)
                g = g + n1 + n2

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
        rt = tid < self.route_threads
        if rt:
            for i in cutlass.range_constexpr(self.experts_per_thread):
                ptx.st_shared_u32(s_cnt + (tid + i * self.route_threads) * 4, 0)
        cute.arch.sync_threads()
        for p in cutlass.range(tid, pairs, self.threads, unroll=1):
            e = self._local_expert(ids, p, expert_offset)
            if cutlass.Uint32(e) < cutlass.Uint32(experts):
                ptx.atom_add_shared(s_cnt + e * 4, 1)
        cute.arch.sync_threads()
        # route thread tid owns experts [tid * EPT, tid * EPT + EPT): pair and active totals
        e0 = tid * self.experts_per_thread
        n_pairs = Int32(0)
        n_act = Int32(0)
        if rt:
            for i in cutlass.range_constexpr(self.experts_per_thread):
                c = ptx.ld_shared_u32(s_cnt + (e0 + i) * 4)
                n_pairs = n_pairs + c
                n_act = n_act + cutlass.min(c, 1)
            ptx.st_shared_u32(s_scan + tid * 4, n_pairs)
            ptx.st_shared_u32(s_scan + (self.route_threads + tid) * 4, n_act)
        cute.arch.sync_threads()
        for lvl in cutlass.range_constexpr(self.scan_levels):  # inclusive Hillis-Steele scans
            off = 1 << lvl
            da = Int32(0)
            db = Int32(0)
            if rt and tid >= off:
                da = ptx.ld_shared_u32(s_scan + (tid - off) * 4)
                db = ptx.ld_shared_u32(s_scan + (self.route_threads + tid - off) * 4)
            cute.arch.sync_threads()
            if rt and tid >= off:
                ptx.st_shared_u32(s_scan + tid * 4, ptx.ld_shared_u32(s_scan + tid * 4) + da)
                ptx.st_shared_u32(s_scan + (self.route_threads + tid) * 4,
                                  ptx.ld_shared_u32(s_scan + (self.route_threads + tid) * 4) + db)
            cute.arch.sync_threads()
        if rt:
            pos = ptx.ld_shared_u32(s_scan + tid * 4) - n_pairs
            slot = ptx.ld_shared_u32(s_scan + (self.route_threads + tid) * 4) - n_act
            for i in cutlass.range_constexpr(self.experts_per_thread):
                e = e0 + i
                c = ptx.ld_shared_u32(s_cnt + e * 4)
                ptx.st_shared_u32(s_off + e * 4, pos)
                ptx.st_shared_u32(s_cur + e * 4, pos)
                if c > 0:
                    ptx.st_shared_u32(s_act + slot * 4, e)
                    slot = slot + 1
                pos = pos + c
            if tid == self.route_threads - 1:
                ptx.st_shared_u32(s_nact, slot)
        cute.arch.sync_threads()
        for p in cutlass.range(tid, pairs, self.threads, unroll=1):
            e = self._local_expert(ids, p, expert_offset)
            if cutlass.Uint32(e) < cutlass.Uint32(experts):
                at = ptx.atom_add_shared(s_cur + e * 4, 1)
                ptx.st_shared_u32(s_ord + at * 4, p)
        cute.arch.sync_threads()

    # ------------------------------------------------------------------ producer warp
    @cute.jit
    def _produce(self, g0, n1, n2, lane, w13, s13, w2, s2, x, x_stride, top_k, hidden,
                 groups1, groups2, slices, s_base, s_full, s_empty, s_ord, e, sl, pos0, n):
        """Bulk-copy the chunk's n1 FC1 K-tiles (token rows + 16 groups) and n2 FC2 row stages
        into the ring; lane l copies group l (and token row l of FC1 stages)."""
        cfg = self.cfg
        sbpr = self.sbpr
        # lane l's token row (FC1 B operand), found once per chunk
        row = x
        if lane < n:
            pair = ptx.ld_shared_u32(s_ord + (pos0 + lane) * 4)
            row = x + Int64(pair // top_k) * Int64(x_stride) * 2
        # lane l's FC1 group (blob group sl * G1 + l) and FC2 group (stage j: j * 16 + l)
        t1 = (Int64(e) * Int64(groups1) + Int64(sl * cfg.fc1_groups + lane)) * Int64(n1)
        t2 = (Int64(e) * Int64(groups2) + Int64(lane)) * Int64(slices) + Int64(sl)
        for i in cutlass.range(n1 + n2, unroll=1):
            gi = g0 + i
            slot = gi % cfg.stages
            ptx.mbarrier_wait(s_empty + slot * 8, ((gi // cfg.stages) & 1) ^ 1)
            stage = s_base + slot * self.stage_bytes
            full = s_full + slot * 8
            if i < n1:
                vb = cutlass.min(hidden - i * TILE_K, TILE_K) * 2  # valid bytes of a token row
                if vb < TILE_K * 2:  # K tail (H not a multiple of 128): zero the rest of the rows
                    if lane < n:
                        for z in cutlass.range(vb, TILE_K * 2, 4, unroll=1):
                            ptx.st_shared_u32(stage + lane * fm.B_ROW_BYTES + z, 0)
                ptx.syncwarp()
                if lane == 0:
                    ptx.mbarrier_arrive_expect_tx(full, cfg.fc1_groups * self.gtb + n * vb)
                ptx.syncwarp()
                if lane < n:
                    ptx.bulk_copy_g2s(stage + lane * fm.B_ROW_BYTES, row + Int64(i) * (TILE_K * 2),
                                      vb, full)
                if lane < cfg.fc1_groups:
                    dst = stage + self.b_bytes + lane * self.gtb
                    t = t1 + Int64(i)
                    ptx.bulk_copy_g2s(dst, w13 + t * 1024, 1024, full)
                    ptx.bulk_copy_g2s(dst + 1024, s13 + t * (16 * sbpr), 16 * sbpr, full)
            else:
                j = i - n1
                ng = cutlass.min(groups2 - j * STAGE_GROUPS, STAGE_GROUPS)
                if lane == 0:
                    ptx.mbarrier_arrive_expect_tx(full, ng * self.gtb)
                ptx.syncwarp()
                if lane < ng:
                    dst = stage + self.b_bytes + lane * self.gtb
                    t = t2 + Int64(j * STAGE_GROUPS) * Int64(slices)
                    ptx.bulk_copy_g2s(dst, w2 + t * 1024, 1024, full)
                    ptx.bulk_copy_g2s(dst + 1024, s2 + t * (16 * sbpr), 16 * sbpr, full)

    # ------------------------------------------------------------------ consumer warps
    @cute.jit
    def _consume(self, g0, n1, n2, warp, lane, alpha1, b13, groups1, groups2, slices, hidden,
                 part, act_alpha, act_beta, act_limit, s_base, s_full, s_empty, s_ord,
                 e, sl, pos0, n):
        cfg = self.cfg
        r = lane // 4
        q = lane % 4
        acc1 = cute.make_rmem_tensor(cute.make_layout((self.split1 * cfg.mw1, self.nb, 4)), Float32)
        acc1.fill(0.0)
        acc2 = cute.make_rmem_tensor(cute.make_layout((self.split2 * self.mw2, self.nb, 4)), Float32)
        b_lane = fm.ldmatrix_lane_offset(lane)
        s_inter = s_base + self.inter_off
        for i in cutlass.range(n1 + n2, unroll=1):
            gi = g0 + i
            slot = gi % cfg.stages
            ptx.mbarrier_wait(s_full + slot * 8, (gi // cfg.stages) & 1)
            stage = s_base + slot * self.stage_bytes
            if i < n1:
                if warp < cfg.fc1_warps:
                    self._fc1_step(acc1, stage, b_lane, warp, lane)
                if i == n1 - 1:
                    # the previous chunk's FC2 readers are done with s_inter before it is rewritten
                    ptx.named_barrier_sync(1, self.route_threads)
                    if warp < cfg.fc1_warps:
                        fm.sum_split(acc1, cfg.mw1, self.nb, self.split1)
                        self._fc1_epilogue(acc1, alpha1, b13, e, groups1, sl, warp, r, q, s_inter,
                                           act_alpha, act_beta, act_limit)
                    ptx.named_barrier_sync(1, self.route_threads)  # the slice is complete
            else:
                gg0 = (i - n1) * STAGE_GROUPS + warp * self.mw2
                if gg0 < groups2:  # groups2 is a multiple of 8: a warp's groups are all in or out
                    self._fc2_step(acc2, stage, s_inter + b_lane, warp, lane)
                    self._fc2_store(acc2, part, s_ord, pos0, n, gg0, sl, slices, hidden, r, q)
            ptx.syncwarp()
            if lane == 0:
                ptx.mbarrier_arrive(s_empty + slot * 8)

    @cute.jit
    def _fc1_step(self, acc1, stage, b_lane, warp, lane):
        cfg = self.cfg
        words = [fm.load_group_words(stage + self.b_bytes + (warp * cfg.mw1 + g) * self.gtb,
                                     lane, cfg.weight_format) for g in range(cfg.mw1)]
        fm.mma_ktile(acc1, words, stage + b_lane, self.nb, cfg.weight_format, split=self.split1)

    @cute.jit
    def _fc2_step(self, acc2, stage, b_addr, warp, lane):
        cfg = self.cfg
        acc2.fill(0.0)
        words = [fm.load_group_words(stage + self.b_bytes + (warp * self.mw2 + g) * self.gtb,
                                     lane, cfg.weight_format) for g in range(self.mw2)]
        fm.mma_ktile(acc2, words, b_addr, self.nb, cfg.weight_format, split=self.split2)
        fm.sum_split(acc2, self.mw2, self.nb, self.split2)

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
        for g in cutlass.range_constexpr(self.mw2):
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
        per_cta = self.threads // REDUCE_LANES
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
