"""dispatcher.hf on CPU: tiny random Qwen3-MoE, GPT-OSS and DeepSeek-V3 models.

On CPU the dispatcher runs the torch reference, so these tests check the integration (layouts,
activations, biases, routing hand-off, loading), not a kernel. Each model class is checked:
- quantize_experts against transformers' own eager forward on the same dequantized FP4 weights
  (rel L2 <= 1e-2; the fused path rounds the tokens and the activation to bf16, ~1e-3), and
  against the stock bf16 weights within the FP4 quantization error (measured on the weights);
- from_pretrained on folders written by transformers' save_pretrained (bf16 experts) and in
  the FP4 layouts (ModelOpt NVFP4, gpt-oss MXFP4): logits identical to quantize_experts on the
  same weights, and a greedy generation with the same tokens.
"""
import copy
import json

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5")

from safetensors import safe_open  # noqa: E402  (after the skip: a transformers dependency)
from safetensors.torch import save_file  # noqa: E402

import dispatcher.hf as hf  # noqa: E402
from moe_common import MoEWeights  # noqa: E402
from moe_common.checkpoint import transformers_experts  # noqa: E402

E, H, I, K, VOCAB = 8, 64, 32, 2, 128
SMALL = dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, initializer_range=0.1)  # experts weigh in the logits


def qwen3_moe():
    return transformers.Qwen3MoeConfig(**SMALL, intermediate_size=96, moe_intermediate_size=I, num_experts=E,
                                       num_experts_per_tok=K, num_key_value_heads=2, head_dim=16)


def gpt_oss():
    return transformers.GptOssConfig(**SMALL, intermediate_size=I, num_local_experts=E, num_experts_per_tok=K,
                                     num_key_value_heads=2, head_dim=16, sliding_window=8,
                                     layer_types=["sliding_attention", "full_attention"],
                                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def deepseek_v3():
    return transformers.DeepseekV3Config(**SMALL, intermediate_size=96, moe_intermediate_size=I,
                                         n_routed_experts=E, num_experts_per_tok=K, n_group=2, topk_group=1,
                                         first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32,
                                         qk_rope_head_dim=8, v_head_dim=16, qk_nope_head_dim=16,
                                         num_key_value_heads=4)


CONFIGS = {"qwen3_moe": qwen3_moe, "gpt_oss": gpt_oss, "deepseek_v3": deepseek_v3}
FORMATS = {"qwen3_moe": "nvfp4", "gpt_oss": "mxfp4", "deepseek_v3": "nvfp4"}


def stock(name, dtype=torch.float32):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[name](), dtype=dtype).eval()
    with torch.no_grad():  # the router's bias / correction start at zero; make them matter
        for n, p in model.named_parameters():
            if n.endswith(("router.bias", "e_score_correction_bias")):
                p.normal_(0, 0.5)
    return model


def tokens(seed=1, batch=2, length=7):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


def rel_l2(a, b):
    return float((a - b).norm() / b.norm())


def module_layout(m, w13, w2, b13=None, b2=None):
    return transformers_experts(w13, w2, b13, b2, transposed=m.is_transposed, interleaved=not m.is_concatenated)


def with_dequantized_experts(quantized):
    """A copy of the quantized model running transformers' eager experts on the dequantized FP4
    weights (exact in fp32)."""
    return hf.dequantize_experts(copy.deepcopy(quantized), "eager")


def weight_error(model, quantized):
    """rel L2 of the dequantized FP4 expert weights against the stock ones, over the whole model."""
    num = den = 0.0
    qmods = dict(hf.experts_modules(quantized))
    for name, m in hf.experts_modules(model):
        w13, w2 = qmods[name].fused_moe_weights.dequantize()
        ref = module_layout(m, w13, w2)
        for pname in ("gate_up_proj", "down_proj"):
            num += float((ref[pname] - getattr(m, pname).detach()).norm() ** 2)
            den += float(getattr(m, pname).detach().norm() ** 2)
    return (num / den) ** 0.5


