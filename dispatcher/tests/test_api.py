"""fused_moe, FusedMoE and the torch.library op on the CPU (the reference runs)."""
from __future__ import annotations

import pytest
import torch

import dispatcher
from dispatcher import FusedMoE, fused_moe
from moe_common.reference import reference_moe


@pytest.mark.parametrize("activation,fmt,bias", [("silu", "nvfp4", False), ("relu2", "nvfp4", False),
                                                  ("swigluoai", "mxfp4", True), ("gelu_tanh", "mxfp4", False)])
def test_fused_moe_matches_reference(clean_env, tiny, activation, fmt, bias):
    p, w, x, tw, ids = tiny(activation=activation, weight_format=fmt, bias=bias)
    out = fused_moe(x, w, tw, ids, activation=activation)
    assert out.shape == (x.shape[0], p.hidden) and out.dtype == torch.bfloat16
    assert torch.equal(out, reference_moe(x, w, tw, ids, activation=activation))


def test_fused_moe_writes_into_out(clean_env, tiny):
    p, w, x, tw, ids = tiny()
    out = torch.full((x.shape[0], p.hidden), float("nan"), dtype=torch.bfloat16)
    r = fused_moe(x, w, tw, ids, out=out)
    assert r is out and torch.isfinite(out).all()


def test_swiglu_parameters_reach_the_kernel(clean_env, tiny):
    p, w, x, tw, ids = tiny(activation="swigluoai", weight_format="mxfp4", bias=True)
    x = x * 8
    a = fused_moe(x, w, tw, ids, activation="swigluoai", swiglu_limit=None)
    b = fused_moe(x, w, tw, ids, activation="swigluoai", swiglu_alpha=1.0, swiglu_limit=0.5)
    from moe_common.types import Activation

    assert torch.equal(a, reference_moe(x, w, tw, ids, activation=Activation("swigluoai", 1.702, 1.0, None)))
    assert torch.equal(b, reference_moe(x, w, tw, ids, activation=Activation("swigluoai", 1.0, 1.0, 0.5)))
    assert not torch.equal(a, b)


def test_invalid_inputs_raise_value_error(clean_env, tiny):
    p, w, x, tw, ids = tiny()
    with pytest.raises(ValueError):
        fused_moe(x.float(), w, tw, ids)
    with pytest.raises(ValueError):
        fused_moe(x, w, tw, ids, activation="relu2")  # gated weights
    with pytest.raises(ValueError):
        fused_moe(x, w, tw, ids, quant_mode="w8a8")


def test_fused_moe_layer_equals_functional(clean_env, tiny):
    p, w, x, tw, ids = tiny(tokens=6)
    layer = FusedMoE(w, max_tokens=8, top_k=p.top_k, activation="silu").warmup()
    assert layer.workspace.frozen
    assert 8 in layer.warmed_tokens
    for t in (1, 3, 6):
        got = layer(x[:t].contiguous(), tw[:t].contiguous(), ids[:t].contiguous())
        assert got.shape == (t, p.hidden)
        assert got.data_ptr() == layer.out.data_ptr()  # a view of the owned buffer
        assert torch.equal(got, fused_moe(x[:t].contiguous(), w, tw[:t].contiguous(), ids[:t].contiguous()))
    assert layer.choice(3).kernel == "reference"


def test_fused_moe_layer_rejects_bad_calls(clean_env, tiny):
    p, w, x, tw, ids = tiny(tokens=6)
    layer = FusedMoE(w, max_tokens=4, top_k=p.top_k)
    with pytest.raises(ValueError, match="max_tokens"):
        layer(x, tw, ids)
    layer3 = FusedMoE(w, max_tokens=8, top_k=3)
    with pytest.raises(ValueError, match="top_k"):
        layer3(x, tw, ids)


