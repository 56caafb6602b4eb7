"""Thin inline-PTX wrappers the kernels use where the DSL has no direct op.

Addresses are plain 64-bit integers (global) or 32-bit shared-window offsets (shared), so the
kernels can do their own index math exactly as they would in CUDA C++. Pure operations are
emitted without side effects so LLVM may schedule, CSE and hoist them; loads from memory that
other threads (or an earlier launch) write are marked volatile-free `.nc` only where the data
is read-only for the whole launch (weights, scales, token rows).

Sections: integer ops and warp shuffles; bf16 / e4m3 conversions; global loads; global stores
and atomics; shared memory and ldmatrix; cp.async; tensor cores (mma.sync, wgmma waits);
synchronization and fences (warp, named barriers, CTA flags, proxies, the grid barrier, PDL);
mbarriers and bulk copies (cp.async.bulk, the TMA engine's 1-D copy).
"""
from __future__ import annotations

from typing import NamedTuple

from cutlass import Float32, Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def _i32(v, loc, ip):
    return Int32(v).ir_value(loc=loc, ip=ip)


def _asm(ret, operands, text, constraints, side_effects=False):
    return llvm.inline_asm(
        ret, operands, text, constraints, has_side_effects=side_effects,
        is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
    )


def _stmt(operands, text, constraints):
    """An asm statement with side effects and no result (stores, waits, fences)."""
    llvm.inline_asm(None, operands, text, constraints, has_side_effects=True,
                    is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)


def _unpack(struct, n, ty):
    return tuple(llvm.extractvalue(ty, struct, [i]) for i in range(n))


# ---------------------------------------------------------------- integer ops, warp shuffles
@dsl_user_op
def prmt(a, b, sel, *, loc=None, ip=None) -> Int32:
    """Byte permute: bytes {b:a} (a = bytes 0..3) picked by the low 4 nibbles of sel."""
    return Int32(_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip), _i32(sel, loc, ip)],
                      "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r"))


@dsl_user_op
def prmt_const(a, b, sel: int, *, loc=None, ip=None) -> Int32:
    """prmt with a constant selector, written into the instruction (PRMT's immediate form, no
    register held for it)."""
    return Int32(_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip)],
                      f"prmt.b32 $0, $1, $2, {int(sel):#x};", "=r,r,r"))


@dsl_user_op
def rotl(a, n: int, *, loc=None, ip=None) -> Int32:
    """a rotated left by the constant n (a funnel shift of a with itself: one SHF)."""
    return Int32(_asm(T.i32(), [_i32(a, loc, ip)], f"shf.l.wrap.b32 $0, $1, $1, {int(n)};",
                      "=r,r"))


@dsl_user_op
def or_and(a, b, mask, *, loc=None, ip=None) -> Int32:
    """a | (b & mask) in one LOP3 (immLut: a=0xF0, b=0xCC, c=0xAA)."""
    return Int32(_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip), _i32(mask, loc, ip)],
                      "lop3.b32 $0, $1, $2, $3, 0xF8;", "=r,r,r,r"))


@dsl_user_op
def shfl_up_i32(v, delta, *, loc=None, ip=None) -> Int32:
    """v of lane (lane - delta); lanes below delta get their own v (shfl.sync.up, full warp)."""
    return Int32(_asm(T.i32(), [_i32(v, loc, ip), _i32(delta, loc, ip)],
                      "shfl.sync.up.b32 $0, $1, $2, 0x0, 0xffffffff;", "=r,r,r", side_effects=True))


@dsl_user_op
def shfl_idx_i32(v, src_lane, *, loc=None, ip=None) -> Int32:
    """v of lane src_lane (shfl.sync.idx, full warp)."""
    return Int32(_asm(T.i32(), [_i32(v, loc, ip), _i32(src_lane, loc, ip)],
                      "shfl.sync.idx.b32 $0, $1, $2, 0x1f, 0xffffffff;", "=r,r,r", side_effects=True))


# ---------------------------------------------------------------- bf16 / e4m3 conversions
@dsl_user_op
def mul_bf16x2(a, b, *, loc=None, ip=None) -> Int32:
    """Packed bf16x2 multiply, round to nearest (exact for e2m1 x e4m3 / e8m0 products)."""
    return Int32(_asm(T.i32(), [_i32(a, loc, ip), _i32(b, loc, ip)],
                      "mul.rn.bf16x2 $0, $1, $2;", "=r,r,r"))


def bcast_half_ptx(dst: str, word: str, h: str, x: str, half: int) -> list:
    """PTX lines: dst = {v, v} for the bf16 v in half `half` (0 low, 1 high) of word (h, x: b16
    scratch registers). Written inside the asm of the bf16x2 multiplies that use dst, ptxas
    folds it into their .H0_H0 / .H1_H1 operand swizzle (a prmt costs one instruction)."""
    unpack = f"{{{x}, {h}}}" if half else f"{{{h}, {x}}}"
    return [f"mov.b32 {unpack}, {word};", f"mov.b32 {dst}, {{{h}, {h}}};"]


