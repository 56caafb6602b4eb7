"""Summarize `ncu --import R --page source --csv --print-source sass` (development tool).

    ncu --import static.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 tools/ncu_sass_top.py sass.csv [--top 30]

The CSV is ~1.5 MB per kernel; this prints what the comparisons in BENCHMARKS.md use: warp
stall samples by reason, instructions executed, shared-memory wavefronts (and the excess over
ideal: bank conflicts), and the SASS lines with the most samples. A report of several kernels
(`ncu -c 2`: FC1 and FC2) has one table per kernel, each printed on its own.
"""
from __future__ import annotations

import argparse
import csv
import io


def _num(s) -> float:
    """A CSV cell as a number; empty or missing cells (short rows between kernels) are 0."""
    try:
        return float((s or "").replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    text = open(args.csv, encoding="utf-8", errors="replace").read()
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith('"Address"')]
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        rows = [r for r in csv.DictReader(io.StringIO("\n".join(lines[start:end])))
                if r.get("Source")]
        if len(starts) > 1:
            print(f"\n== kernel {n + 1} of {len(starts)}")
        _summarize(rows, args.top)


def _summarize(rows, top_n: int):
    reasons = [c for c in rows[0] if c.startswith("stall_") and "(Not Issued)" not in c]
    samples = "Warp Stall Sampling (All Samples)"
    total = sum(_num(r[samples]) for r in rows)
    print(f"SASS lines {len(rows)}, warp stall samples {total:.0f}")
    by_reason = {c: sum(_num(r[c]) for r in rows) for c in reasons}
    for c, v in sorted(by_reason.items(), key=lambda kv: -kv[1]):
        if v:
            print(f"  {c:<28} {v:8.0f} {100 * v / max(total, 1):5.1f}%")
    for col in ("Instructions Executed", "L1 Wavefronts Shared", "L1 Wavefronts Shared Ideal",
                "L1 Wavefronts Shared Excessive", "L2 Theoretical Sectors Global"):
        if col in rows[0]:
            print(f"{col:<34} {sum(_num(r[col]) for r in rows):14.0f}")
    print(f"\ntop {top_n} SASS lines by samples (address low bits, instruction, samples, "
          "top reasons):")
    for r in sorted(rows, key=lambda r: -_num(r[samples]))[:top_n]:
        n = _num(r[samples])
        top = sorted(((c, _num(r[c])) for c in reasons), key=lambda kv: -kv[1])[:3]
        why = " ".join(f"{c[6:]}={v:.0f}" for c, v in top if v)
        print(f"{n:6.0f} {100 * n / max(total, 1):5.1f}% {(r['Address'] or '')[-5:]} "
              f"{r['Source'].strip()[:52]:<52} {why}")


if __name__ == "__main__":
    main()
