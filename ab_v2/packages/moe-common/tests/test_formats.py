"""The 4-bit formats against hand-computed values and independent re-derivations."""
import math

import pytest
import torch

from moe_common.formats import (
    E2M1_VALUES,
    FORMATS,
    MXFP4,
    NVFP4,
    e2m1_decode,
    e2m1_quantize,
    e4m3_round,
    e8m0_from_amax,
    e8m0_to_float,
    get_format,
    pack_e2m1,
    swizzle_scales_128x4,
    unpack_e2m1,
    unswizzle_scales_128x4,
    weight_global_scale,
)

GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def q(values):
    return e2m1_quantize(torch.tensor(values, dtype=torch.float32)).tolist()


# ---- e2m1 ------------------------------------------------------------------------------------


def test_e2m1_decode_follows_the_bit_layout():
    # Independent decode: bit 3 sign, bits 2..1 exponent (bias 1, 0 = subnormal), bit 0 mantissa.
    for code in range(16):
        s, e, m = code >> 3, (code >> 1) & 3, code & 1
        mag = 0.5 * m if e == 0 else 2.0 ** (e - 1) * (1 + 0.5 * m)
        want = -mag if s else mag
        got = e2m1_decode(torch.tensor([code], dtype=torch.uint8)).item()
        assert got == want and math.copysign(1, got) == math.copysign(1, want), code
    assert list(E2M1_VALUES) == GRID


def test_e2m1_every_grid_value_and_its_negative_round_trips():
    assert q(GRID) == list(range(8))
    assert q([-v for v in GRID]) == list(range(8, 16))  # -0.0 keeps its sign: code 8
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(e2m1_quantize(e2m1_decode(codes)), codes)


def test_e2m1_midpoints_round_to_the_even_code():
    mids = [(a + b) / 2 for a, b in zip(GRID, GRID[1:])]
    assert mids == [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    # the neighbour with mantissa bit 0 wins: 0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0
    assert q(mids) == [0, 2, 2, 4, 4, 6, 6]
    assert q([-m for m in mids]) == [8, 10, 10, 12, 12, 14, 14]
    # one ulp either side of each midpoint goes to the nearer neighbour
    t = torch.tensor(mids)
    below = e2m1_quantize(torch.nextafter(t, torch.zeros_like(t))).tolist()
    above = e2m1_quantize(torch.nextafter(t, torch.full_like(t, 10.0))).tolist()
    assert below == [0, 1, 2, 3, 4, 5, 6]
    assert above == [1, 2, 3, 4, 5, 6, 7]


def test_e2m1_nearest_on_random_values_matches_modelopt_rule():
    # ModelOpt's _cast_fp4 (searchsorted over the midpoints, then +1 at the odd-code midpoints)
    # as an independent reference, on random values and on every midpoint.
    g = torch.Generator().manual_seed(0)
    v = torch.cat([torch.randn(20000, generator=g) * 3, torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])])
    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    a = v.abs()
    ordinal = torch.searchsorted(bounds, a, out_int32=True)
    ordinal = ordinal + (a.unsqueeze(-1) == bounds[[1, 3, 5]]).any(-1).int()
    want = ((v < 0).int() << 3) + ordinal
    got = e2m1_quantize(v).int()
    neg_to_zero = (v < 0) & (ordinal == 0)  # ModelOpt keeps the sign there too: code 8
    assert torch.equal(got, want)
    assert neg_to_zero.any()


def test_e2m1_saturates():
    assert q([6.0, 6.5, 7.0, 100.0, float("inf")]) == [7] * 5
    assert q([-6.5, -1e9, float("-inf")]) == [15] * 3


def test_pack_puts_element_zero_in_the_low_nibble():
    codes = torch.tensor([[1, 2, 3, 4], [15, 0, 8, 7]], dtype=torch.uint8)
    packed = pack_e2m1(codes)
    assert packed.tolist() == [[0x21, 0x43], [0x0F, 0x78]]
    assert torch.equal(unpack_e2m1(packed), codes)
    with pytest.raises(ValueError, match="codes"):
        pack_e2m1(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="packed"):
        unpack_e2m1(torch.zeros(3, dtype=torch.int32))


# ---- scale encodings -------------------------------------------------------------------------


def _e4m3_positive_values():
    return sorted(v for v in torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
                  if not math.isnan(v))


