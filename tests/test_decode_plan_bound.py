"""tools/decode_plan_bound.py on the CPU: fragments.DECODE_PLAN costs 16 instructions per two
words in the tool's model and its windows take every packed bit once; no plan of one piece per
register exists, for one word or two, so 16 is the least (the tool's steps 1-3)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

from moe_common.fragments import DECODE_PLAN, PAIR_PIECES, window_source

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
bound = importlib.import_module("decode_plan_bound")


def test_decode_plan_costs_16():
    assert bound.plan_cost(DECODE_PLAN) == 16


def test_decode_plan_windows_take_each_bit_once():
    taken = [window_source(window, b) for pieces in PAIR_PIECES for bits, window in pieces
             for b in bits]
    assert sorted(taken) == [(w, p) for w in range(2) for p in range(32)]


def test_no_plan_of_one_piece_per_register():
    assert bound.one_word_tilings() == 0
    assert bound.full_window_plans(False) == 0
    assert bound.full_window_plans(True) == 0
