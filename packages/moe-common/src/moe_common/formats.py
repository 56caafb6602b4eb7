"""The 4-bit weight/activation formats, in torch, exactly as docs/DESIGN.md section 5 defines them.

Everything here computes in fp32 and works on CPU and CUDA tensors without reading tensor values
on the host (no .item(), no data-dependent shapes), so quantize/dequantize can run inside a CUDA
graph once their small lookup table exists on the device.

e2m1 (the 4-bit element of both formats): bit 3 sign, bits 2..1 exponent (bias 1), bit 0 mantissa.
Magnitude codes 0..7 are {0, 0.5, 1, 1.5, 2, 3, 4, 6}; code | 8 is the negative. Two codes are
packed per byte, element 2i in the LOW nibble of byte i (ModelOpt, gpt-oss, FlashInfer agree).

NVFP4: blocks of 16 along the last dim, one e4m3 scale per block, one fp32 global scale gs
(ModelOpt's weight_scale_2 for weights, its input_scale for activations; both ~ amax / 2688):
    s = e4m3_rn_satfinite(min(amax_block / (6 * gs), 448))
    q = e2m1_rn_satfinite(v / (s * gs)), and q = 0 where s == 0
    value = q * s * gs
MXFP4 (OCP MX): blocks of 32, one e8m0 byte b per block (value 2^(b - 127)), no global scale:
    e = ceil(log2(amax_block / 6)), b = clamp(e + 127, 0, 254), b = 0 for an all-zero block
    q = e2m1_rn_satfinite(v / 2^(b - 127)), value = q * 2^(b - 127)

Also here: the 128x4 scale-factor interleave of CUTLASS/FlashInfer ("swizzled" scales), because
it is a property of how block scales are stored, not of any one checkpoint.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0
E8M0_BIAS = 127
E8M0_NAN = 255  # the e8m0 NaN encoding (no Inf exists)

# Magnitudes of e2m1 codes 0..7; code c | 8 is -E2M1_VALUES[c].
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

GlobalScale = Optional[Union[float, torch.Tensor]]

# --------------------------------------------------------------------------------------------
# e2m1 elements
# --------------------------------------------------------------------------------------------

# One 16-entry decode table per device: creating it is a host->device copy, which must not happen
# on every call (nor inside a CUDA graph capture), so it is made once per device.
_E2M1_LUT: dict = {}


def _e2m1_lut(device: torch.device) -> torch.Tensor:
    lut = _E2M1_LUT.get(device)
    if lut is None:
        mags = list(E2M1_VALUES)
        lut = torch.tensor(mags + [-m for m in mags], dtype=torch.float32, device=device)
        _E2M1_LUT[device] = lut
    return lut


def e2m1_quantize(v: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to e2m1 codes (uint8 in [0, 16)): nearest, ties to even, saturating.

    Ties go to the code with mantissa bit 0: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
    3.5 -> 4, 5 -> 4; |v| > 6 (and +-inf) saturates to +-6. The sign bit is kept, so a negative
    value that rounds to zero (and -0.0) gives code 8 (-0), as the hardware convert and ModelOpt
    do; e2m1_decode(8) is -0.0. NaN is not a supported input (it currently gives code 0 or 8).
    """
    v = v.float()
    a = v.abs()
    # The magnitude index is the number of rounding thresholds that |v| passes. A threshold is a
    # midpoint between two neighbours; at a tie, `>` keeps the lower (even) code and `>=` moves
    # to the upper one, chosen so the result always has mantissa bit 0 (the even code).
    idx = (
        (a > 0.25).to(torch.uint8)  # 0 | 0.5   tie -> 0   (code 0, even)
        + (a >= 0.75).to(torch.uint8)  # 0.5 | 1   tie -> 1   (code 2)
        + (a > 1.25).to(torch.uint8)  # 1 | 1.5   tie -> 1   (code 2)
        + (a >= 1.75).to(torch.uint8)  # 1.5 | 2   tie -> 2   (code 4)
        + (a > 2.5).to(torch.uint8)  # 2 | 3     tie -> 2   (code 4)
        + (a >= 3.5).to(torch.uint8)  # 3 | 4     tie -> 4   (code 6)
        + (a > 5.0).to(torch.uint8)  # 4 | 6     tie -> 4   (code 6); > 6 saturates to 7
    )
    return idx | (torch.signbit(v).to(torch.uint8) << 3)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (any integer dtype, values in [0, 16)) -> fp32 values."""
    return _e2m1_lut(codes.device)[codes.long()]


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., K] (K even) -> uint8 [..., K/2]; element 2i in the low nibble of byte i."""
    if codes.shape[-1] % 2:
        raise ValueError(f"codes: got last dim {codes.shape[-1]}; allowed: an even number")
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> uint8 codes [..., K] (inverse of pack_e2m1)."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed: got dtype {packed.dtype}; allowed: torch.uint8")
    pairs = torch.stack((packed & 0x0F, packed >> 4), dim=-1)
    return pairs.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


