"""moe-generic on the H200: the docs/DESIGN.md section 5 bar over decode and prefill shapes, every
activation, format and mode, biases and expert parallelism; CUDA-graph replay; determinism."""
from __future__ import annotations

import itertools

import pytest
import torch

from moe_common.reference import reference_moe
from moe_common.testing import (
    assert_close, assert_graph_replay_matches_eager, check_case, check_one_workspace,
    check_out_of_range_ids, random_layer, random_routing,
)
from moe_common.types import ACTIVATIONS, QUANT_MODES, WEIGHT_FORMATS, Activation

pytestmark = pytest.mark.gpu


# (T, E, H, I, top_k): decode and prefill; H and I include 2880 and 704 (padded internally)
DECODE = [(1, 8, 256, 128, 2), (7, 128, 2048, 768, 8), (32, 256, 512, 704, 8), (64, 8, 2880, 256, 4)]
PREFILL = [(512, 128, 1024, 768, 8), (1024, 256, 512, 256, 8), (2048, 8, 2880, 2880, 4), (4096, 128, 768, 704, 6)]


def _cases():
    out = []
    combos = itertools.product(ACTIVATIONS, WEIGHT_FORMATS, QUANT_MODES)
    for n, (act, fmt, mode) in enumerate(combos):
        bias = n % 2 == 1
        for shapes in (DECODE, PREFILL):
            out.append((shapes[n % len(shapes)], act, fmt, mode, bias))
    return out


def _run_case(shape, act, fmt, mode, bias, **kw):
    from moe_generic import fused_moe

    return check_case(fused_moe, shape, act, fmt, mode=mode, bias=bias, **kw)


@pytest.mark.parametrize("shape,act,fmt,mode,bias", _cases())
def test_matches_reference(shape, act, fmt, mode, bias):
    _run_case(shape, act, fmt, mode, bias)


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
def test_expert_parallel_slice(fmt):
    # half of the routes go to experts another rank owns: they must contribute nothing
    _run_case((300, 16, 512, 256, 4), "silu", fmt, "w4a16", True, ep=True)
    _run_case((5, 16, 512, 256, 4), "swigluoai", fmt, "w4a16", False, ep=True)


def test_swiglu_without_limit():
    _run_case((64, 8, 256, 128, 2), "swigluoai", "mxfp4", "w4a16", True, limit=None)


def test_deterministic_bitwise():
    from moe_generic import fused_moe

    w = random_layer(64, 1024, 512)
    x = torch.randn(777, 1024, device="cuda").bfloat16()
    tw, ti = random_routing(777, 64, 8)
    first = fused_moe(x, w, tw, ti, deterministic=True)
    for _ in range(3):
        assert torch.equal(fused_moe(x, w, tw, ti, deterministic=True), first)


@pytest.mark.parametrize("mode", ["w4a16", "w4a4"])
@pytest.mark.parametrize("tokens", [128, 256])  # 16 and 32 routed rows per expert: 32, 48 wide
def test_deterministic_bitwise_and_tile_counts_reset(mode, tokens):
    # repeated calls through one workspace (w4a16: FC2 beside FC1, GemmConfig.overlap), each of
    # which must leave its per-tile counts at zero (the next call's FC2 would read tiles FC1 has
    # not finished); FC2 waits for FC1's tiles one by one, so a missed wait would show as a
    # result that differs. Skewed routing with dropped routes (-1) and bf16 router weights
    # (converted before FC1, so that no other kernel runs between FC1 and FC2).
    from moe_common.workspace import Workspace
    from moe_generic import fused_moe, runner

    E, k = 64, 8
    w = random_layer(E, 1024, 512, w4a4=mode == "w4a4")
    x = torch.randn(tokens, 1024, device="cuda").bfloat16()
    tw, ti = random_routing(tokens, E, k, skew=1.0)
    ti.view(-1)[::7] = -1
    tw = tw.bfloat16()
    assert runner.pick_bn(tokens * k, E) == (32 if tokens == 128 else 48)
    ws = Workspace()
    first = fused_moe(x, w, tw, ti, quant_mode=mode, workspace=ws)
    assert_close(first, reference_moe(x, w, tw, ti, quant_mode=mode), "determinism run")
    for _ in range(8):
        assert torch.equal(fused_moe(x, w, tw, ti, quant_mode=mode, workspace=ws), first)
    assert "moe-generic.tile_done" in ws._zeroed
    for name in ws._zeroed:
        counters = ws._buffers[name]
        assert counters.count_nonzero().item() == 0, (name, counters.tolist())


def test_one_workspace_across_layers_and_a_rank_with_no_route():
    from moe_generic import fused_moe

    # 32- and 48-token tiles (4, 50 and 1.25 mean routed rows per expert)
    check_one_workspace(fused_moe, [
        (16, 16, 1024, 256, 4), (200, 32, 512, 384, 8), (5, 8, 768, 512, 2)])


def test_cuda_graph_replay_matches_eager():
    from moe_generic import fused_moe

    assert_graph_replay_matches_eager(fused_moe, tokens=48)


