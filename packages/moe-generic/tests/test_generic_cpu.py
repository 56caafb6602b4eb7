"""moe-generic without a GPU: compilation for sm_90a, the support limits, routing tables and
the fragment repack (what the kernel's loads see), all checked on the CPU."""
from __future__ import annotations

import re

import pytest
import torch

from moe_common.fragments import (
    _fragment_index, gated_row_order, repack_codes, repack_scales, unpack_word_codes,
)
from moe_common.formats import pack_e2m1
from moe_common.cute import jit
from moe_common.testing import check_operands_marshal, make_shape
from moe_common.types import ACTIVATIONS, WEIGHT_FORMATS, Activation
from moe_generic.limits import unsupported_reason


_shape = make_shape


def test_every_dispatchable_config_compiles_for_sm90a():
    from moe_generic.compile_cache import all_configs, compile_config

    configs = all_configs()
    # 2 formats x 5 tile widths x (4 FC1 activations + FC2), + the 256-row tiles, + the 32- and
    # 48-token FC1 tiles of a K tail (their bulk producer zeroes the tail itself:
    # GemmConfig.k_tail), + the 32- and 48-token tiles with FC2 beside FC1 (GemmConfig.overlap:
    # 2 formats x 2 widths x (8 FC1 + FC2))
    assert len(configs) == 112
    for cfg in configs:
        assert compile_config(cfg) is not None, cfg


_PRODUCER_PROBE = """
import dataclasses, sys
from moe_generic.compile_cache import compile_config, config
bn = int(sys.argv[1])
for fmt in ("nvfp4", "mxfp4"):
    for phase, act in (("fc1", "swigluoai"), ("fc2", "none")):
        for pw in (1, 2):
            c = compile_config(dataclasses.replace(config(phase, fmt, act, bn), producer_warps=pw,
                                                   producer_bulk=False))
            open(f"{fmt}-{phase}-{pw}.txt", "w").write(c.__ptx__)
"""


@pytest.mark.parametrize("bn", [8, 16, 32, 64])
def test_producer_warp_configs_hand_stages_over_by_mbarrier(bn, tmp_path):
    """With a copy-only warp (GemmConfig.producer_warps) the K loop has no CTA barrier: one
    bar.sync (after the mbarriers' set-up), the producer commits a cp.async group per K-tile
    and waits for the one stages - 2 back before arriving on its full barrier (then for all at
    the end), the MMA warps wait on them (try_wait.parity). Checked in the PTX of each format
    and phase, with one and two producer warps."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", _PRODUCER_PROBE, str(bn)], env=env, check=True,
                   cwd=tmp_path)
    ptx = {p.name: p.read_text() for p in Path(tmp_path).glob("*-fc*.txt")}
    assert len(ptx) == 8, list(ptx)
    for name, text in ptx.items():
        assert text.count("bar.sync") == 1, name
        stages = 3 if bn == 32 else 4  # compile_cache.config's ring depths
        waits = re.findall(r"cp\.async\.wait_group (\d+);", text)
        assert sorted(set(waits)) == sorted({str(stages - 2), "0"}), (name, waits)
        assert text.count("cp.async.commit_group") == 1, name
        assert "mbarrier.try_wait.parity" in text, name
        assert "cp.async.mbarrier.arrive" not in text, name


_BULK_PROBE = """
from moe_generic.compile_cache import compile_config, config
for fmt in ("nvfp4", "mxfp4"):
    for phase, act, tail in (("fc1", "silu", False), ("fc2", "none", False), ("fc1", "silu", True)):
        cfg = config(phase, fmt, act, 32, k_tail=tail)
        name = f"{fmt}-{phase}-{'tail' if tail else 'whole'}-{'bulk' if cfg.producer_bulk else 'cp'}"
        open(name + ".txt", "w").write(compile_config(cfg).__ptx__)
