"""Layer weights repacked for the kernels: fragment-ordered codes and bf16 scales, on the device.

Every moe-* kernel decodes the same layout (moe_common.fragments, moe_common.cute.fragment_mma),
so the repack is done once per layer and cached in `MoEWeights.kernel_cache` under one key that
all kernels share: a layer served by moe-static at decode and moe-generic at prefill holds one
copy of its packed weights, not two.

Staleness. The cache entry remembers what it was packed from (`Sources`): the tensor objects
themselves (held, so their ids and storage cannot be reused while the entry lives) and torch's
`_version` counter of each, which every in-place edit bumps (also through a view: views share
their base's counter). `pack` repacks when any weight field now holds another tensor, or a held
tensor was edited in place; the check costs one identity and one counter read per field (about
1 us a call, no device work). A copy made with `dataclasses.replace` starts with an empty cache
(MoEWeights.kernel_cache is not an __init__ argument), so two objects that differ in one tensor
never share a repack. Not seen: writes through `tensor.data` or through another library's raw
pointer, which bypass the version counter; call `weights.kernel_cache.clear()` after those.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import get_format
from .fragments import (
    ALPHA_SHIFT, TILE_K, gated_row_order, group_records, mxfp4_scale_range_reason, pad_gated,
    pad_rows,
)
from .weights import MoEWeights

CACHE_KEY = "packed-fragments"
REASON_KEY = "packed-fragments-reason"
# Every MoEWeights field that pack() reads values from.
SOURCE_FIELDS = ("w13", "w13_scale", "w13_scale_2", "w2", "w2_scale", "w2_scale_2", "w13_bias",
                 "w2_bias", "input_scale", "fc2_input_scale")

# Weight rows are padded to 128: moe-generic's largest CTA row tile (4 warps x 2 groups x 16);
# moe-static's slices (128 intermediate columns) and row stages predicate on the real count.
ROW_TILE = 128


def _round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


@dataclass
class Packed:
    """Weights of one layer in fragment order (see moe_common.fragments), on the device.

    w13 and w2 are group records [E, groups / 8, K-tiles, 8, record] (fragments.group_records:
    each 16-row x 128-K group tile's 1 KiB of codes, then its bf16 block scales, K-tile-major in
    blocks of 8 groups; record bytes moe_common.cute.fragment_mma.group_tile_bytes). Gated w13
    rows are in `gated_row_order` (16-row groups of [8 gate; 8 up]), so group g holds
    intermediate columns 8g..8g+7; relu2 w13 group g holds columns 16g..16g+15.
    """

    hidden: int
    intermediate: int
    hidden_padded: int
    intermediate_padded: int
    gated: bool
    w13: torch.Tensor
    w13_bias: torch.Tensor  # fp32 [E, N1p] (zeros without bias), in blob row order
    w2: torch.Tensor
    w2_bias: torch.Tensor  # fp32 [E, Hp]
    fc1_alpha: dict  # quant_mode -> fp32 [E]: weight scale_2 (x input_scale in w4a4) x 2^64
    fc2_alpha: dict  # (the block scales carry 2^62 and decoded codes 2^-126: fragments.py)

    @property
    def fc1_rows(self) -> int:
        return self.w13.shape[1] * self.w13.shape[3] * 16

    @property
    def fc2_rows(self) -> int:
        return self.w2.shape[1] * self.w2.shape[3] * 16


class Sources:
    """What a cache entry was computed from: each field's tensor (or None) and its `_version`."""

    __slots__ = ("tensors", "versions")

    def __init__(self, weights: MoEWeights):
        self.tensors = tuple(getattr(weights, n) for n in SOURCE_FIELDS)
        self.versions = tuple(None if t is None else t._version for t in self.tensors)

    def current(self, weights: MoEWeights) -> bool:
        """True while every field holds the same tensor, unedited since the entry was made."""
        for name, t, v in zip(SOURCE_FIELDS, self.tensors, self.versions):
            now = getattr(weights, name)
            if now is not t or (t is not None and t._version != v):
                return False
        return True


