"""Decode-and-multiply for a whole 128-deep K-tile in one inline-PTX block (sm_90a wgmma).

The register-A warpgroup MMA reads its A fragment asynchronously, so decoding slab s + 1 can
overlap the tensor core's work on slab s, but only if nothing outside the asm can reuse the
fragment registers while a wgmma is in flight. Keeping the e2m1 decode (the same windows and
masks as `decode.decode_fragment_slab`), the block-scale multiply, the wgmmas and the final
wait in one asm statement gives every slab its own PTX registers and leaves the scheduling to
ptxas, which tracks wgmma register lifetimes itself.

B: K-major core matrices (8 tokens x 16 bytes) in shared memory, without swizzle (their strides
are the descriptor's `b_lbo`, `b_sbo`), or in two 64-column halves (`b_half`), plain or with
wgmma's 128-byte swizzle (`b_swizzle`).
"""
from __future__ import annotations

from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from ..fragments import DECODE_PLAN
from .ptx import bcast_half_ptx

_SLAB_REGS = ["m0", "m1", "m2", "m3", "t", "v0", "v1", "v2", "v3", "sr", "sq"]
_SLAB_HALVES = ["hr", "xr", "hq", "xq"]  # b16: the scale words' halves


def _window_ptx(dst: str, op: str, word: int, n: int, codes) -> list:
    """PTX for a DECODE_PLAN window of a pair's code words (w0, w1) into dst (the caller reads
    the plan's "none" pieces, the plain words, without a window)."""
    if op == "prmt":
        return [f"prmt.b32 {dst}, {codes[0]}, {codes[1]}, {n:#x};"]
    w = codes[word]
    if op == "shl":
        return [f"shl.b32 {dst}, {w}, {n};"]
    assert op == "rotl", op
    return [f"shf.l.wrap.b32 {dst}, {w}, {w}, {n};"]


def _slab_ptx(g: int, s: int, codes, s_r: str, s_r8: str, half: int) -> list:
    """PTX decoding slab s of group g into registers a{g}_{s}_{0..3}
    (decode.decode_fragment_slab: codes are the words of slabs s - s % 2 and s - s % 2 + 1),
    times the block scales in half `half` of the scale words s_r (row r) and s_r8 (row r + 8)."""
    t = f"{g}_{s}"
    lines, m = [], 0
    # fragments.DECODE_PLAN, as decode_fragment_slab
    for i, pieces in enumerate(DECODE_PLAN[4 * (s % 2):4 * (s % 2) + 4]):
        moved = []
        for op, word, n, _ in pieces:
            if op == "none":
                moved.append(codes[word])
                continue
            lines += _window_ptx(f"m{m}{t}", op, word, n, codes)
            moved.append(f"m{m}{t}")
            m += 1
        if len(pieces) == 1:
            lines.append(f"and.b32 v{i}{t}, {moved[0]}, {pieces[0][3]:#x};")
        else:
            lines += [f"and.b32 t{t}, {moved[0]}, {pieces[0][3]:#x};",
                      f"lop3.b32 v{i}{t}, t{t}, {moved[1]}, {pieces[1][3]:#x}, 0xF8;"]
    assert m <= 4
    return lines + [
        # the scale broadcasts, folded by ptxas into the multiplies' operand swizzle
        *bcast_half_ptx(f"sr{t}", s_r, f"hr{t}", f"xr{t}", half),
        *bcast_half_ptx(f"sq{t}", s_r8, f"hq{t}", f"xq{t}", half),
        f"mul.rn.bf16x2 a{t}0, v0{t}, sr{t};",
        f"mul.rn.bf16x2 a{t}1, v1{t}, sq{t};",
        f"mul.rn.bf16x2 a{t}2, v2{t}, sr{t};",
        f"mul.rn.bf16x2 a{t}3, v3{t}, sq{t};",
    ]


