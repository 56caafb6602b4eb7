"""MXFP4 weights whose scales the packed layout cannot hold get a reason from
unpackable_reason, pack() refuses them and the shape carries the reason (the kernels' declines
are tested in the workspace's tests/test_unpackable_weights.py, where the kernels are installed)."""
from __future__ import annotations

import pytest
import torch

from moe_common.packed import pack, unpackable_reason
from moe_common.testing import unpackable_mxfp4_layer
from moe_common.validation import describe
from moe_common.weights import MoEWeights


def test_pack_refuses_them_with_the_reason_the_shape_carries():
    w = unpackable_mxfp4_layer()
    reason = unpackable_reason(w)
    assert reason is not None and "outside the kernels' exact range" in reason
    with pytest.raises(ValueError, match="outside the kernels' exact range"):
        pack(w)
    assert describe(w, 4, 2, "w4a16", (9, 0), torch.bfloat16).weights_reason == reason


def test_reason_follows_an_edit_of_the_scales():
    w = unpackable_mxfp4_layer()
    assert unpackable_reason(w) is not None
    w.w13_scale.fill_(127)
    w.w2_scale.fill_(127)
    assert unpackable_reason(w) is None


def test_nvfp4_weights_have_no_reason():
    w = MoEWeights.quantize(torch.randn(2, 128, 64), torch.randn(2, 64, 64))
    assert unpackable_reason(w) is None
    assert describe(w, 1, 1, "w4a16", (9, 0), torch.bfloat16).weights_reason is None
