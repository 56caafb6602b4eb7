"""Read one MoE layer's experts from a checkpoint folder into MoEWeights.

A checkpoint folder holds config.json and safetensors files: one `model.safetensors`, several
files named by `model.safetensors.index.json` (sharded), or several files without an index.

Algorithm of `Checkpoint(path).experts(layer)` (`MoEWeights.from_checkpoint` calls it):

1. Read config.json (the nested `text_config` when there is one) and the key -> file map: the
   index's weight_map, else the key list in each file's header. Only headers are read here.
2. Take the keys under `<prefix>layers.<layer>.mlp.experts.`; none is a ValueError that lists
   the layers that have experts.
3. Detect the layout from those keys (and config.json's model_type):
     `<e>.gate_proj.weight_packed`          compressed-tensors nvfp4-pack-quantized, per expert
     `<e>.gate_proj.weight_scale_2`         ModelOpt NVFP4, per expert
     `gate_up_proj_blocks`                  gpt-oss MXFP4 (gate/up rows interleaved)
     `gate_up_proj`                         bf16 stacked over experts: [E, 2I, H] rows [gate; up],
                                            or for gpt-oss [E, H, 2I] with gate/up interleaved
     `<e>.gate_proj.weight` (floating)      bf16 per expert, quantized on load to weight_format
4. Check every tensor's shape against config.json (E experts, hidden H, intermediate I),
   read only those tensors (memory-mapped: safetensors reads a tensor's bytes when it is asked
   for, so other layers' bytes are never read) and hand them to the converter of that layout
   in weights.py (from_modelopt, from_gpt_oss, quantize), which moves bytes without rounding.

compressed-tensors stores NVFP4 global scales as multipliers of the quantization: its
`weight_global_scale` is 448 * 6 / amax and it dequantizes q * (weight_scale / global_scale),
the reciprocal of ModelOpt's weight_scale_2 = amax / (448 * 6) (and likewise input_global_scale
vs input_scale). They are inverted on load, so the dequantized values agree to within an fp32
rounding of the division.

`Checkpoint.dense(key)` reads a non-expert tensor in bf16, dequantizing NVFP4 linear weights
(ModelOpt or compressed-tensors) on the way, for loaders that build a whole model.
"""
from __future__ import annotations

import json
import os
import re
from typing import NamedTuple, Optional

import torch
from safetensors import safe_open

from .formats import NVFP4, get_format
from .types import Activation
from .weights import MoEWeights, _deinterleave_rows, _interleave_rows

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
PROJ_NAMES = ("gate_proj", "up_proj", "down_proj")
# The weight format each FP4 layout stores.
LAYOUT_FORMATS = {"modelopt": "nvfp4", "compressed-tensors": "nvfp4", "gpt-oss": "mxfp4"}


class Nvfp4Keys(NamedTuple):
    """One NVFP4 layout's key suffixes for a projection, and whether its per-tensor scales are
    stored inverted (compressed-tensors' global scales, see above)."""

    weight: str
    global_scale: str
    input_scale: str
    inverted: bool


NVFP4_KEYS = {
    "modelopt": Nvfp4Keys("weight", "weight_scale_2", "input_scale", False),
    "compressed-tensors": Nvfp4Keys("weight_packed", "weight_global_scale", "input_global_scale", True),
}

# config.json hidden_act -> the gated moe_common activation act(gate) * up (gpt-oss: swigluoai).
HIDDEN_ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def _fail(msg: str):
    raise ValueError(msg)


def _first(config: dict, names, what: str):
    for n in names:
        if config.get(n) is not None:
            return config[n]
    _fail(f"config.json: got none of {', '.join(names)}; allowed: one of them giving the {what}")


def moe_dims(config: dict) -> tuple:
    """(experts E, hidden H, intermediate I) of the MoE layers from a config.json dict."""
    e = _first(config, ("num_local_experts", "num_experts", "n_routed_experts"), "number of experts")
    h = _first(config, ("hidden_size",), "hidden size")
    i = _first(config, ("moe_intermediate_size", "intermediate_size"), "experts' intermediate size")
    return int(e), int(h), int(i)


