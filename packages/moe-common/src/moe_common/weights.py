"""MoEWeights: the prepared 4-bit weights of one MoE layer, in the canonical layout.

Canonical layout (what every kernel and the reference read; kernels may cache their own repack
of it in `kernel_cache`):

  w13        uint8 [E_local, N1, H/2]   e2m1 codes, element 2i in the low nibble of byte i.
                                         N1 = 2I with rows [gate; up] for gated activations,
                                         N1 = I for relu2.
  w13_scale  NVFP4: float8_e4m3fn [E_local, N1, H/16];  MXFP4: uint8 (e8m0 bytes) [E_local, N1, H/32]
  w13_scale_2 float32 [E_local]          per-expert global scale (ModelOpt weight_scale_2); 1 for MXFP4
  w2         uint8 [E_local, H, I/2]
  w2_scale   as w13_scale, [E_local, H, I/bs]
  w2_scale_2 float32 [E_local]
  w13_bias   float32 [E_local, N1] or None
  w2_bias    float32 [E_local, H] or None
  input_scale      float32 [E_local] or None   NVFP4 activation global scale of FC1's input (w4a4)
  fc2_input_scale  float32 [E_local] or None   same for FC2's input (the activation output)
  local_expert_offset, num_experts: this object holds global experts
      [local_expert_offset, local_expert_offset + E_local) of num_experts.

Dequantized weight = e2m1(code) * scale * scale_2 (NVFP4) or e2m1(code) * 2^(byte-127) (MXFP4).
H and I must be multiples of the format's block size (16 / 32).

Ways in and out (every conversion moves bytes and never requantizes, so it is exact):

  MoEWeights.quantize(w13, w2, ...)     from bf16/fp32 (ModelOpt's rules: docs/DESIGN.md section 5)
  MoEWeights.from_modelopt(...)         ModelOpt NVFP4 per-expert tensors; inverse: to_modelopt()
  MoEWeights.from_b12x(...)             FlashInfer SM12x ("b12x") MoE tensors; inverse: to_b12x()
  MoEWeights.from_gpt_oss(...)          gpt-oss MXFP4 checkpoint tensors; inverse: to_gpt_oss()
  MoEWeights.from_checkpoint(path, layer)  one layer's experts from a checkpoint folder (checkpoint.py)
  weights.dequantize()                  fp32 (w13 [E, N1, H], w2 [E, H, I])
  weights.calibrate(x, topk_ids)        a copy with input_scale / fc2_input_scale (for w4a4)
  weights.to(device)                    a copy on another device
  weights.validate()                    check the layout above (the constructors call it)

The input scales follow ModelOpt: a scale multiplies (dequantized = q * s * input_scale) and is
amax / (6 * 448), not FlashInfer's reciprocal "global_sf" = 2688 / amax.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional, Union

import torch

from .formats import (
    E2M1_MAX,
    E8M0_NAN,
    E4M3_MAX,
    MXFP4,
    NVFP4,
    get_format,
    swizzle_scales_128x4,
    unswizzle_scales_128x4,
    weight_global_scale,
)
from .types import WEIGHT_FORMATS, Activation, make_activation

Scale = Optional[Union[float, torch.Tensor]]


def _fail(msg: str):
    raise ValueError(msg)


def _shape(t) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _desc(t) -> str:
    """'dtype (shape)' of a tensor, or the type name of anything else, for error messages."""
    return f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _per_expert(value: Scale, name: str, num: int, device) -> Optional[torch.Tensor]:
    """None | python number | one-value tensor (shape () as ModelOpt stores it, or [1]) | [E]
    tensor -> fp32 [E] on `device` (positive and finite)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        _fail(f"{name}: got {type(value).__name__}; allowed: None, a float, or a tensor [E] = [{num}]")
    if isinstance(value, torch.Tensor):
        if tuple(value.shape) not in ((), (1,), (num,)) or not value.is_floating_point():
            _fail(f"{name}: got shape {tuple(value.shape)} {value.dtype}; allowed: None, a float, "
                  f"a one-value floating tensor (shape () or [1]) or [E] = [{num}]")
        t = value.to(device=device, dtype=torch.float32).reshape(-1).expand(num).contiguous()
    else:
        t = torch.full((num,), float(value), dtype=torch.float32, device=device)
    if not bool(torch.all(torch.isfinite(t) & (t > 0))):
        _fail(f"{name}: got {t.tolist()[:8]}...; allowed: positive finite scales")
    return t


def _first_bad(name: str, bad: torch.Tensor, allowed: str) -> None:
    """ValueError naming `name`'s first expert with a bad entry (bad: bool, experts first)."""
    hit = bad.reshape(bad.shape[0], -1).any(dim=1).nonzero()
    if hit.numel():
        e = int(hit[0])
        _fail(f"{name}: got {int(bad.sum())} bad values, first in expert {e}; allowed: {allowed}")


def _bias(value, name: str, shape: tuple, device) -> Optional[torch.Tensor]:
    if value is None:
        return None
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        _fail(f"{name}: got {_shape(value)}; allowed: None or a floating tensor {list(shape)}")
    if tuple(value.shape) != shape:
        _fail(f"{name}: got shape {tuple(value.shape)}; allowed: {list(shape)}")
    return value.to(device=device, dtype=torch.float32)


def _swap_halves(t: torch.Tensor, i: int) -> torch.Tensor:
    """[E, 2I, ...] rows [a; b] -> [b; a] (our [gate; up] <-> b12x's [up; gate])."""
    return torch.cat([t[:, i:], t[:, :i]], dim=1)


def _interleave_rows(t: torch.Tensor, i: int) -> torch.Tensor:
    """[E, 2I, ...] rows [gate; up] -> gpt-oss order: row 2j = gate j, row 2j+1 = up j."""
    return torch.stack([t[:, :i], t[:, i:]], dim=2).reshape(t.shape)


def _deinterleave_rows(t: torch.Tensor) -> torch.Tensor:
    """gpt-oss rows (gate j at 2j, up j at 2j+1) -> [gate; up]."""
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1)