@dsl_user_op
def mul_bf16x2_bcast(a, w, half: int, *, loc=None, ip=None) -> Int32:
    """a * {v, v} for the bf16 v in half `half` of w, in one HMUL2 (see bcast_half_ptx)."""
    lines = ["{", ".reg .b16 h, x;", ".reg .b32 s;", *bcast_half_ptx("s", "$2", "h", "x", half),
             "mul.rn.bf16x2 $0, $1, s;", "}"]
    return Int32(_asm(T.i32(), [_i32(a, loc, ip), _i32(w, loc, ip)], "\n".join(lines),
                      "=r,r,r"))


@dsl_user_op
def bf16x2_from_f32(lo, hi, *, loc=None, ip=None) -> Int32:
    """Pack two fp32 into bf16x2 (lo in the low half), round to nearest even."""
    return Int32(_asm(T.i32(), [Float32(hi).ir_value(loc=loc, ip=ip), Float32(lo).ir_value(loc=loc, ip=ip)],
                      "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f"))


@dsl_user_op
def bf16_lo_to_f32(v, *, loc=None, ip=None) -> Float32:
    """The low bf16 of a packed pair as fp32 (exact)."""
    return Float32(_asm(T.f32(), [_i32(v, loc, ip)], "shl.b32 $0, $1, 16;", "=f,r"))


@dsl_user_op
def bf16_hi_to_f32(v, *, loc=None, ip=None) -> Float32:
    """The high bf16 of a packed pair as fp32 (exact)."""
    return Float32(_asm(T.f32(), [_i32(v, loc, ip)], "and.b32 $0, $1, 0xffff0000;", "=f,r"))


@dsl_user_op
def e4m3x2_to_f32x2(v, *, loc=None, ip=None):
    """Two e4m3 bytes (low 16 bits of v) -> two fp32 (exact: f16 holds every e4m3 value)."""
    s = _asm(llvm.StructType.get_literal([T.f32(), T.f32()]), [_i32(v, loc, ip)],
             "{ .reg .b16 l; .reg .b32 h; .reg .b16 h0, h1;\n"
             "  cvt.u16.u32 l, $2;\n"
             "  cvt.rn.f16x2.e4m3x2 h, l;\n"
             "  mov.b32 {h0, h1}, h;\n"
             "  cvt.f32.f16 $0, h0;\n"
             "  cvt.f32.f16 $1, h1; }",
             "=f,=f,r")
    a, b = _unpack(s, 2, T.f32())
    return Float32(a), Float32(b)


@dsl_user_op
def f32_bits(v, *, loc=None, ip=None) -> Float32:
    """Reinterpret an int32 bit pattern as fp32."""
    return Float32(_asm(T.f32(), [_i32(v, loc, ip)], "mov.b32 $0, $1;", "=f,r"))


# ---------------------------------------------------------------- global loads
@dsl_user_op
def ld_u32(addr, *, loc=None, ip=None) -> Int32:
    """Coherent 4-byte global load (for data written earlier in the same stream)."""
    return Int32(_asm(T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip)],
                      "ld.global.u32 $0, [$1];", "=r,l", side_effects=True))


@dsl_user_op
def ld_relaxed_u32(addr, *, loc=None, ip=None) -> Int32:
    """ld_u32 as a relaxed gpu-scope load, which ptxas keeps where it stands (a plain load whose
    only use is behind a branch is sunk past it: moe-generic's tile fields)."""
    return Int32(_asm(T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip)],
                      "ld.relaxed.gpu.global.u32 $0, [$1];", "=r,l", side_effects=True))


@dsl_user_op
def ld_nc_u32(addr, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip)],
                      "ld.global.nc.u32 $0, [$1];", "=r,l"))


@dsl_user_op
def ld_nc_f32(addr, *, loc=None, ip=None) -> Float32:
    return Float32(_asm(T.f32(), [Int64(addr).ir_value(loc=loc, ip=ip)],
                        "ld.global.nc.f32 $0, [$1];", "=f,l"))


@dsl_user_op
def ld_nc_s64_as_s32(addr, *, loc=None, ip=None) -> Int32:
    """A read-only int64 expert id as int32, saturated to [-1, 2^31 - 1] first, so that an id
    outside int32 stays outside every expert range (2^32 + e must not become e, INT64_MIN not
    0) and the callers' one 32-bit range check drops it as the reference does."""
    return Int32(_asm(T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip)],
                      "{ .reg .s64 t; ld.global.nc.s64 t, [$1]; max.s64 t, t, -1; "
                      "min.s64 t, t, 2147483647; cvt.u32.u64 $0, t; }", "=r,l"))


@dsl_user_op
def ld_v4(addr, *, loc=None, ip=None):
    """Coherent 16-byte global load (data written by an earlier kernel of the same stream)."""
    s = _asm(llvm.StructType.get_literal([T.i32()] * 4), [Int64(addr).ir_value(loc=loc, ip=ip)],
             "ld.global.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", side_effects=True)
    return tuple(Int32(x) for x in _unpack(s, 4, T.i32()))