def layer_activation(config: dict) -> Activation:
    """The gated experts' activation from a config.json dict: act(gate) * up for hidden_act,
    gpt-oss's clamped swiglu (swigluoai with its alpha and limit)."""
    if config.get("model_type") == "gpt_oss":
        return Activation("swigluoai", alpha=float(config.get("swiglu_alpha", 1.702)), beta=1.0,
                          limit=config.get("swiglu_limit", 7.0))
    act = config.get("hidden_act", "silu")
    if act not in HIDDEN_ACTS:
        _fail(f"config.json hidden_act: got {act!r}; allowed: {', '.join(HIDDEN_ACTS)} (or model_type gpt_oss)")
    return Activation(HIDDEN_ACTS[act])


class Checkpoint:
    """A checkpoint folder: its config and the key -> file map; tensors are read on demand."""

    def __init__(self, path, device=None):
        self.path = os.fspath(path)
        self.device = "cpu" if device is None else str(torch.device(device))
        if not os.path.isdir(self.path):
            _fail(f"path: got {self.path!r}; allowed: a checkpoint folder (config.json and *.safetensors)")
        cfg_file = os.path.join(self.path, CONFIG_FILE)
        if not os.path.isfile(cfg_file):
            _fail(f"path: {self.path!r} has no {CONFIG_FILE}; allowed: a checkpoint folder with one")
        with open(cfg_file) as f:
            config = json.load(f)
        self.full_config = config
        self.config = config.get("text_config") or config
        self.weight_map = self._weight_map()
        self._handles: dict = {}
        self.read_keys: list = []  # every tensor read, in order (tests check a layer reads only its own)

    def _weight_map(self) -> dict:
        index = os.path.join(self.path, INDEX_FILE)
        if os.path.isfile(index):
            with open(index) as f:
                wm = json.load(f).get("weight_map")
            if not isinstance(wm, dict) or not wm:
                _fail(f"{INDEX_FILE}: got no 'weight_map'; allowed: a mapping of tensor names to files")
            return dict(wm)
        files = sorted(n for n in os.listdir(self.path) if n.endswith(".safetensors"))
        if not files:
            _fail(f"path: {self.path!r} has no *.safetensors file and no {INDEX_FILE}")
        wm = {}
        for name in files:
            with safe_open(os.path.join(self.path, name), framework="pt") as f:
                wm.update({k: name for k in f.keys()})
        return wm

    # ---- tensors -----------------------------------------------------------------------------

    def has(self, key: str) -> bool:
        return key in self.weight_map

    def tensor(self, key: str) -> torch.Tensor:
        """One tensor by its checkpoint name, on this checkpoint's device."""
        name = self.weight_map.get(key)
        if name is None:
            _fail(f"{key}: missing from the checkpoint {self.path!r}")
        handle = self._handles.get(name)
        if handle is None:
            file = os.path.join(self.path, name)
            if not os.path.isfile(file):
                _fail(f"{key}: its file {name!r} (from {INDEX_FILE}) is missing in {self.path!r}")
            handle = safe_open(file, framework="pt", device=self.device)
            self._handles[name] = handle
        self.read_keys.append(key)
        return handle.get_tensor(key)

    def _shaped(self, key: str, shape: tuple, dtypes=None) -> torch.Tensor:
        t = self.tensor(key)
        if tuple(t.shape) != tuple(shape):
            _fail(f"{key}: got shape {tuple(t.shape)}; allowed: {list(shape)} (from config.json)")
        if dtypes is not None and t.dtype not in dtypes:
            _fail(f"{key}: got dtype {t.dtype}; allowed: {', '.join(str(d) for d in dtypes)}")
        return t

    def dense(self, key: str, dtype=torch.bfloat16) -> torch.Tensor:
        """A non-expert tensor in `dtype`; an NVFP4 linear weight (ModelOpt `weight` uint8 +
        weight_scale + weight_scale_2, or compressed-tensors `weight_packed` + weight_scale +
        weight_global_scale) is dequantized."""
        base = key[: -len("weight")] if key.endswith("weight") else None
        if base is not None and not self.has(key) and self.has(base + "weight_packed"):
            q, s = self.tensor(base + "weight_packed"), self.tensor(base + "weight_scale")
            gs = self._reciprocal(base + "weight_global_scale")
            return NVFP4.dequantize(q, _e4m3(s, base + "weight_scale"), gs).to(dtype)
        t = self.tensor(key)
        if base is not None and t.dtype == torch.uint8 and self.has(base + "weight_scale_2"):
            s = _e4m3(self.tensor(base + "weight_scale"), base + "weight_scale")
            gs = self._scalar(base + "weight_scale_2")
            return NVFP4.dequantize(t, s, gs).to(dtype)
        if not t.is_floating_point() or t.dtype.itemsize == 1:
            # fp8 weights carry a scale (block-quantized FP8 checkpoints) that a cast would drop
            _fail(f"{key}: got dtype {t.dtype}; allowed: a 16/32-bit floating tensor or an NVFP4 linear weight")
        return t.to(dtype)

    # ---- experts -----------------------------------------------------------------------------

    def experts_prefix(self, layer: int) -> str:
        """'<prefix>layers.<layer>.mlp.experts.' as the checkpoint spells it."""
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            _fail(f"layer: got {layer!r}; allowed: a layer index >= 0")
        pat = re.compile(rf"^(.*?layers\.{layer}\.mlp\.experts\.)")
        found = {m.group(1) for k in self.weight_map if (m := pat.match(k))}
        if len(found) > 1:
            _fail(f"layer {layer}: experts under several prefixes {sorted(found)}; allowed: one")
        if not found:
            _fail(f"layer {layer}: no key '*layers.{layer}.mlp.experts.*' in {self.path!r}; "
                  f"layers with experts: {self.moe_layers()}")
        return found.pop()

    def moe_layers(self) -> list:
        """The layer indices that have experts in this checkpoint, ascending."""
        pat = re.compile(r"layers\.(\d+)\.mlp\.experts\.")
        return sorted({int(m.group(1)) for k in self.weight_map if (m := pat.search(k))})

    def layout(self, prefix: str) -> str:
        """'modelopt' | 'compressed-tensors' | 'gpt-oss' | 'bf16-fused' | 'bf16' for the experts at prefix."""
        p0 = prefix + "0.gate_proj."
        if self.has(p0 + "weight_packed"):
            return "compressed-tensors"
        if self.has(p0 + "weight_scale_2"):
            return "modelopt"
        if self.has(prefix + "gate_up_proj_blocks"):
            return "gpt-oss"
        if self.has(prefix + "gate_up_proj"):
            return "bf16-fused"
        if self.has(p0 + "weight"):
            return "bf16"
        keys = sorted(k[len(prefix):] for k in self.weight_map if k.startswith(prefix))[:6]
        _fail(
            f"{prefix}*: unknown experts layout (keys {keys}...); allowed: ModelOpt NVFP4 "
            "(<e>.gate_proj.weight_scale_2), compressed-tensors NVFP4 (<e>.gate_proj.weight_packed), "
            "gpt-oss MXFP4 (gate_up_proj_blocks), bf16 (gate_up_proj, or <e>.gate_proj.weight)"
        )

    def experts(self, layer: int, weight_format: Optional[str] = None) -> MoEWeights:
        """The experts of `layer` as MoEWeights (see the module docstring for the steps)."""
        prefix = self.experts_prefix(layer)
        layout = self.layout(prefix)
        stored = LAYOUT_FORMATS.get(layout)
        if weight_format is not None:
            get_format(weight_format)
        if stored is not None and weight_format not in (None, stored):
            _fail(f"weight_format: got {weight_format!r} for a {layout} checkpoint, which stores {stored}; "
                  f"allowed: None or {stored!r} (4-bit weights are not requantized to another format)")
        dims = moe_dims(self.config)
        if layout == "gpt-oss":
            return self._gpt_oss(prefix, *dims)
        if layout in ("modelopt", "compressed-tensors"):
            return self._nvfp4(prefix, layout, *dims)
        w13, w2, b13, b2 = (self._bf16_fused if layout == "bf16-fused" else self._bf16_per_expert)(prefix, *dims)
        return MoEWeights.quantize(w13, w2, weight_format=weight_format or "nvfp4", w13_bias=b13, w2_bias=b2)

    def _nvfp4(self, prefix: str, layout: str, e: int, h: int, i: int) -> MoEWeights:
        rows_cols = {"gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}
        keys = NVFP4_KEYS[layout]
        projs = {}
        for name, (n, k) in rows_cols.items():
            # Activation scales are optional (w4a16 exports omit them); expert 0 says whether
            # the layer has them, and then every expert must.
            inputs = self.has(f"{prefix}0.{name}.{keys.input_scale}")
            per_expert = [self._nvfp4_proj(f"{prefix}{x}.{name}.", n, k, inputs, keys) for x in range(e)]
            projs[name] = {key: [p[key] for p in per_expert] for key in per_expert[0]}
        return MoEWeights.from_modelopt(gate=projs["gate_proj"], up=projs["up_proj"], down=projs["down_proj"])

    def _scalar(self, key: str) -> torch.Tensor:
        t = self.tensor(key)
        if t.numel() != 1:
            _fail(f"{key}: got shape {tuple(t.shape)}; allowed: one value (a per-tensor scale)")
        return t.float().reshape(())

    def _nvfp4_proj(self, base: str, n: int, k: int, inputs: bool, keys: Nvfp4Keys) -> dict:
        """One expert's projection in ModelOpt's names and scale convention (from_modelopt's input)."""
        scalar = self._reciprocal if keys.inverted else self._scalar
        out = {
            "weight": self._shaped(base + keys.weight, (n, k // 2), (torch.uint8,)),
            "weight_scale": _e4m3(self._shaped(base + "weight_scale", (n, k // 16)), base + "weight_scale"),
            "weight_scale_2": scalar(base + keys.global_scale),
        }
        if inputs:
            out["input_scale"] = scalar(base + keys.input_scale)
        return out

    def _reciprocal(self, key: str) -> torch.Tensor:
        """ModelOpt's scale from a compressed-tensors global scale (its reciprocal)."""
        t = self._scalar(key)
        if not bool(torch.isfinite(t) & (t > 0)):
            _fail(f"{key}: got {float(t)}; allowed: a positive finite global scale")
        return 1.0 / t

    def _gpt_oss(self, prefix: str, e: int, h: int, i: int) -> MoEWeights:
        u8 = (torch.uint8,)
        t = {
            "gate_up_proj_blocks": self._shaped(prefix + "gate_up_proj_blocks", (e, 2 * i, h // 32, 16), u8),
            "gate_up_proj_scales": self._shaped(prefix + "gate_up_proj_scales", (e, 2 * i, h // 32), u8),
            "down_proj_blocks": self._shaped(prefix + "down_proj_blocks", (e, h, i // 32, 16), u8),
            "down_proj_scales": self._shaped(prefix + "down_proj_scales", (e, h, i // 32), u8),
        }
        for name, shape in (("gate_up_proj_bias", (e, 2 * i)), ("down_proj_bias", (e, h))):
            t[name] = self._shaped(prefix + name, shape) if self.has(prefix + name) else None
        return MoEWeights.from_gpt_oss(**t)

    def _bf16_fused(self, prefix: str, e: int, h: int, i: int):
        """(w13 [E, 2I, H] [gate; up], w2 [E, H, I], biases) from gate_up_proj / down_proj."""
        bias = {n: prefix + n + "_bias" for n in ("gate_up_proj", "down_proj")}
        b13 = self._shaped(bias["gate_up_proj"], (e, 2 * i)) if self.has(bias["gate_up_proj"]) else None
        b2 = self._shaped(bias["down_proj"], (e, h)) if self.has(bias["down_proj"]) else None
        if self.config.get("model_type") == "gpt_oss":
            # transformers' GptOssExperts: x @ gate_up_proj[e] ([H, 2I], gate j in column 2j, up j in 2j+1)
            gu, d = self._shaped(prefix + "gate_up_proj", (e, h, 2 * i)), self._shaped(prefix + "down_proj", (e, i, h))
            return canonical_experts(gu, d, b13, b2, transposed=True, interleaved=True)
        gu, d = self._shaped(prefix + "gate_up_proj", (e, 2 * i, h)), self._shaped(prefix + "down_proj", (e, h, i))
        return canonical_experts(gu, d, b13, b2, transposed=False, interleaved=False)

    def _bf16_per_expert(self, prefix: str, e: int, h: int, i: int):
        shapes = {"gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}
        w = {n: torch.stack([self._shaped(f"{prefix}{x}.{n}.weight", s) for x in range(e)]) for n, s in shapes.items()}
        biases = {}
        for n, s in shapes.items():
            keys = [f"{prefix}{x}.{n}.bias" for x in range(e)]
            biases[n] = torch.stack([self._shaped(k, s[:1]) for k in keys]) if self.has(keys[0]) else None
        b13 = None
        if biases["gate_proj"] is not None or biases["up_proj"] is not None:
            if biases["gate_proj"] is None or biases["up_proj"] is None:
                _fail(f"{prefix}0.gate_proj.bias/up_proj.bias: got one of them; allowed: both or neither")
            b13 = torch.cat([biases["gate_proj"], biases["up_proj"]], dim=1)
        return torch.cat([w["gate_proj"], w["up_proj"]], dim=1), w["down_proj"], b13, biases["down_proj"]


def canonical_experts(gate_up, down, gate_up_bias=None, down_bias=None, *, transposed: bool, interleaved: bool):
    """Stacked experts in transformers' layouts -> (w13 [E, 2I, H] rows [gate; up], w2 [E, H, I],
    w13 bias [E, 2I] or None, w2 bias [E, H] or None), as MoEWeights.quantize takes them.

    transposed: gate_up [E, H, 2I] and down [E, I, H] (y = x @ W) instead of [E, 2I, H] and
    [E, H, I] (y = x @ W^T). interleaved: gate j is row 2j and up j row 2j + 1 (gpt-oss) instead
    of gate rows then up rows.
    """
    if transposed:
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    if interleaved:
        gate_up = _deinterleave_rows(gate_up)
        gate_up_bias = None if gate_up_bias is None else _deinterleave_rows(gate_up_bias)
    return gate_up, down, gate_up_bias, down_bias


def transformers_experts(w13, w2, w13_bias=None, w2_bias=None, *, transposed: bool, interleaved: bool) -> dict:
    """The inverse of canonical_experts: {gate_up_proj, down_proj, gate_up_proj_bias,
    down_proj_bias} in the layout that `transposed` / `interleaved` describe."""
    if interleaved:
        i = w13.shape[1] // 2
        w13 = _interleave_rows(w13, i)
        w13_bias = None if w13_bias is None else _interleave_rows(w13_bias, i)
    if transposed:
        w13, w2 = w13.transpose(1, 2), w2.transpose(1, 2)
    return {"gate_up_proj": w13, "down_proj": w2, "gate_up_proj_bias": w13_bias, "down_proj_bias": w2_bias}


def _e4m3(t: torch.Tensor, key: str) -> torch.Tensor:
    if t.dtype == torch.uint8:  # e4m3 bytes stored untyped
        return t.view(torch.float8_e4m3fn)
    if t.dtype != torch.float8_e4m3fn:
        _fail(f"{key}: got dtype {t.dtype}; allowed: float8_e4m3fn (NVFP4 block scales)")
    return t


def from_checkpoint(path, layer: int, *, weight_format: Optional[str] = None, device=None) -> MoEWeights:
    """The experts of MoE layer `layer` of the checkpoint folder `path` (see the module docstring).

    weight_format: None keeps an FP4 checkpoint's format (ModelOpt / compressed-tensors: nvfp4,
    gpt-oss: mxfp4) and quantizes bf16 experts to nvfp4; "nvfp4" / "mxfp4" picks the format of
    bf16 experts (an FP4 checkpoint must already be in it). device: where the tensors are read to
    and the result lives (default CPU).
    """
    return Checkpoint(path, device=device).experts(layer, weight_format)
