"""reference_moe vs a plain per-token Python loop written here (its own activation formulas,
weights dequantized with MoEWeights.dequantize()), plus the reference plugin."""
import math

import pytest
import torch

from moe_common.activations import apply_activation
from moe_common.formats import FORMATS
from moe_common.reference import reference_moe
from moe_common.types import PRIORITY_REFERENCE, Activation, Offer
from moe_common.weights import MoEWeights

T, H, I, E, K = 7, 64, 32, 4, 2
OFFSET, NUM_EXPERTS = 3, 10  # this layer holds global experts 3..6 of 10

ACTIVATIONS = [
    Activation("silu"),
    Activation("gelu_tanh"),
    Activation("swigluoai"),
    Activation("swigluoai", limit=None),
    Activation("relu2"),
]
ACT_IDS = ["silu", "gelu_tanh", "swigluoai", "swigluoai-nolimit", "relu2"]


# --- the independent loop ------------------------------------------------------------------

def loop_act(h, act):
    if act.name == "relu2":
        return torch.where(h > 0, h * h, torch.zeros_like(h))
    g, u = h[: h.shape[0] // 2], h[h.shape[0] // 2 :]
    if act.name == "silu":
        return g / (1 + torch.exp(-g)) * u
    if act.name == "gelu_tanh":
        return 0.5 * g * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3))) * u
    if act.limit is not None:
        g = torch.where(g > act.limit, torch.full_like(g, act.limit), g)
        u = torch.maximum(torch.minimum(u, torch.full_like(u, act.limit)), torch.full_like(u, -act.limit))
    return g / (1 + torch.exp(-act.alpha * g)) * (u + act.beta)


def loop_moe(x, weights, tw, ids, act, quant_mode):
    w13, w2 = weights.dequantize()
    fmt = FORMATS[weights.weight_format]
    nv = weights.weight_format == "nvfp4"
    out = torch.zeros(x.shape, dtype=torch.bfloat16)
    for t in range(x.shape[0]):
        acc = torch.zeros(x.shape[1], dtype=torch.float32)
        for j in range(ids.shape[1]):
            e = int(ids[t, j]) - weights.local_expert_offset
            if not 0 <= e < weights.num_local_experts:
                continue
            a = x[t].float()
            if quant_mode == "w4a4":
                a = fmt.fake_quantize(a[None], float(weights.input_scale[e]) if nv else None)[0]
            h = w13[e] @ a
            if weights.w13_bias is not None:
                h = h + weights.w13_bias[e]
            y = loop_act(h, act).bfloat16().float()
            if quant_mode == "w4a4":
                y = fmt.fake_quantize(y[None], float(weights.fc2_input_scale[e]) if nv else None)[0]
            z = w2[e] @ y
            if weights.w2_bias is not None:
                z = z + weights.w2_bias[e]
            acc += float(tw[t, j]) * z
        out[t] = acc.bfloat16()
    return out


# --- problems ------------------------------------------------------------------------------

def make_weights(fmt, act, bias, seed=0, scales=True):
    g = torch.Generator().manual_seed(seed)
    n1 = I if act.name == "relu2" else 2 * I
    w13 = (torch.randn(E, n1, H, generator=g) / math.sqrt(H)).bfloat16()
    w2 = (torch.randn(E, H, I, generator=g) / math.sqrt(I)).bfloat16()
    kw = {}
    if bias:
        kw["w13_bias"] = torch.randn(E, n1, generator=g) * 0.5
        kw["w2_bias"] = torch.randn(E, H, generator=g) * 0.5
    if scales and fmt == "nvfp4":  # MXFP4 activations have no global scale
        # Calibrated as a user would (amax / (6 * 448)) on the test inputs, with a per-expert
        # spread so that using the wrong expert's scale would show.
        x = make_inputs()[0].float()
        spread = 1.0 + 0.25 * torch.arange(E, dtype=torch.float32)
        h = torch.einsum("th,enh->etn", x, w13.float())
        if bias:
            h = h + kw["w13_bias"][:, None, :]
        y_amax = apply_activation(h, act).abs().amax(dim=(1, 2))
        kw["input_scale"] = spread * float(x.abs().max()) / 2688
        kw["fc2_input_scale"] = spread * y_amax / 2688
    return MoEWeights.quantize(
        w13, w2, weight_format=fmt, local_expert_offset=OFFSET, num_experts=NUM_EXPERTS, **kw
    )


