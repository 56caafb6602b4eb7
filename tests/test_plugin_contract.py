"""Every installed kernel plugin keeps the contract (CPU; pure host logic, no kernel runs).

For a grid of shapes on a CPU and on a (pretended) sm_90 device, each plugin's answer is an
Offer (callable runner, int priority, name) or a Decline with a one-line reason, never an
exception; on a CPU every real kernel declines, so the reference runs.
"""
from __future__ import annotations

import itertools

import pytest

import dispatcher
from moe_common.types import Activation, MoEShape


def shapes(cap):
    for tokens, (fmt, act, bias), mode in itertools.product(
        (1, 8, 512, 8192),
        (("nvfp4", "silu", False), ("nvfp4", "relu2", False), ("nvfp4", "gelu_tanh", False),
         ("mxfp4", "swigluoai", True)),
        ("w4a16", "w4a4"),
    ):
        yield MoEShape(tokens=tokens, hidden=2048, intermediate=768, num_experts=128, num_local_experts=128,
                       local_expert_offset=0, top_k=8, weight_format=fmt, quant_mode=mode, has_bias=bias,
                       device_capability=cap), Activation(act)


@pytest.mark.parametrize("cap", [None, (9, 0), (8, 0)], ids=["cpu", "sm90", "sm80"])
def test_answers_are_well_formed(cap):
    for shape, act in shapes(cap):
        ex = dispatcher.explain(shape, activation=act)
        assert ex.choice is not None
        for a in ex.answers:
            assert a.status in ("offer", "decline"), f"{a.kernel}: {a.reason}"
            if a.offered:
                assert isinstance(a.priority, int) and callable(a.offer.run) and a.kernel
            else:
                assert a.reason and "\n" not in a.reason, f"{a.kernel} declined without a one-line reason"
        if cap != (9, 0):
            assert ex.choice.kernel == "reference", f"{ex.choice.kernel} offered without sm_90: {shape}"


def test_reference_always_offers_lowest():
    for shape, act in shapes((9, 0)):
        ex = dispatcher.explain(shape, activation=act)
        ref = ex.answer("reference")
        assert ref.offered
        assert all(o.priority > ref.priority for o in ex.offers if o.kernel != "reference")


@pytest.mark.parametrize("kernel", ["moe-generic", "moe-gated", "moe-static"])
def test_each_kernel_package_is_discovered_through_its_entry_point(kernel):
    m = dispatcher.get_manager()
    assert kernel in m.names, [str(f) for f in m.failures]