@dsl_user_op
def ld_nc_v4(addr, *, loc=None, ip=None):
    """16-byte read-only global load."""
    s = _asm(llvm.StructType.get_literal([T.i32()] * 4), [Int64(addr).ir_value(loc=loc, ip=ip)],
             "ld.global.nc.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l")
    return tuple(Int32(x) for x in _unpack(s, 4, T.i32()))


@dsl_user_op
def ld_cg_v4(addr, *, loc=None, ip=None):
    """16-byte global load through L2 only (data other CTAs of this launch wrote before a
    grid barrier; L1 is not coherent across SMs)."""
    s = _asm(llvm.StructType.get_literal([T.i32()] * 4), [Int64(addr).ir_value(loc=loc, ip=ip)],
             "ld.global.cg.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", side_effects=True)
    return tuple(Int32(x) for x in _unpack(s, 4, T.i32()))


@dsl_user_op
def ld_cg_v4_if(addr, pred, *, loc=None, ip=None):
    """ld_cg_v4 where pred != 0, else four zeros and no load (the access is predicated off)."""
    s = _asm(llvm.StructType.get_literal([T.i32()] * 4),
             [Int64(addr).ir_value(loc=loc, ip=ip), _i32(pred, loc, ip)],
             "{\n.reg .pred p;\nsetp.ne.u32 p, $5, 0;\n"
             "mov.u32 $0, 0;\nmov.u32 $1, 0;\nmov.u32 $2, 0;\nmov.u32 $3, 0;\n"
             "@p ld.global.cg.v4.u32 {$0, $1, $2, $3}, [$4];\n}",
             "=r,=r,=r,=r,l,r", side_effects=True)
    return tuple(Int32(x) for x in _unpack(s, 4, T.i32()))


# ---------------------------------------------------------------- global stores, atomics
@dsl_user_op
def st_u16(addr, a, *, loc=None, ip=None):
    """Store the low 16 bits of a."""
    _stmt([Int64(addr).ir_value(loc=loc, ip=ip), _i32(a, loc, ip)], "{ .reg .b16 t; cvt.u16.u32 t, $1; st.global.u16 [$0], t; }", "l,r")


@dsl_user_op
def st_u32(addr, a, *, loc=None, ip=None):
    _stmt([Int64(addr).ir_value(loc=loc, ip=ip), _i32(a, loc, ip)], "st.global.u32 [$0], $1;", "l,r")


@dsl_user_op
def st_f32(addr, a, *, loc=None, ip=None):
    _stmt([Int64(addr).ir_value(loc=loc, ip=ip), Float32(a).ir_value(loc=loc, ip=ip)], "st.global.f32 [$0], $1;", "l,f")


@dsl_user_op
def st_v2(addr, a, b, *, loc=None, ip=None):
    _stmt([Int64(addr).ir_value(loc=loc, ip=ip), _i32(a, loc, ip), _i32(b, loc, ip)],
          "st.global.v2.u32 [$0], {$1, $2};", "l,r,r")


@dsl_user_op
def st_v4(addr, a, b, c, d, *, loc=None, ip=None):
    _stmt([Int64(addr).ir_value(loc=loc, ip=ip)] + [_i32(x, loc, ip) for x in (a, b, c, d)], "st.global.v4.u32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r")


@dsl_user_op
def st_v4_f32(addr, a, b, c, d, *, loc=None, ip=None):
    _stmt([Int64(addr).ir_value(loc=loc, ip=ip)] + [Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)],
          "st.global.v4.f32 [$0], {$1, $2, $3, $4};", "l,f,f,f,f")


@dsl_user_op
def st_u16_if(addr, a, pred, *, loc=None, ip=None):
    """st_u16 where pred != 0 (predicated, no branch)."""
    _stmt([Int64(addr).ir_value(loc=loc, ip=ip), _i32(pred, loc, ip), _i32(a, loc, ip)],
          "{\n.reg .pred p;\n.reg .b16 t;\nsetp.ne.u32 p, $1, 0;\ncvt.u16.u32 t, $2;\n"
          "@p st.global.u16 [$0], t;\n}", "l,r,r")


@dsl_user_op
def st_u32_if(addr, a, pred, *, loc=None, ip=None):
    """4-byte global store where pred != 0 (predicated, no branch)."""
    _stmt([Int64(addr).ir_value(loc=loc, ip=ip), _i32(pred, loc, ip), _i32(a, loc, ip)],
          "{\n.reg .pred p;\nsetp.ne.u32 p, $1, 0;\n@p st.global.u32 [$0], $2;\n}", "l,r,r")


