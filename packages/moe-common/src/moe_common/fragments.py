"""Offline repack of 4-bit weights into mma A-fragment order (host side, torch).

The kernels feed decoded weights to `mma.sync.m16n8k16` as the A operand straight from
registers. Within a tile of 16 rows x 128 K, lane l of a warp (r = l // 4, q = l % 4) needs, for
each of the 8 K-slabs s of 16 values, the 8 codes

    (r, 16s+2q), (r, 16s+2q+1), (r+8, 16s+2q), (r+8, 16s+2q+1),
    (r, 16s+8+2q), (r, 16s+9+2q), (r+8, 16s+8+2q), (r+8, 16s+9+2q)

which is the PTX A fragment {a0..a7}. We store them as one 32-bit word per slab, 8 words = 32
contiguous bytes per lane, 1 KiB per tile, so a warp reads a tile with two fully coalesced
16-byte loads per lane.

Inside a word the 32 code bits are placed (WORD_BIT_POSITION) so that a rotation and a mask put
code 2i and 2i + 1 straight into the bf16 halves of A register i: the 3 magnitude bits
(m, e0, e1) at bf16 bits 6..8 and the sign at bit 15, i.e. the bf16 pattern of the e2m1 value
times 2^-126 (e = 0 is the subnormal 0.5 * 2^-126, exactly). REGISTER_PIECES says how; the
device decode (moe_common.cute.decode, wgmma_decode) and the tests follow DECODE_PLAN, derived
from it: 9 integer instructions per 8 codes.

Block scales follow the same tiling: per tile, [16 rows][128 / block] bytes (NVFP4: 8 per row,
MXFP4: 4 per row); lane l reads row r's and row r+8's bytes. The kernels hold them as bf16
(scales_to_bf16) right after the tile's codes: a group tile is one record [1 KiB codes | 16 x
128 / block bf16 scales] (group_records), the unit every kernel copies and decodes. Records are
K-tile-major in blocks of BLOCK_GROUPS groups (128 rows, the padding unit): a block's records of
one K-tile lie side by side, so a CTA's row tile takes one copy per block and K-tile.

Rows and K are zero-padded to the tile (16 rows, 128 K): padded codes are 0, so padded values
are exactly 0 whatever their scale.
"""
from __future__ import annotations

import torch

TILE_ROWS = 16
TILE_K = 128
# Groups per record block: records [E, groups / BLOCK_GROUPS, K-tiles, BLOCK_GROUPS, record]
# (group_records). A row tile of 128 or 256 rows (moe-gated, moe-generic) copies one or two
# blocks per K-tile instead of a record per group: moe-gated's band points 0.3-3.6% faster,
# moe-static's decode up to 1.5% slower (8fc9d6c against b55d70a, BENCHMARKS.md)
BLOCK_GROUPS = 8
BLOCK_SHIFT = 3  # log2(BLOCK_GROUPS): device code divides group counts by a shift
assert BLOCK_GROUPS == 1 << BLOCK_SHIFT

# The bf16x2 bits a decoded register fills: magnitude at 6..8 and sign at 15, in both halves.
FIELD_BITS = (6, 7, 8, 15, 22, 23, 24, 31)
# A register i (codes 2i, 2i + 1) = OR over its pieces of (word rotated left by `rotation`) &
# (the piece's bits). Four single-piece registers cannot tile the word's 32 bits (an exhaustive
# search over rotations found none), so one register takes two pieces: 4 shifts or rotations
# and 5 logic operations per word, where the earlier plain-shift layout took 5 and 6 (its best,
# by a search over shift pairs). Among the 9-operation layouts this one has the fewest
# rotations that cross bit 31 (those need a funnel shift; a plain left shift can run as IMAD).
# Two words decoded together cannot go below 17 per two words with shifts alone
# (tools/decode_plan_bound.py); with a byte permute, 16 (benchmarks/candidates/pair-decode).
REGISTER_PIECES = (
    ((FIELD_BITS, 0),),
    ((FIELD_BITS, 4),),
    ((FIELD_BITS, 10),),
    (((6, 22), 6), ((7, 8, 15, 23, 24, 31), 14)),
)


