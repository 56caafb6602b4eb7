"""Differential check of the kernels' launch arguments between two source trees, on the CPU.

A change to how the runners pass operands (positional arguments, operand bundles) leaves the
PTX unchanged (tools/ptx_fingerprint.py) but can still put a wrong value in a kernel parameter,
which only a GPU run would show. This tool compares, launch by launch and parameter by
parameter, the values each tree's runners pass to every compiled kernel for the same calls:

    uv run python tools/launch_args_diff.py --base 8b6b63d            # a git revision, or
    uv run python tools/launch_args_diff.py --base /tmp/base          # a tree holding packages/*/src

Steps:
1. For each tree (the current checkout, `--tree`, and the base), start a subprocess with that
   tree's packages/*/src first on PYTHONPATH and no MOE_* variables (development knobs) set.
2. In it, replace moe_common.cute.jit.compiled (through which every runner and helper fetches a
   compiled launcher: routing, routing_split, topk_reduce, the packages' compile caches) by a
   factory of recorders, jit.current_stream by a "stream" marker and the device's SM count by
   132 (an H200's); nothing is compiled and nothing launched, and the runners get CPU tensors.
3. Run each case (CASES: package, tokens, format, activation, bias, quant mode, expert slice)
   through its package's runner.run with a fresh Workspace and fixed-seed inputs; moe-generic's
   cases pin its tile width (`generic_bn`, runner.pick_bn replaced): the width rule is a policy
   that changes with measurements (b7f4ca8), the values passed at a given width are what this
   tool compares.
4. Write each launch as its kernel (the compile-cache key; a config dataclass without the
   removed development fields at their defaults) and one line per kernel parameter: operand
   bundles (NamedTuples, or jit.operands' ctypes structures) flattened in field order, DSL
   scalars as numbers (floats rounded to fp32, as the launcher passes them), and every
   integer inside a known tensor (inputs, output, MoEWeights fields, the packed weights in
   kernel_cache, the workspace buffers) as its name + byte offset.
5. Diff the two trees' listings; exit 1 on any difference, 0 when identical.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL_PACKAGES = {"moe-static": "moe_static", "moe-gated": "moe_gated",
                   "moe-generic": "moe_generic"}
# Config fields that 3511fb5 and 6fd564b removed with the development knobs; at their defaults
# they select the production kernel (identical PTX), so a launch's kernel is named without them.
REMOVED_KNOBS = ("skip", "variant", "even_gain", "pending", "wgmma")
SM_COUNT = 132  # an H200's, for the runners' grid sizes
POINTER_MIN = 1 << 32  # an integer this large that is in no known tensor is an unknown pointer
STREAM = object()  # what the patched jit.current_stream returns


def _case(name, package, tokens, fmt="nvfp4", activation="silu", *, bias=False, mode="w4a16",
          offset=0, num_experts=None, ids64=False, experts=16, hidden=256, intermediate=128,
          top_k=4, generic_bn=None):
    return dict(name=name, package=package, tokens=tokens, fmt=fmt, activation=activation,
                bias=bias, mode=mode, offset=offset, num_experts=num_experts, ids64=ids64,
                experts=experts, hidden=hidden, intermediate=intermediate, top_k=top_k,
                generic_bn=generic_bn)


# x is a view of rows X_PAD elements wider than H, so that its row stride differs from H and a
# stride passed where H belongs (or the reverse) shows.
X_PAD = 64
# Expert-parallel cases: 16 local experts from 32 of 64, so offset, local and total all differ.
EP = dict(offset=32, num_experts=64)
# Cases with H, I and their padded sizes, K-tile and row-group counts all distinct.
WIDE = dict(hidden=384, intermediate=256)

CASES = {c["name"]: c for c in (
    _case("static-T1-nvfp4-silu", "moe-static", 1),
    _case("static-T5-mxfp4-relu2-bias", "moe-static", 5, "mxfp4", "relu2", bias=True),
    _case("static-T5-nvfp4-swigluoai-ep", "moe-static", 5, "nvfp4", "swigluoai", **EP),
    _case("static-T1-mxfp4-gelu-ids64-wide", "moe-static", 1, "mxfp4", "gelu_tanh", ids64=True,
          **WIDE),
    _case("generic-T1-nvfp4-silu-w4a16", "moe-generic", 1, generic_bn=8),
    _case("generic-T40-nvfp4-swigluoai-w4a4-bias", "moe-generic", 40, "nvfp4", "swigluoai",
          bias=True, mode="w4a4", generic_bn=32),
    _case("generic-T300-mxfp4-relu2-w4a16-bias", "moe-generic", 300, "mxfp4", "relu2", bias=True,
          generic_bn=64),
    _case("generic-T300-mxfp4-gelu-w4a4-wide", "moe-generic", 300, "mxfp4", "gelu_tanh",
          mode="w4a4", generic_bn=64, **WIDE),
    _case("generic-T40-nvfp4-relu2-w4a4-ep", "moe-generic", 40, "nvfp4", "relu2", mode="w4a4",
          generic_bn=32, **EP),
    _case("generic-T1-mxfp4-silu-w4a16-ids64-ep", "moe-generic", 1, "mxfp4", ids64=True,
          generic_bn=8, **EP),
    _case("gated-T300-nvfp4-silu-w4a16", "moe-gated", 300),
    _case("gated-T300-mxfp4-swigluoai-w4a4-bias-wide", "moe-gated", 300, "mxfp4", "swigluoai",
          bias=True, mode="w4a4", **WIDE),
    _case("gated-T5000-nvfp4-swigluoai-w4a4-bias", "moe-gated", 5000, "nvfp4", "swigluoai",
          bias=True, mode="w4a4"),
    _case("gated-T5000-mxfp4-gelu-w4a16-ep-ids64", "moe-gated", 5000, "mxfp4", "gelu_tanh",
          ids64=True, **EP),
)}


# --- recording (runs inside the subprocess, on the tree's own sources) ---------------------

class _Recorder:
    """A compiled launcher's stand-in: each call appends (kernel, arguments) to `launches`."""

    def __init__(self, key, launches: list):
        self.key, self.launches = key, launches

    def __call__(self, *args):
        self.launches.append((self.key, args))