def test_e4m3_round_to_nearest_even_and_saturate():
    vals = _e4m3_positive_values()
    assert vals[0] == 0 and vals[1] == 2.0**-9 and vals[-1] == 448.0 and len(vals) == 127
    grid = torch.tensor(vals)
    assert torch.equal(e4m3_round(grid).float(), grid)
    # midpoints: ties go to the neighbour whose byte is even (mantissa lsb 0)
    lo, hi = grid[:-1], grid[1:]
    mid = (lo + hi) / 2
    lo_bits = e4m3_round(lo).view(torch.uint8)
    want = torch.where(lo_bits % 2 == 0, lo, hi)
    assert torch.equal(e4m3_round(mid).float(), want)
    assert e4m3_round(torch.tensor([2.0**-10])).float().item() == 0.0  # tie with 0 -> 0
    assert e4m3_round(torch.tensor([1.0 + 1 / 16])).float().item() == 1.0  # 1 | 1.125 tie -> 1
    assert e4m3_round(torch.tensor([1.0 + 3 / 16])).float().item() == 1.25  # 1.125 | 1.25 -> 1.25
    # saturation (some torch versions cast out-of-range values to NaN, hence the clamp)
    sat = e4m3_round(torch.tensor([448.0, 460.0, 464.0, 500.0, 1e6, float("inf"), -1e6])).float()
    assert sat.tolist() == [448.0] * 6 + [-448.0]


def test_e8m0_bytes():
    amax = torch.tensor([0.0, 6.0, 6.000001, 3.0, 1.0, 0.75, 0.7499999, 12.0, 7.0, 1e-45, 3e38])
    # ceil(log2(amax/6)) + 127, by hand: 0 block; 0; 1; -1; ceil(-2.58) = -2; -3; -3; 1; 1; clamp; 126
    assert e8m0_from_amax(amax).tolist() == [0, 127, 128, 126, 125, 124, 124, 128, 128, 0, 253]
    b = torch.tensor([0, 1, 126, 127, 128, 254], dtype=torch.uint8)
    assert e8m0_to_float(b).tolist() == [2.0**-127, 2.0**-126, 0.5, 1.0, 2.0, 2.0**127]
    assert math.isnan(e8m0_to_float(torch.tensor([255], dtype=torch.uint8)).item())


def test_e8m0_matches_log2_definition_on_random_amax():
    g = torch.Generator().manual_seed(1)
    amax = torch.exp(torch.randn(5000, generator=g, dtype=torch.float64) * 8).float()
    want = [min(max(math.ceil(math.log2(a / 6.0)) + 127, 0), 254) for a in amax.double().tolist()]
    assert e8m0_from_amax(amax).tolist() == want


# ---- NVFP4 / MXFP4 ---------------------------------------------------------------------------


def test_nvfp4_quantize_hand_computed():
    # gs = 1, amax 6 -> s = 1, codes are plain e2m1 roundings
    v = torch.tensor([[6.0, -0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -6.0, 0.1, -0.4, 100 / 101, 2.9, 4.4, 0.0, -3.0]])
    packed, s = NVFP4.quantize(v, 1.0)
    assert s.dtype == torch.float8_e4m3fn and s.float().tolist() == [[1.0]]
    assert unpack_e2m1(packed).tolist() == [[7, 8, 2, 2, 4, 4, 6, 6, 15, 0, 9, 2, 5, 6, 0, 13]]
    # amax 6.5, gs = 1: s = 1.0833 -> e4m3 1.125; q = v / 1.125: 6.5 -> 5.78 -> 6, 2.25 -> 2
    v = torch.zeros(1, 16)
    v[0, 0], v[0, 1] = 6.5, 2.25
    packed, s = NVFP4.quantize(v)
    assert s.float().item() == 1.125
    assert unpack_e2m1(packed)[0, :2].tolist() == [7, 4]
    assert NVFP4.dequantize(packed, s)[0, :2].tolist() == [6.75, 2.25]
    # gs = 0.5, amax 12 -> s = 12 / 3 = 4; q = v / (4 * 0.5)
    v = torch.tensor([[12.0, 3.0, -1.0, 5.0] + [0.0] * 12])
    packed, s = NVFP4.quantize(v, 0.5)
    assert s.float().item() == 4.0
    assert unpack_e2m1(packed)[0, :4].tolist() == [7, 3, 9, 4]  # 6, 1.5, -0.5, 2.5 -> 2
    assert NVFP4.dequantize(packed, s, 0.5)[0, :4].tolist() == [12.0, 3.0, -1.0, 4.0]


