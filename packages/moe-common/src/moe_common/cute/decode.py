"""Register-level e2m1 -> bf16 decode and block-scale helpers (device side, exact).

Kernel weights (moe_common.fragments): a lane's 32 bytes hold one 32-bit word per k16 slab, the
8 codes of an mma A fragment, and the 64 bits of slabs 2j and 2j + 1 are placed so that
`decode_fragment_slab` is a window and a mask per register (fragments.DECODE_PLAN: 7 shifts,
rotations or byte permutes and 9 logic operations for 16 codes; the byte-table decode below
takes 14 for 8). Register i of a slab gets the bf16 patterns of code 2i, 2i + 1 times 2^-126
(magnitude at bits 6..8, sign at 15: e = 0 lands in bf16's subnormals exactly); the kernels'
bf16 block scales carry 2^62, so one bf16x2 multiply gives code x scale x 2^-64, exact
(fragments.py).

Canonical layout (the dequantizer): one 32-bit word holds 8 e2m1 codes, code j in bits
[4j, 4j+4). `decode_e2m1x8` turns it into
four bf16x2 registers, register i = (code 2i in the low half, code 2i+1 in the high half), so
a word whose codes are in memory order decodes to bf16 in memory order, and a word repacked in
mma fragment order decodes straight into an mma A fragment.

The magnitude (3 bits) of each code indexes two 8-byte tables with `prmt`: one gives the low
byte of the bf16 pattern, one the high byte. The sign bit is then ORed into each high byte and
the bytes are interleaved. 14 integer instructions for 8 values, no conversion unit.

bf16 patterns of the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6:
  0x0000 0x3F00 0x3F80 0x3FC0 0x4000 0x4040 0x4080 0x40C0
"""
from __future__ import annotations

from cutlass import Int32

from ..fragments import DECODE_PLAN
from . import ptx

_LO_BYTES_0_3 = 0xC0800000  # low bytes of magnitudes 0..3
_LO_BYTES_4_7 = 0xC0804000  # low bytes of magnitudes 4..7
_HI_BYTES_0_3 = 0x3F3F3F00
_HI_BYTES_4_7 = 0x40404040


def _s32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


def _window(op: str, word: int, n: int, w0, w1):
    """A DECODE_PLAN window of the pair (fragments.window_source)."""
    if op == "prmt":
        return ptx.prmt_const(w0, w1, n)
    w = (w0, w1)[word]
    if op == "shl":
        return w << n
    return ptx.rotl(w, n) if op == "rotl" else w


def decode_fragment_slab(w0, w1, slab: int):
    """Fragment words 2j and 2j + 1 (fragments.PAIR_BIT_POSITION) -> the 4 bf16x2 registers of
    code x 2^-126 of slab 2j + `slab` (0 or 1), by its registers of fragments.DECODE_PLAN: per
    piece its window (a word, a plain shift, a funnel-shift rotation or a prmt of both words),
    then one AND (one piece) or an AND and an AND-OR (two pieces). Each slab's registers are
    its own instructions (8 per slab), so a slab decodes where it is used."""
    w0, w1 = Int32(w0), Int32(w1)
    regs = []
    for pieces in DECODE_PLAN[4 * slab:4 * slab + 4]:
        moved = [_window(op, word, n, w0, w1) for op, word, n, _ in pieces]
        r = moved[0] & Int32(_s32(pieces[0][3]))
        for x, piece in zip(moved[1:], pieces[1:]):
            r = ptx.or_and(r, x, Int32(_s32(piece[3])))
        regs.append(r)
    return tuple(regs)


def decode_e2m1x8(w):
    """8 e2m1 codes (one int32) -> 4 bf16x2 registers (exact)."""
    w = Int32(w)
    mag = w & Int32(0x77777777)
    mag_hi = mag >> 16  # prmt only reads the low 4 selector nibbles
    lo_a, lo_b = Int32(_s32(_LO_BYTES_0_3)), Int32(_s32(_LO_BYTES_4_7))
    hi_a, hi_b = Int32(_s32(_HI_BYTES_0_3)), Int32(_s32(_HI_BYTES_4_7))
    lo03 = ptx.prmt(lo_a, lo_b, mag)
    lo47 = ptx.prmt(lo_a, lo_b, mag_hi)
    hi03 = ptx.prmt(hi_a, hi_b, mag)
    hi47 = ptx.prmt(hi_a, hi_b, mag_hi)
    # Sign of code j is bit 4j+3. Byte b of (w << 4) has code 2b's sign in bit 7; byte b of w has
    # code 2b+1's sign there. Gather them in code order, one per byte, and OR into the high bytes.
    w4 = w << 4
    sign = Int32(_s32(0x80808080))
    hi03 = ptx.or_and(hi03, ptx.prmt(w4, w, Int32(0x5140)), sign)
    hi47 = ptx.or_and(hi47, ptx.prmt(w4, w, Int32(0x7362)), sign)
    return (
        ptx.prmt(lo03, hi03, Int32(0x5140)),
        ptx.prmt(lo03, hi03, Int32(0x7362)),
        ptx.prmt(lo47, hi47, Int32(0x5140)),
        ptx.prmt(lo47, hi47, Int32(0x7362)),
    )


def nvfp4_scale_pair(word, byte_index: int):
    """Broadcast bf16x2 {s, s} of the e4m3 scale in byte `byte_index` (0..3) of `word`."""
    pair = Int32(word) >> (8 * (byte_index & 2))
    a, b = ptx.e4m3x2_to_f32x2(pair)
    s = a if byte_index % 2 == 0 else b
    return ptx.bf16x2_from_f32(s, s)


def mxfp4_scale_pair(word, byte_index: int):
    """Broadcast bf16x2 {s, s} of the e8m0 scale 2^(b-127) in byte `byte_index` of `word`.

    e8m0 byte b maps to the bf16 pattern b << 7; b == 0 (2^-127) is the bf16 subnormal 0x0040.
    """
    b = (Int32(word) >> (8 * byte_index)) & Int32(0xFF)
    bits = (b << 7) | (((b - Int32(1)) >> 31) & Int32(0x40))  # b == 0 -> 0x0040
    return bits | (bits << 16)
