"""moe-static's fixed cost, part by part (development tool; wrong outputs, timing only).

Times one layer call (CUDA-graph replay, 20 calls per graph) with parts of the kernel left out
(StaticConfig.skip): the launch alone, + routing, + the two grid barriers, + the reduce, and
the whole kernel, at a Qwen3-30B-A3B-sized layer. The layer is called through FusedMoE with its
workspace, as `fused-moe bench` does (a direct call allocates and zeroes its buffers per call:
two fill kernels, 2.4 us, in the graph; the table measured at 24a91be included them). One routing
is replayed, so the hit experts' weights stay in L2: the whole-kernel time is not the bench's
cold stream.

    python3 tools/static_fixed_cost.py [--tokens 1 8]
"""
from __future__ import annotations

import argparse

import torch

from dispatcher import FusedMoE
from dispatcher.bench import graph_time_us
from moe_common.testing import random_layer, random_routing
from moe_static import compile_cache

PARTS = ("tasks", "route", "barriers", "reduce")
SETS = [  # (label, parts skipped)
    ("launch only", PARTS),
    ("+ route", ("tasks", "barriers", "reduce")),
    ("+ barriers", ("tasks", "route", "reduce")),
    ("+ reduce", ("tasks", "route", "barriers")),
    ("all but tasks", ("tasks",)),
    ("no barriers (wrong)", ("barriers",)),
    ("whole kernel", ()),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=768)
    args = ap.parse_args()
    w = random_layer(args.experts, args.hidden, args.intermediate)
    for T in args.tokens:
        x = torch.randn(T, args.hidden, device="cuda").bfloat16()
        tw, ti = random_routing(T, args.experts, 8)
        for label, skip in SETS:
            compile_cache.SKIP = frozenset(skip)
            layer = FusedMoE(w, T, 8, kernel="moe-static").warmup([T])  # compiles, allocates
            t = graph_time_us([lambda: layer(x, tw, ti)] * 20)
            print(f"T={T:4d} {label:22s} {t['median_us']:7.1f} us", flush=True)


if __name__ == "__main__":
    main()