def test_nvfp4_scale_saturation_zero_and_underflow_blocks():
    v = torch.zeros(3, 16)
    v[0, 0] = 6000.0  # s = 1000 -> 448; 6000 / 448 = 13.4 saturates to 6 -> 2688
    v[2, :] = 1e-6  # s = 1.7e-7 underflows e4m3 to 0: the block stores zeros
    packed, s = NVFP4.quantize(v)
    assert s.float().tolist() == [[448.0], [0.0], [0.0]]
    assert torch.all(packed[1:] == 0)  # q = 0 where s == 0: codes 0, not v / 0
    d = NVFP4.dequantize(packed, s)
    assert d[0, 0].item() == 2688.0 and torch.all(d[1:] == 0)
    assert not torch.isnan(d).any()


def test_nvfp4_global_scale_broadcasts_per_row_and_per_expert():
    g = torch.Generator().manual_seed(2)
    v = torch.randn(3, 4, 32, generator=g)
    gs = torch.tensor([0.01, 0.02, 0.5])
    packed, s = NVFP4.quantize(v, gs[:, None])  # per expert [E, 1]
    for e in range(3):
        pe, se = NVFP4.quantize(v[e], gs[e].item())
        assert torch.equal(packed[e], pe) and torch.equal(s[e].view(torch.uint8), se.view(torch.uint8))
    rows = torch.tensor([0.01, 0.02, 0.03, 0.04])
    packed, s = NVFP4.quantize(v[0], rows)  # per row [N]
    for n in range(4):
        pe, se = NVFP4.quantize(v[0, n : n + 1], rows[n].item())
        assert torch.equal(packed[n : n + 1], pe)
    with pytest.raises(ValueError, match="global_scale"):
        NVFP4.quantize(v, gs)  # [E] does not broadcast to [E, N] as intended
    with pytest.raises(ValueError, match="global_scale"):
        NVFP4.quantize(v, "1.0")


def test_mxfp4_quantize_hand_computed():
    v = torch.zeros(3, 32)
    v[0, :4] = torch.tensor([6.0, 1.75, -0.25, 3.0])  # amax 6 -> byte 127, q = v
    v[1, :3] = torch.tensor([7.0, 1.0, -2.5])  # amax 7 -> e = 1; 3.5 -> 4, 0.5, -1.25 -> -1
    packed, b = MXFP4.quantize(v)  # row 2 all zero -> byte 0
    assert b.dtype == torch.uint8 and b.tolist() == [[127], [128], [0]]
    codes = unpack_e2m1(packed)
    assert codes[0, :4].tolist() == [7, 4, 8, 5]
    assert codes[1, :3].tolist() == [6, 1, 10]
    d = MXFP4.dequantize(packed, b)
    assert d[1, :3].tolist() == [8.0, 1.0, -2.0] and torch.all(d[2] == 0)