def _quantize_experts(fmt, w: torch.Tensor, name: str):
    """[E, N, K] floating -> (packed [E, N, K/2], block scales, scale_2 fp32 [E]), one expert at a
    time so the fp32 temporaries stay one expert large (a whole layer in fp32 can be tens of GB)."""
    e, n, k = w.shape
    packed = torch.empty(e, n, k // 2, dtype=torch.uint8, device=w.device)
    scales = torch.empty(e, n, k // fmt.block_size, dtype=fmt.scale_dtype, device=w.device)
    scale_2 = torch.ones(e, dtype=torch.float32, device=w.device)
    for x in range(e):
        bad = (~torch.isfinite(w[x])).nonzero()
        if bad.numel():
            _fail(f"{name}: got {bad.shape[0]} non-finite values (NaN/Inf) in expert {x}, first "
                  f"at (row, column) {tuple(bad[0].tolist())}; "
                  "allowed: finite values (4-bit formats cannot represent NaN or Inf)")
        if fmt is NVFP4:
            scale_2[x] = weight_global_scale(w[x])  # ModelOpt: amax(|w_e|) / (6 * 448), 1 if zero
            packed[x], scales[x] = NVFP4.quantize(w[x], scale_2[x])
        else:
            packed[x], scales[x] = MXFP4.quantize(w[x])
    return packed, scales, scale_2


# ---- ModelOpt helpers ------------------------------------------------------------------------


def _mo_get(proj: Mapping, key: str, pname: str, required: bool):
    v = proj.get(key)
    if v is None:
        if required:
            _fail(f"{pname}[{key!r}]: got nothing; allowed: a tensor stacked over experts or a list of one per expert")
        return None
    if isinstance(v, (list, tuple)):
        if not v or not all(isinstance(t, torch.Tensor) for t in v):
            _fail(f"{pname}[{key!r}]: got a list of {[type(t).__name__ for t in v][:4]}; allowed: tensors, one per expert")
        if key in ("weight_scale_2", "input_scale"):
            v = [t.reshape(-1) for t in v]
        try:
            v = torch.stack(list(v))
        except RuntimeError as err:
            _fail(f"{pname}[{key!r}]: per-expert tensors do not stack ({err}); allowed: the same shape for every expert")
    if not isinstance(v, torch.Tensor):
        _fail(f"{pname}[{key!r}]: got {type(v).__name__}; allowed: a tensor or a list of tensors")
    if key in ("weight_scale_2", "input_scale"):
        if v.dim() not in (1, 2) or (v.dim() == 2 and v.shape[1] != 1):
            _fail(f"{pname}[{key!r}]: got shape {tuple(v.shape)}; allowed: one scalar per expert ([E] or [E, 1])")
        v = v.reshape(-1).to(torch.float32)
    return v


def _mo_proj(proj, pname: str) -> dict:
    if not isinstance(proj, Mapping):
        _fail(
            f"{pname}: got {type(proj).__name__}; allowed: a mapping with ModelOpt's names "
            "'weight', 'weight_scale', 'weight_scale_2' (and optional 'input_scale', 'bias')"
        )
    w = _mo_get(proj, "weight", pname, True)
    s = _mo_get(proj, "weight_scale", pname, True)
    if w.dtype != torch.uint8 or w.dim() != 3:
        _fail(f"{pname}['weight']: got {w.dtype} {tuple(w.shape)}; allowed: uint8 [N, K/2] per expert ([E, N, K/2] stacked)")
    if s.dtype == torch.uint8:  # e4m3 bytes stored untyped: same bits
        s = s.view(torch.float8_e4m3fn)
    if s.dtype != torch.float8_e4m3fn or s.dim() != 3:
        _fail(
            f"{pname}['weight_scale']: got {s.dtype} {tuple(s.shape)}; allowed: float8_e4m3fn "
            "[N, K/16] per expert (linear, not swizzled)"
        )
    e = w.shape[0]
    out = {"weight": w, "weight_scale": s}
    for key in ("weight_scale_2", "input_scale"):
        v = _mo_get(proj, key, pname, key == "weight_scale_2")
        if v is not None and v.shape[0] != e:
            _fail(f"{pname}[{key!r}]: got {v.shape[0]} experts; allowed: E = {e}, as {pname}['weight']")
        out[key] = v
    b = _mo_get(proj, "bias", pname, False)
    if b is not None and (b.dim() != 2 or tuple(b.shape) != (e, w.shape[1])):
        _fail(f"{pname}['bias']: got {tuple(b.shape)}; allowed: [N] = [{w.shape[1]}] per expert")
    out["bias"] = b
    return out


# ---- b12x helpers ----------------------------------------------------------------------------


def _b12x_sf_linear(sf: torch.Tensor, name: str, e: int, rows: int, cols: int) -> torch.Tensor:
    """b12x block scales (6-D MMA view, or expert-major 128x4-swizzled storage) -> linear [E, rows, cols]."""
    if not isinstance(sf, torch.Tensor):
        _fail(f"{name}: got {type(sf).__name__}; allowed: a tensor")
    r_pad, c_pad = -(-rows // 128) * 128, -(-cols // 4) * 4
    mma = (32, 4, r_pad // 128, 4, c_pad // 4, e)
    if tuple(sf.shape) == mma:
        # FlashInfer's convert_sf_to_mma_layout: storage [E, r_tile, c_tile, 32, 4, 4] viewed as
        # (32, 4, r_tile, 4, c_tile, E); undo the view to get the storage order back.
        sf = sf.permute(5, 2, 4, 0, 1, 3).contiguous()
    elif sf.numel() == e * r_pad * c_pad and sf.is_contiguous():
        pass  # [E, R_pad, C_pad], [E * R_pad, C_pad] or flat: all the same bytes
    else:
        _fail(
            f"{name}: got shape {tuple(sf.shape)}; allowed: FlashInfer's 6-D MMA view {mma} or "
            f"contiguous 128x4-swizzled storage of E x {r_pad} x {c_pad} scales"
        )
    return unswizzle_scales_128x4(sf.reshape(e, r_pad * c_pad), rows, cols)


def _b12x_sf_mma(linear: torch.Tensor) -> torch.Tensor:
    """Linear [E, rows, cols] -> FlashInfer's 6-D MMA view (32, 4, r_tile, 4, c_tile, E)."""
    e = linear.shape[0]
    swz = swizzle_scales_128x4(linear)
    r_pad, c_pad = swz.shape[1], swz.shape[2]
    return swz.view(e, r_pad // 128, c_pad // 4, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)


def _b12x_vec(t, name: str, e: int, device) -> Optional[torch.Tensor]:
    """A b12x per-expert scale ([E], or one value broadcast as FlashInfer does) -> fp32 [E]."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or t.numel() not in (1, e) or (t.numel() == e and t.dim() != 1):
        _fail(f"{name}: got {_shape(t)}; allowed: a tensor [E] = [{e}] or a single value")
    return t.to(device=device, dtype=torch.float32).reshape(-1).expand(e).contiguous()


_B12X_QUANT_MODES = {"w4a16": "w4a16", "w4a4": "w4a4", "nvfp4": "w4a4", "mxfp4": "w4a4"}


@dataclass(eq=False)
class MoEWeights:
    weight_format: str
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w13_scale_2: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w2_scale_2: torch.Tensor
    w13_bias: Optional[torch.Tensor] = None
    w2_bias: Optional[torch.Tensor] = None
    input_scale: Optional[torch.Tensor] = None
    fc2_input_scale: Optional[torch.Tensor] = None
    local_expert_offset: int = 0
    num_experts: Optional[int] = None
    # Kernel-private derived data (repacked weights, compiled handles), keyed by kernel name.
    # Not an __init__ argument, so dataclasses.replace() gives the copy an empty cache: a copy
    # with one tensor replaced (replace(w, w2_bias=b)) never sees the original's repack.
    kernel_cache: dict = field(default_factory=dict, repr=False, init=False)

    def __post_init__(self):
        if self.num_experts is None:
            self.num_experts = self.local_expert_offset + self.w13.shape[0]

    @property
    def num_local_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.w2.shape[1]

    @property
    def intermediate(self) -> int:
        return self.w2.shape[2] * 2

    @property
    def gated(self) -> bool:
        """True when w13 holds [gate; up] (2I rows); False for relu2 weights (I rows)."""
        return self.w13.shape[1] == 2 * self.intermediate

    @property
    def has_bias(self) -> bool:
        return self.w13_bias is not None or self.w2_bias is not None

    @property
    def device(self) -> torch.device:
        return self.w13.device

    @property
    def block_size(self) -> int:
        return get_format(self.weight_format).block_size

    # ---- consistency -----------------------------------------------------------------------

    def validate(self) -> "MoEWeights":
        """Check the canonical layout (shapes, dtypes, devices, EP range) and the scale and
        bias values (see _check_values); returns self.

        Every constructor here calls it; call it after building a MoEWeights by hand. The value
        checks read the scales and biases (one host sync on a GPU), never the codes.
        """
        fmt = get_format(self.weight_format)
        bs = fmt.block_size
        for name in ("w13", "w2"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 3:
                _fail(f"{name}: got {_desc(t)}; allowed: uint8 [E, rows, K/2] packed e2m1")
        e, n1, h_half = self.w13.shape
        h, i = self.hidden, self.intermediate
        if self.w2.shape[0] != e:
            _fail(f"w2: got {self.w2.shape[0]} experts {tuple(self.w2.shape)}; allowed: E = {e}, as w13")
        if h_half * 2 != h:
            _fail(f"w13: got {tuple(self.w13.shape)}; allowed: last dim H/2 = {h // 2} (H = {h} from w2)")
        if n1 not in (i, 2 * i):
            _fail(f"w13: got {n1} rows; allowed: 2I = {2 * i} ([gate; up]) or I = {i} (relu2), I = {i} from w2")
        if h % bs or i % bs:
            _fail(f"weights: got H = {h}, I = {i}; allowed: multiples of the {fmt.name} block size {bs}")
        for name, want in (("w13_scale", (e, n1, h // bs)), ("w2_scale", (e, h, i // bs))):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != fmt.scale_dtype or tuple(t.shape) != want:
                _fail(f"{name}: got {_desc(t)}; allowed: {fmt.scale_dtype} {list(want)}")
        vectors = (("w13_scale_2", (e,)), ("w2_scale_2", (e,)), ("w13_bias", (e, n1)),
                   ("w2_bias", (e, h)), ("input_scale", (e,)), ("fc2_input_scale", (e,)))
        for name, want in vectors:
            t = getattr(self, name)
            if t is None and name in ("w13_scale_2", "w2_scale_2"):
                _fail(f"{name}: got None; allowed: float32 {list(want)}")
            if t is not None and (not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != want):
                _fail(f"{name}: got {_desc(t)}; allowed: float32 {list(want)} or None")
        for name in ("w13_scale", "w13_scale_2", "w2", "w2_scale", "w2_scale_2", "w13_bias", "w2_bias",
                     "input_scale", "fc2_input_scale"):
            t = getattr(self, name)
            if t is not None and t.device != self.device:
                _fail(f"{name}: got device {t.device}; allowed: {self.device}, as w13")
        if self.local_expert_offset < 0 or self.num_experts < self.local_expert_offset + e:
            _fail(
                f"local_expert_offset/num_experts: got {self.local_expert_offset}/{self.num_experts} "
                f"for {e} local experts; allowed: 0 <= offset and offset + E_local <= num_experts"
            )
        self._check_values()
        return self

    def _check_values(self) -> None:
        """Scales and biases hold values every path computes with: block scales not NaN (e4m3
        0x7F/0xFF, e8m0 0xFF), global and activation scales positive and finite, biases finite.
        Each bad field is named with its first bad expert."""
        fmt = get_format(self.weight_format)
        for name in ("w13_scale", "w2_scale"):
            t = getattr(self, name)
            nan = (t == E8M0_NAN) if fmt is MXFP4 else torch.isnan(t.float())
            _first_bad(name, nan, f"no NaN block scales ({'byte 255' if fmt is MXFP4 else 'e4m3 NaN'})")
        for name in ("w13_scale_2", "w2_scale_2", "input_scale", "fc2_input_scale"):
            t = getattr(self, name)
            if t is not None:
                _first_bad(name, ~(torch.isfinite(t) & (t > 0)), "positive finite scales")
        for name in ("w13_bias", "w2_bias"):
            t = getattr(self, name)
            if t is not None:
                _first_bad(name, ~torch.isfinite(t), "finite values")

    # ---- from a checkpoint folder ------------------------------------------------------------

    @classmethod
    def from_checkpoint(cls, path, layer: int, *, weight_format: Optional[str] = None, device=None) -> "MoEWeights":
        """The experts of MoE layer `layer` of a checkpoint folder (ModelOpt / compressed-tensors
        NVFP4, gpt-oss MXFP4 or bf16); moe_common.checkpoint.from_checkpoint documents it."""
        from .checkpoint import from_checkpoint  # checkpoint.py imports this module

        return from_checkpoint(path, layer, weight_format=weight_format, device=device)

    # ---- from bf16 -------------------------------------------------------------------------

    @classmethod
    def quantize(
        cls,
        w13: torch.Tensor,
        w2: torch.Tensor,
        *,
        weight_format: str = "nvfp4",
        w13_bias: Optional[torch.Tensor] = None,
        w2_bias: Optional[torch.Tensor] = None,
        input_scale: Scale = None,
        fc2_input_scale: Scale = None,
        local_expert_offset: int = 0,
        num_experts: Optional[int] = None,
    ) -> "MoEWeights":
        """Quantize floating weights: w13 [E, 2I, H] rows [gate; up] (or [E, I, H] for relu2), w2 [E, H, I].

        NVFP4: per expert, scale_2 = amax(|w_e|) / (6*448) over the whole w13[e] (resp. w2[e]),
        1 for an all-zero expert (ModelOpt's rule), then the block rule with gs = scale_2.
        MXFP4: e8m0 block scales, scale_2 = 1, no activation scales.
        input_scale / fc2_input_scale: None, a float for every expert, or an [E] tensor.
        """
        fmt = get_format(weight_format)
        bs = fmt.block_size
        for name, t in (("w13", w13), ("w2", w2)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 3:
                _fail(f"{name}: got {_desc(t)}; allowed: a floating 3-D tensor")
        e, n1, h = w13.shape
        if w2.shape[0] != e:
            _fail(f"w2: got {w2.shape[0]} experts {tuple(w2.shape)}; allowed: E = {e}, as w13")
        if w2.shape[1] != h:
            _fail(f"w2: got shape {tuple(w2.shape)}; allowed: [E, H, I] with H = {h} (w13's last dim)")
        i = w2.shape[2]
        if n1 not in (2 * i, i):
            _fail(
                f"w13: got shape {tuple(w13.shape)}; allowed: [E, 2I, H] ([gate; up]) or [E, I, H] "
                f"(relu2) with I = {i} from w2"
            )
        if h % bs:
            _fail(f"w13: got H = {h}; allowed: a multiple of the {fmt.name} block size {bs}")
        if i % bs:
            _fail(f"w2: got I = {i}; allowed: a multiple of the {fmt.name} block size {bs}")
        if w2.device != w13.device:
            _fail(f"w2: got device {w2.device}; allowed: {w13.device}, as w13")
        dev = w13.device
        if fmt is MXFP4:
            for name, v in (("input_scale", input_scale), ("fc2_input_scale", fc2_input_scale)):
                if v is not None:
                    _fail(f"{name}: got {_shape(v)}; allowed: None for mxfp4 (MXFP4 activations carry e8m0 block scales only)")
        q13, sc13, s13 = _quantize_experts(fmt, w13, "w13")
        q2, sc2, s2 = _quantize_experts(fmt, w2, "w2")
        return cls(
            weight_format=fmt.name,
            w13=q13, w13_scale=sc13, w13_scale_2=s13,
            w2=q2, w2_scale=sc2, w2_scale_2=s2,
            w13_bias=_bias(w13_bias, "w13_bias", (e, n1), dev),
            w2_bias=_bias(w2_bias, "w2_bias", (e, h), dev),
            input_scale=_per_expert(input_scale, "input_scale", e, dev),
            fc2_input_scale=_per_expert(fc2_input_scale, "fc2_input_scale", e, dev),
            local_expert_offset=local_expert_offset,
            num_experts=num_experts,
        ).validate()

    def dequantize(self):
        """(w13 fp32 [E, N1, H], w2 fp32 [E, H, I]): e2m1 * block scale * scale_2."""
        fmt = get_format(self.weight_format)
        w13 = fmt.dequantize(self.w13, self.w13_scale, self.w13_scale_2.float()[:, None])
        w2 = fmt.dequantize(self.w2, self.w2_scale, self.w2_scale_2.float()[:, None])
        return w13, w2

    def to(self, device) -> "MoEWeights":
        """A copy with every tensor on `device` and an empty kernel_cache."""
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)

    # ---- activation calibration ------------------------------------------------------------

    def calibrate(
        self,
        x: torch.Tensor,
        topk_ids: Optional[torch.Tensor] = None,
        activation="silu",
        swiglu_alpha: float = Activation.alpha,
        swiglu_beta: float = Activation.beta,
        swiglu_limit: Optional[float] = Activation.limit,
    ) -> "MoEWeights":
        """A copy (sharing the weight tensors) carrying input_scale and fc2_input_scale [E] fp32.

        input_scale[e] = amax(|x|) over the tokens routed to e (every token when topk_ids is None)
        / (6*448); fc2_input_scale[e] = amax(|act|) / (6*448) where act is the bf16-rounded
        activation of FC1 (dequantized weights, fp32, + bias) over the same tokens. An expert
        no token reaches gets the value over all tokens; an amax of 0 gives 1 (no scale).
        MXFP4 weights need no activation global scales: the copy leaves them None.
        `activation` is a name or a moe_common.types.Activation (then swiglu_* are ignored).
        """
        from .activations import apply_activation  # activations.py imports nothing from here
        act = make_activation(activation, swiglu_alpha, swiglu_beta, swiglu_limit)
        if act.gated != self.gated:
            _fail(
                f"activation: got {act.name!r}, but these weights are "
                f"{'gated ([gate; up])' if self.gated else 'non-gated (relu2)'}"
            )
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.hidden:
            _fail(f"x: got {_shape(x)}; allowed: [T, H] with H = {self.hidden}")
        if topk_ids is not None and (
            not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]
        ):
            _fail(f"topk_ids: got {_shape(topk_ids)}; allowed: None or [T, k] with T = {x.shape[0]}")
        if self.weight_format == "mxfp4":
            return dataclasses.replace(self)

        xf = x.to(self.device, torch.float32)
        fmt = get_format(self.weight_format)
        e_loc = self.num_local_experts
        in_amax = torch.empty(e_loc, dtype=torch.float32, device=self.device)
        out_amax = torch.empty_like(in_amax)
        for e in range(e_loc):
            rows = xf
            if topk_ids is not None:
                hit = (topk_ids.to(self.device) == self.local_expert_offset + e).any(dim=1)
                if bool(hit.any()):
                    rows = xf[hit]
            w13_e = fmt.dequantize(self.w13[e], self.w13_scale[e], self.w13_scale_2[e].float())
            h = rows @ w13_e.t()
            if self.w13_bias is not None:
                h = h + self.w13_bias[e]
            y = apply_activation(h, act).to(torch.bfloat16).float()
            in_amax[e] = rows.abs().amax()
            out_amax[e] = y.abs().amax()

        def scale(amax):
            return torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax))

        return dataclasses.replace(
            self, input_scale=scale(in_amax), fc2_input_scale=scale(out_amax)
        )

    # ---- ModelOpt NVFP4 --------------------------------------------------------------------

    @classmethod
    def from_modelopt(
        cls,
        *,
        down: Mapping,
        gate_up: Optional[Mapping] = None,
        gate: Optional[Mapping] = None,
        up: Optional[Mapping] = None,
        local_expert_offset: int = 0,
        num_experts: Optional[int] = None,
    ) -> "MoEWeights":
        """ModelOpt NVFP4 experts (HF names: gate_proj = w1, up_proj = w3, down_proj = w2).

        Each projection is a mapping with ModelOpt's tensor names, each value either a list with
        one tensor per local expert or one tensor stacked over them:
            "weight"          uint8 [N, K/2]           e2m1, element 2i in the low nibble (as ours)
            "weight_scale"    float8_e4m3fn [N, K/16]  linear (row-major), not swizzled
            "weight_scale_2"  fp32 scalar              the weight global scale
            "input_scale"     fp32 scalar, optional    the activation global scale (amax / 2688)
            "bias"            [N], optional
        Give `gate` and `up` (separate), or `gate_up` (fused rows [gate; up]), or `up` alone for
        non-gated (relu2) experts; always `down`.

        One scale_2 covers the fused [gate; up] rows, so separate gate and up must have equal
        weight_scale_2 per expert (ModelOpt exports them tied). Unequal ones raise ValueError:
        folding their ratio into the e4m3 block scales would round, and we only convert exactly.
        Their input_scale (both see the same x) becomes the larger of the two, as vLLM does.
        down's input_scale becomes fc2_input_scale.
        """
        if gate_up is not None and (gate is not None or up is not None):
            _fail("gate_up: got gate_up together with gate/up; allowed: gate_up alone, gate and up, or up alone (relu2)")
        if gate is not None and up is None:
            _fail("up: got None with gate given; allowed: gate and up together, gate_up alone, or up alone (relu2)")
        if gate_up is None and up is None:
            _fail("gate_up/gate/up: got none; allowed: gate_up, or gate and up, or up alone (relu2)")
        d = _mo_proj(down, "down")
        if gate is not None:
            g, u = _mo_proj(gate, "gate"), _mo_proj(up, "up")
            for key in ("weight", "weight_scale"):
                if g[key].shape != u[key].shape:
                    _fail(f"up[{key!r}]: got {tuple(u[key].shape)}; allowed: gate's shape {tuple(g[key].shape)}")
            if not torch.equal(g["weight_scale_2"], u["weight_scale_2"]):
                bad = (g["weight_scale_2"] != u["weight_scale_2"]).nonzero().flatten().tolist()
                e0 = bad[0]
                _fail(
                    f"gate/up: got different weight_scale_2 for experts {bad[:8]} (expert {e0}: gate "
                    f"{g['weight_scale_2'][e0].item():.6g}, up {u['weight_scale_2'][e0].item():.6g}); "
                    "allowed: equal per expert, since one scale_2 covers the fused [gate; up] rows and "
                    "rescaling block scales would not be exact. Requantize from bf16 with "
                    "MoEWeights.quantize, or export with ModelOpt's tied gate/up amax."
                )
            for key in ("input_scale", "bias"):
                if (g[key] is None) != (u[key] is None):
                    _fail(f"gate/up: got {key!r} for only one of them; allowed: both or neither")
            fc1 = {
                "weight": torch.cat([g["weight"], u["weight"]], dim=1),
                "weight_scale": torch.cat([g["weight_scale"], u["weight_scale"]], dim=1),
                "weight_scale_2": g["weight_scale_2"],
                "input_scale": None if g["input_scale"] is None else torch.maximum(g["input_scale"], u["input_scale"]),
                "bias": None if g["bias"] is None else torch.cat([g["bias"], u["bias"]], dim=1),
            }
        else:
            fc1 = _mo_proj(gate_up if gate_up is not None else up, "gate_up" if gate_up is not None else "up")
        e = fc1["weight"].shape[0]
        if d["weight"].shape[0] != e:
            _fail(f"down['weight']: got {d['weight'].shape[0]} experts; allowed: E = {e}, as gate/up")
        dev = fc1["weight"].device
        return cls(
            weight_format="nvfp4",
            w13=fc1["weight"].contiguous(), w13_scale=fc1["weight_scale"].contiguous(),
            w13_scale_2=fc1["weight_scale_2"].to(dev).contiguous(),
            w2=d["weight"].contiguous(), w2_scale=d["weight_scale"].contiguous(),
            w2_scale_2=d["weight_scale_2"].to(dev).contiguous(),
            w13_bias=None if fc1["bias"] is None else fc1["bias"].float().contiguous(),
            w2_bias=None if d["bias"] is None else d["bias"].float().contiguous(),
            input_scale=None if fc1["input_scale"] is None else fc1["input_scale"].to(dev).contiguous(),
            fc2_input_scale=None if d["input_scale"] is None else d["input_scale"].to(dev).contiguous(),
            local_expert_offset=local_expert_offset,
            num_experts=num_experts,
        ).validate()

    def to_modelopt(self, fused: bool = False) -> dict:
        """The inverse of from_modelopt: {"gate", "up", "down"} (or {"gate_up", "down"} when fused,
        {"up", "down"} for relu2), each a dict of tensors stacked over the local experts.
        Optional entries (input_scale, bias) appear only when set. NVFP4 only.
        """
        if self.weight_format != "nvfp4":
            _fail(f"weight_format: got {self.weight_format!r}; allowed: 'nvfp4' (ModelOpt NVFP4 export)")

        def proj(w, s, s2, inp, bias, rows=slice(None)):
            out = {"weight": w[:, rows].contiguous(), "weight_scale": s[:, rows].contiguous(),
                   "weight_scale_2": s2.clone()}
            if inp is not None:
                out["input_scale"] = inp.clone()
            if bias is not None:
                out["bias"] = bias[:, rows].contiguous()
            return out

        fc1 = (self.w13, self.w13_scale, self.w13_scale_2, self.input_scale, self.w13_bias)
        res = {"down": proj(self.w2, self.w2_scale, self.w2_scale_2, self.fc2_input_scale, self.w2_bias)}
        if not self.gated:
            res["up"] = proj(*fc1)
        elif fused:
            res["gate_up"] = proj(*fc1)
        else:
            i = self.intermediate
            res["gate"] = proj(*fc1, rows=slice(0, i))
            res["up"] = proj(*fc1, rows=slice(i, 2 * i))
        return res

    # ---- FlashInfer SM12x (b12x) -----------------------------------------------------------

    @classmethod
    def from_b12x(
        cls,
        w1_weight: torch.Tensor,
        w1_weight_sf: torch.Tensor,
        w2_weight: torch.Tensor,
        w2_weight_sf: torch.Tensor,
        *,
        w1_alpha: Optional[torch.Tensor] = None,
        w2_alpha: Optional[torch.Tensor] = None,
        fc2_input_scale: Optional[torch.Tensor] = None,
        input_global_scale: Optional[torch.Tensor] = None,
        quant_mode: str = "w4a4",
        weight_format: Optional[str] = None,
        input_scales_are_reciprocal: bool = False,
        w2_scale_2: Optional[torch.Tensor] = None,
        local_expert_offset: int = 0,
        num_experts: Optional[int] = None,
    ) -> "MoEWeights":
        """The weights `flashinfer.b12x_fused_moe` takes, under the same argument names.

        w1_weight uint8 [E, 2I, H/2] with halves [up; gate] (ours is [gate; up]; swapped here),
        or [E, I, H/2] for relu2; w2_weight uint8 [E, H, I/2]. Block scales: FlashInfer's 6-D
        MMA view (32, 4, ceil(R/128), 4, ceil(C/4), E) from `convert_sf_to_mma_layout`, or the
        contiguous expert-major 128x4-swizzled storage under it ([E, R_pad, C_pad]); e4m3 for
        NVFP4, uint8 e8m0 for MXFP4 (`weight_format` None infers it from that dtype).

        What the scales mean depends on the mode they were prepared for (`quant_mode`: "w4a16",
        or "w4a4" = FlashInfer's "nvfp4" / "mxfp4"); we store what the kernel computes:
          w4a16 (NVFP4): w1_alpha, w2_alpha are the weight global scales (ModelOpt weight_scale_2);
            input_global_scale / fc2_input_scale, if given, are kept as input_scale /
            fc2_input_scale (FlashInfer ignores them in this mode).
          w4a4 (NVFP4): activations are quantized with divisor-form global scales (block scale =
            amax / (6 * gs), q = v / (s * gs)), i.e. ModelOpt input_scale values:
            input_global_scale (FC1 input) -> input_scale; w1_alpha is then the FC1 weight scale
            (FlashInfer multiplies the two into the epilogue alpha). Without input_global_scale
            FlashInfer uses w1_alpha for both roles, so input_scale = w1_alpha and w13_scale_2 = 1.
            fc2_input_scale (required) -> fc2_input_scale, and w2_alpha = fc2_input_scale *
            weight_scale_2(down): w2_scale_2 = w2_alpha / fc2_input_scale, whose product with
            fc2_input_scale is w2_alpha again (all the kernel sees) but which can be one ulp off
            the checkpoint's value; pass that value as `w2_scale_2` for a bitwise-exact import.
          MXFP4: alphas must be 1 (or None); the activation scales are ignored, as FlashInfer does.
        input_scales_are_reciprocal=True: input_global_scale / fc2_input_scale are 1/input_scale
        (multiplier form, FlashInfer's launch_sm120_moe flag of that name); they are inverted.
        """
        mode = _B12X_QUANT_MODES.get(quant_mode)
        if mode is None:
            _fail(f"quant_mode: got {quant_mode!r}; allowed: {', '.join(_B12X_QUANT_MODES)}")
        for name, t in (("w1_weight", w1_weight), ("w2_weight", w2_weight)):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 3:
                _fail(f"{name}: got {_desc(t)}; allowed: uint8 [E, rows, K/2]")
        if weight_format is None:
            sf_dtype = getattr(w1_weight_sf, "dtype", None)
            if sf_dtype == torch.float8_e4m3fn:
                weight_format = "nvfp4"
            elif sf_dtype == torch.uint8 or str(sf_dtype) == "torch.float8_e8m0fnu":
                weight_format = "mxfp4"
            else:
                _fail(f"w1_weight_sf: got dtype {sf_dtype}; allowed: float8_e4m3fn (NVFP4) or uint8 / float8_e8m0fnu (MXFP4)")
        fmt = get_format(weight_format)
        if quant_mode in WEIGHT_FORMATS and quant_mode != fmt.name:
            _fail(f"quant_mode: got {quant_mode!r} for {fmt.name} weights; allowed: 'w4a16', 'w4a4' or {fmt.name!r}")
        e, n1, h_half = w1_weight.shape
        h, i = 2 * h_half, 2 * w2_weight.shape[2]
        if w2_weight.shape[0] != e or w2_weight.shape[1] != h:
            _fail(f"w2_weight: got {tuple(w2_weight.shape)}; allowed: [E, H, I/2] = [{e}, {h}, I/2]")
        if n1 not in (i, 2 * i):
            _fail(f"w1_weight: got {n1} rows; allowed: 2I = {2 * i} ([up; gate]) or I = {i} (relu2)")
        bs = fmt.block_size
        if h % bs or i % bs:
            _fail(f"w1_weight/w2_weight: got H = {h}, I = {i}; allowed: multiples of the {fmt.name} block size {bs}")

        def linear_sf(sf, name, rows, cols):
            raw = sf.view(torch.uint8) if sf.dtype != torch.uint8 else sf
            lin = _b12x_sf_linear(raw, name, e, rows, cols)
            return lin.view(fmt.scale_dtype) if fmt.scale_dtype != torch.uint8 else lin

        w13 = w1_weight
        w13_sf = linear_sf(w1_weight_sf, "w1_weight_sf", n1, h // bs)
        w2_sf = linear_sf(w2_weight_sf, "w2_weight_sf", h, i // bs)
        if n1 == 2 * i:
            w13, w13_sf = _swap_halves(w13, i), _swap_halves(w13_sf, i)
        dev = w1_weight.device
        a1 = _b12x_vec(w1_alpha, "w1_alpha", e, dev)
        a2 = _b12x_vec(w2_alpha, "w2_alpha", e, dev)
        igs = _b12x_vec(input_global_scale, "input_global_scale", e, dev)
        fc2 = _b12x_vec(fc2_input_scale, "fc2_input_scale", e, dev)
        if input_scales_are_reciprocal:
            igs = None if igs is None else 1.0 / igs
            fc2 = None if fc2 is None else 1.0 / fc2
        ones = torch.ones(e, dtype=torch.float32, device=dev)
        if fmt is MXFP4:
            for name, a in (("w1_alpha", a1), ("w2_alpha", a2)):
                if a is not None and not bool(torch.all(a == 1)):
                    _fail(f"{name}: got values other than 1 for MXFP4 weights; allowed: 1 or None (e8m0 scales carry the range)")
            s13, s2, igs, fc2 = ones, ones.clone(), None, None
        else:
            for name, a in (("w1_alpha", a1), ("w2_alpha", a2)):
                if a is None:
                    _fail(f"{name}: got None; allowed: a tensor [E] = [{e}] (NVFP4 needs its global scales)")
            if mode == "w4a16":
                s13, s2 = a1, a2
            else:
                if fc2 is None:
                    _fail("fc2_input_scale: got None; allowed: a tensor [E] (required for quant_mode 'w4a4'/'nvfp4')")
                if igs is None:  # FlashInfer's dual use: w1_alpha quantizes FC1's input and is its alpha
                    s13, igs = ones, a1
                else:
                    s13 = a1
                if w2_scale_2 is not None:
                    s2 = _b12x_vec(w2_scale_2, "w2_scale_2", e, dev)
                    if not torch.equal(fc2 * s2, a2):
                        _fail(
                            "w2_scale_2: got values whose product with fc2_input_scale is not "
                            "w2_alpha; allowed: down's weight_scale_2"
                        )
                else:
                    # Only the product reaches the kernel, so the factor is known up to the
                    # product's rounding: fp32(fc2 * (a2 / fc2)) == a2 (the test checks it), but
                    # a2 / fc2 can be one ulp off the checkpoint's weight_scale_2.
                    s2 = a2 / fc2
        return cls(
            weight_format=fmt.name,
            w13=w13.contiguous(), w13_scale=w13_sf.contiguous(), w13_scale_2=s13.contiguous(),
            w2=w2_weight.contiguous(), w2_scale=w2_sf.contiguous(), w2_scale_2=s2.contiguous(),
            input_scale=igs, fc2_input_scale=fc2,
            local_expert_offset=local_expert_offset,
            num_experts=num_experts,
        ).validate()

    def to_b12x(self, quant_mode: str = "w4a4", input_scales_are_reciprocal: bool = False) -> dict:
        """The inverse of from_b12x: keyword arguments for `flashinfer.b12x_fused_moe`.

        Returns w1_weight ([up; gate] halves), w1_weight_sf / w2_weight_sf (FlashInfer's 6-D MMA
        view, zero padded to 128 rows x 4 scale columns), w2_weight, w1_alpha, w2_alpha,
        fc2_input_scale, input_global_scale and quant_mode (FlashInfer's spelling). NVFP4 w4a4
        uses the decoupled form (w1_alpha = w13_scale_2, input_global_scale = input_scale, both
        exact) and needs input_scale and fc2_input_scale. b12x takes no biases.
        """
        mode = _B12X_QUANT_MODES.get(quant_mode)
        if mode is None:
            _fail(f"quant_mode: got {quant_mode!r}; allowed: {', '.join(_B12X_QUANT_MODES)}")
        if self.has_bias:
            _fail("weights: got biases; allowed: none (FlashInfer's b12x MoE takes no bias)")
        i = self.intermediate
        w1, w1_sf = self.w13, self.w13_scale
        if self.gated:
            w1, w1_sf = _swap_halves(w1, i), _swap_halves(w1_sf, i)
        out = {
            "w1_weight": w1.contiguous(),
            "w1_weight_sf": _b12x_sf_mma(w1_sf),
            "w2_weight": self.w2.contiguous(),
            "w2_weight_sf": _b12x_sf_mma(self.w2_scale),
        }

        def form(t):
            if t is None:
                return None
            return 1.0 / t if input_scales_are_reciprocal else t.clone()

        if self.weight_format == "mxfp4":
            ones = torch.ones(self.num_local_experts, dtype=torch.float32, device=self.device)
            out.update(w1_alpha=ones, w2_alpha=ones.clone(), fc2_input_scale=None,
                       input_global_scale=None, quant_mode="mxfp4" if mode == "w4a4" else "w4a16")
            return out
        if mode == "w4a16":
            out.update(w1_alpha=self.w13_scale_2.clone(), w2_alpha=self.w2_scale_2.clone(),
                       fc2_input_scale=form(self.fc2_input_scale),
                       input_global_scale=form(self.input_scale), quant_mode="w4a16")
            return out
        missing = [n for n in ("input_scale", "fc2_input_scale") if getattr(self, n) is None]
        if missing:
            _fail(f"{' and '.join(missing)}: got None; allowed: set (b12x w4a4 quantizes activations; call calibrate(x) first)")
        out.update(w1_alpha=self.w13_scale_2.clone(),
                   w2_alpha=self.fc2_input_scale * self.w2_scale_2,
                   fc2_input_scale=form(self.fc2_input_scale),
                   input_global_scale=form(self.input_scale), quant_mode="nvfp4")
        return out

    # ---- gpt-oss MXFP4 ---------------------------------------------------------------------

    @classmethod
    def from_gpt_oss(
        cls,
        gate_up_proj_blocks: torch.Tensor,
        gate_up_proj_scales: torch.Tensor,
        down_proj_blocks: torch.Tensor,
        down_proj_scales: torch.Tensor,
        gate_up_proj_bias: Optional[torch.Tensor] = None,
        down_proj_bias: Optional[torch.Tensor] = None,
        *,
        local_expert_offset: int = 0,
        num_experts: Optional[int] = None,
    ) -> "MoEWeights":
        """gpt-oss MXFP4 experts (HF checkpoint names, `mlp.experts.*`).

        *_blocks uint8 [E, rows, K/32, 16]: 16 bytes per 32-element block, element 2j of a block in
        the low nibble of its byte j (HF transformers' convert_moe_packed_tensors), which is our
        packing once the last two dims are merged. *_scales uint8 [E, rows, K/32]: e8m0 bytes,
        value 2^(b-127), used as they are. gate_up rows are interleaved (row 2j = gate j, row
        2j+1 = up j; the model splits gate_up[..., ::2] / [..., 1::2]) and become [gate; up].
        Biases [E, 2I] (interleaved the same way) and [E, H] are stored as fp32 (exact).
        """
        def blocks(t, s, name):
            if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 4 or t.shape[-1] != 16:
                _fail(f"{name}_blocks: got {_desc(t)}; allowed: uint8 [E, rows, K/32, 16]")
            if isinstance(s, torch.Tensor) and str(s.dtype) == "torch.float8_e8m0fnu":
                s = s.view(torch.uint8)
            if not isinstance(s, torch.Tensor) or s.dtype != torch.uint8 or tuple(s.shape) != tuple(t.shape[:3]):
                _fail(f"{name}_scales: got {_desc(s)}; allowed: uint8 {list(t.shape[:3])}")
            return t.reshape(*t.shape[:2], t.shape[2] * 16), s

        w13, s13 = blocks(gate_up_proj_blocks, gate_up_proj_scales, "gate_up_proj")
        w2, s2 = blocks(down_proj_blocks, down_proj_scales, "down_proj")
        e, n1 = w13.shape[:2]
        if n1 % 2:
            _fail(f"gate_up_proj_blocks: got {n1} rows; allowed: an even number (gate and up interleaved)")
        h, i = w13.shape[2] * 2, n1 // 2  # w13/w2 are packed now: [E, 2I, H/2], [E, H', I'/2]
        if w2.shape[0] != e or w2.shape[1] != h or w2.shape[2] * 2 != i:
            _fail(
                f"down_proj_blocks: got {tuple(down_proj_blocks.shape)}; allowed: [E, H, I/32, 16] = "
                f"[{e}, {h}, {i // 32}, 16] (from gate_up_proj_blocks)"
            )
        dev = w13.device
        b13 = _bias(gate_up_proj_bias, "gate_up_proj_bias", (e, n1), dev)
        return cls(
            weight_format="mxfp4",
            w13=_deinterleave_rows(w13).contiguous(), w13_scale=_deinterleave_rows(s13).contiguous(),
            w13_scale_2=torch.ones(e, dtype=torch.float32, device=dev),
            w2=w2.contiguous(), w2_scale=s2.contiguous(),
            w2_scale_2=torch.ones(e, dtype=torch.float32, device=dev),
            w13_bias=None if b13 is None else _deinterleave_rows(b13).contiguous(),
            w2_bias=_bias(down_proj_bias, "down_proj_bias", (e, w2.shape[1]), dev),
            local_expert_offset=local_expert_offset,
            num_experts=num_experts,
        ).validate()

    def to_gpt_oss(self) -> dict:
        """The inverse of from_gpt_oss (MXFP4, gated): the six gpt-oss expert tensors by name.
        Biases come back as fp32 (None where this object has none)."""
        if self.weight_format != "mxfp4" or not self.gated:
            _fail(
                f"weights: got {self.weight_format} {'gated' if self.gated else 'relu2'}; allowed: "
                "mxfp4 gated weights (gpt-oss layout)"
            )
        e, i = self.num_local_experts, self.intermediate
        w13 = _interleave_rows(self.w13, i)
        return {
            "gate_up_proj_blocks": w13.reshape(e, 2 * i, -1, 16).contiguous(),
            "gate_up_proj_scales": _interleave_rows(self.w13_scale, i).contiguous(),
            "gate_up_proj_bias": None if self.w13_bias is None else _interleave_rows(self.w13_bias, i).contiguous(),
            "down_proj_blocks": self.w2.reshape(e, self.hidden, -1, 16).contiguous(),
            "down_proj_scales": self.w2_scale.clone(),
            "down_proj_bias": None if self.w2_bias is None else self.w2_bias.clone(),
        }
