"""tools/drain_probe.py and tools/tma_row_probe.py on the CPU: the drain probe's patched
moe-gated kernel assembles for sm_90a with its global-timer stamps and nothing else changed in
its loops, and its summary reads stamps as the docstring says; the row probe's kernel issues
tensor-map copies, and its expected stage is the row scatter's swizzled layout."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))
drain_probe = importlib.import_module("drain_probe")

_DRAIN = f"""
import sys
sys.path.insert(0, {str(TOOLS)!r})
import drain_probe
drain_probe.patch(0x7f0000000000)
from moe_gated import compile_cache
compile_cache.compile_config(compile_cache.config("fc1", "nvfp4", "silu", "tall"))
"""

_ROWS = f"""
import sys
sys.path.insert(0, {str(TOOLS)!r})
import tma_row_probe
from cutlass import Int32, Int64
from moe_common.cute import jit
jit.compile_kernel(tma_row_probe.RowProbe(48, 4, 4), Int64(0), Int64(0), Int64(0), Int32(0),
                   Int32(1), Int32(1), jit.example_stream())
"""


def test_drain_stamps_assemble_beside_the_shipped_loops(tmp_path):
    from moe_common.testing import ptxas_report

    report = ptxas_report(_DRAIN, [], "*GatedGemm*.ptx", tmp_path)
    assert "C7512" not in report, report
    assert "0 bytes spill stores, 0 bytes spill loads" in report, report
    ptx = next(tmp_path.rglob("*GatedGemm*.ptx")).read_text()
    assert ptx.count("%globaltimer") == 2  # a consumer warp's start and end
    assert "red.global.min.u64" in ptx and "red.global.max.u64" in ptx
    assert "0x7f0000000000" in ptx or str(0x7f0000000000) in ptx  # the stamps' buffer


def test_drain_summary():
    # 3 CTAs (the fourth slot unused): starts 0, 1, 2 us; ends 100, 90, 70 us
    ns = 1000
    stamps = torch.tensor([[0, 100 * ns], [1 * ns, 90 * ns], [2 * ns, 70 * ns], [0, 0]])
    r = drain_probe.summarize(stamps, n_items=30)
    assert r["ctas"] == 3 and r["span_us"] == pytest.approx(100.0)
    assert r["start_offset_us"] == pytest.approx(1.0)
    assert r["end_idle_us"] == pytest.approx((0 + 10 + 30) / 3)
    assert r["end_idle_max_us"] == pytest.approx(30.0)
    assert r["model_end_idle_frac"] == pytest.approx(3 / 60)


def test_drain_items_count_the_tall_tiles():
    # 4 experts with 0, 1, 128, 129 routed pairs: 0 + 1 + 1 + 2 token tiles of 128; FC1 of 512
    # rows is 2 row tiles of 256, FC2 of 300 rows 2
    ids = torch.cat([torch.full((n,), e) for e, n in enumerate((0, 1, 128, 129))])
    assert drain_probe.items(ids, 4, {"fc1": 512, "fc2": 300}) == {"fc1": 8, "fc2": 8}


def test_row_probe_issues_tensor_copies(tmp_path):
    from moe_common.testing import ptxas_report

    report = ptxas_report(_ROWS, [], "*RowProbe*.ptx", tmp_path)
    assert "C7512" not in report, report
    ptx = next(tmp_path.rglob("*RowProbe*.ptx")).read_text()
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx" in ptx
    assert "fence.proxy.tensormap::generic.acquire.gpu" in ptx


def test_row_probe_expected_stage_is_the_scatter_layout():
    tma_row_probe = importlib.import_module("tma_row_probe")
    x = torch.arange(3 * 200, dtype=torch.float32).view(3, 200).to(torch.bfloat16)
    rows = torch.tensor([2, 0, 2], dtype=torch.int32)
    half = 1024
    got = tma_row_probe.expected(x, rows, 128, half).view(torch.bfloat16).view(2, half // 2)
    for hb in range(2):
        for n, r in enumerate(rows.tolist()):
            for c in range(8):
                at = (n * 128 + (c ^ (n % 8)) * 16) // 2
                col = 128 + 64 * hb + 8 * c
                want = x[r, col:col + 8] if col < 200 else torch.zeros(8, dtype=x.dtype)
                assert torch.equal(got[hb, at:at + 8], want), (hb, n, c)
