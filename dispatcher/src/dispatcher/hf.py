"""transformers integration: the "fused_moe" experts backend, quantize_experts and from_pretrained.

transformers (v5 and later) runs every MoE experts module through its experts interface: a class
decorated with `transformers.integrations.moe.use_experts_implementation` looks up
`config._experts_implementation` in `ExpertsInterface` on each call and runs
`fn(module, hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])`. Importing this
module registers `fn` under the name "fused_moe" (`ExpertsInterface.register`); a model is
switched to it with `model.set_experts_implementation("fused_moe")`.

The backend's call, per experts module:
1. The module's `fused_moe_weights` (MoEWeights) and `fused_moe_activation` (Activation), set by
   quantize_experts or from_pretrained; without them it is a ValueError naming the class.
2. The weights move to the tokens' device the first time they differ (model.to(device) does not
   see them: they are not parameters, so that a dtype cast cannot touch the 4-bit codes).
3. dispatcher.fused_moe(bf16 tokens, weights, fp32 router weights, ids, activation) and the result
   cast back to the tokens' dtype (the kernels take and return bf16).

quantize_experts(model, weight_format):
1. Find the experts modules (the decorated classes); check each is one this backend can serve:
   gated, no post-expert norm, and a gate it knows (the default act(gate) * up with config.json's
   hidden_act, or GptOssExperts' clamped swiglu = swigluoai with the module's alpha and limit).
2. Per module: its bf16 parameters in our layout (undoing transformers' transposed / interleaved
   layouts), MoEWeights.quantize, delete the parameters (their memory is freed when nothing else
   holds them), attach the weights and the activation.
3. model.set_experts_implementation("fused_moe").

from_pretrained(path, weight_format):
1. Read config.json; build the model from it with every experts class's __init__ run under the
   meta device, so no bf16 expert weights are allocated.
2. Fill every other parameter and persistent buffer from the checkpoint by name (NVFP4 linear
   weights are dequantized to the model's dtype; a tensor shared with another one, such as tied
   embeddings, may be absent).
3. Per experts module `...layers.<L>.mlp.experts`: moe_common.checkpoint's experts(L) straight
   into MoEWeights, then attach and switch the backend as above.

transformers is an optional dependency: `pip install moe-dispatcher[hf]`.
"""
from __future__ import annotations

import contextlib
import re
import sys
from typing import Optional

import torch

try:
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations.moe import ExpertsInterface, _default_apply_gate
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "dispatcher.hf needs transformers >= 5 (its experts interface); install moe-dispatcher[hf]"
    ) from err

from moe_common.checkpoint import Checkpoint, canonical_experts, layer_activation, transformers_experts
from moe_common.types import Activation
from moe_common.weights import MoEWeights

from .api import fused_moe

BACKEND = "fused_moe"
EXPERT_PARAMS = ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias")
# Experts classes with their own gate function, and how to read its parameters off the module.
CUSTOM_GATES = {
    "GptOssExperts": lambda m: layer_activation({"model_type": "gpt_oss", "swiglu_alpha": m.alpha,
                                                 "swiglu_limit": m.limit}),
}


def _fail(msg: str):
    raise ValueError(msg)


def fused_moe_experts_forward(module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                              top_k_weights: torch.Tensor) -> torch.Tensor:
    """The "fused_moe" experts implementation (see the module docstring)."""
    weights = getattr(module, "fused_moe_weights", None)
    if weights is None:
        _fail(f"{type(module).__name__}: has no fused_moe weights; allowed: a model prepared by "
              "dispatcher.hf.quantize_experts or loaded by dispatcher.hf.from_pretrained")
    if weights.device != hidden_states.device:
        weights = module.fused_moe_weights = weights.to(hidden_states.device)
    out = fused_moe(hidden_states.to(torch.bfloat16).contiguous(), weights,
                    top_k_weights.float().contiguous(), top_k_index.contiguous(),
                    activation=module.fused_moe_activation)
    return out.to(hidden_states.dtype)


ExpertsInterface.register(BACKEND, fused_moe_experts_forward)


# ---- which modules, which activation ----------------------------------------------------------


def is_experts_module(module) -> bool:
    """True for an instance of a class decorated with transformers' use_experts_implementation."""
    return hasattr(type(module), "_apply_gate") and hasattr(module, "is_concatenated")


def experts_modules(model) -> list:
    """[(name, module)] of the model's experts modules; none is a ValueError naming the model's class."""
    found = [(n, m) for n, m in model.named_modules() if is_experts_module(m)]
    if not found:
        _fail(f"{type(model).__name__}: has no transformers experts module (a class decorated with "
              "use_experts_implementation); allowed: MoE models such as Qwen3-MoE, GPT-OSS, DeepSeek-V3")
    return found


def experts_activation(module) -> Activation:
    """The Activation that reproduces the module's gate, or a ValueError naming its class."""
    cls = type(module)
    if not module.has_gate:
        _fail(f"{cls.__name__}: non-gated experts (up_proj only); allowed: gated experts (gate_up_proj)")
    # has_post_expert_norm is newer than transformers 5.17 (which has no such norm)
    if getattr(module, "has_post_expert_norm", False):
        _fail(f"{cls.__name__}: has a post-expert norm, which the fused kernels do not apply")
    if cls._apply_gate is _default_apply_gate:
        try:
            return layer_activation({"hidden_act": module.config.hidden_act})
        except ValueError as err:
            _fail(f"{cls.__name__}: {err}")
    if cls.__name__ in CUSTOM_GATES:
        return CUSTOM_GATES[cls.__name__](module)
    _fail(f"{cls.__name__}: its gate ({cls.__name__}._apply_gate) has no fused equivalent; allowed: "
          f"the default act(gate) * up, or {', '.join(CUSTOM_GATES)}")