@dsl_user_op
def st_v2_if(addr, a, b, pred, *, loc=None, ip=None):
    """8-byte global store where pred != 0 (predicated, no branch)."""
    _stmt([Int64(addr).ir_value(loc=loc, ip=ip), _i32(pred, loc, ip), _i32(a, loc, ip),
           _i32(b, loc, ip)],
          "{\n.reg .pred p;\nsetp.ne.u32 p, $1, 0;\n@p st.global.v2.u32 [$0], {$2, $3};\n}",
          "l,r,r,r")


@dsl_user_op
def red_add_f32(addr, a, *, loc=None, ip=None):
    """Atomic fp32 add at L2, no result (relaxed, gpu scope)."""
    _stmt([Int64(addr).ir_value(loc=loc, ip=ip), Float32(a).ir_value(loc=loc, ip=ip)], "red.global.add.f32 [$0], $1;", "l,f")


@dsl_user_op
def atom_add_global(addr, v, *, loc=None, ip=None) -> Int32:
    """Relaxed device-scope atomic add on a global int32; returns the old value."""
    return Int32(_asm(T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip), _i32(v, loc, ip)],
                      "atom.global.add.u32 $0, [$1], $2;", "=r,l,r", side_effects=True))


# ---------------------------------------------------------------- shared memory, ldmatrix
@dsl_user_op
def ld_shared_u16(addr, *, loc=None, ip=None) -> Int32:
    """A zero-extended 16-bit shared-memory value."""
    return Int32(_asm(T.i32(), [Int32(addr).ir_value(loc=loc, ip=ip)],
                      "{\n.reg .u16 h;\nld.shared.u16 h, [$1];\ncvt.u32.u16 $0, h;\n}", "=r,r",
                      side_effects=True))


@dsl_user_op
def ld_shared_u32(addr, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [Int32(addr).ir_value(loc=loc, ip=ip)],
                      "ld.shared.u32 $0, [$1];", "=r,r", side_effects=True))


@dsl_user_op
def ld_shared_v2(addr, *, loc=None, ip=None):
    s = _asm(llvm.StructType.get_literal([T.i32()] * 2), [Int32(addr).ir_value(loc=loc, ip=ip)],
             "ld.shared.v2.u32 {$0, $1}, [$2];", "=r,=r,r", side_effects=True)
    return tuple(Int32(x) for x in _unpack(s, 2, T.i32()))


@dsl_user_op
def ld_shared_v4(addr, *, loc=None, ip=None):
    s = _asm(llvm.StructType.get_literal([T.i32()] * 4), [Int32(addr).ir_value(loc=loc, ip=ip)],
             "ld.shared.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r", side_effects=True)
    return tuple(Int32(x) for x in _unpack(s, 4, T.i32()))


@dsl_user_op
def st_shared_u16(addr, v, *, loc=None, ip=None):
    """The low 16 bits of v."""
    _stmt([Int32(addr).ir_value(loc=loc, ip=ip), _i32(v, loc, ip)],
          "{\n.reg .u16 h;\ncvt.u16.u32 h, $1;\nst.shared.u16 [$0], h;\n}", "r,r")


@dsl_user_op
def st_shared_u32(addr, v, *, loc=None, ip=None):
    _stmt([Int32(addr).ir_value(loc=loc, ip=ip), _i32(v, loc, ip)], "st.shared.u32 [$0], $1;", "r,r")


@dsl_user_op
def st_shared_f32(addr, v, *, loc=None, ip=None):
    _stmt([Int32(addr).ir_value(loc=loc, ip=ip), Float32(v).ir_value(loc=loc, ip=ip)],
          "st.shared.f32 [$0], $1;", "r,f")


@dsl_user_op
def st_shared_v4(addr, a, b, c, d, *, loc=None, ip=None):
    _stmt([Int32(addr).ir_value(loc=loc, ip=ip)] + [_i32(x, loc, ip) for x in (a, b, c, d)],
          "st.shared.v4.u32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r")


@dsl_user_op
def st_shared_v4_f32(addr, a, b, c, d, *, loc=None, ip=None):
    _stmt([Int32(addr).ir_value(loc=loc, ip=ip)] + [Float32(x).ir_value(loc=loc, ip=ip) for x in (a, b, c, d)],
          "st.shared.v4.f32 [$0], {$1, $2, $3, $4};", "r,f,f,f,f")


@dsl_user_op
def atom_add_shared(addr, v, *, loc=None, ip=None) -> Int32:
    """Atomic add on a shared-memory int32; returns the old value."""
    return Int32(_asm(T.i32(), [Int32(addr).ir_value(loc=loc, ip=ip), _i32(v, loc, ip)],
                      "atom.shared.add.u32 $0, [$1], $2;", "=r,r,r", side_effects=True))


@dsl_user_op
def atom_max_shared(addr, v, *, loc=None, ip=None) -> Int32:
    """Atomic unsigned max on a shared-memory int32; returns the old value."""
    return Int32(_asm(T.i32(), [Int32(addr).ir_value(loc=loc, ip=ip), _i32(v, loc, ip)],
                      "atom.shared.max.u32 $0, [$1], $2;", "=r,r,r", side_effects=True))


