"""Helpers for the kernels' tests: random layers and routing, and the docs/DESIGN.md section 5 bar.

Every call draws fresh random data (seeded from the clock unless a seed is given), so a test
that passes checks the kernel on data it has never seen.
"""
from __future__ import annotations

import time
from typing import Optional

import torch

from .types import MoEShape
from .weights import MoEWeights

REL_L2_MAX = 1e-2
COSINE_MIN = 0.9999


def fresh_seed() -> int:
    return time.time_ns() % (2**31)


def random_layer(experts: int, hidden: int, intermediate: int, *, weight_format: str = "nvfp4",
                 gated: bool = True, bias: bool = False, w4a4: bool = False,
                 local_expert_offset: int = 0, num_experts: Optional[int] = None,
                 device="cuda", generator: Optional[torch.Generator] = None) -> MoEWeights:
    """Random bf16 weights quantized with MoEWeights.quantize (w4a4: NVFP4 activation scales)."""
    g = generator
    n1 = 2 * intermediate if gated else intermediate
    w13 = (torch.randn(experts, n1, hidden, generator=g, device=device) * hidden ** -0.5).bfloat16()
    w2 = (torch.randn(experts, hidden, intermediate, generator=g, device=device) * intermediate ** -0.5).bfloat16()
    kw = {}
    if bias:
        kw["w13_bias"] = torch.randn(experts, n1, generator=g, device=device) * 0.1
        kw["w2_bias"] = torch.randn(experts, hidden, generator=g, device=device) * 0.1
    if w4a4 and weight_format == "nvfp4":
        # x ~ N(0, 1): amax about 4.5; the intermediate is O(1)
        kw["input_scale"] = (4.5 + torch.rand(experts, generator=g, device=device)) / 2688
        kw["fc2_input_scale"] = (1.0 + torch.rand(experts, generator=g, device=device)) / 2688
    return MoEWeights.quantize(w13, w2, weight_format=weight_format,
                               local_expert_offset=local_expert_offset, num_experts=num_experts, **kw)


def unpackable_mxfp4_layer() -> MoEWeights:
    """Weights quantize() itself produces from a layer scaled by 1e-20: MXFP4 scale bytes near
    2^-70, outside the range the packed layout holds exactly (moe_common.packed)."""
    g = torch.Generator().manual_seed(0)
    w13 = torch.randn(2, 128, 64, generator=g) * 1e-20
    w2 = torch.randn(2, 64, 64, generator=g) * 1e-20
    return MoEWeights.quantize(w13, w2, weight_format="mxfp4")


def make_shape(**overrides) -> MoEShape:
    """A small bf16 sm_90 call shape for support-check tests; keywords replace its fields."""
    base = dict(tokens=4, hidden=256, intermediate=128, num_experts=8, num_local_experts=8,
                local_expert_offset=0, top_k=2, weight_format="nvfp4", quant_mode="w4a16",
                has_bias=False, device_capability=(9, 0), dtype=torch.bfloat16)
    base.update(overrides)
    return MoEShape(**base)


