"""The byte-permute tables of the device e2m1 decode, checked on the CPU.

The device code (moe_common.cute.decode and the PTX in wgmma_decode) cannot run here, so this
emulates `prmt` and replays the documented sequence with the module's own table constants:
every code in every position must give torch's bf16 of the e2m1 value, sign included.
"""
from __future__ import annotations

import random

import torch

from moe_common.cute import decode
from moe_common.formats import e2m1_decode

M32 = 0xFFFFFFFF


def prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): output byte i = byte (sel >> 4i) & 7 of {b:a}, or its sign
    replicated when bit 3 of that selector nibble is set."""
    src = (a & M32) | ((b & M32) << 32)
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = (src >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def emulate_decode(w: int) -> list:
    mag = w & 0x77777777
    lo03 = prmt(decode._LO_BYTES_0_3, decode._LO_BYTES_4_7, mag)
    lo47 = prmt(decode._LO_BYTES_0_3, decode._LO_BYTES_4_7, mag >> 16)
    hi03 = prmt(decode._HI_BYTES_0_3, decode._HI_BYTES_4_7, mag)
    hi47 = prmt(decode._HI_BYTES_0_3, decode._HI_BYTES_4_7, mag >> 16)
    w4 = (w << 4) & M32
    hi03 |= prmt(w4, w, 0x5140) & 0x80808080
    hi47 |= prmt(w4, w, 0x7362) & 0x80808080
    return [prmt(lo03, hi03, 0x5140), prmt(lo03, hi03, 0x7362),
            prmt(lo47, hi47, 0x5140), prmt(lo47, hi47, 0x7362)]


def _bf16_bits(v: float) -> int:
    return int(torch.tensor([v], dtype=torch.bfloat16).view(torch.int16).item()) & 0xFFFF


def _check(codes):
    w = sum(c << (4 * j) for j, c in enumerate(codes))
    regs = emulate_decode(w)
    for j, c in enumerate(codes):
        got = (regs[j // 2] >> (16 * (j % 2))) & 0xFFFF
        want = _bf16_bits(float(e2m1_decode(torch.tensor([c], dtype=torch.uint8))[0]))
        assert got == want, (codes, j, hex(got), hex(want))


def test_every_code_in_every_position():
    for c in range(16):
        for pos in range(8):
            codes = [0] * 8
            codes[pos] = c
            _check(codes)


def test_random_words():
    rng = random.Random(0)
    for _ in range(2000):
        _check([rng.randrange(16) for _ in range(8)])
