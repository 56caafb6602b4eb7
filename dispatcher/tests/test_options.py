"""The entry points' keyword options have one home (dispatcher.options.CallOptions): every entry
point shows them in its signature with CallOptions' defaults, passes them on, and rejects a
keyword it does not know."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

import dispatcher
from dispatcher.distributed import FusedMoEEP, explain_ep, fused_moe_ep
from dispatcher.options import CallOptions, takes_options
from moe_common.types import Activation

ENTRY_POINTS = [dispatcher.fused_moe, dispatcher.explain, dispatcher.FusedMoE, dispatcher.fused_moe_op,
                fused_moe_ep, explain_ep, FusedMoEEP]


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_every_entry_point_shows_the_options_with_their_defaults(entry):
    params = inspect.signature(entry).parameters
    assert "options" not in params
    for f in dataclasses.fields(CallOptions):
        p = params[f.name]
        assert p.kind is inspect.Parameter.KEYWORD_ONLY and p.default == f.default, (entry, f.name)


def test_the_swiglu_defaults_are_the_activations():
    o = CallOptions()
    assert o.make_activation() == Activation()
    assert (o.swiglu_alpha, o.swiglu_beta, o.swiglu_limit) == (Activation.alpha, Activation.beta, Activation.limit)


def test_the_wrapper_collects_exactly_the_options():
    @takes_options
    def f(a, *, b=0, options: CallOptions):
        return a, b, options

    a, b, o = f(1, b=2, quant_mode="w4a4", swiglu_limit=None)
    assert (a, b) == (1, 2) and o == CallOptions(quant_mode="w4a4", swiglu_limit=None)
    with pytest.raises(TypeError, match="quant_mod"):
        f(1, quant_mod="w4a4")


def test_a_function_without_options_is_refused():
    with pytest.raises(TypeError, match="keyword-only parameter 'options'"):
        takes_options(lambda a, options=None: a)


def test_bad_option_values_raise_value_error(clean_env, tiny):
    p, w, x, tw, ids = tiny()
    with pytest.raises(ValueError, match="activation: got 'tanh'"):
        dispatcher.fused_moe(x, w, tw, ids, activation="tanh")
    with pytest.raises(ValueError, match="swiglu_limit"):
        dispatcher.FusedMoE(w, 4, p.top_k, activation="swigluoai", swiglu_limit=-1.0)
    with pytest.raises(ValueError, match="quant_mode"):
        dispatcher.explain(x, w, tw, ids, quant_mode="w8a8")
