"""moe-gated without a GPU: every configuration compiles for sm_90a; limits and bids."""
from __future__ import annotations

import re

import pytest

from moe_common.cute import jit
from moe_common.testing import check_operands_marshal, make_shape, ptxas_report
from moe_common.types import PRIORITY_GATED, PRIORITY_GENERIC, Activation
from moe_gated.limits import CUTOVER_ROWS_PER_EXPERT, priority, unsupported_reason


def test_every_dispatchable_config_compiles_for_sm90a():
    from moe_gated.compile_cache import all_configs, compile_config, row_scatter
    from moe_gated.kernel import GEOMETRIES

    for bn, _ in GEOMETRIES.values():
        assert row_scatter(bn) is not None
    configs = all_configs()
    # with and without FC2 beside FC1 x 2 geometries x 2 formats x (4 FC1 activations + FC2)
    assert len(configs) == 40
    for cfg in configs:
        assert compile_config(cfg) is not None, cfg


def test_operands_reach_the_kernel_in_field_order():
    """The runner's GatedOperands arrive as the kernel's parameters, one per field, in order
    and with their values (the launcher's marshalling, checked without a GPU)."""
    from moe_gated.compile_cache import compile_config, config
    from moe_gated.kernel import GatedOperands

    compiled = compile_config(config("fc2", "nvfp4", "none", "tall"))
    check_operands_marshal(compiled, GatedOperands, jit.example_stream())


_PTX_PROBE = """
import sys
from moe_gated.compile_cache import all_configs, compile_config
for i in map(int, sys.argv[1:]):
    compile_config(all_configs()[i])
"""


# wide, tall: FC1 NVFP4 silu, FC1 NVFP4 relu2, FC2 MXFP4 (all_configs' order)
@pytest.mark.parametrize("index", [0, 3, 9, 10, 13, 19])
def test_wgmma_runs_asynchronously(index, tmp_path):
    """ptxas serializes every wgmma (a wait for completion after each, C7512) when the consumer
    warps' live registers do not fit; with pending=2 slabs in flight that happened and the
    tensor cores idled during each slab's decode. Assemble the kernel and check it does not,
    that nothing spills (the producer's copies unrolled in the kernel once made ptxas spill in
    the wide geometry's consumers, T=8192 1-3% slower: benchmarks/HISTORY.md, 2026-12-03),
    that the producer issues its copies from one elected lane, and that FC2 writes y as bf16."""
    report = ptxas_report(_PTX_PROBE, [index], "*GatedGemm*.ptx", tmp_path)
    assert "C7512" not in report, report
    assert "0 bytes spill stores, 0 bytes spill loads" in report, report
    ptx = next(tmp_path.rglob("*GatedGemm*.ptx")).read_text()
    _check_register_pool(ptx, report)
    _check_elected_copies(ptx)
    if index == 0:
        _check_second_wgmma(ptx)
    _check_first_slab_overwrites(ptx, tall=index >= 10)
    if index in (9, 19):
        _check_bf16_y_stores(ptx)


