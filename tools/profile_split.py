"""Where a kernel package's time goes: per-kernel GPU time of one layer call (development tool).

    python tools/profile_split.py [--kernel generic|gated|static] [--preset deepseek-v3] [--tokens 8192]
    python tools/profile_split.py ... --graph [--copies 8] [--warm 2] [--replays 20]

Eager (the default): runs the call once to compile and allocate, then `--calls` times under
torch.profiler, and prints each GPU kernel's mean time per call (routing, FC1, FC2, top-k
reduce, and any torch ops). For hardware counters run the same script under
`ncu --clock-control none --kernel-name regex:kernel_cutlass -c 4 python3 tools/profile_split.py
--no-profiler` (tools/gpu_steps.sh ncu-band).

--graph: the bench's conditions, to tell the kernels' time from what lies between them:
1. `--copies` calls through `dispatcher.FusedMoE` (the kernel forced) on distinct inputs,
   captured in one CUDA graph, as `fused-moe bench` does;
2. the graph replayed for `--warm` seconds first, so the GPU runs at its sustained clock and
   power (a few eager calls run at the boost clock);
3. `--replays` replays timed by CUDA events and recorded by torch.profiler;
4. printed: each kernel's time per call, their sum, the wall time per call, and the difference
   (launch gaps and idle SMs between kernels: the part no kernel's own profile shows).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import time
from collections import defaultdict

import torch

from dispatcher.presets import PRESETS, random_inputs, random_weights


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="generic", choices=["generic", "gated", "static"])
    ap.add_argument("--preset", default="deepseek-v3", choices=sorted(PRESETS))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--no-profiler", action="store_true",
                    help="run the calls without torch.profiler (under ncu, which needs CUPTI alone)")
    ap.add_argument("--graph", action="store_true",
                    help="CUDA-graph replay of distinct inputs at the sustained clock (see above)")
    ap.add_argument("--copies", type=int, default=8, help="--graph: calls (input copies) per graph")
    ap.add_argument("--warm", type=float, default=2.0, help="--graph: seconds of replay before timing")
    ap.add_argument("--replays", type=int, default=20, help="--graph: replays timed and profiled")
    args = ap.parse_args(argv)
    if min(args.tokens, args.calls, args.copies, args.replays) < 1 or args.warm < 0:
        ap.error("--tokens, --calls, --copies and --replays must be >= 1, --warm >= 0")
    return args


def per_kernel(events, calls: int) -> dict:
    """GPU time per call of each kernel. A kernel launched m times per call (moe-gated's FC1 and
    FC2 share one name) is listed as name [0] .. name [m-1], in launch order."""
    evs = sorted((ev for ev in events if ev.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda ev: ev.time_range.start)
    count = defaultdict(int)
    for ev in evs:
        count[ev.name] += 1
    seen = defaultdict(int)
    per = defaultdict(float)
    for ev in evs:
        m = max(1, count[ev.name] // calls)
        label = ev.name[:80] + (f" [{seen[ev.name] % m}]" if m > 1 else "")
        seen[ev.name] += 1
        per[label] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    return {name: t / calls for name, t in per.items()}


def report(title: str, per: dict, wall_us: float = None) -> None:
    total = sum(per.values())
    print(f"{title}: {total:.1f} us of GPU kernels per call")
    for name, t in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"{t:10.1f} us  {100 * t / total:5.1f}%  {name}")
    if wall_us is not None:
        print(f"wall {wall_us:.1f} us per call (CUDA events); kernels {total:.1f}; "
              f"between kernels {wall_us - total:.1f} ({100 * (wall_us - total) / wall_us:.1f}%)")


def eager(args, p, w) -> None:
    fused_moe = importlib.import_module(f"moe_{args.kernel}").fused_moe
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
    if not args.no_profiler:
        report(f"moe-{args.kernel} {p.name} T={args.tokens}", per_kernel(prof.events(), args.calls))


def warm_graph(p, w, tokens: int, kernel: str, copies: int, warm: float, seed: int = 2):
    """Steps 1-2 of --graph: `copies` calls of `kernel` (forced) on distinct inputs (drawn from
    `seed`) captured in one CUDA graph and replayed for `warm` seconds (at least once).
    Returns (layer, inputs, graph)."""
    from dispatcher import FusedMoE

    gen = torch.Generator(device="cuda").manual_seed(seed)
    inputs = [random_inputs(p, tokens, device="cuda", gen=gen) for _ in range(copies)]
    layer = FusedMoE(w, tokens, p.top_k, activation=p.activation, kernel=kernel).warmup([tokens])
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for x, tw, ids in inputs:
            layer(x, tw, ids)
    t0 = time.perf_counter()
    while True:
        g.replay()
        torch.cuda.synchronize()
        if time.perf_counter() - t0 >= warm:
            break
    return layer, inputs, g


def graph(args, p, w) -> None:
    _, _, g = warm_graph(p, w, args.tokens, f"moe-{args.kernel}", args.copies, args.warm)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls = args.replays * args.copies
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(args.replays):
            g.replay()
        end.record()
        torch.cuda.synchronize()
    wall_us = start.elapsed_time(end) * 1e3 / calls
    report(f"moe-{args.kernel} {p.name} T={args.tokens}, graph of {args.copies} calls x "
           f"{args.replays} replays after {args.warm:.1f} s", per_kernel(prof.events(), calls), wall_us)


def main(argv=None) -> None:
    args = parse_args(argv)
    p = PRESETS[args.preset]
    w = random_weights(p, device="cuda", seed=1)
    (graph if args.graph else eager)(args, p, w)


if __name__ == "__main__":
    main()
