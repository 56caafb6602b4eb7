"""validate_inputs: one test per rule; every ValueError names the offending argument."""
import dataclasses

import pytest
import torch

from moe_common.types import Activation, MoEShape
from moe_common.validation import validate_inputs
from moe_common.weights import MoEWeights

T, H, I, E, K = 5, 64, 32, 4, 2


def make_weights(fmt="nvfp4", gated=True, device="cpu", w4a4_scales=True, bias=False):
    n1 = 2 * I if gated else I
    bs = 16 if fmt == "nvfp4" else 32
    sdt = torch.float8_e4m3fn if fmt == "nvfp4" else torch.uint8
    z = lambda *s, dt=torch.float32: torch.zeros(*s, dtype=dt, device=device)  # noqa: E731
    return MoEWeights(
        weight_format=fmt,
        w13=z(E, n1, H // 2, dt=torch.uint8),
        w13_scale=z(E, n1, H // bs, dt=sdt),
        w13_scale_2=z(E) + 1,
        w2=z(E, H, I // 2, dt=torch.uint8),
        w2_scale=z(E, H, I // bs, dt=sdt),
        w2_scale_2=z(E) + 1,
        w13_bias=z(E, n1) if bias else None,
        w2_bias=z(E, H) if bias else None,
        input_scale=z(E) + 1 if w4a4_scales else None,
        fc2_input_scale=z(E) + 1 if w4a4_scales else None,
        local_expert_offset=2,
        num_experts=10,
    )


def make_call(device="cpu", **wkw):
    return dict(
        x=torch.zeros(T, H, dtype=torch.bfloat16, device=device),
        weights=make_weights(device=device, **wkw),
        topk_weights=torch.zeros(T, K, dtype=torch.float32, device=device),
        topk_ids=torch.zeros(T, K, dtype=torch.int32, device=device),
        activation=Activation("silu"),
        quant_mode="w4a16",
        out=torch.zeros(T, H, dtype=torch.bfloat16, device=device),
    )


def check(call, *names):
    """The call raises ValueError whose message starts with the argument's name."""
    with pytest.raises(ValueError) as info:
        validate_inputs(**call)
    msg = str(info.value)
    assert msg.split(":")[0] in names, msg
    assert "got" in msg and "allowed" in msg, msg
    return msg


def misaligned(shape, dtype):
    buf = torch.zeros(int(torch.tensor(shape).prod()) + 8, dtype=dtype)
    t = buf[1 : 1 + int(torch.tensor(shape).prod())].view(shape)
    assert t.is_contiguous() and t.data_ptr() % 16 != 0
    return t


# --- the valid call and its MoEShape -------------------------------------------------------

def test_valid_call_returns_shape():
    shape = validate_inputs(**make_call(bias=True))
    assert shape == MoEShape(
        tokens=T, hidden=H, intermediate=I, num_experts=10, num_local_experts=E,
        local_expert_offset=2, top_k=K, weight_format="nvfp4", quant_mode="w4a16",
        has_bias=True, device_capability=None, dtype=torch.bfloat16,
    )


def test_valid_variants():
    c = make_call(fmt="mxfp4", gated=False, w4a4_scales=False)
    c.update(activation=Activation("relu2"), quant_mode="w4a4", out=None)
    c["topk_ids"] = c["topk_ids"].long()
    c["topk_weights"] = c["topk_weights"].bfloat16()
    s = validate_inputs(**c)
    assert (s.weight_format, s.quant_mode, s.has_bias, s.top_k) == ("mxfp4", "w4a4", False, K)
    # activation given by name is accepted too
    c["activation"] = "relu2"
    validate_inputs(**c)


def test_reads_no_values_meta_tensors():
    """Everything on the meta device (no data at all): validation must still pass, so it never
    reads a value (no host sync on CUDA)."""
    validate_inputs(**make_call(device="meta"))


# --- weights ------------------------------------------------------------------------------

def test_weight_format_unknown():
    c = make_call()
    c["weights"] = dataclasses.replace(c["weights"], weight_format="int4")
    msg = check(c, "weights.weight_format")
    assert "int4" in msg and "nvfp4" in msg


# --- x --------------------------------------------------------------------------------------

def test_x_not_2d():
    c = make_call()
    c["x"] = c["x"].view(1, T, H)
    check(c, "x")


def test_x_not_bf16():
    c = make_call()
    c["x"] = c["x"].half()
    assert "float16" in check(c, "x")


def test_x_hidden_mismatch():
    c = make_call()
    c["x"] = torch.zeros(T, H + 16, dtype=torch.bfloat16)
    msg = check(c, "x")
    assert str(H + 16) in msg and str(H) in msg


def test_x_zero_tokens():
    c = make_call()
    c.update(x=torch.zeros(0, H, dtype=torch.bfloat16), topk_ids=c["topk_ids"][:0],
             topk_weights=c["topk_weights"][:0], out=None)
    assert "T >= 1" in check(c, "x")


def test_x_non_contiguous():
    c = make_call()
    c["x"] = torch.zeros(H, T, dtype=torch.bfloat16).t()
    assert "contiguous" in check(c, "x")


def test_x_misaligned():
    c = make_call()
    c["x"] = misaligned((T, H), torch.bfloat16)
    assert "aligned" in check(c, "x")


def test_x_wrong_device():
    c = make_call()
    c["x"] = c["x"].to("meta")
    assert "meta" in check(c, "x")


# --- routing --------------------------------------------------------------------------------

def test_topk_ids_dtype():
    c = make_call()
    c["topk_ids"] = c["topk_ids"].to(torch.int16)
    assert "int16" in check(c, "topk_ids")


def test_topk_ids_float_rejected():
    c = make_call()
    c["topk_ids"] = c["topk_ids"].float()
    check(c, "topk_ids")


def test_topk_weights_dtype():
    c = make_call()
    c["topk_weights"] = c["topk_weights"].half()
    assert "float16" in check(c, "topk_weights")


def test_topk_ids_not_2d():
    c = make_call()
    c["topk_ids"] = c["topk_ids"].reshape(-1)
    check(c, "topk_ids")


def test_topk_ids_token_mismatch():
    c = make_call()
    c["topk_ids"] = torch.zeros(T + 1, K, dtype=torch.int32)
    check(c, "topk_ids")


def test_topk_weights_token_mismatch():
    c = make_call()
    c["topk_weights"] = torch.zeros(T - 1, K)
    check(c, "topk_weights")


def test_top_k_mismatch():
    c = make_call()
    c["topk_weights"] = torch.zeros(T, K + 1)
    assert "top_k" in check(c, "topk_weights")


def test_top_k_zero():
    c = make_call()
    c.update(topk_ids=torch.zeros(T, 0, dtype=torch.int32), topk_weights=torch.zeros(T, 0))
    assert "top_k" in check(c, "topk_ids")


def test_topk_ids_non_contiguous():
    c = make_call()
    c["topk_ids"] = torch.zeros(K, T, dtype=torch.int32).t()
    assert "contiguous" in check(c, "topk_ids")


def test_topk_weights_non_contiguous():
    c = make_call()
    c["topk_weights"] = torch.zeros(K, T).t()
    assert "contiguous" in check(c, "topk_weights")


def test_topk_ids_wrong_device():
    c = make_call()
    c["topk_ids"] = c["topk_ids"].to("meta")
    check(c, "topk_ids")


def test_topk_weights_wrong_device():
    c = make_call()
    c["topk_weights"] = c["topk_weights"].to("meta")
    check(c, "topk_weights")


# --- out ------------------------------------------------------------------------------------

def test_out_dtype():
    c = make_call()
    c["out"] = c["out"].float()
    check(c, "out")


def test_out_shape():
    c = make_call()
    c["out"] = torch.zeros(T, H // 2, dtype=torch.bfloat16)
    check(c, "out")


def test_out_non_contiguous():
    c = make_call()
    c["out"] = torch.zeros(H, T, dtype=torch.bfloat16).t()
    assert "contiguous" in check(c, "out")


def test_out_misaligned():
    c = make_call()
    c["out"] = misaligned((T, H), torch.bfloat16)
    assert "aligned" in check(c, "out")


def test_out_wrong_device():
    c = make_call()
    c["out"] = c["out"].to("meta")
    check(c, "out")


# --- activation / quant mode ---------------------------------------------------------------

def test_activation_unknown_name():
    c = make_call()
    c["activation"] = "gelu"
    assert "gelu_tanh" in check(c, "activation")


def test_relu2_with_gated_weights():
    c = make_call(gated=True)
    c["activation"] = Activation("relu2")
    check(c, "activation")


def test_gated_activation_with_relu2_weights():
    c = make_call(gated=False)
    c["activation"] = Activation("swigluoai")
    check(c, "activation")


def test_quant_mode_unknown():
    c = make_call()
    c["quant_mode"] = "w8a8"
    msg = check(c, "quant_mode")
    assert "w4a16" in msg and "w4a4" in msg


@pytest.mark.parametrize("missing", ["input_scale", "fc2_input_scale"])
def test_w4a4_nvfp4_needs_activation_scales(missing):
    c = make_call()
    c["weights"] = dataclasses.replace(c["weights"], **{missing: None})
    c["quant_mode"] = "w4a4"
    with pytest.raises(ValueError) as info:
        validate_inputs(**c)
    msg = str(info.value)
    assert msg.startswith("quant_mode") and missing in msg
    assert "MoEWeights.quantize" in msg and "calibrate" in msg


def test_w4a4_mxfp4_needs_no_activation_scales():
    c = make_call(fmt="mxfp4", w4a4_scales=False)
    c["quant_mode"] = "w4a4"
    validate_inputs(**c)
