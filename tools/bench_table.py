#!/usr/bin/env python3
"""BENCHMARKS.md's tables from `fused-moe bench --json` files (development tool, CPU only).

    python3 tools/bench_table.py NEW.json [--against OLD.json [--gate RATIO]] [--bars]

1. The table: one row per preset, one column per T, each cell the time in us and the kernel
   that ran (S moe-static, N moe-generic, G moe-gated); one table per kernel label where the
   run forced several kernels.
2. `--against`: each point's time over OLD's at the same (preset, T, kernel label), the
   geomean, and the range of each kernel that ran in NEW, as the A/B paragraphs quote them.
   Same-run A/Bs only carry a decision (BENCHMARKS.md, "Method"). `--gate RATIO`: exit status
   1 when that geomean (NEW over OLD) is above RATIO or no point is shared, so that one device
   call can measure a candidate first and verify it only when it is faster
   (tools/gpu_steps.sh land-candidate).
3. `--bars`: issue 29's bars (times in us; nemotron-relu2 T=8192 in TFLOP/s), each met or
   short, with the margin. They were set on the H200; the tool says so when the run is not.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict

LETTERS = {"moe-static": "S", "moe-generic": "N", "moe-gated": "G"}
# issue 29's bars on the dispatcher's choice: (preset, T) -> the most us per call
BARS = {
    ("deepseek-v3", 128): 1750, ("deepseek-v3", 256): 1900, ("deepseek-v3", 512): 2100,
    ("deepseek-v3", 1024): 2480, ("deepseek-v3", 2048): 3350,
    ("qwen3-30b-a3b", 128): 128, ("qwen3-30b-a3b", 256): 130, ("qwen3-30b-a3b", 512): 167,
    ("qwen3-30b-a3b", 1024): 213, ("qwen3-30b-a3b", 2048): 400,
    ("qwen3.5-35b", 128): 149, ("qwen3.5-35b", 256): 159, ("qwen3.5-35b", 512): 171,
    ("qwen3.5-35b", 1024): 222, ("qwen3.5-35b", 2048): 327,
    ("gpt-oss-120b", 128): 560, ("gpt-oss-120b", 512): 800, ("gpt-oss-120b", 2048): 1280,
    ("nemotron-relu2", 2048): 700,
}
# and (preset, T) -> the least TFLOP/s
TFLOPS_BARS = {("nemotron-relu2", 8192): 450}


def load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def points(result: dict) -> dict:
    """(preset, T, kernel label) -> row, rows that failed left out; the dispatcher's rows
    ("auto(moe-gated)") labelled "auto", so that a point whose kernel changed still pairs."""
    return {(r["shape"], r["T"], r["kernel"].split("(")[0]): r
            for r in result["rows"] if "error" not in r}


def cell(row: dict) -> str:
    return f"{row['time_us']:.1f} {LETTERS.get(row.get('runs'), '?')}"


def tables(result: dict) -> str:
    """Markdown tables, one per kernel label, presets and T in the run's order."""
    by_label = defaultdict(dict)
    for (shape, t, label), row in points(result).items():
        by_label[label][(shape, t)] = row
    out = []
    for label, rows in by_label.items():
        shapes = list(dict.fromkeys(s for s, _ in rows))
        tokens = sorted({t for _, t in rows})
        if len(by_label) > 1:
            out.append(f"{label}:\n")
        out.append("| preset | " + " | ".join(f"T={t}" for t in tokens) + " |")
        out.append("|---|" + "---:|" * len(tokens))
        for s in shapes:
            cells = [cell(rows[(s, t)]) if (s, t) in rows else "" for t in tokens]
            out.append(f"| {s} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def _ratios(new: dict, old: dict) -> dict:
    """Each shared point's (NEW's time over OLD's, OLD's point, NEW's point), in NEW's order."""
    a, b = points(old), points(new)
    return {k: (b[k]["time_us"] / a[k]["time_us"], a[k], b[k]) for k in b if k in a}


def _geomean(xs: list) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def geomean_ratio(new: dict, old: dict):
    """The geomean over shared points of NEW's time over OLD's; None when none is shared."""
    ratios = _ratios(new, old)
    return _geomean([x for x, _, _ in ratios.values()]) if ratios else None


def against(new: dict, old: dict) -> str:
    """Each shared point's change, the geomean, and each kernel's range (by the kernel that ran
    in the new run)."""
    ratios = _ratios(new, old)
    if not ratios:
        return "no point in common"
    lines, per_kernel = [], defaultdict(list)
    for key, (x, p_old, p_new) in ratios.items():
        per_kernel[p_new.get("runs")].append((x, key))
        lines.append(f"{key[0]:<16} {key[1]:>6} {key[2]:<24} {p_old['time_us']:>9.1f} -> "
                     f"{p_new['time_us']:>9.1f} {100 * (x - 1):+6.1f}%")
    geomean = _geomean([x for x, _, _ in ratios.values()])
    lines.append(f"geomean {100 * (geomean - 1):+.2f}% over {len(ratios)} points")
    for kernel, xs in per_kernel.items():
        lo, hi = min(xs), max(xs)
        lines.append(f"{kernel}: {len(xs)} points, {100 * (lo[0] - 1):+.1f}% ({lo[1][0]} "
                     f"T={lo[1][1]}) to {100 * (hi[0] - 1):+.1f}% ({hi[1][0]} T={hi[1][1]})")
    return "\n".join(lines)


def bars(result: dict) -> tuple[str, int]:
    """Each bar's verdict on the dispatcher's rows ("auto"); the count of bars short or not
    measured."""
    rows = {(s, t): r for (s, t, label), r in points(result).items() if label == "auto"}
    lines, short = [], 0
    if "H200" not in result.get("gpu", ""):
        lines.append(f"note: the bars were set on the H200; this run is on {result.get('gpu')}")
    for key, bar in [*BARS.items(), *TFLOPS_BARS.items()]:
        r = rows.get(key)
        if r is None:
            lines.append(f"{key[0]} T={key[1]}: not measured")
            short += 1
            continue
        if key in TFLOPS_BARS:
            ok, got = r["TFLOPs"] >= bar, f"{r['TFLOPs']:.0f} TFLOP/s against {bar}"
        else:
            ok = r["time_us"] <= bar
            got = f"{r['time_us']:.1f} us against {bar} ({100 * (r['time_us'] / bar - 1):+.1f}%)"
        short += not ok
        lines.append(f"{key[0]} T={key[1]}: {got} {'met' if ok else 'SHORT'}")
    lines.append(f"{short} of {len(BARS) + len(TFLOPS_BARS)} bars short or not measured")
    return "\n".join(lines), short


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="a fused-moe bench --json file")
    ap.add_argument("--against", help="an older run's JSON: each point's change")
    ap.add_argument("--gate", type=float, metavar="RATIO",
                    help="with --against: exit 1 unless the geomean of NEW over OLD is <= RATIO")
    ap.add_argument("--bars", action="store_true", help="issue 29's bars, met or short")
    args = ap.parse_args(argv)
    if args.gate is not None and not args.against:
        ap.error("--gate needs --against")
    new = load(args.json)
    old = load(args.against) if args.against else None
    print(f"{new.get('gpu')}, commit {new.get('commit')}, seed {new.get('seed')}\n")
    print(tables(new))
    if old is not None:
        print(against(new, old) + "\n")
    if args.bars:
        print(bars(new)[0])
    if args.gate is not None:
        ratio = geomean_ratio(new, old)
        passed = ratio is not None and ratio <= args.gate
        print(f"gate: geomean ratio {ratio if ratio is None else round(ratio, 4)} against "
              f"{args.gate}: {'pass' if passed else 'FAIL'}")
        return 0 if passed else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
