"""The w4a4 host code the kernels run on the CPU side (issue 31, item 15): each routed pair's
activation rows quantized with its own expert's global scale, and the packed w4a4 alphas.

Every expert gets a different input_scale / fc2_input_scale (a spread of x1..x4), so using
another expert's scale, or a pair's wrong expert, changes the bits checked here.
"""
from __future__ import annotations

import pytest
import torch

from moe_common.formats import get_format
from moe_common.fragments import ALPHA_SHIFT
from moe_common.kernel_package import quantize_rows, w4a4_fc1_rows, w4a4_requantize_intermediate
from moe_common.packed import pack
from moe_common.testing import random_layer

E, H, I, K, T, OFFSET = 4, 64, 64, 2, 6, 3


def _layer(fmt):
    g = torch.Generator().manual_seed(0)
    w = random_layer(E, H, I, weight_format=fmt, w4a4=True, local_expert_offset=OFFSET,
                     num_experts=OFFSET + E + 2, device="cpu", generator=g)
    if fmt == "nvfp4":
        spread = torch.tensor([1.0, 1.7, 2.9, 4.1])
        w.input_scale = w.input_scale * spread
        w.fc2_input_scale = w.fc2_input_scale * spread.flip(0)
    return w


def _ids():
    ids = torch.tensor([[3, 4], [6, 5], [4, 3], [5, 6], [2, 3], [6, 9]], dtype=torch.int32)
    assert ids.shape == (T, K)
    return ids


def _expected_row(v, w, e, scale_name):
    fmt = get_format(w.weight_format)
    gs = None if w.weight_format == "mxfp4" else getattr(w, scale_name)[e].reshape(1)
    return quantize_rows(v[None], fmt, gs)[0]


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fc1_rows_use_each_pairs_expert_input_scale(fmt):
    w = _layer(fmt)
    ids = _ids()
    x = (torch.randn(T, H, generator=torch.Generator().manual_seed(1)) * 3).bfloat16()
    out = w4a4_fc1_rows(x, w, ids, torch.empty(T * K, H, dtype=torch.bfloat16))
    checked = 0
    for t in range(T):
        for j in range(K):
            e = int(ids[t, j]) - OFFSET
            if 0 <= e < E:  # pairs routed elsewhere are never read
                assert torch.equal(out[t * K + j], _expected_row(x[t], w, e, "input_scale")), (t, j)
                checked += 1
    assert checked == 10


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_intermediate_rows_use_their_pairs_expert_fc2_scale(fmt):
    w = _layer(fmt)
    ids = _ids()
    flat = ids.reshape(-1).long() - OFFSET
    local = [p for p in range(T * K) if 0 <= flat[p] < E]
    order = torch.tensor(sorted(local, key=lambda p: (int(flat[p]), p)) + [0] * (T * K - len(local)),
                         dtype=torch.int32)  # sorted pairs, then stale entries past the count
    inter = (torch.randn(T * K, I, generator=torch.Generator().manual_seed(2)) * 4).bfloat16()
    before = inter.clone()
    w4a4_requantize_intermediate(inter, w, ids, order)
    for p in range(len(local)):
        e = int(flat[int(order[p])])
        assert torch.equal(inter[p], _expected_row(before[p], w, e, "fc2_input_scale")), p


def test_packed_w4a4_alphas_are_each_experts_product():
    w = _layer("nvfp4")
    p = pack(w)
    shift = 2.0 ** ALPHA_SHIFT
    assert torch.equal(p.fc1_alpha["w4a4"], w.w13_scale_2 * shift * w.input_scale)
    assert torch.equal(p.fc2_alpha["w4a4"], w.w2_scale_2 * shift * w.fc2_input_scale)
    assert torch.equal(p.fc1_alpha["w4a16"], w.w13_scale_2 * shift)


def test_mxfp4_w4a4_alphas_have_no_activation_scale():
    w = _layer("mxfp4")
    p = pack(w)
    assert torch.equal(p.fc1_alpha["w4a4"], p.fc1_alpha["w4a16"])
    assert torch.equal(p.fc2_alpha["w4a4"], p.fc2_alpha["w4a16"])
