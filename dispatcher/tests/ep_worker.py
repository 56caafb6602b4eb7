"""The expert-parallel test cases and the rank function that runs them (test_distributed.py
spawns 4 gloo ranks once; the cases run on the world and on two 2-rank groups {0, 1}, {2, 3}).

Every case's inputs are a pure function of the case and the group (seeded), so the parent test
rebuilds them to compute the single-process expectations. Each rank saves what it got (outputs,
the strategy chosen, or the ValueError message) to ``<outdir>/rank<r>.pt``.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

PAIRS = ([0, 1], [2, 3])
LAYERS = {
    "nvfp4-silu": dict(experts=10, hidden=64, intermediate=64, top_k=3, weight_format="nvfp4", activation="silu"),
    "mxfp4-swigluoai-bias": dict(experts=8, hidden=64, intermediate=64, top_k=2, weight_format="mxfp4",
                                 activation="swigluoai", bias=True),
    "nvfp4-relu2": dict(experts=6, hidden=64, intermediate=32, top_k=2, weight_format="nvfp4", activation="relu2"),
}
BOTH = ("all_to_all", "allgather")

# name, group ("world" or "pair"), layer, tokens per group rank (one list per step for "fixed"),
# routing, strategies (None = chosen), options
CASES = [
    dict(name="uneven", group="world", layer="nvfp4-silu", tokens=[5, 0, 9, 3], routing="random",
         strategies=BOTH + (None,), out=True),
    dict(name="skewed", group="world", layer="nvfp4-silu", tokens=[12, 7, 12, 1], routing="skewed",
         strategies=BOTH, router_dtype=torch.bfloat16),
    dict(name="dropped-int64", group="world", layer="nvfp4-silu", tokens=[7, 2, 0, 4], routing="dropped",
         strategies=BOTH, ids_dtype=torch.int64),
    dict(name="one-rank", group="world", layer="mxfp4-swigluoai-bias", tokens=[4, 6, 0, 5], routing="one_rank",
         strategies=BOTH),
    dict(name="no-tokens", group="world", layer="nvfp4-silu", tokens=[0, 0, 0, 0], routing="random",
         strategies=BOTH),
    dict(name="chosen-large", group="world", layer="nvfp4-silu", tokens=[80, 70, 90, 66], routing="random",
         strategies=(None,)),
    dict(name="fixed", group="world", layer="nvfp4-silu", tokens=[[5, 0, 8, 3], [8, 8, 1, 0]], routing="dropped",
         api="fixed", capacity=8, ids_dtype=torch.int64),
    dict(name="pair-random", group="pair", layer="nvfp4-relu2", tokens=[6, 3], routing="random",
         strategies=BOTH + (None,)),
    dict(name="pair-zero-rank", group="pair", layer="nvfp4-silu", tokens=[0, 5], routing="skewed", strategies=BOTH),
    dict(name="pair-dropped", group="pair", layer="nvfp4-relu2", tokens=[4, 4], routing="dropped", strategies=BOTH),
    dict(name="pair-one-rank", group="pair", layer="mxfp4-swigluoai-bias", tokens=[3, 5], routing="one_rank",
         strategies=BOTH),
    dict(name="pair-fixed", group="pair", layer="mxfp4-swigluoai-bias", tokens=[[6, 2], [0, 4]], routing="random",
         api="fixed", capacity=6),
]
BENCH_JSON = "bench.json"


def preset(layer: str):
    from dispatcher.presets import Preset

    return Preset(layer, **LAYERS[layer])


def case_seed(case: dict, pair: int) -> int:
    return 1000 * CASES.index(case) + pair


def routing(case: dict, p, tokens: int, world: int, gen: torch.Generator):
    """(topk_weights, topk_ids) of one rank's tokens for the case's routing kind."""
    from dispatcher.distributed import expert_range
    from moe_common.testing import random_routing

    kind = case["routing"]
    if kind == "skewed":
        tw, ids = random_routing(tokens, p.experts, p.top_k, device="cpu", skew=3.0, generator=gen)
    elif kind == "one_rank":  # every token's experts on one rank, picked per token
        owner = torch.randint(0, world, (tokens,), generator=gen)
        ids = torch.empty((tokens, p.top_k), dtype=torch.int32)
        for t in range(tokens):
            lo, hi = expert_range(p.experts, world, int(owner[t]))
            ids[t] = lo + torch.randperm(hi - lo, generator=gen)[: p.top_k]
        tw = torch.softmax(torch.randn((tokens, p.top_k), generator=gen), dim=-1)
    else:
        logits = torch.randn((tokens, p.experts), generator=gen)
        top, ids = logits.topk(p.top_k, dim=-1)
        tw, ids = torch.softmax(top, dim=-1), ids.to(torch.int32)
    ids = ids.to(case.get("ids_dtype", torch.int32))
    if kind == "dropped":  # -1, past E and (int64) ids that would wrap into range as int32
        drop = torch.rand((tokens, p.top_k), generator=gen) < 0.3
        bad = torch.tensor([-1, p.experts + 5] + ([2**32 + 1] if ids.dtype == torch.int64 else []),
                           dtype=ids.dtype)
        pick = bad[torch.randint(0, bad.numel(), (tokens, p.top_k), generator=gen)]
        ids = torch.where(drop, pick, ids)
        tw = torch.where(drop, float("nan"), tw)  # a dropped route's weight is never read
    return tw.to(case.get("router_dtype", torch.float32)).contiguous(), ids.contiguous()


def case_inputs(case: dict, pair: int, step: int = 0):
    """(preset, full weights, [(x, topk_weights, topk_ids) per group rank])."""
    from dispatcher.presets import random_weights

    p = preset(case["layer"])
    seed = case_seed(case, pair)
    full = random_weights(p, seed=seed)
    tokens = case["tokens"][step] if case.get("api") == "fixed" else case["tokens"]
    gen = torch.Generator().manual_seed(seed + 1 + 100 * step)
    inputs = []
    for t in tokens:
        x = torch.randn((t, p.hidden), generator=gen).to(torch.bfloat16)
        inputs.append((x, *routing(case, p, t, len(tokens), gen)))
    return p, full, inputs


def _error(fn) -> str:
    try:
        fn()
    except ValueError as e:
        return "ValueError: " + str(e)
    return "no error"


def _run_case(case: dict, group, pair: int, grank: int) -> dict:
    from dispatcher.distributed import FusedMoEEP, explain_ep, fused_moe_ep, shard_weights

    p, full, inputs = case_inputs(case, pair)
    world = len(inputs)
    mine = shard_weights(full, grank, world)
    kw = dict(group=group, activation=p.activation)
    got = {}
    if case.get("api") == "fixed":
        layer = FusedMoEEP(mine, case["capacity"], p.top_k, **kw).warmup()
        for step in range(len(case["tokens"])):
            x, tw, ids = case_inputs(case, pair, step)[2][grank]
            got[f"step{step}"] = layer(x, tw, ids).clone()
        return got
    x, tw, ids = inputs[grank]
    for s in case["strategies"]:
        tm: dict = {}
        out = torch.empty((x.shape[0], p.hidden), dtype=torch.bfloat16) if case.get("out") else None
        res = fused_moe_ep(x, mine, tw, ids, strategy=s, out=out, timings=tm, **kw)
        got[str(s)] = res
        got[f"{s}-timings"] = tm
        got[f"{s}-out-is-given"] = out is not None and res is out
    ex = explain_ep(x, mine, tw, ids, **kw)
    got["explain"] = dict(strategy=ex.strategy, rows=ex.rows, tokens=ex.tokens_per_rank, text=str(ex))
    return got


def _bad_inputs(rank: int, world: int) -> dict:
    """ValueError messages per bad-input case (every rank must raise, none may hang)."""
    from dispatcher.distributed import FusedMoEEP, fused_moe_ep, shard_weights

    case = CASES[0]
    p, full, inputs = case_inputs(case, 0)
    x, tw, ids = inputs[rank]
    mine = shard_weights(full, rank, world)
    act = p.activation
    msgs = {
        "dtype-on-rank-1": _error(lambda: fused_moe_ep(x.float() if rank == 1 else x, mine, tw, ids, activation=act)),
        "strategy-disagrees": _error(lambda: fused_moe_ep(x, mine, tw, ids, activation=act,
                                                          strategy="all_to_all" if rank == 0 else "allgather")),
        "strategy-unknown": _error(lambda: fused_moe_ep(x, mine, tw, ids, activation=act, strategy="bogus")),
        "wrong-slice": _error(lambda: fused_moe_ep(x, shard_weights(full, (rank + 1) % world, world), tw, ids,
                                                   activation=act)),
        "activation-disagrees": _error(lambda: fused_moe_ep(x, mine, tw, ids,
                                                            activation="gelu_tanh" if rank == 3 else act)),
        "fixed-capacity-disagrees": _error(lambda: FusedMoEEP(mine, 4 if rank == 0 else 8, p.top_k,
                                                              activation=act)),
        "fixed-too-many-tokens": _error(lambda: FusedMoEEP(mine, 2, p.top_k, activation=act)(
            torch.zeros((3, p.hidden), dtype=torch.bfloat16), torch.full((3, p.top_k), 1.0 / p.top_k),
            torch.zeros((3, p.top_k), dtype=torch.int32))),
    }
    return msgs


def worker(rank: int, world: int, outdir: str) -> None:
    """Run every case on this rank (test_distributed.py spawns it with 4 ranks)."""
    from dispatcher import bench_ep
    from dispatcher.distributed import fused_moe_ep

    torch.set_num_threads(1)  # the parent's expectations use one thread too: the same BLAS sums
    pair = rank // 2
    pair_groups = [dist.new_group(r) for r in PAIRS]
    results = {}
    for case in CASES:
        if case["group"] == "world":
            results[case["name"]] = _run_case(case, None, 0, rank)
        else:
            results[case["name"]] = _run_case(case, pair_groups[pair], pair, rank % 2)
    results["bad"] = _bad_inputs(rank, world)
    # a group this rank is not in: every rank raises at once, so none waits
    p, full, inputs = case_inputs(CASES[0], 0)
    x, tw, ids = inputs[rank]
    results["bad"]["not-a-member"] = _error(lambda: fused_moe_ep(x, full, tw, ids, group=pair_groups[1 - pair]))
    # the group still works after all of that
    results["after-errors"] = _run_case(CASES[0], None, 0, rank)
    job = bench_ep.make_job([preset("nvfp4-relu2")], [0, 2], world, on_gpu=False, warmup=0, iters=1,
                            json_path=os.path.join(outdir, BENCH_JSON), seed=5)
    bench_ep.run_rank(rank, world, job)
    torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))


DEVICE_CASES = [c for c in CASES if c["group"] == "pair"]  # two ranks: the world of device_worker


def on_device(case: dict, pair: int, device, step: int = 0):
    """case_inputs with the weights and tensors on ``device``."""
    p, full, inputs = case_inputs(case, pair, step)
    return p, full.to(device), [tuple(t.to(device) for t in i) for i in inputs]


def device_worker(rank: int, world: int, outdir: str, device_type: str = "cuda") -> None:
    """The 2-rank cases with tensors on ``device_type`` over gloo (CUDA data staged through host
    memory; both ranks on one GPU if there is only one): the installed kernels under EP."""
    from dispatcher.distributed import FusedMoEEP, fused_moe_ep, shard_weights

    if device_type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device(device_type)
    results = {}
    for case in DEVICE_CASES:
        p, full, inputs = on_device(case, 0, dev)
        mine = shard_weights(full, rank, world)
        got = {}
        if case.get("api") == "fixed":
            layer = FusedMoEEP(mine, case["capacity"], p.top_k, activation=p.activation).warmup()
            for step in range(len(case["tokens"])):
                x, tw, ids = on_device(case, 0, dev, step)[2][rank]
                got[f"step{step}"] = layer(x, tw, ids).to("cpu", copy=True)  # the next step overwrites it
        else:
            x, tw, ids = inputs[rank]
            for s in case["strategies"]:
                got[str(s)] = fused_moe_ep(x, mine, tw, ids, strategy=s, activation=p.activation).cpu()
        results[case["name"]] = got
    torch.save(results, os.path.join(outdir, f"{device_type}-rank{rank}.pt"))
