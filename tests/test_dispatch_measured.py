"""The dispatcher's choice against the kernels' measured times (CPU: `explain` on the presets'
shapes as an sm_90 GPU would see them, the times from the recorded benchmark JSON, H200 unless
the file names the H100).

Each JSON below forced every kernel at the same points in one run of the tree it names; where
two measured the same point, the later one in MEASURED stands. At every point the kernel the
dispatcher picks must be within 3% of the fastest one (issue 29's bar), so a change of
priorities or cutovers that contradicts a recorded measurement fails here until the
measurement is redone. The same holds moe-generic's tile-width rule (`runner.pick_bn`) to the
times of its widths forced (WIDTHS).
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from dispatcher import explain
from dispatcher.presets import PRESETS
from moe_generic.runner import pick_bn

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
MEASURED = [
    # moe-static against moe-generic at T = 1..128 (moe_static.limits.CUTOVER_TOKENS and
    # LARGE_EXPERT_ROWS)
    "2026-12-01-h200-b122685-static.json", "2026-12-01-h200-b122685-static-all.json",
    # moe-generic (with its producer-warp tiles) against moe-gated at 16-48 routed rows per
    # expert (moe_gated.limits.CUTOVER_ROWS_PER_EXPERT)
    "2026-12-02-h200-256bc33-cutover.json",
    # moe-gated against moe-generic, relu2 and gated presets, T = 128..16384
    "2026-12-02-h200-ded395c-relu2.json", "2026-12-01-h200-47afd6b-gated-all.json",
    # after moe-generic's bulk copies at every 32-token tile: moe-static against moe-generic at
    # T = 32-128, moe-generic against moe-gated at T = 512-2048
    "2026-12-02-h200-b7f4ca8-static-points.json", "2026-12-02-h200-b7f4ca8-cutover.json",
    # moe-static against moe-generic below one routed row per large expert (T = 8, 16)
    "2026-12-02-h200-dbc99f5-static-small.json",
    # after moe-gated's producer issued its copies from one elected lane: moe-generic against
    # moe-gated at T = 512-2048
    "2026-12-03-h200-361f507-cutover.json",
    # after moe-gated's group records and its 80- and 48-token tall widths: the same points
    "2026-12-04-h200-fc08658-cutover.json",
    # after moe-generic's round-trip cuts and moe-gated's tall ring bits: the same points
    "2026-12-05-h200-7ea0869-cutover.json",
    # between them: 20, 24 and 28 rows per expert on every preset
    "2026-12-05-h200-dfc0c62-cutover-mid.json",
    # the same after the weights went evict-first in L2 (672f63a), on an H100
    "2026-12-05-h100-436c8c7-cutover-mid-32.json", "2026-12-05-h100-436c8c7-cutover-mid-16.json",
    "2026-12-05-h100-436c8c7-cutover-mid-relu2.json",
    # moe-static against moe-generic at T = 1..128 after moe-generic's changes since b7f4ca8
    # (the points of every earlier static file), on an H100
    "2026-12-05-h100-d073081-static-small.json", "2026-12-05-h100-d073081-static-points.json",
    # every point of the three above on the H200 in one run, after moe-static's cutover went to
    # 10M weights per matrix (36e40e9)
    "2026-12-05-h200-3cbddb3-static-small.json", "2026-12-05-h200-3cbddb3-static-points.json",
    "2026-12-05-h200-3cbddb3-cutover.json",
    # moe-generic against moe-gated at 16-64 rows per expert after moe-gated's tall loop trim
    # (1028e9e), on an H100
    "2026-12-06-h100-5f71179-cutover-points.json", "2026-12-06-h100-5f71179-cutover-mid-32.json",
    "2026-12-06-h100-5f71179-cutover-mid-16.json", "2026-12-06-h100-5f71179-cutover-mid-relu2.json",
    # the same points after moe-gated's B trim and FC2 beside FC1 (5425ace, b39fa11), on an H100
    "2026-12-06-h100-e2745f5-cutover-points.json", "2026-12-06-h100-e2745f5-cutover-mid-32.json",
    "2026-12-06-h100-e2745f5-cutover-mid-16.json", "2026-12-06-h100-e2745f5-cutover-mid-relu2.json",
    # 20, 24 and 28 rows per expert after moe-generic's FC2 beside FC1 (c3c6e9c), on an H100
    "2026-12-06-h100-14ac7c2-cutover-mid-32.json", "2026-12-06-h100-14ac7c2-cutover-mid-16.json",
    "2026-12-06-h100-14ac7c2-cutover-mid-relu2.json",
    # 16, 32 and 64 rows per expert at the same kernels (9c449c2), on an H100
    "2026-12-06-h100-9c449c2-cutover-points.json",
]
# file -> {row kernel label: tile width}: moe-generic with its width forced, one run of the tree
# named; at ea2bbc3 the dispatcher ran 32-token tiles below 64 routed rows per expert, and
# '48:stages=2' is today's 48-token config
WIDTHS = {
    "2026-12-02-h200-ea2bbc3-mid-widths.json": {"auto(moe-generic)": 32,
                                                 "moe-generic 48:stages=2": 48},
}
TOLERANCE = 1.03


def _points():
    latest = {}  # (preset, T) -> (file, {kernel: us}); a later file replaces the point
    for name in MEASURED:
        times = defaultdict(dict)
        for row in json.loads((BENCHMARKS / name).read_text())["rows"]:
            if "median_us" in row and not row["kernel"].startswith("auto"):
                times[(row["shape"], row["T"])][row["kernel"]] = row["median_us"]
        latest.update({point: (name, t) for point, t in times.items() if len(t) > 1})
    return [(name, preset, T, t) for (preset, T), (name, t) in sorted(latest.items())]


def _width_points():
    points = []
    for name, labels in WIDTHS.items():
        times = defaultdict(dict)  # (preset, T) -> {width: us}
        for row in json.loads((BENCHMARKS / name).read_text()):
            if row["kernel"] in labels:
                times[(row["shape"], row["T"])][labels[row["kernel"]]] = row["median_us"]
        points += [(name, preset, T, t) for (preset, T), t in sorted(times.items()) if len(t) > 1]
    return points


def _assert_near_fastest(chosen, times, what: str, source: str):
    fastest = min(times, key=times.get)
    assert chosen in times, (chosen, times)
    assert times[chosen] <= TOLERANCE * times[fastest], (
        f"{what} {chosen} ({times[chosen]:.1f} us), {fastest} ran {times[fastest]:.1f} us "
        f"({source})")


@pytest.mark.parametrize("source,preset,tokens,times", _points(),
                         ids=lambda v: v if isinstance(v, (str, int)) else "")
def test_the_choice_is_within_3_percent_of_the_fastest(source, preset, tokens, times):
    p = PRESETS[preset]
    ex = explain(p.shape(tokens, device_capability=(9, 0)), activation=p.activation)
    _assert_near_fastest(ex.choice.kernel, times, f"{preset} T={tokens}: the dispatcher picks",
                         source)


def test_the_measurements_cover_every_preset():
    assert {preset for _, preset, _, _ in _points()} == set(PRESETS)


@pytest.mark.parametrize("source,preset,tokens,times", _width_points(),
                         ids=lambda v: v if isinstance(v, (str, int)) else "")
def test_the_width_is_within_3_percent_of_the_fastest(source, preset, tokens, times):
    p = PRESETS[preset]
    _assert_near_fastest(pick_bn(tokens * p.top_k, p.experts), times,
                         f"{preset} T={tokens}: pick_bn gives width", source)


def test_the_width_measurements_reach_both_sides_of_the_mid_cutover():
    """Points on each side of runner.MID_MIN_ROWS (a rule moved past all of them would
    otherwise pass unchecked)."""
    chosen = {pick_bn(T * PRESETS[p].top_k, PRESETS[p].experts) for _, p, T, _ in _width_points()}
    assert chosen == {32, 48}