@pytest.mark.parametrize("name", list(CONFIGS))
def test_quantize_experts_matches_eager(name):
    model = stock(name)
    quantized = hf.quantize_experts(copy.deepcopy(model), FORMATS[name])
    assert quantized.config._experts_implementation == "fused_moe"
    for _, m in hf.experts_modules(quantized):
        assert not any(p in m._parameters for p in hf.EXPERT_PARAMS)  # the bf16 copies are gone
        assert m.fused_moe_weights.weight_format == FORMATS[name]
    ids = tokens()
    got = logits(quantized, ids)
    # Tight: transformers' eager experts on the same (dequantized) weights.
    eager = with_dequantized_experts(quantized)
    assert rel_l2(got, logits(eager, ids)) <= 1e-2
    # Loose: the stock weights. The experts see weights off by the FP4 error e_w (relative), so
    # their outputs are off by about e_w per GEMM; the logits, which add the non-expert paths,
    # by less than two GEMMs' worth.
    e_w = weight_error(model, quantized)
    assert 0.01 < e_w < 0.2
    assert rel_l2(got, logits(model, ids)) <= 2 * e_w


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CONFIGS))
def test_quantize_experts_on_gpu(name):
    """The same tight check with the dispatcher's kernels (not the reference) on an sm_90 GPU."""
    import dispatcher

    model = stock(name).cuda()
    quantized = hf.quantize_experts(copy.deepcopy(model), FORMATS[name])
    ids = tokens().cuda()
    eager = with_dequantized_experts(quantized)
    assert rel_l2(logits(quantized, ids), logits(eager, ids)) <= 1e-2
    _, m = hf.experts_modules(quantized)[-1]
    routed = torch.stack([torch.randperm(E)[:K] for _ in range(ids.numel())]).cuda()
    x = torch.randn(ids.numel(), H, device="cuda").bfloat16()
    ex = dispatcher.explain(x, m.fused_moe_weights, torch.full(routed.shape, 0.5, device="cuda"), routed,
                            activation=m.fused_moe_activation)
    assert ex.choice is not None and ex.choice.kernel != "reference", ex


def test_quantize_experts_activations_and_biases():
    act = {n: m.fused_moe_activation for n, m in hf.experts_modules(hf.quantize_experts(stock("gpt_oss"), "mxfp4"))}
    assert {(a.name, a.alpha, a.beta, a.limit) for a in act.values()} == {("swigluoai", 1.702, 1.0, 7.0)}
    q = hf.quantize_experts(stock("gpt_oss"), "mxfp4")
    assert all(m.fused_moe_weights.has_bias for _, m in hf.experts_modules(q))
    q = hf.quantize_experts(stock("deepseek_v3"), "nvfp4")
    assert [n for n, _ in hf.experts_modules(q)] == ["model.layers.1.mlp.experts"]  # layer 0 is dense
    assert all(m.fused_moe_activation.name == "silu" and not m.fused_moe_weights.has_bias
               for _, m in hf.experts_modules(q))


def test_bf16_model_moves_weights_with_tokens():
    model = hf.quantize_experts(stock("qwen3_moe", torch.bfloat16), "nvfp4")
    out = logits(model, tokens())
    assert out.shape == (2, 7, VOCAB) and torch.isfinite(out).all()


# ---- from_pretrained ---------------------------------------------------------------------------


def save(model, path):
    model.save_pretrained(path)
    return path


def read_all(path):
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def write_fp4(path, tensors, config_extra, quantized):
    """The saved checkpoint with its experts replaced by the FP4 layout of `quantized`'s weights:
    ModelOpt per-expert NVFP4, or gpt-oss MXFP4 blocks."""
    tensors = {k: v for k, v in tensors.items() if ".mlp.experts." not in k}
    for name, m in hf.experts_modules(quantized):
        w = m.fused_moe_weights
        if w.weight_format == "mxfp4":
            tensors.update({f"{name}.{k}": v.contiguous() for k, v in w.to_gpt_oss().items() if v is not None})
            continue
        for proj, d in w.to_modelopt().items():
            for key, t in d.items():
                for x in range(E):
                    tensors[f"{name}.{x}.{proj}_proj.{key}"] = t[x].clone()
    save_file(tensors, str(path / "model.safetensors"))
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **config_extra}))
    return path


@pytest.mark.parametrize("name", list(CONFIGS))
def test_from_pretrained_bf16_checkpoint(name, tmp_path):
    model = stock(name, torch.bfloat16)
    path = save(model, tmp_path / "bf16")
    fmt = FORMATS[name]
    loaded = hf.from_pretrained(path, weight_format=fmt)
    expected = hf.quantize_experts(copy.deepcopy(model), fmt)
    ids = tokens()
    assert torch.equal(logits(loaded, ids), logits(expected, ids))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_from_pretrained_fp4_checkpoint(name, tmp_path, monkeypatch):
    model = stock(name, torch.bfloat16)
    path = save(model, tmp_path / name)
    expected = hf.quantize_experts(copy.deepcopy(model), FORMATS[name])
    quant_cfg = ({"quantization_config": {"quant_method": "mxfp4"}} if name == "gpt_oss" else
                 {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}})
    write_fp4(path, read_all(path), quant_cfg, expected)

    def no_requantization(*args, **kwargs):
        raise AssertionError("an FP4 checkpoint's experts went through bf16")

    monkeypatch.setattr(MoEWeights, "quantize", no_requantization)
    loaded = hf.from_pretrained(path)
    ids = tokens()
    assert torch.equal(logits(loaded, ids), logits(expected, ids))
    for _, m in hf.experts_modules(loaded):
        assert not any(p in m._parameters for p in hf.EXPERT_PARAMS)
    prompt = tokens(seed=3, batch=1, length=4)
    gen = loaded.generate(prompt, max_new_tokens=5, do_sample=False)
    assert gen.shape == (1, 9)
    assert torch.equal(gen, expected.generate(prompt, max_new_tokens=5, do_sample=False))


