"""moe-generic's token-tile width against the layer time (development tool).

    python tools/band_probe.py --preset deepseek-v3 --tokens 256 512 --bn 8 16 32 64 --json out.json
    python tools/band_probe.py --preset qwen3-30b-a3b --tokens 256 --bn \
        --config 32:stages=3 '*/fc2:width_step=16'

For each forced tile width (runner.pick_bn replaced in this process), times the layer with the
bench's protocol (dispatcher.bench.bench_preset: CUDA-graph replay, data rotated past the L2)
with moe-generic forced; `--kernels` adds other kernels' rows (once, at their own choices).
`--config BN[/PHASE]:FIELD=VALUE,...` times moe-generic with its tiles BN tokens wide (forced)
and those GemmConfig fields replaced in both GEMMs or in PHASE (fc1, fc2); `*` in place of BN:
at the dispatcher's widths, every one of them changed.
A tile is (expert, at most bn routed rows), and each tile streams its expert's weights, so a
width below an expert's routed rows reads that expert's weights once per tile.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json

import moe_generic.runner as generic_runner
from config_probe import parse_fields, rows_with_config  # tools/, this script's directory
from dispatcher.bench import bench_preset, format_row
from dispatcher.presets import PRESETS


@contextlib.contextmanager
def forced_width(bn):
    """moe-generic's tiles `bn` tokens wide (runner.pick_bn replaced) inside the block; None
    leaves the dispatcher's width rule."""
    default_pick = generic_runner.pick_bn
    if bn is not None:
        generic_runner.pick_bn = lambda pairs, experts: bn
    try:
        yield
    finally:
        generic_runner.pick_bn = default_pick


def config_rows(p, tokens, variant: str, seed: int) -> list:
    """moe-generic rows with GemmConfig fields replaced (--config), its width forced to BN
    unless BN is `*`."""
    which, fields = variant.split(":")
    bn, _, phase = which.partition("/")
    changes = parse_fields(fields)

    def change(cfg):
        if bn in ("*", str(cfg.bn)) and phase in ("", cfg.phase):
            return dataclasses.replace(cfg, **changes)
        return cfg

    with forced_width(None if bn == "*" else int(bn)):
        return rows_with_config("moe-generic", p, tokens, variant, change, seed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", nargs="+", default=["deepseek-v3"], choices=sorted(PRESETS))
    ap.add_argument("--tokens", nargs="+", type=int, default=[256, 512, 1024, 2048])
    ap.add_argument("--bn", nargs="*", type=int, default=[8, 16, 32, 64])
    ap.add_argument("--kernels", nargs="*", default=[])
    ap.add_argument("--config", nargs="*", default=[])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for name in args.preset:
        p = PRESETS[name]
        if args.kernels:
            rows += bench_preset(p, args.tokens, kernels=args.kernels, seed=args.seed, check=False)
        for bn in args.bn:
            with forced_width(bn):
                widths = bench_preset(p, args.tokens, kernels=["moe-generic"], seed=args.seed,
                                      check=False, log=lambda s: None)
            for r in widths:
                r["kernel"] = f"moe-generic bn={bn}"
                print(format_row(r), flush=True)
                rows.append(r)
        for variant in args.config:
            rows += config_rows(p, args.tokens, variant, args.seed)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
