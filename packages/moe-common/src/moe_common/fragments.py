"""Offline repack of 4-bit weights into mma A-fragment order (host side, torch).

The kernels feed decoded weights to `mma.sync.m16n8k16` as the A operand straight from
registers. Within a tile of 16 rows x 128 K, lane l of a warp (r = l // 4, q = l % 4) needs, for
each of the 8 K-slabs s of 16 values, the 8 codes

    (r, 16s+2q), (r, 16s+2q+1), (r+8, 16s+2q), (r+8, 16s+2q+1),
    (r, 16s+8+2q), (r, 16s+9+2q), (r+8, 16s+8+2q), (r+8, 16s+9+2q)

which is the PTX A fragment {a0..a7}. We store a slab's 32 code bits in one 32-bit word, 8 words
= 32 contiguous bytes per lane, 1 KiB per tile, so a warp reads a tile with two fully coalesced
16-byte loads per lane.

The 64 code bits of a lane's slabs 2j and 2j + 1 (words 2j, 2j + 1) are placed
(PAIR_BIT_POSITION) so that a window of the two words (a shift, a rotation or a byte permute)
and a mask put codes 2i and 2i + 1 of a slab straight into the bf16 halves of A register i:
the 3 magnitude bits (m, e0, e1) at bf16 bits 6..8 and the sign at bit 15, i.e. the bf16
pattern of the e2m1 value times 2^-126 (e = 0 is the subnormal 0.5 * 2^-126, exactly).
PAIR_PIECES says how; the device decode (moe_common.cute.decode, wgmma_decode) and the tests
follow DECODE_PLAN, derived from it: 16 integer instructions per 16 codes.

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
# Two words (slabs 2j and 2j + 1 of a lane) decode together into their 8 registers. Register k
# (slab 2j + k // 4, A register k % 4: codes 2 (k % 4) and + 1) = OR over its pieces of a
# window of the two words & (the piece's bits). A window is a word ("none"), one shifted left
# ("shl": no bit it keeps crosses bit 31, so it can run as IMAD), one rotated left ("rotl", a
# funnel shift) or a byte permute of both ("prmt", selector over w0's bytes 0-3 and w1's 4-7).
# Cost: an instruction per window that is not a plain word and one per piece. No 8 one-piece
# registers cover the 64 bits, so one register takes two pieces, and 16 is the least
# (tools/decode_plan_bound.py); the two plans of 16 mirror each other. The one-word plan this
# replaces took 9 per word (4 shifts or rotations, 5 logic operations); against it, 16 fewer SASS
# per K-tile and -0.53% geomean at T = 512 and 1024 (8c84a7a, same run on an H100: BENCHMARKS.md).
PAIR_PIECES = (
    ((FIELD_BITS, ("shl", 0, 6)),),
    ((FIELD_BITS, ("rotl", 0, 12)),),
    ((FIELD_BITS, ("shl", 0, 2)),),
    ((FIELD_BITS, ("prmt", 0, 0x6341)),),
    ((FIELD_BITS, ("rotl", 1, 14)),),
    ((FIELD_BITS, ("shl", 1, 4)),),
    ((FIELD_BITS, ("rotl", 1, 10)),),
    (((7, 8, 23, 24), ("none", 0, 0)), ((6, 15, 22, 31), ("none", 1, 0))),
)


def _mask(bits) -> int:
    return sum(1 << b for b in bits)


def window_source(window, bit: int) -> tuple:
    """(word 0 or 1, bit) of the pair that `window` moves to bit `bit`."""
    op, word, n = window
    if op == "prmt":
        src = (n >> (4 * (bit // 8))) & 0xF
        assert src < 8, window  # no sign-replicate selectors
        return src // 4, 8 * (src % 4) + bit % 8
    if op == "shl":
        assert bit >= n, window
    return word, (bit - n) % 32 if op in ("shl", "rotl") else bit


# Per register, its pieces as (op, word, amount, mask): what every decoder executes.
DECODE_PLAN = tuple(tuple((*window, _mask(bits)) for bits, window in pieces)
                    for pieces in PAIR_PIECES)


def pair_bit_position(slab: int, code: int, bit: int) -> tuple:
    """(word 0 or 1 of the pair, bit) holding bit `bit` (0 = m, 1 = e0, 2 = e1, 3 = sign) of
    code `code` (0..7, the A-fragment order a0..a7) of the pair's slab `slab` (0 or 1)."""
    reg, half = divmod(code, 2)
    target = (6 + bit if bit < 3 else 15) + 16 * half
    for bits, window in PAIR_PIECES[4 * slab + reg]:
        if target in bits:
            return window_source(window, target)
    raise AssertionError(f"register {reg} of slab {slab} has no piece for bit {target}")


