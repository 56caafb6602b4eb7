"""Issue 31's hazards on the kernels themselves (sm_90; skipped elsewhere by the root conftest).

Each test is the GPU half of a CPU test: stale packed weights (item 1, test_packed_staleness),
threads and streams sharing one FusedMoE (items 2 and 11, test_sharing), int64 ids outside
int32 (item 7), no compile after warm-up at any T (item 9, test_warmup_variants) and the
swigluoai clamp reaching every kernel's epilogue (item 16, test_activation_device).
"""
from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

import dispatcher
from dispatcher import FusedMoE, fused_moe
from dispatcher.bench import compare
from moe_common.reference import reference_moe
from moe_common.testing import random_layer, random_routing

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("clean_env")]
INT64_MIN = -(2**63)


def _layer(experts=16, hidden=512, inter=256, fmt="nvfp4", bias=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return random_layer(experts, hidden, inter, weight_format=fmt, bias=bias, device="cuda",
                        generator=g)


def _inputs(w, tokens, top_k, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, w.hidden, device="cuda", generator=g).bfloat16()
    tw, ids = random_routing(tokens, w.num_experts, top_k, generator=g)
    return x, tw, ids


def _kernels(x, w, tw, ids, **kw):
    ks = [o.kernel for o in dispatcher.explain(x, w, tw, ids, **kw).offers if o.kernel != "reference"]
    assert ks, "no kernel offered on sm_90"
    return ks


def _ok(out, ref, what):
    m = compare(out, ref)
    assert m["ok"], (what, m)


@pytest.mark.parametrize("tokens", [4, 300])
def test_replaced_or_edited_weights_reach_every_kernel(tokens):
    w = _layer(bias=True)
    x, tw, ids = _inputs(w, tokens, 4)
    for k in _kernels(x, w, tw, ids):
        fused_moe(x, w, tw, ids, kernel=k)  # packs and caches w
        w2 = dataclasses.replace(w, w2_bias=w.w2_bias + 1.0)
        _ok(fused_moe(x, w2, tw, ids, kernel=k), reference_moe(x, w2, tw, ids), (k, "replace"))
        w.w13_bias.mul_(-1.0)
        _ok(fused_moe(x, w, tw, ids, kernel=k), reference_moe(x, w, tw, ids), (k, "in place"))


@pytest.mark.parametrize("tokens", [4, 300])
def test_int64_ids_outside_int32_are_dropped(tokens):
    w = _layer(experts=16)
    x, tw, ids = _inputs(w, tokens, 4)
    ids = ids.long()
    ids[0, 0] = 2**32 + 3  # truncated to 32 bits this is expert 3
    ids[1, 1] = INT64_MIN  # truncated: expert 0
    ids[2, 2] = -(2**32) + 5
    ref = reference_moe(x, w, tw, ids)
    for k in _kernels(x, w, tw, ids):
        _ok(fused_moe(x, w, tw, ids, kernel=k), ref, k)
        layer = FusedMoE(w, max_tokens=tokens, top_k=4, kernel=k).warmup()
        _ok(layer(x, tw, ids), ref, (k, "FusedMoE"))


def test_every_t_after_warmup_compiles_nothing_and_captures():
    """Qwen3-30B-A3B's routing shape (E=128, k=8) on a narrower layer: the first call at T=1
    after warmup() compiled 1.4 s before (moe-static's team shape)."""
    w = _layer(experts=128, hidden=512, inter=256)
    layer = FusedMoE(w, max_tokens=64, top_k=8).warmup()
    for t in range(1, 65):
        x, tw, ids = _inputs(w, t, 8, seed=t)
        for dtype in (torch.int32, torch.int64):
            out = layer(x, tw, ids.to(dtype))  # raises CompileAfterWarmup on a compile
        if t in (1, 2, 3, 17, 33, 64):
            _ok(out, reference_moe(x, w, tw, ids), t)
    x, tw, ids = _inputs(w, 1, 8, seed=99)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = layer(x, tw, ids)
    g.replay()
    torch.cuda.synchronize()
    _ok(y, reference_moe(x, w, tw, ids), "graph T=1")


def _expected(layer, cases):
    out = [layer(*c).clone() for c in cases]
    torch.cuda.synchronize()
    return out


def test_two_threads_on_their_own_streams_share_one_layer():
    w = _layer(experts=64)
    layer = FusedMoE(w, max_tokens=64, top_k=8).warmup()
    cases = [_inputs(w, t, 8, seed=t) for t in (1, 7, 33, 64)]
    want = _expected(layer, cases)  # the kernels are bitwise deterministic
    wrong, errors = [], []

    def worker(offset):
        s = torch.cuda.Stream()
        try:
            with torch.cuda.stream(s):
                for i in range(300):
                    j = (i + offset) % len(cases)
                    got = layer(*cases[j]).clone()
                    s.synchronize()
                    if not torch.equal(got, want[j]):
                        wrong.append((offset, i))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(o,)) for o in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors and not wrong, (errors, wrong[:5])


def test_one_thread_alternating_two_streams():
    w = _layer(experts=64)
    layer = FusedMoE(w, max_tokens=512, top_k=8).warmup()
    cases = [_inputs(w, t, 8, seed=t) for t in (2, 300, 512)]  # moe-static, generic, gated
    want = _expected(layer, cases)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    got = []
    for i in range(60):
        with torch.cuda.stream(streams[i % 2]):
            got.append((i % len(cases), layer(*cases[i % len(cases)]).clone()))
    torch.cuda.synchronize()
    assert all(torch.equal(g, want[j]) for j, g in got)


def test_swiglu_clamp_reaches_every_kernel():
    w = _layer(fmt="mxfp4", bias=True)
    for tokens in (4, 300, 2048):
        x, tw, ids = _inputs(w, tokens, 4)
        x = x * 8  # FC1 outputs well past the limit 7
        clamped = reference_moe(x, w, tw, ids, activation="swigluoai")
        free = reference_moe(x, w, tw, ids,
                             activation=dispatcher.make_activation("swigluoai", swiglu_limit=None))
        assert compare(clamped, free)["rel_l2"] > 1e-1  # the clamp matters on this data
        for k in _kernels(x, w, tw, ids, activation="swigluoai"):
            _ok(fused_moe(x, w, tw, ids, activation="swigluoai", kernel=k), clamped, (k, 7.0))
            _ok(fused_moe(x, w, tw, ids, activation="swigluoai", swiglu_limit=None, kernel=k),
                free, (k, None))
