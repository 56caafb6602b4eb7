"""How few integer instructions an e2m1 fragment decode can take (development tool, CPU only).

fragments.DECODE_PLAN turns one packed word (8 codes) into 4 bf16x2 registers in 9 integer
instructions. A register is the OR of pieces; a piece is a window of the packed bits (a word
as it is, a shift or rotation of one word, or a funnel shift across two) ANDed with a subset of
FIELD_BITS (magnitude at bf16 bits 6..8, sign at 15, in both halves). Cost: one logic
instruction per piece plus one per window that is not a plain word. Offline packing may place
every code bit anywhere, so the question is only which windows can cover the packed bits
exactly once. Steps:
1. One word: a window's field bits are FIELD_BITS translated mod 32; no 4 translates tile
   Z_32, so some register takes two pieces. One such register makes 5 pieces in 5 windows
   (the plain word free): >= 9, DECODE_PLAN's cost; two make 6 pieces in >= 5 windows (4 would
   be a tiling): >= 10.
2. Two words decoded together (funnel windows may take bits from both words): a window holds
   at most 8 bits, so 64 bits need >= 8 windows, of which at most 2 (the plain words) are
   free. Eight one-piece registers are 8 full windows (a); one two-piece register makes 9
   pieces in 9 windows, 16 only with both plain words among them (b); two make 10 pieces in
   >= 8 windows, 16 only as (a)'s windows split between registers; more make >= 17.
3. (a) is a 2-fold tiling of Z_32 by 8 translates with each window's bits assigned to the two
   words: 512 tilings, none assignable. (b): 7 full translates and a split register covering
   Z_32 twice, none assignable. So with shifts, rotations and funnel shifts a joint plan takes
   >= 17 per two words, 8.5 per word against 9. A byte permute (prmt) of both words as a
   window reaches 16, 8 per word: benchmarks/candidates/pair-decode (its version of this tool
   searches those windows too).

    uv run python tools/decode_plan_bound.py     (about 20 s)
"""
from __future__ import annotations

import itertools
import sys
from collections import Counter

from moe_common.fragments import FIELD_BITS

F = FIELD_BITS


def positions(shift: int, bits=F) -> list:
    """Word positions a window shifted left by `shift` takes `bits` from (mod 32)."""
    return [(b - shift) % 32 for b in bits]


def cells(shift: int, bits, hi: int, lo) -> list:
    """(word, position) of each of `bits` for a funnel shift of (hi:lo) left by `shift`: bits
    at or above the shift come from hi, the ones below it wrap in from lo."""
    return [(hi if b >= shift else lo, (b - shift) % 32) for b in bits]


def window_choices(shift: int, bits) -> list:
    """(hi, lo) word pairs a window can take (lo matters only where bits wrap)."""
    wraps = shift and any(b < shift for b in bits)
    return [(h, lo) for h in (0, 1) for lo in ((0, 1) if wraps else (None,))]


def multisets(count: int, fold: int) -> list:
    """Multisets of `count` shifts whose translates cover no position more than `fold` times."""
    found = []

    def rec(cover, chosen, start):
        if len(chosen) == count:
            found.append(tuple(chosen))
            return
        for s in range(start, 32):
            ps = positions(s)
            if all(cover[p] < fold for p in ps):
                for p in ps:
                    cover[p] += 1
                rec(cover, chosen + [s], s)
                for p in ps:
                    cover[p] -= 1

    rec([0] * 32, [], 0)
    return found


def assignable(windows: list, need_plain: bool) -> bool:
    """Whether (shift, bits) windows can take their bits from two words, every (word,
    position) exactly once; with need_plain, both words must appear as plain windows."""
    def rec(i, used, plain):
        if i == len(windows):
            return not need_plain or plain == {0, 1}
        shift, bits = windows[i]
        for hi, lo in window_choices(shift, bits):
            cs = cells(shift, bits, hi, lo)
            if used.isdisjoint(cs):
                if rec(i + 1, used | set(cs), plain | ({hi} if shift == 0 else set())):
                    return True
        return False
    return rec(0, frozenset(), set())


def one_word_tilings() -> int:
    return len(multisets(4, 1))


def full_window_plans() -> tuple:
    """Step 3(a): the 2-fold tilings by 8 translates and how many can be assigned."""
    tilings = multisets(8, 2)
    return len(tilings), sum(assignable([(s, F) for s in m], False) for m in tilings)


def splits(left: Counter, t1: int, t2: int) -> list:
    """The pieces P (F - P the other) with P at t1 and F - P at t2 covering `left` exactly."""
    found = []

    def rec(i, piece):
        if i == len(F):
            if 0 < len(piece) < len(F) and not +left:
                found.append(piece)
            return
        for t, into in ((t1, True), (t2, False)):
            p = (F[i] - t) % 32
            if left[p] > 0:
                left[p] -= 1
                rec(i + 1, piece + [F[i]] if into else piece)
                left[p] += 1

    rec(0, [])
    return found


def one_double_plans() -> tuple:
    """Step 3(b): 7 one-piece windows and a register split into P at t1 and F - P at t2,
    covering Z_32 twice, shift 0 among the 9 windows at least twice (the two plain words)."""
    candidates = assigned = 0
    for singles in multisets(7, 2):
        left = Counter({p: 2 for p in range(32)})
        left.subtract(p for s in singles for p in positions(s))
        for t1, t2 in itertools.product(range(32), repeat=2):
            if list(singles).count(0) + (t1 == 0) + (t2 == 0) < 2:
                continue
            for piece in splits(left, t1, t2):
                candidates += 1
                rest = [b for b in F if b not in piece]
                wins = [(s, F) for s in singles] + [(t1, piece), (t2, rest)]
                assigned += assignable(wins, True)
    return candidates, assigned


def main() -> int:
    print(f"1. one word: tilings of Z_32 by 4 translates: {one_word_tilings()}")
    tilings, ok = full_window_plans()
    print(f"3a. two words, 8 full windows: {tilings} 2-fold tilings, {ok} assignable")
    candidates, ok = one_double_plans()
    print(f"3b. two words, 7 one-piece registers + one of two pieces, both words plain: "
          f"{candidates} covers, {ok} assignable")
    return 0


if __name__ == "__main__":
    sys.exit(main())