def _install_patches(launches: list) -> None:
    import types

    import torch

    from moe_common.cute import jit

    jit.compiled = lambda key, build: _Recorder(key, launches)
    jit.current_stream = lambda device: STREAM
    torch.cuda.get_device_properties = lambda device: types.SimpleNamespace(
        multi_processor_count=SM_COUNT)


def _label(value) -> str:
    """A compile-cache key's part: a config dataclass without REMOVED_KNOBS at their defaults."""
    if isinstance(value, tuple):
        return "(" + ", ".join(_label(v) for v in value) + ")"
    if dataclasses.is_dataclass(value):
        kept = [f"{f.name}={getattr(value, f.name)!r}" for f in dataclasses.fields(value)
                if not (f.name in REMOVED_KNOBS and getattr(value, f.name) == f.default)]
        return f"{type(value).__name__}({', '.join(kept)})"
    return repr(value)


def _named_tensors(inputs: dict, weights, workspace) -> list:
    """(name, tensor) for every tensor a launch may point into, the inputs first."""
    import torch

    named = list(inputs.items())
    named += [(f"ws.{k}", t) for k, t in workspace.views.items()]
    for key, entry in weights.kernel_cache.items():
        if isinstance(entry, tuple) and len(entry) == 2:  # (its sources, the value): packed.cached
            entry = entry[1]
        fields = ([f.name for f in dataclasses.fields(entry)] if dataclasses.is_dataclass(entry)
                  else entry.keys() if isinstance(entry, dict) else ())
        for f in fields:
            v = getattr(entry, f) if dataclasses.is_dataclass(entry) else entry[f]
            if isinstance(v, dict):
                named += [(f"{key}.{f}[{k}]", t) for k, t in v.items()
                          if isinstance(t, torch.Tensor)]
            elif isinstance(v, torch.Tensor):
                named.append((f"{key}.{f}", v))
    named += [(f"weights.{f.name}", getattr(weights, f.name)) for f in dataclasses.fields(weights)
              if isinstance(getattr(weights, f.name), torch.Tensor)]
    return [(n, t) for n, t in named if t.numel() > 0]


def _symbolizer(named: list):
    """value -> text: a tensor's name (+offset) for an address inside it, fp32 for floats. An
    address inside a tensor of rows reads as its row and the offset in it (name[row]+offset):
    a buffer's row length (the routing table's tile capacity) is a sizing choice, its rows are
    what a kernel parameter must point to."""
    spans = [(n, t.data_ptr(), t.numel() * t.element_size(),
              t.stride(0) * t.element_size() if t.dim() > 1 else 0) for n, t in named]
    unknown: dict = {}

    def symbol(v) -> str:
        if isinstance(v, str):
            return v
        if isinstance(v, bool):
            return repr(v)
        if isinstance(v, float):
            return repr(struct.unpack("f", struct.pack("f", v))[0])
        if not isinstance(v, int):
            return f"<{type(v).__name__}>"
        exact = [n for n, p, _, _ in spans if p == v]
        if exact:
            return exact[0]
        inside = [(n, v - p, row) for n, p, size, row in spans if p < v < p + size]
        if inside:
            n, off, row = inside[0]
            if row:
                r, off = divmod(off, row)
                n = f"{n}[{r}]"
            return f"{n}+{off}" if off else n
        if v >= POINTER_MIN:
            return unknown.setdefault(v, f"unknown-pointer-{len(unknown)}")
        return repr(v)

    return symbol


def _flatten(args) -> list:
    """Launch arguments as the kernel receives them: bundles by field, DSL scalars as numbers."""
    out = []
    for a in args:
        if a is STREAM:
            out.append("stream")
        elif isinstance(a, tuple) and hasattr(a, "_fields"):
            out += _flatten(tuple(a))
        elif hasattr(a, "_fields_"):  # jit.operands' OperandValues (a ctypes structure)
            out += [getattr(a, name) for name, _ in a._fields_]
        elif hasattr(a, "value") and type(a).__module__.startswith("cutlass"):
            out.append(a.value)
        else:
            out.append(a)
    return out