def _random_grid_data(fmt, gen, rows, k):
    """Codes with a +-6 in every block, plus random scales: data that is exactly representable."""
    bs = fmt.block_size
    codes = torch.randint(0, 16, (rows, k), generator=gen, dtype=torch.uint8)
    codes.view(rows, k // bs, bs)[:, :, 0] = torch.where(
        torch.rand(rows, k // bs, generator=gen) < 0.5, 7, 15
    ).to(torch.uint8)
    if fmt is NVFP4:
        # random positive e4m3 scales (normals and subnormals)
        scales = torch.randint(1, 0x7F, (rows, k // bs), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn)
    else:
        scales = torch.randint(100, 150, (rows, k // bs), generator=gen, dtype=torch.uint8)
    return pack_e2m1(codes), scales


@pytest.mark.parametrize("fmt", [NVFP4, MXFP4])
def test_quantize_of_dequantize_is_identity_on_representable_data(fmt):
    gen = torch.Generator().manual_seed(3)
    packed, scales = _random_grid_data(fmt, gen, 8, 128)
    gs = 2.0**-7 if fmt is NVFP4 else None  # a power of two keeps amax / (6 gs) exact
    v = fmt.dequantize(packed, scales, gs)
    p2, s2 = fmt.quantize(v, gs)
    # -0 codes (8) come back as +0 only if v is +0; dequantize gives -0.0 for code 8, so equal
    assert torch.equal(p2, packed)
    assert torch.equal(s2.view(torch.uint8), scales.view(torch.uint8))
    assert torch.equal(fmt.fake_quantize(v, gs), v)


@pytest.mark.parametrize("fmt", [NVFP4, MXFP4])
def test_fake_quantize_is_dequantize_of_quantize(fmt):
    gen = torch.Generator().manual_seed(4)
    v = torch.randn(4, 64, generator=gen) * 3
    gs = 0.0123 if fmt is NVFP4 else None
    assert torch.equal(fmt.fake_quantize(v, gs), fmt.dequantize(*fmt.quantize(v, gs), gs))
    err = (fmt.fake_quantize(v, gs) - v).norm() / v.norm()
    assert 0.01 < err < 0.2
    # bf16 input is read as fp32
    vb = v.bfloat16()
    assert torch.equal(fmt.fake_quantize(vb, gs), fmt.fake_quantize(vb.float(), gs))


def test_shape_and_argument_errors():
    with pytest.raises(ValueError, match="block size 16"):
        NVFP4.quantize(torch.zeros(2, 24))
    with pytest.raises(ValueError, match="block size 32"):
        MXFP4.quantize(torch.zeros(2, 48))
    with pytest.raises(ValueError, match="scales"):
        NVFP4.dequantize(torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(2, 2).to(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match="scales: got dtype"):
        NVFP4.dequantize(torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="global_scale"):
        MXFP4.quantize(torch.zeros(2, 32), 1.0)
    with pytest.raises(ValueError, match="weight_format"):
        get_format("int4")
    assert FORMATS == {"nvfp4": NVFP4, "mxfp4": MXFP4}


def test_weight_global_scale():
    w = torch.zeros(3, 4, 16)
    w[0, 1, 2] = -2688.0 * 0.5
    w[1, 0, 0] = 1.0
    assert weight_global_scale(w).item() == 0.5
    per = weight_global_scale(w, dim=(1, 2))
    assert per.tolist() == [0.5, (torch.tensor(1.0) / 2688).item(), 1.0]  # all-zero expert -> 1


# ---- 128x4 scale interleave ------------------------------------------------------------------


def test_swizzle_matches_the_cutlass_index_map():
    rows, cols = 130, 5  # padded to 256 x 8
    lin = torch.randint(1, 255, (rows, cols), dtype=torch.uint8)
    swz = swizzle_scales_128x4(lin)
    assert swz.shape == (256, 8)
    flat = swz.flatten()
    for r in range(256):
        for c in range(8):
            off = ((r // 128) * 2 + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
            want = lin[r, c].item() if r < rows and c < cols else 0
            assert flat[off].item() == want, (r, c)
    assert torch.equal(unswizzle_scales_128x4(swz, rows, cols), lin)
    assert torch.equal(unswizzle_scales_128x4(flat, rows, cols), lin)


def test_swizzle_batched_and_typed():
    lin = torch.randint(1, 120, (3, 40, 8), dtype=torch.uint8).view(torch.float8_e4m3fn)
    swz = swizzle_scales_128x4(lin)
    assert swz.dtype == torch.float8_e4m3fn and swz.shape == (3, 128, 8)
    for e in range(3):
        assert torch.equal(swz[e].view(torch.uint8), swizzle_scales_128x4(lin[e].view(torch.uint8)))
    back = unswizzle_scales_128x4(swz, 40, 8)
    assert torch.equal(back.view(torch.uint8), lin.view(torch.uint8))
    with pytest.raises(ValueError, match="swizzled"):
        unswizzle_scales_128x4(torch.zeros(3, 100, dtype=torch.uint8), 40, 8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", [NVFP4, MXFP4])
def test_cuda_matches_cpu(fmt):
    v = torch.randn(8, 256) * 5
    gs = torch.rand(8, 1) * 0.01 + 1e-3 if fmt is NVFP4 else None
    p, s = fmt.quantize(v, gs)
    pc, sc = fmt.quantize(v.cuda(), None if gs is None else gs.cuda())
    assert torch.equal(pc.cpu(), p) and torch.equal(sc.cpu().view(torch.uint8), s.view(torch.uint8))
    d = fmt.dequantize(pc, sc, None if gs is None else gs.cuda())
    assert torch.equal(d.cpu(), fmt.dequantize(p, s, gs))
