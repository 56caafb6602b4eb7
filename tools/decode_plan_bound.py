"""How few integer instructions an e2m1 fragment decode can take (development tool, CPU only).

fragments.DECODE_PLAN turns two packed words (16 codes) into 8 bf16x2 registers. A register is
the OR of pieces; a piece is a window of the packed bits ANDed with a subset of FIELD_BITS
(magnitude at bf16 bits 6..8, sign at 15, in both halves). Windows: a word as it is, a shift
or rotation of one word, a funnel shift across two, or a byte permute (prmt) of both. Cost:
one instruction per window that is not a plain word and one per piece. Offline packing may
place every code bit anywhere, so the question is only which windows can cover the packed bits
exactly once. Steps:
1. One word: no 4 translates of FIELD_BITS tile Z_32, so some register takes two pieces. One
   such register makes 5 pieces in 5 windows (the plain word free): >= 9, the one-word plan's
   cost (4 shifts or rotations, 5 logic operations); two make 6 pieces in >= 5 windows: >= 10.
2. Two words: a window holds at most 8 bits, so 64 bits need >= 8 windows, of which at most 2
   (the plain words) are free. Eight one-piece registers are 8 full windows (a); one
   two-piece register makes 9 pieces in 9 windows, 16 only with both plain words among them
   (b); two make 10 pieces in >= 8 windows, 16 only as (a)'s windows split; more make >= 17.
3. (a) has no cover, with prmt windows or without (full_window_plans), so 16 is the least.
   With shifts and rotations alone (b) has no plan either, 17 being their least (8.5 per
   word: this tool's search at a7cec80); with a prmt window it has two, mirror images of each
   other. fragments.PAIR_PIECES is one: 8 instructions per word against the one-word plan's 9.

    uv run python tools/decode_plan_bound.py     (seconds)
"""
from __future__ import annotations

import itertools
import sys

from moe_common.fragments import FIELD_BITS

F = FIELD_BITS


def shift_windows() -> dict:
    """Cells (word x 32 + bit) each field bit comes from, per shift window ("shf", s, hi, lo):
    the pair (hi:lo) shifted left by s, bits at or above s from hi, those below wrapping in from
    lo (None where no field bit wraps: a plain shift)."""
    wins = {}
    for s, hi, lo in itertools.product(range(32), (0, 1), (0, 1)):
        wraps = s and any(b < s for b in F)
        cells = tuple((hi if b >= s else lo) * 32 + (b - s) % 32 for b in F)
        wins.setdefault(cells, ("shf", s, hi, lo if wraps else None))
    return wins


def prmt_windows() -> dict:
    """The same for prmt(w0, w1, sel): destination byte d takes source byte sel[d] (w0's bytes
    0-3, w1's 4-7), each bit keeping its place in the byte."""
    wins = {}
    for sel in itertools.product(range(8), repeat=4):
        cells = tuple(8 * sel[b // 8] + b % 8 for b in F)
        if len(set(cells)) == len(F):
            wins.setdefault(cells, ("prmt",) + sel)
    return wins


def window_set(prmt: bool) -> list:
    wins = shift_windows()
    if prmt:
        for cells, name in prmt_windows().items():
            wins.setdefault(cells, name)
    return [(name, cells) for cells, name in wins.items()]


def one_word_tilings() -> int:
    """Tilings of Z_32 by 4 translates of FIELD_BITS (one-piece registers of one word)."""
    found = 0

    def rec(cover, count):
        nonlocal found
        if count == 4:
            found += cover == (1 << 32) - 1
            return
        low = (~cover & -~cover).bit_length() - 1
        for f in F:
            m = sum(1 << ((b - (f - low)) % 32) for b in F)
            if not m & cover:
                rec(cover | m, count + 1)

    rec(0, 0)
    return found


def full_window_plans(prmt: bool) -> int:
    """Step 3(a): exact covers of both words' 64 bits by 8 full windows."""
    wins = window_set(prmt)
    sets = [frozenset(c) for _, c in wins]
    by_cell = [[i for i, c in enumerate(sets) if x in c] for x in range(64)]

    def rec(cover) -> int:
        if len(cover) == 64:
            return 1
        x = next(i for i in range(64) if i not in cover)
        return sum(rec(cover | sets[i]) for i in by_cell[x] if not sets[i] & cover)

    return rec(frozenset())


def plan_cost(plan) -> int:
    """A DECODE_PLAN's instructions: a piece each, a window each that is not a plain word."""
    windows = {(op, word, n) for pieces in plan for op, word, n, _ in pieces if op != "none"}
    return sum(len(pieces) for pieces in plan) + len(windows)


def main() -> int:
    from moe_common.fragments import DECODE_PLAN

    print(f"1. one word: tilings of Z_32 by 4 translates: {one_word_tilings()}")
    for prmt in (False, True):
        kind = "shifts, rotations and prmt" if prmt else "shifts and rotations"
        print(f"3a. two words, {kind}: covers by 8 full windows: {full_window_plans(prmt)}")
    print(f"fragments.DECODE_PLAN: {plan_cost(DECODE_PLAN)} instructions per two words")
    return 0


if __name__ == "__main__":
    sys.exit(main())
