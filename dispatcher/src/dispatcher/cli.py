"""``fused-moe``: explain, demo and bench from the command line."""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from typing import Optional, Sequence

import torch

from moe_common.types import ACTIVATIONS, QUANT_MODES, WEIGHT_FORMATS

from . import bench as _bench
from .api import FusedMoE, explain, fused_moe
from .manager import get_manager
from .presets import PRESETS, random_inputs, random_weights, resolve


def _shape_args(p: argparse.ArgumentParser, *, multi_preset: bool = False) -> None:
    if multi_preset:
        p.add_argument("--preset", nargs="+", choices=list(PRESETS), metavar="NAME",
                       help=f"model presets ({', '.join(PRESETS)}); default: all of them unless "
                            "--experts/--hidden/--intermediate/--top-k describe a custom shape")
    else:
        p.add_argument("--preset", choices=list(PRESETS), metavar="NAME",
                       help=f"model preset ({', '.join(PRESETS)}; default qwen3-30b-a3b)")
    p.add_argument("--experts", type=int, help="number of experts E (overrides the preset)")
    p.add_argument("--hidden", type=int, help="hidden size H")
    p.add_argument("--intermediate", type=int, help="intermediate size I (per expert)")
    p.add_argument("--top-k", type=int, dest="top_k", help="experts per token k")
    p.add_argument("--format", choices=WEIGHT_FORMATS, dest="weight_format", help="weight format")
    p.add_argument("--activation", choices=ACTIVATIONS, help="activation")
    p.add_argument("--bias", action=argparse.BooleanOptionalAction, default=None, help="FC1/FC2 biases")
    p.add_argument("--quant-mode", choices=QUANT_MODES, default="w4a16", dest="quant_mode")


def _explicit(args) -> dict:
    return dict(experts=args.experts, hidden=args.hidden, intermediate=args.intermediate, top_k=args.top_k,
                weight_format=args.weight_format, activation=args.activation, bias=args.bias)


# `explain --device`: this machine's GPU (auto), the CPU, or a Hopper GPU described without one
DEVICE_CAPABILITIES = {"sm90": (9, 0)}


def _device_capability(device: str) -> Optional[tuple]:
    if device in DEVICE_CAPABILITIES:
        return DEVICE_CAPABILITIES[device]
    if device == "cpu" or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability())


def _device_name(device: str, cap: Optional[tuple]) -> str:
    if cap is None:
        return "CPU"
    if device in DEVICE_CAPABILITIES:
        return f"an sm_{cap[0]}{cap[1]} GPU (H100/H200; described, not present)"
    return f"{torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]})"


def version_text() -> str:
    """The versions of the workspace's distributions that are installed, torch and the DSL."""
    from importlib import metadata

    names = ("moe-dispatcher", "moe-common", "moe-generic", "moe-gated", "moe-static",
             "torch", "nvidia-cutlass-dsl")
    parts = []
    for name in names:
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return "fused-moe: " + ", ".join(parts)