@dsl_user_op
def ldmatrix_x2(addr, *, loc=None, ip=None):
    """Two 8x8 b16 matrices (lanes 0..15 supply the row addresses)."""
    s = _asm(llvm.StructType.get_literal([T.i32()] * 2), [Int32(addr).ir_value(loc=loc, ip=ip)],
             "ldmatrix.sync.aligned.m8n8.x2.shared.b16 {$0, $1}, [$2];", "=r,=r,r", side_effects=True)
    return tuple(Int32(x) for x in _unpack(s, 2, T.i32()))


@dsl_user_op
def ldmatrix_x4(addr, *, loc=None, ip=None):
    """Four 8x8 b16 matrices from shared memory; lane l supplies row l % 8 of matrix l // 8."""
    s = _asm(llvm.StructType.get_literal([T.i32()] * 4), [Int32(addr).ir_value(loc=loc, ip=ip)],
             "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r",
             side_effects=True)
    return tuple(Int32(x) for x in _unpack(s, 4, T.i32()))


@dsl_user_op
def stmatrix_x4_trans(addr, r0, r1, r2, r3, *, loc=None, ip=None):
    """Store four 8x8 bf16 matrices transposed: lanes 8m..8m+7 give the row addresses of
    matrix m; register m of the thread (row t // 4, columns 2 (t % 4), +1) lands in memory row
    2 (t % 4) (+1), position t // 4."""
    _stmt([Int32(addr).ir_value(loc=loc, ip=ip)] + [_i32(x, loc, ip) for x in (r0, r1, r2, r3)],
          "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [$0], {$1, $2, $3, $4};", "r,r,r,r,r")


# ---------------------------------------------------------------- cp.async
@dsl_user_op
def cp_async_16(smem_addr, gmem_addr, *, loc=None, ip=None):
    """Asynchronous 16-byte global -> shared copy (L2 only: token rows are reused via smem)."""
    _stmt([Int32(smem_addr).ir_value(loc=loc, ip=ip), Int64(gmem_addr).ir_value(loc=loc, ip=ip)], "cp.async.cg.shared.global [$0], [$1], 16;", "r,l")


@dsl_user_op
def cp_async_16_zfill(smem_addr, gmem_addr, nbytes, *, loc=None, ip=None):
    """As cp_async_16, reading only `nbytes` (0 or 16) and zero-filling the rest."""
    _stmt([Int32(smem_addr).ir_value(loc=loc, ip=ip), Int64(gmem_addr).ir_value(loc=loc, ip=ip),
                           _i32(nbytes, loc, ip)], "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r")


@dsl_user_op
def cp_async_commit(*, loc=None, ip=None):
    _stmt([], "cp.async.commit_group;", "")


@dsl_user_op
def cp_async_wait(n: int, *, loc=None, ip=None):
    """Wait until at most n committed cp.async groups are still in flight (n: compile-time)."""
    _stmt([], f"cp.async.wait_group {int(n)};", "")


# ---------------------------------------------------------------- tensor cores
@dsl_user_op
def mma_bf16_16816(d, a, b, *, loc=None, ip=None):
    """d += A(16x16, row) @ B(16x8, col), bf16 in, fp32 accumulate (mma.sync, m16n8k16).

    d: 4 fp32, a: 4 bf16x2 registers, b: 2 bf16x2 registers, in the PTX fragment order.
    """
    ops = [Float32(x).ir_value(loc=loc, ip=ip) for x in d] + [_i32(x, loc, ip) for x in a] + \
          [_i32(x, loc, ip) for x in b]
    s = _asm(llvm.StructType.get_literal([T.f32()] * 4), ops,
             "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
             "{$0, $1, $2, $3}, {$8, $9, $10, $11}, {$12, $13}, {$4, $5, $6, $7};",
             "=f,=f,=f,=f,f,f,f,f,r,r,r,r,r,r")
    return tuple(Float32(x) for x in _unpack(s, 4, T.f32()))


@dsl_user_op
def wgmma_wait(n: int, *, loc=None, ip=None):
    """Wait until at most n committed wgmma groups of this warp are in flight (n: compile-time)."""
    _stmt([], f"wgmma.wait_group.sync.aligned {int(n)};", "")


# ---------------------------------------------------------------- synchronization, fences
@dsl_user_op
def sync_warp(*, loc=None, ip=None):
    """bar.warp.sync over the whole warp: orders the lanes' shared-memory accesses (cp.async
    data one lane copied and another reads, after each lane's cp.async.wait_group)."""
    _stmt([], "bar.warp.sync -1;", "")


@dsl_user_op
def named_barrier(barrier_id, threads, *, loc=None, ip=None):
    """bar.sync on hardware barrier barrier_id (1..15; 0 is the CTA barrier) for `threads`
    threads (a multiple of 32): the warps of one team meet without stopping the others."""
    _stmt([_i32(barrier_id, loc, ip), _i32(threads, loc, ip)], "bar.sync $0, $1;", "r,r")


