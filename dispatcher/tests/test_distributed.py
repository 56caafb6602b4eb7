"""Expert parallelism on the CPU (gloo; the reference serves the local experts).

One spawn of 4 ranks (with a deadline, so a hang fails instead of blocking) runs every case in
ep_worker.py on the world and on two 2-rank groups; the tests here compare what each rank got
with the single-process layer on the group's concatenated tokens:

* bitwise with the same layer computed in one process on the same expert partition (each
  rank's slice over all tokens, bf16 partials summed in rank order in fp32): the reference's
  rows do not depend on the other rows of its call, so both strategies and FusedMoEEP must match
  it exactly;
* bitwise with the unpartitioned layer where every token's routes sit on one rank;
* within rel L2 1e-2 / cosine 0.9999 of the unpartitioned layer everywhere.

The rest (partition, strategy rule, argument checks, a one-rank group) runs in this process.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys

import pytest
import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # the spawned ranks import ep_worker by name
import ep_worker  # noqa: E402

from dispatcher import fused_moe  # noqa: E402
from dispatcher.bench_ep import free_port, spawn  # noqa: E402
from dispatcher.cli import main  # noqa: E402
from dispatcher.distributed import (  # noqa: E402
    ALLGATHER_MAX_TOKENS, PHASES, FusedMoEEP, choose_strategy, expert_range, fused_moe_ep, shard_weights)
from moe_common.testing import assert_close  # noqa: E402

WORLD = 4
SPAWN_TIMEOUT_S = 300  # the ranks' own collectives time out at the same deadline
CASES = {c["name"]: c for c in ep_worker.CASES}
FUNCTIONAL = [n for n, c in CASES.items() if c.get("api") != "fixed"]
FIXED = [n for n, c in CASES.items() if c.get("api") == "fixed"]


@pytest.fixture(scope="module")
def ep_run(tmp_path_factory):
    outdir = tmp_path_factory.mktemp("ep")
    spawn(ep_worker.worker, WORLD, (str(outdir),), timeout_s=SPAWN_TIMEOUT_S)
    results = {r: torch.load(outdir / f"rank{r}.pt", weights_only=False) for r in range(WORLD)}
    return results, outdir


@contextlib.contextmanager
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _groups(case: dict) -> list:
    """(pair index, global ranks) of the groups the case ran on."""
    return [(0, list(range(WORLD)))] if case["group"] == "world" else list(enumerate(ep_worker.PAIRS))


def _expected(case: dict, pair: int, step: int = 0):
    """(single-process output, partitioned output, per-rank inputs) on the group's tokens."""
    p, full, inputs = ep_worker.case_inputs(case, pair, step)
    world = len(inputs)
    x, tw, ids = (torch.cat([i[n] for i in inputs]) for n in range(3))
    if x.shape[0] == 0:
        empty = torch.empty((0, p.hidden), dtype=torch.bfloat16)
        return empty, empty, inputs
    with _one_thread():
        single = fused_moe(x, full, tw, ids, activation=p.activation)
        parts = [fused_moe(x, shard_weights(full, d, world), tw, ids, activation=p.activation) for d in range(world)]
    acc = parts[0].float()
    for part in parts[1:]:
        acc += part.float()
    return single, acc.to(torch.bfloat16), inputs


def _rows(case: dict, inputs: list) -> list:
    """rows[s][d]: tokens of group rank s with a route to an expert of rank d."""
    p = ep_worker.preset(case["layer"])
    w = len(inputs)
    rows = []
    for _, _, ids in inputs:
        hit = [((ids >= lo) & (ids < hi)).any(dim=1).sum().item()
               for lo, hi in (expert_range(p.experts, w, d) for d in range(w))]
        rows.append(hit)
    return rows


def _check_rank(got: torch.Tensor, single: torch.Tensor, partitioned: torch.Tensor, bitwise_single: bool, what: str):
    assert got.dtype == torch.bfloat16 and got.shape == partitioned.shape, (what, got.shape, partitioned.shape)
    assert torch.equal(got, partitioned), f"{what}: differs from the single-process partitioned layer"
    if got.shape[0]:
        assert_close(got, single, what)
    if bitwise_single:
        assert torch.equal(got, single), f"{what}: routes on one rank but not bitwise equal to one process"