def _run_case(case: dict, launches: list) -> list:
    import torch

    from moe_common.testing import random_layer, random_routing
    from moe_common.types import Activation
    from moe_common.workspace import Workspace

    g = torch.Generator().manual_seed(1234)
    gated = case["activation"] != "relu2"
    weights = random_layer(case["experts"], case["hidden"], case["intermediate"],
                           weight_format=case["fmt"], gated=gated, bias=case["bias"],
                           w4a4=case["mode"] == "w4a4", local_expert_offset=case["offset"],
                           num_experts=case["num_experts"], device="cpu", generator=g)
    total = weights.num_experts
    x = torch.randn(case["tokens"], case["hidden"] + X_PAD, generator=g).bfloat16()
    x = x[:, :case["hidden"]]
    topk_weights, topk_ids = random_routing(case["tokens"], total, case["top_k"], device="cpu",
                                            generator=g)
    if case["ids64"]:
        topk_ids = topk_ids.long()
    out = torch.empty(case["tokens"], case["hidden"], dtype=torch.bfloat16)

    class ShapedWorkspace(Workspace):
        """Keeps each buffer as the runner shaped it (the symbolizer names rows)."""

        def __init__(self):
            super().__init__()
            self.views = {}

        def get(self, name, *a, **kw):
            self.views[name] = super().get(name, *a, **kw)
            return self.views[name]

    ws = ShapedWorkspace()
    runner = __import__(KERNEL_PACKAGES[case["package"]] + ".runner", fromlist=["run"])
    if case["generic_bn"]:
        runner.pick_bn = lambda pairs, experts, bn=case["generic_bn"]: bn
    del launches[:]
    runner.run(x, weights, topk_weights, topk_ids, activation=Activation(case["activation"]),
               quant_mode=case["mode"], out=out, workspace=ws)
    inputs = dict(x=x, topk_weights=topk_weights, topk_ids=topk_ids, out=out)
    symbol = _symbolizer(_named_tensors(inputs, weights, ws))
    lines = []
    for key, args in launches:
        lines.append(f"launch {_label(key)}")
        lines += [f"  {i:2d} {symbol(v)}" for i, v in enumerate(_flatten(args))]
    return lines


def record(names: list) -> dict:
    """Every case's launch listing, from the sources this interpreter imports."""
    launches: list = []
    _install_patches(launches)
    return {name: _run_case(CASES[name], launches) for name in names}


# --- driver ----------------------------------------------------------------------------------

def _source_paths(tree: Path) -> list:
    paths = sorted(str(p) for p in (tree / "packages").glob("*/src"))
    if not paths:
        raise ValueError(f"{tree}: no packages/*/src; pass a tree holding the kernel packages")
    return paths


def listing(tree: Path, names: list) -> dict:
    """record(names) in a subprocess that imports the packages from `tree`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOE_")}
    env["PYTHONPATH"] = os.pathsep.join(_source_paths(tree) + [env.get("PYTHONPATH", "")])
    cmd = [sys.executable, str(Path(__file__).resolve()), "--record", str(tree), *names]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"recording {tree} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


def extract(rev: str, dest: Path) -> Path:
    """The packages of git revision `rev` extracted under dest."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "packages"],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        raise ValueError(f"--base {rev!r}: not a directory and not a git revision "
                         f"({archive.stderr.decode().strip()})")
    subprocess.run(["tar", "x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def diff(base: Path, tree: Path, names: list) -> list:
    """Unified-diff lines of the two trees' listings (empty when identical)."""
    before, after = listing(base, names), listing(tree, names)
    out = []
    for name in names:
        out += difflib.unified_diff(before[name], after[name], f"base/{name}", f"tree/{name}",
                                    lineterm="")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", help="a tree holding packages/*/src, or a git revision")
    ap.add_argument("--tree", default=str(ROOT), help="the tree to check (default: this checkout)")
    ap.add_argument("--show", action="store_true", help="also print both listings")
    ap.add_argument("--record", metavar="TREE", help=argparse.SUPPRESS)
    ap.add_argument("cases", nargs="*", help=f"case names (default: all): {', '.join(CASES)}")
    args = ap.parse_args(argv)
    names = args.cases or list(CASES)
    bad = [n for n in names if n not in CASES]
    if bad:
        ap.error(f"unknown cases {bad}; the cases are {list(CASES)}")
    if args.record:
        import moe_common

        if not Path(moe_common.__file__).resolve().is_relative_to(Path(args.record).resolve()):
            raise RuntimeError(f"moe_common imported from {moe_common.__file__}, not {args.record}")
        print(json.dumps(record(names)))
        return 0
    if not args.base:
        ap.error("--base is required")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.base) if Path(args.base).is_dir() else extract(args.base, Path(tmp))
        tree = Path(args.tree)
        if args.show:
            for label, t in (("base", base), ("tree", tree)):
                for name, lines in listing(t, names).items():
                    print(f"== {label} {name}", *lines, sep="\n")
        lines = diff(base, tree, names)
    print("\n".join(lines) if lines else f"identical: {len(names)} cases")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
