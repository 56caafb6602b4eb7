"""moe-generic's tile-width rule against the widths' measured times (CPU: `runner.pick_bn` on the
presets' shapes, the times from the recorded benchmark JSON).

Each JSON below timed moe-generic at the same points with its tile width forced, in one run of
the tree it names; WIDTHS maps a row's kernel label to the width (and config) it ran, where that
config is still the one `compile_cache.config` builds for the width. At every point timed at
two or more widths, the width the rule picks must be within 3% of the fastest (as
test_dispatch_measured holds the dispatcher's kernel choice), so moving MID_MIN_ROWS or
WIDE_MIN_ROWS against a recorded measurement fails here until it is measured again.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from dispatcher.presets import PRESETS
from moe_generic.runner import pick_bn

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# file -> {row kernel label: tile width}; at ea2bbc3 the dispatcher ran 32-token tiles below 64
# routed rows per expert, and '48:stages=2' is today's 48-token config
WIDTHS = {
    "2026-12-02-h200-ea2bbc3-mid-widths.json": {"auto(moe-generic)": 32,
                                                 "moe-generic 48:stages=2": 48},
}
TOLERANCE = 1.03


def _points():
    points = []
    for name, labels in WIDTHS.items():
        times = defaultdict(dict)  # (preset, T) -> {width: us}
        for row in json.loads((BENCHMARKS / name).read_text()):
            if row["kernel"] in labels:
                times[(row["shape"], row["T"])][labels[row["kernel"]]] = row["median_us"]
        points += [(name, preset, T, t) for (preset, T), t in sorted(times.items()) if len(t) > 1]
    return points


@pytest.mark.parametrize("source,preset,tokens,times", _points(),
                         ids=lambda v: v if isinstance(v, (str, int)) else "")
def test_the_width_is_within_3_percent_of_the_fastest(source, preset, tokens, times):
    p = PRESETS[preset]
    chosen = pick_bn(tokens * p.top_k, p.experts)
    fastest = min(times, key=times.get)
    assert chosen in times, (chosen, times)
    assert times[chosen] <= TOLERANCE * times[fastest], (
        f"{preset} T={tokens}: pick_bn gives {chosen} tokens ({times[chosen]:.1f} us), "
        f"{fastest} ran {times[fastest]:.1f} us ({source})")


def test_the_measurements_reach_both_sides_of_the_mid_cutover():
    """Points on each side of runner.MID_MIN_ROWS (a rule moved past all of them would
    otherwise pass unchecked)."""
    chosen = {pick_bn(T * PRESETS[p].top_k, PRESETS[p].experts) for _, p, T, _ in _points()}
    assert chosen == {32, 48}
