"""Bounded soak run of the fused MoE layer on an sm_90 GPU (issue 31): a few minutes of what a
serving process does, checked.

    uv run python tools/soak.py [--seconds 180] [--preset qwen3-30b-a3b] [--max-tokens 512]
                                [--json soak.json] [--dry-run]

Steps:
1. Build one random layer of the preset and two FusedMoE objects on it: A (automatic kernel
   choice) and B (moe-generic forced), both warmed up (so no call may compile: a compile raises).
2. Capture CUDA graphs of A on stream 1 at a few T (1, 8, 64 and max-tokens, those <= max).
3. Until the time is up, draw an operation per step (seeded): a graph replay of A with fresh
   inputs copied into its static buffers, an eager call of A (stream 1), an eager call of B
   (stream 2), or fused_moe with a forced kernel among those offered (stream 2); T drawn
   log-uniformly from 1..max-tokens, int32 or int64 ids (some outside the local experts).
   Each step's inputs are made on the stream that reads them. Streams 1 and 2 are never
   synchronized with each other except at checks.
4. Every --check-every steps: synchronize, compare the step's result (copied when it was made)
   with the fp32 reference (DESIGN section 5 bar), and read the allocator's memory.
5. A watchdog thread exits with code 3 when no step finishes within --watchdog seconds (a hang).
6. Pass when every check passed and allocated memory after the first check grew by at most
   --mem-slack-mb. Exit codes: 0 pass, 1 a wrong result, 2 memory grew, 3 hang, 4 no sm_90 GPU.

--dry-run prints the configuration and the first steps' plan without touching a GPU (exit 0).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import threading
import time

EXIT_OK, EXIT_WRONG, EXIT_MEMORY, EXIT_HANG, EXIT_NO_GPU = 0, 1, 2, 3, 4
OPS = ("replay", "eager_a", "eager_b", "fused_moe")
GRAPH_TOKENS = (1, 8, 64)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=180.0, help="how long the soak runs")
    p.add_argument("--preset", default="qwen3-30b-a3b", help="dispatcher.presets name")
    p.add_argument("--max-tokens", type=int, default=512, help="FusedMoE max_tokens")
    p.add_argument("--check-every", type=int, default=25, help="steps between reference checks")
    p.add_argument("--watchdog", type=float, default=120.0,
                   help="seconds without a finished step that count as a hang")
    p.add_argument("--mem-slack-mb", type=float, default=64.0,
                   help="allowed growth of allocated memory after the first check")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--dry-run", action="store_true",
                   help="print the configuration and the first steps, touch no GPU")
    args = p.parse_args(argv)
    if args.max_tokens < 1 or args.check_every < 1 or args.seconds <= 0 or args.watchdog <= 0:
        p.error("--max-tokens and --check-every must be >= 1, --seconds and --watchdog > 0")
    return args


def draw_step(rng: random.Random, max_tokens: int) -> dict:
    """One step: the operation, T (log-uniform in 1..max_tokens) and the ids' dtype."""
    op = rng.choice(OPS)
    if op == "replay":
        tokens = rng.choice(graph_tokens(max_tokens))
    else:
        tokens = min(max_tokens, max(1, int(round(math.exp(rng.uniform(0, math.log(max_tokens)))))))
    return {"op": op, "tokens": tokens, "int64": rng.random() < 0.5, "wild_ids": rng.random() < 0.2}


def graph_tokens(max_tokens: int) -> list:
    return sorted({t for t in GRAPH_TOKENS if t <= max_tokens} | {max_tokens})


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class Watchdog(threading.Thread):
    """Exits the process with EXIT_HANG when beat() is not called for `limit` seconds."""

    def __init__(self, limit: float):
        super().__init__(daemon=True)
        self.limit, self.last, self.what = limit, time.monotonic(), "setup"

    def beat(self, what: str) -> None:
        self.last, self.what = time.monotonic(), what

    def run(self) -> None:
        while True:
            time.sleep(min(5.0, self.limit / 4))
            if time.monotonic() - self.last > self.limit:
                print(f"soak: HANG, no step finished in {self.limit:.0f} s (last: {self.what})",
                      flush=True)
                os._exit(EXIT_HANG)


