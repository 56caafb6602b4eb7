"""The kernels' packed weights on the CPU: scale exponents and the MXFP4 range check.

The decoded codes carry 2^-126 (moe_common.fragments), so the packed bf16 block scales carry
2^SCALE_SHIFT and the fp32 global scales 2^ALPHA_SHIFT: exact powers of two, nothing else may
change. MXFP4 scales that would leave bf16's range are refused with a clear error.
"""
from __future__ import annotations

import pytest
import torch

from moe_common.fragments import (
    ALPHA_SHIFT, BLOCK_GROUPS, SCALE_SHIFT, group_major, record_index, repack_codes,
    repack_scales, scales_to_bf16,
)
from moe_common.packed import pack
from moe_common.testing import random_layer


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_packed_scales_carry_exact_powers_of_two(fmt):
    w = random_layer(2, 256, 128, weight_format=fmt, device="cpu",
                     generator=torch.Generator().manual_seed(0))
    p = pack(w)
    assert SCALE_SHIFT + ALPHA_SHIFT == 126
    block = 16 if fmt == "nvfp4" else 32
    raw = repack_scales(w.w2_scale.view(torch.uint8), block, 128)
    if fmt == "nvfp4":
        want = raw.view(torch.float8_e4m3fn).float()
    else:
        want = torch.exp2(raw.float() - 127.0)
    # each group record: the group tile's 1 KiB of codes, then its bf16 scales
    e, g, kt = raw.shape[:3]
    assert p.w2.shape == (e, g // BLOCK_GROUPS, kt, BLOCK_GROUPS, 1024 + raw[0, 0, 0].numel() * 2)
    by_group = group_major(p.w2)
    assert torch.equal(by_group[..., :1024], repack_codes(w.w2, 128).reshape(e, g, kt, 1024))
    got = by_group[..., 1024:].contiguous().view(torch.bfloat16).reshape(raw.shape).float()
    assert torch.equal(got * 2.0 ** -SCALE_SHIFT, want)
    assert torch.equal(p.fc2_alpha["w4a16"], w.w2_scale_2.float() * 2.0 ** ALPHA_SHIFT)
    assert torch.equal(scales_to_bf16(raw, fmt).float(), want * 2.0 ** SCALE_SHIFT)


def test_records_are_k_tile_major_in_blocks_of_eight_groups():
    """Group g's record of K-tile kt sits at record_index: a block's 8 records of one K-tile
    side by side (one copy per block and K-tile in the kernels), the next K-tile 8 further."""
    w = random_layer(3, 384, 256, device="cpu", generator=torch.Generator().manual_seed(3))
    p = pack(w)
    flat = p.w13.reshape(-1, p.w13.shape[-1])
    by_group = group_major(p.w13)
    e, g, kt = by_group.shape[:3]
    assert (g, kt) == (p.fc1_rows // 16, 3) and g % BLOCK_GROUPS == 0
    for ei, gi, ki in [(0, 0, 0), (0, 1, 0), (0, 0, 1), (1, 9, 2), (2, g - 1, kt - 1)]:
        assert torch.equal(flat[record_index(ei, gi, ki, g, kt)], by_group[ei, gi, ki])
    assert record_index(0, 1, 0, g, kt) == 1 and record_index(0, 0, 1, g, kt) == BLOCK_GROUPS
    assert record_index(0, BLOCK_GROUPS, 0, g, kt) == kt * BLOCK_GROUPS


def test_mxfp4_scale_outside_the_exact_range_is_refused():
    w = random_layer(2, 256, 128, weight_format="mxfp4", device="cpu",
                     generator=torch.Generator().manual_seed(1))
    s = w.w2_scale.view(torch.uint8)
    s[0, 0, 0] = 200  # 2^73: scale x 2^62 would overflow bf16
    w.w2[0, 0, :16] = 0x11  # a nonzero block
    with pytest.raises(ValueError, match=r"weights.w2: an MXFP4 scale of 2\^73 .*2\^-61..2\^65"):
        pack(w)


def test_mxfp4_tiny_scale_on_an_all_zero_block_is_accepted():
    w = random_layer(2, 256, 128, weight_format="mxfp4", device="cpu",
                     generator=torch.Generator().manual_seed(2))
    w.w2_scale.view(torch.uint8)[1, 3, 2] = 0  # 2^-127 ...
    w.w2[1, 3, 32:48] = 0  # ... on a block whose codes are all zero: decodes to 0 exactly
    pack(w)