@pytest.mark.parametrize("name", FUNCTIONAL)
def test_fused_moe_ep_equals_single_process(ep_run, name):
    results, _ = ep_run
    case = CASES[name]
    for pair, ranks in _groups(case):
        single, partitioned, inputs = _expected(case, pair)
        starts = [0]
        for x, _, _ in inputs:
            starts.append(starts[-1] + x.shape[0])
        rows = _rows(case, inputs)
        want = choose_strategy([x.shape[0] for x, _, _ in inputs], rows, single.shape[1],
                               ep_worker.preset(case["layer"]).top_k)[0]
        for grank, rank in enumerate(ranks):
            got = results[rank][name]
            sl = slice(starts[grank], starts[grank + 1])
            for s in case["strategies"]:
                what = f"{name} group {ranks} rank {rank} strategy {s}"
                _check_rank(got[str(s)], single[sl], partitioned[sl], case["routing"] == "one_rank", what)
                tm = got[f"{s}-timings"]
                assert set(PHASES) <= set(tm) and all(tm[ph] >= 0 for ph in PHASES), tm
                assert tm["strategy"] == (s or want), (what, tm["strategy"], want)
                if case.get("out"):
                    assert got[f"{s}-out-is-given"], what
            assert got["explain"]["rows"] == rows and got["explain"]["strategy"] == want, got["explain"]


def test_chosen_strategy_follows_the_traffic(ep_run):
    """80 tokens per rank over 4 ranks, k = 3: a token reaches ~2.3 of 4 ranks, so all_to_all
    moves ~0.6x allgather's bytes and is chosen; below ALLGATHER_MAX_TOKENS allgather is."""
    results, _ = ep_run
    assert results[0]["chosen-large"]["explain"]["strategy"] == "all_to_all"
    assert "all_to_all" in results[0]["chosen-large"]["explain"]["text"]
    assert max(CASES["uneven"]["tokens"]) <= ALLGATHER_MAX_TOKENS
    assert results[0]["uneven"]["explain"]["strategy"] == "allgather"


@pytest.mark.parametrize("name", FIXED)
def test_fused_moe_ep_fixed_equals_single_process(ep_run, name):
    results, _ = ep_run
    case = CASES[name]
    for pair, ranks in _groups(case):
        for step in range(len(case["tokens"])):
            single, partitioned, inputs = _expected(case, pair, step)
            start = 0
            for grank, rank in enumerate(ranks):
                t = inputs[grank][0].shape[0]
                got = results[rank][name][f"step{step}"]
                sl = slice(start, start + t)
                _check_rank(got, single[sl], partitioned[sl], False, f"{name} step {step} rank {rank}")
                start += t


def test_bad_inputs_raise_on_every_rank(ep_run):
    results, _ = ep_run
    bad = {r: results[r]["bad"] for r in range(WORLD)}
    for r in range(WORLD):
        assert "x: got dtype torch.float32" in bad[r]["dtype-on-rank-1"] if r == 1 else \
            "rank(s) [1] of the group rejected" in bad[r]["dtype-on-rank-1"], bad[r]
        assert "disagree on strategy" in bad[r]["strategy-disagrees"], bad[r]
        assert "strategy: got 'bogus'" in bad[r]["strategy-unknown"], bad[r]
        assert f"weights: rank {r} of 4 holds experts" in bad[r]["wrong-slice"], bad[r]
        assert "disagree on the layer" in bad[r]["activation-disagrees"], bad[r]
        assert "disagree on max_tokens_per_rank" in bad[r]["fixed-capacity-disagrees"], bad[r]
        assert "allowed: T <= max_tokens_per_rank = 2" in bad[r]["fixed-too-many-tokens"], bad[r]
        assert "not a member" in bad[r]["not-a-member"], bad[r]


def test_group_still_works_after_errors(ep_run):
    results, _ = ep_run
    for r in range(WORLD):
        for s in CASES["uneven"]["strategies"]:
            assert torch.equal(results[r]["after-errors"][str(s)], results[r]["uneven"][str(s)])


def test_bench_ep_writes_the_split(ep_run):
    _, outdir = ep_run
    with open(outdir / ep_worker.BENCH_JSON) as f:
        result = json.load(f)
    assert result["world_size"] == WORLD and result["backend"] == "gloo"
    rows = result["presets"][0]["rows"]
    assert [(r["T_per_rank"], r["strategy"]) for r in rows] == [
        (t, s) for t in (0, 2) for s in ("all_to_all", "allgather", "fixed")]
    for r in rows:
        assert all(len(r[ph + "_us"]) == WORLD and r["max_" + ph + "_us"] >= 0 for ph in PHASES), r
        if r["T_per_rank"]:
            assert r["check_ok"] and max(r["check_rel_l2"]) <= 1e-2, r


def check_device_run(outdir, device_type: str) -> None:
    """ep_worker.device_worker's outputs against the one-process layer on the same device."""
    results = [torch.load(os.path.join(outdir, f"{device_type}-rank{r}.pt"), weights_only=False) for r in range(2)]
    for case in ep_worker.DEVICE_CASES:
        steps = range(len(case["tokens"])) if case.get("api") == "fixed" else [0]
        for step in steps:
            p, full, inputs = ep_worker.on_device(case, 0, device_type, step)
            x, tw, ids = (torch.cat([i[n] for i in inputs]) for n in range(3))
            single = fused_moe(x, full, tw, ids, activation=p.activation).cpu()
            start = 0
            for rank in range(2):
                t = inputs[rank][0].shape[0]
                got = results[rank][case["name"]]
                outs = {f"step{step}": got[f"step{step}"]} if case.get("api") == "fixed" else got
                for key, out in outs.items():
                    assert out.shape == (t, p.hidden), (case["name"], key)
                    if t:
                        assert_close(out, single[start:start + t], f"{case['name']} rank {rank} {key}")
                start += t


