"""Cross-package tests on an sm_90 GPU (skipped elsewhere by the root conftest).

docs/DESIGN.md section 5's bar everywhere: fresh random data, output poisoned with NaN first,
relative L2 <= 1e-2 and cosine >= 0.9999 against the fp32 torch reference, no NaN.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

import dispatcher
from dispatcher import FusedMoE, bench, cli
from dispatcher.presets import Preset, random_inputs, random_weights
from moe_common.reference import reference_moe

pytestmark = pytest.mark.gpu


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def layer(p: Preset, tokens: int, device, seed: int):
    w = random_weights(p, device=device, seed=seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    return (w, *random_inputs(p, tokens, device=device, gen=gen))


@pytest.mark.parametrize("act,fmt,bias", [("silu", "nvfp4", False), ("relu2", "nvfp4", False),
                                          ("swigluoai", "mxfp4", True)])
def test_reference_cuda_matches_cpu(act, fmt, bias):
    p = Preset("t", 8, 256, 128, 2, fmt, act, bias)
    seed = fresh_seed()
    w, x, tw, ids = layer(p, 33, "cpu", seed)
    ref_cpu = reference_moe(x, w, tw, ids, activation=act)
    wc = w.to("cuda")
    ref_gpu = reference_moe(x.cuda(), wc, tw.cuda(), ids.cuda(), activation=act)
    m = bench.compare(ref_gpu.cpu(), ref_cpu, max_rel_l2=1e-3, min_cosine=0.999999)
    assert m["ok"], (seed, m)
    dense = reference_moe(x.cuda(), wc, tw.cuda(), ids.cuda(), activation=act, capturable=True)
    assert bench.compare(dense, ref_gpu, max_rel_l2=1e-3, min_cosine=0.999999)["ok"]


@pytest.mark.parametrize("kernel", ["reference", None], ids=["reference", "auto"])
def test_fused_moe_layer_graph_capture_replays_like_eager(kernel):
    p = Preset("t", 8, 256, 128, 2, "nvfp4", "silu")
    seed = fresh_seed()
    w, x, tw, ids = layer(p, 16, "cuda", seed)
    lay = FusedMoE(w, max_tokens=16, top_k=2, kernel=kernel).warmup([4, 16])
    ran = lay.choice(16).kernel
    assert ran == "reference" if kernel == "reference" else ran != "reference", ran
    eager = lay(x, tw, ids).clone()
    sx, stw, sids = x.clone(), tw.clone(), ids.clone()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        lay(sx, stw, sids)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        y = lay(sx, stw, sids)
    lay.out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    m = bench.compare(y, eager)
    assert m["ok"], (seed, m)
    # New data through the same graph.
    w2_, x2, tw2, ids2 = layer(p, 16, "cuda", seed + 10)
    sx.copy_(x2), stw.copy_(tw2), sids.copy_(ids2)
    g.replay()
    torch.cuda.synchronize()
    assert bench.compare(y, reference_moe(x2, w, tw2, ids2))["ok"]


ACTS = [("silu", "nvfp4", False), ("gelu_tanh", "nvfp4", False), ("relu2", "nvfp4", False),
        ("swigluoai", "mxfp4", True), ("silu", "mxfp4", False)]


@pytest.mark.parametrize("act,fmt,bias", ACTS)
@pytest.mark.parametrize("mode", ["w4a16", "w4a4"])
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_every_offered_kernel_matches_reference(act, fmt, bias, mode, tokens):
    p = Preset("t", 16, 512, 256, 4, fmt, act, bias)
    seed = fresh_seed()
    w, x, tw, ids = layer(p, tokens, "cuda", seed)
    if mode == "w4a4" and fmt == "nvfp4":
        w = w.calibrate(x, ids, activation=act)
    ref = reference_moe(x, w, tw, ids, activation=act, quant_mode=mode)
    ex = dispatcher.explain(x, w, tw, ids, activation=act, quant_mode=mode)
    kernels = [o.kernel for o in ex.offers if o.kernel != "reference"]
    assert kernels, f"no kernel offered on sm_90 (the test would check nothing):\n{ex}"
    assert "moe-generic" in kernels  # it runs every case here
    for offer in ex.offers:
        if offer.kernel == "reference":
            continue
        out = torch.full_like(x, float("nan"))
        dispatcher.fused_moe(x, w, tw, ids, activation=act, quant_mode=mode, kernel=offer.kernel, out=out)
        torch.cuda.synchronize()
        m = bench.compare(out, ref)
        assert m["ok"], (offer.kernel, seed, m)


def test_bench_runs_on_a_tiny_shape(tmp_path, capsys):
    path = tmp_path / "bench.json"
    rc = cli.main(["bench", "--experts", "8", "--hidden", "256", "--intermediate", "128", "--top-k", "2",
                   "--tokens", "1", "16", "--json", str(path), "--plot", str(tmp_path / "b.png")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "copy ceiling" in out
    data = json.loads(path.read_text())
    kernels = {r["kernel"].split("(")[0] for r in data["rows"]}
    assert {"auto", "torch-bf16", "torch-dequant"} <= kernels
    for r in data["rows"]:
        assert "error" not in r, r
        assert r["time_us"] > 0 and r["GBps"] > 0 and r["check_ok"], r
    assert data["copy_ceiling"]["GBps"] > 100
