"""``fused-moe bench``: the one benchmark every quoted number comes from (docs/DESIGN.md section 7).

Per (shape, T, kernel) it times the whole layer as a user calls it (``FusedMoE``, routing
preparation included) under CUDA-graph replay: one graph holds N calls that rotate among N
input copies (and, when a layer's weights are small, among weight copies) so the data touched
between two uses of the same bytes is several times the L2; the graph is replayed many times
after warm-up and the median per call is reported. Metrics per row:

* time (us, median per call),
* GB/s of 4-bit weight bytes of the experts actually hit (distinct experts in each copy's
  routing x (packed e2m1 codes + block scales + global scales) of one expert),
* TFLOP/s = 2*T*k*H*(N1 + I) / t (= 6*T*k*H*I for gated activations).

Baselines (torch only):

* ``torch-bf16``: bf16 weights (dequantized once), pairs sorted by expert on the device,
  ``torch._grouped_mm`` for FC1, the activation, ``torch._grouped_mm`` for FC2, weighted
  scatter-add in fp32;
* ``torch-dequant``: the same after dequantizing all experts to bf16 with torch ops in every
  call (what a user without a 4-bit kernel pays).

``torch._grouped_mm(mat_a, mat_b, offs)`` semantics used here (checked against the ATen source,
torch 2.8-2.11): ``mat_a`` [M, K] 2-D with rows grouped by expert, ``mat_b`` [G, K, N] 3-D,
``offs`` int32 [G] with the *cumulative end row* of each group (group g is rows
``offs[g-1]:offs[g]``; ``offs[-1]`` may be < M, rows past it are left unwritten), output [M, N]
of mat_a's dtype. The fast CUTLASS path (no host sync, so CUDA-graph capturable) needs sm_90 or
sm_100 and bf16 inputs; elsewhere it falls back to a loop that copies ``offs`` to the host.
Both operands need one of their last two dims contiguous and the other stride a multiple of
16 bytes (K and N multiples of 8 for bf16), and a 16-byte aligned data pointer; ``mat_b`` may
be a transposed view of [G, N, K] (nn.Linear layout). Forward 2d x 3d has no per-group row
alignment requirement (torchtitan's padding of groups to 8/16/32 rows is for the backward and
for the fp8/mxfp8 variants).

Without a supported GPU (CUDA sm_90), ``bench`` prints why and benchmarks nothing (exit 0).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from typing import Callable, Optional, Sequence

import torch

from moe_common.activations import apply_activation
from moe_common.types import Activation
from moe_common.weights import MoEWeights

from .api import FusedMoE, explain
from .presets import BLOCK, Preset, random_inputs, random_weights

DEFAULT_TOKENS = (1, 8, 32, 128, 512, 2048, 8192)
BASELINES = ("torch-bf16", "torch-dequant")
L2_FALLBACK_BYTES = 60 * 2**20
ROTATE_FACTOR = 4  # data touched between reuses >= ROTATE_FACTOR x L2


# ----------------------------------------------------------------------------------------------
# environment
# ----------------------------------------------------------------------------------------------
def supported_gpu() -> tuple:
    """(True, device name) on a CUDA sm_90 GPU, else (False, why)."""
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    cap = torch.cuda.get_device_capability()
    name = torch.cuda.get_device_name()
    if tuple(cap) != (9, 0):
        return False, f"needs an sm_90 (Hopper) GPU; found {name} (sm_{cap[0]}{cap[1]})"
    return True, name


def l2_bytes(device=None) -> int:
    try:
        return int(torch.cuda.get_device_properties(device).L2_cache_size) or L2_FALLBACK_BYTES
    except Exception:  # noqa: BLE001
        return L2_FALLBACK_BYTES


def git_commit() -> Optional[str]:
    # The GPU host gets a copy of the tree without .git: the caller passes the commit along.
    if os.environ.get("FUSED_MOE_COMMIT"):
        return os.environ["FUSED_MOE_COMMIT"]
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True,
                           text=True, timeout=10)
        if r.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return r.stdout.strip() + ("-dirty" if dirty else "")
    except Exception:  # noqa: BLE001
        pass
    return None


# ----------------------------------------------------------------------------------------------
# numerics
# ----------------------------------------------------------------------------------------------
def compare(out: torch.Tensor, ref: torch.Tensor, *, max_rel_l2: float = 1e-2, min_cosine: float = 0.9999) -> dict:
    """docs/DESIGN.md section 5 metrics of ``out`` vs ``ref``: relative L2 error, cosine, NaN
    count."""
    o, r = out.double().flatten(), ref.double().flatten()
    nan = int((~torch.isfinite(o)).sum())
    rn = float(r.norm())
    rel = float((o - r).norm()) / rn if rn > 0 else float((o - r).norm())
    on = float(o.norm())
    cos = float((o @ r) / (on * rn)) if on > 0 and rn > 0 else (1.0 if on == rn else 0.0)
    ok = nan == 0 and math.isfinite(rel) and rel <= max_rel_l2 and cos >= min_cosine
    return {"rel_l2": rel, "cosine": cos, "nonfinite": nan, "ok": ok}


_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_LUTS: dict = {}


def _e2m1_lut(device) -> torch.Tensor:
    """The e2m1 code -> value table on `device`, made once (an H2D copy must not happen while a
    CUDA graph is being captured: the first, eager call creates it)."""
    key = str(torch.device(device))
    lut = _LUTS.get(key)
    if lut is None:
        lut = _LUTS[key] = torch.tensor(_E2M1, dtype=torch.float32).to(device)
    return lut


def dequantize_bf16(weights: MoEWeights, which: str, out: Optional[torch.Tensor] = None,
                    chunk: int = 8) -> torch.Tensor:
    """All experts of ``w13`` or ``w2`` dequantized to bf16 with plain torch ops, in expert
    chunks (bounded temporaries, no host sync: capturable). ``out`` [E, N, K] bf16 or None."""
    packed = getattr(weights, which)
    scales = getattr(weights, which + "_scale")
    scale_2 = getattr(weights, which + "_scale_2")
    e, n, kh = packed.shape
    k = 2 * kh
    bs = BLOCK[weights.weight_format]
    if out is None:
        out = torch.empty((e, n, k), dtype=torch.bfloat16, device=packed.device)
    lut = _e2m1_lut(packed.device)
    for e0 in range(0, e, chunk):
        e1 = min(e, e0 + chunk)
        p = packed[e0:e1]
        codes = torch.stack((p & 0xF, p >> 4), dim=-1).reshape(e1 - e0, n, k // bs, bs)
        vals = lut[codes.int()]
        s = scales[e0:e1]
        if weights.weight_format == "nvfp4":
            sf = s.float()
        else:  # e8m0 bytes: 2^(b - 127)
            sf = torch.exp2(s.view(torch.uint8).float() - 127.0)
        # (q * s) is exact in fp32; the only rounding is * scale_2, then the bf16 cast.
        v = vals * sf.unsqueeze(-1) * scale_2[e0:e1].float().view(-1, 1, 1, 1)
        out[e0:e1] = v.reshape(e1 - e0, n, k).to(torch.bfloat16)
    return out


def grouped_mm_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, activation: Activation, *, out: torch.Tensor,
                   w13_bias: Optional[torch.Tensor] = None, w2_bias: Optional[torch.Tensor] = None,
                   local_expert_offset: int = 0) -> torch.Tensor:
    """The bf16 ``torch._grouped_mm`` MoE baseline (no host sync on sm_90: capturable).

    ``w13`` [E, N1, H] and ``w2`` [E, H, I] bf16 (nn.Linear layout, passed as transposed views).
    Pairs routed outside [offset, offset + E) are sorted past the last group and contribute 0.
    """
    t, k = topk_ids.shape
    e = w13.shape[0]
    ids = topk_ids.reshape(-1).long() - local_expert_offset
    valid = (ids >= 0) & (ids < e)
    ids = torch.where(valid, ids, e)
    sorted_ids, order = torch.sort(ids, stable=True)
    counts = torch.zeros(e + 1, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
    offs = torch.cumsum(counts[:e], 0, dtype=torch.int32)
    tok = order // k
    h = torch._grouped_mm(x[tok], w13.transpose(1, 2), offs=offs).float()
    keep = sorted_ids < e
    gid = sorted_ids.clamp(max=e - 1)
    if w13_bias is not None:
        h = h + w13_bias.float()[gid]
    a = apply_activation(h, activation).to(torch.bfloat16)
    y = torch._grouped_mm(a, w2.transpose(1, 2), offs=offs).float()
    if w2_bias is not None:
        y = y + w2_bias.float()[gid]
    rw = topk_weights.reshape(-1).float()[order]
    y = torch.where(keep.unsqueeze(1), y * rw.unsqueeze(1), 0.0)
    acc = torch.zeros((t, x.shape[1]), dtype=torch.float32, device=x.device)
    acc.index_add_(0, tok, y)
    out.copy_(acc)
    return out


# ----------------------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------------------
def graph_time_us(calls: Sequence[Callable[[], object]], *, min_replays: int = 10, max_replays: int = 200,
                  budget_s: float = 2.0) -> dict:
    """Capture ``calls`` (run in order) in one CUDA graph, replay it, median us per call."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    t0 = time.perf_counter()
    while len(times) < max_replays and (len(times) < min_replays or time.perf_counter() - t0 < budget_s):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    del g
    return {"median_us": statistics.median(times), "min_us": min(times), "replays": len(times),
            "calls_per_graph": len(calls)}


