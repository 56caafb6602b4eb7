"""The moe-static CuTe DSL kernel: a whole MoE layer in one persistent, cooperative launch.

For small routed batches the layer is a weight stream: every active expert's 4-bit weights are
read once and the FLOPs are negligible, so the kernel is built to keep HBM busy and to spread
the stream over every warp of the GPU.

1. Routing, redundantly in every CTA (P = T * k <= MAX_PAIRS ids, a few KiB from L2): a shared
   histogram of local experts, a scan, the ascending list of active experts and the routed pairs
   of each expert, in sorted positions. Every CTA derives the same tables; no grid-wide step.
2. FC1: units (active expert, 16-row weight group), taken by teams of `team_fc1` warps. The warps
   of a team split the group's K-tiles into contiguous ranges; each streams its range in steps
   of 2 K-tiles through its own ring of two shared-memory slots, filled by bulk copies (the
   step's group records and the chunk's token rows) that complete on the slot's mbarrier, so
   no CTA barrier stands in the stream; it decodes e2m1 and runs mma.sync with the token rows
   as B (ldmatrix). The team adds its partial sums in a fixed order through shared memory,
   applies the per-expert global scale (gscale), bias and the activation and writes the bf16
   intermediate inter[pair, column] to a global workspace (at decode sizes a few KiB,
   L2-resident), one row per routed pair.
3. Grid barrier.
4. FC2: units (active expert, 16 rows of H), the same stream over the intermediate's K-tiles,
   B from inter[pair]; the epilogue writes y[pair, h] = w[pair] * (gscale * acc + b2) (fp32),
   each element once.
5. Grid barrier, then out[t, h] = bf16(sum_j y[t * k + j, h]) over the local routes of token t
   in the order j = 0..k-1: bitwise deterministic, one rounding, every element written (0 when no
   route of t is local).
   With cta_reduce (where H's 16-row groups spread evenly over the CTAs, runner.owns_rows) each
   CTA owns a range of groups: step 4 runs every active expert's units of those groups in that
   CTA, and step 5 is a CTA barrier and the reduce of those rows, with no second grid barrier.

With teams of one, where whole units dealt round-robin would leave warps idle (DeepSeek-V3
T=1: 3584 FC2 units for 2112 warps), a GEMM's units are laid end to end in K-tiles and each warp
takes an even share; a unit is then cut at most once, and its two pieces add into y (FC2) or
meet in their CTA before the activation (FC1, see _meet_leave). Either way a + b in one fixed
pairing keeps the layer bitwise deterministic.

An expert with more than CHUNK tokens is done in chunks of CHUNK (its weights re-read from L2).
Units of 16 rows keep every warp of the GPU on the stream even at T=1 (Qwen3-30B-A3B: 8 experts
x 96 FC1 groups = 768 units), where the first version's (expert, 128-column slice) tasks kept
48 SMs busy; the per-stage CTA barrier of its shared ring is gone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from moe_common.cute import activation as act
from moe_common.cute import fragment_mma as fm
from moe_common.cute import jit
from moe_common.cute import ptx
from moe_common.cute.ring import StageRing
from moe_common.cute.routing import local_expert
from moe_common.cute.scan import exclusive_scan2
from moe_common.cute.storage import SharedStorage, shared_storage
from moe_common.fragments import BLOCK_GROUPS, TILE_K
from moe_common.hopper import SMEM_PER_CTA


WARPS = 16
THREADS = WARPS * 32
CHUNK = 8  # tokens per unit chunk: one n8 MMA block (the other kernels' token tiles are bn)
# A ring slot holds a step of up to STEP consecutive K-tiles of one unit: their group records
# (moe_common.packed: codes then scales, one bulk copy each) and the chunk's CHUNK token rows,
# so the mbarrier wait and the slot bookkeeping are paid once per step.
STEP = 2
B_OFF = STEP * fm.group_tile_bytes("nvfp4")  # the larger record (MXFP4's scales are half)
B_ROW_BYTES = (STEP * TILE_K + 8) * 2  # a token row of one step, padded: conflict-free ldmatrix
SLOT_BYTES = B_OFF + CHUNK * B_ROW_BYTES  # 6784
# Ring slots per warp: one step in flight while the other is consumed, two while the warp waits
# (see _next_step). 16 warps x 2 x 6784 B is what shared memory holds (one-tile slots measured 2
# the same as 3, at 0db0d90). A power of two: slot and phase parity by bit operations.
DEPTH = 2
MAX_LOCAL_EXPERTS = 512
MAX_PAIRS = 2048  # pair ids (< MAX_PAIRS) are kept as u16 in shared memory
EXPERTS_PER_THREAD = MAX_LOCAL_EXPERTS // THREADS
# FC1 unit cut in two (see _meet_leave): the fragment (32 lanes x 4 fp32) of its piece from the cut
MEET_BYTES = 512
REDUCE_BATCH = 8  # top-k routes the final reduce loads at once (k <= 8: one round trip)
# The least gain, in percent of the busiest warp's K-tiles, for which a GEMM is split in even
# shares (see StaticMoE._even_share); 5 measured level to slower (91e45ef, BENCHMARKS.md)
EVEN_GAIN_PERCENT = 10


class StaticOperands(NamedTuple):
    """The runtime operands of one launch, in kernel-parameter order: runner.run builds them
    once per call (jit.operands), StaticMoE.__call__ and .kernel take them whole, and the
    compile cache compiles with jit.example(StaticOperands)."""
    # the packed weights (moe_common.packed): FC1 and FC2 group records, per-expert global
    # scales gscale (fp32 [E]: packed fc1_alpha / fc2_alpha, the weights' scale_2, in w4a4 times
    # the activation's) and biases (fp32 [E, rows])
    w13: Int64
    gscale13: Int64
    b13: Int64
    w2: Int64
    gscale2: Int64
    b2: Int64
    # the call: topk_ids (int32 or int64, StaticConfig.ids_bytes), router weights (fp32), the
    # bf16 token rows x and their stride in elements, T, k and the local experts
    ids: Int64
    route_w: Int64
    x: Int64
    x_stride: Int32
    tokens: Int32
    top_k: Int32
    expert_offset: Int32
    experts: Int32
    # the layer: H, FC1's K-tiles and 16-row groups per expert, FC2's groups and K-tiles
    hidden: Int32
    k_tiles1: Int32
    groups1: Int32
    groups2: Int32
    k_tiles2: Int32
    # the workspace (see runner) and the bf16 output [T, H]
    inter: Int64
    y: Int64
    out: Int64
    barrier: Int64
    meet: Int64
    # the activation's run-time parameters (moe_common.types.Activation)
    act_alpha: Float32
    act_beta: Float32
    act_limit: Float32


class _Gemm(NamedTuple):
    """One GEMM's operands as its units read them (device values, bundled at trace time)."""
    n_groups: Int32  # units per active expert: FC1 the blob's 16-row groups, FC2 ceil(H / 16)
    blob_groups: Int32  # 16-row groups per expert in the weight blob
    k_tiles: Int32
    w: Int64  # group records, per-expert global scale, bias (see StaticOperands)
    gscale: Int64
    bias: Int64
    src: Int64  # B's rows: FC1 x (a row per token), FC2 inter (a row per routed pair)
    src_stride: Int32  # in elements


