"""The moe-generic CuTe DSL kernel: one grouped GEMM over (expert, token-tile) work, used twice.

    FC1: inter[p, j]  = act(gscale[e] * (src[order[p] // row_div] @ w13[e]^T) + b13[e])  (bf16)
    FC2: y[pair[p], h] = w[pair[p]] * (gscale[e] * (inter[p] @ w2[e]^T) + b2[e])     (bf16)

p runs over routed pairs sorted by expert; a tile is (expert e, rows p0..p1 of that expert,
at most bn of them), listed by the device-side routing so no host sync is needed; CTAs whose
tile index is past the device-side tile count return at once.

Swap A/B: the weights are the MMA's A operand (M = weight rows), tokens are B (N = tokens), so
an expert with a handful of tokens still runs a 16 x 8 MMA instead of padding tokens to 64.
Per CTA: 4 warps (8 for bn=64 tiles, 16 where the K loop is long: 256 weight rows), each owning
mw groups of 16 weight rows and all bn tokens of the tile. The mainloop comes in one body per
8-token width class, picked per tile, so an expert's partly filled last tile skips the MMAs and
B reads past its tokens.
A 4-stage cp.async ring holds, per 128-deep K-tile:
  - token rows, gathered 16 B per copy (zero-filled past the tile's rows and past the real K;
    each thread's row addresses are computed once per tile, outside the K loop);
  - each warp's weight tiles: 1 KiB of fragment-ordered codes per 16-row group (a lane's 32 B
    are exactly its A fragments for the 8 k16 slabs) and the group's bf16 block scales.
Per K-tile each lane reads its codes and scales from shared memory, decodes e2m1 -> bf16 in
registers (decode_fragment_slab: shifts, rotations, a prmt and masks), multiplies by the block scale (bf16x2, exact),
and feeds the tensor cores: mma.sync.m16n8k16 with B fragments by ldmatrix from padded
[bn][128 + 8] rows.
With GemmConfig.producer_warps (compile_cache.config: the 32- and 48-token tiles) extra warps
issue every copy and hand the stages over by mbarriers instead of a CTA barrier per K-tile; with
GemmConfig.producer_bulk that warp's copies are bulk copies whose bytes complete the stage's full
barrier (_produce_bulk: the CTA's weight groups of a K-tile are one block of records, side by
side, so one copy; with GemmConfig.k_tail it zeroes the last K-tile past the real K itself).
Epilogues apply the fp32 global scale (x the activation global scale in w4a4) and bias; FC1
applies the activation with gate (row r) and up (row r + 8) of the same j in the same lane
(weights repacked so), FC2 the router weight and writes each (pair, h) exactly once, with y's
columns in the paired order of Y_BLOCK, so the top-k sum afterwards is deterministic. With a
producer warp, FC2's pair indices and router weights reach the epilogue through a shared table
that warp fills after its last copy (_stage_columns), not by two dependent loads after the K loop,
and the expert's global scale and the CTA's row biases, which that warp loads before its K loop,
through the ring stage after the K loop's last (_stage_operands): the epilogue starts without a
global round trip.

Overlap (GemmConfig.overlap, w4a16 at the bulk producer's widths): FC2 follows FC1 directly, and
FC1's last wave leaves SMs idle while its last CTAs finish (about half a CTA's time per slot);
FC2's first tiles fill them:
1. FC1 issues griddepcontrol.launch_dependents at its start, so FC2's grid launches once every
   FC1 CTA has started and its CTAs take the slots FC1's leave (no FC1 CTA waits for a slot,
   so none of FC2's waits can block FC1).
2. At a CTA's end, FC1's MMA threads fence their intermediate stores for the async proxy (FC2
   reads them by bulk copy) and meet at a named barrier; thread 0 adds 1 to the token tile's
   count with release semantics at GPU scope.
3. FC2 does not wait for FC1 at its start: its producer issues the weight copies of the first
   stages, waits (acquire) until the tile's count reaches FC1's CTAs per tile, then copies the
   intermediate. It adds 1 past that count, and the tile's last FC2 CTA zeroes it for the next
   launch. Every FC2 CTA waits for FC1's completion before it exits, so the kernels after FC2
   still follow FC1.
Same run on an H100 against the GEMMs one after the other (c3c6e9c, BENCHMARKS.md): -0.2% to
-4.2% at the five presets' moe-generic points, T = 64..512.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from moe_common.cute import jit, ptx
from moe_common.cute import activation as act
from moe_common.cute import fragment_mma as fm
from moe_common.cute.ring import StageRing
from moe_common.cute.storage import shared_storage
from moe_common.cute.topk_reduce import fragment_position
from moe_common.fragments import BLOCK_GROUPS, TILE_K

SMEM_ROW_BYTES = fm.B_ROW_BYTES  # 272: conflict-free ldmatrix B-fragment reads
# The intermediate FC1 writes and FC2 reads: K-tile-major blocks of rows padded as B's rows are
# in shared memory, element (p, k) at (k // 128) x P x SMEM_ROW_BYTES + p x SMEM_ROW_BYTES +
# (k % 128) x 2 (the runner's buffer [Ip / 128, P, SMEM_ROW_BYTES / 2]). A tile's rows p0 ..
# p0 + live - 1 of one K-tile are then one run of live x SMEM_ROW_BYTES bytes: FC2's bulk
# producer copies them with one copy from the elected lane, where rows of [P, Ip] took a bulk
# copy per row, each issued by its own lane, which ptxas serializes over the active lanes
# (ELECT, 3 R2UR, UBLKCP, ...: 9 SASS per row and K-tile, ~290 for 32 rows beside the 4 MMA
# warps' 4 x 319). The 8 padding columns of a row are copied and never read.
INTERMEDIATE_ROW = SMEM_ROW_BYTES // 2  # elements
# Columns per block of FC2's paired y order (moe_common.cute.topk_reduce): a 16-row group's rows
# r and r + 8, which one thread holds, sit side by side, so they go out as one bf16x2 store.
Y_BLOCK = 16


GemmOperands = jit.grouped_gemm_operands("GemmOperands", """The runtime operands of one GEMM
launch (FC1 or FC2), in kernel-parameter order: the runner builds them per launch
(jit.operands), GroupedGemm.__call__ and .kernel take them whole, and the compile cache compiles
with jit.example(GemmOperands).""", [
    # (first jit.GROUPED_GEMM_FIELDS: the GEMM's packed weights and the routing's tiles)
    # B's rows: FC1 token row order[p] // row_div of src (w4a16: x, row_div = k; w4a4: the
    # pairs' quantized rows, 1), FC2 row p of the intermediate; the row stride in elements and
    # (FC2) the bytes from one K-tile's block of rows to the next (INTERMEDIATE_ROW); the
    # real K (columns past it read as 0), the K-tiles and the 16-row weight groups per expert
    ("row_div", Int32), ("src", Int64), ("src_stride", Int32), ("src_kt_bytes", Int32),
    ("k_real", Int32), ("k_tiles", Int32), ("row_groups", Int32),
    # the output: FC1 the bf16 intermediate (INTERMEDIATE_ROW: row stride, K-tile block
    # bytes), FC2 y [P, H] bf16 (stride H; out_kt_bytes unused), its rows, with FC2's original
    # pair index per sorted position and the router weights (fp32 [P])
    ("out", Int64), ("out_stride", Int32), ("out_kt_bytes", Int32), ("out_rows", Int32),
    ("pair_orig", Int64), ("route_w", Int64),
    # the activation's run-time parameters (FC1; moe_common.types.Activation)
    ("act_alpha", Float32), ("act_beta", Float32), ("act_limit", Float32),
    # GemmConfig.overlap: per token tile, FC1's CTAs completed, then FC2's CTAs past their
    # wait (zeroed once; FC2's last CTA of a tile zeroes it again), and FC1's CTAs per tile
    ("tile_done", Int64), ("tile_items", Int32),
])


@dataclass(frozen=True)
class GemmConfig:
    phase: str  # "fc1" | "fc2"
    weight_format: str  # "nvfp4" | "mxfp4"
    activation: str = "silu"  # fc1 only; swiglu alpha/beta/limit are run-time arguments
    bn: int = 64  # tokens per tile (multiple of 8)
    mw: int = 2  # 16-row groups per warp (1 for decode tiles: twice the CTAs on the weights)
    warps: int = 4  # per CTA (8 with mw=1: the same 128-row tile with twice the warps)
    stages: int = 4  # cp.async ring depth; bn=64, 8 warps, NVFP4: 4 x 27 KiB, two CTAs per SM
    width_step: int = 8  # token granularity of the mainloop bodies (see live_widths)
    # 0: every warp copies its share of each stage and the CTA meets at a barrier per K-tile.
    # n > 0: n more warps only copy (cp.async into the same stages), each stage handed over by
    # mbarriers (full: the copies landed; empty: every MMA thread is done with it), so the MMA
    # warps issue no copy and never wait for each other (see _produce, _consume).
    producer_warps: int = 0
    # with one producer warp: every copy a bulk copy (cp.async.bulk) completing its bytes on the
    # stage's full barrier (weights from one elected lane, each live token row from its lane) in
    # place of 16-byte cp.async copies, commit groups and arrivals. Bulk copies do not zero-fill:
    # past a K tail the producer needs k_tail (compile_cache.unfit_reason); rows past the tile
    # keep stale bytes, which reach only MMA columns that are never stored.
    producer_bulk: bool = False
    # the real K stops inside the last K-tile (FC1 of a hidden size not a multiple of 128). Read
    # only by the bulk producer: it copies the real bytes of the last K-tile's rows and zeroes
    # the rest itself (the cp.async copies check every chunk against k_real anyway).
    k_tail: bool = False
    # FC2 beside FC1's last CTAs (w4a16, the bulk producer's widths; section "Overlap" above):
    # FC1 lets FC2 launch at its start and counts each token tile's completed CTAs; FC2 starts
    # without waiting for FC1 and its producer waits per tile for that count
    overlap: bool = False
    # n > 0: compiled for n CTAs per SM (.maxntid and .minnctapersm: ptxas caps the registers
    # at what n CTAs of this block leave, spilling if it must); 0: no bound
    min_ctas: int = 0

    @property
    def gated(self) -> bool:
        return self.phase == "fc1" and self.activation != "relu2"

    @property
    def cta_rows(self) -> int:
        return self.warps * self.mw * 16

    @property
    def live_widths(self) -> tuple:
        """The mainloop bodies, in 8-token blocks: a tile runs the narrowest body that holds
        its rows (bn=32: (1, 2, 3, 4); width_step 16: (2, 4))."""
        nb, step = self.bn // 8, self.width_step // 8
        return tuple(sorted({min(nb, c) for c in range(step, nb + step, step)}))

    @property
    def scale_bytes_per_row(self) -> int:  # bf16 scales per 128-K tile
        return fm.scale_bytes_per_row(self.weight_format)


class GroupedGemm:
    def __init__(self, cfg: GemmConfig):
        assert cfg.phase in ("fc1", "fc2") and cfg.bn % 8 == 0 and cfg.bn <= 64
        # a CTA's groups are whole record blocks or lie inside one, and so do a warp's
        # (fm.record_index; _produce_bulk copies a block, or the CTA's part of one, per K-tile)
        n = cfg.warps * cfg.mw
        assert n % BLOCK_GROUPS == 0 or BLOCK_GROUPS % n == 0, cfg
        assert BLOCK_GROUPS % cfg.mw == 0, cfg
        self.cfg = cfg
        self.nb = cfg.bn // 8
        self.b_bytes = cfg.bn * SMEM_ROW_BYTES  # padded rows: conflict-free ldmatrix
        self.a_group_bytes = fm.group_tile_bytes(cfg.weight_format)
        self.threads = cfg.warps * 32  # the MMA warps'
        self.block_threads = self.threads + cfg.producer_warps * 32
        self.stage_bytes = self.b_bytes + cfg.warps * cfg.mw * self.a_group_bytes
        # 16-byte chunks of one B stage, spread over the CTA's threads
        self.b_chunks = cfg.bn * (TILE_K // 8)
        assert self.b_chunks % self.threads == 0
        self.b_iters = self.b_chunks // self.threads
        bars = cfg.stages if cfg.producer_warps else 0
        # FC2 with a producer warp: it stages each token slot's (pair, router weight) for the
        # epilogue (_stage_columns) and the CTA's row biases and the expert's global scale
        # (_stage_operands), completing the `columns` barrier
        self.staged_columns = cfg.phase == "fc2" and cfg.producer_warps == 1
        slots = cfg.bn if self.staged_columns else 0
        # the epilogue finds a row's bias by a mask of its group (_epilogue_operands)
        assert not self.staged_columns or cfg.cta_rows & (cfg.cta_rows - 1) == 0, cfg
        mem = cute.struct.MemRange
        self.storage = shared_storage("GroupedGemmStorage", {
            "stages": cute.struct.Align[mem[cutlass.Uint8, cfg.stages * self.stage_bytes], 128],
            # with producer warps, the mbarriers: full[s] counts the copies, empty[s] the MMA
            # threads' releases (_warp_specialized)
            "full": mem[cutlass.Int64, bars],
            "empty": mem[cutlass.Int64, bars],
            "columns": mem[cutlass.Int64, 1 if slots else 0],
            "table": mem[cutlass.Int64, slots],  # per slot: pair (low word), weight (high)
            "end": mem[cutlass.Uint8, 0],  # the bytes used (the struct's size pads to 128)
        })
        self.smem_bytes = self.storage.offsets["end"]
        assert cfg.producer_warps >= 0, cfg
        assert not cfg.producer_bulk or cfg.producer_warps == 1, cfg
        assert not cfg.overlap or cfg.producer_bulk, cfg  # the waits sit in the bulk producer
        self.publishes = cfg.overlap and cfg.phase == "fc1"  # FC1 counts tiles (_publish)
        self.waits_per_tile = cfg.overlap and cfg.phase == "fc2"  # FC2 waits for them
        assert self.block_threads <= 1024, cfg

    # ------------------------------------------------------------------ host entry
    @cute.jit
    def __call__(self, ops: GemmOperands, grid_m: Int32, max_tiles: Int32, stream):
        """grid: grid_m row tiles x max_tiles token tiles (a bound: CTAs past the device-side
        tile count return at once)."""
        self.kernel(ops).launch(grid=[grid_m, max_tiles, 1], block=[self.block_threads, 1, 1],
                                smem=self.smem_bytes, stream=stream, use_pdl=jit.PDL,
                                **self._launch_bounds())

    def _launch_bounds(self) -> dict:
        """Launch fields for GemmConfig.min_ctas (none without it). The carveout is given so
        that the DSL does not ask the device for its shared memory at compile time."""
        if not self.cfg.min_ctas:
            return {}
        return dict(min_blocks_per_mp=self.cfg.min_ctas, preferred_smem_carveout=100,
                    max_number_threads=[self.block_threads, 1, 1])

    # ------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, ops):  # a GemmOperands (see jit.operands: why it is not annotated)
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        if cutlass.const_expr(not self.waits_per_tile):
            ptx.grid_dependency_wait()  # first: see jit.PDL (FC2 with overlap: before it exits)
        if cutlass.const_expr(self.publishes):
            ptx.launch_dependents()  # FC2's CTAs take the slots FC1's leave (see Overlap)
        bidx, bidy, _ = cute.arch.block_idx()
        tile = bidy
        # the tile's fields are loaded with the tile count, not after it (one round trip before
        # the first copy, not two; relaxed loads, which ptxas does not sink into the branch): the
        # table holds at least gridDim.y entries (runner.tiles_capacity), those past the count
        # stale and unused. FC2 with overlap reads the count from L2 as well: the routing wrote
        # it before FC1's CTAs passed their wait, and this kernel has not waited for anything.
        if cutlass.const_expr(self.waits_per_tile):
            count = ptx.ld_relaxed_u32(ops.num_tiles)
        else:
            count = ptx.ld_u32(ops.num_tiles)
        e = ptx.ld_relaxed_u32(ops.tile_expert + Int64(tile) * 4)
        p0 = ptx.ld_relaxed_u32(ops.tile_start + Int64(tile) * 4)
        p1 = ptx.ld_relaxed_u32(ops.tile_end + Int64(tile) * 4)
        if tile < count:
            warp = tidx // 32
            lane = tidx % 32
            r = lane // 4
            q = lane % 4

            smem = cutlass.memory.SmemAllocator()
            sbuf = smem.allocate_array(cutlass.Uint8, self.smem_bytes, byte_alignment=128)
            s_base = Int32(sbuf.toint())

            # ---- weight stream. Record (e, group, kt) (moe_common.packed): 1 KiB of
            # fragment-ordered codes, lane l's 32 B at l * 32, then bf16 scales [16 rows]
            # [128 / block] (NVFP4 256 B, MXFP4 128 B), at fm.record_index. Each warp copies
            # its groups' records (side by side in one block) into its own slice of the stage.
            group0 = bidx * (cfg.warps * cfg.mw) + warp * cfg.mw
            w_warp = ops.records + fm.record_index(e, group0, 0, ops.row_groups,
                                                   ops.k_tiles) * self.a_group_bytes
            a_warp_off = self.b_bytes + warp * cfg.mw * self.a_group_bytes

            acc = cute.make_rmem_tensor(cute.make_layout((cfg.mw, self.nb, 4)), Float32)
            acc.fill(0.0)

            b_lane = fm.ldmatrix_lane_offset(lane)  # this lane's ldmatrix row in a B stage

            if cutlass.const_expr(cfg.producer_warps == 0):
                sources = [self._chunk_source(tidx + it * self.threads, p0, p1, ops.order, ops.row_div,
                                              ops.src, ops.src_stride, self._b_kt_bytes(ops))
                           for it in range(self.b_iters)]

                # ---- mainloop, specialised on the tile's live width: an expert's last tile is
                # partly filled (DeepSeek-V3 T=8192: ~11% of the 64-token columns are padding;
                # T=256, 8 routed rows per expert in 32-token tiles: most of them), and the MMAs
                # and B reads of 8-token column blocks past it are skipped. One body per width
                # class (cfg.live_widths), chosen once per tile (a branch per K-tile instead kept
                # every body's registers live: 144 per thread, one CTA per SM). The decode is the
                # same in every body.
                loop_args = (acc, ops.k_tiles, s_base, lane, b_lane, sources, ops.src, ops.k_real,
                             w_warp, a_warp_off)
                self._by_width(cfg.live_widths, p1 - p0, loop_args)
                ptx.cp_async_wait(0)
                self._epilogue(ops, acc, e, None, p0, p1, group0, r, q)
            else:
                self._warp_specialized(ops, acc, e, p0, p1, bidx, tile, warp, lane, r, q, s_base,
                                       b_lane)
        if cutlass.const_expr(self.waits_per_tile):
            # FC2 exits after FC1 has completed, so the kernels after it still follow FC1 (a
            # CTA past the tile count too: with no tiles no CTA would wait for FC1 otherwise)
            ptx.grid_dependency_wait()

    # ------------------------------------------------------------------ pieces
    @cute.jit
    def _epilogue_operands(self, ops, e, cols, group0, r):
        """Expert e's global scale and the biases of rows r and r + 8 of this thread's groups
        (always read, zeros when the layer has none: one less compile variant). With cols (FC2's
        producer warp staged them: _stage_operands) from shared memory once the `columns`
        barrier completes, else all loaded from global memory together at the epilogue's start
        (before the K loop they take 5 more registers: FC2's 32-token tiles at 112, 3 CTAs per
        SM, or spilling inside the K loop at 96)."""
        biases = []
        if cutlass.const_expr(cols is not None):
            _, bar, staged = cols
            ptx.mbarrier_wait(bar, 0)
            gscale = ptx.f32_bits(ptx.ld_shared_u32(staged + self.cfg.cta_rows * 4))
            # the group's row in the CTA: groups are CTA-major (group0), n_groups a power of 2
            n_groups = self.cfg.warps * self.cfg.mw
            for g in cutlass.range_constexpr(self.cfg.mw):
                brow = staged + (((group0 + g) & (n_groups - 1)) * 16 + r) * 4
                biases.append((ptx.f32_bits(ptx.ld_shared_u32(brow)),
                               ptx.f32_bits(ptx.ld_shared_u32(brow + 32))))
        else:
            gscale = ptx.ld_nc_f32(ops.gscale + Int64(e) * 4)
            for g in cutlass.range_constexpr(self.cfg.mw):
                brow = ops.bias + (Int64(e) * Int64(ops.row_groups * 16)
                                   + Int64((group0 + g) * 16 + r)) * 4
                biases.append((ptx.ld_nc_f32(brow), ptx.ld_nc_f32(brow + 32)))
        return gscale, biases

    @cute.jit
    def _epilogue(self, ops, acc, e, cols, p0, p1, group0, r, q):
        """Global scale, bias; FC1 the activation into the intermediate, FC2 the router weight
        into y (each (pair, row) written once; cols: the shared table and operands the producer
        staged (_stage_columns, _stage_operands), or None to load them here)."""
        pre = self._epilogue_operands(ops, e, cols, group0, r)
        if cutlass.const_expr(self.cfg.phase == "fc2"):
            self._epilogue_fc2(ops, acc, pre, cols, p0, p1, group0, r, q)
        else:
            self._epilogue_fc1(ops, acc, pre, p0, p1, group0, r, q)

    @cute.jit
    def _epilogue_fc1(self, ops, acc, pre, p0, p1, group0, r, q):
        """inter[p] = act(acc x gscale + bias) in bf16: per column (token slot) the address of
        its intermediate row at this thread's first group (the next group's is an immediate
        offset on), then per group one store per column (relu2: two), each
        predicated on the column holding one of the tile's pairs (no branch per column; a
        dead column's activation runs on whatever its accumulators hold and is not stored).
        Gated: gate (row r) and up (row r + 8) of intermediate column 8 group + r; relu2:
        rows r and r + 8 are intermediate columns 16 group + r and + 8. A group's columns lie in
        one K-tile block of the intermediate (INTERMEDIATE_ROW)."""
        cfg = self.cfg
        per_group = 8 if cfg.gated else 16  # intermediate columns per 16-row group
        gscale, biases = pre
        rows = [ops.out + (Int64(p0 + nb * 8 + 2 * q + c) * Int64(ops.out_stride) + Int64(r)) * 2
                for nb in range(self.nb) for c in range(2)]
        for g in cutlass.range_constexpr(cfg.mw):
            b_lo, b_hi = biases[g]
            col = (group0 + g) * per_group  # the group's first intermediate column
            at = Int64(col // TILE_K) * Int64(ops.out_kt_bytes) + Int64(col % TILE_K) * 2
            for nb in cutlass.range_constexpr(self.nb):
                for c in cutlass.range_constexpr(2):
                    live = p0 + nb * 8 + 2 * q + c < p1
                    v_lo = acc[g, nb, c] * gscale + b_lo
                    v_hi = acc[g, nb, 2 + c] * gscale + b_hi
                    dst = rows[2 * nb + c] + at
                    if cutlass.const_expr(cfg.gated):
                        h = act.gated(cfg.activation, v_lo, v_hi, ops.act_alpha, ops.act_beta,
                                      ops.act_limit)
                        ptx.st_u16_if(dst, ptx.bf16x2_from_f32(h, h), live)
                    else:
                        a, b = act.relu2(v_lo), act.relu2(v_hi)
                        ptx.st_u16_if(dst, ptx.bf16x2_from_f32(a, a), live)
                        ptx.st_u16_if(dst + 16, ptx.bf16x2_from_f32(b, b), live)

    @cute.jit
    def _epilogue_fc2(self, ops, acc, pre, cols, p0, p1, group0, r, q):
        """y = (acc x gscale + bias) x router weight, rows r and r + 8 of each group as one
        bf16x2 word: y's rows are in the paired order of Y_BLOCK (moe_common.cute.topk_reduce),
        where they sit side by side, so a warp instruction writes 4 tokens x 32 contiguous
        bytes (a sector each). Steps:
        1. per column (token slot): its pair and router weight, from the shared table the
           producer warp filled (cols: _stage_columns, its barrier waited for by
           _epilogue_operands), else loaded here (clamped into the tile), every load issued
           before the first store (not 2 serial round trips per column after it: Qwen3-30B-A3B
           T=512 -4.5%), and the address of its y row at this thread's first group's columns
           (the next group's are 32 bytes on: an immediate offset);
        2. per group inside y's rows (out_rows is a multiple of 32: a group is in or out, one
           warp-uniform branch): one store per column, predicated on the column holding one of
           the tile's pairs (no branch per column)."""
        cfg = self.cfg
        gscale, biases = pre
        if cutlass.const_expr(cols is not None):
            table = cols[0]
        columns = []
        for nb in cutlass.range_constexpr(self.nb):
            for c in cutlass.range_constexpr(2):
                n = nb * 8 + 2 * q + c
                if cutlass.const_expr(cols is not None):
                    pair, w_bits = ptx.ld_shared_v2(table + n * 8)
                    wgt = ptx.f32_bits(w_bits)
                else:
                    pair = ptx.ld_u32(ops.pair_orig + Int64(cutlass.min(p0 + n, p1 - 1)) * 4)
                    wgt = ptx.ld_nc_f32(ops.route_w + Int64(pair) * 4)
                columns.append((p0 + n, pair, wgt))
        col0 = fragment_position(group0 * 16, r, 0, 0, 1)
        dsts = [ops.out + (Int64(pair) * Int64(ops.out_stride) + Int64(col0)) * 2
                for _, pair, _ in columns]
        for g in cutlass.range_constexpr(cfg.mw):
            if (group0 + g) * 16 < ops.out_rows:
                b_lo, b_hi = biases[g]
                for nb in cutlass.range_constexpr(self.nb):
                    for c in cutlass.range_constexpr(2):
                        p, _, wgt = columns[2 * nb + c]
                        v_lo = acc[g, nb, c] * gscale + b_lo
                        v_hi = acc[g, nb, 2 + c] * gscale + b_hi
                        ptx.st_u32_if(dsts[2 * nb + c] + 32 * g,
                                      ptx.bf16x2_from_f32(v_lo * wgt, v_hi * wgt), p < p1)

    @cute.jit
    def _by_width(self, widths: tuple, width, loop_args):
        """The K loop body (_mainloop, or _consume with producer warps) of the narrowest class in
        `widths` (8-token blocks) that holds `width` rows."""
        if cutlass.const_expr(len(widths) == 1):
            self._body(widths[0], loop_args)
        else:
            if width > widths[-2] * 8:
                self._body(widths[-1], loop_args)
            else:
                self._by_width(widths[:-1], width, loop_args)

    @cute.jit
    def _body(self, live_nb: int, loop_args):
        if cutlass.const_expr(self.cfg.producer_warps == 0):
            self._mainloop(live_nb, *loop_args)
        else:
            self._consume(live_nb, *loop_args)

    # ------------------------------------------------------------------ producer warps
    @cute.jit
    def _warp_specialized(self, ops, acc, e, p0, p1, bidx, tile, warp, lane, r, q, s_base,
                          b_lane):
        """The tile with cfg.producer_warps copy-only warps after the MMA warps:
        1. thread 0 sets up the stages' mbarriers: full[s] counts the copying threads' arrivals,
           empty[s] the MMA threads';
        2. a producer warp streams K-tile after K-tile into the ring (_produce), waiting only
           for the stage it refills to be released;
        3. an MMA warp runs the same decode and MMAs per K-tile as _mainloop, waiting only for
           that stage's copies, then releases it (_consume), and writes its rows (_epilogue);
        4. FC2 with one producer warp: that warp loads the tile's pair indices, the expert's
           global scale and the CTA's row biases before its K loop (_column_pairs,
           _operand_loads) and, after it, stores the pairs and their router weights into the
           shared table (_stage_columns) and the scale and biases into the stage after the K
           loop's last (_stage_operands, _staged_at), which the epilogue reads once the
           `columns` barrier completes: the epilogue starts without a global round trip (its
           first FFMA waited on the scale's and biases' loads: 7.7% of FC2's stall samples,
           ncu); held in the MMA warps' registers over the K loop they would cost 5
           (_epilogue_operands); in the producer warp's none, the kernel's count being set by
           the MMA warps' K loop (32 tokens, NVFP4: 96 registers before and after);
        5. with cfg.overlap, FC1's MMA warps count the tile's CTA done after their epilogue
           (_publish) and FC2's producer waits for that count (_produce_bulk)."""
        cfg = self.cfg
        off = self.storage.offsets
        ring = StageRing(cfg.stages, self.stage_bytes, s_base + off["full"],
                         s_base + off["empty"], (s_base, off["stages"]))
        cols = None
        if cutlass.const_expr(self.staged_columns):
            cols = (s_base + off["table"], s_base + off["columns"])
        if warp == 0:
            if lane == 0:
                # full: with bulk copies one arrival (expect_tx) and the bytes, else each copying
                # thread's arrival; empty: every MMA thread's release
                ring.init(1 if cfg.producer_bulk else cfg.producer_warps * 32, cfg.warps * 32)
                if cutlass.const_expr(self.staged_columns):
                    ptx.mbarrier_init(cols[1], 32)  # the producer warp's lanes
                ptx.fence_mbarrier_init()
        cute.arch.sync_threads()
        if warp >= cfg.warps:
            pairs = self._column_pairs(ops, lane, p0, p1) if self.staged_columns else []
            held = self._operand_loads(ops, lane, bidx, e) if self.staged_columns else None
            if cutlass.const_expr(cfg.producer_bulk):
                self._produce_bulk(ops, lane, bidx, tile, e, p0, p1, ring)
            else:
                self._produce(ops, warp - cfg.warps, lane, bidx, e, p0, p1, ring)
            if cutlass.const_expr(self.staged_columns):
                self._stage_columns(ops, lane, pairs, cols)
                self._stage_operands(ops, lane, held, ring)
                # release: this lane's stores (table, operands) before the epilogue's reads
                ptx.mbarrier_arrive(cols[1])
        else:
            a_warp_off = self.b_bytes + warp * cfg.mw * self.a_group_bytes
            group0 = (bidx * cfg.warps + warp) * cfg.mw
            self._by_width(cfg.live_widths, p1 - p0,
                           (acc, ops, ring, lane, b_lane, a_warp_off, e, cols,
                            p0, p1, group0, r, q))
            if cutlass.const_expr(self.publishes):
                self._publish(ops, tile)

    @cute.jit
    def _publish(self, ops, tile):
        """Overlap, FC1, the MMA warps after their epilogue: each thread orders its intermediate
        stores before async-proxy reads (FC2's bulk copies), the MMA warps meet at a named
        barrier (the producer warp stores nothing), and thread 0 adds 1 to the tile's count with
        release semantics at GPU scope (its fence waits for the CTA's stores to be visible).
        Thread 0 is found from the thread index read here: a test carried from the kernel's start
        held a register over the K loop (spilled once the decode took 2 more there)."""
        ptx.fence_proxy_async_global()
        ptx.named_barrier(1, self.cfg.warps * 32)
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            ptx.count_add_release_gpu(ops.tile_done + Int64(tile) * 4)

    @cute.jit
    def _column_pairs(self, ops, lane, p0, p1):
        """The pair index of token slots lane, lane + 32, ... of the tile (a slot past the tile's
        rows takes its last row's: the table is always whole), loads issued before the K loop."""
        return [ptx.ld_u32(ops.pair_orig + Int64(cutlass.min(p0 + i * 32 + lane, p1 - 1)) * 4)
                for i in range(-(-self.cfg.bn // 32))]

    def _staged_at(self, ops, ring):
        """Where the producer stages the epilogue's operands (_stage_operands): the CTA's row
        biases (fp32, cta_rows of them) and then the global scale, at the start of the stage of
        use k_tiles, the first after the K loop's last. Not beside the table: at 32 tokens
        (NVFP4) 4 CTAs per SM leave 200 bytes per CTA unallocated (4 x (57144 + 1024 reserved)
        of 233472), and these are 516. That stage's last use, k_tiles - stages, is released
        stages - 1 K-tiles before the MMA warps' epilogue (a K loop shorter than the ring never
        used it), by threads that waited for its copies' completion before reading it: the
        producer's plain stores after that release follow the copies' writes."""
        return ring.at(ops.k_tiles)

    def _bias_chunk(self, i, lane):
        """The 16-byte chunk of the CTA's biases (4 rows) that lane copies in pass i: 32 per
        pass, the 128 rows of the dispatched tiles in one; a CTA of 64 rows (the 8- and
        16-token tiles with a producer warp, probes only) has 16, and lanes 16-31 copy the last
        (the same bytes as lane 15)."""
        chunk = i * 32 + lane
        if self.cfg.cta_rows < 128:
            chunk = cutlass.min(chunk, self.cfg.cta_rows // 4 - 1)
        return chunk

    @cute.jit
    def _operand_loads(self, ops, lane, bidx, e):
        """Expert e's global scale (its bits) and this lane's chunks of the CTA's row biases
        (rows bidx x cta_rows .. of expert e, 16-byte aligned: an expert's bias rows are padded
        to 128), loads issued before the K loop and held in the producer's registers over it
        (5 at 128 rows: one 16-byte load per lane)."""
        rows = self.cfg.cta_rows
        gscale = ptx.ld_nc_u32(ops.gscale + Int64(e) * 4)
        first = ops.bias + (Int64(e) * Int64(ops.row_groups * 16) + Int64(bidx * rows)) * 4
        return gscale, [ptx.ld_nc_v4(first + Int64(self._bias_chunk(i, lane)) * 16)
                        for i in range(-(-rows // 128))]

    @cute.jit
    def _stage_operands(self, ops, lane, held, ring):
        """After the producer's K loop and _stage_columns: wait until the stage of use k_tiles is
        free (_staged_at), then the biases it loaded (_operand_loads) into it, one 16-byte store
        per lane and chunk (_bias_chunk), and the global scale from lane 0. Waiting after the
        router weights' round trip (_stage_columns), not before it, the release it waits for
        comes during that round trip."""
        gscale, chunks = held
        ring.wait_empty(ops.k_tiles)
        staged = self._staged_at(ops, ring)
        for i in cutlass.range_constexpr(len(chunks)):
            ptx.st_shared_v4(staged + self._bias_chunk(i, lane) * 16, *chunks[i])
        if lane == 0:
            ptx.st_shared_u32(staged + self.cfg.cta_rows * 4, gscale)

    @cute.jit
    def _stage_columns(self, ops, lane, pairs, cols):
        """After the producer's K loop: slot n's (pair, router weight) into the shared table (the
        caller then arrives on the `columns` barrier)."""
        table, _ = cols
        for i in cutlass.range_constexpr(len(pairs)):
            n = i * 32 + lane
            if n < self.cfg.bn:
                w = ptx.ld_nc_u32(ops.route_w + Int64(pairs[i]) * 4)
                ptx.st_shared_u32(table + n * 8, pairs[i])
                ptx.st_shared_u32(table + n * 8 + 4, w)

    @cute.jit
    def _produce(self, ops, pw, lane, bidx, e, p0, p1, ring):
        """Producer warp pw: per K-tile, wait until the stage is free, cp.async into it its share
        of the token rows (two copying threads per row, each 32-byte sector of a row read whole
        by one instruction: thread j of the P warps' 32 P takes row j // 2 + 16 P i, chunks
        j % 2, j % 2 + 2, ...; zeros past the tile's rows and the real K) and the weight groups
        of MMA warps pw, pw + P, ..., commit them as one group, and arrive on the full barrier
        of the stage filled stages - 2 K-tiles before once that group has landed (wait_group):
        the stages - 1 K-tiles in flight of _mainloop's ring, each handed over by a plain
        arrive (release) after the copying thread saw its own copies land."""
        cfg = self.cfg
        npw = cfg.producer_warps
        ctid = pw * 32 + lane  # this thread among the producer warps'
        rows_per_pass = 16 * npw
        half = ctid % 2  # the chunks of the row this thread copies: half, half + 2, ...
        row_src = [self._chunk_source((ctid // 2 + rows_per_pass * i) * 16 + half, p0, p1,
                                      ops.order, ops.row_div, ops.src, ops.src_stride,
                                      self._b_kt_bytes(ops))
                   for i in range(-(-cfg.bn // rows_per_pass))]
        served = [pw + npw * j for j in range(-(-cfg.warps // npw))]  # MMA warps pw + P j
        # per served warp: where its groups' records start, its stage slice
        starts = [fm.record_index(e, (bidx * cfg.warps + w) * cfg.mw, 0, ops.row_groups,
                                  ops.k_tiles) for w in served]
        weights = [(ops.records + t0 * self.a_group_bytes,
                    self.b_bytes + w * cfg.mw * self.a_group_bytes, w)
                   for t0, w in zip(starts, served)]
        lag = max(0, cfg.stages - 2)
        for kt in cutlass.range(ops.k_tiles, unroll=1):
            ring.wait_empty(kt)
            stage = ring.at(kt)
            for i in cutlass.range_constexpr(len(row_src)):
                if ctid // 2 + rows_per_pass * i < cfg.bn:
                    base, dst, ch0, ok, kt_bytes = row_src[i]
                    for j in cutlass.range_constexpr(TILE_K // 16):
                        self._copy_chunk((base + Int64(j * 32), dst + j * 32, ch0 + 2 * j, ok,
                                          kt_bytes), kt, ops.k_real, ops.src, stage)
            for j in cutlass.range_constexpr(len(weights)):
                w_src, a_off, w = weights[j]
                if w < cfg.warps:
                    self._copy_groups(kt, stage, lane, w_src, a_off)
            ptx.cp_async_commit()
            ptx.cp_async_wait(lag)
            if kt >= lag:
                ring.arrive_full(kt - lag)
        # the last `lag` stages, once every copy has landed
        ptx.cp_async_wait(0)
        for i in cutlass.range_constexpr(lag):
            kt = ops.k_tiles - lag + i
            if kt >= 0:
                ring.arrive_full(kt)

    @cute.jit
    def _produce_bulk(self, ops, lane, bidx, tile, e, p0, p1, ring):
        """The producer warp with cfg.producer_bulk: per K-tile, wait until the stage is free;
        one elected lane arrives on its full barrier expecting the stage's bytes and bulk copies
        every MMA warp's weight groups (one record per group) and, in FC2, the tile's live rows
        of the intermediate (one run: INTERMEDIATE_ROW); in FC1 lane n copies live token row
        n (one 256-byte copy; with cfg.k_tail the last K-tile's real bytes, and zeros past them).
        The barrier completes when the bytes have landed. FC1's token rows wait on a load of
        `order` (and a division by row_div), FC2's intermediate with cfg.overlap on FC1's count
        of the tile (_wait_tile); the weights do not: the first `stages` K-tiles' weight copies
        go out before it, their rows after it, then the loop runs both."""
        cfg = self.cfg
        fc2 = cfg.phase == "fc2"
        live = cutlass.min(p1 - p0, cfg.bn)
        # FC2: the tile's rows p0 .. p0 + live - 1 at K-tile 0, contiguous rows of SMEM_ROW_BYTES
        run = (ops.src + Int64(p0) * Int64(ops.src_stride) * 2, live * SMEM_ROW_BYTES)
        # the record index (fm.record_index) of each block of the CTA's groups at K-tile 0, in
        # stage order: one copy per block and K-tile
        n_groups = cfg.warps * cfg.mw
        blocks = [fm.record_index(e, bidx * n_groups + j, 0, ops.row_groups, ops.k_tiles)
                  for j in range(0, n_groups, BLOCK_GROUPS)]
        head = (ops, lane, live, blocks, run, ring)
        if cutlass.const_expr(fc2):
            if cutlass.const_expr(self.waits_per_tile):
                ahead = cutlass.min(ops.k_tiles, cfg.stages)
                for kt in cutlass.range(ahead, unroll=1):
                    self._bulk_head(kt, *head, False)
                self._wait_tile(ops, lane, tile)
                for kt in cutlass.range(ahead, unroll=1):
                    self._bulk_run(kt, ops, run, ring)
                for kt in cutlass.range(ahead, ops.k_tiles, unroll=1):
                    self._bulk_head(kt, *head, True)
            else:
                for kt in cutlass.range(ops.k_tiles, unroll=1):
                    self._bulk_head(kt, *head, True)
        else:
            ahead = cutlass.min(ops.k_tiles, cfg.stages)
            for kt in cutlass.range(ahead, unroll=1):
                self._bulk_head(kt, *head, True)
            rows = self._row_sources(ops, lane, p0, live)
            for kt in cutlass.range(ahead, unroll=1):
                self._bulk_rows(kt, ops, lane, live, rows, ring)
            for kt in cutlass.range(ahead, ops.k_tiles, unroll=1):
                self._bulk_head(kt, *head, True)
                self._bulk_rows(kt, ops, lane, live, rows, ring)

    @cute.jit
    def _wait_tile(self, ops, lane, tile):
        """Overlap, FC2's producer: wait (every lane, acquire at GPU scope) until FC1's CTAs of
        the tile have all counted it (_publish), then a proxy fence before this warp's bulk
        copies read the intermediate; lane 0 adds 1 past FC1's count, and the tile's last FC2
        CTA (gridDim.x of them) sets it back to 0: every one of them has passed its wait."""
        at = ops.tile_done + Int64(tile) * 4
        ptx.count_wait_acquire_gpu(at, ops.tile_items)
        ptx.fence_proxy_async_global()
        if lane == 0:
            grid_m, _, _ = cute.arch.grid_dim()
            if ptx.atom_add_global(at, 1) == ops.tile_items + Int32(grid_m) - 1:
                ptx.st_u32(at, Int32(0))

    @cute.jit
    def _bulk_run(self, kt, ops, run, ring):
        """Overlap, FC2: K-tile kt's run of the tile's intermediate rows, from the elected lane,
        on the stage's full barrier (its arrival, by _bulk_head, counted these bytes already)."""
        run_src, run_bytes = run
        ptx.bulk_copies_g2s_elected(ring.full_bar(kt), None, [
            (ring.at(kt), run_src + Int64(kt) * Int64(ops.src_kt_bytes), run_bytes)])

    def _kt_row_bytes(self, ops, kt):
        """The bytes of a token row that K-tile kt copies: all 256, or with cfg.k_tail the real
        columns' (the last K-tile's end inside it)."""
        if cutlass.const_expr(self.cfg.k_tail):
            return cutlass.min(ops.k_real - kt * TILE_K, TILE_K) * 2
        return TILE_K * 2

    @cute.jit
    def _bulk_head(self, kt, ops, lane, live, blocks, run, ring, run_copy: cutlass.Constexpr):
        """K-tile kt's stage, all but FC1's token rows: wait until it is free; with cfg.k_tail
        zero each live row past the real columns (this lane's stores, ordered before the elected
        arrival by the warp barrier); the elected lane's arrival expecting every byte of the
        stage (the rows' too) and its copies of the weight blocks (FC2: and of the rows' run,
        unless run_copy is False: _bulk_run copies it later).
        The weights are read once per call: evict-first in L2 (ptx.BulkCopy), the
        token rows and the intermediate at the default priority."""
        cfg = self.cfg
        fc2 = cfg.phase == "fc2"
        ring.wait_empty(kt)
        stage = ring.at(kt)
        row_bytes = self._kt_row_bytes(ops, kt)
        if cutlass.const_expr(cfg.k_tail):
            for i in cutlass.range_constexpr(-(-cfg.bn // 32)):
                n = i * 32 + lane
                if n < live:
                    for off in cutlass.range(row_bytes, TILE_K * 2, 16):
                        ptx.st_shared_v4(stage + n * SMEM_ROW_BYTES + off, 0, 0, 0, 0)
            ptx.sync_warp()
        n_groups = cfg.warps * cfg.mw
        block = min(n_groups, BLOCK_GROUPS) * self.a_group_bytes
        copies = []
        for j in cutlass.range_constexpr(len(blocks)):
            t = blocks[j] + Int64(kt) * BLOCK_GROUPS
            copies.append(ptx.BulkCopy(stage + self.b_bytes + j * block,
                                       ops.records + t * self.a_group_bytes, block,
                                       evict_first=True))
        run_src, run_bytes = run
        if cutlass.const_expr(fc2 and run_copy):
            copies.append((stage, run_src + Int64(kt) * Int64(ops.src_kt_bytes), run_bytes))
        tx_bytes = n_groups * self.a_group_bytes + (run_bytes if fc2 else live * row_bytes)
        ptx.bulk_copies_g2s_elected(ring.full_bar(kt), tx_bytes, copies)

    @cute.jit
    def _row_sources(self, ops, lane, p0, live):
        """FC1: per pass over the tile's rows, the address of row n = 32 pass + lane's source
        row, order[p0 + n] // row_div of src (src itself past the tile: never read)."""
        rows = []
        for i in cutlass.range_constexpr(-(-self.cfg.bn // 32)):
            src_row = ops.src
            if i * 32 + lane < live:
                row = ptx.ld_u32(ops.order + Int64(p0 + i * 32 + lane) * 4) // ops.row_div
                src_row = ops.src + Int64(row) * Int64(ops.src_stride) * 2
            rows.append(src_row)
        return rows

    @cute.jit
    def _bulk_rows(self, kt, ops, lane, live, rows, ring):
        """FC1: K-tile kt of each live token row, one bulk copy from its lane (ptxas runs them
        as a loop over the active lanes), completing on the stage's full barrier."""
        stage = ring.at(kt)
        row_bytes = self._kt_row_bytes(ops, kt)
        for i in cutlass.range_constexpr(len(rows)):
            n = i * 32 + lane
            if n < live:
                ptx.bulk_copy_g2s(stage + n * SMEM_ROW_BYTES, rows[i] + Int64(kt) * (TILE_K * 2),
                                  row_bytes, ring.full_bar(kt))

    @cute.jit
    def _consume(self, live_nb: int, acc, ops, ring, lane, b_lane, a_warp_off, e, cols, p0,
                 p1, group0, r, q):
        """An MMA warp with producer warps: the K loop (wait for the stage's copies, decode and
        MMA as _mainloop does, release the stage: every thread arrives after its own
        shared-memory reads, so each read is ordered before the refill by the barrier itself),
        then the epilogue (cols: the table, its barrier and, formed after the K loop, where the
        operands are staged: _staged_at)."""
        cfg = self.cfg
        for kt in cutlass.range(ops.k_tiles, unroll=1):
            ring.wait_full(kt)
            stage = ring.at(kt)
            words = [fm.load_group_words(stage + a_warp_off + gi * self.a_group_bytes, lane,
                                         cfg.weight_format) for gi in range(cfg.mw)]
            fm.mma_ktile(acc, words, stage + b_lane, live_nb, cfg.weight_format)
            ring.release(kt)
        staged = None
        if cutlass.const_expr(cols is not None):
            staged = (*cols, self._staged_at(ops, ring))
        self._epilogue(ops, acc, e, staged, p0, p1, group0, r, q)

    @cute.jit
    def _mainloop(self, live_nb: int, acc, k_tiles, s_base, lane, b_lane, sources, src, k_real,
                  w_warp, a_warp_off):
        """The K loop: a stages-deep cp.async ring of (B tile, A tiles), MMAs over the tile's
        first live_nb 8-token blocks (the copies always fill all bn rows, zeros past the tile)."""
        cfg = self.cfg
        for st in cutlass.range_constexpr(cfg.stages - 1):
            if st < k_tiles:
                self._issue_stage(Int32(st), s_base + st * self.stage_bytes, lane, sources, src,
                                  k_real, w_warp, a_warp_off)
            ptx.cp_async_commit()
        for kt in cutlass.range(k_tiles, unroll=1):
            ptx.cp_async_wait(cfg.stages - 2)
            cute.arch.sync_threads()  # stage kt landed for every thread; stage kt-1 is free
            nxt = kt + cfg.stages - 1
            if nxt < k_tiles:
                self._issue_stage(nxt, s_base + (nxt % cfg.stages) * self.stage_bytes, lane, sources,
                                  src, k_real, w_warp, a_warp_off)
            ptx.cp_async_commit()
            stage = s_base + (kt % cfg.stages) * self.stage_bytes
            words = [fm.load_group_words(stage + a_warp_off + g * self.a_group_bytes, lane,
                                         cfg.weight_format) for g in range(cfg.mw)]
            fm.mma_ktile(acc, words, stage + b_lane, live_nb, cfg.weight_format)

    def _b_kt_bytes(self, ops):
        """Bytes from one K-tile of B's source rows to the next: FC1 reads row-major rows (x or
        the w4a4 rows), FC2 the intermediate's K-tile blocks (INTERMEDIATE_ROW)."""
        return TILE_K * 2 if self.cfg.phase == "fc1" else ops.src_kt_bytes

    @cute.jit
    def _chunk_source(self, c, p0, p1, order, row_div, src, src_stride, kt_bytes):
        """Where B chunk c (a token row's 16-byte piece ch of each K-tile) comes from and goes to,
        and the bytes from one K-tile's piece to the next (_b_kt_bytes).

        Computed once per tile, outside the K loop: the row gather (order[p] // row_div) is a
        dependent global load that would otherwise stall every K-tile's copies.
        """
        n = c // 16
        ch = c % 16
        dst = n * SMEM_ROW_BYTES + ch * 16
        p = p0 + n
        base = src
        ok = Int32(0)
        if p < p1:
            row = p  # FC2 reads the intermediate in sorted order
            if cutlass.const_expr(self.cfg.phase == "fc1"):
                # FC1 gathers rows: token = pair // top_k (w4a16), or the pair's own quantized
                # row (w4a4, row_div = 1)
                row = ptx.ld_u32(order + Int64(p) * 4) // row_div
            base = src + (Int64(row) * Int64(src_stride) + Int64(ch * 8)) * 2
            ok = Int32(1)
        return base, dst, ch, ok, kt_bytes

    @cute.jit
    def _copy_chunk(self, source, kt, k_real, src, stage_base):
        base, dst, ch, ok, kt_bytes = source
        k0 = kt * TILE_K + ch * 8
        nbytes = Int32(0)
        gaddr = src  # any valid address when nothing is read (zero-fill)
        if ok != Int32(0):
            if k0 < k_real:
                gaddr = base + Int64(kt) * Int64(kt_bytes)
                nbytes = Int32(16)
        ptx.cp_async_16_zfill(stage_base + dst, gaddr, nbytes)

    @cute.jit
    def _issue_stage(self, kt, stage, lane, sources, src, k_real,
                     w_warp, a_warp_off):
        """cp.async K-tile kt's token rows (whole CTA) and this warp's weight tiles into a stage."""
        for it in cutlass.range_constexpr(self.b_iters):
            self._copy_chunk(sources[it], kt, k_real, src, stage)
        self._copy_groups(kt, stage, lane, w_warp, a_warp_off)

    @cute.jit
    def _copy_groups(self, kt, stage, lane, w_warp, a_warp_off):
        """cp.async K-tile kt of one warp's mw weight groups (their records, side by side in
        one block: fm.record_index) into a stage."""
        cfg = self.cfg
        scale_chunks = cfg.scale_bytes_per_row  # 16 rows x sbpr bytes = sbpr chunks of 16 B
        for g in cutlass.range_constexpr(cfg.mw):
            dst = stage + a_warp_off + g * self.a_group_bytes
            rec = w_warp + Int64(kt) * (BLOCK_GROUPS * self.a_group_bytes) \
                + g * self.a_group_bytes
            ptx.cp_async_16(dst + lane * 32, rec + Int64(lane) * 32)
            ptx.cp_async_16(dst + lane * 32 + 16, rec + Int64(lane) * 32 + 16)
            if lane < scale_chunks:
                ptx.cp_async_16(dst + 1024 + lane * 16, rec + 1024 + Int64(lane) * 16)