# --------------------------------------------------------------------------------------------
# Scale encodings
# --------------------------------------------------------------------------------------------


def e4m3_round(s: torch.Tensor) -> torch.Tensor:
    """fp32 -> float8_e4m3fn, round to nearest even, saturating at +-448.

    torch's float8_e4m3fn cast rounds to nearest even (subnormals included) but turns values past
    the largest finite into NaN instead of saturating, so clamp first.
    """
    return s.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def e8m0_to_float(b: torch.Tensor) -> torch.Tensor:
    """e8m0 bytes (uint8) -> fp32 2^(b - 127), built from bits so it is exact (b = 255 is NaN)."""
    bits = b.to(torch.int32) << 23  # the byte is exactly an fp32 exponent field
    bits = torch.where(b == 0, torch.full_like(bits, 0x00400000), bits)  # 2^-127 is subnormal
    bits = torch.where(b == E8M0_NAN, torch.full_like(bits, 0x7FC00000), bits)
    return bits.view(torch.float32)


def e8m0_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """MXFP4 block scale byte: ceil(log2(amax / 6)) + 127 clamped to [0, 254]; 0 for amax == 0.

    Computed from the exact binary exponent of amax instead of log2 (whose rounding could cross a
    power of two): with amax = m * 2^p, m in [0.5, 1), amax / 6 > 2^(p-3) iff m > 0.75, so
    ceil(log2(amax / 6)) is p - 2 when m > 0.75 and p - 3 otherwise.
    """
    m, p = torch.frexp(amax.float())
    e = p - 3 + (m > 0.75).to(p.dtype)
    b = (e + E8M0_BIAS).clamp(0, 254)
    b = torch.where(amax == 0, torch.zeros_like(b), b)
    return b.to(torch.uint8)


# --------------------------------------------------------------------------------------------
# Block formats
# --------------------------------------------------------------------------------------------


def _blocks(v: torch.Tensor, block_size: int, name: str) -> torch.Tensor:
    k = v.shape[-1] if v.dim() else 0
    if v.dim() == 0 or k % block_size:
        raise ValueError(
            f"{name}: got shape {tuple(v.shape)}; allowed: last dim a multiple of the block "
            f"size {block_size}"
        )
    return v.reshape(*v.shape[:-1], k // block_size, block_size)


def _global_scale(gs: GlobalScale, lead_shape: torch.Size, device: torch.device) -> torch.Tensor:
    """gs as fp32 broadcastable against the per-block tensors [*lead_shape, n_blocks].

    A python number becomes a 0-dim CPU fp32 tensor: torch lets it join CUDA ops as a scalar
    without a copy, and rounding it to fp32 first makes CPU and CUDA compute the same thing.
    """
    if isinstance(gs, (int, float)):
        return torch.tensor(float(gs), dtype=torch.float32)
    if not isinstance(gs, torch.Tensor):
        raise ValueError(
            f"global_scale: got {type(gs).__name__}; allowed: None, a float, or a tensor "
            f"broadcastable to {tuple(lead_shape)}"
        )
    try:
        ok = torch.broadcast_shapes(gs.shape, lead_shape) == lead_shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"global_scale: got shape {tuple(gs.shape)}; allowed: broadcastable to the input's "
            f"leading dims {tuple(lead_shape)} (per-expert scales for [E, N, K] are [E, 1])"
        )
    gs = gs.float()
    if gs.dim() == 0 and gs.device.type == "cpu":
        return gs
    return gs.to(device).unsqueeze(-1)


def _per_element(gs: torch.Tensor) -> torch.Tensor:
    """A _global_scale result made broadcastable against [..., n_blocks, block_size]."""
    return gs if gs.dim() == 0 else gs.unsqueeze(-1)


