"""tools/decode_plan_bound.py on the CPU: its model prices fragments.DECODE_PLAN at 9, and the
quick steps of its bound (no one-word tiling; no assignable 2-fold tiling) hold."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

from moe_common.fragments import DECODE_PLAN, REGISTER_PIECES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
bound = importlib.import_module("decode_plan_bound")


def test_decode_plan_costs_9_in_the_tools_model():
    pieces = sum(len(p) for p in DECODE_PLAN)
    windows = {n for p in DECODE_PLAN for op, n, _ in p if op != "none"}
    assert pieces + len(windows) == 9


def test_decode_plan_windows_cover_the_word_once():
    # the one-word plan as windows of one word (hi = lo = 0): every bit taken exactly once
    taken = [c for pieces in REGISTER_PIECES for bits, rot in pieces
             for c in bound.cells(rot, bits, 0, 0)]
    assert sorted(taken) == [(0, p) for p in range(32)]


def test_no_single_piece_plan_for_one_or_two_words():
    assert bound.one_word_tilings() == 0
    assert bound.full_window_plans() == (512, 0)