@dsl_user_op
def wgmma_decode_k128(accs, codes, scales, weight_format: str, b_smem, n: int, pending=None,
                      b_lbo=None, b_sbo: int = 128, b_half=None,
                      b_swizzle: bool = False, slabs=range(8), accumulate=None, *, loc=None,
                      ip=None):
    """accs[g] (64 x n fp32) += decode(codes[g], scales[g]) (64 x 128) @ B (128 x n).

    pending=None: one commit group for the tile and a wait for all of it before returning.
    pending=j: one commit group per k16 slab and, after each, a wait down to j groups, so the
    last j slabs of this tile are still running when the block returns (the caller waits with
    ptx.wgmma_wait before reading accs or reusing B's shared memory); at most j + 1 slabs' A
    registers are live.
    b_lbo / b_sbo: bytes between core matrices adjacent in K / in tokens. The default is
    chunk-major (each 8-column K-chunk holds the n tokens' 16 bytes in a row: b_lbo = 16 n,
    b_sbo = 128); b_lbo = 16 x (a wider tile's tokens) lets an n-token MMA read the first n
    tokens of that tile, and (128, 16 x 128) is token-group-major (each 8-token group's 128 K
    columns contiguous, so a tile's first n tokens are its first 256 n bytes).
    b_half (bytes, not None): B is two 64-column halves that many bytes apart, each 8-token group
    1024 bytes (b_sbo), so b_lbo = 128 (plain core matrices) or, with b_swizzle, a token per
    128-byte row with 16-byte chunk c of token t at chunk c ^ (t % 8) (the 128-byte swizzle;
    b_smem 1024-byte aligned; b_lbo unused).
    slabs: the k16 slabs to run (default all 8). With b_half=0 and slabs 4..7, b_smem is the
    second half itself: a caller whose halves live in different pipeline stages runs a K-tile
    as two calls (the slabs left in flight by the first count toward `pending` as usual).
    n > 256 (wgmma's widest): each slab issues a second wgmma for tokens 256..n - 1, sharing
    the decoded A registers (the decode is paid once for the n tokens); its B starts 32 groups
    (32 b_sbo bytes) further on.
    accumulate (a run-time Int32, not None): where it is 0, the first slab's wgmmas overwrite
    accs instead of adding to them (wgmma's scale-d), so a K loop's first call needs no zeroed
    accumulators: the caller skips filling them (64 register moves per item in moe-gated's
    tall tile).

    codes[g]: the 8 fragment-ordered code words of this lane (one per k16 slab); scales[g]: the
    bf16 block-scale words of rows r and r + 8 (NVFP4: 4 + 4 words, slab s in half s % 2 of word
    s // 2; MXFP4: 2 + 2 words, block s // 2 in half (s // 2) % 2 of word s // 4).
    """
    h = n // 2
    b_lbo = 16 * n if b_lbo is None else b_lbo
    layout = 0  # descriptor bits 62-63: 0 no swizzle, 1 the 128-byte swizzle
    if b_half is not None:
        b_sbo = 1024
        # K-major 128B swizzle: LBO unused (1); a k16 slab is 32 bytes further along the
        # 128-byte row, as for plain core matrices 128 bytes apart in K
        b_lbo, layout = (16, 1) if b_swizzle else (128, 0)
        assert b_half % 1024 == 0
    assert b_lbo % 16 == 0 and b_sbo % 16 == 0 and b_lbo < (1 << 18) and b_sbo < (1 << 18)
    assert n % 8 == 0 and 8 <= n <= 512 and (n <= 256 or n % 16 == 0)
    # the wgmmas of one slab: (accumulator offset, width, descriptor offset >> 4)
    parts = [(0, min(n, 256), 0)] + ([(128, n - 256, 32 * b_sbo >> 4)] if n > 256 else [])
    G = len(accs)
    nsw = 4 if weight_format == "nvfp4" else 2
    ops = [Float32(x).ir_value(loc=loc, ip=ip) for acc in accs for x in acc]
    ins = [w for g in range(G) for w in list(codes[g]) + list(scales[g])]
    ops += [Int32(x).ir_value(loc=loc, ip=ip) for x in ins]
    ops += [Int32(b_smem).ir_value(loc=loc, ip=ip), Int32(1).ir_value(loc=loc, ip=ip)]
    if accumulate is not None:
        ops.append(Int32(accumulate).ir_value(loc=loc, ip=ip))
    base = 2 * G * h  # outputs, tied inputs, then the words
    per_g = 8 + 2 * nsw
    addr, one = base + G * per_g, base + G * per_g + 1
    regs, halves = [], []
    for g in range(G):
        for s in slabs:
            t = f"{g}_{s}"
            regs += [f"{r}{t}" for r in _SLAB_REGS] + [f"a{t}{j}" for j in range(4)]
            halves += [f"{r}{t}" for r in _SLAB_HALVES]
    # pa (accumulate given): the first slab's scale-d; p: every other wgmma's (1)
    first_pred = [] if accumulate is None else [".reg .pred pa;", f"setp.ne.b32 pa, ${one + 1}, 0;"]
    lines = ["{", ".reg .pred p;", ".reg .b64 d0, ds;" if n <= 256 else ".reg .b64 d0, ds, d1;",
             f".reg .b32 {', '.join(regs)};", f".reg .b16 {', '.join(halves)};",
             f"setp.ne.b32 p, ${one}, 0;", *first_pred,
             # the start address field is bits 0-13 of addr >> 4: a shared address (< 228 KiB)
             # fits it, so no mask; the other fields are constants in both halves
             ".reg .b32 dlo;", f"shr.b32 dlo, ${addr}, 4;",
             f"or.b32 dlo, dlo, {(b_lbo >> 4) << 16};",
             f"mov.b64 d0, {{dlo, {(b_sbo >> 4) | (layout << 30)}}};"]
    for s in slabs:
        for g in range(G):
            w0 = base + g * per_g
            pair = w0 + s - s % 2
            pair_words = (f"${pair}", f"${pair + 1}")  # the words of slabs s - s % 2 and + 1
            if weight_format == "nvfp4":
                wi, half = s // 2, s % 2
            else:
                wi, half = s // 4, (s // 2) % 2
            s_r, s_r8 = f"${w0 + 8 + wi}", f"${w0 + 8 + nsw + wi}"
            lines += _slab_ptx(g, s, pair_words, s_r, s_r8, half)
        # slab s: K-chunks 2s, 2s + 1 (in halves: chunks 2 (s % 4), + 1 of half s // 4; the
        # swizzled LBO of 16 bytes makes that 32 bytes along the row)
        ks, hoff = (s % 4, (s // 4) * (b_half >> 4)) if b_half is not None else (s, 0)
        lines.append(f"add.s64 ds, d0, {ks * 2 * (b_lbo >> 4) + hoff};")
        lines.append("wgmma.fence.sync.aligned;")  # A registers were just written
        for g in range(G):
            av = ", ".join(f"a{g}_{s}{j}" for j in range(4))
            for a0, w, doff in parts:
                d = ", ".join(f"${g * h + a0 + i}" for i in range(w // 2))
                desc = "ds"
                if doff:
                    lines.append(f"add.s64 d1, ds, {doff};")
                    desc = "d1"
                scale_d = "pa" if accumulate is not None and s == slabs[0] else "p"
                lines.append(f"wgmma.mma_async.sync.aligned.m64n{w}k16.f32.bf16.bf16 "
                             f"{{{d}}}, {{{av}}}, {desc}, {scale_d}, 1, 1, 0;")
        if pending is not None:
            lines += ["wgmma.commit_group.sync.aligned;", f"wgmma.wait_group.sync.aligned {int(pending)};"]
    if pending is None:
        lines += ["wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned 0;"]
    lines.append("}")
    cons = ",".join(["=f"] * (G * h) + [str(i) for i in range(G * h)] + ["r"] * (G * per_g)
                    + ["r"] * (2 if accumulate is None else 3))
    st = llvm.inline_asm(llvm.StructType.get_literal([T.f32()] * (G * h)), ops, "\n".join(lines), cons,
                         has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)
    res = [Float32(llvm.extractvalue(T.f32(), st, [i])) for i in range(G * h)]
    return [tuple(res[g * h:(g + 1) * h]) for g in range(G)]