def _mask(bits) -> int:
    return sum(1 << b for b in bits)


def _shift_op(bits, rotation: int) -> str:
    """How a piece's rotation is done: none, a plain left shift (no bit it keeps crosses bit
    31) or a funnel-shift rotation."""
    if rotation == 0:
        return "none"
    return "shl" if min(bits) >= rotation else "rotl"


# Per register, its pieces as (op, amount, mask): what every decoder executes.
DECODE_PLAN = tuple(tuple((_shift_op(bits, rot), rot, _mask(bits)) for bits, rot in pieces)
                    for pieces in REGISTER_PIECES)


def word_bit_position(code: int, bit: int) -> int:
    """Bit of the packed word holding bit `bit` (0 = m, 1 = e0, 2 = e1, 3 = sign) of code
    `code` (0..7, the A-fragment order a0..a7)."""
    reg, half = divmod(code, 2)
    target = (6 + bit if bit < 3 else 15) + 16 * half
    for bits, rotation in REGISTER_PIECES[reg]:
        if target in bits:
            return (target - rotation) % 32
    raise AssertionError(f"register {reg} has no piece for bit {target}")


WORD_BIT_POSITION = [[word_bit_position(c, b) for b in range(4)] for c in range(8)]
assert sorted(p for row in WORD_BIT_POSITION for p in row) == list(range(32))
for _pieces in REGISTER_PIECES:
    assert sorted(b for bits, _ in _pieces for b in bits) == list(FIELD_BITS)


def decode_word_reference(w: int) -> list:
    """DECODE_PLAN on a Python int (the 4 bf16x2 register patterns of a fragment word), as the
    kernels run it: the tests check it against the e2m1 values."""
    w &= 0xFFFFFFFF
    regs = []
    for pieces in DECODE_PLAN:
        r = 0
        for op, n, mask in pieces:
            x = w if op == "none" else (w << n | w >> (32 - n)) & 0xFFFFFFFF
            r |= x & mask
        regs.append(r)
    return regs