def test_ids_out_of_range_are_ignored():
    from moe_generic import fused_moe

    check_out_of_range_ids(fused_moe, 16)


@pytest.mark.parametrize("bn", [8, 64])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_routing_kernel_tiles_cover_every_local_pair_once(bn, id_dtype):
    from moe_common.cute import jit
    from moe_common.cute.routing import MAX_SPLIT_CTAS
    from moe_generic.runner import max_tiles_bound

    T, k, E, off = 157, 4, 12, 3
    ids = torch.randint(-2, 20, (T, k), device="cuda").to(id_dtype)
    if id_dtype == torch.int64:  # ids outside int32 are dropped, not aliased to 3 and 0
        ids.view(-1)[::13] = 2**32 + 3 + off
        ids.view(-1)[5::13] = -2**63
    P = T * k
    mt = max_tiles_bound(P, E, bn)
    order = torch.full((P,), -1, dtype=torch.int32, device="cuda")
    slots = torch.empty(P, dtype=torch.int32, device="cuda")
    counts = torch.empty(E, dtype=torch.int32, device="cuda")
    tiles = torch.full((3, mt), -7, dtype=torch.int32, device="cuda")
    nt = torch.empty(1, dtype=torch.int32, device="cuda")
    hist = torch.empty(MAX_SPLIT_CTAS + 1, E, dtype=torch.int32, device="cuda")
    jit.route(ids, P, off, E, bn, order, slots, counts, tiles, nt, hist,
              jit.current_stream(ids.device))
    ids_c, order_c, tiles_c, n = ids.cpu().view(-1), order.cpu(), tiles.cpu(), int(nt.item())
    local = (ids_c - off >= 0) & (ids_c - off < E)
    assert torch.equal(counts.cpu(), torch.bincount((ids_c - off)[local].long(), minlength=E).int())
    assert n <= mt
    seen = torch.zeros(P, dtype=torch.int32)
    for t in range(n):
        e, s, end = (int(v) for v in tiles_c[:, t])
        assert 0 < end - s <= bn
        for p in range(s, end):
            pair = int(order_c[p])
            assert int(ids_c[pair]) - off == e
            seen[pair] += 1
    assert torch.equal(seen, local.to(torch.int32))


# (T, E, H, I, top_k), activation, format, mode, bias, skew: shapes whose GEMMs have 2 to 23
# K-tiles, on skewed routing (hot experts over several tiles, partly
# filled last tiles, experts without tokens) with dropped routes
SKEWED_CASES = [
    ((96, 32, 512, 256, 8), "silu", "nvfp4", "w4a16", False, 1.5),
    ((700, 64, 1024, 768, 6), "relu2", "nvfp4", "w4a4", True, 1.0),
    ((333, 16, 2880, 704, 4), "swigluoai", "mxfp4", "w4a16", True, 2.0),
    ((200, 24, 768, 512, 8), "gelu_tanh", "mxfp4", "w4a4", False, 0.5),
]


def _check_skewed(case, label):
    from moe_generic import fused_moe

    (T, E, H, I, k), act, fmt, mode, bias, skew = case
    w = random_layer(E, H, I, weight_format=fmt, gated=act != "relu2", bias=bias,
                     w4a4=mode == "w4a4")
    x = torch.randn(T, H, device="cuda").bfloat16()
    tw, ti = random_routing(T, E, k, skew=skew)
    ti[::7, 0] = -1  # dropped routes
    a = Activation(act, 1.702, 1.0, 7.0)
    out = torch.full((T, H), float("nan"), device="cuda", dtype=torch.bfloat16)
    fused_moe(x, w, tw, ti, activation=a, quant_mode=mode, out=out)
    ref = reference_moe(x, w, tw, ti, activation=a, quant_mode=mode)
    assert_close(out, ref, f"{label} {case}")


@pytest.mark.parametrize("bn", [8, 16, 32, 48, 64])
@pytest.mark.parametrize("case", SKEWED_CASES)
def test_every_tile_width_matches_reference(bn, case, monkeypatch):
    """Each tile width the width rule can pick, forced on shapes it would not pick it for (every
    mainloop body: skewed routing leaves tiles of every 8-token width class)."""
    from moe_generic import runner

    monkeypatch.setattr(runner, "pick_bn", lambda pairs, experts: bn)
    _check_skewed(case, f"bn={bn}")



@pytest.mark.parametrize("bn", [32, 48])
@pytest.mark.parametrize("act,fmt,mode,bias", [("silu", "nvfp4", "w4a16", True),
                                               ("relu2", "mxfp4", "w4a4", False)])
def test_bulk_widths_when_k_fits_the_ring(bn, act, fmt, mode, bias, monkeypatch):
    """The bulk producer where the K loop is as short as its ring (FC1 at H = 288: 3 K-tiles,
    the last with a tail; FC2 at I = 128: 1): at 32 tokens (3 stages) every K-tile goes out in
    the first stages (their weight copies, then their rows' copies after `order`; the tail
    zeroed there) and none is left for the loop after them (_produce_bulk); at 48 (2 stages)
    the tail K-tile is the loop's only one. FC2 reads its column table after one K-tile."""
    from moe_generic import runner

    monkeypatch.setattr(runner, "pick_bn", lambda pairs, experts: bn)
    _check_skewed(((64, 8, 288, 128, 4), act, fmt, mode, bias, 1.0), f"bn={bn}")