def test_fused_moe_layer_picks_per_tokens(fake_plugins, tiny):
    fake_plugins("fake-picky")
    import fused_moe_fake_picky as picky
    p, w, x, tw, ids = tiny(tokens=8)
    layer = FusedMoE(w, max_tokens=8, top_k=p.top_k)
    assert layer.choice(4).kernel == "picky" and layer.choice(5).kernel == "reference"
    # warm-up runs the largest T of every kernel that can be chosen, plus the declared ones.
    assert layer.plan([2]) == [8, 4, 2]
    picky.CALLS.clear()
    layer.warmup([2])
    # the planned runs first, then the variant probes (a runner's host logic with launches
    # stubbed; a torch-only fake like this one runs whole), never past picky's own range
    assert picky.CALLS[:2] == [4, 2] and set(picky.CALLS) <= {1, 2, 3, 4}
    picky.CALLS.clear()
    out = layer(x[:3].contiguous(), tw[:3].contiguous(), ids[:3].contiguous())
    assert picky.CALLS == [3]
    assert torch.equal(out, reference_moe(x[:3], w, tw[:3], ids[:3]))


def test_fused_moe_layer_forced_kernel(fake_plugins, tiny):
    fake_plugins("fake-picky")
    p, w, x, tw, ids = tiny(tokens=8)
    layer = FusedMoE(w, max_tokens=8, top_k=p.top_k, kernel="picky")
    assert layer.plan() == [4]
    with pytest.raises(ValueError, match="declined"):
        layer(x, tw, ids)
    with pytest.raises(ValueError, match="declined"):
        layer.warmup([8])


def test_fused_moe_layer_passes_workspace_and_deterministic(fake_plugins, tiny):
    fake_plugins("fake-high")
    import fused_moe_fake_high as fake
    p, w, x, tw, ids = tiny(tokens=4)
    layer = FusedMoE(w, max_tokens=4, top_k=p.top_k, deterministic=True).warmup()
    fake.CALLS.clear()
    layer(x, tw, ids)
    assert fake.CALLS[0]["workspace"] is layer.workspace and fake.CALLS[0]["deterministic"] is True


# -- the torch.library op ----------------------------------------------------------------------
def test_op_eager_matches_fused_moe(clean_env, tiny):
    p, w, x, tw, ids = tiny()
    got = dispatcher.fused_moe_op(x, w, tw, ids)
    assert torch.equal(got, fused_moe(x, w, tw, ids))
    h = dispatcher.register_weights(w)
    assert dispatcher.register_weights(w) == h
    assert torch.equal(torch.ops.fused_moe.fused_moe(x, tw, ids, h, "silu", "w4a16", 1.702, 1.0, 7.0, None, False), got)


def test_op_opcheck(clean_env, tiny):
    p, w, x, tw, ids = tiny()
    h = dispatcher.register_weights(w)
    torch.library.opcheck(torch.ops.fused_moe.fused_moe.default,
                          (x, tw, ids, h, "silu", "w4a16", 1.702, 1.0, 7.0, None, False),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_op_under_torch_compile(clean_env, tiny, backend):
    p, w, x, tw, ids = tiny(activation="relu2")
    dispatcher.register_weights(w)  # outside the compiled region: fullgraph needs no side effect

    def layer(x, tw, ids):
        return dispatcher.fused_moe_op(x * 1, w, tw, ids, activation="relu2") + 0

    torch._dynamo.reset()
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    got = compiled(x, tw, ids)
    assert torch.equal(got, fused_moe(x, w, tw, ids, activation="relu2"))


def test_op_handle_of_a_freed_weights_object_is_an_error(clean_env, tiny):
    import gc

    p, w, x, tw, ids = tiny()
    h = dispatcher.register_weights(w)
    del w
    gc.collect()
    with pytest.raises(Exception, match="no live MoEWeights"):
        torch.ops.fused_moe.fused_moe(x, tw, ids, h, "silu", "w4a16", 1.702, 1.0, 7.0, None, False)