@pytest.mark.gpu
def test_gloo_ranks_with_cuda_tensors_match_the_single_gpu_layer(tmp_path):
    """2 ranks, gloo staging CUDA tensors through host memory (both on one GPU if there is one):
    every installed kernel the dispatcher picks on a slice, against the single-GPU layer."""
    spawn(ep_worker.device_worker, 2, (str(tmp_path), "cuda"), timeout_s=600)  # kernels compile in each rank
    check_device_run(tmp_path, "cuda")


# ----------------------------------------------------------------------------------------------
# in this process
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("experts,world", [(8, 1), (8, 4), (10, 4), (7, 3), (256, 8), (5, 5)])
def test_expert_range_tiles_the_experts(experts, world):
    ranges = [expert_range(experts, world, r) for r in range(world)]
    assert ranges[0][0] == 0 and ranges[-1][1] == experts
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [b - a for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_expert_range_and_shard_weights_reject_bad_arguments(tiny):
    with pytest.raises(ValueError, match="E >= W"):
        expert_range(3, 4, 0)
    with pytest.raises(ValueError, match="allowed: 0..3"):
        expert_range(8, 4, 4)
    p, w, *_ = tiny(experts=6)
    s = shard_weights(w, 1, 4)
    assert (s.local_expert_offset, s.num_local_experts, s.num_experts) == (2, 2, 6)
    assert torch.equal(s.w13, w.w13[2:4]) and torch.equal(s.w2_scale, w.w2_scale[2:4])
    with pytest.raises(ValueError, match="allowed: the full layer"):
        shard_weights(s, 0, 2)
    with pytest.raises(ValueError, match="moe_common.MoEWeights"):
        shard_weights("weights", 0, 2)


def test_choose_strategy_rule():
    h, k = 7168, 8
    assert choose_strategy([5], [[5]], h, k)[0] == "allgather"
    small = ALLGATHER_MAX_TOKENS
    assert choose_strategy([small, small], [[small, small]] * 2, h, k)[0] == "allgather"
    t = 4 * ALLGATHER_MAX_TOKENS
    # two ranks, every token on both: the same bytes either way
    assert choose_strategy([t, t], [[t, t], [t, t]], h, k)[0] == "allgather"
    # eight ranks, each token on its own and the next: all_to_all moves t rows out and t in,
    # allgather 7 t each way
    rows = [[t if (d - s) % 8 in (0, 1) else 0 for d in range(8)] for s in range(8)]
    strategy, reason = choose_strategy([t] * 8, rows, h, k)
    assert strategy == "all_to_all" and "0.14x" in reason, reason


def test_fused_moe_ep_needs_an_initialized_group(tiny):
    assert not dist.is_initialized()
    p, w, x, tw, ids = tiny()
    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        fused_moe_ep(x, w, tw, ids)
    with pytest.raises(ValueError, match="torch.distributed is not initialized"):
        FusedMoEEP(w, 4, p.top_k)


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_one_rank_group_is_the_plain_layer(one_rank_group, tiny):
    p, w, x, tw, ids = tiny(tokens=7, experts=6, top_k=3, activation="relu2")
    want = fused_moe(x, w, tw, ids, activation="relu2")
    for s in ("all_to_all", "allgather", None):
        assert torch.equal(fused_moe_ep(x, w, tw, ids, strategy=s, activation="relu2"), want), s
    layer = FusedMoEEP(w, 9, p.top_k, activation="relu2").warmup()
    assert torch.equal(layer(x, tw, ids), want)
    assert layer(x[:0], tw[:0], ids[:0]).shape == (0, p.hidden)
    with pytest.raises(ValueError, match="topk_ids: got 2 rows; allowed: T = 0 rows"):
        fused_moe_ep(x[:0], w, tw[:2], ids[:2], activation="relu2")
    with pytest.raises(ValueError, match="top_k = 2; allowed: 3"):
        layer(x, tw[:, :2].contiguous(), ids[:, :2].contiguous())
    with pytest.raises(ValueError, match="x: got dtype"):
        layer(x.float(), tw, ids)


@pytest.mark.parametrize("argv,message", [
    (["--ep", "0"], "--ep: got 0"),
    (["--ep", "2", "--ep-strategies", "bogus"], "ep strategies: got ['bogus']"),
    (["--ep", "2", "--quant-mode", "w4a4"], "allowed with --ep: w4a16"),
])
def test_bench_ep_cli_rejects_bad_arguments(argv, message, capsys):
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err
