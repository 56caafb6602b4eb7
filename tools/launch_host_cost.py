"""Host time per call of launching the CuTe DSL kernels, measured without a GPU (development tool).

Eager decode is CPU-bound: a kernel of 15 us on the GPU costs the host several times that to
launch. This tool times the host steps that need no GPU, so a change to them is measured on any
machine (docs/HOST_OVERHEAD.md records the numbers).

Steps:
1. Compile, for sm_90a on the CPU, one configuration of every launch a layer call makes:
   moe-static's kernel, moe-generic's FC1 and FC2, moe-gated's row scatter, FC1 and FC2, and
   moe-common's routing and top-k reduce.
2. Per launch, time three steps, each as the best of --rounds rounds of --calls calls (the
   best round is the one least disturbed by the rest of the machine):
     operands  jit.operands(bundle, **fields): the launch's operand bundle (launches that
               take one);
     marshal   compiled.generate_execution_args(*launch arguments): what the compiled
               function's __call__ does with its arguments before the C call;
     pack      the executor's copy of those into its C argument array
               (JitExecutor._get_invoke_packed_args, on an executor that loads no module).
   What remains of a launch is the C call itself (cuLaunchKernel), which needs a GPU.
3. Time the dispatcher's work before the runner in dispatcher.fused_moe on CPU tensors of one
   token with int64 ids (transformers' top-k indices are int64): make_activation,
   validate_inputs and the manager's select (cached choice); FusedMoE's int32_ids of those ids
   beside them (fused_moe passes int64 ids on). A small layer: none of these steps reads a
   size-dependent amount of data.
4. Print microseconds per call, one line per step.

    uv run python tools/launch_host_cost.py [--calls 2000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import ctypes
import functools
import math
import time
import types

import torch

QWEN = dict(T=1, k=8, E=128, H=2048, I=768)  # Qwen3-30B-A3B at batch 1: what the values hold


def best_us(fn, calls: int, rounds: int) -> float:
    """The fastest round's mean time of fn() in microseconds."""
    for _ in range(min(calls, 200)):
        fn()
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


class Launch:
    """One kernel launch as its runner makes it: the compiled function, its operand bundle type
    (None for launches of plain scalars) and its arguments around the bundle."""

    def __init__(self, package: str, name: str, compiled, bundle, before=(), after=()):
        self.package, self.name, self.compiled, self.bundle = package, name, compiled, bundle
        self.before, self.after = tuple(before), tuple(after)

    def operands(self):
        from moe_common.cute import jit

        return jit.operands(self.bundle, **self.values)

    def args(self) -> tuple:
        middle = (self.operands(),) if self.bundle is not None else ()
        return self.before + middle + self.after

    @functools.cached_property
    def values(self) -> dict:
        from moe_common.testing import numbered_operand_values

        return numbered_operand_values(self.bundle)


