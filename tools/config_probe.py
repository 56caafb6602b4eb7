"""A kernel package with its config's fields replaced, against its own choice (development tool).

    python tools/config_probe.py --kernel moe-static --preset qwen3-30b-a3b deepseek-v3 \
        --tokens 1 2 4 8 --config team_fc1=1 team_fc1=1,team_fc2=1 [--seed 1] [--json out.json]
    python tools/config_probe.py --kernel moe-gated --preset deepseek-v3 --tokens 1024 2048 \
        --config geometry=tall

Steps:
1. Per preset, time the kernel as its runner configures it (`fused-moe bench`'s protocol,
   dispatcher.bench.bench_preset: CUDA-graph replay, data rotated past the L2).
2. For each `--config FIELD=VALUE,...`, time it again with its compile_cache.config's result
   replaced by those fields (every choice the runner makes, team shape or geometry, keeps the
   rest), same seed, so the same routing and data.
3. Print one row per (preset, T, variant); `--json` writes them all.
Candidates need their GPU correctness run first (each package's GPU tests,
`test_config_candidates_match_reference`). moe-generic's widths: tools/band_probe.py.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json

from dispatcher.bench import bench_preset, format_row
from dispatcher.presets import PRESETS

KERNELS = ("moe-static", "moe-gated", "moe-generic")


def parse_fields(fields: str) -> dict:
    """'a=1,b=tall,c=True' -> {'a': 1, 'b': 'tall', 'c': True} (integers as int, True and False
    as bool, the rest as str)."""
    pairs = (f.split("=", 1) for f in fields.split(","))
    return {k: _value(v) for k, v in pairs}


def _value(v: str):
    if v.lstrip("-").isdigit():
        return int(v)
    return {"True": True, "False": False}.get(v, v)


def rows_with_config(kernel: str, p, tokens, label: str, change, seed: int) -> list:
    """The kernel's bench rows with every configuration its compile_cache.config returns passed
    through change(cfg) first, labelled `kernel label`."""
    cache = importlib.import_module(kernel.replace("-", "_") + ".compile_cache")
    default_config = cache.config

    def config(*a, **kw):
        cfg = default_config(*a, **kw)
        candidate = change(cfg)
        if kernel == "moe-generic":  # a replacement that cannot run this GEMM right
            rows = kw.get("rows", a[4] if len(a) > 4 else 0)
            tail = kw.get("k_tail", a[6] if len(a) > 6 else False)
            reason = cache.unfit_reason(candidate, rows, tail)
            if reason is not None:
                print(f"# {kernel} {label}: its own config ({reason})", flush=True)
                return cfg
        return candidate

    cache.config = config
    try:
        rows = bench_preset(p, tokens, kernels=[kernel], seed=seed, check=False,
                            log=lambda s: None)
    finally:
        cache.config = default_config
    for r in rows:
        r["kernel"] = f"{kernel} {label}"
        print(format_row(r), flush=True)
    return rows


def variant_rows(kernel: str, p, tokens, variant: str, seed: int) -> list:
    """The kernel's rows with its config's fields replaced (one --config)."""
    changes = parse_fields(variant)
    return rows_with_config(kernel, p, tokens, variant,
                            lambda cfg: dataclasses.replace(cfg, **changes), seed)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", required=True, choices=KERNELS)
    ap.add_argument("--preset", nargs="+", default=["qwen3-30b-a3b"], choices=sorted(PRESETS))
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--config", nargs="+", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for name in args.preset:
        p = PRESETS[name]
        rows += bench_preset(p, args.tokens, kernels=[args.kernel], seed=args.seed, check=False)
        for variant in args.config:
            rows += variant_rows(args.kernel, p, args.tokens, variant, args.seed)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
