"""mma.sync on fragment-ordered 4-bit weights: the inner loop every moe-* kernel shares.

A weight group tile in shared memory (see moe_common.fragments) is 1 KiB of codes (lane l's
32 B at l * 32: one word per k16 slab, already in mma A-fragment order) followed by the group's
bf16 block scales, [16 rows][128 / block] (NVFP4 16 B per row, MXFP4 8 B per row).

Tokens are the B operand: bf16 rows of B_ROW_BYTES (128 K + 8 pad, so ldmatrix is
conflict-free), read with ldmatrix and shared by every weight group a warp holds.

These are plain trace-time helpers (static control flow only), inlined where they are called.
"""
from __future__ import annotations

from cutlass import Int64

from ..fragments import BLOCK_GROUPS, TILE_K
from . import ptx
from .decode import decode_fragment_slab

B_ROW_BYTES = (TILE_K + 8) * 2  # 272


def scale_bytes_per_row(weight_format: str) -> int:
    """bf16 scale bytes per weight row per 128-deep K-tile."""
    return 16 if weight_format == "nvfp4" else 8


def group_tile_bytes(weight_format: str) -> int:
    return 1024 + 16 * scale_bytes_per_row(weight_format)


def record_index(e, group, kt, groups, k_tiles):
    """fragments.record_index on the device (Int64): group `group`'s record of K-tile kt in
    expert e's blob of `groups` groups and k_tiles K-tiles. The next K-tile's record is
    BLOCK_GROUPS records further on; the next group's (inside its block of 8) the next one."""
    return ((Int64(e) * Int64(groups // BLOCK_GROUPS) + Int64(group // BLOCK_GROUPS))
            * Int64(k_tiles) + Int64(kt)) * BLOCK_GROUPS + Int64(group % BLOCK_GROUPS)


def load_group_words(ga, lane, weight_format: str):
    """This lane's 8 code words and its rows' (r, r + 8) scale words from a group tile at ga."""
    sbpr = scale_bytes_per_row(weight_format)
    codes = ptx.ld_shared_v4(ga + lane * 32) + ptx.ld_shared_v4(ga + lane * 32 + 16)
    sa = ga + 1024 + (lane // 4) * sbpr
    if weight_format == "nvfp4":
        scales = ptx.ld_shared_v4(sa) + ptx.ld_shared_v4(sa + 8 * sbpr)
    else:
        scales = ptx.ld_shared_v2(sa) + ptx.ld_shared_v2(sa + 8 * sbpr)
    return codes + scales


def a_fragment(words, s: int, weight_format: str):
    """Slab s's A fragment: decode its 8 codes (their bits lie in the words of slabs s - s % 2
    and s - s % 2 + 1: fragments.PAIR_BIT_POSITION) and apply the block scales of rows r and
    r + 8 (code x 2^-126 times scale x 2^62: the A values carry 2^-64, the epilogue's alpha
    2^64)."""
    j = s - s % 2
    v = decode_fragment_slab(words[j], words[j + 1], s % 2)
    sc = words[8:]
    if weight_format == "nvfp4":
        # 4 words per row: slab s is half s % 2 of word s // 2
        w_r, w_r8 = sc[s // 2], sc[4 + s // 2]
        half = s % 2
    else:
        # 2 words per row: block s // 2 is half (s // 2) % 2 of word s // 4
        w_r, w_r8 = sc[s // 4], sc[2 + s // 4]
        half = (s // 2) % 2
    return (ptx.mul_bf16x2_bcast(v[0], w_r, half), ptx.mul_bf16x2_bcast(v[1], w_r8, half),
            ptx.mul_bf16x2_bcast(v[2], w_r, half), ptx.mul_bf16x2_bcast(v[3], w_r8, half))


def ldmatrix_lane_offset(lane):
    """Byte offset of this lane's ldmatrix row inside a B tile: matrix m = lane // 8 covers
    tokens (2 * pair + m // 2) * 8 + lane % 8 and k-half m % 2 of a slab."""
    return ((lane // 16) * 8 + lane % 8) * B_ROW_BYTES + ((lane // 8) % 2) * 16


def mma_ktile(acc, words, b_lane, nb: int, weight_format: str):
    """acc[g, n, :] += A_g (16 x 128 decoded) @ B (128 x 8 nb tokens) over the tile's 8 k16 slabs.

    acc: rmem [len(words), nb, 4] fp32; words: per group, load_group_words(...); b_lane: the B
    tile's shared address plus ldmatrix_lane_offset(lane).
    """
    mw = len(words)
    for s in range(8):
        a = [a_fragment(words[g], s, weight_format) for g in range(mw)]
        slab = b_lane + s * 32
        for pair in range((nb + 1) // 2):
            addr = slab + pair * 16 * B_ROW_BYTES
            bm = ptx.ldmatrix_x4(addr) if 2 * pair + 1 < nb else ptx.ldmatrix_x2(addr)
            for half in range(len(bm) // 2):
                n = 2 * pair + half
                for g in range(mw):
                    d = ptx.mma_bf16_16816((acc[g, n, 0], acc[g, n, 1], acc[g, n, 2], acc[g, n, 3]),
                                           a[g], (bm[2 * half], bm[2 * half + 1]))
                    for c in range(4):
                        acc[g, n, c] = d[c]