def _layer_of(name: str) -> int:
    m = re.search(r"layers\.(\d+)\.", name)
    if m is None:
        _fail(f"{name}: an experts module outside '...layers.<L>....'; allowed: decoder layers' experts")
    return int(m.group(1))


def _attach(module, weights: MoEWeights, activation: Activation) -> None:
    """Replace the module's expert parameters by `weights` (the parameters' memory is released)."""
    for name in EXPERT_PARAMS:
        module._parameters.pop(name, None)
    module.fused_moe_weights = weights
    module.fused_moe_activation = activation


# ---- quantize_experts --------------------------------------------------------------------------


def quantize_experts(model, weight_format: str = "nvfp4"):
    """Quantize every experts module's bf16 parameters to `weight_format` ("nvfp4" / "mxfp4")
    MoEWeights, free the parameters and switch the model to the "fused_moe" backend. Returns the
    model (changed in place). Checks every module before changing any."""
    found = [(n, m, experts_activation(m)) for n, m in experts_modules(model)]
    for _, m, act in found:
        w13, w2, b13, b2 = canonical_experts(
            m.gate_up_proj.detach(), m.down_proj.detach(),
            m.gate_up_proj_bias.detach() if m.has_bias else None,
            m.down_proj_bias.detach() if m.has_bias else None,
            transposed=m.is_transposed, interleaved=not m.is_concatenated)
        _attach(m, MoEWeights.quantize(w13, w2, weight_format=weight_format, w13_bias=b13, w2_bias=b2), act)
    model.set_experts_implementation(BACKEND)
    return model


def dequantize_experts(model, implementation: str = "grouped_mm"):
    """The inverse of quantize_experts, for accuracy checks against transformers' own experts
    code: every experts module gets its parameters back, holding the dequantized 4-bit weights
    (in the module's layout and the model's dtype), and the model switches to `implementation`.
    Returns the model (changed in place)."""
    dtype = next(p for p in model.parameters()).dtype
    for _, m in experts_modules(model):
        w = getattr(m, "fused_moe_weights", None)
        if w is None:
            _fail(f"{type(m).__name__}: has no fused_moe weights to dequantize; allowed: a model "
                  "prepared by quantize_experts or from_pretrained")
        w13, w2 = w.dequantize()
        params = transformers_experts(w13, w2, w.w13_bias, w.w2_bias, transposed=m.is_transposed,
                                      interleaved=not m.is_concatenated)
        for name, t in params.items():
            if t is not None:
                m.register_parameter(name, torch.nn.Parameter(t.to(dtype).contiguous(), requires_grad=False))
        del m.fused_moe_weights, m.fused_moe_activation
    model.set_experts_implementation(implementation)
    return model


# ---- from_pretrained ---------------------------------------------------------------------------


@contextlib.contextmanager
def _experts_on_meta(model_class):
    """Run the __init__ of every experts class in model_class's module under the meta device."""
    module = sys.modules[model_class.__module__]
    classes = [c for c in vars(module).values()
               if isinstance(c, type) and issubclass(c, torch.nn.Module) and hasattr(c, "_apply_gate")]
    saved = {c: c.__dict__["__init__"] for c in classes if "__init__" in c.__dict__}

    def on_meta(init):
        def __init__(self, *args, **kwargs):
            with torch.device("meta"):
                init(self, *args, **kwargs)
        return __init__

    for c, init in saved.items():
        c.__init__ = on_meta(init)
    try:
        yield
    finally:
        for c, init in saved.items():
            c.__init__ = init


def _load_dense(model, ck: Checkpoint, skip: tuple) -> None:
    """Copy every non-expert parameter and persistent buffer from the checkpoint, by name."""
    state = model.state_dict(keep_vars=True)
    for key, target in state.items():
        if key.startswith(skip):
            continue
        if not ck.has(key) and any(t is target for k, t in state.items() if k != key and ck.has(k)):
            continue  # tied to a tensor the checkpoint has (e.g. lm_head and the embeddings)
        value = ck.dense(key, dtype=target.dtype)
        if value.shape != target.shape:
            _fail(f"{key}: got shape {tuple(value.shape)}; allowed: {tuple(target.shape)} (the model's, from config.json)")
        with torch.no_grad():
            target.copy_(value)


def from_pretrained(path, *, weight_format: Optional[str] = None, device=None, dtype=torch.bfloat16, **kwargs):
    """A transformers causal LM from the checkpoint folder `path`, its experts loaded straight into
    MoEWeights and run by the "fused_moe" backend (see the module docstring).

    weight_format: as MoEWeights.from_checkpoint (None keeps an FP4 checkpoint's format and
    quantizes bf16 experts to nvfp4). device: where the model is built (default CPU).
    dtype: of the non-expert weights (default bf16). kwargs go to transformers'
    AutoModelForCausalLM.from_config (e.g. attn_implementation).
    """
    ck = Checkpoint(path, device=device)
    config = AutoConfig.from_pretrained(ck.path)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the experts are ours; other quantized linears are dequantized
    try:
        model_class = AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        _fail(f"{ck.path}: {type(config).__name__} has no causal LM class in transformers; allowed: "
              "MoE causal LMs such as Qwen3-MoE, GPT-OSS, DeepSeek-V3")
    with torch.device(ck.device), _experts_on_meta(model_class):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)
    found = [(n, m, experts_activation(m)) for n, m in experts_modules(model)]
    _load_dense(model, ck, skip=tuple(n + "." for n, _, _ in found))
    for name, m, act in found:
        _attach(m, ck.experts(_layer_of(name), weight_format), act)
    model.set_experts_implementation(BACKEND)
    return model.eval()