def make_inputs(seed=1, x_scale=3.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, H, generator=g) * x_scale).bfloat16()
    tw = torch.rand(T, K, generator=g) + 0.1
    ids = torch.randint(OFFSET, OFFSET + E, (T, K), generator=g, dtype=torch.int32)
    ids[0, 1] = -1  # out of bounds on the low side
    ids[1, 1] = NUM_EXPERTS  # out of bounds on the high side
    ids[2, 0] = OFFSET - 1  # another rank's expert, just below the local range
    ids[3, 0] = OFFSET + E  # another rank's expert, just above
    ids[4, :] = torch.tensor([0, NUM_EXPERTS + 5], dtype=torch.int32)  # row with no local expert
    # rows whose both routes are local, distinct experts: every path must sum over experts
    ids[5, :] = torch.tensor([OFFSET, OFFSET + 1], dtype=torch.int32)
    ids[6, :] = torch.tensor([OFFSET + 3, OFFSET + 2], dtype=torch.int32)
    return x, tw, ids


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def assert_matches(got, want, tol):
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    assert not torch.isnan(got).any()
    err = rel_l2(got, want)
    assert err <= tol, f"relative L2 error {err:.3g} > {tol}"
    # Elementwise: at most a couple of bf16 ulps anywhere (the fp32 sums differ in order only).
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2 * float(want.float().abs().max()))


# --- the loop comparison -------------------------------------------------------------------

