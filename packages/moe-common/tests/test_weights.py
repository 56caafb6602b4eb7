"""MoEWeights: quantization rules, validation, calibration and exact checkpoint-layout conversions."""
import dataclasses

import pytest
import torch

from moe_common.formats import MXFP4, NVFP4, e2m1_decode, pack_e2m1
from moe_common.weights import MoEWeights

TENSOR_FIELDS = ("w13", "w13_scale", "w13_scale_2", "w2", "w2_scale", "w2_scale_2",
                 "w13_bias", "w2_bias", "input_scale", "fc2_input_scale")


def make(e=3, i=96, h=160, gated=True, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    n1 = 2 * i if gated else i
    w13 = (torch.randn(e, n1, h, generator=g) * 0.05).to(dtype)
    w2 = (torch.randn(e, h, i, generator=g) * 0.05).to(dtype)
    return w13, w2


def bits(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def assert_same(a: MoEWeights, b: MoEWeights):
    """Bitwise-identical canonical tensors and metadata."""
    assert a.weight_format == b.weight_format
    assert (a.local_expert_offset, a.num_experts) == (b.local_expert_offset, b.num_experts)
    for name in TENSOR_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape, name
            assert torch.equal(bits(x), bits(y)), name
    for x, y in zip(a.dequantize(), b.dequantize()):
        assert torch.equal(x, y)


# ---- quantize from bf16 ----------------------------------------------------------------------


def test_quantize_nvfp4_follows_modelopt_rules():
    w13, w2 = make()
    w13[1] = 0  # an all-zero expert: scale_2 = 1, zero codes and scales
    w = MoEWeights.quantize(w13, w2)
    assert w.weight_format == "nvfp4" and w.gated and (w.hidden, w.intermediate) == (160, 96)
    assert w.w13.shape == (3, 192, 80) and w.w13.dtype == torch.uint8
    assert w.w13_scale.shape == (3, 192, 10) and w.w13_scale.dtype == torch.float8_e4m3fn
    assert w.w2.shape == (3, 160, 48) and w.w2_scale.shape == (3, 160, 6)
    for e in range(3):
        amax = w13[e].float().abs().max()
        want = amax / 2688 if amax > 0 else torch.tensor(1.0)
        assert w.w13_scale_2[e].item() == want.item()
        p, s = NVFP4.quantize(w13[e].float(), w.w13_scale_2[e].item())
        assert torch.equal(w.w13[e], p) and torch.equal(bits(w.w13_scale[e]), bits(s))
        assert w.w2_scale_2[e].item() == (w2[e].float().abs().max() / 2688).item()
    assert torch.all(w.w13[1] == 0) and torch.all(w.w13_scale[1].float() == 0)
    d13, d2 = w.dequantize()
    assert d13.dtype == torch.float32 and d13.shape == (3, 192, 160) and d2.shape == (3, 160, 96)
    assert torch.equal(d13[0], NVFP4.dequantize(w.w13[0], w.w13_scale[0], w.w13_scale_2[0].item()))
    rel = (d2 - w2.float()).norm() / w2.float().norm()
    assert rel < 0.15
    assert w.input_scale is None and w.fc2_input_scale is None and not w.has_bias


def test_quantize_is_exact_on_representable_weights():
    # w = q * s with an amax of 6 * 448 in each expert: scale_2 = 1 and every block scale is s.
    g = torch.Generator().manual_seed(5)
    e, rows, k = 2, 32, 64
    codes = torch.randint(0, 16, (e, rows, k), generator=g, dtype=torch.uint8)
    codes.view(e, rows, k // 16, 16)[..., 0] = 7
    s = torch.randint(8, 0x7E, (e, rows, k // 16), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    s[:, 0, 0] = 448.0
    w = (e2m1_decode(codes).view(e, rows, k // 16, 16) * s.float()[..., None]).reshape(e, rows, k)
    assert torch.equal(w.bfloat16().float(), w)  # 2 + 4 significant bits fit bf16
    # w2 all zero: the zero-expert rule (scale_2 = 1, zero scales and codes)
    mw = MoEWeights.quantize(w.bfloat16(), torch.zeros(e, k, 16, dtype=torch.bfloat16))
    assert torch.all(mw.w13_scale_2 == 1.0)
    assert torch.equal(mw.w13, pack_e2m1(codes)) and torch.equal(bits(mw.w13_scale), bits(s))
    assert torch.equal(mw.dequantize()[0], w)
    assert torch.all(mw.w2_scale_2 == 1.0) and torch.all(mw.dequantize()[1] == 0)


def test_quantize_mxfp4_with_biases():
    w13, w2 = make(i=64, h=96)
    b13 = torch.randn(3, 128).bfloat16()
    b2 = torch.randn(3, 96)
    w = MoEWeights.quantize(w13, w2, weight_format="mxfp4", w13_bias=b13, w2_bias=b2)
    assert w.weight_format == "mxfp4" and w.w13_scale.dtype == torch.uint8 and w.w13_scale.shape == (3, 128, 3)
    assert torch.all(w.w13_scale_2 == 1) and torch.all(w.w2_scale_2 == 1)
    p, s = MXFP4.quantize(w2.float())
    assert torch.equal(w.w2, p) and torch.equal(w.w2_scale, s)
    assert w.w13_bias.dtype == torch.float32 and torch.equal(w.w13_bias, b13.float())
    assert w.has_bias and w.block_size == 32


def test_relu2_weights():
    w13, w2 = make(i=64, h=96, gated=False)
    w = MoEWeights.quantize(w13, w2, input_scale=0.01, fc2_input_scale=torch.full((3,), 0.02))
    assert not w.gated and w.w13.shape == (3, 64, 48) and w.intermediate == 64
    assert w.input_scale.dtype == torch.float32 and torch.all(w.input_scale == torch.tensor(0.01))
    d13, _ = w.dequantize()
    assert d13.shape == (3, 64, 96)


def test_expert_parallel_fields():
    w13, w2 = make(e=2, i=32, h=32)
    w = MoEWeights.quantize(w13, w2, local_expert_offset=4)
    assert (w.local_expert_offset, w.num_experts, w.num_local_experts) == (4, 6, 2)
    w = MoEWeights.quantize(w13, w2, local_expert_offset=4, num_experts=16)
    assert w.num_experts == 16
    moved = w.to("cpu")
    assert (moved.local_expert_offset, moved.num_experts) == (4, 16)
    with pytest.raises(ValueError, match="local_expert_offset/num_experts"):
        MoEWeights.quantize(w13, w2, local_expert_offset=4, num_experts=5)
    with pytest.raises(ValueError, match="local_expert_offset/num_experts"):
        MoEWeights.quantize(w13, w2, local_expert_offset=-1, num_experts=5)


def test_to_device_returns_a_new_object_without_kernel_cache():
    w13, w2 = make(e=2, i=32, h=32)
    w = MoEWeights.quantize(w13, w2, w2_bias=torch.zeros(2, 32), input_scale=0.5)
    w.kernel_cache["k"] = object()
    m = w.to("meta")
    assert m is not w and m.kernel_cache == {} and "k" in w.kernel_cache
    for name in TENSOR_FIELDS:
        t = getattr(m, name)
        assert t is None or t.device.type == "meta", name
    c = w.to("cpu")
    assert c is not w and c.kernel_cache == {}
    assert_same(w, c)


Q_ERRORS = [
    (dict(weight_format="int4"), "weight_format"),
    (dict(w13=torch.zeros(2, 64, 32)[0]), "w13"),
    (dict(w13=torch.zeros(2, 64, 32, dtype=torch.int32)), "w13"),
    (dict(w2=torch.zeros(3, 32, 32)), "w2: got 3 experts"),
    (dict(w2=torch.zeros(2, 48, 32)), "w2: got shape"),
    (dict(w13=torch.zeros(2, 48, 32)), "w13: got shape"),
    (dict(w13=torch.zeros(2, 64, 40), w2=torch.zeros(2, 40, 32)), "w13: got H = 40"),
    (dict(w13=torch.zeros(2, 48, 32), w2=torch.zeros(2, 32, 24)), "w2: got I = 24"),
    (dict(weight_format="mxfp4", w13=torch.zeros(2, 64, 48), w2=torch.zeros(2, 48, 32)), "multiple of the mxfp4 block size 32"),
    (dict(w13_bias=torch.zeros(2, 32)), "w13_bias"),
    (dict(w2_bias=torch.zeros(2, 32, dtype=torch.int64)), "w2_bias"),
    (dict(w2_bias=torch.zeros(2, 31)), "w2_bias"),
    (dict(input_scale=torch.ones(3)), "input_scale: got shape"),
    (dict(input_scale="0.1"), "input_scale"),
    (dict(input_scale=0.0), "input_scale.*positive"),
    (dict(fc2_input_scale=torch.tensor([1.0, float("nan")])), "fc2_input_scale.*positive"),
    (dict(weight_format="mxfp4", input_scale=0.1), "input_scale.*mxfp4"),
]


@pytest.mark.parametrize("change,match", Q_ERRORS)
def test_quantize_rejects_bad_arguments(change, match):
    kw = dict(w13=torch.zeros(2, 64, 32), w2=torch.zeros(2, 32, 32))
    kw.update(change)
    with pytest.raises(ValueError, match=match):
        MoEWeights.quantize(kw.pop("w13"), kw.pop("w2"), **kw)


def test_validate_rejects_hand_built_inconsistencies():
    w13, w2 = make(e=2, i=32, h=32)
    w = MoEWeights.quantize(w13, w2)
    bad = [
        (dict(w13_scale=w.w13_scale.view(torch.uint8)), "w13_scale"),
        (dict(w2_scale_2=w.w2_scale_2.double()), "w2_scale_2"),
        (dict(w13=w.w13.to(torch.int8)), "w13"),
        (dict(w2=w.w2[:1]), "w2: got 1 experts"),
        (dict(fc2_input_scale=torch.ones(3)), "fc2_input_scale"),
        (dict(weight_format="fp4"), "weight_format"),
    ]
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(w, **change).validate()


# ---- calibrate -------------------------------------------------------------------------------


def test_calibrate_by_hand():
    w13, w2 = make(e=3, i=32, h=32, seed=7)
    b13 = torch.randn(3, 64) * 0.1
    w = MoEWeights.quantize(w13, w2, w13_bias=b13, local_expert_offset=10, num_experts=20)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(6, 32, generator=g).bfloat16()
    x[5, 3] = -9.0  # the all-token amax, only routed to expert 11
    ids = torch.tensor([[10, 0], [10, 11], [0, 1], [11, 10], [0, 1], [11, 19]])  # 12 gets no token
    c = w.calibrate(x, ids)
    assert w.input_scale is None and c is not w and torch.equal(c.w13, w.w13)
    xf = x.float()
    d13, _ = w.dequantize()

    def expect(e, rows):
        h = xf[rows] @ d13[e].t() + b13[e]
        gate, up = h[:, :32], h[:, 32:]
        y = (gate * torch.sigmoid(gate) * up).bfloat16().float()
        return xf[rows].abs().max() / 2688, y.abs().max() / 2688

    for e, rows in ((0, [0, 1, 3]), (1, [1, 3, 5]), (2, list(range(6)))):
        a_in, a_out = expect(e, rows)
        assert c.input_scale[e].item() == a_in.item()
        assert torch.allclose(c.fc2_input_scale[e], a_out, rtol=1e-6, atol=0)
    nine = torch.tensor(9.0) / 2688  # in fp32, as computed
    assert c.input_scale[1] == nine and c.input_scale[2] == nine
    # no routing: every token for every expert
    c_all = w.calibrate(x)
    assert torch.all(c_all.input_scale == nine)


def test_calibrate_activation_options_and_errors():
    w13, w2 = make(e=2, i=32, h=32, seed=9)
    w = MoEWeights.quantize(w13, w2)
    x = torch.randn(4, 32).bfloat16()
    a = w.calibrate(x, activation="swigluoai", swiglu_limit=None)
    b = w.calibrate(x, activation="swigluoai", swiglu_limit=0.01)
    assert torch.all(b.fc2_input_scale < a.fc2_input_scale)
    z = w.calibrate(torch.zeros(4, 32).bfloat16())
    assert torch.all(z.input_scale == 1) and torch.all(z.fc2_input_scale == 1)  # amax 0 -> 1
    with pytest.raises(ValueError, match="activation"):
        w.calibrate(x, activation="relu2")
    with pytest.raises(ValueError, match="x: got"):
        w.calibrate(x[:, :16])
    with pytest.raises(ValueError, match="topk_ids"):
        w.calibrate(x, torch.zeros(3, 2, dtype=torch.long))
    r = MoEWeights.quantize(*make(e=2, i=32, h=32, gated=False))
    assert r.calibrate(x, activation="relu2").input_scale.shape == (2,)
    m = MoEWeights.quantize(*make(e=2, i=32, h=32), weight_format="mxfp4")
    mc = m.calibrate(x)
    assert mc is not m and mc.input_scale is None and mc.fc2_input_scale is None


# ---- exact conversions -----------------------------------------------------------------------


def calibrated(fmt="nvfp4", gated=True, bias=False, seed=0):
    w13, w2 = make(gated=gated, seed=seed, i=96 if fmt == "nvfp4" else 64, h=160)
    kw = {}
    if bias:
        kw = dict(w13_bias=torch.randn(3, w13.shape[1]).bfloat16(), w2_bias=torch.randn(3, 160))
    w = MoEWeights.quantize(w13, w2, weight_format=fmt, **kw)
    x = torch.randn(16, 160, generator=torch.Generator().manual_seed(seed)).bfloat16()
    return w.calibrate(x, activation="silu" if gated else "relu2")


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("fused", [False, True])
def test_modelopt_round_trip_is_exact(gated, fused):
    w = calibrated(gated=gated)
    w = dataclasses.replace(w, local_expert_offset=2, num_experts=8)
    m = w.to_modelopt(fused=fused)
    if not gated:
        assert set(m) == {"up", "down"}
    else:
        assert set(m) == ({"gate_up", "down"} if fused else {"gate", "up", "down"})
    assert_same(w, MoEWeights.from_modelopt(**m, local_expert_offset=2, num_experts=8))
    # per-expert lists, as a checkpoint stores them ([N, K/2], [N, K/16], scalars)
    lists = {p: {k: list(v.unbind(0)) for k, v in d.items()} for p, d in m.items()}
    assert_same(w, MoEWeights.from_modelopt(**lists, local_expert_offset=2, num_experts=8))


def test_modelopt_layout_is_theirs():
    w = calibrated(bias=True)
    m = w.to_modelopt()
    i = w.intermediate
    # ModelOpt's own dequant: low nibble = element 2i, value = e2m1 * (scale * scale_2)
    lut = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6])
    up = m["up"]
    e = 1
    packed = up["weight"][e]
    un = torch.empty(packed.shape[0], packed.shape[1] * 2, dtype=torch.long)
    un[:, 0::2], un[:, 1::2] = packed & 0x0F, packed >> 4
    deq = (lut[un].view(packed.shape[0], -1, 16) * (up["weight_scale"][e].float() * up["weight_scale_2"][e])[..., None])
    ours = w.dequantize()[0][e, i:]
    assert torch.allclose(deq.reshape(ours.shape), ours, rtol=2**-23, atol=0)
    assert torch.equal(m["gate"]["bias"], w.w13_bias[:, :i]) and torch.equal(m["down"]["input_scale"], w.fc2_input_scale)


def test_modelopt_separate_gate_up_rules():
    w = calibrated()
    m = w.to_modelopt()
    m["up"]["input_scale"] = m["up"]["input_scale"] * 2
    assert torch.equal(MoEWeights.from_modelopt(**m).input_scale, m["up"]["input_scale"])  # the max
    bad = {k: dict(v) for k, v in w.to_modelopt().items()}
    bad["up"]["weight_scale_2"] = bad["up"]["weight_scale_2"].clone()
    bad["up"]["weight_scale_2"][2] *= 1.5
    with pytest.raises(ValueError, match=r"weight_scale_2 for experts \[2\]"):
        MoEWeights.from_modelopt(**bad)
    m = w.to_modelopt()
    with pytest.raises(ValueError, match="up: got None"):
        MoEWeights.from_modelopt(down=m["down"], gate=m["gate"])
    with pytest.raises(ValueError, match="gate_up/gate/up: got none"):
        MoEWeights.from_modelopt(down=m["down"])
    with pytest.raises(ValueError, match="gate_up: got gate_up together"):
        MoEWeights.from_modelopt(down=m["down"], gate_up=m["up"], gate=m["gate"], up=m["up"])
    no_in = dict(m["gate"])
    del no_in["input_scale"]
    with pytest.raises(ValueError, match="input_scale' for only one"):
        MoEWeights.from_modelopt(down=m["down"], gate=no_in, up=m["up"])
    with pytest.raises(ValueError, match=r"down\['weight'\]"):
        MoEWeights.from_modelopt(down={**m["down"], "weight": m["down"]["weight"].to(torch.int8)}, gate=m["gate"], up=m["up"])
    with pytest.raises(ValueError, match=r"down\['weight_scale_2'\]"):
        MoEWeights.from_modelopt(down={**m["down"], "weight_scale_2": None}, gate=m["gate"], up=m["up"])
    with pytest.raises(ValueError, match="down: got list"):
        MoEWeights.from_modelopt(down=[m["down"]], gate=m["gate"], up=m["up"])
    # weight_scale as raw e4m3 bytes is read as e4m3
    raw = {**m["down"], "weight_scale": m["down"]["weight_scale"].view(torch.uint8)}
    assert_same(w, MoEWeights.from_modelopt(down=raw, gate=m["gate"], up=m["up"]))
    with pytest.raises(ValueError, match="weight_format"):
        MoEWeights.quantize(*make(e=2, i=32, h=32), weight_format="mxfp4").to_modelopt()


@pytest.mark.parametrize("fmt,gated", [("nvfp4", True), ("nvfp4", False), ("mxfp4", True), ("mxfp4", False)])
def test_b12x_w4a16_round_trip_is_exact(fmt, gated):
    w = calibrated(fmt, gated)
    d = w.to_b12x("w4a16")
    assert d["quant_mode"] == "w4a16"
    assert_same(w, MoEWeights.from_b12x(**d))


@pytest.mark.parametrize("gated", [True, False])
def test_b12x_w4a4_round_trip(gated):
    w = calibrated("nvfp4", gated)
    d = w.to_b12x()  # default: FlashInfer's W4A4 ("nvfp4")
    assert d["quant_mode"] == "nvfp4"
    assert torch.equal(d["w1_alpha"], w.w13_scale_2) and torch.equal(d["input_global_scale"], w.input_scale)
    assert torch.equal(d["w2_alpha"], w.fc2_input_scale * w.w2_scale_2)
    # with the down projection's weight_scale_2 at hand the import is bitwise exact
    assert_same(w, MoEWeights.from_b12x(**d, w2_scale_2=w.w2_scale_2))
    # without it, w2_scale_2 is recovered from w2_alpha = fc2_input_scale * w2_scale_2: the same
    # product (all the kernel uses), the same value up to one ulp
    r = MoEWeights.from_b12x(**d)
    assert torch.equal(r.fc2_input_scale * r.w2_scale_2, d["w2_alpha"])
    ulp = torch.nextafter(w.w2_scale_2, torch.full_like(w.w2_scale_2, 1.0)) - w.w2_scale_2
    assert torch.all((r.w2_scale_2 - w.w2_scale_2).abs() <= ulp)
    assert_same(dataclasses.replace(w, w2_scale_2=r.w2_scale_2), r)
    with pytest.raises(ValueError, match="w2_scale_2"):
        MoEWeights.from_b12x(**d, w2_scale_2=w.w2_scale_2 * 2)


def test_b12x_mxfp4_round_trip_and_alpha_rules():
    w = calibrated("mxfp4")
    d = w.to_b12x()
    assert d["quant_mode"] == "mxfp4" and d["fc2_input_scale"] is None
    assert torch.all(d["w1_alpha"] == 1) and d["w1_weight_sf"].dtype == torch.uint8
    assert_same(w, MoEWeights.from_b12x(**d))
    d["w2_alpha"] = d["w2_alpha"] * 2
    with pytest.raises(ValueError, match="w2_alpha"):
        MoEWeights.from_b12x(**d)


def test_b12x_layout_is_theirs():
    w = calibrated()
    d = w.to_b12x()
    e, i, h = 3, w.intermediate, w.hidden
    assert d["w1_weight"].shape == (e, 2 * i, h // 2)
    # halves are [up; gate]
    assert torch.equal(d["w1_weight"][:, :i], w.w13[:, i:]) and torch.equal(d["w1_weight"][:, i:], w.w13[:, :i])
    # scales: FlashInfer's 6-D MMA view (32, 4, r_tile, 4, c_tile, E) over storage [E, r_tile,
    # c_tile, 32, 4, 4]: entry (r, c) of expert e at [r % 32, (r % 128) // 32, r // 128, c % 4, c // 4, e]
    sf = d["w1_weight_sf"]
    rows, cols = 2 * i, h // 16
    assert sf.shape == (32, 4, 2, 4, 3, e) and sf.dtype == torch.float8_e4m3fn
    b12x_rows = torch.cat([w.w13_scale[:, i:], w.w13_scale[:, :i]], dim=1)
    for ex in range(e):
        for r in range(0, 256, 7):
            for c in range(12):
                got = sf[r % 32, (r % 128) // 32, r // 128, c % 4, c // 4, ex].view(torch.uint8).item()
                want = b12x_rows[ex, r, c].view(torch.uint8).item() if r < rows and c < cols else 0
                assert got == want, (ex, r, c)
    storage = sf.permute(5, 2, 4, 0, 1, 3)
    assert storage.is_contiguous()  # a view of expert-major swizzled storage, as FlashInfer's
    # the storage itself (or FlashInfer's 2-D [E * R_pad, C_pad]) is accepted too
    w2_storage = d["w2_weight_sf"].permute(5, 2, 4, 0, 1, 3).reshape(e, 256, 8)
    flat = dict(d, w1_weight_sf=storage.reshape(e * 256, 12), w2_weight_sf=w2_storage)
    assert_same(w, MoEWeights.from_b12x(**flat, w2_scale_2=w.w2_scale_2))


def test_b12x_scale_semantics():
    w = calibrated()
    d = w.to_b12x()
    # FlashInfer's dual use: without input_global_scale, w1_alpha quantizes FC1's input and is
    # its whole epilogue alpha, so the weight scale is 1 and input_scale = w1_alpha
    legacy = dict(d, input_global_scale=None)
    r = MoEWeights.from_b12x(**legacy, w2_scale_2=w.w2_scale_2)
    assert torch.all(r.w13_scale_2 == 1) and torch.equal(r.input_scale, d["w1_alpha"])
    # reciprocal (multiplier-form) activation scales
    rec = w.to_b12x(input_scales_are_reciprocal=True)
    assert torch.equal(rec["fc2_input_scale"], 1.0 / w.fc2_input_scale)
    r = MoEWeights.from_b12x(**rec, input_scales_are_reciprocal=True)
    assert torch.allclose(r.input_scale, w.input_scale, rtol=2**-22, atol=0)
    # both activation scales are inverted back, and FC2's alpha still factors as before
    assert torch.allclose(r.fc2_input_scale, w.fc2_input_scale, rtol=2**-22, atol=0)
    assert torch.allclose(r.w2_scale_2, w.w2_scale_2, rtol=2**-21, atol=0)
    # one value for every expert is broadcast, as FlashInfer does
    one = dict(d, fc2_input_scale=d["fc2_input_scale"][:1], w2_alpha=d["fc2_input_scale"][:1] * w.w2_scale_2)
    assert torch.all(MoEWeights.from_b12x(**one).fc2_input_scale == d["fc2_input_scale"][0])
    with pytest.raises(ValueError, match="fc2_input_scale: got None"):
        MoEWeights.from_b12x(**dict(d, fc2_input_scale=None))
    with pytest.raises(ValueError, match="w1_alpha: got None"):
        MoEWeights.from_b12x(**dict(d, w1_alpha=None))
    with pytest.raises(ValueError, match="quant_mode"):
        MoEWeights.from_b12x(**dict(d, quant_mode="fp8"))
    with pytest.raises(ValueError, match="quant_mode"):
        MoEWeights.from_b12x(**dict(d, quant_mode="mxfp4"))
    with pytest.raises(ValueError, match="w1_weight_sf: got shape"):
        MoEWeights.from_b12x(**dict(d, w1_weight_sf=d["w1_weight_sf"][..., :2]))
    with pytest.raises(ValueError, match="w1_weight_sf: got dtype"):
        MoEWeights.from_b12x(**dict(d, w1_weight_sf=d["w1_weight_sf"].float()))
    with pytest.raises(ValueError, match="w1_weight: got 100 rows"):
        MoEWeights.from_b12x(**dict(d, w1_weight=d["w1_weight"][:, :100]))
    with pytest.raises(ValueError, match="w2_alpha"):
        MoEWeights.from_b12x(**dict(d, w2_alpha=torch.ones(2)))
    with pytest.raises(ValueError, match="input_scale and fc2_input_scale: got None"):
        MoEWeights.quantize(*make(e=2, i=32, h=32)).to_b12x()
    with pytest.raises(ValueError, match="bias"):
        calibrated(bias=True).to_b12x()


def test_gpt_oss_round_trip_is_exact():
    w = calibrated("mxfp4", bias=True)
    w = dataclasses.replace(w, local_expert_offset=3, num_experts=9)
    g = w.to_gpt_oss()
    assert g["gate_up_proj_blocks"].shape == (3, 128, 5, 16) and g["gate_up_proj_scales"].shape == (3, 128, 5)
    assert g["down_proj_blocks"].shape == (3, 160, 2, 16) and g["down_proj_bias"].shape == (3, 160)
    assert_same(w, MoEWeights.from_gpt_oss(**g, local_expert_offset=3, num_experts=9))
    nb = MoEWeights.quantize(*make(i=64, h=160), weight_format="mxfp4")
    gn = nb.to_gpt_oss()
    assert gn["gate_up_proj_bias"] is None
    assert_same(nb, MoEWeights.from_gpt_oss(**gn))


def test_gpt_oss_import_matches_transformers_dequant():
    # random checkpoint tensors, dequantized as HF transformers' convert_moe_packed_tensors does
    # (low nibble -> even element, ldexp by scale - 127), then split gate = ::2, up = 1::2
    g = torch.Generator().manual_seed(11)
    e, i, h = 2, 64, 96
    blocks = torch.randint(0, 256, (e, 2 * i, h // 32, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(118, 130, (e, 2 * i, h // 32), generator=g, dtype=torch.uint8)
    dblocks = torch.randint(0, 256, (e, h, i // 32, 16), generator=g, dtype=torch.uint8)
    dscales = torch.randint(118, 130, (e, h, i // 32), generator=g, dtype=torch.uint8)
    bias = torch.randn(e, 2 * i, generator=g).bfloat16()
    lut = torch.tensor([0.0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])

    def hf_dequant(b, s):
        out = torch.empty(*b.shape[:-1], 32)
        out[..., 0::2], out[..., 1::2] = lut[(b & 0x0F).long()], lut[(b >> 4).long()]
        out = torch.ldexp(out, (s.int() - 127)[..., None].float())
        return out.reshape(*b.shape[:2], -1)  # [E, rows, K] (HF then transposes)

    w = MoEWeights.from_gpt_oss(blocks, scales, dblocks, dscales, bias, None)
    d13, d2 = w.dequantize()
    ref13 = hf_dequant(blocks, scales)
    assert torch.equal(d13[:, :i], ref13[:, 0::2]) and torch.equal(d13[:, i:], ref13[:, 1::2])
    assert torch.equal(d2, hf_dequant(dblocks, dscales))
    assert torch.equal(w.w13_bias[:, :i], bias[:, 0::2].float()) and w.w2_bias is None
    assert w.weight_format == "mxfp4" and w.gated and w.intermediate == i


def test_gpt_oss_errors():
    w = calibrated("mxfp4", bias=True)
    g = w.to_gpt_oss()
    with pytest.raises(ValueError, match="gate_up_proj_blocks"):
        MoEWeights.from_gpt_oss(**dict(g, gate_up_proj_blocks=g["gate_up_proj_blocks"].reshape(3, 128, 80)))
    with pytest.raises(ValueError, match="down_proj_scales"):
        MoEWeights.from_gpt_oss(**dict(g, down_proj_scales=g["down_proj_scales"][:, :, :1]))
    with pytest.raises(ValueError, match="down_proj_blocks"):
        MoEWeights.from_gpt_oss(
            **dict(g, down_proj_blocks=g["down_proj_blocks"][:, :96], down_proj_scales=g["down_proj_scales"][:, :96])
        )
    with pytest.raises(ValueError, match="gate_up_proj_bias"):
        MoEWeights.from_gpt_oss(**dict(g, gate_up_proj_bias=g["gate_up_proj_bias"][:, :64]))
    with pytest.raises(ValueError, match="mxfp4 gated"):
        calibrated("nvfp4").to_gpt_oss()
