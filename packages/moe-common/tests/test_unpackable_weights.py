"""MXFP4 weights whose scales the packed layout cannot hold are declined by every kernel with
the reason, and the reference runs them (issue 31, item 4): can_handle never offers a call that
pack() would refuse."""
from __future__ import annotations

import importlib

import pytest
import torch

from moe_common.packed import pack, unpackable_reason
from moe_common.types import Activation
from moe_common.validation import describe
from moe_common.weights import MoEWeights

KERNELS = ("moe_generic", "moe_gated", "moe_static")


def _tiny_mxfp4_layer():
    """Weights quantize() itself produces from a layer scaled by 1e-20: scale bytes near 2^-70."""
    g = torch.Generator().manual_seed(0)
    w13 = torch.randn(2, 128, 64, generator=g) * 1e-20
    w2 = torch.randn(2, 64, 64, generator=g) * 1e-20
    return MoEWeights.quantize(w13, w2, weight_format="mxfp4")


@pytest.mark.parametrize("module", KERNELS)
def test_kernels_decline_weights_pack_cannot_hold(module):
    w = _tiny_mxfp4_layer()
    reason = unpackable_reason(w)
    assert reason is not None and "outside the kernels' exact range" in reason
    with pytest.raises(ValueError, match="outside the kernels' exact range"):
        pack(w)
    shape = describe(w, 4, 2, "w4a16", (9, 0), torch.bfloat16)
    plugin = importlib.import_module(f"{module}.plugin")
    answer = plugin.can_handle(shape, Activation("silu"))
    assert answer.reason == reason  # a Decline, with the reason


def test_reason_follows_an_edit_of_the_scales():
    w = _tiny_mxfp4_layer()
    assert unpackable_reason(w) is not None
    w.w13_scale.fill_(127)
    w.w2_scale.fill_(127)
    assert unpackable_reason(w) is None


def test_nvfp4_weights_have_no_reason():
    w = MoEWeights.quantize(torch.randn(2, 128, 64), torch.randn(2, 64, 64))
    assert unpackable_reason(w) is None
    assert describe(w, 1, 1, "w4a16", (9, 0), torch.bfloat16).weights_reason is None
