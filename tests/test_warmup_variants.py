"""Warm-up makes every T capture-safe (issue 31, item 9), on the CPU, for the three kernels (so
here, with every package installed, not in the dispatcher's own tests).

The kernels cannot run here, so the runners run their host logic against a stand-in for the
device: kernel compiles are recorded instead of done (jit.compile_kernel), launches do nothing,
the device reports 132 SMs and the layer claims sm_90. What is checked is what a runner asks the
compile cache for: after FusedMoE.warmup(), a call at any T <= max_tokens (int32 or int64 ids)
asks for nothing that is not compiled, and a variant that is missing raises
CompileAfterWarmup instead of compiling.
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

import dispatcher
from dispatcher import FusedMoE
from moe_common.cute import jit
from moe_common.testing import random_layer

# (experts, hidden, intermediate, top_k, max_tokens): the first crosses moe-static's FC1 team
# shape (T = 1 against 2+), moe-generic's four tile widths (T = 16, 32, 64) and moe-gated's
# tall -> wide geometry (T = 512); the second crosses the routing's one-CTA -> split path
# (16384 pairs: T = 512).
LAYERS = [(16, 64, 544, 8, 520), (64, 64, 128, 32, 520)]


@pytest.fixture
def stand_in_device(monkeypatch):  # tests/conftest.py reloads the dispatcher around each test
    compiles = []

    def record(kernel, *args):
        compiles.append(kernel)
        return lambda *a: None

    monkeypatch.setattr(jit, "_cache", {})
    monkeypatch.setattr(jit, "compile_kernel", record)
    monkeypatch.setattr(jit, "current_stream", lambda device: None)
    monkeypatch.setattr(jit, "device_properties",
                        lambda device: SimpleNamespace(multi_processor_count=132))
    return compiles


@functools.lru_cache(maxsize=None)
def _weights(experts, hidden, intermediate):
    """One weights object per layer (its packed copy is cached on it, shared by the tests)."""
    return random_layer(experts, hidden, intermediate, device="cpu",
                        generator=torch.Generator().manual_seed(0))


def _layer(experts, hidden, intermediate, top_k, max_tokens, kernel):
    w = _weights(experts, hidden, intermediate)
    layer = FusedMoE(w, max_tokens=max_tokens, top_k=top_k, kernel=kernel)
    layer.capability = (9, 0)  # what the plugins are told; the runners run on the CPU
    return layer


def _ids(layer, t, dtype):
    g = torch.Generator().manual_seed(t)
    e, k = layer.weights.num_local_experts, layer.top_k
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(dtype)
    return torch.full((t, k), 1.0 / k), ids


def _runnable(layer):
    out = []
    for t in range(1, layer.max_tokens + 1):
        try:
            layer.choice(t)
        except ValueError:
            continue  # a forced kernel that declines this T
        out.append(t)
    return out


@pytest.mark.parametrize("kernel", [None, "moe-generic", "moe-gated", "moe-static"])
@pytest.mark.parametrize("dims", LAYERS, ids=["teams-tiles-geometry", "split-routing"])
def test_after_warmup_no_call_compiles(stand_in_device, dims, kernel):
    layer = _layer(*dims, kernel)
    layer.warmup()
    assert stand_in_device, "the warm-up compiled nothing: the stand-in device is not in use"
    warm = len(stand_in_device)
    x = torch.randn(layer.max_tokens, layer.weights.hidden).bfloat16()
    kernels_seen = set()
    for t in _runnable(layer):
        kernels_seen.add(layer.choice(t).kernel)
        for dtype in (torch.int32, torch.int64):
            tw, ids = _ids(layer, t, dtype)
            layer(x[:t], tw, ids)  # raises CompileAfterWarmup on a missing variant
    assert len(stand_in_device) == warm
    assert "reference" not in kernels_seen
    if kernel is None:
        assert {"moe-static", "moe-gated"} <= kernels_seen


def test_the_warmup_finds_variants_the_largest_t_does_not_use(stand_in_device):
    layer = _layer(*LAYERS[0], "moe-generic")
    inputs = layer._warmup_inputs(torch.Generator().manual_seed(0))
    keys = layer.variants(layer.max_tokens, inputs)
    widths = {k[1].bn for k in keys if k[0] == "moe-generic"}
    assert widths == {64}
    found = layer.variant_tokens(inputs)
    every = set().union(*(layer.variants(t, inputs) for t in found))
    from moe_generic.runner import pick_bn

    E, k = layer.weights.num_experts, layer.top_k
    needed = {pick_bn(t * k, E) for t in range(1, layer.max_tokens + 1)}
    assert len(needed) >= 2  # the layer's T range spans both dispatched tile widths
    assert {k[1].bn for k in every if k[0] == "moe-generic"} == needed
    assert not stand_in_device  # probing compiles nothing


def test_a_missing_variant_raises_instead_of_compiling(stand_in_device):
    layer = _layer(*LAYERS[0], "moe-static").warmup()
    jit._cache.clear()  # as if the warm-up had missed every variant
    tw, ids = _ids(layer, 1, torch.int32)
    with pytest.raises(jit.CompileAfterWarmup, match="not compiled"):
        layer(torch.randn(1, layer.weights.hidden).bfloat16(), tw, ids)
    n = len(stand_in_device)
    fresh = _layer(*LAYERS[0], "moe-static")  # a layer not warmed up compiles as it goes
    fresh(torch.randn(1, layer.weights.hidden).bfloat16(), tw, ids)
    assert len(stand_in_device) > n