class Soak:
    """The layer, its two FusedMoE objects, the captured graphs and the bookkeeping."""

    def __init__(self, args, torch, dispatcher):
        from dispatcher.presets import random_weights, resolve

        self.args, self.torch, self.dispatcher = args, torch, dispatcher
        self.preset = resolve(args.preset)
        self.weights = random_weights(self.preset, device="cuda", seed=args.seed)
        self.gen = torch.Generator(device="cuda").manual_seed(args.seed + 1)
        self.s1, self.s2 = torch.cuda.Stream(), torch.cuda.Stream()
        kw = dict(max_tokens=args.max_tokens, top_k=self.preset.top_k,
                  activation=self.preset.activation)
        with torch.cuda.stream(self.s1):
            self.a = dispatcher.FusedMoE(self.weights, **kw).warmup()
        with torch.cuda.stream(self.s2):
            self.b = dispatcher.FusedMoE(self.weights, kernel="moe-generic", **kw).warmup()
        torch.cuda.synchronize()
        self.graphs = {t: self._capture(t) for t in graph_tokens(args.max_tokens)}
        self.counts = {op: 0 for op in OPS}
        self.kernels: dict = {}
        self.checks, self.worst = 0, 0.0

    def inputs(self, tokens: int, int64: bool, wild: bool):
        from dispatcher.presets import random_inputs

        x, tw, ids = random_inputs(self.preset, tokens, device="cuda", gen=self.gen)
        if int64:
            ids = ids.long()
            if wild:  # ids a 32-bit truncation would turn into local experts
                ids[0, 0] = 2**32 + int(ids[0, 0])
                ids[-1, -1] = -(2**63)
        elif wild:
            ids[0, 0] = -1
        return x, tw, ids.contiguous()

    def _capture(self, tokens: int):
        torch = self.torch
        static = self.inputs(tokens, False, False)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.s1):
            out = self.a(*static)
        return graph, static, out

    def step(self, s: dict, keep: bool):
        """Run one step on its stream; returns (inputs, a copy of the output) when keep."""
        torch, t = self.torch, s["tokens"]
        if s["op"] == "replay":
            graph, static, out = self.graphs[t]
            with torch.cuda.stream(self.s1):
                fresh = self.inputs(t, False, s["wild_ids"])
                for dst, src in zip(static, fresh):
                    dst.copy_(src)
                graph.replay()
                result = (fresh, out.clone()) if keep else None
        else:
            stream = self.s1 if s["op"] == "eager_a" else self.s2
            with torch.cuda.stream(stream):
                # made on the stream that reads them: the side streams do not wait for the
                # default one, and the allocator reuses a freed block on its own stream only
                args = self.inputs(t, s["int64"], s["wild_ids"])
                if s["op"] == "eager_a":
                    out = self.a(*args)
                elif s["op"] == "eager_b":
                    out = self.b(*args)
                else:
                    out = self._fused_moe(args)
                result = (args, out.clone()) if keep else None
        self.counts[s["op"]] += 1
        return result

    def _fused_moe(self, args):
        x, tw, ids = args
        act = self.preset.activation
        offers = [o.kernel for o in self.dispatcher.explain(x, self.weights, tw, ids,
                                                            activation=act).offers]
        kernel = offers[self.counts["fused_moe"] % len(offers)]
        self.kernels[kernel] = self.kernels.get(kernel, 0) + 1
        return self.dispatcher.fused_moe(x, self.weights, tw, ids, activation=act, kernel=kernel)

    def check(self, kept) -> dict:
        from dispatcher.bench import compare
        from moe_common.reference import reference_moe

        self.torch.cuda.synchronize()
        (x, tw, ids), out = kept
        m = compare(out, reference_moe(x, self.weights, tw, ids, activation=self.preset.activation))
        self.checks += 1
        self.worst = max(self.worst, m["rel_l2"])
        return m


def run(args) -> int:
    import torch

    import dispatcher

    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("soak: needs an sm_90 (Hopper) GPU", flush=True)
        return EXIT_NO_GPU
    dog = Watchdog(args.watchdog)
    dog.start()
    soak = Soak(args, torch, dispatcher)
    rng = random.Random(args.seed)
    baseline = None
    growth = 0.0
    failure = None
    steps = 0
    end = time.monotonic() + args.seconds
    while time.monotonic() < end and failure is None:
        s = draw_step(rng, args.max_tokens)
        keep = steps % args.check_every == 0
        kept = soak.step(s, keep)
        if keep:
            m = soak.check(kept)
            if not m["ok"]:
                failure = f"step {steps} {s}: {m}"
            mem = torch.cuda.memory_allocated()
            baseline = mem if baseline is None else baseline
            growth = max(growth, (mem - baseline) / 2**20)
        steps += 1
        dog.beat(f"step {steps} {s}")
    torch.cuda.synchronize()
    code = EXIT_WRONG if failure else (EXIT_MEMORY if growth > args.mem_slack_mb else EXIT_OK)
    summary = {"commit": commit(), "args": vars(args), "steps": steps, "ops": soak.counts,
               "fused_moe_kernels": soak.kernels, "checks": soak.checks,
               "worst_rel_l2": soak.worst, "memory_growth_mb": growth,
               "graphs": sorted(soak.graphs), "failure": failure, "exit_code": code,
               "device": torch.cuda.get_device_name()}
    print(json.dumps(summary, indent=1), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return code


def dry_run(args) -> int:
    rng = random.Random(args.seed)
    plan = [draw_step(rng, args.max_tokens) for _ in range(10)]
    print(json.dumps({"args": vars(args), "graph_tokens": graph_tokens(args.max_tokens),
                      "first_steps": plan}, indent=1))
    return EXIT_OK


def main(argv=None) -> int:
    args = parse_args(argv)
    return dry_run(args) if args.dry_run else run(args)


if __name__ == "__main__":
    sys.exit(main())