@dsl_user_op
def flag_set_release_cta(addr, *, loc=None, ip=None):
    """Set a shared-memory flag to 1 with release semantics at CTA scope: after a warp sync, the
    warp's earlier writes (global included) are visible to a warp of the CTA that sees the flag
    through flag_wait_acquire_cta. A CTA-scope fence, not a round trip to L2."""
    _stmt([Int32(addr).ir_value(loc=loc, ip=ip)], "st.release.cta.shared.u32 [$0], 1;", "r")


@dsl_user_op
def flag_wait_acquire_cta(addr, *, loc=None, ip=None):
    """Spin until a shared-memory flag is 1 (acquire, CTA scope; see flag_set_release_cta)."""
    _stmt([Int32(addr).ir_value(loc=loc, ip=ip)],
          "{\n.reg .pred p;\n.reg .b32 v;\nWAIT_${:uid}:\n"
          "ld.acquire.cta.shared.u32 v, [$0];\n"
          "setp.ne.u32 p, v, 1;\n"
          "@p bra WAIT_${:uid};\n}", "r")


@dsl_user_op
def fence_proxy_async_shared(*, loc=None, ip=None):
    """Order this thread's generic-proxy shared-memory writes before async-proxy reads (wgmma)."""
    _stmt([], "fence.proxy.async.shared::cta;", "")


@dsl_user_op
def fence_proxy_async_global(*, loc=None, ip=None):
    """Order this thread's generic-proxy global writes before async-proxy (bulk copy) reads of
    them that a later barrier makes happen after."""
    _stmt([], "fence.proxy.async.global;", "")


@dsl_user_op
def count_add_release_gpu(addr, *, loc=None, ip=None):
    """Add 1 to a global counter with release semantics at GPU scope: what happens before it in
    this CTA (other warps' writes too, once an mbarrier or CTA barrier ordered them before this
    thread) is visible to a thread of any CTA that sees the count by count_wait_acquire_gpu.
    The fence (MEMBAR.GPU) waits for those writes: issue it from a warp no one waits on."""
    _stmt([Int64(addr).ir_value(loc=loc, ip=ip)], "red.release.gpu.global.add.u32 [$0], 1;",
          "l")


@dsl_user_op
def count_wait_acquire_gpu(addr, target, *, loc=None, ip=None):
    """Spin until a global counter (count_add_release_gpu's) is at least `target`, then acquire
    at GPU scope (the loads after it, of this SM's threads, see what came before the adds)."""
    _stmt([Int64(addr).ir_value(loc=loc, ip=ip), _i32(target, loc, ip)],
          "{\n.reg .pred p;\n.reg .b32 v;\nWAIT_${:uid}:\n"
          "ld.acquire.gpu.global.u32 v, [$0];\n"
          "setp.lt.s32 p, v, $1;\n"
          "@p nanosleep.u32 256;\n"
          "@p bra WAIT_${:uid};\n}", "l,r")


@dsl_user_op
def grid_barrier_arrive_wait(state, master, last, *, loc=None, ip=None):
    """One thread per CTA: wait until every CTA of the (co-resident) grid has arrived.

    state: one u32 in global memory, 0 before the first use. Each barrier adds 2^31 to it in
    all: the master CTA (master != 0, exactly one) adds 2^31 - last, every other CTA 1 (last =
    grid size - 1), so bit 31 flips exactly when the last CTA arrives and the low bits are back
    at 0: the same word serves every call and every CUDA-graph replay without a reset. One
    atomic and one poll per CTA (the scheme of CUDA's cooperative-groups grid sync); the
    version before (a counter the last CTA reset and a generation it bumped) had two more
    round trips to L2 on the path. The caller brackets this with CTA barriers, so the CTA's
    earlier writes are ordered before the fence here and its later reads after the last one.
    """
    _stmt([Int64(state).ir_value(loc=loc, ip=ip), _i32(master, loc, ip), _i32(last, loc, ip)],
          "{\n"
          ".reg .pred p;\n"
          ".reg .b32 nb, old, cur;\n"
          "setp.ne.u32 p, $1, 0;\n"
          "sub.u32 nb, 0x80000000, $2;\n"
          "selp.u32 nb, nb, 1, p;\n"
          "fence.acq_rel.gpu;\n"
          "atom.relaxed.gpu.global.add.u32 old, [$0], nb;\n"
          "WAIT_${:uid}:\n"
          "ld.relaxed.gpu.global.u32 cur, [$0];\n"
          "xor.b32 cur, cur, old;\n"
          "setp.lt.s32 p, cur, 0;\n"
          "@!p bra WAIT_${:uid};\n"
          "fence.acq_rel.gpu;\n"
          "}", "l,r,r")