@pytest.mark.parametrize("index", [10, 14, 30, 34])  # tall FC1 NVFP4 silu, FC2 NVFP4; overlap, not
def test_fc2_beside_fc1_synchronizes_per_tile(index, tmp_path):
    """GatedConfig.overlap: FC1 lets FC2 launch at its start and counts each tile's items with
    gpu-scope releases from its publisher warp; FC2 waits for nothing at its start, acquires a
    tile's count before copying its intermediate, and waits for FC1 after its last wgmma. Without
    overlap (w4a4) both kernels wait for their predecessor first and nothing else. No spills."""
    from moe_gated.compile_cache import all_configs

    cfg = all_configs()[index]
    report = ptxas_report(_PTX_PROBE, [index], "*GatedGemm*.ptx", tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report, report
    ptx = next(tmp_path.rglob("*GatedGemm*.ptx")).read_text()
    wait = ptx.find("griddepcontrol.wait")
    first_barrier = ptx.find("mbarrier.init")
    assert ptx.count("griddepcontrol.wait") == 1
    assert ("griddepcontrol.launch_dependents" in ptx) == (cfg.overlap and cfg.phase == "fc1")
    assert ("red.release.gpu.global.add" in ptx) == (cfg.overlap and cfg.phase == "fc1")
    assert ("ld.acquire.gpu.global" in ptx) == (cfg.overlap and cfg.phase == "fc2")
    if cfg.overlap and cfg.phase == "fc2":
        assert wait > ptx.rfind("wgmma.mma_async")
    else:
        assert 0 < wait < first_barrier


def _check_bf16_y_stores(ptx: str):
    """FC2's y rows are bf16 (b069cd2): its global stores are bf16x2 words, 4 bytes per token
    and group (wide) or 8 (tall, st.global.v2.u32), never fp32."""
    assert "cvt.rn.bf16x2.f32" in ptx
    assert set(re.findall(r"st\.global[.\w]*", ptx)) <= {"st.global.u32", "st.global.v2.u32"}


def _check_register_pool(ptx: str, report: str):
    """setmaxnreg moves registers inside the CTA's launch allocation (threads x the count
    ptxas reports): the producer warpgroup's decrease must free at least what the consumer
    warps' increase takes, else the increase waits forever (kernel.py, PRODUCER_REGS)."""
    from moe_gated.kernel import CONSUMER_WARPS, THREADS

    entry = int(re.search(r"Used (\d+) registers", report).group(1))
    dec = [int(n) for n in re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+);", ptx)]
    inc = [int(n) for n in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+);", ptx)]
    assert len(dec) == 1 and len(inc) == 1, (dec, inc)
    consumers = 32 * CONSUMER_WARPS
    assert (THREADS - consumers) * dec[0] + consumers * inc[0] <= THREADS * entry, \
        (entry, dec, inc)


def _check_elected_copies(ptx: str):
    """Every bulk copy sits in an inline-asm block that elects its lane (elect.sync): a copy
    from lane-varying operands makes ptxas loop over the active lanes, one copy at a time
    (32 per K-tile, the producer too slow for narrow items: 8-32% of moe-gated's time at 16-64
    routed rows per expert, BENCHMARKS.md)."""
    from moe_common.testing import inline_asm_blocks

    blocks, outside = inline_asm_blocks(ptx)
    assert "cp.async.bulk" not in outside
    copies = [asm for asm in blocks if "cp.async.bulk" in asm]
    for asm in copies:
        assert "elect.sync" in asm, asm
    assert len(copies) >= 2, len(copies)  # B's halves and the weight groups
    # the weight groups' copies (the loop over groups) are evict-first in L2, the token blocks'
    # are not (ptx.BulkCopy: the weights are read once, the blocks were just written for FC1)
    for asm in copies:
        hinted = ".L2::cache_hint" in asm
        assert hinted == ("LOOP:" in asm), asm
        assert hinted == ("L2::evict_first" in asm), asm


def _check_first_slab_overwrites(ptx: str, tall: bool):
    """The tall tile does not zero its accumulators per item (1c058ce): in each mainloop
    (one per MMA width) the K-tile's first slab takes wgmma's scale-d from the run-time
    `accumulate` predicate (pa: 0 on an item's first K-tile), every other slab accumulates (p).
    The wide tile zeroes them and always accumulates."""
    lines = [ln.strip() for ln in ptx.splitlines()]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("setp.ne.b32 pa,")]
    if not tall:
        assert not starts and not any(", pa, 1, 1, 0;" in ln for ln in lines)
        return
    assert starts
    for i in starts:
        first = lines.index("wgmma.commit_group.sync.aligned;", i)
        mmas = [ln for ln in lines[i:first] if ln.startswith("wgmma.mma_async")]
        assert mmas and all(ln.endswith(", pa, 1, 1, 0;") for ln in mmas), mmas
        end = next((j for j in range(first, len(lines)) if lines[j].startswith("setp.ne.b32 p,")),
                   len(lines))
        rest = [ln for ln in lines[first:end] if ln.startswith("wgmma.mma_async")]
        assert rest and all(ln.endswith(", p, 1, 1, 0;") for ln in rest)


def _check_second_wgmma(ptx: str):
    """A 288-token wide item decodes each slab once for both of its wgmmas: every m64n256k16
    of that width is followed by an m64n32k16 on the same A registers, its B 32 token groups
    (32 x 1024 bytes) further on; 8 slabs a K-tile (two asm blocks of 4)."""
    lines = [ln.strip() for ln in ptx.splitlines()]
    pairs = 0
    for i, ln in enumerate(lines):
        if "m64n256k16" in ln and lines[i + 1] == "add.s64 d1, ds, 2048;":
            a_regs = re.search(r"\}, (\{a[^}]*\}), ds,", ln).group(1)
            assert "m64n32k16" in lines[i + 2] and f"{a_regs}, d1," in lines[i + 2], lines[i + 2]
            pairs += 1
    assert pairs == 8, pairs


@pytest.mark.parametrize("kw,act,needle", [
    (dict(device_capability=None), "silu", "CUDA device"),
    (dict(device_capability=(8, 0)), "silu", "sm_90"),
    (dict(hidden=2880 + 16), "silu", "multiple of 32"),
    (dict(intermediate=65536 + 32), "silu", "intermediate=65568 exceeds"),
    (dict(top_k=33), "silu", "top_k=33"),
    (dict(num_local_experts=2048, num_experts=2048), "silu", "local experts"),
    (dict(tokens=70000), "silu", "tokens=70000"),
])
def test_declines_with_reason(kw, act, needle):
    reason = unsupported_reason(make_shape(**kw), Activation(act))
    assert reason is not None and needle in reason


