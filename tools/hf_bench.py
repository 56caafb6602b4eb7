"""A transformers MoE model's forward with the "fused_moe" experts backend against
transformers' grouped_mm backend on the bf16 weights (docs/MODELS.md; issue 30's GPU bar).

    python3 tools/hf_bench.py --preset qwen3-30b-a3b --layers 4 --shapes 1x1 32x1 512x1 1x2048 \
        [--format nvfp4] [--json out.json]

Steps:
1. Build the preset's config cut to --layers decoder layers, random weights, bf16, on the GPU
   (the CPU with --preset tiny, for a smoke test; times are then wall-clock).
2. Time the stock model (grouped_mm on bf16 experts) at each shape (batch x sequence length,
   no KV cache): the whole forward, and the experts calls alone (CUDA events recorded by a
   forward pre-hook and a forward hook on every experts module, summed per forward; in an
   eager forward that is host-bound this is the host time of the calls), and on the GPU the
   experts' kernels alone (their GPU time under the torch profiler, per forward).
3. quantize_experts, check the logits of a 64-token sequence against transformers' eager experts
   on the dequantized weights (rel L2 <= 1e-2, else exit 1), time the same way, and print the
   table (and --json).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from typing import Optional

import torch
import transformers

import dispatcher.hf as hf

PRESETS = {
    "qwen3-30b-a3b": lambda: transformers.Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=40960),
    "gpt-oss-20b": lambda: transformers.GptOssConfig(
        vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
        sliding_window=128, max_position_embeddings=131072),
    "tiny": lambda: transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
        num_experts_per_tok=2, max_position_embeddings=4096),
}
FORMATS = {"qwen3-30b-a3b": "nvfp4", "gpt-oss-20b": "mxfp4", "tiny": "nvfp4"}


def build(preset: str, layers: int, device):
    config = PRESETS[preset]()
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:layers]
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()


def hook_experts(model, before, after) -> list:
    """before() / after() around every experts module's forward; the hooks' handles."""
    handles = []
    for _, m in hf.experts_modules(model):
        handles.append(m.register_forward_pre_hook(lambda *_: before()))
        handles.append(m.register_forward_hook(lambda *_: after()))
    return handles


class ExpertsTimer:
    """CUDA events around every experts call (wall clock on the CPU), summed per forward."""

    def __init__(self, model):
        self.cuda = next(model.parameters()).is_cuda
        self.pairs = []
        self.handles = hook_experts(model, lambda: self.pairs.append([self._mark(), None]),
                                    lambda: self.pairs[-1].__setitem__(1, self._mark()))

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def total_ms(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return sum(a.elapsed_time(b) for a, b in self.pairs)
        return sum(b - a for a, b in self.pairs) * 1e3

    def remove(self):
        for h in self.handles:
            h.remove()


def time_forward(model, ids, iters: int, warmup: int = 3) -> tuple:
    """(whole forward ms, experts ms), medians over `iters` forwards."""
    cuda = ids.is_cuda
    timer = ExpertsTimer(model)
    whole, experts = [], []
    with torch.no_grad():
        for it in range(warmup + iters):
            timer.pairs = []
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(ids)
            if cuda:
                torch.cuda.synchronize()
            if it >= warmup:
                whole.append((time.perf_counter() - t0) * 1e3)
                experts.append(timer.total_ms())
    timer.remove()
    return sorted(whole)[len(whole) // 2], sorted(experts)[len(experts) // 2]


def kernel_ms_in_ranges(trace_events: list, range_name: str) -> float:
    """Total duration (ms) of the GPU kernels that ran inside the GPU spans of the user ranges
    named `range_name` (chrome-trace events: "gpu_user_annotation" spans, "kernel" events).

    A span runs from its range's first kernel to its last, so when the host is slower than the
    GPU it also holds idle time; the kernels inside it are the range's own (one stream, in
    order), and their durations alone are its GPU time."""
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in trace_events
             if e.get("cat") == "gpu_user_annotation" and e.get("name") == range_name]
    total_us = 0.0
    for e in trace_events:
        if e.get("cat") == "kernel" and any(a <= e["ts"] < b for a, b in spans):
            total_us += e["dur"]
    return total_us / 1e3


def experts_kernel_ms(model, ids, forwards: int = 3) -> Optional[float]:
    """GPU time of the kernels the experts calls launch, per forward (torch profiler): each
    experts call runs inside a record_function range, and the kernels inside its GPU span are
    summed (kernel_ms_in_ranges). Unlike the CUDA events, host time between launches does not
    count. None on the CPU."""
    if not ids.is_cuda:
        return None
    from torch.profiler import ProfilerActivity, profile, record_function

    ranges = []

    def enter():
        ranges.append(record_function("hf_bench.experts"))
        ranges[-1].__enter__()

    handles = hook_experts(model, enter, lambda: ranges.pop().__exit__(None, None, None))
    try:
        with torch.no_grad():
            model(ids)  # warm
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(forwards):
                    model(ids)
                torch.cuda.synchronize()
    finally:
        for h in handles:
            h.remove()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    return kernel_ms_in_ranges(events, "hf_bench.experts") / forwards


def rel_l2(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="qwen3-30b-a3b", choices=list(PRESETS))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--shapes", nargs="+", default=["1x1", "32x1", "512x1", "1x2048"],
                    help="batch x sequence length of each forward")
    ap.add_argument("--format", default=None, choices=["nvfp4", "mxfp4"], help="default: the preset's")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    model = build(args.preset, args.layers, device)
    vocab = model.config.vocab_size
    inputs = {s: torch.randint(0, vocab, s, device=device) for s in shapes}
    rows = {s: {"batch": s[0], "seq": s[1]} for s in shapes}
    for s, ids in inputs.items():
        rows[s]["grouped_mm_ms"], rows[s]["grouped_mm_experts_ms"] = time_forward(model, ids, args.iters)
        rows[s]["grouped_mm_experts_kernel_ms"] = experts_kernel_ms(model, ids)
    fmt = args.format or FORMATS[args.preset]
    hf.quantize_experts(model, fmt)
    check = torch.randint(0, vocab, (1, 64), device=device)
    with torch.no_grad():
        eager = hf.dequantize_experts(copy.deepcopy(model), "eager")
        err = rel_l2(model(check).logits, eager(check).logits)
    del eager
    for s, ids in inputs.items():
        rows[s]["fused_moe_ms"], rows[s]["fused_moe_experts_ms"] = time_forward(model, ids, args.iters)
        rows[s]["fused_moe_experts_kernel_ms"] = experts_kernel_ms(model, ids)
    print(f"{args.preset}, {args.layers} layers, {fmt}, {device}; logits vs eager experts on the "
          f"dequantized weights: rel L2 {err:.2e} ({'ok' if err <= 1e-2 else 'FAIL'})")
    print(f"{'shape':>9} {'grouped_mm':>11} {'fused_moe':>10} {'speedup':>8} | {'experts gmm':>11} "
          f"{'experts fused':>13} {'speedup':>8}  (ms, medians of {args.iters})")
    for s in shapes:
        r = rows[s]
        print(f"{s[0]:>4}x{s[1]:<4} {r['grouped_mm_ms']:>11.3f} {r['fused_moe_ms']:>10.3f} "
              f"{r['grouped_mm_ms'] / r['fused_moe_ms']:>7.2f}x | {r['grouped_mm_experts_ms']:>11.3f} "
              f"{r['fused_moe_experts_ms']:>13.3f} {r['grouped_mm_experts_ms'] / r['fused_moe_experts_ms']:>7.2f}x")
    if device == "cuda":
        print("experts' kernels alone (torch profiler, GPU ms per forward): grouped_mm / fused_moe")
        for s in shapes:
            g, f = rows[s]["grouped_mm_experts_kernel_ms"], rows[s]["fused_moe_experts_kernel_ms"]
            print(f"{s[0]:>4}x{s[1]:<4} {g:>11.3f} {f:>10.3f} {g / f:>7.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "layers": args.layers, "format": fmt, "device": device,
                       "torch": torch.__version__, "transformers": transformers.__version__,
                       "logits_rel_l2": err, "rows": list(rows.values())}, f, indent=1)
    if err > 1e-2:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
