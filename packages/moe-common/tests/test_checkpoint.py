"""MoEWeights.from_checkpoint: tiny synthetic checkpoint folders in every layout, on CPU.

Each test writes a real folder (config.json + safetensors, sharded with an index where stated),
loads one layer, and checks the layer against the same layer built directly from the tensors:
the canonical tensors bit for bit where the conversion is exact, and the layer's output through
moe_common.reference on random tokens and routing.
"""
import json

import pytest
import torch
from safetensors.torch import save_file

from moe_common import MoEWeights, reference_moe
from moe_common.checkpoint import INDEX_FILE, Checkpoint, layer_activation

E, H, I, K = 4, 64, 32, 2  # experts, hidden, intermediate, top_k
LAYERS = 2
QWEN = {"model_type": "qwen3_moe", "num_experts": E, "hidden_size": H, "moe_intermediate_size": I,
        "intermediate_size": 3 * I, "hidden_act": "silu", "num_experts_per_tok": K}
GPT_OSS = {"model_type": "gpt_oss", "num_local_experts": E, "hidden_size": H, "intermediate_size": I,
           "swiglu_limit": 7.0, "num_experts_per_tok": K}
FIELDS = ("w13", "w13_scale", "w13_scale_2", "w2", "w2_scale", "w2_scale_2", "w13_bias", "w2_bias",
          "input_scale", "fc2_input_scale")


def prefix(layer: int) -> str:
    return f"model.layers.{layer}.mlp.experts."


def bf16_weights(seed: int):
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, H, generator=g) * H ** -0.5).bfloat16()
    w2 = (torch.randn(E, H, I, generator=g) * I ** -0.5).bfloat16()
    return w13, w2