def copy_ceiling(device="cuda", nbytes: int = 1 << 30) -> dict:
    """Device-to-device copy bandwidth, bytes read + written, median of 20."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(20):
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end) * 1e-3)
    t = statistics.median(ts)
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes": 2 * nbytes, "seconds": t, "GBps": 2 * nbytes / t / 1e9}


# ----------------------------------------------------------------------------------------------
# the benchmark
# ----------------------------------------------------------------------------------------------
def _copies_needed(bytes_per_copy: float, l2: int, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, math.ceil(ROTATE_FACTOR * l2 / max(bytes_per_copy, 1)))))


def eager_time_us(calls: Sequence[Callable[[], object]], *, repeats: int = 3) -> dict:
    """Wall-clock median per call without graphs: only for exercising the bench on a CPU."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for c in calls:
            c()
        times.append((time.perf_counter() - t0) * 1e6 / len(calls))
    return {"median_us": statistics.median(times), "min_us": min(times), "replays": repeats,
            "calls_per_graph": len(calls)}


def bench_preset(p: Preset, tokens: Sequence[int], *, kernels: Optional[Sequence[str]] = None,
                 quant_mode: str = "w4a16", seed: int = 0, check: bool = True,
                 log: Callable[[str], None] = print, device=None,
                 timer: Callable[..., dict] = graph_time_us, rotate: bool = True) -> list:
    """Rows for one shape over ``tokens``. ``kernels`` None = dispatcher's choice ("auto"),
    every capable kernel forced (the reference excluded) and both baselines.

    ``device``/``timer``/``rotate`` exist for tests (a CPU run with ``eager_time_us``, one
    weight copy and two input copies); numbers come from the defaults: the current CUDA
    device, CUDA-graph replay, data rotated over several times the L2."""
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    on_cuda = dev.type == "cuda"
    cap = tuple(torch.cuda.get_device_capability(dev)) if on_cuda else None
    act = Activation(p.activation)
    l2 = l2_bytes(dev) if on_cuda else L2_FALLBACK_BYTES
    expert_bytes = p.expert_bytes()
    layer_bytes = expert_bytes * p.experts
    free = torch.cuda.mem_get_info(dev)[0] if on_cuda else 8 << 30
    bf16_bytes = 2 * p.experts * p.hidden * (p.n1 + p.intermediate)
    n_w = _copies_needed(layer_bytes, l2, 1, 8)
    want_baselines = kernels is None or any(k in BASELINES for k in kernels)
    per_copy = layer_bytes + (bf16_bytes if want_baselines else 0)
    n_w = max(1, min(n_w, int(0.4 * free // max(per_copy, 1)))) if rotate else 1
    log(f"# {p.describe()}: {layer_bytes / 1e6:.1f} MB of 4-bit weights, {n_w} weight cop{'y' if n_w == 1 else 'ies'}")

    wcopies = []
    for i in range(n_w):
        w = random_weights(p, device=dev, seed=seed * 1000 + i)
        if quant_mode == "w4a4" and p.weight_format == "nvfp4":
            calib = random_inputs(p, 256, device=dev, gen=torch.Generator(device=dev).manual_seed(seed + 7))[0]
            w = w.calibrate(calib, activation=act)
        wcopies.append(w)
    bf16 = []
    dq_buf = None
    if want_baselines:
        for w in wcopies:
            bf16.append((dequantize_bf16(w, "w13"), dequantize_bf16(w, "w2")))
        if kernels is None or "torch-dequant" in kernels:
            dq_buf = (torch.empty((p.experts, p.n1, p.hidden), dtype=torch.bfloat16, device=dev),
                      torch.empty((p.experts, p.hidden, p.intermediate), dtype=torch.bfloat16, device=dev))

    rows = []
    gen = torch.Generator(device=dev).manual_seed(seed)
    for t in tokens:
        io_bytes = t * p.hidden * 2 * 2 + t * p.top_k * 8
        n_in = _copies_needed(io_bytes, l2, 4, 32) if rotate else 2
        n_in = int(math.ceil(n_in / n_w) * n_w)
        inputs = [random_inputs(p, t, device=dev, gen=gen) for _ in range(n_in)]
        hit = [int(torch.unique(ids).numel()) for _, _, ids in inputs]
        hit_mean = sum(hit) / len(hit)
        wbytes = hit_mean * expert_bytes
        flops = p.flops(t)
        shape = p.shape(t, quant_mode=quant_mode, device_capability=cap)
        ex = explain(shape, activation=act, quant_mode=quant_mode)
        capable = [o.kernel for o in ex.offers]
        names = list(kernels) if kernels else (
            ["auto"] + [k for k in capable if k != "reference"] + list(BASELINES))
        ref_out = None
        if check:
            from moe_common.reference import reference_moe

            x0, tw0, id0 = inputs[0]
            ref_out = reference_moe(x0, wcopies[0], tw0, id0, activation=act, quant_mode=quant_mode)
        for name in names:
            row = {"shape": p.name, "E": p.experts, "H": p.hidden, "I": p.intermediate, "k": p.top_k,
                   "format": p.weight_format, "activation": p.activation, "bias": p.bias,
                   "quant_mode": quant_mode, "T": t, "kernel": name, "experts_hit": hit_mean,
                   "weight_bytes": wbytes, "flops": flops, "input_copies": n_in, "weight_copies": n_w}
            try:
                check_out = torch.full((t, p.hidden), float("nan"), dtype=torch.bfloat16, device=dev)
                if name in BASELINES:
                    outs = [torch.empty((t, p.hidden), dtype=torch.bfloat16, device=dev) for _ in range(n_w)]

                    def make(i, name=name, outs=outs):
                        x, tw, ids = inputs[i]
                        wi = i % n_w
                        w = wcopies[wi]
                        def call():
                            if name == "torch-dequant":
                                w13 = dequantize_bf16(w, "w13", out=dq_buf[0])
                                w2 = dequantize_bf16(w, "w2", out=dq_buf[1])
                            else:
                                w13, w2 = bf16[wi]
                            return grouped_mm_moe(x, w13, w2, tw, ids, act, out=outs[wi], w13_bias=w.w13_bias,
                                                  w2_bias=w.w2_bias, local_expert_offset=w.local_expert_offset)
                        return call
                    calls = [make(i) for i in range(n_in)]
                    if check:
                        x0, tw0, id0 = inputs[0]
                        w13, w2 = bf16[0]
                        grouped_mm_moe(x0, w13, w2, tw0, id0, act, out=check_out, w13_bias=wcopies[0].w13_bias,
                                       w2_bias=wcopies[0].w2_bias)
                else:
                    forced = None if name == "auto" else name
                    layers = [FusedMoE(w, t, p.top_k, activation=act, quant_mode=quant_mode, kernel=forced)
                              for w in wcopies]
                    row["runs"] = layers[0].choice(t).kernel
                    if name == "auto":
                        row["kernel"] = f"auto({row['runs']})"
                    for layer in layers:
                        layer.warmup([t])
                    calls = [(lambda i=i: layers[i % n_w](*inputs[i])) for i in range(n_in)]
                    if check:
                        check_out.copy_(layers[0](*inputs[0]))
                if on_cuda:
                    torch.cuda.synchronize()
                if check:
                    row.update({"check_" + k: v for k, v in compare(check_out, ref_out).items()})
                timing = timer(calls)
                row.update(timing)
                us = timing["median_us"]
                row["time_us"] = us
                row["GBps"] = wbytes / (us * 1e-6) / 1e9
                row["TFLOPs"] = flops / (us * 1e-6) / 1e12
            except Exception as e:  # noqa: BLE001 - a failing kernel is a row, not the end of the run
                row["error"] = f"{type(e).__name__}: {e}"
            rows.append(row)
            log(format_row(row))
            if on_cuda:
                torch.cuda.empty_cache()
    base = {}
    for r in rows:
        if r["kernel"] == "torch-bf16" and "time_us" in r:
            base[r["T"]] = r["time_us"]
    for r in rows:
        if "time_us" in r and r["T"] in base:
            r["speedup_vs_bf16"] = base[r["T"]] / r["time_us"]
    return rows


HEADER = f"{'shape':<16} {'T':>6} {'kernel':<26} {'time us':>10} {'GB/s':>8} {'TFLOP/s':>8} {'x bf16':>7}  check"


def format_row(r: dict) -> str:
    if "error" in r:
        return f"{r['shape']:<16} {r['T']:>6} {r['kernel']:<26} {'error: ' + r['error']}"
    chk = ""
    if "check_ok" in r:
        chk = ("ok" if r["check_ok"] else "FAIL") + f" rel={r['check_rel_l2']:.1e} cos={r['check_cosine']:.6f}"
    sp = f"{r['speedup_vs_bf16']:.2f}" if "speedup_vs_bf16" in r else ""
    return (f"{r['shape']:<16} {r['T']:>6} {r['kernel']:<26} {r['time_us']:>10.1f} {r['GBps']:>8.0f} "
            f"{r['TFLOPs']:>8.1f} {sp:>7}  {chk}")


def plot(result: dict, path: str) -> bool:
    """Time vs T per kernel, one panel per shape. False (and a note) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(matplotlib is not installed: no plot written to {path})")
        return False
    rows = [r for r in result["rows"] if "time_us" in r]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    if not shapes:
        print(f"(nothing timed: no plot written to {path})")
        return False
    fig, axes = plt.subplots(len(shapes), 2, figsize=(12, 4 * len(shapes)), squeeze=False)
    for ax_t, ax_b, s in zip(axes[:, 0], axes[:, 1], shapes):
        srows = [r for r in rows if r["shape"] == s]
        for k in dict.fromkeys(r["kernel"].split("(")[0] for r in srows):
            kr = sorted((r for r in srows if r["kernel"].split("(")[0] == k), key=lambda r: r["T"])
            ax_t.plot([r["T"] for r in kr], [r["time_us"] for r in kr], marker="o", label=k)
            ax_b.plot([r["T"] for r in kr], [r["GBps"] for r in kr], marker="o", label=k)
        for ax in (ax_t, ax_b):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("tokens T")
            ax.grid(True, which="both", alpha=0.3)
        ax_t.set_yscale("log")
        ax_t.set_ylabel("time per call (us)")
        ax_t.set_title(s)
        ax_b.set_ylabel("GB/s of 4-bit weights hit")
        if result.get("copy_ceiling"):
            ax_b.axhline(result["copy_ceiling"]["GBps"], color="gray", linestyle="--", label="D2D copy")
        ax_b.set_title(f"{s}: weight bandwidth")
        ax_t.legend(fontsize=8)
        ax_b.legend(fontsize=8)
    fig.suptitle(f"fused-moe bench, {result.get('gpu', '')}, {result.get('date', '')}, {result.get('commit', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def run(presets: Sequence[Preset], tokens: Sequence[int] = DEFAULT_TOKENS, *, kernels=None,
        quant_mode: str = "w4a16", seed: Optional[int] = None, check: bool = True,
        json_path: Optional[str] = None, plot_path: Optional[str] = None, argv=None) -> dict:
    """The whole `fused-moe bench`; returns the result dict (also written as JSON)."""
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    ok, why = supported_gpu()
    result = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv)),
        "commit": git_commit(), "torch": torch.__version__, "python": platform.python_version(),
        "seed": seed, "tokens": list(tokens), "quant_mode": quant_mode, "rows": [],
    }
    if not ok:
        print(f"fused-moe bench: {why}; the benchmark needs an H100/H200 (sm_90). Nothing was benchmarked.")
        result["skipped"] = why
    else:
        result["gpu"] = torch.cuda.get_device_name()
        result["l2_bytes"] = l2_bytes()
        result["copy_ceiling"] = copy_ceiling()
        print(f"fused-moe bench on {result['gpu']} (torch {torch.__version__}, commit {result['commit']}, "
              f"seed {seed}); device copy ceiling {result['copy_ceiling']['GBps']:.0f} GB/s (read+write)")
        print(HEADER)
        for p in presets:
            result["rows"] += bench_preset(p, tokens, kernels=kernels, quant_mode=quant_mode, seed=seed,
                                           check=check)
        print()
        print("summary (x bf16 = torch-bf16 time / time):")
        print(HEADER)
        for r in result["rows"]:
            print(format_row(r))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"wrote {json_path}")
    if plot_path:
        if not result["rows"]:
            print(f"(no rows were timed: no plot written to {plot_path})")
        elif plot(result, plot_path):
            print(f"wrote {plot_path}")
    return result