@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "swigluoai", "relu2"])
@pytest.mark.parametrize("fmt,mode", [("nvfp4", "w4a16"), ("mxfp4", "w4a4")])
def test_offers_every_activation_both_formats_and_modes(act, fmt, mode):
    shape = make_shape(hidden=2880, intermediate=704, weight_format=fmt, quant_mode=mode)
    assert unsupported_reason(shape, Activation(act)) is None


@pytest.mark.parametrize("hidden,intermediate", [
    (2048, 768),  # Qwen3-30B-A3B
    (2048, 512),  # Qwen3.5-35B
    (2880, 2880),  # gpt-oss-120b
    (7168, 2048),  # DeepSeek-V3
])
def test_bids_above_generic_only_for_large_batches(hidden, intermediate):
    E, k, rows = 128, 8, CUTOVER_ROWS_PER_EXPERT
    kw = dict(hidden=hidden, intermediate=intermediate, num_experts=E, num_local_experts=E,
              top_k=k)
    assert priority(make_shape(tokens=8, **kw)) < PRIORITY_GENERIC
    t_cut = -(-rows * E // k)
    assert priority(make_shape(tokens=t_cut - 1, **kw)) < PRIORITY_GENERIC
    assert priority(make_shape(tokens=t_cut, **kw)) == PRIORITY_GATED > PRIORITY_GENERIC


def test_plugin_offer_and_decline():
    from moe_gated import plugin

    assert "sm_90" in plugin.can_handle(make_shape(device_capability=(8, 0)),
                                        Activation("relu2")).reason
    offer = plugin.can_handle(make_shape(tokens=8192), Activation("swigluoai"))
    assert offer.kernel == "moe-gated" and offer.priority == PRIORITY_GATED


def test_direct_call_raises_value_error_with_the_reason():
    import torch

    from moe_common.testing import random_layer
    from moe_gated import fused_moe

    w = random_layer(4, 128, 128, gated=False, device="cpu")
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    tw = torch.full((2, 2), 0.5)
    ti = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="moe-gated cannot run"):
        fused_moe(x, w, tw, ti, activation="relu2")  # CPU tensors: no CUDA device


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_shared_memory_fits_one_cta_per_sm(fmt):
    from moe_gated.compile_cache import config
    from moe_gated.kernel import GEOMETRIES, GatedGemm

    for geometry in GEOMETRIES:
        for phase, act in (("fc1", "silu"), ("fc2", "none")):
            k = GatedGemm(config(phase, fmt, act, geometry))
            assert k.smem_bytes <= 227 * 1024, (geometry, phase, fmt, k.smem_bytes)
            assert k.stages >= 3, (geometry, phase, fmt, k.stages)
            assert k.stage_bytes % 128 == 0  # bulk-copy and wgmma descriptor alignment of every stage


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_stage_layouts(fmt):
    """stage_layout: a K-tile of an item of width w is [B's first half | second half | A], each
    half w tokens x 128 bytes (1024-byte aligned for FC1's swizzle), as many K-tiles per stage
    as fit; the wide geometry (288 tokens: 3 whole K-tiles do not fit) splits a K-tile that
    does not fit a stage over two, [first half | A] and [second half]. Every item fits its
    stages, and narrow wide items pack several K-tiles."""
    from moe_gated.compile_cache import config
    from moe_gated.kernel import GEOMETRIES, GatedGemm

    for geometry in GEOMETRIES:
        for phase, act in (("fc1", "silu"), ("fc2", "none")):
            k = GatedGemm(config(phase, fmt, act, geometry))
            assert k.split == (geometry == "wide"), (geometry, k.split)
            for w in k.widths:
                per, step, a_off, half = k.stage_layout(w)
                b_half = w * 128
                assert half % 1024 == 0 and a_off % 1024 == 0 and step % 1024 == 0
                if per == 0:
                    assert k.split and (step, half) == (k.stage_bytes, 0)
                    assert a_off >= b_half and a_off + k.a_bytes <= k.stage_bytes
                    assert b_half <= k.stage_bytes  # the second half's stage
                    continue
                assert half >= b_half and a_off >= 2 * half  # B of w tokens, then A
                assert a_off + k.a_bytes <= step and per * step <= k.stage_bytes
            packed = {w: k.stage_layout(w)[0] for w in k.widths if k.stage_layout(w)[0] != 1}
            want = {288: 0, 256: 0, 32: 2} if geometry == "wide" else {}
            assert packed == want, (geometry, phase, packed)


