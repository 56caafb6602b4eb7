"""``fused-moe bench --ep N`` (and tools/bench_ep.py): the expert-parallel layer timed over N
processes, split into dispatch, local compute and combine.

1. Launch. Under torchrun (RANK, WORLD_SIZE and LOCAL_RANK in the environment) every process is
   one rank and joins the group from the environment; otherwise ``spawn`` starts N processes
   (torch.multiprocessing, a free localhost port, a deadline after which they are ended).
   Backend: NCCL with one GPU per rank where there are N sm_90 GPUs, else gloo on the CPU,
   where the layer is made small (``cpu_preset``) and T is capped at ``CPU_MAX_TOKENS``
   (the torch reference serves the local experts there).
2. Per rank: the full layer from the seed (the same on every rank), this rank's slice
   (``shard_weights``), this rank's own random tokens; per T and per strategy ("all_to_all",
   "allgather": ``fused_moe_ep``; "fixed": ``FusedMoEEP``) warm-up calls, then timed calls with
   the phase split (the device synchronized between phases, so the phases add up to more than
   an unsynchronized call), median per phase; the output is checked against the single-process
   layer (``fused_moe`` on the full weights) on this rank's tokens. On GPUs the "fixed" step is
   also captured in a CUDA graph and replayed (every rank together), its median as ``graph_us``
   (no phase split: the number a served decode step sees).
3. Rank 0 prints one line per (T, strategy) with the slowest rank's medians and writes the
   JSON (every rank's medians and check, and what ``strategy=None`` would choose).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import statistics
import sys
import time
import traceback
from dataclasses import asdict, replace
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .api import fused_moe
from .bench import compare, git_commit, supported_gpu
from .distributed import PHASES, FusedMoEEP, explain_ep, fused_moe_ep, shard_weights
from .presets import Preset, random_inputs, random_weights, resolve

EP_STRATEGIES = ("all_to_all", "allgather", "fixed")
DEFAULT_EP_TOKENS = (1, 128, 2048, 8192)
CPU_MAX_TOKENS = 64  # the reference on a CPU: larger T only adds minutes
CPU_LAYER = dict(hidden=256, intermediate=256)  # multiples of both formats' blocks
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


# ----------------------------------------------------------------------------------------------
# launching
# ----------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn: Callable, world: int, port: int, backend: str, timeout_s: float, args: tuple) -> None:
    if backend == "nccl":
        torch.cuda.set_device(rank)
    else:  # N ranks share the host's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=_dt.timedelta(seconds=timeout_s))
    try:
        fn(rank, world, *args)
    except BaseException:
        # The parent re-raises one rank's error, often a peer's "connection closed" rather than the
        # cause: every rank's traceback goes to stderr too.
        sys.stderr.write(f"rank {rank} of {world} failed:\n{traceback.format_exc()}")
        raise
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable, nprocs: int, args: tuple = (), *, backend: str = "gloo", timeout_s: float = 600.0) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``nprocs`` spawned processes that form the default
    process group (``backend``, localhost). A rank's exception is raised here (the others are
    ended); past ``timeout_s`` every rank is ended and TimeoutError raised. ``fn`` must be
    importable by the children (a module-level function)."""
    if int(nprocs) < 1:
        raise ValueError(f"nprocs: got {nprocs}; allowed: >= 1")
    ctx = mp.start_processes(_entry, args=(fn, nprocs, free_port(), backend, timeout_s, args), nprocs=nprocs,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"spawn: the {nprocs} ranks did not finish within {timeout_s:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
                p.join(5)
                if p.is_alive():
                    p.kill()


def under_torchrun() -> bool:
    return all(v in os.environ for v in TORCHRUN_VARS)


# ----------------------------------------------------------------------------------------------
# one rank's benchmark
# ----------------------------------------------------------------------------------------------
def cpu_preset(p: Preset, world: int) -> Preset:
    """The small layer a CPU run uses: the preset's format, activation, bias and k; H = I = 256;
    E = max(8, 2 W) (at least k)."""
    experts = max(8, 2 * world, p.top_k)
    return replace(p, name=p.name + "-cpu", experts=experts, **CPU_LAYER)


def _median_us(samples: list) -> dict:
    return {ph: statistics.median(s[ph] for s in samples) * 1e6 for ph in PHASES}


def _time_calls(call: Callable[[dict], torch.Tensor], warmup: int, iters: int) -> tuple:
    """(last output, per-phase median us) over ``iters`` timed calls after ``warmup`` calls."""
    for _ in range(warmup):
        out = call({})
    samples = []
    for _ in range(iters):
        tm: dict = {}
        out = call(tm)
        samples.append(tm)
    return out, _median_us(samples)


def _graph_us(step: Callable[[], object], replays: int, group=None) -> dict:
    """The median us of one captured step replayed from a CUDA graph (every rank captures and
    replays together: the step's collectives pair the ranks). Where a rank cannot capture,
    every rank records the errors instead of replaying."""
    graph, error = torch.cuda.CUDAGraph(), None
    try:
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            step()
    except Exception as e:  # noqa: BLE001 - a row, not the end of the run
        error = f"{type(e).__name__}: {e}"
    errors = [None] * dist.get_world_size(group)
    dist.all_gather_object(errors, error, group=group)
    if any(errors):
        return {"graph_error": errors}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    dist.barrier(group=group)
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return {"graph_us": statistics.median(times)}


def rank_rows(cfg: dict, group=None) -> list:
    """This rank's rows for one preset (every rank of ``group`` calls it with the same ``cfg``):
    per (T, strategy) the phase medians (us), the check against the single-process layer and
    what strategy=None would pick."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    p = Preset(**cfg["preset"])
    dev = torch.device(cfg["device"]) if cfg["device"] != "cuda" else torch.device("cuda", torch.cuda.current_device())
    full = random_weights(p, device=dev, seed=cfg["seed"])
    mine = shard_weights(full, rank, world)
    rows = []
    for t in cfg["tokens"]:
        gen = torch.Generator(device=dev).manual_seed(cfg["seed"] + 1 + 7919 * rank + t)
        x, tw, ids = random_inputs(p, t, device=dev, gen=gen)
        ref = fused_moe(x, full, tw, ids, activation=p.activation) if cfg["check"] and t else None
        auto = explain_ep(x, mine, tw, ids, group=group, activation=p.activation).strategy
        for s in cfg["strategies"]:
            if s == "fixed":
                layer = FusedMoEEP(mine, max(t, 1), p.top_k, group=group, activation=p.activation).warmup()

                def call(tm, layer=layer):
                    return layer(x, tw, ids, timings=tm)
            else:
                def call(tm, s=s):
                    return fused_moe_ep(x, mine, tw, ids, group=group, strategy=s, activation=p.activation,
                                        timings=tm)
            out, med = _time_calls(call, cfg["warmup"], cfg["iters"])
            row = {"T": t, "strategy": s, "auto": auto, **{ph + "_us": med[ph] for ph in PHASES},
                   "total_us": sum(med.values())}
            if ref is not None:
                row.update({"check_" + k: v for k, v in compare(out, ref).items()})
            if s == "fixed" and dev.type == "cuda":
                row.update(_graph_us(lambda: layer(x, tw, ids), cfg["iters"], group))
            rows.append(row)
    return rows


def _merge(per_rank: list) -> list:
    """Rank lists of rows -> one row per (T, strategy): every rank's values and the max."""
    merged = []
    for i, first in enumerate(per_rank[0]):
        ranks = [rows[i] for rows in per_rank]
        row = {"T_per_rank": first["T"], "strategy": first["strategy"], "auto": first["auto"]}
        for key in [ph + "_us" for ph in PHASES] + ["total_us"]:
            vals = [r[key] for r in ranks]
            row[key] = vals
            row["max_" + key] = max(vals)
        if "check_rel_l2" in first:
            row["check_rel_l2"] = [r["check_rel_l2"] for r in ranks]
            row["check_ok"] = all(r["check_ok"] for r in ranks)
        if "graph_us" in first:
            row["graph_us"] = [r["graph_us"] for r in ranks]
            row["max_graph_us"] = max(row["graph_us"])
        if "graph_error" in first:
            row["graph_error"] = first["graph_error"]
        merged.append(row)
    return merged


HEADER = (f"{'layer':<22} {'T/rank':>6} {'strategy':<11} {'dispatch':>10} {'compute':>10} {'combine':>10} "
          f"{'total us':>10}  auto        check")


def format_row(layer: str, r: dict) -> str:
    chk = ""
    if "check_ok" in r:
        chk = ("ok" if r["check_ok"] else "FAIL") + f" rel={max(r['check_rel_l2']):.1e}"
    if "max_graph_us" in r:
        chk += f"  graph replay {r['max_graph_us']:.1f} us"
    elif "graph_error" in r:
        chk += f"  graph capture failed: {next(e for e in r['graph_error'] if e)}"
    return (f"{layer:<22} {r['T_per_rank']:>6} {r['strategy']:<11} {r['max_dispatch_us']:>10.1f} "
            f"{r['max_compute_us']:>10.1f} {r['max_combine_us']:>10.1f} {r['max_total_us']:>10.1f}  "
            f"{r['auto']:<11} {chk}")


def run_rank(rank: int, world: int, job: dict) -> Optional[dict]:
    """One rank of the whole benchmark (every preset); rank 0 prints and writes the JSON and
    returns the result."""
    result = dict(job["meta"], world_size=world, backend=str(dist.get_backend()), presets=[])
    if rank == 0:
        print(f"# expert parallelism over {world} ranks ({result['backend']}); per-phase medians of the "
              "slowest rank, device synchronized between phases")
        print(HEADER)
    for cfg in job["configs"]:
        rows = rank_rows(cfg)
        per_rank = [None] * world
        dist.all_gather_object(per_rank, rows)
        merged = _merge(per_rank)
        p = Preset(**cfg["preset"])
        result["presets"].append({"layer": p.describe(), "tokens_per_rank": cfg["tokens"], "rows": merged})
        if rank == 0:
            for r in merged:
                print(format_row(p.name, r))
    if rank != 0:
        return None
    if job["json"]:
        with open(job["json"], "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {job['json']}")
    return result


# ----------------------------------------------------------------------------------------------
# the command
# ----------------------------------------------------------------------------------------------
def make_job(presets: Sequence[Preset], tokens: Sequence[int], world: int, *, on_gpu: bool,
             strategies: Optional[Sequence[str]] = None, seed: Optional[int] = None, check: bool = True,
             warmup: Optional[int] = None, iters: Optional[int] = None, json_path: Optional[str] = None,
             argv: Optional[list] = None, log: Callable[[str], None] = print) -> dict:
    """Everything the ranks need, as plain data (it crosses the spawn)."""
    strategies = list(strategies or EP_STRATEGIES)
    bad = [s for s in strategies if s not in EP_STRATEGIES]
    if bad:
        raise ValueError(f"ep strategies: got {bad}; allowed: {', '.join(EP_STRATEGIES)}")
    if any(int(t) < 0 for t in tokens):
        raise ValueError(f"tokens: got {list(tokens)}; allowed: T >= 0 per rank")
    seed = int(time.time()) & 0x7FFFFFFF if seed is None else seed
    tokens = sorted({int(t) for t in tokens})
    if not on_gpu:
        skipped = [t for t in tokens if t > CPU_MAX_TOKENS]
        tokens = [t for t in tokens if t <= CPU_MAX_TOKENS] or [1]
        if skipped:
            log(f"(on the CPU: T > {CPU_MAX_TOKENS} skipped: {skipped})")
    configs = []
    for p in presets:
        q = p if on_gpu else cpu_preset(p, world)
        if q.experts < world:
            raise ValueError(f"--ep: got {world} ranks for {q.experts} experts; allowed: at most E ranks")
        configs.append(dict(preset=asdict(q), tokens=tokens, strategies=strategies, seed=seed, check=check,
                            warmup=warmup if warmup is not None else (3 if on_gpu else 1),
                            iters=iters if iters is not None else (20 if on_gpu else 2),
                            device="cuda" if on_gpu else "cpu"))
    meta = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "commit": git_commit(),
            "argv": argv, "seed": seed, "torch": torch.__version__}
    return {"configs": configs, "json": json_path, "meta": meta}


