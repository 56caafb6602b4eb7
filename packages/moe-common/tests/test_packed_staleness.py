"""The packed-weight cache never serves stale weights (issue 31, item 1).

A copy made with dataclasses.replace, a tensor edited in place (directly or through a view) and
a field reassigned each make pack() repack; an untouched layer keeps its one cached repack.
"""
from __future__ import annotations

import dataclasses

import torch

from moe_common.packed import pack
from moe_common.testing import random_layer


def _layer(seed=0, **kw):
    return random_layer(2, 128, 64, device="cpu", bias=True,
                        generator=torch.Generator().manual_seed(seed), **kw)


def _bias_row(p, h):
    return p.w2_bias[:, :h]


def test_unchanged_weights_keep_one_repack():
    w = _layer()
    assert pack(w) is pack(w)


def test_replaced_copy_packs_its_own_bias():
    w = _layer()
    old = pack(w)
    b = torch.full_like(w.w2_bias, 3.0)
    w2 = dataclasses.replace(w, w2_bias=b)
    assert w2.kernel_cache == {}
    assert torch.equal(_bias_row(pack(w2), w.hidden), b)
    assert pack(w) is old  # the original's repack is untouched and still current


def test_in_place_edit_repacks():
    w = _layer()
    before = pack(w)
    w.w2_bias.add_(1.0)
    after = pack(w)
    assert after is not before
    assert torch.equal(_bias_row(after, w.hidden), w.w2_bias)


def test_in_place_edit_through_a_view_repacks():
    w = _layer()
    codes = pack(w).w2.clone()
    w.w2[0].view(-1)[:64] ^= 0x77  # a view of expert 0 shares w2's version counter
    assert not torch.equal(pack(w).w2, codes)


def test_reassigned_field_repacks():
    w = _layer()
    before = pack(w).fc1_alpha["w4a16"].clone()
    w.w13_scale_2 = w.w13_scale_2 * 2
    assert torch.equal(pack(w).fc1_alpha["w4a16"], before * 2)


def test_input_scales_are_sources_of_the_w4a4_alphas():
    w = _layer(w4a4=True)
    before = pack(w).fc2_alpha["w4a4"].clone()
    w.fc2_input_scale.mul_(4.0)
    assert torch.equal(pack(w).fc2_alpha["w4a4"], before * 4)