class _Tables(NamedTuple):
    """The routing tables in shared memory (addresses; see StaticMoE.kernel)."""
    s_base: Int32
    s_cnt: Int32
    s_off: Int32
    s_act: Int32
    s_ord: Int32


class _WarpPlace(NamedTuple):
    """Where this warp stands in a GEMM: its team and place in it, its ring."""
    my_team: Int32
    member: Int32
    ring: StageRing  # the warp's DEPTH slots, each with its mbarrier (no empty barriers)
    lane: Int32


@dataclass(frozen=True)
class StaticConfig:
    weight_format: str  # "nvfp4" | "mxfp4"
    activation: str  # silu | gelu_tanh | swigluoai | relu2
    ids_bytes: int = 4  # topk_ids int32 or int64
    # warps per FC1 / FC2 unit (they split its K-tiles): the runner picks 2 or 1 by how many
    # units there are per warp (runner.choose_teams); teams of 4 measured slower (DeepSeek-V3
    # T=1 111.7 vs 104.2 us at 0db0d90, BENCHMARKS.md)
    team_fc1: int = 2
    team_fc2: int = 2
    # FC2 by owned rows: CTA b owns the 16-row groups [b G / grid, (b + 1) G / grid) of H (G =
    # H / 16), runs every active expert's FC2 unit of them and reduces those rows of out itself,
    # so the second grid barrier and the grid-wide reduce go. The runner takes it where the
    # groups spread evenly over the CTAs (runner.owns_rows).
    cta_reduce: bool = False

    @property
    def gated(self) -> bool:
        return self.activation != "relu2"


def _shared_storage(team_bytes: int) -> SharedStorage:
    """The CTA's shared memory, in order. team_bytes: one 512 B partial-sum buffer per team of
    2 warps (0 with teams of one)."""
    mem = cute.struct.MemRange
    return shared_storage("StaticStorage", {
        "ring": cute.struct.Align[mem[cutlass.Uint8, WARPS * DEPTH * SLOT_BYTES], 128],
        "team": mem[cutlass.Uint8, team_bytes],  # team partial sums (_team_sum)
        # routing tables that outlive the routing (the routing's scratch, cursors and scan,
        # lives in the ring, which no copy fills before it ends)
        "cnt": mem[cutlass.Uint32, MAX_LOCAL_EXPERTS],  # routed pairs per local expert
        "off": mem[cutlass.Uint32, MAX_LOCAL_EXPERTS],  # each expert's first sorted position
        "act": mem[cutlass.Uint32, MAX_LOCAL_EXPERTS],  # active experts, ascending
        "ord": mem[cutlass.Uint16, MAX_PAIRS],  # pair indices grouped by expert
        "nact": cutlass.Uint32,  # number of active experts
        "max": cutlass.Uint32,  # most routed pairs of one expert
        "mbar": mem[cutlass.Int64, WARPS * DEPTH],  # [WARPS][DEPTH] ring-slot mbarriers
        "flag": mem[cutlass.Int32, WARPS],  # FC1 cut flags (_meet_leave)
        "end": mem[cutlass.Uint8, 0],  # the bytes used (the struct's size pads to 128)
    })


def _owned_groups(n_groups, bid, grid):
    """FC2 with cta_reduce: CTA bid's 16-row groups of H, [g0, g1)."""
    return bid * n_groups // grid, (bid + 1) * n_groups // grid


def _owned_unit(p, n_act, n_groups):
    """The unit (active expert a, group g) at group-major position p = g n_act + a: u = a G + g."""
    g = p // n_act
    return (p - g * n_act) * n_groups + g