@dsl_user_op
def grid_dependency_wait(*, loc=None, ip=None):
    """Programmatic dependent launch (kernels launched with `use_pdl`, jit.PDL): wait until the
    previous kernel on the stream has completed and its writes are visible. Called first by
    every kernel launched that way, before it touches global memory; a no-op for a plain
    launch. (Only an FC1 with FC2 beside it, moe-gated's and moe-generic's, also issues
    launch_dependents, below. In every kernel at its start, b6e5a8a, it made the layer 14-18%
    slower at T = 128-512 in a same-run `kernel-ab`; issued once a CTA had no more work,
    80735b8, it measured level, +0.15% over 30 band points; benchmarks/HISTORY.md.)"""
    _stmt([], "griddepcontrol.wait;", "~{memory}")


@dsl_user_op
def launch_dependents(*, loc=None, ip=None):
    """Programmatic dependent launch: let the next kernel on the stream launch once every CTA
    of this grid has issued this or exited. Its CTAs then take SMs as this grid's leave; it must
    not read this grid's results before it has waited for them (moe-gated's and moe-generic's
    FC2 beside FC1: by per-tile counts, count_wait_acquire_gpu)."""
    _stmt([], "griddepcontrol.launch_dependents;", "")


# ---------------------------------------------------------------- mbarriers, bulk copies
@dsl_user_op
def mbarrier_init(addr, count, *, loc=None, ip=None):
    _stmt([Int32(addr).ir_value(loc=loc, ip=ip), _i32(count, loc, ip)],
          "mbarrier.init.shared::cta.b64 [$0], $1;", "r,r")


@dsl_user_op
def fence_mbarrier_init(*, loc=None, ip=None):
    """Make mbarrier.init visible to the async proxy (bulk copies) before first use."""
    _stmt([], "fence.mbarrier_init.release.cluster;", "")


@dsl_user_op
def mbarrier_arrive(addr, *, loc=None, ip=None):
    _stmt([Int32(addr).ir_value(loc=loc, ip=ip)],
          "{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [$0]; }", "r")


@dsl_user_op
def mbarrier_arrive_expect_tx(addr, nbytes, *, loc=None, ip=None):
    """Arrive once and add nbytes to the phase's expected transaction count."""
    _stmt([Int32(addr).ir_value(loc=loc, ip=ip), _i32(nbytes, loc, ip)],
          "{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [$0], $1; }", "r,r")


@dsl_user_op
def mbarrier_wait(addr, parity, *, loc=None, ip=None):
    """Spin until the phase with this parity (0/1) of the mbarrier has completed."""
    _stmt([Int32(addr).ir_value(loc=loc, ip=ip), _i32(parity, loc, ip)],
          "{\n.reg .pred p;\nWAIT_${:uid}:\n"
          "mbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1;\n"
          "@!p bra WAIT_${:uid};\n}", "r,r")


# a bulk copy global -> shared that completes its bytes on an mbarrier
_BULK_G2S = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
# the same with an L2 eviction policy (the asm block's 64-bit register `pol`, _POLICY_EVICT_FIRST)
_BULK_G2S_HINT = _BULK_G2S + ".L2::cache_hint"
# Lines a copy reads under this policy are the first the L2 evicts. A layer reads each weight
# byte once per call, while the buffers it writes and reads back (tile-blocked token rows, the
# intermediate, y: 12-30% of the weight bytes at the small-expert presets in the band) wait in
# L2 for their reader with the weights streaming past them; ptxas folds the policy into a
# constant descriptor (UBLKCP ... desc[URn]). The policy alone (12327f9 against 2a553aa, H200,
# same run, `tools/gpu_steps.sh band-ab`): T = 512..2048 -1.9% to +0.8% (Qwen3.5-35B T=512
# 171.8 -> 168.6 us); with 12c1ee7 and edd0ccf (672f63a, H100) T = 64..256 up to 6% faster
# (BENCHMARKS.md, "Measured decisions").
_POLICY_EVICT_FIRST = [".reg .b64 pol;", "createpolicy.fractional.L2::evict_first.b64 pol, 1.0;"]


def _bulk_g2s(dst: str, src: str, nbytes, mbar: str, evict_first: bool) -> str:
    """The text of one bulk copy (operands as PTX text), with `pol` where evict_first."""
    if evict_first:
        return f"{_BULK_G2S_HINT} [{dst}], [{src}], {nbytes}, [{mbar}], pol;"
    return f"{_BULK_G2S} [{dst}], [{src}], {nbytes}, [{mbar}];"


class BulkCopy(NamedTuple):
    """One copy of bulk_copies_g2s_elected: nbytes from global src to shared dst; only where the
    run-time Int32 `when` is positive (None: always); evict_first: its lines under
    _POLICY_EVICT_FIRST (for data the call reads once: the weights)."""
    dst: object
    src: object
    nbytes: object
    when: object = None
    evict_first: bool = False


@dsl_user_op
def bulk_copy_g2s(smem_addr, gmem_addr, nbytes, mbar, *, loc=None, ip=None):
    """cp.async.bulk global -> shared (16-byte aligned, nbytes a multiple of 16), completing
    nbytes of transactions on the mbarrier."""
    _stmt([Int32(smem_addr).ir_value(loc=loc, ip=ip), Int64(gmem_addr).ir_value(loc=loc, ip=ip),
           _i32(nbytes, loc, ip), Int32(mbar).ir_value(loc=loc, ip=ip)],
          _bulk_g2s("$0", "$1", "$2", "$3", False),
          "r,l,r,r")