def cached(weights: MoEWeights, key: str, build):
    """weights.kernel_cache[key]'s value while its sources are current, else build(weights)
    (stored with the sources it was built from)."""
    entry = weights.kernel_cache.get(key)
    if entry is not None and entry[0].current(weights):
        return entry[1]
    sources = Sources(weights)  # before building: an edit during the build is seen next call
    value = build(weights)
    weights.kernel_cache[key] = (sources, value)
    return value


def pack(weights: MoEWeights) -> Packed:
    """The layer's packed weights, repacked whenever a weight tensor was replaced or edited."""
    return cached(weights, CACHE_KEY, _pack)


def unpackable_reason(weights: MoEWeights):
    """None when pack() can hold these weights exactly, else why not (MXFP4 block scales
    outside the packed scales' exact range on nonzero blocks). Read once per weights version
    (a host sync for MXFP4 weights, none for NVFP4); validate_inputs puts it in the MoEShape,
    so every kernel declines such weights and the reference runs them."""
    if weights.weight_format != "mxfp4":
        return None
    return cached(weights, REASON_KEY, _unpackable_reason)


def _unpackable_reason(weights: MoEWeights):
    for name, codes, scales in (("w13", weights.w13, weights.w13_scale),
                                ("w2", weights.w2, weights.w2_scale)):
        reason = mxfp4_scale_range_reason(scales, codes)
        if reason is not None:
            return f"weights.{name}: {reason}"
    return None


def _pack(weights: MoEWeights) -> Packed:
    fmt = get_format(weights.weight_format)
    reason = unpackable_reason(weights)
    if reason is not None:
        raise ValueError(f"{reason}; use the torch reference for this layer")
    E, H, I = weights.num_local_experts, weights.hidden, weights.intermediate
    Hp, Ip = _round_up(H, TILE_K), _round_up(I, TILE_K)
    dev = weights.device
    w13, s13 = weights.w13, weights.w13_scale.view(torch.uint8)
    b13 = weights.w13_bias.float() if weights.w13_bias is not None else \
        torch.zeros(E, w13.shape[1], dtype=torch.float32, device=dev)
    if weights.gated:
        order = gated_row_order(I, Ip).to(dev)
        w13, s13, b13 = (pad_gated(t, I, Ip)[:, order] for t in (w13, s13, b13))
    else:
        w13, s13, b13 = (pad_rows(t, ROW_TILE) for t in (w13, s13, b13))
    b2 = weights.w2_bias.float() if weights.w2_bias is not None else \
        torch.zeros(E, H, dtype=torch.float32, device=dev)
    # Activation global scales exist for NVFP4 only (MXFP4 activations carry e8m0 block scales).
    one = torch.ones(E, dtype=torch.float32, device=dev)
    nv = weights.weight_format == "nvfp4"
    in_s = weights.input_scale.float() if nv and weights.input_scale is not None else one
    fc2_s = weights.fc2_input_scale.float() if nv and weights.fc2_input_scale is not None else one
    s2_13 = weights.w13_scale_2.float() * 2.0 ** ALPHA_SHIFT
    s2_2 = weights.w2_scale_2.float() * 2.0 ** ALPHA_SHIFT
    prep = Packed(
        hidden=H, intermediate=I, hidden_padded=Hp, intermediate_padded=Ip, gated=weights.gated,
        w13=group_records(w13, s13, fmt.block_size, weights.weight_format, ROW_TILE),
        w13_bias=pad_rows(b13, ROW_TILE),
        w2=group_records(weights.w2, weights.w2_scale.view(torch.uint8), fmt.block_size,
                         weights.weight_format, ROW_TILE),
        w2_bias=pad_rows(b2, ROW_TILE),
        # w4a4 activations are stored as q * block_scale (exact in bf16); their global scale
        # joins the weight's in the fp32 epilogue, as a Blackwell W4A4 kernel's alpha does.
        fc1_alpha={"w4a16": s2_13.contiguous(), "w4a4": (s2_13 * in_s).contiguous()},
        fc2_alpha={"w4a16": s2_2.contiguous(), "w4a4": (s2_2 * fc2_s).contiguous()},
    )
    return prep