def _check_scales(packed: torch.Tensor, scales: torch.Tensor, block_size: int, dtypes) -> None:
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed: got dtype {packed.dtype}; allowed: torch.uint8")
    want = (*packed.shape[:-1], packed.shape[-1] * 2 // block_size)
    if packed.dim() == 0 or (packed.shape[-1] * 2) % block_size or tuple(scales.shape) != want:
        raise ValueError(
            f"scales: got shape {tuple(scales.shape)} for packed {tuple(packed.shape)}; allowed: "
            f"{want} (one scale per {block_size} elements = {block_size // 2} packed bytes)"
        )
    if scales.dtype not in dtypes:
        raise ValueError(
            f"scales: got dtype {scales.dtype}; allowed: {', '.join(str(d) for d in dtypes)}"
        )


def _scaled_blocks(packed: torch.Tensor, scale_values: torch.Tensor, block: int,
                   global_scale: GlobalScale) -> torch.Tensor:
    """e2m1 codes x their fp32 block scale (x the global scale when given), fp32 [..., K]."""
    q = e2m1_decode(unpack_e2m1(packed))
    blocks = q.reshape(*scale_values.shape, block) * scale_values.unsqueeze(-1)
    if global_scale is not None:
        blocks = blocks * _per_element(_global_scale(global_scale, packed.shape[:-1], packed.device))
    return blocks.reshape(q.shape)


class NVFP4:
    """NVFP4: e2m1 elements, an e4m3 scale per 16 along the last dim, an fp32 global scale.

    `global_scale` (gs) is None (= 1), a python float, or a tensor broadcastable to
    v.shape[:-1]: per row [..., N], per expert [E, 1] for [E, N, K] weights, or 0-dim.
    It must be positive and finite; gs and the block scales multiply the value (gs is the
    ModelOpt weight_scale_2 / input_scale, not FlashInfer's reciprocal "global_sf").
    """

    name = "nvfp4"
    block_size = 16
    scale_dtype = torch.float8_e4m3fn

    @classmethod
    def quantize(cls, v: torch.Tensor, global_scale: GlobalScale = None):
        """v [..., K] -> (packed uint8 [..., K/2], scales float8_e4m3fn [..., K/16])."""
        blocks = _blocks(v.float(), cls.block_size, "v")
        gs = _global_scale(1.0 if global_scale is None else global_scale, v.shape[:-1], v.device)
        amax = blocks.abs().amax(dim=-1)
        s = e4m3_round(torch.clamp_max(amax / (E2M1_MAX * gs), E4M3_MAX))
        s32 = s.float()
        q = e2m1_quantize(blocks / _per_element(s32 * gs))
        # A zero scale (all-zero or underflowing block) stores zeros, never v / 0.
        q = torch.where((s32 == 0).unsqueeze(-1), torch.zeros_like(q), q)
        return pack_e2m1(q.reshape(v.shape)), s

    @classmethod
    def dequantize(cls, packed: torch.Tensor, scales: torch.Tensor, global_scale: GlobalScale = None):
        """(packed [..., K/2], scales [..., K/16]) -> fp32 [..., K] = q * s * gs.

        q * s is exact in fp32 (2 + 4 significant bits), so the only rounding is the final * gs.
        """
        _check_scales(packed, scales, cls.block_size, (torch.float8_e4m3fn,))
        return _scaled_blocks(packed, scales.float(), cls.block_size, global_scale)

    @classmethod
    def fake_quantize(cls, v: torch.Tensor, global_scale: GlobalScale = None) -> torch.Tensor:
        """dequantize(quantize(v)): the value a W4A4 kernel feeds its MMA (fp32)."""
        packed, scales = cls.quantize(v, global_scale)
        return cls.dequantize(packed, scales, global_scale)


class MXFP4:
    """MXFP4 (OCP MX): e2m1 elements, an e8m0 byte per 32 along the last dim, no global scale.

    quantize/fake_quantize take `global_scale` only for a uniform call shape with NVFP4 and
    reject anything but None; dequantize multiplies by it when given (MoEWeights' scale_2, which
    is 1 for MXFP4, so the product is exact).
    """

    name = "mxfp4"
    block_size = 32
    scale_dtype = torch.uint8

    @classmethod
    def quantize(cls, v: torch.Tensor, global_scale: GlobalScale = None):
        """v [..., K] -> (packed uint8 [..., K/2], e8m0 bytes uint8 [..., K/32])."""
        if global_scale is not None:
            raise ValueError(
                f"global_scale: got {type(global_scale).__name__}; allowed: None (MXFP4 has no "
                "global scale; its e8m0 block scales carry the range)"
            )
        blocks = _blocks(v.float(), cls.block_size, "v")
        amax = blocks.abs().amax(dim=-1)
        # A block holding NaN or Inf gets the NaN scale byte (OCP MX: X = NaN), so it decodes
        # to NaN instead of finite codes under a clamped scale.
        b = torch.where(torch.isfinite(amax), e8m0_from_amax(amax), E8M0_NAN)
        q = e2m1_quantize(blocks / e8m0_to_float(b).unsqueeze(-1))  # / 2^e is exact
        return pack_e2m1(q.reshape(v.shape)), b

    @classmethod
    def dequantize(cls, packed: torch.Tensor, scales: torch.Tensor, global_scale: GlobalScale = None):
        """(packed [..., K/2], e8m0 [..., K/32]) -> fp32 [..., K] = q * 2^(b - 127) (* gs)."""
        if scales.dtype != torch.uint8 and str(scales.dtype) == "torch.float8_e8m0fnu":
            scales = scales.view(torch.uint8)
        _check_scales(packed, scales, cls.block_size, (torch.uint8,))
        return _scaled_blocks(packed, e8m0_to_float(scales), cls.block_size, global_scale)

    @classmethod
    def fake_quantize(cls, v: torch.Tensor, global_scale: GlobalScale = None) -> torch.Tensor:
        packed, scales = cls.quantize(v, global_scale)
        return cls.dequantize(packed, scales)


FORMATS = {"nvfp4": NVFP4, "mxfp4": MXFP4}


def get_format(weight_format: str):
    """FORMATS[weight_format], or a ValueError naming the allowed formats."""
    fmt = FORMATS.get(weight_format)
    if fmt is None:
        raise ValueError(f"weight_format: got {weight_format!r}; allowed: {', '.join(FORMATS)}")
    return fmt


def weight_global_scale(w: torch.Tensor, dim=None) -> torch.Tensor:
    """ModelOpt's weight_scale_2: amax(|w|) / (6 * 448) in fp32, and 1 where amax is 0.

    `dim` (an int or tuple) reduces only those dims, e.g. dim=(1, 2) gives one scale per expert
    of a stacked [E, N, K] tensor; None reduces everything to a 0-dim tensor.
    """
    a = w.float().abs()
    amax = a.amax() if dim is None else a.amax(dim=dim)
    return torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax))