def test_from_pretrained_dequantizes_nvfp4_linears(tmp_path):
    """A ModelOpt export also quantizes attention projections: they are dequantized on load."""
    model = stock("qwen3_moe", torch.bfloat16)
    path = save(model, tmp_path / "q")
    expected = hf.quantize_experts(copy.deepcopy(model), "nvfp4")
    tensors = read_all(path)
    key = "model.layers.1.self_attn.q_proj."
    q = MoEWeights.quantize(tensors[key + "weight"][None], torch.zeros(1, H, 32), weight_format="nvfp4")
    tensors.update({key + "weight": q.w13[0], key + "weight_scale": q.w13_scale[0],
                    key + "weight_scale_2": q.w13_scale_2[0], key + "input_scale": torch.tensor(0.01)})
    write_fp4(path, tensors, {}, expected)
    loaded = hf.from_pretrained(path)
    with torch.no_grad():
        expected.model.layers[1].self_attn.q_proj.weight.copy_(q.dequantize()[0][0])
    ids = tokens()
    assert torch.equal(logits(loaded, ids), logits(expected, ids))


# ---- errors ------------------------------------------------------------------------------------


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="Linear: has no transformers experts module"):
        hf.quantize_experts(torch.nn.Linear(4, 4))
    model = stock("qwen3_moe")
    model.set_experts_implementation("fused_moe")
    with pytest.raises(ValueError, match="Qwen3MoeExperts: has no fused_moe weights"):
        logits(model, tokens())

    from transformers.integrations.moe import use_experts_implementation

    @use_experts_implementation
    class OddExperts(torch.nn.Module):
        def __init__(self, config):
            super().__init__()

        def _apply_gate(self, gate_up):
            return gate_up[..., :1]

    @use_experts_implementation(has_gate=False)
    class UpOnlyExperts(torch.nn.Module):
        def __init__(self, config):
            super().__init__()

    cfg = qwen3_moe()
    with pytest.raises(ValueError, match=r"OddExperts: its gate \(OddExperts._apply_gate\) has no fused equivalent"):
        hf.experts_activation(OddExperts(cfg))
    with pytest.raises(ValueError, match="UpOnlyExperts: non-gated experts"):
        hf.experts_activation(UpOnlyExperts(cfg))
    cfg.hidden_act = "tanh"
    m = stock("qwen3_moe")
    m.config.hidden_act = "tanh"
    with pytest.raises(ValueError, match="Qwen3MoeExperts: config.json hidden_act: got 'tanh'"):
        hf.quantize_experts(m)
    # A checkpoint whose tensor does not fit the config names the key.
    path = save(stock("qwen3_moe", torch.bfloat16), tmp_path / "bad")
    tensors = read_all(path)
    tensors["model.layers.0.self_attn.o_proj.weight"] = torch.zeros(H, 32, dtype=torch.bfloat16)
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.o_proj\.weight: got shape \(64, 32\)"):
        hf.from_pretrained(path)
    del tensors["model.layers.0.self_attn.o_proj.weight"]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.o_proj\.weight: missing"):
        hf.from_pretrained(path)


# ---- the documentation's examples ------------------------------------------------------------


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def python_blocks(text: str) -> list:
    return [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]


def test_docs_examples(tmp_path):
    """docs/MODELS.md's examples (in order, one namespace) and README's "Run a real model" one,
    with the placeholder paths pointing at tiny checkpoints."""
    model = stock("qwen3_moe", torch.bfloat16)
    bf16_path = save(model, tmp_path / "bf16")
    nvfp4_path = save(model, tmp_path / "nvfp4")
    write_fp4(nvfp4_path, read_all(nvfp4_path), {}, hf.quantize_experts(copy.deepcopy(model), "nvfp4"))
    paths = {'"/models/Qwen3-30B-A3B-NVFP4"': repr(str(nvfp4_path)), '"/models/Qwen3-30B-A3B"': repr(str(bf16_path))}
    ns = {}
    for block in python_blocks((ROOT / "docs" / "MODELS.md").read_text()):
        for placeholder, real in paths.items():
            block = block.replace(placeholder, real)
        exec(compile(block, "docs/MODELS.md", "exec"), ns)
    assert ns["y"].shape == (4, H) and ns["act"].name == "silu"
    assert ns["tokens"].shape == (1, 12) and torch.isfinite(ns["logits"]).all()
    readme = (ROOT / "README.md").read_text().split("## Run a real model", 1)[1].split("\n## ", 1)[0]
    ns = {"path": str(nvfp4_path), "prompt": torch.tensor([[1, 2, 3]])}
    (block,) = python_blocks(readme)
    exec(compile(block, "README.md", "exec"), ns)
    assert ns["w"].weight_format == "nvfp4" and ns["tokens"].shape == (1, 11)