def _fragment_index():
    """[32 lanes, 8 slabs, 8 codes] -> (row, k) inside a 16 x 128 tile."""
    lane = torch.arange(32).view(32, 1, 1)
    slab = torch.arange(8).view(1, 8, 1)
    j = torch.arange(8).view(1, 1, 8)
    r, q = lane // 4, lane % 4
    row = r + 8 * ((j // 2) % 2)
    k = 16 * slab + 8 * (j // 4) + 2 * q + (j % 2)
    return row.expand(32, 8, 8), k.expand(32, 8, 8)


def _pad_to(t: torch.Tensor, dim: int, multiple: int) -> torch.Tensor:
    size = t.shape[dim]
    pad = (-size) % multiple
    if pad == 0:
        return t
    shape = list(t.shape)
    shape[dim] = pad
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


def repack_codes(packed: torch.Tensor, row_multiple: int = TILE_ROWS,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """[E, N, K/2] canonical packed codes -> [E, Np/16, Kp/128, 32, 32] uint8 fragment blob, or
    written into `out` (a uint8 [E, Np/16, Kp/128, 1024] tensor or view) and returned. One
    expert at a time: the unpacked codes and the int32 words of a whole layer would not fit
    beside it (DeepSeek-V3's w13 as one byte per code is 7.5 GB)."""
    e, n, half = packed.shape
    nt = -(-n // row_multiple) * row_multiple // TILE_ROWS
    kt = -(-2 * half // TILE_K)
    blob = out if out is not None else torch.empty(e, nt, kt, 1024, dtype=torch.uint8,
                                                   device=packed.device)
    row, kk = _fragment_index()
    row, kk = row.to(packed.device), kk.to(packed.device)
    for i in range(e):  # (out may also be group_records' [Np/128, 8, Kp/128, 1024] view)
        codes = torch.stack([packed[i] & 0xF, packed[i] >> 4], dim=-1).flatten(-2)  # [N, K]
        codes = _pad_to(_pad_to(codes, 0, row_multiple), 1, TILE_K)
        tiles = codes.view(nt, TILE_ROWS, kt, TILE_K).permute(0, 2, 1, 3)
        frag = tiles[:, :, row, kk].to(torch.int32)  # [Nt, Kt, 32 lanes, 8 slabs, 8 codes]
        word = torch.zeros(frag.shape[:-1], dtype=torch.int32, device=frag.device)
        for c in range(8):
            for b in range(4):
                word |= ((frag[..., c] >> b) & 1) << WORD_BIT_POSITION[c][b]
        # little-endian bytes of each 32-bit word
        blob[i] = torch.stack([(word >> (8 * j)) & 0xFF for j in range(4)],
                              dim=-1).to(torch.uint8).reshape(blob.shape[1:])
        del codes, frag, word
    return blob if out is not None else blob.view(e, nt, kt, 32, 32)


def unpack_word_codes(words: torch.Tensor) -> torch.Tensor:
    """[..., 4] word bytes -> [..., 8] codes in A-fragment order (the inverse of the placement)."""
    w = sum(words[..., i].to(torch.int64) << (8 * i) for i in range(4))
    codes = [sum(((w >> WORD_BIT_POSITION[c][b]) & 1) << b for b in range(4)) for c in range(8)]
    return torch.stack(codes, dim=-1).to(torch.uint8)


def repack_scales(scales: torch.Tensor, block: int, row_multiple: int = TILE_ROWS) -> torch.Tensor:
    """[E, N, K/block] scale bytes -> [E, Np/16, Kp/128, 16, 128/block] uint8."""
    s = scales.view(torch.uint8) if scales.dtype != torch.uint8 else scales
    per_tile = TILE_K // block
    s = _pad_to(_pad_to(s, 1, row_multiple), 2, per_tile)
    e, n, kb = s.shape
    s = s.view(e, n // TILE_ROWS, TILE_ROWS, kb // per_tile, per_tile).permute(0, 1, 3, 2, 4)
    return s.contiguous()


def group_records(packed: torch.Tensor, scales: torch.Tensor, block: int, weight_format: str,
                  row_multiple: int = TILE_ROWS * BLOCK_GROUPS) -> torch.Tensor:
    """[E, N, K/2] canonical codes and their [E, N, K/block] scale bytes -> [E, Np/128, Kp/128,
    BLOCK_GROUPS, record] uint8: each group tile's record, its 1 KiB of codes (repack_codes)
    then its bf16 scales (scales_to_bf16); group g's record of K-tile kt is [.., g // 8, kt,
    g % 8] (record_index). The codes are written into the records in place: no second copy of
    the layer."""
    assert row_multiple % (TILE_ROWS * BLOCK_GROUPS) == 0, row_multiple
    s = scales_to_bf16(repack_scales(scales, block, row_multiple), weight_format)
    e, g, kt = s.shape[:3]
    nb = g // BLOCK_GROUPS
    s = s.view(torch.uint8).reshape(e, nb, BLOCK_GROUPS, kt, -1)
    rec = torch.empty(e, nb, kt, BLOCK_GROUPS, 1024 + s.shape[-1], dtype=torch.uint8,
                      device=packed.device)
    by_group = rec.permute(0, 1, 3, 2, 4)  # [E, blocks, 8, K-tiles, record]
    by_group[..., 1024:] = s
    repack_codes(packed, row_multiple, out=by_group[..., :1024])
    return rec


def record_index(expert: int, group: int, kt: int, groups: int, k_tiles: int) -> int:
    """Index of group `group`'s record of K-tile kt in group_records' blob of an expert's
    `groups` groups and `k_tiles` K-tiles (the kernels compute the same)."""
    block, j = divmod(group, BLOCK_GROUPS)
    return ((expert * (groups // BLOCK_GROUPS) + block) * k_tiles + kt) * BLOCK_GROUPS + j


def group_major(records: torch.Tensor) -> torch.Tensor:
    """group_records' blob as [E, groups, K-tiles, record] (a copy)."""
    e, nb, kt, b, r = records.shape
    return records.permute(0, 1, 3, 2, 4).reshape(e, nb * b, kt, r)


def pad_rows(v: torch.Tensor, row_multiple: int) -> torch.Tensor:
    """Zero-pad dim 1 of a per-row vector ([E, N] bias) to a multiple."""
    return _pad_to(v, 1, row_multiple).contiguous()


def gated_row_order(intermediate: int, intermediate_padded: int) -> torch.Tensor:
    """Row order for a [gate; up] w13 so each 16-row tile is [8 gate rows j..j+7; 8 up rows].

    Returned indices select rows of the canonical [2I, H] matrix after it has been padded to
    [2 * intermediate_padded, H] as [gate (padded); up (padded)]; the epilogue then finds gate and
    up of the same j in one lane (accumulator rows r and r + 8).
    """
    j = torch.arange(intermediate_padded).view(-1, 8)  # [Ip/8, 8]
    order = torch.cat([j, j + intermediate_padded], dim=1)  # [Ip/8, 16]
    return order.flatten()


def pad_gated(w: torch.Tensor, intermediate: int, intermediate_padded: int) -> torch.Tensor:
    """[E, 2I, ...] -> [E, 2Ip, ...] padding the gate and the up halves separately."""
    gate, up = w[:, :intermediate], w[:, intermediate:]
    return torch.cat([_pad_to(gate, 1, intermediate_padded), _pad_to(up, 1, intermediate_padded)], 1) \
        if intermediate_padded != intermediate else w


# The decoded codes are e2m1 * 2^-126; the kernels' bf16 block scales carry 2^SCALE_SHIFT and
# their fp32 global scales 2^ALPHA_SHIFT, so scale * code = true product * 2^-ALPHA_SHIFT and the
# epilogue's alpha restores it. Powers of two: every product and sum is the same up to that
# exponent, so results are bitwise those of unshifted values.
ALPHA_SHIFT = 64
SCALE_SHIFT = 126 - ALPHA_SHIFT
# MXFP4 e8m0 scale bytes that stay exact: below, code x scale x 2^-64 leaves bf16's normal range;
# above, scale x 2^62 overflows. (NVFP4's e4m3 scales, 2^-9..448, are always inside.)
MXFP4_SCALE_BYTES = (66, 192)


def scales_to_bf16(scale_tiles: torch.Tensor, weight_format: str) -> torch.Tensor:
    """Scale bytes (e4m3 or e8m0) -> the same values times 2^SCALE_SHIFT as bf16 (exact: bf16
    holds every e4m3 value and every power of two in range). Kernels that read bf16 scales skip
    the per-scale conversion in their inner loop at the cost of one more byte per scale."""
    if weight_format == "nvfp4":
        v = scale_tiles.view(torch.float8_e4m3fn).float()
    else:
        v = torch.exp2(scale_tiles.float() - 127.0)
    return (v * 2.0 ** SCALE_SHIFT).to(torch.bfloat16)


def mxfp4_scale_range_reason(scales: torch.Tensor, codes: torch.Tensor, block: int = 32):
    """None when every MXFP4 block with a nonzero code has its scale byte in MXFP4_SCALE_BYTES
    (blocks of zero codes decode to 0 whatever their scale), else a one-line reason."""
    lo, hi = MXFP4_SCALE_BYTES
    s = scales.view(torch.uint8)
    bad = (s < lo) | (s > hi)
    if not bool(bad.any()):
        return None
    nonzero = (codes.view(*codes.shape[:-1], -1, block // 2) & 0x77).amax(-1) > 0
    bad &= nonzero
    if not bool(bad.any()):
        return None
    b = int(s[bad].min()) if int(s[bad].min()) < lo else int(s[bad].max())
    return (f"an MXFP4 scale of 2^{b - 127} (byte {b}) is outside the kernels' exact range "
            f"2^{lo - 127}..2^{hi - 127}")
