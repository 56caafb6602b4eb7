"""Property tests (hypothesis): every path against the reference over drawn layers and calls
(issue 31).

A draw is a layer (format, activation and its parameters, biases, quant mode, expert-parallel
slice, H, I) and a call (T, top_k, router-weight dtype, id dtype and an id pattern: distinct,
duplicates, -1, out of range on both sides including int64 values past int32, all dropped, one
hot expert).

CPU profile (CI): few examples, no deadline. The reference's gather and dense strategies agree;
fused_moe and a warmed FusedMoE give the reference's bits; ids outside the local experts count
as nothing (the same as -1) and int64 ids give the int32 result; the int32 ids the kernels get
drop exactly what the reference drops; a token with no local route is exactly zero.

GPU profile (marked gpu; MOE_PROPERTY_EXAMPLES examples, default 200): every kernel that offers
the call, against the reference (DESIGN section 5 bar), output poisoned with NaN first. Run it
under compute-sanitizer as docs/RELIABILITY.md says.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dispatcher
from dispatcher import FusedMoE, fused_moe
from dispatcher.bench import compare
from dispatcher.api import int32_ids
from moe_common.reference import reference_moe
from moe_common.types import ACTIVATIONS, WEIGHT_FORMATS, Activation
from moe_common.weights import MoEWeights

PATTERNS = ("distinct", "duplicates", "minus_one", "out_of_range", "all_dropped", "one_hot")
CPU = settings(max_examples=12, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GPU = settings(max_examples=int(os.environ.get("MOE_PROPERTY_EXAMPLES", "200")), deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass
class Case:
    weights: MoEWeights
    activation: Activation
    quant_mode: str
    x: torch.Tensor
    tw: torch.Tensor
    ids: torch.Tensor


@st.composite
def activations(draw):
    name = draw(st.sampled_from(ACTIVATIONS))
    if name != "swigluoai":
        return Activation(name)
    limit = draw(st.sampled_from((None, 0.5, 7.0)))
    return Activation(name, draw(st.sampled_from((1.702, 1.0))), draw(st.sampled_from((1.0, 0.0))),
                      limit)


def _ids(draw, g, tokens, top_k, lo, hi, num_experts, dtype):
    """[T, k] ids of one pattern; local experts are lo..hi-1 of num_experts."""
    pattern = draw(st.sampled_from(PATTERNS))
    local = hi - lo
    if pattern == "one_hot":
        ids = torch.full((tokens, top_k), lo + draw(st.integers(0, local - 1)))
    elif pattern == "all_dropped":
        outside = [v for v in (-1, lo - 1, hi, num_experts + 3) if not lo <= v < hi]
        ids = torch.tensor(outside)[torch.randint(len(outside), (tokens, top_k), generator=g)]
    else:
        ids = torch.randint(0, num_experts, (tokens, top_k), generator=g)
        if pattern == "duplicates":
            ids[:, -1] = ids[:, 0]
        elif pattern == "minus_one":
            ids[torch.rand(tokens, top_k, generator=g) < 0.3] = -1
        elif pattern == "out_of_range":
            wild = torch.tensor([num_experts, 2**31 - 1, -(2**31)]
                                + ([2**32 + lo, -(2**63)] if dtype == torch.int64 else []))
            mask = torch.rand(tokens, top_k, generator=g) < 0.3
            ids[mask] = wild[torch.randint(len(wild), (int(mask.sum()),), generator=g)]
    return ids.to(dtype).contiguous()


@st.composite
def cases(draw, device="cpu", max_tokens=24):
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    fmt = draw(st.sampled_from(WEIGHT_FORMATS))
    act = draw(activations())
    quant_mode = draw(st.sampled_from(("w4a16", "w4a4")))
    local = draw(st.integers(1, 6))
    offset = draw(st.integers(0, 3))
    num_experts = offset + local + draw(st.integers(0, 3))
    hidden = draw(st.sampled_from((32, 64, 96, 160)))
    inter = draw(st.sampled_from((32, 64, 96)))
    n1 = inter if act.name == "relu2" else 2 * inter
    w13 = torch.randn(local, n1, hidden, generator=g) * hidden ** -0.5
    w2 = torch.randn(local, hidden, inter, generator=g) * inter ** -0.5
    kw = {}
    if draw(st.booleans()):
        kw = dict(w13_bias=torch.randn(local, n1, generator=g) * 0.1,
                  w2_bias=torch.randn(local, hidden, generator=g) * 0.1)
    tokens = draw(st.integers(1, max_tokens))
    top_k = draw(st.integers(1, 6))
    x = (torch.randn(tokens, hidden, generator=g) * draw(st.sampled_from((0.5, 2.0, 8.0))))
    if quant_mode == "w4a4" and fmt == "nvfp4":
        kw.update(input_scale=float(x.abs().max()) / 2688, fc2_input_scale=8.0 / 2688)
    w = MoEWeights.quantize(w13, w2, weight_format=fmt, local_expert_offset=offset,
                            num_experts=num_experts, **kw)
    id_dtype = draw(st.sampled_from((torch.int32, torch.int64)))
    ids = _ids(draw, g, tokens, top_k, offset, offset + local, num_experts, id_dtype)
    tw = torch.rand(tokens, top_k, generator=g).to(draw(st.sampled_from((torch.float32, torch.bfloat16))))
    return Case(w.to(device), act, quant_mode, x.bfloat16().to(device), tw.to(device), ids.to(device))


def _ref(c: Case, ids=None, **kw):
    return reference_moe(c.x, c.weights, c.tw, c.ids if ids is None else ids,
                         activation=c.activation, quant_mode=c.quant_mode, **kw)


@CPU
@given(cases())
def test_cpu_paths_agree_with_the_reference(c):
    ref = _ref(c)
    dense = _ref(c, capturable=True)
    torch.testing.assert_close(dense.float(), ref.float(), rtol=8e-3, atol=1e-3)
    local = c.ids.long() - c.weights.local_expert_offset
    inside = (local >= 0) & (local < c.weights.num_local_experts)
    assert (ref[~inside.any(dim=1)] == 0).all()  # a token with no local route is exactly zero
    assert torch.equal(_ref(c, ids=torch.where(inside, c.ids, -1)), ref)  # outside == -1
    assert torch.equal(_ref(c, ids=int32_ids(c.ids, c.weights)), ref)  # what the kernels get
    assert torch.equal(_ref(c, ids=c.ids.long()), ref)
    kw = dict(activation=c.activation, quant_mode=c.quant_mode)
    assert torch.equal(fused_moe(c.x, c.weights, c.tw, c.ids, **kw), ref)
    layer = FusedMoE(c.weights, max_tokens=c.x.shape[0], top_k=c.ids.shape[1], **kw).warmup()
    assert torch.equal(layer(c.x, c.tw, c.ids), ref)


@pytest.mark.gpu
@GPU
@given(cases(device="cuda", max_tokens=600))
def test_every_kernel_agrees_with_the_reference(c):
    kw = dict(activation=c.activation, quant_mode=c.quant_mode)
    ref = _ref(c)
    ex = dispatcher.explain(c.x, c.weights, c.tw, c.ids, **kw)
    for offer in ex.offers:
        if offer.kernel == "reference":
            continue
        out = torch.full_like(c.x, float("nan"))
        fused_moe(c.x, c.weights, c.tw, c.ids, kernel=offer.kernel, out=out, **kw)
        torch.cuda.synchronize()
        m = compare(out, ref)
        assert m["ok"], (offer.kernel, m, ex.shape)