def gpus_for(world: int) -> bool:
    ok, _ = supported_gpu()
    return ok and torch.cuda.device_count() >= world


def run(presets: Sequence[Preset], tokens: Sequence[int], world: Optional[int], *, timeout_s: float = 3600.0,
        **job_kw) -> int:
    """Under torchrun: this process's rank. Otherwise: spawn ``world`` ranks."""
    if under_torchrun():
        env_world = int(os.environ["WORLD_SIZE"])
        if world is not None and world != env_world:
            raise ValueError(f"--ep: got {world}; allowed: WORLD_SIZE = {env_world} under torchrun")
        local = int(os.environ["LOCAL_RANK"])
        on_gpu = gpus_for(1)
        if on_gpu:
            torch.cuda.set_device(local)
        job = make_job(presets, tokens, env_world, on_gpu=on_gpu, **job_kw)
        dist.init_process_group("nccl" if on_gpu else "gloo")
        try:
            run_rank(dist.get_rank(), env_world, job)
        finally:
            dist.destroy_process_group()
        return 0
    if world is None or world < 1:
        raise ValueError(f"--ep: got {world}; allowed: N >= 1 processes (or run under torchrun)")
    on_gpu = gpus_for(world)
    job = make_job(presets, tokens, world, on_gpu=on_gpu, **job_kw)
    spawn(run_rank, world, (job,), backend="nccl" if on_gpu else "gloo", timeout_s=timeout_s)
    return 0


def run_cli(args) -> int:
    """``fused-moe bench --ep N``: the bench arguments that apply (presets or an explicit
    shape, --tokens, --seed, --check, --json) plus --ep-strategies."""
    explicit = dict(experts=args.experts, hidden=args.hidden, intermediate=args.intermediate, top_k=args.top_k,
                    weight_format=args.weight_format, activation=args.activation, bias=args.bias)
    if args.preset:
        presets = [resolve(n, **explicit) for n in args.preset]
    else:
        presets = [resolve(None, default="deepseek-v3", **explicit)]
    if args.quant_mode != "w4a16":
        raise ValueError(f"--quant-mode: got {args.quant_mode!r}; allowed with --ep: w4a16")
    tokens = args.tokens if "--tokens" in args.argv else DEFAULT_EP_TOKENS
    return run(presets, tokens, args.ep, strategies=args.ep_strategies, seed=args.seed, check=args.check,
               json_path=args.json, argv=["fused-moe"] + list(args.argv))

