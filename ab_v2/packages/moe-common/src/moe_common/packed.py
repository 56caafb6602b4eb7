"""Layer weights repacked for the kernels: fragment-ordered codes and bf16 scales, on the device.

Every moe-* kernel decodes the same layout (moe_common.fragments, moe_common.cute.fragment_mma),
so the repack is done once per layer and cached in `MoEWeights.kernel_cache` under one key that
all kernels share: a layer served by moe-static at decode and moe-generic at prefill holds one
copy of its packed weights, not two.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .formats import get_format
from .fragments import (
    ALPHA_SHIFT, TILE_K, gated_row_order, mxfp4_scale_range_reason, pad_gated, pad_rows,
    repack_codes, repack_scales, scales_to_bf16,
)
from .weights import MoEWeights

CACHE_KEY = "packed-fragments"

# Weight rows are padded to 128: moe-generic's largest CTA row tile (4 warps x 2 groups x 16);
# moe-static's slices (128 intermediate columns) and row stages predicate on the real count.
ROW_TILE = 128


def _round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


@dataclass
class Packed:
    """Weights of one layer in fragment order (see moe_common.fragments), on the device.

    Gated w13 rows are in `gated_row_order` (16-row groups of [8 gate; 8 up]), so group g holds
    intermediate columns 8g..8g+7; relu2 w13 group g holds columns 16g..16g+15.
    """

    hidden: int
    intermediate: int
    hidden_padded: int
    intermediate_padded: int
    gated: bool
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w13_bias: torch.Tensor  # fp32 [E, N1p] (zeros without bias), in blob row order
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w2_bias: torch.Tensor  # fp32 [E, Hp]
    fc1_alpha: dict  # quant_mode -> fp32 [E]: weight scale_2 (x input_scale in w4a4) x 2^64
    fc2_alpha: dict  # (the block scales carry 2^62 and decoded codes 2^-126: fragments.py)

    @property
    def fc1_rows(self) -> int:
        return self.w13.shape[1] * 16

    @property
    def fc2_rows(self) -> int:
        return self.w2.shape[1] * 16


def pack(weights: MoEWeights) -> Packed:
    cached = weights.kernel_cache.get(CACHE_KEY)
    if cached is not None:
        return cached
    fmt = get_format(weights.weight_format)
    if weights.weight_format == "mxfp4":
        for name, codes, scales in (("w13", weights.w13, weights.w13_scale),
                                    ("w2", weights.w2, weights.w2_scale)):
            reason = mxfp4_scale_range_reason(scales, codes)
            if reason is not None:
                raise ValueError(f"weights.{name}: {reason}; use the torch reference for this layer")
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
        w13=repack_codes(w13, ROW_TILE),
        w13_scale=scales_to_bf16(repack_scales(s13, fmt.block_size, ROW_TILE), weights.weight_format),
        w13_bias=pad_rows(b13, ROW_TILE),
        w2=repack_codes(weights.w2, ROW_TILE),
        w2_scale=scales_to_bf16(repack_scales(weights.w2_scale.view(torch.uint8), fmt.block_size, ROW_TILE),
                                weights.weight_format),
        w2_bias=pad_rows(b2, ROW_TILE),
        # w4a4 activations are stored as q * block_scale (exact in bf16); their global scale
        # joins the weight's in the fp32 epilogue, as a Blackwell W4A4 kernel's alpha does.
        fc1_alpha={"w4a16": s2_13.contiguous(), "w4a4": (s2_13 * in_s).contiguous()},
        fc2_alpha={"w4a16": s2_2.contiguous(), "w4a4": (s2_2 * fc2_s).contiguous()},
    )
    weights.kernel_cache[CACHE_KEY] = prep
    return prep