class _Version(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


# ----------------------------------------------------------------------------------------------
def cmd_explain(args) -> int:
    p = resolve(args.preset, **_explicit(args))
    cap = _device_capability(args.device)
    print(f"{p.describe()} on {_device_name(args.device, cap)}")
    for t in args.tokens:
        ex = explain(p.shape(t, quant_mode=args.quant_mode, device_capability=cap),
                     activation=p.activation, quant_mode=args.quant_mode, kernel=args.kernel)
        print()
        print(ex)
    return 0


# ----------------------------------------------------------------------------------------------
def cmd_demo(args) -> int:
    ok, why = _bench.supported_gpu()
    p = resolve(args.preset, **_explicit(args))
    seed = args.seed if args.seed is not None else int(time.time()) & 0x7FFFFFFF
    if ok and not args.cpu:
        device = torch.device("cuda")
        print(f"GPU: {why}. Running the dispatcher's choice on it and checking it against the reference.")
    else:
        device = torch.device("cpu")
        reason = "--cpu given" if args.cpu else f"no supported GPU here ({why})"
        print(f"{reason}: running the torch reference on CPU (the kernels need an H100/H200).")
        if args.experts is None and p.experts > args.cpu_experts:
            full = p.experts
            p = replace(p, experts=args.cpu_experts, top_k=min(p.top_k, args.cpu_experts), name=p.name + "-small")
            print(f"(a smaller layer for the CPU: {p.experts} experts instead of {full}, same H, I and k; "
                  "--experts or --cpu-experts change it)")
    print(f"layer: {p.describe()}; T={args.tokens}; quant_mode={args.quant_mode}; seed={seed}")
    t0 = time.perf_counter()
    weights = random_weights(p, device=device, seed=seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    if args.quant_mode == "w4a4" and p.weight_format == "nvfp4":
        weights = weights.calibrate(random_inputs(p, 256, device=device, gen=gen)[0], activation=p.activation)
    x, tw, ids = random_inputs(p, args.tokens, device=device, gen=gen)
    print(f"random weights quantized in {time.perf_counter() - t0:.1f} s")
    kw = dict(activation=p.activation, quant_mode=args.quant_mode, kernel=args.kernel)
    ex = explain(x, weights, tw, ids, **kw)
    print(ex)
    if ex.choice is None:
        print(f"error: {ex.error}")
        return 2

    from moe_common.reference import reference_moe

    out = torch.full((args.tokens, p.hidden), float("nan"), dtype=torch.bfloat16, device=device)
    t1 = time.perf_counter()
    fused_moe(x, weights, tw, ids, out=out, **kw)
    first_call_s = time.perf_counter() - t1
    if ex.choice.kernel == "reference" and args.quant_mode == "w4a16":
        # the reference against itself would prove nothing: check it against an independent
        # path (LUT dequantization to bf16, torch grouped GEMMs, bf16 intermediate)
        against = "the bf16 grouped-GEMM path"
        ref = torch.empty_like(out)
        _bench.grouped_mm_moe(x, _bench.dequantize_bf16(weights, "w13"), _bench.dequantize_bf16(weights, "w2"),
                              tw, ids, p.activation, out=ref, w13_bias=weights.w13_bias,
                              w2_bias=weights.w2_bias)
    else:
        against = "the fp32 reference"
        ref = reference_moe(x, weights, tw, ids, activation=p.activation, quant_mode=args.quant_mode)
    m = _bench.compare(out, ref)
    print(f"ran {ex.choice.kernel} on {device.type}, checked against {against}: rel L2 {m['rel_l2']:.2e} (<= 1e-2), cosine "
          f"{m['cosine']:.6f} (>= 0.9999), non-finite {m['nonfinite']} -> {'PASS' if m['ok'] else 'FAIL'}")
    if device.type == "cuda":
        layer = FusedMoE(weights, args.tokens, p.top_k, activation=p.activation, quant_mode=args.quant_mode,
                         kernel=args.kernel).warmup([args.tokens])
        tm = _bench.graph_time_us([lambda: layer(x, tw, ids)], min_replays=20, max_replays=200, budget_s=1.0)
        us = tm["median_us"]
        hit = int(torch.unique(ids).numel())
        gbps = hit * p.expert_bytes() / (us * 1e-6) / 1e9
        print(f"time: {us:.1f} us per call (CUDA-graph replay, median of {tm['replays']}; warm, same data: "
              f"use `fused-moe bench` for quotable numbers); {gbps:.0f} GB/s of 4-bit weights hit, "
              f"{p.flops(args.tokens) / (us * 1e-6) / 1e12:.2f} TFLOP/s")
    else:
        print(f"time: {first_call_s * 1e3:.1f} ms for the call on CPU (the reference; not a kernel number)")
    return 0 if m["ok"] else 1


# ----------------------------------------------------------------------------------------------
def cmd_bench(args) -> int:
    if args.ep is not None:
        from .bench_ep import run_cli

        return run_cli(args)
    explicit = _explicit(args)
    if args.preset:
        presets = [resolve(n, **explicit) for n in args.preset]
    elif all(explicit[k] is not None for k in ("experts", "hidden", "intermediate", "top_k")):
        presets = [resolve(None, **explicit)]
    elif any(v is not None for v in explicit.values()):
        presets = [resolve(None, **explicit)]  # the default preset, modified
    else:
        presets = list(PRESETS.values())
    _bench.run(presets, args.tokens, kernels=args.kernels, quant_mode=args.quant_mode, seed=args.seed,
               check=args.check, json_path=args.json, plot_path=args.plot, argv=["fused-moe"] + list(args.argv))
    return 0


def cmd_list(args) -> int:
    m = get_manager()
    print("kernel plugins (entry-point group 'fused_moe.kernels'):")
    for name in m.names:
        print(f"  {name:<14} {getattr(m.plugins[name], '__name__', '')}")
    for f in m.failures:
        print(f"  {f.name:<14} failed to load: {f.error}")
    print("presets:")
    for p in PRESETS.values():
        print(f"  {p.describe()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="fused-moe", description="NVFP4/MXFP4 fused MoE for Hopper: "
                                 "which kernel runs (explain), a checked run (demo), timings (bench).")
    ap.add_argument("--version", action=_Version, nargs=0, help="print the installed versions and exit")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("explain", help="every kernel plugin's answer for a shape, and the choice")
    _shape_args(p)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 8192], help="T values (default 1 8192)")
    p.add_argument("--kernel", help="force a kernel (as FUSED_MOE_KERNEL does)")
    p.add_argument("--device", choices=["auto", "cpu", *DEVICE_CAPABILITIES], default="auto",
                   help="describe the call on this machine's GPU (auto), on the CPU, or on an "
                        "H100/H200 (sm90) from any machine")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("demo", help="a random layer from a preset, run and checked against the reference")
    _shape_args(p)
    p.add_argument("--tokens", type=int, default=32, help="T (default 32)")
    p.add_argument("--kernel", help="force a kernel")
    p.add_argument("--seed", type=int, help="random seed (default: from the clock; printed)")
    p.add_argument("--cpu", action="store_true", help="use the CPU even when a GPU is present")
    p.add_argument("--cpu-experts", type=int, default=16, dest="cpu_experts",
                   help="experts of the smaller layer used on the CPU (default 16)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="time kernels and torch baselines (method: docs/DESIGN.md "
                       "section 7); needs sm_90")
    _shape_args(p, multi_preset=True)
    p.add_argument("--tokens", type=int, nargs="+", default=list(_bench.DEFAULT_TOKENS),
                   help="T values (default 1 8 32 128 512 2048 8192)")
    p.add_argument("--kernels", nargs="+", help="what to time: 'auto' (the dispatcher's choice), kernel names, "
                   "'torch-bf16', 'torch-dequant' (default: auto, every capable kernel, both baselines)")
    p.add_argument("--seed", type=int, help="random seed (default: fresh each run; recorded in the JSON)")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="check each row's output against the reference (default on)")
    p.add_argument("--json", help="write the results as JSON to this path")
    p.add_argument("--plot", help="write a PNG plot to this path (needs matplotlib)")
    p.add_argument("--ep", type=int, metavar="N", help="expert parallelism over N processes (spawned, or the "
                   "torchrun ranks): times fused_moe_ep / FusedMoEEP split into dispatch, compute, combine "
                   "(default T 1 128 2048 8192 per rank, preset deepseek-v3; docs/EXPERT_PARALLEL.md)")
    p.add_argument("--ep-strategies", nargs="+", dest="ep_strategies", metavar="S",
                   help="with --ep: all_to_all, allgather, fixed (FusedMoEEP) (default: all three)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("list", help="installed kernel plugins and presets")
    p.set_defaults(func=cmd_list)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        return args.func(args)
    except ValueError as e:
        print(f"fused-moe {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