@dsl_user_op
def bulk_copy_groups_g2s_elected(mbar, dst, srcs, group_stride, nbytes, groups: int,
                                 dst_step: int, live, evict_first: bool = False, *, loc=None,
                                 ip=None):
    """One elected lane of a converged warp copies min(live, groups) groups of regions (global
    -> shared) that complete on the mbarrier: group j's region r (of len(srcs)) is nbytes[r]
    bytes from srcs[r] + j x group_stride x nbytes[r] to dst + j x dst_step + sum(nbytes[:r])
    (live, group_stride: run-time Int32). ptxas issues the copies from uniform registers, as
    under bulk_copies_g2s_elected. The walk over the groups is a loop inside the asm block
    (its labels are local to the braces): unrolled, the compiler hoisted an address per group
    and region out of the caller's K-tile loop and moe-gated spilled (its 40-register producer,
    and 52 bytes in the consumers of the wide FC1, whose own PTX had not changed).
    evict_first: every copy under _POLICY_EVICT_FIRST."""
    n = len(srcs)
    ops = [Int32(mbar).ir_value(loc=loc, ip=ip), Int32(dst).ir_value(loc=loc, ip=ip),
           _i32(live, loc, ip), _i32(group_stride, loc, ip)]
    ops += [Int64(a).ir_value(loc=loc, ip=ip) for a in srcs]
    text = ["{", ".reg .pred p, q;", ".reg .b32 d, j, m;", f".reg .b64 a<{n}>, s<{n}>;",
            "elect.sync _|p, 0xffffffff;", "mov.b32 d, $1;", "min.s32 m, $2, %d;" % groups,
            "mov.b32 j, 0;"] + (_POLICY_EVICT_FIRST if evict_first else [])
    text += [f"mov.b64 a{r}, ${4 + r};" for r in range(n)]
    text += [f"mul.wide.s32 s{r}, $3, {nbytes[r]};" for r in range(n)]
    text += ["@!p bra DONE;", "LOOP:", "setp.lt.s32 q, j, m;", "@!q bra.uni DONE;"]
    off = 0
    for r in range(n):
        text.append(_bulk_g2s(f"d+{off}", f"a{r}", nbytes[r], "$0", evict_first))
        off += nbytes[r]
    text += ["add.u32 d, d, %d;" % dst_step, "add.s32 j, j, 1;"]
    text += [f"add.s64 a{r}, a{r}, s{r};" for r in range(n)]
    text += ["bra.uni LOOP;", "DONE:"]
    _stmt(ops, "\n".join(text + ["}"]), ",".join(["r"] * 4 + ["l"] * n))


@dsl_user_op
def bulk_copies_g2s_elected(mbar, tx_bytes, copies, *, loc=None, ip=None):
    """One lane of a converged warp, chosen by elect.sync, arrives on the mbarrier expecting
    tx_bytes (None: no arrival) and starts the bulk copies (global -> shared) `copies`,
    BulkCopy fields each (a tuple (dst, src, nbytes[, when]) is one); they complete on the
    mbarrier. Every lane passes the same operands. Under
    elect.sync ptxas issues each copy once from uniform registers; under `if lane == 0` it wraps
    each in a loop over the active lanes' values (~25 SASS instructions a copy, moe-static's
    _fill)."""
    copies = [BulkCopy(*c) for c in copies]
    ops = [Int32(mbar).ir_value(loc=loc, ip=ip)]
    cons = ["r"]
    text = ["{", ".reg .pred p, q;" if any(c.when is not None for c in copies)
            else ".reg .pred p;", "elect.sync _|p, 0xffffffff;"]
    if any(c.evict_first for c in copies):
        text[2:2] = _POLICY_EVICT_FIRST
    if tx_bytes is not None:
        ops.append(_i32(tx_bytes, loc, ip))
        cons.append("r")
        text[2:2] = [".reg .b64 st;"]
        text.append("@p mbarrier.arrive.expect_tx.shared::cta.b64 st, [$0], $1;")
    for copy in copies:
        k = len(ops)
        ops += [Int32(copy.dst).ir_value(loc=loc, ip=ip), Int64(copy.src).ir_value(loc=loc, ip=ip),
                _i32(copy.nbytes, loc, ip)]
        cons += ["r", "l", "r"]
        pred = "p"
        if copy.when is not None:
            ops.append(_i32(copy.when, loc, ip))
            cons.append("r")
            text.append(f"setp.gt.and.s32 q, ${k + 3}, 0, p;")
            pred = "q"
        text.append(f"@{pred} " + _bulk_g2s(f"${k}", f"${k + 1}", f"${k + 2}", "$0",
                                            copy.evict_first))
    _stmt(ops, "\n".join(text + ["}"]), ",".join(cons))