# --------------------------------------------------------------------------------------------
# The 128x4 scale-factor interleave (CUTLASS "BlockScaledBasicChunk", FlashInfer "swizzled")
# --------------------------------------------------------------------------------------------
#
# A [R, C] matrix of block scales (R rows of the weight, C = K / block_size) is padded with zeros
# to R_pad = ceil(R / 128) * 128 rows and C_pad = ceil(C / 4) * 4 columns and stored as 512-byte
# tiles of 128 rows x 4 columns, tile (r_tile, c_tile) at index r_tile * (C_pad / 4) + c_tile. In a
# tile, scale (r, c) sits at byte (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4). The result is
# returned as [R_pad, C_pad], which is FlashInfer's `fp4_quantize(..., is_sf_swizzled_layout=True)`
# shape; only its flat byte order is meaningful.


def swizzle_scales_128x4(scales: torch.Tensor) -> torch.Tensor:
    """Linear scales [..., R, C] -> 128x4-interleaved [..., R_pad, C_pad] (zero padded)."""
    if scales.dim() < 2:
        raise ValueError(f"scales: got shape {tuple(scales.shape)}; allowed: [..., R, C]")
    dtype = scales.dtype
    *lead, r, c = scales.shape
    r_pad, c_pad = -(-r // 128) * 128, -(-c // 4) * 4
    raw = scales.view(torch.uint8) if dtype != torch.uint8 else scales
    padded = raw.new_zeros((*lead, r_pad, c_pad))
    padded[..., :r, :c] = raw
    # [.., r_tile, r_sub(4), r_in(32), c_tile, c_in(4)] -> [.., r_tile, c_tile, r_in, r_sub, c_in]
    t = padded.reshape(*lead, r_pad // 128, 4, 32, c_pad // 4, 4)
    n = len(lead)
    t = t.permute(*range(n), n, n + 3, n + 2, n + 1, n + 4).contiguous()
    out = t.reshape(*lead, r_pad, c_pad)
    return out.view(dtype) if dtype != torch.uint8 else out


def unswizzle_scales_128x4(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """128x4-interleaved [..., R_pad, C_pad] (or flat [..., R_pad * C_pad]) -> linear [..., rows, cols]."""
    r_pad, c_pad = -(-rows // 128) * 128, -(-cols // 4) * 4
    dtype = swizzled.dtype
    raw = swizzled.view(torch.uint8) if dtype != torch.uint8 else swizzled
    if swizzled.dim() >= 2 and tuple(swizzled.shape[-2:]) == (r_pad, c_pad):
        lead = list(swizzled.shape[:-2])
    elif swizzled.dim() >= 1 and swizzled.shape[-1] == r_pad * c_pad:
        lead = list(swizzled.shape[:-1])
    else:
        raise ValueError(
            f"swizzled: got shape {tuple(swizzled.shape)} for {rows} x {cols} scales; allowed: "
            f"[..., {r_pad}, {c_pad}] or [..., {r_pad * c_pad}] (rows padded to 128, cols to 4)"
        )
    t = raw.reshape(*lead, r_pad // 128, c_pad // 4, 32, 4, 4)
    n = len(lead)
    # [.., r_tile, c_tile, r_in, r_sub, c_in] -> [.., r_tile, r_sub, r_in, c_tile, c_in]
    t = t.permute(*range(n), n, n + 3, n + 2, n + 1, n + 4).contiguous()
    out = t.reshape(*lead, r_pad, c_pad)[..., :rows, :cols].contiguous()
    return out.view(dtype) if dtype != torch.uint8 else out
