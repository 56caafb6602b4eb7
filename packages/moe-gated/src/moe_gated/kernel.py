"""The moe-gated CuTe DSL kernel: a persistent grouped GEMM with large tiles on warpgroup MMA.

    FC1: inter[p, j]  = act(gscale[e] * (src[order[p] // row_div] @ w13[e]^T) + b13[e])  (bf16)
    FC2: y[order[p], h] = gscale[e] * (inter[p] @ w2[e]^T) + b2[e]                       (bf16)

p runs over routed pairs sorted by expert (moe_common.cute.routing, tiles of up to bn pairs);
y's columns are in the paired order of y_block(geometry) and the top-k reduce applies the router
weights (moe_common.cute.topk_reduce, weighted).

Branch pairing: the packed w13 (moe_common.packed) holds each 16-row group as [8 gate rows;
8 up rows] of the same 8 intermediate columns, so the MMA puts gate (row r) and up (row r + 8)
of one (column, token) in the same thread's accumulators and the activation is applied in the
FC1 epilogue, with no second pass and no gate/up round trip through memory. relu2 (non-gated)
layers pack w13's rows as intermediate columns (16g .. 16g + 15 in group g), so its FC1 epilogue
writes two 8-column chunks per group, one per fragment half; the mainloop is the same.

Work: items (token tile, weight row tile), taken from a device-side atomic queue by persistent
CTAs (one per SM), so an expert with many tokens is spread over every SM and skewed routing
stays balanced. Consecutive tickets are the row tiles of one token tile, so the concurrently
running CTAs share that tile's token rows in L2.

Per CTA: a producer warp (in a third warpgroup, see THREADS) and 2 consumer warpgroups; consumer
warp w owns gpw weight groups (16 rows each) of the row tile. Per 128-deep K-tile each consumer
warpgroup issues, per k16 slab, gpw wgmma m64nNk16 with A (the weights, decoded e2m1 -> bf16 and
scaled in registers) from registers and B (the tokens) from shared memory; N is the tile's token
count rounded up to one of WIDTHS (FC2 without FC1_ONLY_WIDTHS; past wgmma's 256, a second
wgmma per slab for the rest, on the same A registers). The decode (8 integer instructions and 4
bf16x2 multiplies per 8 weights) is paid once per weight tile and token tile, so the wider the
token tile, the less decode per FLOP: GEOMETRIES has the two tile shapes, 128 rows x 288
tokens ("wide") and 256 x 128 ("tall").

Operands arrive by bulk copy (cp.async.bulk, the TMA engine's 1-D copy): B is copied per
K-tile as two 64-column halves, as many tokens as the MMA is wide, from a tile-blocked buffer
already in the order the wgmma descriptor reads (FC1: token rows that row_scatter.RowScatter
placed in the 128-byte swizzle; FC2: the intermediate, which FC1's epilogue writes as
token-group-major core matrices), and each weight group's K-tile is one copy of its record
(codes, scales), all issued by one elected lane of the producer warp (_produce). A CTA-wide
per-thread cp.async ring measured 21.1 ms at DeepSeek-V3 T=8192 with its issue stalled on the
load/store unit (ncu: 21% of warp samples on one LDGSTS address register, long scoreboard); the
bulk copies take one instruction per 1-64 KiB instead of one per 16 bytes per thread.

Pipeline: a ring of `stages` stages with a full mbarrier (the producer's transaction bytes) and
an empty mbarrier (one arrival per consumer warp) per stage; there is no CTA barrier in the
mainloop. A stage is one K-tile, several for an item of few tokens, or on wide tiles half of
one (stage_layout): a 288-token K-tile is 81 KiB, and 3 stages of it do not fit. The producer
takes tickets itself and hands items to the consumers through a small ring, so it loads the
next item's K-tiles while the consumers run the epilogue. wgmma runs asynchronously: each slab is its
own commit group and at most `pending` slabs stay in flight across the K-tile boundary; a warp
releases stage g - 1 once stage g's wgmmas are issued, when none of g - 1's can still be reading
it.

Overlap (GatedConfig.overlap, w4a16): at the end of FC1 each CTA idles while the last items
finish, about half an item (1.7% of DeepSeek-V3 T=1024's call on an H100); FC2 fills it:
1. FC1 issues griddepcontrol.launch_dependents at its start, so FC2's CTAs launch on the SMs
   that FC1's CTAs leave (FC1 holds every SM's registers until then).
2. FC1's consumer warps arrive on a per-item mbarrier a mainloop after the item's epilogue
   (between the next item's mainloop and its epilogue), after a proxy fence for FC2's bulk
   copies that by then waits for nothing; a warp of the producer's warpgroup, idle otherwise,
   then adds 1 to the token tile's count in global memory with release semantics (its fence
   waits for the stores on that warp alone).
3. FC2 does not wait for FC1 at its start: its producer waits (acquire) for a tile's count to
   reach FC1's row tiles before it copies that tile's intermediate, and its consumers wait for
   FC1's completion before they exit (so the kernels after FC2 still follow FC1). FC2's last
   CTA zeroes the counts for the next launch.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from moe_common.cute import activation as act
from moe_common.cute import fragment_mma as fm
from moe_common.cute import jit
from moe_common.cute import ptx
from moe_common.cute.ring import StageRing
from moe_common.cute.storage import shared_storage
from moe_common.cute.topk_reduce import fragment_position
from moe_common.cute.wgmma_decode import wgmma_decode_k128
from moe_common.fragments import BLOCK_GROUPS, BLOCK_SHIFT, TILE_K
from moe_common.hopper import SMEM_PER_CTA

from .limits import ACTIVATIONS

# Tile geometries, (tokens per tile, 16-row weight groups per consumer warp): "wide" (288 x 1:
# 128 weight rows) pays the decode once per up to 288 tokens and is the faster one when experts
# get whole tiles; "tall" (128 x 2: 256 weight rows) does twice the decode per FLOP but moves
# half the B bytes per FLOP and gives each warp two independent decode+MMA chains, so it wins
# where tiles are partly filled (BENCHMARKS.md, c8035d3 and 1ed3350). The runner picks one per
# call from the routed pairs per expert. Wide was 256 tokens before 58bc6d3: at 256
# +- 16 routed pairs per expert (DeepSeek-V3, gpt-oss-120b at T=8192) half the experts then
# had a leftover tile of a few tokens costing ~40% of a full one; 288 takes them in one pass,
# 7.8-8.0% faster there (BENCHMARKS.md). 320 makes ptxas serialize the wgmmas (C7512).
GEOMETRIES = {"wide": (288, 1), "tall": (128, 2)}
# MMA widths per tile size: a tile's token count is rounded up to one of these. Widths above
# 256 issue two wgmmas per slab, 256 + the rest, on one decoded A; beside them, a 192 width
# made ptxas serialize the wgmmas (C7512) or spill (every width is its own mainloop). The tall
# tile's 80 serves experts of ~64 routed rows, whose tiles of 65-80 tokens ran at 96: 2.3-3.9%
# faster there in two same-run A/Bs (e999638), and its 48 those of ~32, whose tiles of 33-48
# ran at 64: 1.7-4.8% faster there in two (fc08658). FC2 leaves the 48 out (FC1_ONLY_WIDTHS):
# with it FC2's tall consumers spilled 8 bytes and the points of 64-128 routed rows per expert
# ran 0.4-2.2% slower in three (6dbfc3c); without the spill (pair indices staged by cp.async,
# e453874) FC2's 48 was level, -1.6% to +1.2% (BENCHMARKS.md)
WIDTHS = {128: (128, 96, 80, 64, 48, 32), 288: (288, 256, 128, 64, 32)}
FC1_ONLY_WIDTHS = (48,)
MAX_STAGES = 4  # (2 stages measured 29-32% slower at T=8192: BENCHMARKS.md, 8f0f6f9)
# B (tokens) in shared memory and in the tile-blocked buffers: per K-tile two 64-column halves
# (HALF_BYTES x tokens apart), each 8 tokens x 64 columns = 1024 bytes per 8-token group: FC1's
# token rows in the 128-byte swizzle (moe_gated.row_scatter), FC2's intermediate as K-major
# core matrices (8 per group, 128 bytes each). A tile's first n tokens are the first n x 128
# bytes of each half, so a partly filled tile copies only its tokens, rounded up to a whole
# 8-token group (the swizzle's unit). The MMA reads as wide as its width; the columns past the
# copied groups hold an earlier use's bytes, and no result of those columns is stored.
HALF_BYTES = 64 * 2  # bytes per token in a half
GROUP_BYTES = 8 * HALF_BYTES
WARPGROUPS = 2  # consumer warpgroups (warps 0-7)
CONSUMER_WARPS = 4 * WARPGROUPS
PRODUCER_WARP = CONSUMER_WARPS  # warp 8 fetches work items and issues the bulk copies
# A third warpgroup holds the producer warp: setmaxnreg works per warpgroup, so with a whole
# warpgroup the producer side gives its registers to the consumers. It moves them inside the
# CTA's own allocation, made at launch (threads x the entry count, the most each of 384
# threads can have: 168): the consumers take only what the producer's warpgroup gives up, and
# an increase past that pool waits forever (SASS: USETMAXREG.TRY_ALLOC.CTAPOOL). A build with
# 4 consumer warpgroups at 112 registers each hung that way (pool 640 x 96: benchmarks/HISTORY.md).
THREADS = 32 * (CONSUMER_WARPS + 4)
PRODUCER_REGS = 40
ENTRY_REGS = 65536 // THREADS // 8 * 8  # 168 (a multiple of 8)
CONSUMER_REGS = (THREADS * ENTRY_REGS - 128 * PRODUCER_REGS) // (32 * CONSUMER_WARPS) // 8 * 8
assert CONSUMER_REGS == 232
STG_TOKENS = 32  # FC1 epilogue: tokens per staged chunk (512 bytes per warp)
# FC2 epilogue: tokens per block of y stores, per tile size (a block past the tile's pairs is
# skipped); 32 in the wide tile made ptxas spill 4 bytes (NVFP4), 48 does not
Y_STORE_TOKENS = {128: 32, 288: 48}
ITEM_SLOTS = 8  # work-item ring from the producer to the consumers (it leads by <= stages items)
# a ring slot: (item, expert, first pair, end pair; token tile, row tile, 0, 0), the tile
# facts the producer has loaded or computed anyway, so a consumer starts an item without a
# global round trip or a division of its own (item // row_tiles by a run-time divisor was
# ~30 SASS per item in each consumer warp)
ITEM_BYTES = 32


def _align(nbytes: int) -> int:
    """Shared-memory offsets of B are 1024-byte aligned (the 128-byte swizzle's period)."""
    return -(-nbytes // 1024) * 1024


def _store_fragments(acc, res):
    """acc[g, j // 4, j % 4] = res[g][j]: a plain trace-time loop (unrolled like
    range_constexpr, without its warning about 128-iteration static loops)."""
    for g, vals in enumerate(res):
        for j, v in enumerate(vals):
            acc[g, j // 4, j % 4] = v


def y_block(geometry: str) -> int:
    """Columns per block of FC2's paired y order (moe_common.cute.topk_reduce): a warp's 16-row
    groups, which start at a multiple of it."""
    return 16 * GEOMETRIES[geometry][1]


def row_tile(geometry: str) -> int:
    """Weight rows per work item."""
    return CONSUMER_WARPS * GEOMETRIES[geometry][1] * 16


GatedOperands = jit.grouped_gemm_operands("GatedOperands", """The runtime operands of one GEMM
launch (FC1 or FC2), in kernel-parameter order: the runner builds them per launch
(jit.operands), GatedGemm.__call__ and .kernel take them whole, and the compile cache compiles
with jit.example(GatedOperands).""", [
    # (first jit.GROUPED_GEMM_FIELDS: the GEMM's packed weights and the routing's tiles)
    # B, tile-blocked (FC1: row_scatter's token rows; FC2: FC1's intermediate), its K-tiles,
    # and the GEMM's 16-row weight groups per expert
    ("b_blocked", Int64), ("k_tiles", Int32), ("row_groups", Int32),
    # the output: FC1 the tile-blocked intermediate (stride in K-tiles, Ip rows), FC2 y [P, H]
    # bf16 (stride H, H rows)
    ("out", Int64), ("out_stride", Int32), ("out_rows", Int32),
    # the activation's run-time parameters (FC1; moe_common.types.Activation)
    ("act_alpha", Float32), ("act_beta", Float32), ("act_limit", Float32),
    # the work queue's two counters (zeroed once, left at zero by every launch) and the grid:
    # persistent CTAs, at most one per SM
    ("queue", Int64), ("grid", Int32),
    # GatedConfig.overlap: FC1's items completed per token tile (zeroed once; FC1 counts, FC2
    # waits for each tile's count to reach tile_items, FC1's row tiles, and its last CTA zeroes
    # them again)
    ("tile_done", Int64), ("tile_items", Int32),
])


@dataclass(frozen=True)
class GatedConfig:
    phase: str  # "fc1" | "fc2"
    weight_format: str  # "nvfp4" | "mxfp4"
    activation: str = "silu"  # fc1: limits.ACTIVATIONS (swiglu alpha/beta/limit at run time)
    geometry: str = "wide"  # see GEOMETRIES
    # FC2 beside FC1's last items (w4a16, where FC2 follows FC1 directly): FC1 lets FC2 launch
    # at its start and counts each token tile's completed items; FC2 starts without waiting for
    # FC1, takes the SMs FC1's CTAs leave, and waits per tile for FC1's count (section
    # "Overlap" in the module docstring)
    overlap: bool = False


class GatedGemm:
    def __init__(self, cfg: GatedConfig):
        assert cfg.phase in ("fc1", "fc2")
        assert cfg.phase == "fc2" or cfg.activation in ACTIVATIONS
        self.cfg = cfg
        self.bn, self.gpw = GEOMETRIES[cfg.geometry]
        self.row_tile = row_tile(cfg.geometry)
        self.widths = tuple(w for w in WIDTHS[self.bn]
                            if cfg.phase == "fc1" or w not in FC1_ONLY_WIDTHS)
        # wgmma slabs left in flight when a K-tile's block returns. wide: 2, measured 1.2-1.7%
        # faster than 1 at T=8192 (BENCHMARKS.md, 6073ca8), except at MMA widths above 256 (1).
        # tall: 1. Where the accumulators and 3 slabs' A registers do not fit (two groups per
        # warp; 288 tokens), 2 makes ptxas serialize every wgmma (C7512, checked by
        # tests/test_gated_cpu.py)
        self.pending = 2 if self.gpw == 1 else 1
        self.overwrite_first = self.gpw == 2  # an item's first slab overwrites acc (_work_item)
        self.ring_bit_ops = self.gpw == 2  # (_stages)
        self.publishes = cfg.overlap and cfg.phase == "fc1"  # FC1 counts tiles (_publisher)
        self.waits_per_tile = cfg.overlap and cfg.phase == "fc2"  # FC2 waits for them
        self.b_bytes = self.bn * TILE_K * 2  # a K-tile's B in the tile-blocked buffers
        # FC1's B is 128B-swizzled (read by a swizzled descriptor from 1024-byte aligned halves)
        self.b_swizzle = cfg.phase == "fc1"
        self.a_group_bytes = fm.group_tile_bytes(cfg.weight_format)
        self.groups = CONSUMER_WARPS * self.gpw  # 16-row weight groups per row tile
        assert self.groups % BLOCK_GROUPS == 0  # whole record blocks (_copy_a)
        self.a_bytes = self.groups * self.a_group_bytes  # a K-tile's A
        ep_bytes = CONSUMER_WARPS * STG_TOKENS * 16 if cfg.phase == "fc1" else 2 * self.bn * 4
        fixed = 8 * ITEM_SLOTS + ITEM_BYTES * ITEM_SLOTS + ep_bytes
        if self.publishes:
            fixed += 2 * 8 * ITEM_SLOTS  # item_empty, item_done
        # A stage is a K-tile [B | A] where 3 of them fit (tall: 4 x 50 KiB), else half a
        # K-tile (`split`: wide, 288 tokens: 4 x 46 KiB, [B's first half | A], then [B's second
        # half]); 2 whole-K-tile stages measured 29-32% slower (8f0f6f9). One CTA per SM.
        self.stage_bytes = _align(self.b_bytes + self.a_bytes)
        self.split = 3 * (self.stage_bytes + 16) > SMEM_PER_CTA - fixed
        if self.split:
            self.stage_bytes = _align(self.b_bytes // 2 + self.a_bytes)
        max_stages = 2 * MAX_STAGES if self.split else MAX_STAGES
        self.stages = min(max_stages, (SMEM_PER_CTA - fixed) // (self.stage_bytes + 16))
        # shared memory (one CTA per SM, so the stages take what the rest leaves)
        mem = cute.struct.MemRange
        self.storage = shared_storage("GatedStorage", {
            "stages": cute.struct.Align[mem[cutlass.Uint8, self.stages * self.stage_bytes],
                                        1024],
            "full": mem[cutlass.Int64, self.stages],  # mbarriers: the producer's expect_tx
            "empty": mem[cutlass.Int64, self.stages],  # the consumer warps' releases
            "item_full": mem[cutlass.Int64, ITEM_SLOTS],  # the work-item ring's
            "items": mem[cutlass.Uint8, ITEM_BYTES * ITEM_SLOTS],
            **({  # overlap, FC1: the publisher's release of an item slot, and the consumer
                  # warps' arrivals once an item's epilogue is issued
                "item_empty": mem[cutlass.Int64, ITEM_SLOTS],
                "item_done": mem[cutlass.Int64, ITEM_SLOTS],
            } if self.publishes else {}),
            # FC1: each consumer warp's epilogue staging (STG_TOKENS tokens x 16 bytes); FC2:
            # the tile's pair indices, 4 bytes per token, double-buffered
            "epilogue": mem[cutlass.Uint8, ep_bytes],
            "end": mem[cutlass.Uint8, 0],  # the bytes used (the struct's size pads to 1 KiB)
        })
        off = self.storage.offsets
        self.full_off, self.empty_off = off["full"], off["empty"]
        self.item_bar_off, self.item_off = off["item_full"], off["items"]
        self.item_empty_off = off.get("item_empty")
        self.item_done_off = off.get("item_done")
        self.ep_off = off["epilogue"]
        self.smem_bytes = off["end"]
        assert self.stages >= 3 and self.smem_bytes <= SMEM_PER_CTA, (self.stages, self.smem_bytes)
        assert self.bn % STG_TOKENS == 0 and self.bn <= 512  # FC1's epilogue blocks; wgmma
        assert self.bn % Y_STORE_TOKENS[self.bn] == 0
        assert self.gpw in (1, 2)  # FC2 stores a token's values with one 4- or 8-byte store

    def stage_layout(self, width: int) -> tuple:
        """How the stages hold the K-tiles of an item of MMA width `width`: (K-tiles per stage,
        bytes from one K-tile to the next, A's offset in a K-tile, B's second half's offset).

        A K-tile is [B's first half | B's second half | A], each half the item's first `width`
        tokens (1024-byte aligned for FC1's swizzle). In a split geometry a K-tile of a width
        that does not fit a stage spans two: [first half | A], then [second half]; that is
        K-tiles per stage 0 (and the second half's offset 0: it is its stage's start).
        A narrow item streams the same A bytes per K-tile with a fraction of the MMA, so with
        one K-tile per stage it is bound by the copies' latency (`stages` K-tiles in flight):
        an expert's leftover tile of a few tokens cost ~40% of a full one (BENCHMARKS.md, before
        dbabba6). Its stages therefore hold as many consecutive K-tiles as fit.
        Measured 1.6% faster at DeepSeek-V3 and gpt-oss-120b T=8192 (about half their experts
        had a leftover tile): most of a leftover tile's cost is not the copies' latency."""
        half = _align(width * HALF_BYTES)
        sub = _align(2 * half + self.a_bytes)
        per = self.stage_bytes // sub
        if per == 0:
            assert self.split and half + self.a_bytes <= self.stage_bytes
            return 0, self.stage_bytes, half, 0
        return per, sub, 2 * half, half

    def _stages(self, s_base):
        """The K-tiles' ring (moe_common.cute.ring) in the shared memory at s_base: full, the
        producer's expect_tx; empty, one release per consumer warp. The tall geometry takes a
        K-tile's stage and parity by bit operations (its `stages` is 4): the tall consumer loops
        306 -> 293 SASS per K-tile (FC1 NVFP4), the signed // and % sat between a K-tile's
        count and its barrier wait. With them the wide FC2 spilled 32 bytes (NVFP4), so the
        wide geometry keeps them (`tools/sass_loops.py --package moe-gated`)."""
        return StageRing(self.stages, self.stage_bytes, (s_base, self.full_off),
                         (s_base, self.empty_off), s_base, bit_ops=self.ring_bit_ops)

    def _items(self, s_base):
        """The work items' ring: full, the producer's arrival once it wrote the slot; with
        overlap in FC1, empty, the publisher's release once it has read it."""
        empty = (s_base, self.item_empty_off) if self.publishes else None
        return StageRing(ITEM_SLOTS, ITEM_BYTES, (s_base, self.item_bar_off), empty,
                         (s_base, self.item_off))

    def _done(self, s_base):
        """Overlap, FC1: per item slot, full completes once every consumer warp has passed the
        item's epilogue (one arrival per warp, a mainloop later: _epilogue_done)."""
        return StageRing(ITEM_SLOTS, 0, (s_base, self.item_done_off))

    # ------------------------------------------------------------------ host entry
    @cute.jit
    def __call__(self, ops: GatedOperands, stream):
        self.kernel(ops).launch(
            grid=[ops.grid, 1, 1], block=[THREADS, 1, 1], smem=self.smem_bytes, stream=stream,
            use_pdl=jit.PDL,
            # .minnctapersm 1 pins the kernel's entry register count (168) for ptxas, which the
            # setmaxnreg regions are allocated against (NVIDIA/cutlass#3406). Measured 1.3-1.4%
            # faster at T=8192 (BENCHMARKS.md); the consumers' SASS changes only a little
            # (highest register R218 -> R223 in FC1 NVFP4 silu)
            min_blocks_per_mp=1)

    # ------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, ops):  # a GatedOperands (see jit.operands: why it is not annotated)
        tidx, _, _ = cute.arch.thread_idx()
        if cutlass.const_expr(not self.waits_per_tile):
            ptx.grid_dependency_wait()  # first: see jit.PDL (FC2 with overlap: before it exits)
        if cutlass.const_expr(self.publishes):
            ptx.launch_dependents()  # FC2's CTAs take the SMs FC1's leave (see overlap)
        warp = tidx // 32
        lane = tidx % 32
        smem = cutlass.memory.SmemAllocator()
        sbuf = smem.allocate_array(cutlass.Uint8, self.smem_bytes, byte_alignment=1024)
        s_base = Int32(sbuf.toint())
        if tidx == 0:
            # full: the producer's expect_tx; empty: one release per consumer warp
            self._stages(s_base).init(1, CONSUMER_WARPS)
            if cutlass.const_expr(self.publishes):
                self._items(s_base).init(1, 1)  # the producer's arrival, the publisher's
                self._done(s_base).init(CONSUMER_WARPS)
            else:
                self._items(s_base).init(1)  # the producer's arrival
            ptx.fence_mbarrier_init()
        cute.arch.sync_threads()  # the only CTA-wide barrier

        row_tiles = (ops.row_groups + (self.row_tile // 16 - 1)) // (self.row_tile // 16)
        total = Int32(ptx.ld_u32(ops.num_tiles)) * row_tiles
        if warp >= PRODUCER_WARP:
            cute.arch.setmaxregister_decrease(PRODUCER_REGS)
            if warp == PRODUCER_WARP:
                self._producer(s_base, lane, total, row_tiles, ops)
            if cutlass.const_expr(self.publishes):
                if warp == PRODUCER_WARP + 1:
                    self._publisher(s_base, lane, total, ops)
        else:
            cute.arch.setmaxregister_increase(CONSUMER_REGS)
            self._consumer(s_base, warp, lane, total, ops)
            if cutlass.const_expr(self.waits_per_tile):
                # FC2 exits after FC1 has completed, so the kernels after it still follow FC1
                ptx.grid_dependency_wait()

    # ------------------------------------------------------------------ producer warp
    @cute.jit
    def _producer(self, s_base, lane, total, row_tiles, ops):
        """Takes tickets from the device queue, hands each to the consumers through the item
        ring, and streams the item's K-tiles into the stages as the consumers free them."""
        i = Int32(0)  # items handed out
        g = Int32(0)  # K-tiles issued
        item = Int32(0)
        if lane == 0:
            item = ptx.atom_add_global(ops.queue, 1)
        item = cute.arch.shuffle_sync(item, 0)
        while item < total:
            tile = item // row_tiles
            rt = item % row_tiles
            if cutlass.const_expr(self.waits_per_tile):
                # the tile's intermediate is complete once FC1 has counted all its items (every
                # lane waits: a warp sync here made ptxas spill in the consumers); the acquire
                # also drops the SM's L1, so the tile's facts below come from L2
                ptx.count_wait_acquire_gpu(ops.tile_done + Int64(tile) * 4, ops.tile_items)
                ptx.fence_proxy_async_global()  # before this warp's bulk copies read it
            e = ptx.ld_u32(ops.tile_expert + Int64(tile) * 4)
            p0 = ptx.ld_u32(ops.tile_start + Int64(tile) * 4)
            p1 = ptx.ld_u32(ops.tile_end + Int64(tile) * 4)
            self._post_item(s_base, lane, i, item, e, p0, p1, tile, rt)
            width, per, sub, a_off, half = self._item_layout(p1 - p0)
            b_copy = (p1 - p0 + 7) // 8 * GROUP_BYTES  # each half's first tokens (see HALF_BYTES)
            # the row tile's weight groups (fewer in a partial row tile), in blocks of
            # BLOCK_GROUPS whose records of one K-tile lie side by side (fm.record_index)
            groups_here = ops.row_groups - rt * (self.row_tile // 16)
            if groups_here > self.row_tile // 16:
                groups_here = Int32(self.row_tile // 16)
            # the row tile's first block of records at K-tile 0, counted in blocks
            # (fm.record_index / BLOCK_GROUPS). The same index in records (kt x BLOCK_GROUPS
            # added per K-tile), or formed with a division, made ptxas spill 52 bytes in the wide
            # consumers (FC1 NVFP4), whose PTX had not changed
            first = (Int64(e) * Int64(ops.row_groups >> BLOCK_SHIFT)
                     + Int64(rt * (self.row_tile // (16 * BLOCK_GROUPS)))) * Int64(ops.k_tiles)
            a_src = (ops.records, first, ops.k_tiles, groups_here)
            b_tile = ops.b_blocked + Int64(tile) * Int64(ops.k_tiles) * self.b_bytes
            src = (b_tile, b_copy, half, sub, a_off, a_src)
            if per > 0:
                for kt0 in cutlass.range(0, ops.k_tiles, per, unroll=1):
                    self._produce(s_base, g, kt0, cutlass.min(per, ops.k_tiles - kt0), 0,
                                  src)
                    g = g + 1
            else:  # a K-tile over two stages: [B's first half | A], [B's second half]
                for kt in cutlass.range(ops.k_tiles, unroll=1):
                    for h in cutlass.range_constexpr(2):
                        self._produce(s_base, g, kt, 1, h + 1, src)
                        g = g + 1
            i = i + 1
            if lane == 0:
                item = ptx.atom_add_global(ops.queue, 1)
            item = cute.arch.shuffle_sync(item, 0)
        self._post_item(s_base, lane, i, item, 0, 0, 0, 0, 0)  # past the end: consumers stop
        # queue[0]: next ticket; queue[1]: CTAs finished. The last CTA to finish sets both back
        # to 0, so the next launch (or CUDA-graph replay) starts from a clean queue.
        if lane == 0:
            if ptx.atom_add_global(ops.queue + 4, 1) == ops.grid - 1:
                ptx.st_u32(ops.queue, 0)
                ptx.st_u32(ops.queue + 4, 0)
                if cutlass.const_expr(self.waits_per_tile):
                    # FC1's counts back to 0 for the next launch: every FC2 item has seen its
                    # tile's count complete, so FC1 adds nothing more (a few hundred tiles)
                    for t in cutlass.range(total // row_tiles, unroll=1):
                        ptx.st_u32(ops.tile_done + Int64(t) * 4, Int32(0))

    @cute.jit
    def _produce(self, s_base, g, kt0, n_kt, halves: cutlass.Constexpr, src):
        """Copy K-tiles kt0 .. kt0 + n_kt - 1 into stage g once its previous use is released:
        both halves of B and A (halves 0), or B's first half and A (1), or its second half (2).
        src: the item's (B tile, bytes per B half, the second half's offset, K-tile stride,
        A's offset in a K-tile, A's source: the records, the row tile's first block of
        records at K-tile 0 (in blocks), K-tiles per group, groups in the row tile).

        One elected lane issues every copy from uniform registers (ptx.bulk_copies_g2s_elected,
        ptx.bulk_copy_groups_g2s_elected). A copy per lane (lane 2j: group j's codes, 2j + 1 its
        scales) made ptxas loop over the active lanes, ~9 SASS instructions and a branch per
        copy, 32 copies per K-tile in series: the producer could not keep up with narrow items
        (8-32% of moe-gated's time at 16-64 routed rows per expert, BENCHMARKS.md)."""
        b_tile, b_copy, half, sub, a_off, a_src = src
        hbs = [0, 1] if halves == 0 else [halves - 1]
        ring = self._stages(s_base)
        ring.wait_empty(g)  # the stage's previous use released by every consumer warp
        stage = ring.at(g)
        bar = ring.full_bar(g)
        with_a = halves < 2  # A comes with B's first half
        groups_here = a_src[3]  # (_copy_a copies that many groups)
        tx = len(hbs) * b_copy + (groups_here * self.a_group_bytes if with_a else 0)
        ptx.bulk_copies_g2s_elected(bar, n_kt * tx, [])  # before any copy can complete on it
        for q in cutlass.range(n_kt, unroll=1):
            kt = kt0 + q
            at = stage + q * sub
            ptx.bulk_copies_g2s_elected(
                bar, None, [(at + n * half, b_tile + Int64(kt) * self.b_bytes
                             + hb * (self.b_bytes // 2), b_copy) for n, hb in enumerate(hbs)])
            if cutlass.const_expr(with_a):
                self._copy_a(at + a_off, kt, a_src, bar)

    @cute.jit
    def _copy_a(self, dst, kt, a_src, bar):
        """Copy K-tile kt of the row tile's weight groups to dst: one copy per block of
        BLOCK_GROUPS records (codes then scales, group by group), blocks k_tiles x a block's
        bytes apart. A copy per group was 0.3-3.6% slower at the band's points (b55d70a
        against 8fc9d6c, BENCHMARKS.md). The address is formed here, per
        K-tile: the row tile's base address formed per item instead made ptxas spill 52 bytes
        in the wide consumers (FC1 NVFP4). The weights are read once per call: evict-first in
        L2, so the token blocks and the intermediate stay there for their readers."""
        records, first, k_tiles, groups_here = a_src
        block = BLOCK_GROUPS * self.a_group_bytes
        ptx.bulk_copy_groups_g2s_elected(bar, dst, (records + (first + Int64(kt)) * block,),
                                         k_tiles, (block,), self.groups // BLOCK_GROUPS, block,
                                         groups_here >> BLOCK_SHIFT, evict_first=True)

    @cute.jit
    def _item_layout(self, cnt):
        """The MMA width an item of cnt tokens runs at (see _work_item) and its stage_layout,
        at run time: (width, K-tiles per stage, K-tile stride, A's offset, B's second half's
        offset)."""
        lay = [Int32(v) for v in (self.widths[0],) + self.stage_layout(self.widths[0])]
        for w in cutlass.range_constexpr(1, len(self.widths)):  # descending: the last holding cnt
            narrower = cnt <= self.widths[w]
            lay = [cutlass.select_(narrower, Int32(v), x)
                   for v, x in zip((self.widths[w],) + self.stage_layout(self.widths[w]), lay)]
        return lay[0], lay[1], lay[2], lay[3], lay[4]

    @cute.jit
    def _item_stages(self, per, k_tiles):
        """Stages an item with `per` K-tiles per stage (0: two stages per K-tile) takes."""
        n = 2 * k_tiles
        if per > 0:
            n = (k_tiles + per - 1) // per
        return n

    @cute.jit
    def _post_item(self, s_base, lane, i, item, e, p0, p1, tile, rt):
        """Write item number i, its tile's expert and pair range, its token tile and row tile
        into its ring slot and complete the slot's mbarrier phase. The producer leads by at
        most `stages` items (each has >= 1 K-tile), so a slot is never rewritten before every
        consumer has read it."""
        if lane == 0:
            items = self._items(s_base)
            if cutlass.const_expr(self.publishes):
                items.wait_empty(i)  # the publisher has read the slot's use i - ITEM_SLOTS
            ptx.st_shared_v4(items.at(i), item, e, p0, p1)
            ptx.st_shared_v4(items.at(i) + 16, tile, rt, 0, 0)
            items.arrive_full(i)

    # ------------------------------------------------------------------ consumer warps
    @cute.jit
    def _mainloop(self, n_tok: cutlass.Constexpr, acc, active, g0, s_base, lane, warp_a_off,
                  k_tiles):
        """acc[:, :n_tok / 8] += this warp's weight groups x the first n_tok tokens, over every
        K-tile of the item (stage_layout(n_tok) of them per stage, or each over two stages);
        each stage is released as soon as this warp's wgmmas on it are done. A warp past the
        real rows (not `active`: in a tall row tile, rows being padded to BLOCK_GROUPS groups,
        never in a wide one) runs the same stages without MMAs, in a loop of its own: a test per
        K-tile in one loop cost 3-7 SASS per K-tile (293 -> 286, FC1 NVFP4 silu tall,
        tools/sass_loops.py), where ptxas also rematerialized the lane index."""
        if cutlass.const_expr(self.row_tile == 16 * BLOCK_GROUPS):  # wide: as before
            self._stage_loop(n_tok, acc, active, g0, s_base, lane, warp_a_off, k_tiles)
        elif active:
            self._stage_loop(n_tok, acc, True, g0, s_base, lane, warp_a_off, k_tiles)
        else:
            self._stage_loop(n_tok, acc, False, g0, s_base, lane, warp_a_off, k_tiles)

    @cute.jit
    def _stage_loop(self, n_tok: cutlass.Constexpr, acc, active, g0, s_base, lane, warp_a_off,
                    k_tiles):
        """_mainloop with `active` a run-time value or a trace-time bool."""
        per, sub, a_off, _ = self.stage_layout(n_tok)
        if cutlass.const_expr(per == 0):
            # a K-tile over stages g (B's first half and A) and g + 1 (the second half): at
            # most `pending` slabs are in flight after each half, so the half before is done
            for kt in cutlass.range(k_tiles, unroll=1):
                g = g0 + 2 * kt
                at = self._wait_stage(s_base, g)
                words = self._load_words(at + a_off + warp_a_off, lane)
                if active:
                    self._mma(n_tok, acc, words, at, 0, range(4), Int32(kt > 0))
                if kt > 0:
                    self._release(s_base, lane, g - 1)
                at = self._wait_stage(s_base, g + 1)
                if active:
                    self._mma(n_tok, acc, words, at, 0, range(4, 8))
                self._release(s_base, lane, g)
            ptx.wgmma_wait(0)
            self._release(s_base, lane, g0 + 2 * k_tiles - 1)
        else:
            n_stages = (k_tiles + per - 1) // per
            for j in cutlass.range(n_stages, unroll=1):
                g = g0 + j
                stage = self._wait_stage(s_base, g)
                if active:
                    if cutlass.const_expr(per == 1):
                        self._ktile(n_tok, acc, stage, lane, warp_a_off, Int32(j > 0))
                    else:
                        for q in cutlass.range(cutlass.min(per, k_tiles - j * per), unroll=1):
                            self._ktile(n_tok, acc, stage + q * sub, lane, warp_a_off,
                                        Int32(j * per + q > 0))
                # at most `pending` slabs of stage g's last K-tile are in flight: g - 1 is done
                if j > 0:
                    self._release(s_base, lane, g - 1)
            ptx.wgmma_wait(0)
            self._release(s_base, lane, g0 + n_stages - 1)

    @cute.jit
    def _ktile(self, n_tok: cutlass.Constexpr, acc, at, lane, warp_a_off, accumulate):
        """acc (+)= this warp's groups x the first n_tok tokens of the whole K-tile at `at`."""
        _, _, a_off, half = self.stage_layout(n_tok)
        words = self._load_words(at + a_off + warp_a_off, lane)
        self._mma(n_tok, acc, words, at, half, range(8), accumulate)

    @cute.jit
    def _wait_stage(self, s_base, g):
        """Wait until stage g's bytes have landed; its address."""
        ring = self._stages(s_base)
        ring.wait_full(g)
        return ring.at(g)

    @cute.jit
    def _load_words(self, at, lane):
        """This lane's code and scale words of the warp's groups of a K-tile's A at `at`."""
        return [fm.load_group_words(at + gi * self.a_group_bytes, lane, self.cfg.weight_format)
                for gi in range(self.gpw)]

    @cute.jit
    def _mma(self, n_tok: cutlass.Constexpr, acc, words, b_at, half: cutlass.Constexpr,
             slabs: cutlass.Constexpr, accumulate=None):
        """acc += this warp's decoded groups (words) x B at b_at (second half `half` further
        on, see wgmma_decode_k128) over `slabs`, the wgmmas left in flight (`pending`); with
        accumulate 0 (an item's first K-tile) the first slab overwrites acc instead."""
        accs = [[acc[gi, j // 4, j % 4] for j in range(n_tok // 2)] for gi in range(self.gpw)]
        if cutlass.const_expr(not self.overwrite_first):
            accumulate = None
        res = wgmma_decode_k128(accs, [w[:8] for w in words], [w[8:] for w in words],
                                self.cfg.weight_format, b_at, n_tok,
                                pending=self.pending if n_tok <= 256 else 1, b_half=half,
                                b_swizzle=self.b_swizzle, slabs=slabs, accumulate=accumulate)
        _store_fragments(acc, res)

    @cute.jit
    def _consumer(self, s_base, warp, lane, total, ops):
        i = Int32(0)
        g = Int32(0)  # K-tiles consumed
        item, e, p0, p1, tile, rt = self._next_item(s_base, i)
        while item < total:
            self._work_item(tile, rt, e, p0, p1, i, g, s_base, warp, lane, ops)
            g = g + self._item_stages(self._item_layout(p1 - p0)[1], ops.k_tiles)
            i = i + 1
            item, e, p0, p1, tile, rt = self._next_item(s_base, i)
        if cutlass.const_expr(self.publishes):
            self._epilogue_done(s_base, lane, i - 1)  # the last item's (see _work_item)

    @cute.jit
    def _epilogue_done(self, s_base, lane, i):
        """Overlap, FC1: this warp's epilogue stores of item i (none if i < 0) to the publisher:
        a proxy fence (FC2 reads them by bulk copy), then the warp's arrival. Called between
        item i + 1's mainloop and its epilogue, when those stores have long landed and the fence
        waits for nothing."""
        if i >= 0:
            ptx.fence_proxy_async_global()
            cute.arch.sync_warp()
            if lane == 0:
                self._done(s_base).arrive_full(i)

    # ------------------------------------------------------------------ publisher warp
    @cute.jit
    def _publisher(self, s_base, lane, total, ops):
        """Overlap, FC1 (a warp of the producer's warpgroup, idle otherwise): for each item in
        turn, read its slot, wait until every consumer warp has passed the item's epilogue
        (_epilogue_done), add 1 to its token tile's count with release semantics at GPU scope
        (the fence waits for the epilogue's stores to be visible, on this warp alone) and
        release the slot. FC2 waits for a tile's count to reach FC1's row tiles."""
        i = Int32(0)
        item, _, _, _, tile, _ = self._next_item(s_base, i)
        while item < total:
            if lane == 0:
                self._done(s_base).wait_full(i)
                ptx.count_add_release_gpu(ops.tile_done + Int64(tile) * 4)
                # the slot back to the producer only now: it posts at most ITEM_SLOTS items past
                # the last one counted, so the consumers cannot complete a done phase twice
                # before this warp waits for it
                self._items(s_base).release(i)
            cute.arch.sync_warp()
            i = i + 1
            item, _, _, _, tile, _ = self._next_item(s_base, i)

    @cute.jit
    def _next_item(self, s_base, i):
        """(item, expert, first pair, end pair, token tile, row tile) of the i-th item."""
        items = self._items(s_base)
        items.wait_full(i)
        item, e, p0, p1 = ptx.ld_shared_v4(items.at(i))
        tile, rt, _, _ = ptx.ld_shared_v4(items.at(i) + 16)
        return item, e, p0, p1, tile, rt

    @cute.jit
    def _release(self, s_base, lane, g):
        """This warp is done with K-tile g's stage (its wgmmas on it have completed)."""
        if lane == 0:
            self._stages(s_base).release(g)

    @cute.jit
    def _work_item(self, tile, rt, e, p0, p1, i, g0, s_base, warp, lane, ops):
        cfg = self.cfg
        # warp w owns groups gpw * w .. gpw * w + gpw - 1 of the row tile. Rows are padded to
        # 128, so a wide row tile is always full and in a tall one a whole warpgroup (128 rows)
        # may be past the real rows: it sits out but still waits for and releases every stage,
        # which keeps the barrier phases in step.
        group0 = rt * (self.row_tile // 16) + warp * self.gpw
        active = group0 < ops.row_groups
        warp_a_off = warp * self.gpw * self.a_group_bytes  # from A's offset in a K-tile

        # FC2's token table (pair indices): consumer thread c owns token slots c + 256 u. The
        # index is loaded now and stored after the mainloop, so its latency hides behind the
        # MMAs. The router weights are the reduce's (a weight load here depends on the index:
        # it cost an exposed round trip after the mainloop).
        ctid = warp * 32 + lane
        tok = s_base + self.ep_off + (i % 2) * (self.bn * 4)
        slots = [ctid + 32 * CONSUMER_WARPS * u
                 for u in range(-(-self.bn // (32 * CONSUMER_WARPS)))]
        pair_c = [Int32(0) for _ in slots]
        if cutlass.const_expr(cfg.phase == "fc2"):  # (slots past the tile read its last pair)
            pair_c = [ptx.ld_u32(ops.order + Int64(cutlass.min(p0 + c, p1 - 1)) * 4)
                      for c in slots]

        # the epilogue's global scale and biases, loaded now: they arrive during the mainloop
        # instead of after it, when both warpgroups would wait on them with the tensor cores idle
        gscale, bv = self._epilogue_constants(e, group0, lane, ops.gscale, ops.bias, ops.row_groups)

        # tall: not zeroed, an item's first K-tile overwrites its MMA's columns (_mma's
        # accumulate; the epilogue never stores the rest), 64 register moves per item fewer.
        # wide: zeroed (without, ptxas spills 4 bytes around the 288-wide NVFP4 FC2 mainloop)
        acc = cute.make_rmem_tensor(cute.make_layout((self.gpw, self.bn // 8, 4)), Float32)
        if cutlass.const_expr(not self.overwrite_first):
            acc.fill(0.0)
        # An expert's last tile is usually partly filled (DeepSeek-V3 at T=8192: ~256 +- 16
        # tokens per expert): the MMA runs only as wide as the tile's tokens, rounded up.
        cnt = p1 - p0
        # (the producer copies B's tokens in 8-token groups, see HALF_BYTES)
        for w in cutlass.range_constexpr(len(self.widths)):
            below = self.widths[w + 1] if w + 1 < len(self.widths) else 0
            if cnt > below and cnt <= self.widths[w]:
                self._mainloop(self.widths[w], acc, active, g0, s_base, lane, warp_a_off,
                               ops.k_tiles)

        if cutlass.const_expr(cfg.phase == "fc2"):
            for u, c in enumerate(slots):
                if c < self.bn and p0 + c < p1:
                    ptx.st_shared_u32(tok + c * 4, pair_c[u])
            # every consumer warp has finished item i - 1's epilogue (it ran before this item's
            # mainloop), so the other buffer is free for item i + 1
            ptx.named_barrier(1, 32 * CONSUMER_WARPS)

        if cutlass.const_expr(self.publishes):
            self._epilogue_done(s_base, lane, i - 1)

        # ---- epilogue (overlaps the producer's loads of the next item): global scale, bias,
        # then the activation (FC1).
        if active:
            if cutlass.const_expr(cfg.phase == "fc1"):
                stg = s_base + self.ep_off + warp * (STG_TOKENS * 16)
                self._epilogue_fc1(acc, tile, p0, p1, group0, gscale, bv, stg, lane, ops.out,
                                   ops.out_stride, ops.act_alpha, ops.act_beta, ops.act_limit)
            else:
                self._epilogue_fc2(acc, p0, p1, group0, gscale, bv, tok, lane, ops.out,
                                   ops.out_stride, ops.out_rows)

    @cute.jit
    def _epilogue_constants(self, e, group0, lane, gscale_at, bias, row_groups):
        """Expert e's global scale and the biases of this thread's rows 16 (group0 + gi) + r +
        8 h, as [gi, h] (gi < gpw, h < 2; r = lane // 4): FC1's gate (h = 0) and up (h = 1)
        rows, FC2's output rows. A tall tile's warps past the real rows read group 0's (in
        bounds; they never use them)."""
        g = group0
        if g >= row_groups:
            g = Int32(0)
        brow = bias + (Int64(e) * Int64(row_groups * 16) + Int64(g * 16 + lane // 4)) * 4
        gscale = ptx.ld_nc_f32(gscale_at + Int64(e) * 4)
        return gscale, [ptx.ld_nc_f32(brow + (16 * gi + 8 * h) * 4)
                    for gi in range(self.gpw) for h in range(2)]

    @cute.jit
    def _epilogue_fc1(self, acc, tile, p0, p1, group0, gscale, bv, stg, lane, out, out_stride,
                      act_alpha, act_beta, act_limit):
        """The intermediate's 8-column chunks, each staged through shared memory into FC2's
        tile-blocked B. Gated: group g's rows are [8 gate; 8 up] of columns 8g .. 8g + 7, one
        chunk (g) from both halves of the fragment. relu2: group g's rows are columns 16g ..
        16g + 15, two chunks (2g, 2g + 1), one from each half (rows r and r + 8)."""
        cfg = self.cfg
        for gi in cutlass.range_constexpr(self.gpw):
            g = group0 + gi
            b_lo, b_hi = bv[2 * gi], bv[2 * gi + 1]  # rows r and r + 8
            if cutlass.const_expr(cfg.activation == "relu2"):
                for h in cutlass.range_constexpr(2):
                    b = b_hi if h else b_lo
                    self._stage_chunk(
                        lambda nb, c, h=h, b=b: act.relu2(acc[gi, nb, 2 * h + c] * gscale + b),
                        self._chunk_at(out, tile, out_stride, 2 * g + h, lane), p0, p1, stg, lane)
            else:
                self._stage_chunk(
                    lambda nb, c: act.gated(cfg.activation, acc[gi, nb, c] * gscale + b_lo,
                                            acc[gi, nb, 2 + c] * gscale + b_hi, act_alpha,
                                            act_beta, act_limit),
                    self._chunk_at(out, tile, out_stride, g, lane), p0, p1, stg, lane)

    def _chunk_at(self, out, tile, out_stride, chunk, lane):
        """Where this lane's 16 bytes of intermediate chunk `chunk` (columns 8 chunk ..
        8 chunk + 7) go in FC2's tile-blocked B: chunk c = chunk % 16 of K-tile chunk // 16,
        token n's 16 bytes at (c // 8) * bn * HALF_BYTES + (n // 8) * GROUP_BYTES +
        (c % 8) * 128 + (n % 8) * 16; lane l copies token l of each 32-token block."""
        return out + (Int64(tile) * Int64(out_stride) + Int64(chunk // 16)) * self.b_bytes \
            + Int64((chunk % 16) // 8 * (self.bn * HALF_BYTES) + (chunk % 8) * 128
                    + (lane // 8) * GROUP_BYTES + (lane % 8) * 16)

    @cute.jit
    def _stage_chunk(self, value, dst, p0, p1, stg, lane):
        """value(nb, c): the activation of this thread's column for token 8 nb + 2q + c.
        stmatrix.trans turns the fragment (thread: column r, tokens 2q, 2q + 1) of 32 tokens into
        token rows in shared memory; the warp then copies them out 16 bytes per lane, 128
        contiguous bytes per 8 tokens. Token slots past the tile's pairs (in the last 32-token
        block) get value() of whatever their B columns held, and past the MMA's width of the
        tall tile's unzeroed accumulators (possibly not finite); a column of FC2's MMA depends
        on its own token's B column alone, and FC2 never stores a result from those columns."""
        for m in cutlass.range_constexpr(self.bn // STG_TOKENS):
            if p0 + m * STG_TOKENS < p1:
                regs = []
                for i in cutlass.range_constexpr(STG_TOKENS // 8):
                    nb = (STG_TOKENS // 8) * m + i
                    regs.append(ptx.bf16x2_from_f32(value(nb, 0), value(nb, 1)))
                ptx.stmatrix_x4_trans(stg + lane * 16, regs[0], regs[1], regs[2], regs[3])
                cute.arch.sync_warp()
                v = ptx.ld_shared_v4(stg + lane * 16)
                ptx.st_v4(dst + m * (STG_TOKENS // 8) * GROUP_BYTES, v[0], v[1], v[2], v[3])
                cute.arch.sync_warp()  # the staging buffer is rewritten by the next block

    @cute.jit
    def _epilogue_fc2(self, acc, p0, p1, group0, gscale, bv, tok, lane, out, out_stride, out_rows):
        """y[pair, row] = acc * scale + bias straight from the fragment, with y's rows in
        the paired order of y_block(geometry) (moe_common.cute.topk_reduce): thread (r, q) holds
        rows r and r + 8 of each of its groups for tokens 2q and 2q + 1 of each 8-token block,
        and those sit side by side there, so a lane writes a token's values with one bf16x2
        store: 4 bytes (wide, one group: 4 tokens x 32 contiguous bytes, one sector each, per
        warp instruction) or 8 (tall, two groups: 4 tokens x 64). With fp32 y in row order that
        took two or four 4-byte stores, and the store phase, 16% of FC2 at Qwen3-30B-A3B T=8192
        (no-store build, 9f8f33f), behaved as if paid per cache line an instruction touches:
        FC2 took 520 us there, 470.5 with paired 8-byte stores (BENCHMARKS.md, 0fff0f8,
        a4189a2). A wide warp's stores in the 32-column order would fill half of each sector
        they touch (measured slower with fp32 y)."""
        r = lane // 4
        q = lane % 4
        # the warp's groups are one block (out_rows is a multiple of 32: a block is in or out)
        row0 = group0 * 16
        col = fragment_position(row0, r, 0, 0, self.gpw)  # values (gi, h) at col + 2 gi + h
        # Straight-line code in blocks of Y_STORE_TOKENS tokens, stores predicated: with a branch
        # per token, each token's table load, address and store ran in turn (~17 instructions
        # and a shared-load latency per token); without, the table loads (two tokens' pairs at
        # once) issue ahead of the stores. A block past the tile's pairs is skipped: unguarded,
        # the tall epilogue issued all 128 tokens' ~420 SASS (cuobjdump of the sm_90a build,
        # 1c58373) for items of 16-48 pairs, a quarter of a 6-K-tile mainloop. Slots past the tile's
        # pairs in the last block read stale table entries, never used.
        blk = Y_STORE_TOKENS[self.bn]
        # a token's store address: one wide multiply-add (IMAD.WIDE) from this lane's column,
        # where (pair x stride + col) x 2 + out took three (and LEA, LEA.HI.X): 2 SASS fewer per
        # store, 16 per 32-token block (FC2 NVFP4 tall, cuobjdump of the sm_90a build)
        out_col = out + Int64(col) * 2
        row_bytes = out_stride * 2
        for m in cutlass.range_constexpr(self.bn // blk):
            if p0 + m * blk < p1:
                for nb in cutlass.range_constexpr(m * blk // 8, (m + 1) * blk // 8):
                    pairs = ptx.ld_shared_v2(tok + (nb * 8 + 2 * q) * 4)
                    for c in cutlass.range_constexpr(2):
                        n = nb * 8 + 2 * q + c
                        dst = out_col + Int64(pairs[c]) * Int64(row_bytes)
                        v = [ptx.bf16x2_from_f32(acc[gi, nb, c] * gscale + bv[2 * gi],
                                                 acc[gi, nb, 2 + c] * gscale + bv[2 * gi + 1])
                             for gi in range(self.gpw)]
                        ok = Int32(p0 + n < p1) & Int32(row0 < out_rows)
                        if cutlass.const_expr(self.gpw == 1):
                            ptx.st_u32_if(dst, v[0], ok)
                        else:
                            ptx.st_v2_if(dst, v[0], v[1], ok)
