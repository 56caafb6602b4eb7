"""Model-shaped MoE layers for the CLI: presets, random weights and random routing."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import torch

from moe_common.types import Activation, MoEShape
from moe_common.weights import MoEWeights

BLOCK = {"nvfp4": 16, "mxfp4": 32}


@dataclass(frozen=True)
class Preset:
    name: str
    experts: int
    hidden: int
    intermediate: int
    top_k: int
    weight_format: str = "nvfp4"
    activation: str = "silu"
    bias: bool = False

    @property
    def n1(self) -> int:
        return self.intermediate if self.activation == "relu2" else 2 * self.intermediate

    def describe(self) -> str:
        return (f"{self.name}: E={self.experts} H={self.hidden} I={self.intermediate} k={self.top_k} "
                f"{self.weight_format} {self.activation}{' +bias' if self.bias else ''}")

    def shape(self, tokens: int, *, quant_mode: str = "w4a16",
              device_capability: Optional[tuple] = None) -> MoEShape:
        return MoEShape(
            tokens=int(tokens), hidden=self.hidden, intermediate=self.intermediate,
            num_experts=self.experts, num_local_experts=self.experts, local_expert_offset=0,
            top_k=self.top_k, weight_format=self.weight_format, quant_mode=quant_mode,
            has_bias=self.bias, device_capability=device_capability, dtype=torch.bfloat16)

    def expert_bytes(self) -> int:
        """4-bit weight bytes of one expert: packed e2m1 codes + block scales + global scales."""
        bs = BLOCK[self.weight_format]
        fc1 = self.n1 * self.hidden
        fc2 = self.hidden * self.intermediate
        return fc1 // 2 + fc1 // bs + fc2 // 2 + fc2 // bs + 2 * 4

    def flops(self, tokens: int) -> float:
        """Useful FLOPs of one call: 2*T*k*H*(N1 + I) (= 6*T*k*H*I for gated activations)."""
        return 2.0 * tokens * self.top_k * self.hidden * (self.n1 + self.intermediate)


PRESETS = {p.name: p for p in [
    Preset("qwen3-30b-a3b", 128, 2048, 768, 8, "nvfp4", "silu"),
    Preset("qwen3.5-35b", 256, 2048, 512, 8, "nvfp4", "silu"),
    Preset("deepseek-v3", 256, 7168, 2048, 8, "nvfp4", "silu"),
    Preset("gpt-oss-120b", 128, 2880, 2880, 4, "mxfp4", "swigluoai", bias=True),
    Preset("nemotron-relu2", 128, 2688, 1856, 6, "nvfp4", "relu2"),
]}


def resolve(preset: Optional[str] = None, *, experts=None, hidden=None, intermediate=None, top_k=None,
            weight_format=None, activation=None, bias=None, default: str = "qwen3-30b-a3b") -> Preset:
    """A preset, with any explicit field overriding it (all explicit: a custom shape)."""
    explicit = dict(experts=experts, hidden=hidden, intermediate=intermediate, top_k=top_k,
                    weight_format=weight_format, activation=activation, bias=bias)
    given = {k: v for k, v in explicit.items() if v is not None}
    if preset is None and {"experts", "hidden", "intermediate", "top_k"} <= set(given):
        base = Preset("custom", given["experts"], given["hidden"], given["intermediate"], given["top_k"])
    else:
        name = preset or default
        if name not in PRESETS:
            raise ValueError(f"preset: got {name!r}; allowed: {', '.join(PRESETS)}")
        base = PRESETS[name]
    p = replace(base, **given)
    if base.name != "custom" and p != base:
        p = replace(p, name=base.name + "*")  # a modified preset
    Activation(p.activation)  # validates the name
    if p.weight_format not in BLOCK:
        raise ValueError(f"format: got {p.weight_format!r}; allowed: {', '.join(BLOCK)}")
    bs = BLOCK[p.weight_format]
    for what, v in (("hidden", p.hidden), ("intermediate", p.intermediate)):
        if v % bs:
            raise ValueError(f"{what}: got {v}; allowed: a multiple of the {p.weight_format} block ({bs})")
    if not 1 <= p.top_k <= p.experts:
        raise ValueError(f"top-k: got {p.top_k}; allowed: 1..experts ({p.experts})")
    return p


def random_weights(p: Preset, *, device="cpu", seed: int = 0, chunk: int = 16) -> MoEWeights:
    """Random bf16 weights of ``p`` quantized to its format (expert chunks bound the memory)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    parts = []
    for e0 in range(0, p.experts, chunk):
        n = min(chunk, p.experts - e0)
        w13 = torch.randn((n, p.n1, p.hidden), generator=gen, device=device, dtype=torch.float32)
        w13 = (w13 / math.sqrt(p.hidden)).to(torch.bfloat16)
        w2 = torch.randn((n, p.hidden, p.intermediate), generator=gen, device=device, dtype=torch.float32)
        w2 = (w2 / math.sqrt(p.intermediate)).to(torch.bfloat16)
        kw = {}
        if p.bias:
            kw["w13_bias"] = 0.1 * torch.randn((n, p.n1), generator=gen, device=device)
            kw["w2_bias"] = 0.1 * torch.randn((n, p.hidden), generator=gen, device=device)
        parts.append(MoEWeights.quantize(w13, w2, weight_format=p.weight_format, **kw))
        del w13, w2
    if len(parts) == 1:
        return parts[0]
    fields = ["w13", "w13_scale", "w13_scale_2", "w2", "w2_scale", "w2_scale_2", "w13_bias", "w2_bias",
              "input_scale", "fc2_input_scale"]
    cat = {}
    for f in fields:
        vals = [getattr(q, f) for q in parts]
        cat[f] = None if vals[0] is None else torch.cat(vals, 0)
    return MoEWeights(weight_format=parts[0].weight_format, **cat)


def random_inputs(p: Preset, tokens: int, *, device="cpu", gen: Optional[torch.Generator] = None):
    """x [T, H] bf16 and router output: randn logits -> top-k -> softmax over the k (fp32, int32)."""
    x = torch.randn((tokens, p.hidden), generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
    logits = torch.randn((tokens, p.experts), generator=gen, device=device, dtype=torch.float32)
    top, ids = logits.topk(p.top_k, dim=-1)
    return x, torch.softmax(top, dim=-1), ids.to(torch.int32)