PAIR_BIT_POSITION = [[[pair_bit_position(s, c, b) for b in range(4)] for c in range(8)]
                     for s in range(2)]
assert sorted(p for slab in PAIR_BIT_POSITION for row in slab for p in row) == [
    (w, i) for w in range(2) for i in range(32)]
for _pieces in PAIR_PIECES:
    assert sorted(b for bits, _ in _pieces for b in bits) == list(FIELD_BITS)


def _window_value(window, w0: int, w1: int) -> int:
    op, word, n = window
    if op == "prmt":
        both = w0 | w1 << 32
        return sum(((both >> (8 * ((n >> (4 * d)) & 0xF))) & 0xFF) << (8 * d) for d in range(4))
    w = (w0, w1)[word]
    if op == "shl":
        return (w << n) & 0xFFFFFFFF
    if op == "rotl":
        return (w << n | w >> (32 - n)) & 0xFFFFFFFF
    return w


def decode_pair_reference(w0: int, w1: int) -> list:
    """DECODE_PLAN on Python ints (the 8 bf16x2 register patterns of a pair of fragment words:
    slab 2j's A registers 0-3, then slab 2j + 1's), as the kernels run it: the tests check it
    against the e2m1 values."""
    w0, w1 = w0 & 0xFFFFFFFF, w1 & 0xFFFFFFFF
    regs = []
    for pieces in DECODE_PLAN:
        r = 0
        for op, word, n, mask in pieces:
            r |= _window_value((op, word, n), w0, w1) & mask
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
        pairs = frag.unflatten(-2, (4, 2))  # [.., 4 slab pairs, 2 slabs, 8 codes]
        word = torch.zeros(pairs.shape[:-1], dtype=torch.int32, device=frag.device)
        for s in range(2):
            for c in range(8):
                for b in range(4):
                    w, at = PAIR_BIT_POSITION[s][c][b]
                    word[..., w] |= ((pairs[..., s, c] >> b) & 1) << at
        word = word.flatten(-2)  # [.., 8 words]: slab pair j's in words 2j, 2j + 1
        # little-endian bytes of each 32-bit word
        blob[i] = torch.stack([(word >> (8 * j)) & 0xFF for j in range(4)],
                              dim=-1).to(torch.uint8).reshape(blob.shape[1:])
        del codes, frag, word
    return blob if out is not None else blob.view(e, nt, kt, 32, 32)


def unpack_word_codes(words: torch.Tensor) -> torch.Tensor:
    """[..., 8 slabs, 4] word bytes (a lane's 32 bytes) -> [..., 8 slabs, 8 codes] in A-fragment
    order (the inverse of the placement: slab pair j's codes in words 2j and 2j + 1)."""
    w = sum(words[..., i].to(torch.int64) << (8 * i) for i in range(4))
    w = w.unflatten(-1, (4, 2))  # [.., 4 pairs, 2 words]
    codes = [[sum(((w[..., word] >> at) & 1) << b
                  for b, (word, at) in enumerate(PAIR_BIT_POSITION[s][c])) for c in range(8)]
             for s in range(2)]
    out = torch.stack([torch.stack(codes[s], dim=-1) for s in range(2)], dim=-2)
    return out.flatten(-3, -2).to(torch.uint8)


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
