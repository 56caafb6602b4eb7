"""Bench building blocks that run on a CPU: metrics, dequantization, the grouped_mm baseline."""
from __future__ import annotations

import pytest
import torch

from dispatcher import bench
from moe_common.reference import _dequant, reference_moe
from moe_common.types import Activation


def test_compare_metrics():
    a = torch.randn(64, 32)
    m = bench.compare(a.bfloat16(), a)
    assert m["ok"] and m["rel_l2"] < 1e-2 and m["cosine"] > 0.9999 and m["nonfinite"] == 0
    b = a.clone()
    b[0, 0] = float("nan")
    assert not bench.compare(b, a)["ok"]
    assert not bench.compare(-a, a)["ok"]


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_dequantize_bf16_matches_reference_dequant(tiny, fmt):
    p, w, *_ = tiny(weight_format=fmt, experts=5)
    for which in ("w13", "w2"):
        ours = bench.dequantize_bf16(w, which, chunk=2)
        ref = _dequant(w, which, torch.arange(w.num_local_experts))
        assert torch.equal(ours, ref.to(torch.bfloat16))


def _grouped_mm_on_cpu() -> bool:
    try:
        torch._grouped_mm(torch.zeros(4, 16, dtype=torch.bfloat16), torch.zeros(2, 16, 16, dtype=torch.bfloat16),
                          offs=torch.tensor([2, 4], dtype=torch.int32))
        return True
    except Exception:  # noqa: BLE001 - older torch: CUDA only
        return False


@pytest.mark.skipif(not _grouped_mm_on_cpu(), reason="torch._grouped_mm has no CPU path in this torch")
@pytest.mark.parametrize("activation,fmt,bias", [("silu", "nvfp4", False), ("relu2", "nvfp4", False),
                                                  ("swigluoai", "mxfp4", True)])
def test_grouped_mm_baseline_matches_reference(tiny, activation, fmt, bias):
    p, w, x, tw, ids = tiny(activation=activation, weight_format=fmt, bias=bias, tokens=9, experts=6, top_k=3)
    w13, w2 = bench.dequantize_bf16(w, "w13"), bench.dequantize_bf16(w, "w2")
    out = torch.empty_like(x)
    bench.grouped_mm_moe(x, w13, w2, tw, ids, Activation(activation), out=out, w13_bias=w.w13_bias,
                         w2_bias=w.w2_bias)
    m = bench.compare(out, reference_moe(x, w, tw, ids, activation=activation))
    assert m["rel_l2"] < 2e-2 and m["cosine"] > 0.999, m


@pytest.mark.skipif(not _grouped_mm_on_cpu(), reason="torch._grouped_mm has no CPU path in this torch")
def test_grouped_mm_baseline_ignores_routes_to_other_experts(tiny):
    p, w, x, tw, ids = tiny(tokens=5, experts=4, top_k=2)
    w13, w2 = bench.dequantize_bf16(w, "w13"), bench.dequantize_bf16(w, "w2")
    ids2 = ids.clone()
    ids2[:, 1] = 100  # not a local expert
    out = torch.empty_like(x)
    bench.grouped_mm_moe(x, w13, w2, tw, ids2, Activation("silu"), out=out)
    ref = reference_moe(x, w, tw, ids2, activation="silu")  # id 100 contributes nothing there too
    assert bench.compare(out, ref)["rel_l2"] < 2e-2


@pytest.mark.skipif(not _grouped_mm_on_cpu(), reason="torch._grouped_mm has no CPU path in this torch")
def test_bench_preset_logic_on_cpu(clean_env, tmp_path):
    """The whole bench loop (copies, auto + forced + baselines, checks, metrics) with an eager
    timer on the CPU; the real run differs only in device and CUDA-graph timing."""
    from dispatcher.presets import Preset

    p = Preset("tiny", 8, 128, 64, 2, "mxfp4", "swigluoai", bias=True)
    lines = []
    rows = bench.bench_preset(p, [1, 5], kernels=["auto", "reference", "torch-bf16", "torch-dequant"],
                              device="cpu", timer=lambda calls: bench.eager_time_us(calls, repeats=1),
                              log=lines.append, seed=3, rotate=False)
    assert len(rows) == 8
    for r in rows:
        assert "error" not in r, r
        assert r["time_us"] > 0 and r["GBps"] > 0 and r["TFLOPs"] > 0
        assert r["check_ok"], r
        assert 1 <= r["experts_hit"] <= 8 and r["input_copies"] == 2
    assert rows[0]["kernel"] == "auto(reference)"
    assert {r["kernel"] for r in rows} == {"auto(reference)", "reference", "torch-bf16", "torch-dequant"}
    assert all("speedup_vs_bf16" in r for r in rows)
    assert any("torch-dequant" in ln for ln in lines)
    result = {"rows": rows, "gpu": "cpu", "date": "today", "commit": "x"}
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        path = tmp_path / "p.png"
        assert bench.plot(result, str(path))
        assert path.stat().st_size > 1000