def launches() -> list:
    """Step 1: the launches of the three kernel packages and moe-common."""
    from moe_common.cute import jit
    from moe_common.cute.routing import RoutingTables

    T, k, E, H, I = (QWEN[n] for n in ("T", "k", "E", "H", "I"))
    P, ptr = T * k, 0x7F0000000000
    stream = jit.example_stream()
    out = []

    from moe_static.compile_cache import get as static_get
    from moe_static.kernel import StaticOperands
    _, kernel = static_get("nvfp4", "silu")
    out.append(Launch("moe-static", "layer", kernel, StaticOperands, after=(132, stream)))

    from moe_generic import compile_cache as generic
    from moe_generic.grouped_gemm import GemmOperands
    for phase, act, rows, kt in (("fc1", "silu", 2 * I, H // 128), ("fc2", "none", H, I // 128)):
        _, fn = generic.get(phase, "nvfp4", act, 8, rows, kt)
        out.append(Launch("moe-generic", phase, fn, GemmOperands, after=(rows // 128, P, stream)))

    from moe_gated import compile_cache as gated
    from moe_gated.kernel import GatedOperands
    out.append(Launch("moe-gated", "row_scatter", gated.row_scatter(128), None,
                      before=(ptr, H, H, T, k, ptr, ptr, H // 128, stream)))
    for phase, act in (("fc1", "silu"), ("fc2", "none")):
        _, fn = gated.get(phase, "nvfp4", act, "tall")
        out.append(Launch("moe-gated", phase, fn, GatedOperands, after=(stream,)))

    out.append(Launch("moe-common", "routing", jit.routing(4), RoutingTables,
                      before=(ptr, P, 0, E, 8, ptr, ptr), after=(stream,)))
    out.append(Launch("moe-common", "topk_reduce", jit.topk_reduce(4, 16, False), None,
                      before=(ptr, ptr, 0, ptr, T, k, H, 0, E, stream)))
    return out


def stand_in_executor(compiled):
    """The DSL's JitExecutor over a module that loads nothing: its argument packing runs as in
    a launch, its C call is never made."""
    from cutlass.base_dsl.jit_executor import JitExecutor

    module = types.SimpleNamespace(capi_func=types.SimpleNamespace(restype=ctypes.c_int32),
                                   execution_args=compiled.execution_args)
    return JitExecutor(module, None, False)


def time_launch(launch: Launch, calls: int, rounds: int) -> dict:
    """Step 2: us per call of each host step of one launch."""
    got = {}
    if launch.bundle is not None:
        got["operands"] = best_us(launch.operands, calls, rounds)
    args = launch.args()
    got["marshal"] = best_us(lambda: launch.compiled.generate_execution_args(*args), calls, rounds)
    exe_args, _ = launch.compiled.generate_execution_args(*args)
    executor = stand_in_executor(launch.compiled)
    got["pack"] = best_us(lambda: executor._get_invoke_packed_args(exe_args), calls, rounds)
    return got


def time_dispatcher(calls: int, rounds: int) -> dict:
    """Step 3: us per call of dispatcher.fused_moe's steps before the runner (CPU tensors), and
    of FusedMoE's int32_ids."""
    from moe_common.types import make_activation
    from dispatcher.manager import get_manager
    from dispatcher.api import int32_ids
    from moe_common.testing import random_layer, random_routing
    from moe_common.validation import validate_inputs

    gen = torch.Generator().manual_seed(0)
    w = random_layer(8, 256, 128, device="cpu", generator=gen)
    x = torch.randn(1, 256, generator=gen).bfloat16()
    tw, ids = random_routing(1, 8, 2, device="cpu", generator=gen)
    ids64 = ids.long()
    act = make_activation("silu")
    shape = validate_inputs(x, w, tw, ids64, activation=act, quant_mode="w4a16")
    manager = get_manager()
    manager.select(shape, act)
    steps = {
        "make_activation": best_us(lambda: make_activation("silu"), calls, rounds),
        "validate_inputs": best_us(lambda: validate_inputs(
            x, w, tw, ids64, activation=act, quant_mode="w4a16"), calls, rounds),
        "select": best_us(lambda: manager.select(shape, act), calls, rounds),
    }
    return steps, best_us(lambda: int32_ids(ids64, w), calls, rounds)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; the fastest is reported")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.rounds < 1:
        raise SystemExit(f"--calls and --rounds: got {args.calls}, {args.rounds}; allowed: >= 1")
    print(f"{'package':<12} {'launch':<12} {'step':<16} {'us/call':>8}")
    for launch in launches():
        got = time_launch(launch, args.calls, args.rounds)
        for step, us in got.items():
            print(f"{launch.package:<12} {launch.name:<12} {step:<16} {us:8.1f}")
        print(f"{launch.package:<12} {launch.name:<12} {'total':<16} {sum(got.values()):8.1f}")
    got, narrow = time_dispatcher(args.calls, args.rounds)
    for step, us in got.items():
        print(f"{'dispatcher':<12} {'fused_moe':<12} {step:<16} {us:8.1f}")
    print(f"{'dispatcher':<12} {'fused_moe':<12} {'total':<16} {sum(got.values()):8.1f}")
    print(f"{'dispatcher':<12} {'FusedMoE':<12} {'int32_ids':<16} {narrow:8.1f}")


if __name__ == "__main__":
    main()