def write(path, tensors: dict, config: dict, shards: int = 1):
    """A checkpoint folder; with shards > 1, one file per layer group and an index."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    tensors = {k: v.contiguous().clone() for k, v in tensors.items()}
    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"))
        return path
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: v for k, v in tensors.items() if int(k.split(".")[2]) % shards == s}
        save_file(part, str(path / name))
        weight_map.update({k: name for k in part})
    (path / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


def bits(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def assert_same_tensors(a: MoEWeights, b: MoEWeights, skip=()):
    assert a.weight_format == b.weight_format
    for name in FIELDS:
        if name in skip:
            continue
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.shape == y.shape and torch.equal(bits(x), bits(y)), name


def layer_out(w: MoEWeights, activation="silu", seed=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, H, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(16)]).int()
    tw = torch.softmax(torch.randn(16, K, generator=g), dim=-1)
    return reference_moe(x, w, tw, ids, activation=activation)


def assert_same_layer(a: MoEWeights, b: MoEWeights, activation="silu"):
    assert torch.equal(layer_out(a, activation), layer_out(b, activation))


# ---- ModelOpt NVFP4 --------------------------------------------------------------------------


def modelopt_tensors(layers=LAYERS, input_scales=True):
    out, direct = {}, []
    for layer in range(layers):
        w13, w2 = bf16_weights(layer)
        w = MoEWeights.quantize(w13, w2, weight_format="nvfp4",
                                input_scale=0.01 + 0.001 * torch.arange(E) if input_scales else None,
                                fc2_input_scale=0.02 + 0.001 * torch.arange(E) if input_scales else None)
        direct.append(w)
        for proj, d in w.to_modelopt().items():
            for key, t in d.items():
                for x in range(E):
                    out[f"{prefix(layer)}{x}.{proj}_proj.{key}"] = t[x].clone()
    return out, direct


@pytest.mark.parametrize("input_scales", [True, False])
def test_modelopt(tmp_path, input_scales):
    tensors, direct = modelopt_tensors(input_scales=input_scales)
    # ModelOpt stores the per-tensor scales as 0-dim fp32 tensors
    assert tensors[prefix(0) + "0.gate_proj.weight_scale_2"].dim() == 0
    write(tmp_path, tensors, QWEN)
    for layer in range(LAYERS):
        w = MoEWeights.from_checkpoint(tmp_path, layer)
        assert_same_tensors(w, direct[layer])
        assert_same_layer(w, direct[layer])


def test_modelopt_sharded_reads_only_its_layer(tmp_path):
    tensors, direct = modelopt_tensors(layers=3)
    write(tmp_path, tensors, QWEN, shards=3)
    ck = Checkpoint(tmp_path)
    w = ck.experts(1)
    assert_same_tensors(w, direct[1])
    assert ck.read_keys and all(k.startswith(prefix(1)) for k in ck.read_keys)
    assert len(ck.read_keys) == len([k for k in tensors if k.startswith(prefix(1))])
    # The other layers' shards are never opened: the layer loads with them gone.
    for name in {n for k, n in ck.weight_map.items() if not k.startswith(prefix(1))}:
        (tmp_path / name).unlink()
    assert_same_tensors(MoEWeights.from_checkpoint(tmp_path, 1), direct[1])
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts\.0\.gate_proj\.weight: its file .* is missing"):
        MoEWeights.from_checkpoint(tmp_path, 0)
    # Without the index, every file's header gives the key map.
    (tmp_path / INDEX_FILE).unlink()
    assert_same_tensors(MoEWeights.from_checkpoint(tmp_path, 1), direct[1])
    assert Checkpoint(tmp_path).moe_layers() == [1]


def test_modelopt_errors(tmp_path):
    tensors, _ = modelopt_tensors(layers=1)
    bad = dict(tensors)
    del bad[prefix(0) + "2.up_proj.weight_scale"]
    write(tmp_path / "missing", bad, QWEN)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts\.2\.up_proj\.weight_scale: missing"):
        MoEWeights.from_checkpoint(tmp_path / "missing", 0)
    write(tmp_path / "shape", tensors, {**QWEN, "moe_intermediate_size": 2 * I})
    with pytest.raises(ValueError, match=r"experts\.0\.gate_proj\.weight: got shape \(32, 32\); allowed: \[64, 32\]"):
        MoEWeights.from_checkpoint(tmp_path / "shape", 0)
    write(tmp_path / "experts", tensors, {**QWEN, "num_experts": E + 1})
    with pytest.raises(ValueError, match=r"experts\.4\.gate_proj\.weight: missing"):
        MoEWeights.from_checkpoint(tmp_path / "experts", 0)
    with pytest.raises(ValueError, match=r"layer 5: no key.*layers with experts: \[0\]"):
        MoEWeights.from_checkpoint(tmp_path / "missing", 5)
    with pytest.raises(ValueError, match="weight_format: got 'mxfp4' for a modelopt checkpoint"):
        MoEWeights.from_checkpoint(tmp_path / "missing", 0, weight_format="mxfp4")


# ---- compressed-tensors nvfp4-pack-quantized -------------------------------------------------


def ct_compress(w: torch.Tensor, gs: torch.Tensor, with_input: bool):
    """One Linear weight compressed by compressed-tensors' own NVFP4 code with global scale gs:
    group scales (calculate_qparams) and NVFP4PackedCompressor."""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    w = w.float()
    groups = w.reshape(w.shape[0], -1, 16)
    scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), scheme.weights, global_scale=gs)
    sd = NVFP4PackedCompressor.compress({"weight": w, "weight_scale": scale, "weight_global_scale": gs}, scheme)
    if with_input:
        sd["input_global_scale"] = torch.tensor([2688.0 / 3.0])
    # compressed-tensors' dequantization in fp32 (its decompressor works in bf16)
    q = unpack_fp4_from_uint8(sd["weight_packed"], w.shape[0], w.shape[1], dtype=torch.float32)
    dq = dequantize(x_q=q, scale=sd["weight_scale"].float(), args=scheme.weights, dtype=torch.float32,
                    global_scale=sd["weight_global_scale"])
    return sd, dq


@pytest.fixture(scope="module")
def ct_checkpoint(tmp_path_factory):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization.utils.helpers import generate_gparam

    w13, w2 = bf16_weights(7)
    tensors, dequant = {}, {}
    for x in range(E):
        # llmcompressor ties a gate/up pair's global scales (update_fused_layer_weight_global_scales:
        # the smaller one, from the larger amax), so gate and up share one (generate_gparam).
        gs13 = generate_gparam(w13[x].float().amin(), w13[x].float().amax())
        gs2 = generate_gparam(w2[x].float().amin(), w2[x].float().amax())
        for proj, w, gs in (("gate", w13[x, :I], gs13), ("up", w13[x, I:], gs13), ("down", w2[x], gs2)):
            sd, dq = ct_compress(w, gs, with_input=True)
            dequant[(x, proj)] = dq
            tensors.update({f"{prefix(0)}{x}.{proj}_proj.{k}": v for k, v in sd.items()})
    path = write(tmp_path_factory.mktemp("ct"), tensors, QWEN)
    return path, tensors, dequant


def test_compressed_tensors(ct_checkpoint):
    path, tensors, dequant = ct_checkpoint
    w = MoEWeights.from_checkpoint(path, 0)
    assert w.weight_format == "nvfp4"
    w13, w2 = w.dequantize()
    # compressed-tensors dequantizes q * (scale / global_scale); ours is q * scale * (1 / global_scale):
    # the same up to the fp32 rounding of the division.
    for x in range(E):
        torch.testing.assert_close(w13[x, :I], dequant[(x, "gate")].float(), rtol=2e-7, atol=0)
        torch.testing.assert_close(w13[x, I:], dequant[(x, "up")].float(), rtol=2e-7, atol=0)
        torch.testing.assert_close(w2[x], dequant[(x, "down")].float(), rtol=2e-7, atol=0)
    gs = tensors[prefix(0) + "1.down_proj.weight_global_scale"]
    assert torch.equal(w.w2_scale_2[1], 1.0 / gs.reshape(()))  # ModelOpt's convention: the reciprocal
    assert torch.allclose(w.input_scale, torch.full((E,), 3.0 / 2688))
    # Built directly from the same tensors through the ModelOpt converter.
    direct = MoEWeights.from_modelopt(**{
        p: {"weight": [tensors[f"{prefix(0)}{x}.{p}_proj.weight_packed"] for x in range(E)],
            "weight_scale": [tensors[f"{prefix(0)}{x}.{p}_proj.weight_scale"] for x in range(E)],
            "weight_scale_2": [1.0 / tensors[f"{prefix(0)}{x}.{p}_proj.weight_global_scale"] for x in range(E)],
            "input_scale": [1.0 / tensors[f"{prefix(0)}{x}.{p}_proj.input_global_scale"] for x in range(E)]}
        for p in ("gate", "up", "down")})
    assert_same_tensors(w, direct)
    assert_same_layer(w, direct)


def test_compressed_tensors_bad_global_scale(ct_checkpoint, tmp_path):
    _, tensors, _ = ct_checkpoint
    bad = dict(tensors)
    bad[prefix(0) + "3.down_proj.weight_global_scale"] = torch.tensor([0.0])
    write(tmp_path, bad, QWEN)
    with pytest.raises(ValueError, match=r"experts\.3\.down_proj\.weight_global_scale: got 0\.0"):
        MoEWeights.from_checkpoint(tmp_path, 0)


# ---- gpt-oss MXFP4 ---------------------------------------------------------------------------


def gpt_oss_layer(seed=3):
    w13, w2 = bf16_weights(seed)
    g = torch.Generator().manual_seed(seed + 100)
    return MoEWeights.quantize(w13, w2, weight_format="mxfp4",
                               w13_bias=torch.randn(E, 2 * I, generator=g).bfloat16().float(),
                               w2_bias=torch.randn(E, H, generator=g).bfloat16().float())


def test_gpt_oss_mxfp4(tmp_path):
    convert_moe_packed_tensors = pytest.importorskip("transformers.integrations.mxfp4").convert_moe_packed_tensors

    direct = gpt_oss_layer()
    tensors = {prefix(0) + k: (v.bfloat16() if k.endswith("bias") else v)
               for k, v in direct.to_gpt_oss().items()}
    write(tmp_path, tensors, GPT_OSS)
    w = MoEWeights.from_checkpoint(tmp_path, 0)
    assert_same_tensors(w, direct)
    act = layer_activation(GPT_OSS)
    assert (act.name, act.alpha, act.beta, act.limit) == ("swigluoai", 1.702, 1.0, 7.0)
    assert_same_layer(w, direct, act)
    # transformers' own MXFP4 dequantization of the stored blocks: [E, H, 2I], gate/up interleaved
    hf = convert_moe_packed_tensors(tensors[prefix(0) + "gate_up_proj_blocks"],
                                    tensors[prefix(0) + "gate_up_proj_scales"], dtype=torch.float32)
    w13, _ = w.dequantize()
    assert torch.equal(hf[:, :, 0::2].transpose(1, 2), w13[:, :I])
    assert torch.equal(hf[:, :, 1::2].transpose(1, 2), w13[:, I:])
    with pytest.raises(ValueError, match="weight_format: got 'nvfp4' for a gpt-oss checkpoint"):
        MoEWeights.from_checkpoint(tmp_path, 0, weight_format="nvfp4")


def test_gpt_oss_shape_mismatch(tmp_path):
    tensors = {prefix(0) + k: v for k, v in gpt_oss_layer().to_gpt_oss().items()}
    write(tmp_path, tensors, {**GPT_OSS, "hidden_size": 2 * H})
    with pytest.raises(ValueError, match=r"experts\.gate_up_proj_blocks: got shape \(4, 64, 2, 16\)"):
        MoEWeights.from_checkpoint(tmp_path, 0)


# ---- bf16, quantized on load -----------------------------------------------------------------


@pytest.mark.parametrize("weight_format", ["nvfp4", "mxfp4"])
def test_bf16_per_expert(tmp_path, weight_format):
    w13, w2 = bf16_weights(11)
    tensors = {}
    for x in range(E):
        tensors[f"{prefix(0)}{x}.gate_proj.weight"] = w13[x, :I]
        tensors[f"{prefix(0)}{x}.up_proj.weight"] = w13[x, I:]
        tensors[f"{prefix(0)}{x}.down_proj.weight"] = w2[x]
    write(tmp_path, tensors, QWEN)
    w = MoEWeights.from_checkpoint(tmp_path, 0, weight_format=weight_format)
    direct = MoEWeights.quantize(w13, w2, weight_format=weight_format)
    assert_same_tensors(w, direct)
    assert_same_layer(w, direct)


def test_bf16_fused_default_format(tmp_path):
    w13, w2 = bf16_weights(12)
    write(tmp_path, {prefix(0) + "gate_up_proj": w13, prefix(0) + "down_proj": w2}, QWEN)
    w = MoEWeights.from_checkpoint(tmp_path, 0)
    assert_same_tensors(w, MoEWeights.quantize(w13, w2, weight_format="nvfp4"))


def test_bf16_fused_gpt_oss_transposed_interleaved(tmp_path):
    """transformers' GptOssExperts layout: gate_up_proj [E, H, 2I] with gate j in column 2j."""
    w13, w2 = bf16_weights(13)
    b13, b2 = torch.randn(E, 2 * I).bfloat16(), torch.randn(E, H).bfloat16()
    inter = torch.stack([w13[:, :I], w13[:, I:]], dim=2).reshape(E, 2 * I, H)
    inter_b = torch.stack([b13[:, :I], b13[:, I:]], dim=2).reshape(E, 2 * I)
    write(tmp_path, {prefix(0) + "gate_up_proj": inter.transpose(1, 2), prefix(0) + "gate_up_proj_bias": inter_b,
                     prefix(0) + "down_proj": w2.transpose(1, 2), prefix(0) + "down_proj_bias": b2}, GPT_OSS)
    w = MoEWeights.from_checkpoint(tmp_path, 0, weight_format="mxfp4")
    direct = MoEWeights.quantize(w13, w2, weight_format="mxfp4", w13_bias=b13, w2_bias=b2)
    assert_same_tensors(w, direct)
    assert_same_layer(w, direct, layer_activation(GPT_OSS))