def test_geometry_choice_and_workspace_sizes():
    """Wide tiles from 256 routed pairs per expert on; and the routing table and tile-blocked
    buffers grow with the pair count whichever geometry a call takes, so a workspace warmed at
    the largest T serves every smaller T (FusedMoE freezes it after warm-up)."""
    from moe_gated.kernel import GEOMETRIES
    from moe_gated.runner import _token_slots, geometry_for, tiles_capacity

    bns = [bn for bn, _ in GEOMETRIES.values()]
    assert bns == [288, 128]

    assert geometry_for(256 * 128, 128) == "wide"
    assert geometry_for(256 * 128 - 1, 128) == "tall"
    for E in (1, 8, 128, 256):
        for P in (1, 100, 4096, 32767, 32768, 65535, 65536):
            for P2 in (P - 1, P // 2, 1):
                if P2 < 1:
                    continue
                assert _token_slots(P2, E) <= _token_slots(P, E)
                assert max(tiles_capacity(P2, E, b) for b in bns) <= \
                    max(tiles_capacity(P, E, b) for b in bns)
            for bn in bns:
                assert _token_slots(P, E) >= tiles_capacity(P, E, bn) * bn


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_w4a4_requantize_of_the_tile_blocked_intermediate_matches_row_quantization(fmt):
    """The tile-blocked intermediate requantizes each (tile, token) row with the tile's expert
    scale, exactly as quantizing the rows themselves would."""
    import torch

    from moe_common.formats import get_format
    from moe_common.kernel_package import quantize_rows
    from moe_common.testing import random_layer
    from moe_gated.runner import blocked_to_rows, rows_to_blocked, w4a4_requantize_blocked

    bn, kt, tiles = 16, 2, 3
    w = random_layer(4, 128, 64, weight_format=fmt, w4a4=True, device="cpu")
    rows = torch.randn(tiles * bn, kt * 128).bfloat16()
    blocked = rows_to_blocked(rows, tiles, bn)
    tile_expert = torch.tensor([2, 0, 3], dtype=torch.int32)
    w4a4_requantize_blocked(blocked, w, tile_expert, bn)
    gs = None
    if fmt == "nvfp4":
        gs = w.fc2_input_scale.float()[tile_expert.long()].repeat_interleave(bn)
    want = quantize_rows(rows, get_format(fmt), gs)
    assert torch.equal(blocked_to_rows(blocked, bn), want)


def test_tile_blocked_layout():
    """Token n, column j of tile t, K-tile kt sits at element (j % 128 // 64) * bn * 64 +
    ((n // 8) * 8 + j % 64 // 8) * 64 + (n % 8) * 8 + j % 8 of block [t, kt] (the layout FC1
    writes and FC2's wgmma descriptor reads: two halves of core matrices), and the two
    conversions are inverse."""
    import torch

    from moe_gated.runner import blocked_to_rows, rows_to_blocked

    bn, tiles, K = 16, 2, 256
    rows = torch.arange(tiles * bn * K, dtype=torch.float32).view(tiles * bn, K)
    blocked = rows_to_blocked(rows, tiles, bn)
    for t, n, j in [(0, 0, 0), (0, 9, 5), (1, 15, 200), (1, 3, 127)]:
        el = (j % 128 // 64) * bn * 64 + ((n // 8) * 8 + j % 64 // 8) * 64 + (n % 8) * 8 + j % 8
        assert blocked[t, j // 128, el] == rows[t * bn + n, j]
    assert torch.equal(blocked_to_rows(blocked, bn), rows)


def test_swizzled_layout():
    """FC1's B (moe_gated.row_scatter): token n, column j of tile t, K-tile kt is element
    ((j % 128) // 64 * bn + n) * 64 + ((j % 64 // 8) ^ (n % 8)) * 8 + j % 8 of block [t, kt],
    which swizzled_to_rows reads back; every 8 consecutive tokens use each chunk slot once."""
    import torch

    from moe_gated.runner import swizzled_to_rows

    bn, tiles, K = 16, 2, 256
    kt = K // 128
    blocked = torch.full((tiles, kt, bn * 128), -1.0)
    rows = torch.arange(tiles * bn * K, dtype=torch.float32).view(tiles * bn, K)
    for t in range(tiles):
        for n in range(bn):
            for j in range(K):
                el = ((j % 128) // 64 * bn + n) * 64 + ((j % 64 // 8) ^ (n % 8)) * 8 + j % 8
                blocked[t, j // 128, el] = rows[t * bn + n, j]
    assert (blocked >= 0).all()  # the formula fills every element once
    assert torch.equal(swizzled_to_rows(blocked, bn), rows)


def test_fc2_stores_y_in_the_order_the_reduce_reads():
    """Each geometry's FC2 writes y in the paired blocks of y_block(geometry): a warp's groups
    (GEOMETRIES' gpw of them, moe_common.cute.topk_reduce.fragment_position) fill one block."""
    from moe_gated.kernel import GEOMETRIES, y_block

    for geometry, (_, gpw) in GEOMETRIES.items():
        assert y_block(geometry) == 16 * gpw