class StaticMoE:
    def __init__(self, cfg: StaticConfig):
        for w in (cfg.team_fc1, cfg.team_fc2):
            assert w in (1, 2), "teams of 1 or 2 warps (one 512 B partial-sum buffer per team)"
        self.cfg = cfg
        self.storage = _shared_storage(WARPS // 2 * 512 if max(cfg.team_fc1, cfg.team_fc2) == 2
                                       else 0)
        off = self.storage.offsets
        self.team_off, self.mbar_off, self.flag_off = off["team"], off["mbar"], off["flag"]
        self.smem_bytes = off["end"]
        assert (MAX_LOCAL_EXPERTS + 2 * THREADS) * 4 <= off["team"]  # the routing's scratch
        assert self.smem_bytes <= SMEM_PER_CTA, f"{self.smem_bytes} B of shared memory"

    # ------------------------------------------------------------------ host entry
    @cute.jit
    def __call__(self, ops: StaticOperands, grid: Int32, stream):
        self.kernel(ops).launch(
            grid=[grid, 1, 1], block=[THREADS, 1, 1], smem=self.smem_bytes, stream=stream,
            cooperative=True, use_pdl=jit.PDL,
            # .minnctapersm 1: without it ptxas may hold a 512-thread kernel to 64 registers (2
            # CTAs per SM, which the shared memory never allows); the MXFP4 swigluoai (1,2) build
            # then spilled. With it: 72-79 registers, no spills
            min_blocks_per_mp=1)

    # ------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, ops):  # a StaticOperands (see jit.operands: why it is not annotated)
        cfg = self.cfg
        ptx.grid_dependency_wait()  # first: see jit.PDL
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        smem = cutlass.memory.SmemAllocator()
        sbuf = smem.allocate_array(cutlass.Uint8, self.smem_bytes, byte_alignment=128)
        s_base = Int32(sbuf.toint())
        at = self.storage.offsets  # each region's address: s_base + its offset
        s_cnt, s_off, s_act = s_base + at["cnt"], s_base + at["off"], s_base + at["act"]
        s_ord, s_nact, s_max = s_base + at["ord"], s_base + at["nact"], s_base + at["max"]
        s_cur = s_base                            # routing scratch in the ring: [E] cursors,
        s_scan = s_cur + MAX_LOCAL_EXPERTS * 4    # [2][THREADS] scan
        pairs = ops.tokens * ops.top_k

        if tid % 32 == 0:  # one mbarrier per ring slot of each warp (the routing syncs after)
            for i in cutlass.range_constexpr(DEPTH):
                ptx.mbarrier_init(s_base + self.mbar_off + ((tid // 32) * DEPTH + i) * 8, 1)
            ptx.fence_mbarrier_init()
            ptx.st_shared_u32(s_base + self.flag_off + (tid // 32) * 4, 0)
        self._route(ops.ids, pairs, ops.expert_offset, ops.experts, tid, s_cnt, s_off, s_cur,
                    s_act, s_ord, s_scan, s_nact, s_max)
        # ring steps this warp has consumed so far (slot = count % DEPTH, parity = its use count)
        steps = cute.make_rmem_tensor(cute.make_layout(1), Int32)
        steps[0] = Int32(0)
        n_act = ptx.ld_shared_u32(s_nact)
        inter_stride = ops.k_tiles2 * TILE_K  # bf16 columns per intermediate row
        self._zero_y(ops.y, pairs, ops.hidden, n_act, (ops.hidden + 15) // 16, ops.k_tiles2, bid,
                     grid, tid)
        max_cnt = ptx.ld_shared_u32(s_max)
        tables = _Tables(s_base, s_cnt, s_off, s_act, s_ord)
        fc1 = _Gemm(ops.groups1, ops.groups1, ops.k_tiles1, ops.w13, ops.gscale13, ops.b13,
                    ops.x, ops.x_stride)
        self._phase(True, fc1, ops, inter_stride, tables, n_act, steps, bid, grid, tid, max_cnt)
        ptx.fence_proxy_async_global()  # inter (generic stores) is read by bulk copies next
        self._grid_sync(ops.barrier, bid, grid, tid)
        fc2 = _Gemm((ops.hidden + 15) // 16, ops.groups2, ops.k_tiles2, ops.w2, ops.gscale2,
                    ops.b2, ops.inter, inter_stride)
        self._phase(False, fc2, ops, inter_stride, tables, n_act, steps, bid, grid, tid, max_cnt)
        if cutlass.const_expr(cfg.cta_reduce):
            # this CTA's rows of y are written by its own warps: a CTA barrier orders them
            cute.arch.sync_threads()
            g0, g1 = _owned_groups(fc2.n_groups, bid, grid)
            nq = (g1 - g0) * 4  # H is a multiple of 32: every owned group is 16 rows
            self._reduce(ops, g0 * 4, nq, tid, ops.tokens * nq)
        else:
            self._grid_sync(ops.barrier, bid, grid, tid)
            # CTA b takes quads [b * per, (b + 1) * per) of all T x H / 4: every SM's load path
            # shares the reduce (dealt CTA-major, T=1 put all 512 quads of H = 2048 on CTA 0,
            # whose last warp then ended ~0.9 us after every other CTA's: per-warp timestamps at
            # 22ea6fc; changed in b0c7921)
            quads = ops.hidden // 4
            total = ops.tokens * quads
            per = (total + grid - 1) // grid
            end = cutlass.min(bid * per + per, total)
            self._reduce(ops, Int32(0), quads, bid * per + tid, end)

    @cute.jit
    def _grid_sync(self, barrier, bid, grid, tid):
        cute.arch.sync_threads()  # the CTA's writes are ordered before thread 0's release
        if tid == 0:
            ptx.grid_barrier_arrive_wait(barrier, bid == 0, grid - 1)
        cute.arch.sync_threads()

    # ------------------------------------------------------------------ routing (per CTA)
    @cute.jit
    def _route(self, ids, pairs, expert_offset, experts, tid, s_cnt, s_off, s_cur, s_act, s_ord,
               s_scan, s_nact, s_max):
        for i in cutlass.range_constexpr(EXPERTS_PER_THREAD):
            ptx.st_shared_u32(s_cnt + (tid + i * THREADS) * 4, 0)
        if tid == 0:
            ptx.st_shared_u32(s_max, 0)
        cute.arch.sync_threads()
        for p in cutlass.range(tid, pairs, THREADS, unroll=1):
            e = local_expert(ids, p, expert_offset, self.cfg.ids_bytes)
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
        pos, slot, _, _ = exclusive_scan2(n_pairs, n_act, tid, THREADS, s_scan)
        for i in cutlass.range_constexpr(EXPERTS_PER_THREAD):
            e = e0 + i
            c = ptx.ld_shared_u32(s_cnt + e * 4)
            ptx.atom_max_shared(s_max, c)
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
            e = local_expert(ids, p, expert_offset, self.cfg.ids_bytes)
            if cutlass.Uint32(e) < cutlass.Uint32(experts):
                at = ptx.atom_add_shared(s_cur + e * 4, 1)
                ptx.st_shared_u16(s_ord + at * 2, p)
        ptx.fence_proxy_async_shared()  # the scratch in the ring is next written by bulk copies
        cute.arch.sync_threads()

    # ------------------------------------------------------------------ FC1 / FC2 units
    @cute.jit
    def _phase(self, fc1: cutlass.Constexpr, gemm, ops, inter_stride, tables, n_act, steps, bid,
               grid, tid, max_cnt):
        """Every unit (active expert a, 16-row group g) of one GEMM, by teams of `team` warps.

        gemm (a _Gemm) says where B (tokens) comes from: FC1 the rows x[pair // k] (read-only),
        FC2 the rows inter[pair] this launch wrote before the grid barrier. FC2 with cta_reduce:
        the CTA's units are those of its own groups of H (_owned_groups), in group-major
        positions p = (g - g0) n_act + a (_owned_unit).
        """
        cfg = self.cfg
        own = (not fc1) and cfg.cta_reduce
        n_groups, k_tiles = gemm.n_groups, gemm.k_tiles
        team = cfg.team_fc1 if fc1 else cfg.team_fc2
        teams = WARPS // team
        warp = tid // 32
        lane = tid % 32
        my_team = warp // team
        member = warp - my_team * team
        slots = tables.s_base + warp * (DEPTH * SLOT_BYTES)
        mbar = tables.s_base + self.mbar_off + warp * (DEPTH * 8)
        # uses: the warp's running step count (never negative), DEPTH a power of two
        ring = StageRing(DEPTH, SLOT_BYTES, mbar, data=slots, bit_ops=True)
        wp = _WarpPlace(my_team, member, ring, lane)
        acc = cute.make_rmem_tensor(cute.make_layout(4), Float32)
        n_units = n_act * n_groups
        share = Int32(0)
        if cutlass.const_expr(team == 1):
            if cutlass.const_expr(fc1):
                if max_cnt <= CHUNK:  # FC1's cut units meet per chunk: one chunk only
                    share = self._even_share(n_units, k_tiles, grid, scope="per_cta")
            else:
                share = self._fc2_share(n_act, n_groups, k_tiles, grid)
        if share > 0:
            # Teams of one where whole units per warp leave warps idle: each warp takes `share`
            # K-tiles of units laid end to end (share >= k_tiles, so a unit is cut at most once).
            # FC2: warp w of the grid takes [w * share, (w + 1) * share) of all units (with
            # cta_reduce: warp w of the CTA, of its units), and the two pieces of a cut unit add
            # into zeroed y (see _zero_y). FC1: the CTA's units [b U / grid, (b + 1) U / grid)
            # are split among its warps, so both pieces of a cut unit are in one CTA and meet
            # through shared memory before the activation (see _meet_leave).
            if cutlass.const_expr(fc1):
                start = bid * n_units // grid * k_tiles + warp * share
                end = cutlass.min(start + share, (bid + 1) * n_units // grid * k_tiles)
            elif cutlass.const_expr(own):
                g0, g1 = _owned_groups(n_groups, bid, grid)
                start = g0 * n_act * k_tiles + warp * share
                end = cutlass.min(start + share, g1 * n_act * k_tiles)
            else:
                start = (bid * WARPS + warp) * share
                end = cutlass.min(start + share, n_units * k_tiles)
            meet_cta = ops.meet + Int64(bid * WARPS) * MEET_BYTES
            s_flag = tables.s_base + self.flag_off
            for p in cutlass.range(start // k_tiles, (end + k_tiles - 1) // k_tiles, unroll=1):
                u = p
                if cutlass.const_expr(own):
                    u = _owned_unit(p, n_act, n_groups)
                k0 = cutlass.max(start - p * k_tiles, 0)
                k1 = cutlass.min(end - p * k_tiles, k_tiles)
                # FC1: a piece from K-tile 0 ends at the CTA's cut warp + 1, a later one starts
                # at cut warp
                cut = warp
                if k0 == 0:
                    cut = warp + 1
                self._unit(fc1, acc, u, k0, k1 - k0, gemm, ops, inter_stride, tables, steps, wp,
                           meet_cta, s_flag, cut)
        else:
            # Unit u goes to team u // grid of CTA u % grid: with fewer units than teams every
            # SM still gets a share (Qwen3-30B-A3B T=1: 768 FC1 units on 5-6 teams of each of
            # 132 CTAs, where CTA-major dealing filled 96 CTAs and left 36 SMs idle). With
            # cta_reduce the CTA's own positions go round-robin over its teams.
            first, stop, stride = my_team * grid + bid, n_act * n_groups, grid * teams
            if cutlass.const_expr(own):
                g0, g1 = _owned_groups(n_groups, bid, grid)
                first, stop, stride = g0 * n_act + my_team, g1 * n_act, teams
            for p in cutlass.range(first, stop, stride, unroll=1):
                u = p
                if cutlass.const_expr(own):
                    u = _owned_unit(p, n_act, n_groups)
                self._unit(fc1, acc, u, Int32(0), k_tiles, gemm, ops, inter_stride, tables,
                           steps, wp, ops.meet, Int32(0), Int32(0))

    @cute.jit
    def _fc2_share(self, n_act, n_groups, k_tiles, grid):
        """FC2's K-tiles per warp with teams of one (see _even_share): over every warp of the
        grid, or with cta_reduce over the CTA's warps, the CTA with the most groups deciding."""
        if cutlass.const_expr(self.cfg.cta_reduce):
            share = self._even_share(n_act * ((n_groups + grid - 1) // grid), k_tiles, grid,
                                     scope="cta")
        else:
            share = self._even_share(n_act * n_groups, k_tiles, grid)
        return share

    @cute.jit
    def _even_share(self, n_units, k_tiles, grid, scope: cutlass.Constexpr = "grid"):
        """K-tiles per warp when a GEMM (teams of one) is split in even shares, or 0 when whole
        units dealt round-robin are as good. The split pays where those leave warps idle
        (DeepSeek-V3 T=1: 3584 units of 16 K-tiles for 2112 warps, the busiest warps stream 32
        K-tiles against an even 28: 73.3 -> 70.9 us) but measured slower where units per warp
        are many (Qwen3-30B-A3B T=64, 48 against 47 K-tiles: 160.8 -> 183.3 us, cause not
        found; BENCHMARKS.md, 13b4b70 against bd933fd). So it is taken only where it shortens the
        busiest warp's stream by at least EVEN_GAIN_PERCENT. (Measured on FC2 first; FC1 takes
        the same rule.)
        scope "grid": the GEMM's n_units over every warp of the grid (FC2). "per_cta" (FC1): CTA
        b takes units [b U / G, (b + 1) U / G) and its warps split their K-tiles, so the share
        is that of the CTA with the most units; the same for every CTA; whole units would be
        dealt over the grid. "cta" (FC2 with cta_reduce): n_units is the most units a CTA owns,
        split or dealt whole over its warps."""
        w = grid * WARPS
        if cutlass.const_expr(scope == "per_cta"):
            most = (n_units + grid - 1) // grid
            share = cutlass.max((most * k_tiles + WARPS - 1) // WARPS, k_tiles)
        elif cutlass.const_expr(scope == "cta"):
            share = cutlass.max((n_units * k_tiles + WARPS - 1) // WARPS, k_tiles)
        else:
            share = cutlass.max((n_units * k_tiles + w - 1) // w, k_tiles)
        if cutlass.const_expr(scope == "cta"):
            whole = (n_units + WARPS - 1) // WARPS * k_tiles
        else:
            whole = (n_units + w - 1) // w * k_tiles
        if 100 * share > (100 - EVEN_GAIN_PERCENT) * whole:
            share = Int32(0)
        return share

    @cute.jit
    def _zero_y(self, y, pairs, hidden, n_act, hidden_groups, k_tiles2, bid, grid, tid):
        """y = 0 where FC2's split pieces will add into it (when its shares cut units)."""
        if cutlass.const_expr(self.cfg.team_fc2 == 1):
            share = self._fc2_share(n_act, hidden_groups, k_tiles2, grid)
            if share > 0 and share % k_tiles2 != 0:
                for i in cutlass.range(bid * THREADS + tid, pairs * (hidden // 4), grid * THREADS,
                                       unroll=1):
                    ptx.st_v4(y + Int64(i) * 16, 0, 0, 0, 0)

    @cute.jit
    def _unit(self, fc1: cutlass.Constexpr, acc, u, k0, k_count, gemm, ops, inter_stride, tables,
              steps, wp, meet, s_flag, cut):
        """K-tiles [k0, k0 + k_count) of unit u (active expert a, 16-row group g), every chunk
        of CHUNK of the expert's tokens; member 0 of the team writes the results (of an FC1 unit
        cut in two: the piece from K-tile 0, see _meet_take). gemm: the GEMM's _Gemm; tables:
        the routing's _Tables; wp: this warp's _WarpPlace; meet, s_flag, cut: see _phase."""
        cfg = self.cfg
        team = cfg.team_fc1 if fc1 else cfg.team_fc2
        lane, s_ord, n_groups, k_tiles = wp.lane, tables.s_ord, gemm.n_groups, gemm.k_tiles
        r = lane // 4
        q = lane % 4
        rec = fm.group_tile_bytes(cfg.weight_format)
        a = u // n_groups
        g = u - a * n_groups
        e = ptx.ld_shared_u32(tables.s_act + a * 4)
        cnt = ptx.ld_shared_u32(tables.s_cnt + e * 4)
        first = ptx.ld_shared_u32(tables.s_off + e * 4)
        w_unit = gemm.w + fm.record_index(e, g, 0, gemm.blob_groups, k_tiles) * rec
        for c0 in cutlass.range(0, cnt, CHUNK, unroll=1):
            nch = cutlass.min(cnt - c0, CHUNK)
            # this lane's B column n = lane // 4 (columns past the chunk repeat column 0:
            # finite values whose results are never stored)
            b_src = self._b_source(fc1, gemm.src, gemm.src_stride, ops.top_k, s_ord, first + c0,
                                   nch, lane)
            # ldmatrix row of this lane: B rows past the chunk read row 0 (finite values
            # whose MMA columns are never stored)
            row = lane % 8
            if row >= nch:
                row = Int32(0)
            b_off = row * B_ROW_BYTES + ((lane // 8) % 2) * 16 + (lane // 16) * 32
            acc.fill(0.0)
            # the team's members take contiguous K-ranges of the unit's [k0, k0 + k_count)
            per = (k_count + team - 1) // team
            ka = k0 + wp.member * per
            kb = cutlass.min(ka + per, k0 + k_count)
            # the epilogue's global loads go out before the stream, which hides their latency
            # (after it, every warp of a T=1 launch would wait on them at once)
            ep = self._epilogue_constants(fc1, gemm.gscale, gemm.bias, ops.route_w, e,
                                          gemm.blob_groups, g, s_ord, first + c0, nch, r, q)
            self._stream(fc1, acc, w_unit, ka, kb,
                         k_tiles, b_src, nch, b_off, ops.hidden, wp.ring, steps, lane)
            if cutlass.const_expr(team > 1):
                self._team_sum(acc, tables.s_base + self.team_off, wp.my_team, wp.member, team,
                               lane)
            last = Int32(1)
            if cutlass.const_expr(fc1 and team == 1):
                if k_count < k_tiles:  # a piece of a cut unit (one chunk: see _phase)
                    if k0 > 0:
                        self._meet_leave(acc, meet, s_flag, cut, lane)
                        last = Int32(0)
                    else:
                        self._meet_take(acc, meet, s_flag, cut, lane)
            if wp.member == 0:
                if last != 0:
                    if cutlass.const_expr(fc1):
                        self._fc1_epilogue(acc, ep, g, ops.inter, inter_stride, s_ord, first + c0,
                                           nch, r, q, ops.act_alpha, ops.act_beta, ops.act_limit)
                    else:
                        self._fc2_epilogue(acc, ep, g, ops.y, s_ord, first + c0, nch, ops.hidden,
                                           r, q, k0, k_count < k_tiles)

    @cute.jit
    def _meet_leave(self, acc, meet_cta, s_flag, cut, lane):
        """The later piece of an FC1 unit cut at the CTA's `cut` (its K-tiles from the cut; a
        warp's first piece, so it ends early) leaves its fragment in the cut's slot and sets the
        cut's flag. Both pieces are in one CTA (_even_share with per_cta) and order the pair ids
        alike, so the fragments line up lane by lane, and the flag is a CTA-scope release in
        shared memory: no device-scope fence and no atomic round trip to L2 (the grid-wide
        meeting this replaces, a fence and an atomic per piece, took ~6.6% of the warp samples
        at Qwen3-30B-A3B T=8 at 9a491ca, BENCHMARKS.md)."""
        ptx.st_v4_f32(meet_cta + cut * MEET_BYTES + lane * 16, acc[0], acc[1], acc[2], acc[3])
        ptx.sync_warp()
        if lane == 0:
            ptx.flag_set_release_cta(s_flag + cut * 4)

    @cute.jit
    def _meet_take(self, acc, meet_cta, s_flag, cut, lane):
        """The piece from K-tile 0 (a warp's last piece) adds the later piece's fragment (see
        _meet_leave) and runs the epilogue: acc + other is the same in either order, so the
        result is bitwise deterministic. The other piece was its warp's first, so the flag is
        normally set long before."""
        ptx.flag_wait_acquire_cta(s_flag + cut * 4)
        # a plain load: the writer is a warp of this CTA, and the acquire orders this after it
        v = ptx.ld_v4(meet_cta + cut * MEET_BYTES + lane * 16)
        for c in cutlass.range_constexpr(4):
            acc[c] = acc[c] + ptx.f32_bits(v[c])

    @cute.jit
    def _b_source(self, fc1: cutlass.Constexpr, src, src_stride, top_k, s_ord, pos0, nch, lane):
        """The chunk's token rows at K-tile 0: (this lane's row n = lane, or row 0 past the
        chunk; row 0, the same in every lane). Row 0 goes out with the weights' copies from one
        elected lane (_fill), lanes 1..nch-1 copy theirs."""
        rows = []
        for n in (lane, Int32(0)):
            if n >= nch:
                n = Int32(0)
            pair = ptx.ld_shared_u16(s_ord + (pos0 + n) * 2)
            if cutlass.const_expr(fc1):
                pair = pair // top_k
            rows.append(src + Int64(pair) * Int64(src_stride) * 2)
        return tuple(rows)

    @cute.jit
    def _stream(self, fc1: cutlass.Constexpr, acc, w_unit, ka, kb, k_tiles, b_src, nch,
                b_off, hidden, ring, steps, lane):
        """acc += the unit's K-tiles [ka, kb) of A_unit @ B, in steps of STEP K-tiles.

        Steps run through the warp's ring of DEPTH slots, each filled by bulk copies (the
        step's records, one per token row) that complete on the slot's mbarrier; the warp's
        running step count gives the slot and the phase parity, across units and phases."""
        n_tiles = kb - ka
        n_steps = (n_tiles + STEP - 1) // STEP
        t0 = steps[0]
        for j in cutlass.range_constexpr(DEPTH - 1):
            if j < n_steps:
                self._fill(fc1, t0 + j, ka + j * STEP, kb, w_unit, b_src, nch, hidden,
                           ring, lane)
        # Full steps run unrolled with no masking (ptxas if-converts a branch inside one loop
        # and issues both bodies). The last step goes to a loop of its own when it is short
        # (an odd count) or holds FC1's partial last K-tile (H not a multiple of 128: the
        # slabs past H hold stale bytes, so B is masked there).
        n_full = n_steps
        if n_steps > 0:
            if n_tiles % STEP != 0:
                n_full = n_steps - 1
            if cutlass.const_expr(fc1):
                if hidden % TILE_K != 0:
                    if kb == k_tiles:
                        n_full = n_steps - 1
        for j in cutlass.range(n_full, unroll=1):
            slot = self._next_step(fc1, j, t0, n_steps, ka, kb, w_unit, b_src, nch,
                                   hidden, ring, lane)
            for i in cutlass.range_constexpr(STEP):
                self._tile_mma(acc, slot, i, b_off, lane, False, Int32(8))
        for j in cutlass.range(n_full, n_steps, unroll=1):
            slot = self._next_step(fc1, j, t0, n_steps, ka, kb, w_unit, b_src, nch,
                                   hidden, ring, lane)
            kt = ka + j * STEP
            for i in cutlass.range(cutlass.min(kb - kt, STEP), unroll=1):
                self._tile_mma(acc, slot, i, b_off, lane, fc1,
                               cutlass.min((hidden - (kt + i) * TILE_K) // 16, 8))
        steps[0] = t0 + n_steps
        ptx.sync_warp()  # the next unit's first copies may refill any slot

    @cute.jit
    def _next_step(self, fc1: cutlass.Constexpr, j, t0, n_steps, ka, kb, w_unit, b_src,
                   nch, hidden, ring, lane):
        """Refill the slot step j - 1 used with step j + DEPTH - 1, wait for the warp's step j
        (ring slot (t0 + j) % DEPTH) and return its slot. The refill goes out before the wait,
        so DEPTH steps are in flight while the warp waits, not DEPTH - 1."""
        t = t0 + j
        nxt = j + DEPTH - 1
        if nxt < n_steps:
            ptx.sync_warp()  # every lane is done with step j - 1's slot, which nxt refills
            self._fill(fc1, t0 + nxt, ka + nxt * STEP, kb, w_unit, b_src, nch, hidden,
                       ring, lane)
        ring.wait_full(t)
        return ring.at(t)

    @cute.jit
    def _fill(self, fc1: cutlass.Constexpr, t, kt, kb, w_unit, b_src, nch, hidden, ring,
              lane):
        """Start filling ring slot t % DEPTH (the warp's t-th step) with the unit's K-tiles
        [kt, min(kt + STEP, kb)) by bulk copies: one elected lane token row 0 and their records
        (BLOCK_GROUPS records apart, fm.record_index; ptx.bulk_copies_g2s_elected: issued from
        uniform registers, FC1 loop 357 -> 338 SASS, 85968a0), lane n in 1..nch-1 token row n
        (FC1: only the columns below H)."""
        slot = ring.at(t)
        mb = ring.full_bar(t)
        n = cutlass.min(kb - kt, STEP)
        rec = fm.group_tile_bytes(self.cfg.weight_format)
        row_bytes = n * (TILE_K * 2)
        if cutlass.const_expr(fc1):
            row_bytes = cutlass.min(hidden - kt * TILE_K, n * TILE_K) * 2
        b_lane, b_row0 = b_src
        b_kt = Int64(kt) * (TILE_K * 2)
        w_kt = w_unit + Int64(kt) * (BLOCK_GROUPS * rec)
        # K-tile i of the step is copied where n - i > 0 (the first always)
        ptx.bulk_copies_g2s_elected(
            mb, n * rec + nch * row_bytes,
            [(slot + B_OFF, b_row0 + b_kt, row_bytes), (slot, w_kt, rec)]
            + [(slot + i * rec, w_kt + i * (BLOCK_GROUPS * rec), rec, n - i)
               for i in range(1, STEP)])
        if lane < nch:
            if lane > 0:
                ptx.bulk_copy_g2s(slot + B_OFF + lane * B_ROW_BYTES, b_lane + b_kt, row_bytes, mb)

    @cute.jit
    def _tile_mma(self, acc, slot, i, b_off, lane, masked: cutlass.Constexpr, valid):
        """acc += K-tile i of the slot's step: its 16 x 128 weights (decoded from the slot's
        codes and scales) @ its B rows (ldmatrix). masked: B of slabs >= valid reads as 0 (SEL,
        PLOP3, UISETP: 32 of the FC1 loop's 278 SASS instructions at 1-tile steps, so only a
        short last step pays them)."""
        fmt = self.cfg.weight_format
        # K-tile i's record: this lane's 8 code words and its rows' (r, r + 8) scale words
        words = fm.load_group_words(slot + i * fm.group_tile_bytes(fmt), lane, fmt)
        b = []
        for sp in cutlass.range_constexpr(4):  # slabs 2sp, 2sp + 1: lo and hi k-halves
            m = ptx.ldmatrix_x4(slot + B_OFF + b_off + i * (TILE_K * 2) + sp * 64)
            for h in cutlass.range_constexpr(2):
                if cutlass.const_expr(masked):
                    ok = valid > 2 * sp + h
                    b.append((m[2 * h] if ok else Int32(0), m[2 * h + 1] if ok else Int32(0)))
                else:
                    b.append((m[2 * h], m[2 * h + 1]))
        for k16 in cutlass.range_constexpr(8):
            a = fm.a_fragment(words, k16, fmt)
            d = ptx.mma_bf16_16816((acc[0], acc[1], acc[2], acc[3]), a, b[k16])
            for c in cutlass.range_constexpr(4):
                acc[c] = d[c]

    @cute.jit
    def _team_sum(self, acc, s_team, my_team, member, team, lane):
        """Member 0's acc += the other member's (a fixed summation order). One buffer per team:
        the second barrier keeps the member from writing the next unit's sum before member 0
        has read this one."""
        buf = s_team + my_team * 512
        if member > 0:
            ptx.st_shared_v4_f32(buf + lane * 16, acc[0], acc[1], acc[2], acc[3])
        ptx.named_barrier(1 + my_team, team * 32)
        if member == 0:
            v = ptx.ld_shared_v4(buf + lane * 16)
            for c in cutlass.range_constexpr(4):
                acc[c] = acc[c] + ptx.f32_bits(v[c])
        ptx.named_barrier(1 + my_team, team * 32)

    @cute.jit
    def _epilogue_constants(self, fc1: cutlass.Constexpr, gscale_at, bias, route_w, e, groups, g,
                            s_ord, pos0, nch, r, q):
        """What a unit's epilogue reads from global memory: expert e's global scale, the biases
        of its blob rows 16g + r and 16g + r + 8, and (FC2) the routing weights of this lane's
        token columns 2q, 2q + 1 (a column past the chunk reads column 0's: never stored)."""
        brow = bias + (Int64(e) * Int64(groups * 16) + Int64(g * 16 + r)) * 4
        gscale = ptx.ld_nc_f32(gscale_at + Int64(e) * 4)
        b_lo = ptx.ld_nc_f32(brow)
        b_hi = ptx.ld_nc_f32(brow + 32)
        wr = []
        if cutlass.const_expr(not fc1):
            for c in cutlass.range_constexpr(2):
                n = 2 * q + c
                if n >= nch:
                    n = Int32(0)
                pair = ptx.ld_shared_u16(s_ord + (pos0 + n) * 2)
                wr.append(ptx.ld_nc_f32(route_w + Int64(pair) * 4))
        return (gscale, b_lo, b_hi) + tuple(wr)

    @cute.jit
    def _fc1_epilogue(self, acc, ep, g, inter, inter_stride, s_ord, pos0, nch, r, q, act_alpha,
                      act_beta, act_limit):
        """gscale x acc + bias, activation -> bf16 inter[pair, column]. Gated groups hold
        gate (row r) and up (row r + 8) of column 8g + r; relu2 groups columns 16g + r, + 8.
        Rows are keyed by pair id, not sorted position: each CTA orders an expert's pairs with
        shared-memory atomics, so positions differ between the CTAs of FC1 and FC2."""
        cfg = self.cfg
        gscale, b_lo, b_hi = ep
        for c in cutlass.range_constexpr(2):
            n = 2 * q + c
            if n < nch:
                pair = ptx.ld_shared_u16(s_ord + (pos0 + n) * 2)
                row = inter + Int64(pair) * Int64(inter_stride) * 2
                v_lo = acc[c] * gscale + b_lo
                v_hi = acc[2 + c] * gscale + b_hi
                if cutlass.const_expr(cfg.gated):
                    h = act.gated(cfg.activation, v_lo, v_hi, act_alpha, act_beta, act_limit)
                    ptx.st_u16(row + Int64(g * 8 + r) * 2, ptx.bf16x2_from_f32(h, h))
                else:
                    lo = act.relu2(v_lo)
                    hi = act.relu2(v_hi)
                    ptx.st_u16(row + Int64(g * 16 + r) * 2, ptx.bf16x2_from_f32(lo, lo))
                    ptx.st_u16(row + Int64(g * 16 + 8 + r) * 2, ptx.bf16x2_from_f32(hi, hi))

    @cute.jit
    def _fc2_epilogue(self, acc, ep, g, y, s_ord, pos0, nch, hidden, r, q, k0, piece):
        """y[pair, h] = w[pair] * (gscale * acc + b2[e, h]) for rows h = 16g + r, + 8 < H. A
        piece of a unit cut in two (piece: K-tiles from k0, see _phase) adds its part into the
        zeroed y instead, the bias with the piece from K-tile 0: two fp32 adds into 0 give the
        same bits in either order, so the result stays deterministic."""
        h0 = g * 16 + r
        gscale, b_lo, b_hi = ep[0], ep[1], ep[2]
        if k0 > 0:
            b_lo = Float32(0.0)
            b_hi = Float32(0.0)
        for c in cutlass.range_constexpr(2):
            n = 2 * q + c
            if n < nch:
                pair = ptx.ld_shared_u16(s_ord + (pos0 + n) * 2)
                wr = ep[3 + c]
                dst = y + (Int64(pair) * Int64(hidden) + Int64(h0)) * 4
                v_lo = wr * (acc[c] * gscale + b_lo)
                v_hi = wr * (acc[2 + c] * gscale + b_hi)
                if piece:
                    if h0 < hidden:
                        ptx.red_add_f32(dst, v_lo)
                    if h0 + 8 < hidden:
                        ptx.red_add_f32(dst + 32, v_hi)
                else:
                    if h0 < hidden:
                        ptx.st_f32(dst, v_lo)
                    if h0 + 8 < hidden:
                        ptx.st_f32(dst + 32, v_hi)

    # ------------------------------------------------------------------ final reduce
    @cute.jit
    def _reduce(self, ops, q0, nq, start, end):
        """out[t, h0:h0+4] = bf16(sum over local routes j = 0..k-1 of y[t * k + j, h0:h0+4]) for
        the items it = start, start + THREADS, .. < end of T x nq quads of H from quad q0 (item
        it: token it // nq, quad q0 + it % nq).

        Routes are read REDUCE_BATCH at a time, every id and y load of a batch issued before any
        is used (a y row's address does not depend on its id; a route that is not local, or past
        k, adds +0.0, which leaves the sum's bits as skipping it would): one round trip to L2
        per batch instead of two per route. Routes past k load no y (at k = 4, batches of 8 that
        loaded 4 surplus rows measured ~1% slower than batches of 4 on gpt-oss-120b, T = 1..8)."""
        ids, y, out, top_k, hidden = ops.ids, ops.y, ops.out, ops.top_k, ops.hidden
        for it in cutlass.range(start, end, THREADS, unroll=1):
            t = it // nq
            h0 = (q0 + it - t * nq) * 4
            acc = cute.make_rmem_tensor(cute.make_layout(4), Float32)
            acc.fill(0.0)
            for j0 in cutlass.range(0, top_k, REDUCE_BATCH, unroll=1):
                loads = []
                for jj in cutlass.range_constexpr(REDUCE_BATCH):
                    pair = t * top_k + cutlass.min(j0 + jj, top_k - 1)
                    e = local_expert(ids, pair, ops.expert_offset, self.cfg.ids_bytes)
                    v = ptx.ld_cg_v4_if(y + (Int64(pair) * Int64(hidden) + Int64(h0)) * 4,
                                        j0 + jj < top_k)
                    loads.append((e, j0 + jj, v))
                for e, j, v in loads:
                    keep = Int32(0)
                    if cutlass.Uint32(e) < cutlass.Uint32(ops.experts) and j < top_k:
                        keep = Int32(-1)
                    for c in cutlass.range_constexpr(4):
                        acc[c] = acc[c] + ptx.f32_bits(v[c] & keep)
            ptx.st_v2(out + (Int64(t) * Int64(hidden) + Int64(h0)) * 2,
                      ptx.bf16x2_from_f32(acc[0], acc[1]), ptx.bf16x2_from_f32(acc[2], acc[3]))
