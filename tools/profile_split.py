"""Where a kernel package's time goes: per-kernel GPU time of one layer call (development tool).

    python tools/profile_split.py [--kernel generic|gated|static] [--preset deepseek-v3] [--tokens 8192]

Runs the call once to compile and allocate, then `--calls` times under torch.profiler, and
prints each GPU kernel's mean time per call (routing, FC1, FC2, top-k reduce, and any torch
ops). For hardware counters run the same script under
`ncu --clock-control none --kernel-name regex:kernel_cutlass -c 4 python3 tools/profile_split.py
--no-profiler` (tools/gpu_steps.sh ncu-band).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
from collections import defaultdict

import torch

from dispatcher.presets import PRESETS, random_inputs, random_weights


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", default="generic", choices=["generic", "gated", "static"])
    ap.add_argument("--preset", default="deepseek-v3", choices=sorted(PRESETS))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--no-profiler", action="store_true",
                    help="run the calls without torch.profiler (under ncu, which needs CUPTI alone)")
    args = ap.parse_args()
    fused_moe = importlib.import_module(f"moe_{args.kernel}").fused_moe
    p = PRESETS[args.preset]
    w = random_weights(p, device="cuda", seed=1)
    gen = torch.Generator(device="cuda").manual_seed(2)
    x, tw, ids = random_inputs(p, args.tokens, device="cuda", gen=gen)
    out = torch.empty_like(x)
    fused_moe(x, w, tw, ids, activation=p.activation, out=out)  # compile, repack, allocate
    torch.cuda.synchronize()
    profiler = (contextlib.nullcontext() if args.no_profiler else
                torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]))
    with profiler as prof:
        for _ in range(args.calls):
            fused_moe(x, w, tw, ids, activation=p.activation, out=out)
        torch.cuda.synchronize()
    if args.no_profiler:
        return
    # a kernel launched m times per call (moe-gated's FC1 and FC2 share one name) is listed
    # as name [0] .. name [m-1], in launch order
    evs = sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda ev: ev.time_range.start)
    count = defaultdict(int)
    for ev in evs:
        count[ev.name] += 1
    seen = defaultdict(int)
    per = defaultdict(float)
    for ev in evs:
        m = max(1, count[ev.name] // args.calls)
        label = ev.name[:80] + (f" [{seen[ev.name] % m}]" if m > 1 else "")
        seen[ev.name] += 1
        per[label] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    total = sum(per.values()) / args.calls
    print(f"moe-{args.kernel} {p.name} T={args.tokens}: {total:.1f} us of GPU kernels per call")
    for name, t in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"{t / args.calls:10.1f} us  {100 * t / args.calls / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
