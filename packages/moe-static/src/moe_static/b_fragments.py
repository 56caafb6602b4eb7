"""One K-tile's mma B fragments for one lane, loaded by a single asm statement.

For mma.m16n8k16 lane l holds, per k16 slab s, the bf16 pairs B[16s + 2q .. +1][n] and
B[16s + 8 + 2q .. +1][n] (q = l % 4, n = l // 4): with the lane's token row at `addr` (already
offset by 2q columns) that is 16 4-byte loads at addr + 32 s and addr + 32 s + 16. As separate
statements the compiler interleaves them with the MMAs, so a tile waits for several round trips
(SASS of 766294c); in one statement all 16 are in flight before the first use.
"""
from __future__ import annotations

from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


@dsl_user_op
def load_b_tile(addr, valid_slabs, through_l2: bool, *, loc=None, ip=None):
    """16 words: [(lo, hi) for each of the 8 slabs]; slabs >= valid_slabs read nothing and give 0.

    through_l2: ld.global.cg (rows other CTAs wrote before a grid barrier), else ld.global.nc.
    No side effects: the address depends on values read after any barrier, which orders it.
    """
    op = "ld.global.cg.u32" if through_l2 else "ld.global.nc.u32"
    lines = ["{", ".reg .pred p;"]
    for s in range(8):
        lines += [f"setp.gt.s32 p, $17, {s};",
                  f"mov.b32 ${2 * s}, 0;", f"mov.b32 ${2 * s + 1}, 0;",
                  f"@p {op} ${2 * s}, [$16+{32 * s}];", f"@p {op} ${2 * s + 1}, [$16+{32 * s + 16}];"]
    lines.append("}")
    res = llvm.inline_asm(llvm.StructType.get_literal([T.i32()] * 16),
                          [Int64(addr).ir_value(loc=loc, ip=ip), Int32(valid_slabs).ir_value(loc=loc, ip=ip)],
                          "\n".join(lines), ",".join(["=&r"] * 16 + ["l", "r"]),
                          has_side_effects=False, is_align_stack=False,
                          asm_dialect=llvm.AsmDialect.AD_ATT)
    w = [Int32(llvm.extractvalue(T.i32(), res, [i])) for i in range(16)]
    return [(w[2 * s], w[2 * s + 1]) for s in range(8)]
