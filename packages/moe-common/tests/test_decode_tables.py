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
from moe_common.fragments import decode_pair_reference

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


# ---------------------------------------------------------------- kernel fragment words
def _bf16_value(bits: int) -> float:
    t = torch.tensor([bits if bits < 0x8000 else bits - 0x10000], dtype=torch.int16)
    return float(t.view(torch.bfloat16).float())


def test_fragment_words_decode_to_the_code_times_2_pow_minus_126():
    """Every code in every A-fragment position, through the repack's bit placement and the
    kernels' shift-and-mask decode: exactly e2m1 x 2^-126 (e = 0 as bf16 subnormals)."""
    from moe_common.fragments import repack_codes, unpack_word_codes
    from moe_common.formats import pack_e2m1

    rng = random.Random(3)
    for _ in range(64):
        codes = torch.tensor([[rng.randrange(16) for _ in range(128)] for _ in range(16)], dtype=torch.uint8)
        blob = repack_codes(pack_e2m1(codes[None]))  # [1, 1, 1, 32 lanes, 32 bytes]
        words = blob.view(32, 8, 4)
        from moe_common.fragments import _fragment_index
        row, kk = _fragment_index()
        assert torch.equal(unpack_word_codes(words), codes[row, kk])
        for lane in (0, 5, 31):
            for slab in (0, 3, 6, 7):
                pair = []
                for s in (slab - slab % 2, slab - slab % 2 + 1):
                    wb = words[lane, s].tolist()
                    pair.append(wb[0] | (wb[1] << 8) | (wb[2] << 16) | (wb[3] << 24))
                regs = decode_pair_reference(*pair)[4 * (slab % 2):]  # as the device decodes
                for j in range(8):
                    got = _bf16_value((regs[j // 2] >> (16 * (j % 2))) & 0xFFFF)
                    c = codes[row[lane, slab, j], kk[lane, slab, j]]
                    want = float(e2m1_decode(c.view(1))[0]) * 2.0 ** -126
                    assert got == want, (lane, slab, j, int(c), got, want)


def test_wgmma_slab_ptx_runs_the_decode_plan():
    """The decode PTX that wgmma_decode generates (shl / shf.l.wrap / prmt / and / lop3 lines)
    for each slab of a pair, run on Python ints, gives fragments.DECODE_PLAN's registers for
    any pair of words."""
    import re

    from moe_common.cute.wgmma_decode import _slab_ptx

    m32 = 0xFFFFFFFF
    rng = random.Random(5)
    for slab in (0, 1):
        lines = [ln for ln in _slab_ptx(0, slab, ("W0", "W1"), "SR", "SQ", 0)
                 if not ln.startswith(("mov", "mul"))]
        for _ in range(500):
            regs = {"W0": rng.getrandbits(32), "W1": rng.getrandbits(32)}

            def val(x):
                return regs[x] if x in regs else int(x, 0)

            for ln in lines:
                op, args = ln.rstrip(";").split(None, 1)
                a = [x.strip() for x in args.split(",")]
                if op == "shl.b32":
                    regs[a[0]] = (val(a[1]) << int(a[2])) & m32
                elif op == "shf.l.wrap.b32":
                    x, n = val(a[1]), int(a[3]) % 32
                    assert a[1] == a[2]
                    regs[a[0]] = ((x << n) | (x >> (32 - n))) & m32 if n else x
                elif op == "prmt.b32":
                    regs[a[0]] = prmt(val(a[1]), val(a[2]), val(a[3]))
                elif op == "and.b32":
                    regs[a[0]] = val(a[1]) & val(a[2])
                elif op == "lop3.b32":
                    assert a[4] == "0xF8"
                    regs[a[0]] = val(a[1]) | (val(a[2]) & val(a[3]))
                else:
                    raise AssertionError(f"unexpected PTX in the decode: {ln}")
            got = [regs[f"v{i}0_{slab}"] for i in range(4)]
            want = decode_pair_reference(regs["W0"], regs["W1"])[4 * slab:4 * slab + 4]
            assert got == want, re.sub(r"\s+", " ", " ".join(lines))