@pytest.mark.parametrize("bn,changes", [(32, {"producer_warps": 0, "stages": 4,
                                              "producer_bulk": False}),
                                        (32, {"producer_bulk": False}),
                                        (32, {"producer_bulk": True}),
                                        (32, {"width_step": 16}), (64, {"width_step": 16}),
                                        (8, {"producer_warps": 1}), (16, {"producer_warps": 1}),
                                        (32, {"stages": 4}), (64, {"producer_warps": 1}),
                                        (32, {"mw": 1, "warps": 8}),
                                        (64, {"producer_warps": 2}),
                                        (32, {"producer_warps": 3, "producer_bulk": False}),
                                        (32, {"warps": 8, "mw": 2}),
                                        (32, {"warps": 8, "mw": 2, "producer_warps": 2,
                                              "producer_bulk": False}),
                                        (16, {"mw": 2}), (8, {"mw": 2}),
                                        (8, {"producer_warps": 1, "stages": 3,
                                             "producer_bulk": True}),
                                        (16, {"producer_warps": 1, "stages": 3,
                                              "producer_bulk": True}),
                                        (64, {"producer_warps": 1, "producer_bulk": True}),
                                        (48, {"stages": 3}), (48, {"mw": 1, "warps": 8}),
                                        (48, {"min_ctas": 4}),
                                        (48, {"warps": 8, "mw": 2, "min_ctas": 2}),
                                        (48, {"warps": 8, "mw": 2, "min_ctas": 2,
                                              "stages": 3}),
                                        (32, {"warps": 2, "mw": 4})],
                         ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items())
                         if isinstance(v, dict) else str(v))
@pytest.mark.parametrize("case", SKEWED_CASES)
def test_config_candidates_match_reference(bn, changes, case, monkeypatch):
    """GemmConfig settings that measurements may switch to, forced: the 32-token tiles without
    their producer warp (every MMA warp copying, a CTA barrier per K-tile) or with a 4-deep
    ring; 16-token mainloop bodies; producer warps at the other widths, two or three of them,
    copying by cp.async or by bulk copies (the 32-token tiles' bulk producer also where K has a
    tail, zeroing it itself: case 2's H = 2880);
    twice the weight rows per CTA (each token row read from L2 once per 256 or 128 rows); the
    48-token tiles with 3 stages, as 8 warps x 1 group, compiled for 4 CTAs per SM
    (GemmConfig.min_ctas: 96 registers, spilling a few bytes in FC1), or as 256-row tiles of 8
    warps x 2 groups compiled for 2 CTAs per SM (96 registers); the 32-token tiles as 2 warps x
    4 groups (each B fragment feeds 4 MMAs, not 2). A switch then needs only
    its A/B. Where a candidate's rows per CTA do not divide the GEMM's
    rows, the default runs."""
    _force_candidate(monkeypatch, bn, changes)
    _check_skewed(case, f"bn={bn} {changes}")


# 150 routed rows per expert (64-token tiles); FC1 of 18 K-tiles and 1024 rows: the 256-row tiles
TALL_CASE = ((300, 16, 2304, 512, 8), "silu", "nvfp4", "w4a16", True, 1.5)


@pytest.mark.parametrize("changes", [{"producer_warps": 1, "producer_bulk": True}],
                         ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()))
def test_tall_tile_candidates_match_reference(changes, monkeypatch):
    """The 64-token candidates on the 256-row tiles of a long K loop (16 MMA warps), which
    SKEWED_CASES' short K loops never pick."""
    from moe_generic import compile_cache

    (T, E, H, I, k) = TALL_CASE[0]
    assert compile_cache.config("fc1", "nvfp4", "silu", 64, 2 * I, H // 128).warps == 16
    _force_candidate(monkeypatch, 64, changes)
    _check_skewed(TALL_CASE, f"tall {changes}")


def _force_candidate(monkeypatch, bn, changes):
    """runner.pick_bn forced to `bn`, and compile_cache.config replacing `changes` in its
    configs where the result fits the GEMM (compile_cache.unfit_reason), else the default."""
    import dataclasses

    from moe_generic import compile_cache, runner

    default_config = compile_cache.config
    monkeypatch.setattr(runner, "pick_bn", lambda pairs, experts: bn)

    def config(phase, weight_format, activation, width, rows=0, k_tiles=0, k_tail=False,
               overlap=False):
        cfg = default_config(phase, weight_format, activation, width, rows, k_tiles, k_tail,
                             overlap)
        candidate = dataclasses.replace(cfg, **changes)
        return cfg if compile_cache.unfit_reason(candidate, rows, k_tail) else candidate

    monkeypatch.setattr(compile_cache, "config", config)