def random_routing(tokens: int, num_experts: int, top_k: int, *, device="cuda", skew: float = 0.0,
                   generator: Optional[torch.Generator] = None):
    """(topk_weights fp32 [T, k], topk_ids int32 [T, k]) from softmax(randn) logits.

    skew > 0 adds a Zipf-like bias (expert e gets -skew * log(e + 1)), so a few experts get most
    of the tokens and some get none.
    """
    logits = torch.randn(tokens, num_experts, generator=generator, device=device)
    if skew:
        logits = logits - skew * torch.log(torch.arange(1, num_experts + 1, device=device).float())
    w, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    return w.float().contiguous(), ids.to(torch.int32).contiguous()


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Relative L2 error, cosine similarity and NaN count of out against ref."""
    o, r = out.float().flatten(), ref.float().flatten()
    rel = ((o - r).norm() / r.norm().clamp_min(1e-30)).item()
    cos = torch.nn.functional.cosine_similarity(o, r, dim=0).item()
    return {"rel_l2": rel, "cosine": cos, "nan": int(torch.isnan(o).sum().item())}


def assert_close(out: torch.Tensor, ref: torch.Tensor, what: str = "") -> dict:
    m = compare(out, ref)
    assert m["nan"] == 0, f"{what}: {m['nan']} NaN in the output (unwritten elements?) {m}"
    assert m["rel_l2"] <= REL_L2_MAX and m["cosine"] >= COSINE_MIN, f"{what}: {m}"
    return m


def check_case(fused_moe, shape: tuple, act: str, fmt: str, *, mode: str = "w4a16", bias: bool = False,
               ep: bool = False, limit: Optional[float] = 7.0, skew: float = 0.0,
               id_dtype: torch.dtype = torch.int32) -> dict:
    """One random call of `fused_moe` (a package's direct entry) against the reference, to the
    docs/DESIGN.md section 5 bar. shape: (T, E, H, I, top_k); ep: the layer is experts E/2..3E/2-1
    of 2E (routes reach the others too); skew: see random_routing; out starts as NaN, so an
    unwritten element fails. Returns the comparison."""
    from .reference import reference_moe
    from .types import Activation

    T, E, H, I, k = shape
    off, total = (E // 2, 2 * E) if ep else (0, E)
    w = random_layer(E, H, I, weight_format=fmt, gated=act != "relu2", bias=bias, w4a4=mode == "w4a4",
                     local_expert_offset=off, num_experts=total)
    x = torch.randn(T, H, device="cuda").bfloat16()
    tw, ti = random_routing(T, total, k, skew=skew)
    ti = ti.to(id_dtype)
    a = Activation(act, Activation.alpha, Activation.beta, limit)
    out = torch.full((T, H), float("nan"), device="cuda", dtype=torch.bfloat16)
    fused_moe(x, w, tw, ti, activation=a, quant_mode=mode, out=out)
    ref = reference_moe(x, w, tw, ti, activation=a, quant_mode=mode)
    return assert_close(out, ref, f"{shape} {act} {fmt} {mode} bias={bias} ep={ep} skew={skew}")


def check_out_of_range_ids(fused_moe, tokens: int) -> None:
    """Routes to ids outside the local experts (-1, past E, another rank's) contribute nothing,
    are never read out of bounds, and a token with no local route gets an exact 0 row; as int32
    ids, then as int64 ids with 2^32 + a local id and INT64_MIN among them (the kernels read
    int64 ids themselves: they must drop those, not truncate them to a local expert)."""
    from .reference import reference_moe

    w = random_layer(8, 256, 128, local_expert_offset=8, num_experts=24)
    x = torch.randn(tokens, 256, device="cuda").bfloat16()
    tw, ti = random_routing(tokens, 24, 4)
    ti[0, 0] = -1
    ti[1, 1] = 10_000
    ti[2, :] = 0  # expert 0 is another rank's
    wide = ti.long()
    wide[3, :] = 2**32 + 9  # truncated, 9 would be local expert 1
    wide[4, 0] = -(2**63)  # truncated, 0 (another rank's); a wrong saturation gives a local id
    wide[4, 1] = 2**31 + 10
    for ids, what in ((ti, "int32"), (wide, "int64")):
        out = torch.full((tokens, 256), float("nan"), device="cuda", dtype=torch.bfloat16)
        fused_moe(x, w, tw, ids, out=out)
        assert torch.all(out[2] == 0), what
        if ids is wide:
            assert torch.all(out[3] == 0), "int64 ids 2^32 + a local id must be dropped"
        assert_close(out, reference_moe(x, w, tw, ids), f"out-of-range {what} ids")


def check_one_workspace(fused_moe, shapes: list) -> None:
    """Calls of `fused_moe` (a package's direct entry) through one Workspace, as a serving
    engine makes them: layers of the given (T, E, H, I, top_k) in turn, then each again, then a
    call whose every route belongs to another rank (an expert-parallel slice nothing is routed
    to). Each first call matches the reference (out poisoned with NaN first: an element left
    unwritten fails), each repeat is bitwise equal to it (counters and queues the kernels leave
    in the workspace must be back at their start), and the call with no local route writes an
    exact 0 output."""
    from .reference import reference_moe
    from .workspace import Workspace

    ws = Workspace()
    calls = []
    for T, E, H, I, k in shapes:
        w = random_layer(E, H, I, bias=True)
        x = torch.randn(T, H, device="cuda").bfloat16()
        calls.append((x, w) + random_routing(T, E, k))
    firsts = []
    for n, (x, w, tw, ti) in enumerate(calls + calls):
        out = torch.full_like(x, float("nan"))
        fused_moe(x, w, tw, ti, out=out, workspace=ws)
        if n < len(calls):
            assert_close(out, reference_moe(x, w, tw, ti), f"call {n}, {shapes[n]}")
            firsts.append(out)
        else:
            assert torch.equal(out, firsts[n - len(calls)]), f"call {n}: not bitwise a repeat"
    T, E, H, I, k = shapes[0]
    w = random_layer(E, H, I, local_expert_offset=E, num_experts=2 * E)
    x = torch.randn(T, H, device="cuda").bfloat16()
    tw, ti = random_routing(T, E, k)  # experts 0 .. E - 1: another rank's
    out = torch.full_like(x, float("nan"))
    fused_moe(x, w, tw, ti, out=out, workspace=ws)
    assert torch.all(out == 0), "no local route: the output must be exactly 0"


def assert_graph_replay_matches_eager(fused_moe, *, tokens: int, experts: int = 32, hidden: int = 512,
                                      intermediate: int = 256, top_k: int = 4,
                                      activation: str = "swigluoai", replays: int = 3):
    """Capture one call of `fused_moe` (a package's direct entry) with a frozen workspace in a
    CUDA graph, then replay it on new inputs written into the same buffers: each replay must
    equal an eager call bitwise (MXFP4 layer with biases)."""
    from .workspace import Workspace

    w = random_layer(experts, hidden, intermediate, weight_format="mxfp4", bias=True)
    x = torch.randn(tokens, hidden, device="cuda").bfloat16()
    tw, ti = random_routing(tokens, experts, top_k)
    ws = Workspace()
    out = torch.empty(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    fused_moe(x, w, tw, ti, activation=activation, out=out, workspace=ws)  # compile + allocate
    ws.freeze()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fused_moe(x, w, tw, ti, activation=activation, out=out, workspace=ws)
    for _ in range(replays):
        x.copy_(torch.randn_like(x))
        nw, ni = random_routing(tokens, experts, top_k)
        tw.copy_(nw)
        ti.copy_(ni)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fused_moe(x, w, tw, ti, activation=activation))


_WHEEL_ALONE_PROBE = r"""
import json, sys
target, purelib, dist, module = sys.argv[1:5]
sys.path[:0] = [target]
sys.path.append(purelib)
import importlib, importlib_metadata as md
import torch
eps = [ep for ep in md.entry_points(group="fused_moe.kernels") if ep.name == dist]
plugin = eps[0].load()
from moe_common.types import Activation, MoEShape
from moe_common.testing import random_layer, random_routing
pkg = importlib.import_module(module)
shape = MoEShape(tokens=1, hidden=64, intermediate=64, num_experts=4, num_local_experts=4,
                 local_expert_offset=0, top_k=2, weight_format="nvfp4", quant_mode="w4a16",
                 has_bias=False, device_capability=None, dtype=torch.bfloat16)
answer = plugin.can_handle(shape=shape, activation=Activation("silu"))
w = random_layer(4, 64, 32, device="cpu")
tw, ti = random_routing(2, 4, 2, device="cpu")
try:
    pkg.fused_moe(torch.randn(2, 64).bfloat16(), w, tw, ti)
    err = None
except ValueError as e:
    err = str(e)
print(json.dumps({"eps": [ep.value for ep in eps], "file": pkg.__file__,
                  "answer": getattr(answer, "reason", None), "error": err,
                  "dispatcher_imported": "dispatcher" in sys.modules}))
"""


def probe_wheel_alone(root, tmp_path, dist: str) -> dict:
    """Build the wheels of moe-common and kernel package `dist` (under root/packages), unpack
    only those two into a fresh directory and, in a Python without site-packages on the path
    (torch and friends appended after), load the package's entry point, ask its plugin about a
    CPU call and call its direct fused_moe. Returns what the probe saw (see the keys above)."""
    import json
    import subprocess
    import sys
    import sysconfig
    import zipfile
    from pathlib import Path

    target = Path(tmp_path) / "target"
    for name in ("moe-common", dist):
        out = Path(tmp_path) / name
        r = subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
                           cwd=Path(root) / "packages" / name, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        with zipfile.ZipFile(next(out.glob(name.replace("-", "_") + "-*.whl"))) as z:
            z.extractall(target)
    module = dist.replace("-", "_")
    r = subprocess.run([sys.executable, "-S", "-c", _WHEEL_ALONE_PROBE, str(target),
                        sysconfig.get_paths()["purelib"], dist, module],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    got["target"] = str(target)
    return got


def hopper_unavailable_reason() -> Optional[str]:
    """Why this machine cannot run tests marked `gpu` (None on an sm_90 CUDA device)."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    cap = tuple(torch.cuda.get_device_capability())
    if cap != (9, 0):
        return f"needs an sm_90 (Hopper) GPU; found sm_{cap[0]}{cap[1]}"
    return None


def skip_gpu_test_without_hopper(item) -> None:
    """A pytest_runtest_setup hook for the members' conftest.py files: a test marked `gpu`
    is skipped, with the reason, where no sm_90 GPU is present. Every member's conftest
    imports this one function, so a package's tests skip the same way whether pytest runs
    from the repository root or from the package's own directory."""
    if item.get_closest_marker("gpu") is None:
        return
    reason = hopper_unavailable_reason()
    if reason is not None:
        import pytest

        pytest.skip(f"gpu test: {reason}")


def ptxas() -> Optional[str]:
    """A ptxas that assembles sm_90a: the one torch's triton dependency ships, else PATH's."""
    import shutil
    from pathlib import Path

    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
        if bundled.exists():
            return str(bundled)
    except ImportError:
        pass
    return shutil.which("ptxas")


def ptxas_report(probe: str, args, kernel_glob: str, tmp_path) -> str:
    """Run `probe` (Python that compiles kernels; argv[1:] = args) with the DSL keeping its PTX
    in tmp_path, assemble the one PTX whose name matches kernel_glob with `ptxas -v` for
    sm_90a and return ptxas's report (registers, spills, warnings such as C7512). Skips the
    calling test where no ptxas is found."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    assembler = ptxas()
    if assembler is None:
        pytest.skip("no ptxas")
    env = dict(os.environ, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", probe, *map(str, args)], env=env, check=True,
                   cwd=tmp_path)
    ptx = sorted(Path(tmp_path).rglob(kernel_glob))
    assert len(ptx) == 1, ptx
    res = subprocess.run([assembler, "-arch=sm_90a", "-v", str(ptx[0]), "-o",
                          str(Path(tmp_path) / "k.cubin")], capture_output=True, text=True,
                         check=True)
    return res.stdout + res.stderr


def inline_asm_blocks(ptx: str) -> tuple:
    """(the text of each inline-asm block, the PTX outside them) of a kernel's PTX."""
    pieces = ptx.split("// begin inline asm")
    blocks, outside = [], [pieces[0]]
    for piece in pieces[1:]:
        asm, after = piece.split("// end inline asm", 1)
        blocks.append(asm)
        outside.append(after)
    return blocks, "".join(outside)


def numbered_operand_values(bundle: type) -> dict:
    """A value for every field of an operand bundle (moe_common.cute.jit.operands), numbered by
    its place: field i is 0x7f0000000000 + i (Int64: a pointer), i (Int32) or i + 0.5 (Float32)."""
    from .cute import jit

    return {name: {"Int64": 0x7F0000000000 + i, "Float32": i + 0.5}.get(ty.__name__, i)
            for i, (name, ty) in enumerate(jit.field_types(bundle).items())}


def check_operands_marshal(compiled, bundle: type, *launch_args, before: tuple = ()) -> None:
    """Assert that a compiled kernel launcher passes every field of an operand bundle
    (moe_common.cute.jit.operands) to the kernel as its own parameter, in field order, with its
    value: fields numbered 0, 1, 2, ... (pointers from 0x7f0000000000, floats + 0.5) are built
    with jit.operands and read back from the launcher's marshalled arguments (no GPU needed).
    before: the launcher's scalar arguments ahead of the bundle (one marshalled argument each);
    launch_args: those after it (grid, stream)."""
    import ctypes

    from .cute import jit

    types = jit.field_types(bundle)
    # the C type of each DSL type, stated here apart from jit.C_TYPES so that a wrong entry
    # there is caught
    ctype = {"Int64": ctypes.c_int64, "Int32": ctypes.c_int32, "Float32": ctypes.c_float}
    values = numbered_operand_values(bundle)
    args, _ = compiled.generate_execution_args(*before, jit.operands(bundle, **values),
                                               *launch_args)
    args = args[len(before):]
    assert len(args) >= len(values), (len(args), len(values))
    got = {name: ctypes.cast(p, ctypes.POINTER(ctype[types[name].__name__])).contents.value
           for name, p in zip(types, args)}
    assert got == values, {k: (got[k], values[k]) for k in values if got[k] != values[k]}
