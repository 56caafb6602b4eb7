"""A few layer calls of one kernel package at a DeepSeek-V3-sized expert shape, for ncu
(development tool).

    ncu --clock-control none --kernel-name regex:StaticMoE --launch-skip 1 -c 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        python3 tools/profile_layer.py [--kernel static] [--tokens 1] [--experts 16]

E=16 experts of H=7168, I=2048 (8 hit at T=1, k=8): 220 MB of packed weights, several times
the 50 MB L2, so the launch streams from HBM as a real DeepSeek-V3 layer does.
"""
from __future__ import annotations

import argparse
import importlib

import torch

from moe_common.testing import random_layer, random_routing


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", default="static", choices=["static", "generic", "gated"])
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--top-k", type=int, default=8, dest="top_k")
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=3)
    args = ap.parse_args()
    fused_moe = importlib.import_module(f"moe_{args.kernel}").fused_moe
    w = random_layer(args.experts, args.hidden, args.intermediate)
    x = torch.randn(args.tokens, args.hidden, device="cuda").bfloat16()
    tw, ti = random_routing(args.tokens, args.experts, args.top_k)
    for _ in range(args.calls):
        fused_moe(x, w, tw, ti)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        fused_moe(x, w, tw, ti)
    end.record()
    torch.cuda.synchronize()
    print(f"T={args.tokens} E={args.experts} H={args.hidden} I={args.intermediate}: "
          f"{start.elapsed_time(end) / 20 * 1e3:.1f} us per call (eager, incl. launch)")


if __name__ == "__main__":
    main()
