"""Bad values get a ValueError or propagate, never finite garbage (issue 31, items 3, 5, 12).

Item 3: NaN / Inf weights are refused by MoEWeights.quantize (both formats); MXFP4 activation
quantization gives a NaN block for a non-finite block; validate() refuses NaN block scales,
non-positive or non-finite global and activation scales and non-finite biases.
Item 5: swigluoai parameters that silently zero or NaN every output are refused.
Item 12: a 0-d (or one-value) activation scale, as ModelOpt checkpoints store it, is accepted.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from moe_common.formats import MXFP4, NVFP4
from moe_common.testing import random_layer
from moe_common.types import Activation
from moe_common.weights import MoEWeights


def _w(**kw):
    return random_layer(2, 64, 32, device="cpu", generator=torch.Generator().manual_seed(0), **kw)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("which", ["w13", "w2"])
def test_quantize_refuses_non_finite_weights(fmt, bad, which):
    w13, w2 = torch.randn(2, 64, 64), torch.randn(2, 64, 32)
    (w13 if which == "w13" else w2)[1, 3, 5] = bad
    with pytest.raises(ValueError, match=rf"{which}: got 1 non-finite values .* expert 1, first at "
                                         r"\(row, column\) \(3, 5\)"):
        MoEWeights.quantize(w13, w2, weight_format=fmt)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_mxfp4_activation_block_with_nan_or_inf_decodes_to_nan(bad):
    v = torch.randn(2, 64)
    v[0, 40] = bad
    out = MXFP4.fake_quantize(v)
    assert torch.isnan(out[0, 32:64]).all()  # the whole block holding it
    assert torch.isfinite(out[0, :32]).all() and torch.isfinite(out[1]).all()


def test_nvfp4_activation_nan_propagates():
    v = torch.randn(1, 32)
    v[0, 3] = float("nan")
    assert torch.isnan(NVFP4.fake_quantize(v)[0, :16]).any()


def _scales_with(w, name, value):
    t = getattr(w, name).clone()
    t.view(torch.uint8)[1, 0, 0] = value
    return dataclasses.replace(w, **{name: t})


BAD_FIELDS = [
    ("nvfp4", lambda w: _scales_with(w, "w13_scale", 0x7F), r"w13_scale: .*expert 1.*NaN"),
    ("nvfp4", lambda w: _scales_with(w, "w2_scale", 0xFF), r"w2_scale: .*expert 1.*NaN"),
    ("mxfp4", lambda w: _scales_with(w, "w2_scale", 255), r"w2_scale: .*expert 1.*byte 255"),
    ("nvfp4", lambda w: dataclasses.replace(w, w2_scale_2=torch.tensor([1.0, -1.0])),
     r"w2_scale_2: .*expert 1.*positive finite"),
    ("nvfp4", lambda w: dataclasses.replace(w, w13_scale_2=torch.tensor([0.0, 1.0])),
     r"w13_scale_2: .*expert 0.*positive finite"),
    ("nvfp4", lambda w: dataclasses.replace(w, input_scale=torch.tensor([1.0, float("inf")])),
     r"input_scale: .*expert 1"),
    ("nvfp4", lambda w: dataclasses.replace(w, fc2_input_scale=torch.tensor([float("nan"), 1.0])),
     r"fc2_input_scale: .*expert 0"),
    ("mxfp4", lambda w: dataclasses.replace(w, w2_bias=torch.full((2, 64), float("nan"))),
     r"w2_bias: .*finite"),
]


@pytest.mark.parametrize("fmt,make,match", BAD_FIELDS)
def test_validate_refuses_bad_scale_and_bias_values(fmt, make, match):
    w = _w(weight_format=fmt)
    with pytest.raises(ValueError, match=match):
        make(w).validate()


@pytest.mark.parametrize("kw,match", [
    (dict(limit=-1.0), "swiglu_limit: got -1.0"),
    (dict(limit=0.0), "swiglu_limit: got 0.0"),
    (dict(limit=float("nan")), "swiglu_limit: got nan"),
    (dict(limit=float("inf")), "swiglu_limit"),
    (dict(alpha=float("nan")), "swiglu_alpha: got nan"),
    (dict(beta=float("-inf")), "swiglu_beta"),
    (dict(alpha="1.7"), "swiglu_alpha"),
])
def test_swiglu_parameters_are_checked(kw, match):
    with pytest.raises(ValueError, match=match):
        Activation("swigluoai", **kw)


def test_swiglu_limit_none_and_positive_are_accepted():
    assert Activation("swigluoai", limit=None).limit is None
    assert Activation("swigluoai", alpha=1, beta=0, limit=1e-3).limit == 1e-3


@pytest.mark.parametrize("scale", [torch.tensor(0.01), torch.tensor([0.01]), 0.01])
def test_one_value_activation_scales_are_accepted(scale):
    w = MoEWeights.quantize(torch.randn(2, 64, 64), torch.randn(2, 64, 32),
                            input_scale=scale, fc2_input_scale=scale)
    want = torch.full((2,), 0.01)
    assert torch.equal(w.input_scale, want) and torch.equal(w.fc2_input_scale, want)


def test_integer_scale_tensor_is_refused():
    with pytest.raises(ValueError, match="input_scale: got shape"):
        MoEWeights.quantize(torch.randn(2, 64, 64), torch.randn(2, 64, 32),
                            input_scale=torch.tensor([1, 2]))