@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("quant_mode", ["w4a16", "w4a4"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("act", ACTIVATIONS, ids=ACT_IDS)
def test_matches_loop(act, fmt, quant_mode, bias):
    weights = make_weights(fmt, act, bias)
    x, tw, ids = make_inputs()
    want = loop_moe(x, weights, tw, ids, act, quant_mode)
    assert want.float().abs().max() > 0
    # a token routed only to other ranks' experts gets exactly zero
    assert (want[4] == 0).all()
    gather = reference_moe(x, weights, tw, ids, activation=act, quant_mode=quant_mode)
    dense = reference_moe(x, weights, tw, ids, activation=act, quant_mode=quant_mode, capturable=True)
    tol = 5e-4 if quant_mode == "w4a16" else 5e-3
    assert_matches(gather, want, tol)
    assert_matches(dense, want, tol)
    assert (gather[4] == 0).all() and (dense[4] == 0).all()
    # gather and dense: same math, tight
    torch.testing.assert_close(gather.float(), dense.float(), rtol=8e-3, atol=1e-3)
    assert weights.kernel_cache == {}  # nothing cached by default


def test_activation_by_name_and_bf16_router_weights_int64_ids():
    weights = make_weights("nvfp4", Activation("gelu_tanh"), bias=False)
    x, tw, ids = make_inputs(seed=7)
    want = loop_moe(x, weights, tw.bfloat16(), ids, Activation("gelu_tanh"), "w4a16")
    got = reference_moe(x, weights, tw.bfloat16(), ids.long(), activation="gelu_tanh")
    assert_matches(got, want, 2e-3)


def test_swigluoai_limit_changes_result():
    """Sanity of the fixture: with this input scale the clamp is active, so the limit=None cases
    above really test the unclamped path."""
    weights = make_weights("mxfp4", Activation("swigluoai"), bias=True)
    x, tw, ids = make_inputs()
    a = reference_moe(x, weights, tw, ids, activation=Activation("swigluoai"))
    b = reference_moe(x, weights, tw, ids, activation=Activation("swigluoai", limit=None))
    assert rel_l2(a, b) > 1e-2


@pytest.mark.parametrize("capturable", [False, True], ids=["gather", "dense"])
def test_extreme_ids_never_index(capturable):
    weights = make_weights("nvfp4", Activation("silu"), bias=True)
    x, tw, ids = make_inputs()
    ids[0, 1] = torch.iinfo(torch.int32).max
    ids[1, 1] = torch.iinfo(torch.int32).min
    want = loop_moe(x, weights, tw, ids, Activation("silu"), "w4a16")
    got = reference_moe(x, weights, tw, ids, capturable=capturable)
    assert_matches(got, want, 2e-3)


@pytest.mark.parametrize("capturable", [False, True], ids=["gather", "dense"])
def test_no_local_routes_gives_zeros(capturable):
    weights = make_weights("mxfp4", Activation("silu"), bias=True)
    x, tw, _ = make_inputs()
    ids = torch.full((T, K), -1, dtype=torch.int32)
    ids[:, 1] = OFFSET + E
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
    reference_moe(x, weights, tw, ids, out=out, capturable=capturable)
    assert (out == 0).all()


@pytest.mark.parametrize("capturable", [False, True], ids=["gather", "dense"])
def test_unrouted_token_with_inf_stays_zero(capturable):
    """A token routed to no local expert contributes nothing, even when its values are not
    finite (the dense path computes it but must not let 0 * inf = NaN through)."""
    weights = make_weights("nvfp4", Activation("silu"), bias=True)
    x, tw, ids = make_inputs()
    x[4] = float("inf")
    x[4, ::2] = float("-inf")
    got = reference_moe(x, weights, tw, ids, capturable=capturable)
    assert (got[4] == 0).all()
    assert torch.isfinite(got[:4]).all() and torch.isfinite(got[5:]).all()


@pytest.mark.parametrize("capturable", [False, True], ids=["gather", "dense"])
def test_duplicate_ids_in_a_row_count_twice(capturable):
    weights = make_weights("nvfp4", Activation("silu"), bias=False)
    x, tw, ids = make_inputs()
    ids[:, :] = OFFSET + 1
    want = loop_moe(x, weights, tw, ids, Activation("silu"), "w4a16")
    got = reference_moe(x, weights, tw, ids, capturable=capturable)
    assert_matches(got, want, 2e-3)


@pytest.mark.parametrize("capturable", [False, True], ids=["gather", "dense"])
@pytest.mark.parametrize("quant_mode", ["w4a16", "w4a4"])
def test_out_fully_overwritten(capturable, quant_mode):
    weights = make_weights("nvfp4", Activation("swigluoai"), bias=True)
    x, tw, ids = make_inputs()
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
    ret = reference_moe(x, weights, tw, ids, activation="swigluoai", quant_mode=quant_mode,
                        out=out, capturable=capturable)
    assert ret is out
    assert not torch.isnan(out).any()
    fresh = reference_moe(x, weights, tw, ids, activation="swigluoai", quant_mode=quant_mode,
                          capturable=capturable)
    assert torch.equal(out, fresh)


def test_dense_cache_is_opt_in_and_consistent():
    weights = make_weights("nvfp4", Activation("silu"), bias=True)
    x, tw, ids = make_inputs()
    plain = reference_moe(x, weights, tw, ids, capturable=True)
    cached = reference_moe(x, weights, tw, ids, capturable=True, cache_dequantized=True)
    assert "reference" in weights.kernel_cache
    assert torch.equal(plain, cached)
    # an in-place change to the weights invalidates the cache
    weights.w2.zero_()
    if weights.w2_bias is not None:
        weights.w2_bias.zero_()
    again = reference_moe(x, weights, tw, ids, capturable=True, cache_dequantized=True)
    assert (again == 0).all()


def test_w4a4_nvfp4_without_activation_scales_is_an_error():
    weights = make_weights("nvfp4", Activation("silu"), bias=False, scales=False)
    x, tw, ids = make_inputs()
    with pytest.raises(ValueError, match=r"MoEWeights\.quantize.*calibrate"):
        reference_moe(x, weights, tw, ids, quant_mode="w4a4")
    reference_moe(x, weights, tw, ids, quant_mode="w4a16")  # fine without them


def test_w4a4_mxfp4_needs_no_activation_scales():
    act = Activation("relu2")
    weights = make_weights("mxfp4", act, bias=False, scales=False)
    x, tw, ids = make_inputs()
    want = loop_moe(x, weights, tw, ids, act, "w4a4")
    assert_matches(reference_moe(x, weights, tw, ids, activation=act, quant_mode="w4a4"), want, 1e-2)


def test_w4a4_differs_from_w4a16():
    weights = make_weights("nvfp4", Activation("silu"), bias=False)
    x, tw, ids = make_inputs()
    a = reference_moe(x, weights, tw, ids, quant_mode="w4a16")
    b = reference_moe(x, weights, tw, ids, quant_mode="w4a4")
    assert 1e-3 < rel_l2(b, a) < 0.5


def test_invalid_inputs_are_rejected():
    weights = make_weights("nvfp4", Activation("silu"), bias=False)
    x, tw, ids = make_inputs()
    with pytest.raises(ValueError, match="^x"):
        reference_moe(x.float(), weights, tw, ids)
    with pytest.raises(ValueError, match="^activation"):
        reference_moe(x, weights, tw, ids, activation="relu2")  # gated weights


# --- the plugin ----------------------------------------------------------------------------

def test_plugin_offers_and_runs():
    from moe_common import reference_plugin
    from moe_common.validation import validate_inputs

    weights = make_weights("mxfp4", Activation("swigluoai"), bias=True)
    x, tw, ids = make_inputs()
    act = Activation("swigluoai")
    shape = validate_inputs(x, weights, tw, ids, activation=act, quant_mode="w4a16")
    offer = reference_plugin.can_handle(shape=shape, activation=act)
    assert isinstance(offer, Offer)
    assert offer.kernel == "reference" and offer.priority == PRIORITY_REFERENCE
    out = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
    ret = offer.run(x, weights, tw, ids, activation=act, quant_mode="w4a16", out=out,
                    workspace=None, deterministic=True)
    assert ret is out and not torch.isnan(out).any()
    assert torch.equal(out, reference_moe(x, weights, tw, ids, activation=act))


def test_plugin_is_a_pluggy_hookimpl_and_entry_point():
    from importlib.metadata import entry_points

    import pluggy

    from moe_common import reference_plugin

    eps = [ep for ep in entry_points(group="fused_moe.kernels") if ep.name == "reference"]
    assert eps and eps[0].value == "moe_common.reference_plugin"

    class Spec:
        @pluggy.HookspecMarker("fused_moe")
        def can_handle(self, shape, activation):
            ...

    pm = pluggy.PluginManager("fused_moe")
    pm.add_hookspecs(Spec)
    pm.register(reference_plugin)
    (offer,) = pm.hook.can_handle(shape=None, activation=Activation("relu2"))
    assert offer.kernel == "reference"


def test_plugin_warns_once_when_running_on_a_gpu(monkeypatch, caplog):
    import logging
    from types import SimpleNamespace

    from moe_common import reference_plugin

    calls = []
    monkeypatch.setattr(reference_plugin, "reference_moe", lambda *a, **kw: calls.append(kw) or kw["out"])
    monkeypatch.setattr(reference_plugin, "_warned_on_gpu", False)
    fake_x = SimpleNamespace(is_cuda=True, device="cuda:0")
    with caplog.at_level(logging.WARNING, logger="moe_common.reference"):
        for _ in range(3):
            reference_plugin._run(fake_x, None, None, None, activation=Activation("silu"),
                                  quant_mode="w4a16", out="OUT")
    warnings = [r for r in caplog.records if r.name == "moe_common.reference"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "reference" in warnings[0].getMessage() and "GPU" in warnings[0].getMessage()
    assert len(calls) == 3 and calls[0]["out"] == "OUT"
    # and never on CPU
    caplog.clear()
    monkeypatch.setattr(reference_plugin, "_warned_on_gpu", False)
    reference_plugin._run(SimpleNamespace(is_cuda=False, device="cpu"), None, None, None,
                          activation=Activation("silu"), quant_mode="w4a16", out="OUT")
    assert not [r for r in caplog.records if r.name == "moe_common.reference"]


def test_public_reexports():
    import moe_common

    for name in ("Activation", "MoEShape", "Offer", "Decline", "MoEWeights", "Workspace",
                 "NVFP4", "MXFP4", "reference_moe", "validate_inputs", "hookimpl"):
        assert hasattr(moe_common, name), name
    assert moe_common.reference_moe is reference_moe
    assert moe_common.NVFP4 is FORMATS["nvfp4"] and moe_common.MXFP4 is FORMATS["mxfp4"]