"""


def test_bulk_producer_copies_by_bulk_copies_only(tmp_path):
    """The 32-token tiles' producer (GemmConfig.producer_bulk): per K-tile one elected lane
    arrives expecting the bytes and starts the copy of the 8 weight groups (one block of
    records, side by side); in FC1 each lane its token row's copy, in FC2 the elected lane the
    tile's rows of the intermediate as one run (grouped_gemm.INTERMEDIATE_ROW: no copy from
    lane-varying addresses, which ptxas serializes over the lanes), all completing on the full
    barrier; no 16-byte cp.async, commit group or wait_group is left. With a K tail it zeroes
    the tail itself (k_tail). FC1 issues the first stages' weight copies before it loads
    `order` for its rows' addresses, so its code has the elected block and the row copy twice
    (those stages, then the loop)."""
    from moe_common.testing import inline_asm_blocks
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", _BULK_PROBE], env=env, check=True, cwd=tmp_path)
    ptx = {p.stem: p.read_text() for p in Path(tmp_path).glob("*-fc*.txt")}
    assert sorted(ptx) == sorted(f"{f}-{ph}" for f in ("nvfp4", "mxfp4")
                                 for ph in ("fc1-whole-bulk", "fc2-whole-bulk", "fc1-tail-bulk"))
    for name, text in ptx.items():
        fc2 = "fc2" in name
        copies = text.count("cp.async.bulk.shared::cluster.global.mbarrier")
        assert copies == (2 if fc2 else 4), (name, copies)
        assert "elect.sync" in text and "mbarrier.arrive.expect_tx" in text, name
        assert "cp.async.cg" not in text and "cp.async.wait_group" not in text, name
        assert text.count("bar.sync") == 1, name
        copying = [b for b in inline_asm_blocks(text)[0] if "cp.async.bulk" in b]
        elected = [b for b in copying if "elect.sync" in b]
        assert len(elected) == (1 if fc2 else 2), name
        assert all(b.count("cp.async.bulk") == (2 if fc2 else 1) for b in elected), name
        # the weight block's copy alone is evict-first in L2 (ptx.BulkCopy), not the token rows
        # nor FC2's run of the intermediate
        assert all(b.count(".L2::cache_hint") == 1 and "L2::evict_first" in b
                   for b in elected), name
        assert not any(".L2::cache_hint" in b for b in copying if b not in elected), name
        if not fc2:  # the first order load (after the tile count's) after the first weight copy
            assert text.index("elect.sync") < [m.start() for m in
                                                re.finditer(r"ld\.global\.u32", text)][1], name
        # a tail: the producer zeroes the last K-tile's columns past K (16-byte shared stores;
        # FC2's one other is its staging of the biases: _stage_operands), then the warp barrier
        # orders those stores before the elected arrival
        tail = "tail" in name
        zeroing = text.count("st.shared.v4.u32") - (1 if fc2 else 0)
        assert (zeroing > 0) == tail and ("bar.warp.sync" in text) == tail, (name, zeroing)


_OVERLAP_PROBE = """
import sys
from moe_generic.compile_cache import compile_config, config
phase, overlap = sys.argv[1], sys.argv[2] == "1"
compile_config(config(phase, "nvfp4", "silu" if phase == "fc1" else "none", 32, overlap=overlap))
"""


@pytest.mark.parametrize("phase,overlap", [("fc1", 1), ("fc2", 1), ("fc1", 0), ("fc2", 0)])
def test_fc2_beside_fc1_synchronizes_per_tile(phase, overlap, tmp_path):
    """GemmConfig.overlap (32-token tiles, NVFP4): FC1 lets FC2 launch at its start and counts
    each tile's CTAs with a gpu-scope release after a named barrier of its MMA warps; FC2 waits
    for nothing at its start, issues its first weight copies, acquires the tile's count before
    it copies the intermediate, and waits for FC1 at its end. Without overlap (w4a4) both wait
    for their predecessor first and nothing else. No spills, and at most 96 registers (4 CTAs
    per SM, as without it)."""
    from moe_common.testing import ptxas_report

    report = ptxas_report(_OVERLAP_PROBE, [phase, overlap], "*GroupedGemm*.ptx", tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report, report
    assert int(re.search(r"Used (\d+) registers", report).group(1)) <= 96, report
    ptx = next(tmp_path.rglob("*GroupedGemm*.ptx")).read_text()
    fc1, fc2 = bool(overlap) and phase == "fc1", bool(overlap) and phase == "fc2"
    assert ptx.count("griddepcontrol.wait") == 1
    assert ("griddepcontrol.launch_dependents" in ptx) == fc1
    assert ("red.release.gpu.global.add" in ptx) == fc1
    assert ptx.count("bar.sync") == (2 if fc1 else 1)  # the set-up's, the MMA warps' (FC1)
    assert ("ld.acquire.gpu.global" in ptx) == fc2 and ("atom.global.add" in ptx) == fc2
    wait = ptx.find("griddepcontrol.wait")
    if fc2:
        acquire = ptx.find("ld.acquire.gpu.global")
        copies = [m.start() for m in re.finditer(r"cp\.async\.bulk\.shared", ptx)]
        weights = [m.start() for m in re.finditer(r"cp\.async\.bulk\.shared[^;]*cache_hint",
                                                  ptx)]
        assert weights[0] < acquire < min(set(copies) - set(weights)) < wait
        assert wait > ptx.rfind("mma.sync")
    else:
        assert 0 < wait < ptx.find("mbarrier.init")


_BOUNDS_PROBE = """
import dataclasses
from moe_generic.compile_cache import compile_config, config
base = config("fc2", "nvfp4", "none", 48)
open("free.txt", "w").write(compile_config(base).__ptx__)
open("bound.txt", "w").write(compile_config(dataclasses.replace(base, min_ctas=4)).__ptx__)
"""


def test_min_ctas_bounds_the_kernel_for_ptxas(tmp_path):
    """GemmConfig.min_ctas compiles the kernel with .maxntid (the block's 160 threads: 4 MMA
    warps and the producer) and .minnctapersm, which ptxas turns into a register cap; without it
    neither directive is emitted (the dispatched configs' PTX is unchanged by the field)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", _BOUNDS_PROBE], env=env, check=True, cwd=tmp_path)
    free = Path(tmp_path, "free.txt").read_text()
    bound = Path(tmp_path, "bound.txt").read_text()
    assert ".minnctapersm" not in free and ".maxntid" not in free
    assert re.search(r"\.maxntid 160, 1, 1", bound) and re.search(r"\.minnctapersm 4\b", bound)


def test_32_token_tiles_leave_room_for_four_ctas_per_sm():
    """The 32-token tiles run at 96 registers or fewer (5 warps x 32 threads x 96 x 4 CTAs <=
    65536), so 4 CTAs per SM if their shared memory allows it too: sm_90 has 228 KiB per SM,
    1 KiB of it reserved per CTA. NVFP4's FC2 leaves 200 bytes per CTA (57144 bytes), which is
    why its epilogue operands are staged in a ring stage and not beside the table
    (grouped_gemm.GroupedGemm._staged_at)."""
    from moe_generic.compile_cache import config
    from moe_generic.grouped_gemm import GroupedGemm

    for phase, act in (("fc1", "silu"), ("fc2", "none")):
        for fmt in WEIGHT_FORMATS:
            smem = GroupedGemm(config(phase, fmt, act, 32)).smem_bytes
            assert 4 * (smem + 1024) <= 228 * 1024, (phase, fmt, smem)


_FC2_EPILOGUE_PROBE = """
from moe_generic.compile_cache import BN_CHOICES, compile_config, config
for bn in BN_CHOICES:
    cfg = config("fc2", "nvfp4", "none", bn)
    open(f"fc2-{bn}-{len(cfg.live_widths)}.txt", "w").write(compile_config(cfg).__ptx__)
"""


def test_fc2_epilogue_loads_before_its_stores(tmp_path):
    """FC2's epilogue loads every column's pair index (and from it the router weight) before
    its first store to y. The pair index is a coherent load, kept in program order with the
    stores, and the weight's load needs it: one per column between the stores made 2 serial
    round trips per column and group (48 per 48-token tile), now 2 in all (none with the
    producer warp, which stages them in shared memory: tests/test_generic_round_trips_sass.py).
    In the PTX: a coherent load (ld.global.u32) follows a store fewer times than there are
    epilogues (one per mainloop body with the producer warp): an epilogue's loads come before
    its stores; ptxas schedules the read-only (.nc) loads itself.
    The stores are y's bf16x2 words (b069cd2: one 4-byte store per token and group), never
    fp32, each predicated on its column holding a pair of the tile (no branch per column:
    the epilogue of the 32-token tile went from 392 to 223 SASS)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", _FC2_EPILOGUE_PROBE], env=env, check=True,
                   cwd=tmp_path)
    ptx = {p.stem: p.read_text() for p in Path(tmp_path).glob("fc2-*.txt")}
    assert len(ptx) == 5, list(ptx)
    for name, text in ptx.items():
        ops = "".join("s" if m.startswith("st") else "l"
                      for m in re.findall(r"\b(ld\.global\.u32|st\.global)", text))
        bodies = int(name.split("-")[2])
        assert ops.count("sl") < bodies and ops.count("s") >= 2, (name, ops)
        assert set(re.findall(r"st\.global[.\w]*", text)) == {"st.global.u32"}, name
        stores = re.findall(r"(@p )?st\.global\.u32", text)
        assert stores and all(stores), (name, stores.count(""))


def test_operands_reach_the_kernel_in_field_order():
    """The runner's GemmOperands arrive as the kernel's parameters, one per field, in order and
    with their values (the launcher's marshalling, checked without a GPU)."""
    from moe_generic.compile_cache import compile_config, config
    from moe_generic.grouped_gemm import GemmOperands

    compiled = compile_config(config("fc2", "nvfp4", "none", 8))
    check_operands_marshal(compiled, GemmOperands, 2, 3, jit.example_stream())


def test_tall_tiles_only_for_long_k_and_dividing_rows():
    from moe_generic.compile_cache import config

    # DeepSeek-V3 FC1: 4096 rows, 56 K-tiles -> 256-row tiles
    assert config("fc1", "nvfp4", "silu", 64, rows=4096, k_tiles=56).cta_rows == 256
    # gpt-oss FC2: 2944 rows do not split into 256-row tiles -> 128
    assert config("fc2", "mxfp4", "none", 64, rows=2944, k_tiles=23).cta_rows == 128
    # short K loop (16 K-tiles) or a narrower tile -> 128-row tiles
    assert config("fc2", "nvfp4", "none", 64, rows=7168, k_tiles=16).cta_rows == 128
    assert config("fc1", "nvfp4", "silu", 32, rows=4096, k_tiles=56).cta_rows == 128


@pytest.mark.parametrize("kw,needle", [
    (dict(device_capability=None), "CUDA device"),
    (dict(device_capability=(10, 0)), "sm_90"),
    (dict(hidden=2880 + 16), "multiple of 32"),
    (dict(intermediate=100), "multiple of 32"),
    (dict(hidden=65536 + 32), "hidden=65568 exceeds"),
    (dict(top_k=33), "top_k=33"),
    (dict(num_local_experts=2048, num_experts=2048), "local experts"),
    (dict(tokens=70000), "tokens=70000"),
])
def test_declines_with_reason(kw, needle):
    reason = unsupported_reason(_shape(**kw), Activation("silu"))
    assert reason is not None and needle in reason


def test_offers_supported_shapes():
    for act in ACTIVATIONS:
        assert unsupported_reason(_shape(hidden=2880, intermediate=704), Activation(act)) is None


def test_plugin_offer_and_decline():
    from moe_generic import plugin

    assert plugin.can_handle(_shape(device_capability=None), Activation()).reason
    offer = plugin.can_handle(_shape(), Activation())
    assert offer.kernel == "moe-generic" and offer.priority == 10


def test_fragment_repack_places_each_code_where_the_mma_reads_it():
    g = torch.Generator().manual_seed(1)
    E, N, K = 2, 32, 256
    codes = torch.randint(0, 16, (E, N, K), generator=g, dtype=torch.uint8)
    blob = repack_codes(pack_e2m1(codes))  # [E, N/16, K/128, 32 lanes, 32 bytes]
    assert blob.shape == (E, 2, 2, 32, 32)
    row, kk = _fragment_index()
    nib = unpack_word_codes(blob.view(E, 2, 2, 32, 8, 4))  # [.., lane, slab, code j]
    for e in range(E):
        for gi in range(2):
            for kt in range(2):
                tile = codes[e, gi * 16:(gi + 1) * 16, kt * 128:(kt + 1) * 128]
                assert torch.equal(nib[e, gi, kt], tile[row, kk])
    # PTX A fragment spot checks: lane 5 (r=1, q=1), slab 0: a0=(1,2) a2=(9,2) a4=(1,10) a7=(9,11)
    assert (row[5, 0, 0], kk[5, 0, 0]) == (1, 2)
    assert (row[5, 0, 2], kk[5, 0, 2]) == (9, 2)
    assert (row[5, 0, 4], kk[5, 0, 4]) == (1, 10)
    assert (row[5, 0, 7], kk[5, 0, 7]) == (9, 11)


def test_repack_pads_with_zero_codes():
    codes = torch.full((1, 20, 96), 7, dtype=torch.uint8)  # rows and K not tile multiples
    blob = repack_codes(pack_e2m1(codes), row_multiple=32)
    assert blob.shape == (1, 2, 1, 32, 32)
    total = unpack_word_codes(blob.view(1, 2, 1, 32, 8, 4)).sum()
    assert int(total) == 7 * 20 * 96  # everything else is code 0


def test_scale_repack_and_gated_order():
    s = torch.arange(2 * 32 * 16, dtype=torch.uint8).view(2, 32, 16)  # NVFP4: K = 256
    r = repack_scales(s, 16)
    assert r.shape == (2, 2, 2, 16, 8)
    assert torch.equal(r[1, 1, 1, 3], s[1, 16 + 3, 8:16])
    order = gated_row_order(64, 128)
    assert order[:16].tolist() == list(range(8)) + list(range(128, 136))


def test_workspace_sizes_never_shrink_with_more_tokens():
    # FusedMoE warms a kernel at its largest T and then freezes the workspace: every buffer a
    # smaller call asks for must fit in what the larger call allocated.
    from moe_generic.runner import max_tiles_bound, pick_bn, tiles_capacity

    for E in (1, 8, 128, 256):
        prev = 0
        for P in range(1, 4096):
            cap = tiles_capacity(P, E)
            for total in (E, 4 * E):  # the whole layer, or this rank's quarter of it
                assert cap >= max_tiles_bound(P, E, pick_bn(P, total))
            assert cap >= prev
            prev = cap


def test_tile_width_rule():
    """32-token tiles (bulk copies) below MID_MIN_ROWS mean routed rows per expert, 48 below
    WIDE_MIN_ROWS, else 64."""
    from moe_generic.runner import MID_MIN_ROWS, WIDE_MIN_ROWS, pick_bn

    # (T x top_k pairs, experts) -> width, the five presets' band points
    assert pick_bn(128 * 8, 256) == 32  # DeepSeek-V3 T=128: 4 rows per expert
    assert pick_bn(512 * 8, 256) == 32  # DeepSeek-V3 T=512: 16 rows
    assert pick_bn(1024 * 8, 256) == 48  # DeepSeek-V3 T=1024: 32 rows
    assert pick_bn(512 * 6, 128) == 32  # nemotron-relu2 T=512: 24 rows
    assert pick_bn(2048 * 8, 256) == 64  # DeepSeek-V3 T=2048: 64 rows
    assert pick_bn(1, 256) == 32 and pick_bn(65536 * 8, 8) == 64
    assert pick_bn(MID_MIN_ROWS * 128 - 1, 128) == 32 and pick_bn(MID_MIN_ROWS * 128, 128) == 48
    assert pick_bn(WIDE_MIN_ROWS * 128 - 1, 128) == 48 and pick_bn(WIDE_MIN_ROWS * 128, 128) == 64
    # an expert-parallel slice passes all experts: the width follows the rows its experts get
    # (DeepSeek-V3 T=1024 on 2 ranks: 32 rows per local expert, not 64)
    assert pick_bn(1024 * 8, 256) == 48 and pick_bn(1024 * 8, 128) == 64
    for pairs in (1, 7, 100, 1000, 5000, 40000):
        for experts in (1, 8, 128, 256, 1024):
            assert pick_bn(pairs, experts) in (32, 48, 64)


def test_tile_width_is_monotone_in_tokens():
    """FusedMoE.warmup() finds the widths a T range needs by their change points, so the width
    must never shrink as T grows."""
    from moe_generic.runner import pick_bn

    for experts in (1, 8, 128, 256, 1024):
        for top_k in (1, 4, 8):
            widths = [pick_bn(t * top_k, experts) for t in range(1, 4096)]
            assert widths == sorted(widths), (experts, top_k)



def test_mainloop_bodies_per_8_tokens():
    from moe_generic.grouped_gemm import GemmConfig

    def cfg(bn, **kw):
        return GemmConfig(phase="fc2", weight_format="nvfp4", bn=bn, **kw)

    assert cfg(8).live_widths == (1,)
    assert cfg(16).live_widths == (1, 2)
    assert cfg(32).live_widths == (1, 2, 3, 4)
    assert cfg(64).live_widths == tuple(range(1, 9))
    # one body per 16 tokens, as before 8-token bodies were measured
    assert cfg(32, width_step=16).live_widths == (2, 4)
    assert cfg(8, width_step=16).live_widths == (1,)


@pytest.mark.parametrize("k_tiles,pairs", [(1, 1), (1, 5), (2, 1), (3, 5)])
def test_w4a4_requantize_reaches_every_block(k_tiles, pairs):
    """The w4a4 requantize works on the intermediate's rows wherever they lie: a copy written
    back into the K-tile blocks, or a view of them where Ip is one K-tile (an overlapping copy
    back raised there, on the GPU: dispatcher/tests/test_properties.py at H = 32)."""
    from moe_generic.grouped_gemm import INTERMEDIATE_ROW
    from moe_generic.runner import requantize_blocks

    inter = torch.randn(k_tiles, pairs, INTERMEDIATE_ROW)
    want = inter.clone()
    want[:, :, :128] *= 2  # the pad columns past each block's 128 stay as they were
    requantize_blocks(inter, lambda rows: rows.mul_(2))
    assert torch.equal(inter, want)