# ---- folder-level errors ---------------------------------------------------------------------


def test_folder_errors(tmp_path):
    with pytest.raises(ValueError, match="allowed: a checkpoint folder"):
        MoEWeights.from_checkpoint(tmp_path / "nope", 0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        MoEWeights.from_checkpoint(tmp_path / "empty", 0)
    write(tmp_path / "odd", {prefix(0) + "0.w1.weight": torch.zeros(I, H)}, QWEN)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts\.\*: unknown experts layout"):
        MoEWeights.from_checkpoint(tmp_path / "odd", 0)
    write(tmp_path / "cfg", {prefix(0) + "gate_up_proj": torch.zeros(E, 2 * I, H)}, {"model_type": "x"})
    with pytest.raises(ValueError, match="config.json: got none of num_local_experts"):
        MoEWeights.from_checkpoint(tmp_path / "cfg", 0)
    with pytest.raises(ValueError, match="layer: got -1"):
        MoEWeights.from_checkpoint(tmp_path / "cfg", -1)
    with pytest.raises(ValueError, match="weight_format: got 'int4'"):
        MoEWeights.from_checkpoint(tmp_path / "cfg", 0, weight_format="int4")
    # relu2 is not a gate: act(gate) * up with it has no fused equivalent
    with pytest.raises(ValueError, match="hidden_act: got 'relu2'; allowed: silu, swish, gelu_pytorch_tanh"):
        layer_activation({"hidden_act": "relu2"})
    assert layer_activation({"hidden_act": "gelu_pytorch_tanh"}).name == "gelu_tanh"
