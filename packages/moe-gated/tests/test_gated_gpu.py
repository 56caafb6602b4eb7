"""moe-gated on the H200: the docs/DESIGN.md section 5 bar at prefill sizes (T = 256..16384)
for every activation (the gated ones and relu2), format, mode and bias; skewed routing with
empty experts; expert parallelism; out-of-range ids; CUDA-graph replay; determinism. The
dispatcher's choice of it is tested in tests/test_dispatch_choice_gpu.py (the kernel packages
do not depend on the dispatcher)."""
from __future__ import annotations

import itertools

import pytest
import torch

from moe_common.reference import reference_moe
from moe_common.testing import (
    assert_close, assert_graph_replay_matches_eager, check_case, check_one_workspace,
    check_out_of_range_ids, random_layer, random_routing,
)
from moe_common.types import ACTIVATIONS, QUANT_MODES, WEIGHT_FORMATS

pytestmark = pytest.mark.gpu


# (T, E, H, I, top_k): H and I include 2880 and 704 (padded internally; with the tall geometry
# 2880 also leaves the last 256-row tile half full, see test_each_tile_geometry). The first two
# shapes take the tall geometry (< 256 routed pairs per expert), the others the wide one.
SHAPES = [(256, 8, 1024, 768, 4), (512, 128, 2048, 768, 8), (1024, 16, 2880, 704, 4),
          (2048, 32, 512, 2880, 6), (4096, 64, 768, 256, 8), (16384, 8, 256, 384, 2)]


def _cases():
    out = []
    combos = itertools.product(ACTIVATIONS, WEIGHT_FORMATS, QUANT_MODES)
    for n, (act, fmt, mode) in enumerate(combos):
        out.append((SHAPES[n % len(SHAPES)], act, fmt, mode, n % 2 == 1))
    return out


def _run(shape, act, fmt, mode="w4a16", bias=False, **kw):
    from moe_gated import fused_moe

    return check_case(fused_moe, shape, act, fmt, mode=mode, bias=bias, **kw)


@pytest.mark.parametrize("shape,act,fmt,mode,bias", _cases())
def test_matches_reference(shape, act, fmt, mode, bias):
    _run(shape, act, fmt, mode, bias)


@pytest.mark.parametrize("geometry", ["wide", "tall"])
@pytest.mark.parametrize("fmt,mode", [("nvfp4", "w4a4"), ("mxfp4", "w4a16")])
def test_each_tile_geometry(geometry, fmt, mode, monkeypatch):
    # the runner picks the geometry from the pairs per expert; force each one, on experts with
    # several full tiles and on experts with one partly filled tile
    from moe_gated import runner

    monkeypatch.setattr(runner, "WIDE_MIN_PAIRS_PER_EXPERT", 0 if geometry == "wide" else 10**9)
    _run((777, 8, 2880, 704, 4), "silu", fmt, mode, bias=True)
    _run((300, 16, 512, 256, 4), "gelu_tanh", fmt, mode)
    # relu2: FC1's 1920 rows (I = 1856 padded) end in a half-filled 256-row tile
    _run((333, 8, 512, 1856, 6), "relu2", fmt, mode, bias=True)


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
def test_skewed_routing_and_empty_experts(fmt):
    # Zipf-like routing: a few experts get many full tiles, the tail gets none
    T, E, k = 4096, 64, 4
    _, ti = random_routing(T, E, k, skew=3.0)
    assert int((torch.bincount(ti.view(-1).long(), minlength=E) == 0).sum()) > 0
    _run((T, E, 512, 384, k), "silu", fmt, skew=3.0)
    _run((1000, 32, 1024, 256, 1), "swigluoai", fmt, bias=True, skew=4.0, id_dtype=torch.int64)


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
def test_expert_parallel_slice(fmt):
    _run((600, 16, 512, 256, 4), "silu", fmt, bias=True, ep=True)


def test_swiglu_without_limit():
    _run((512, 8, 256, 128, 2), "swigluoai", "mxfp4", bias=True, limit=None)


def test_ids_out_of_range_are_ignored():
    from moe_gated import fused_moe

    check_out_of_range_ids(fused_moe, 300)


@pytest.mark.parametrize("mode", ["w4a16", "w4a4"])
@pytest.mark.parametrize("tokens", [3000, 512])  # the wide geometry, the tall one
def test_deterministic_bitwise_and_queues_reset(mode, tokens):
    # repeated calls through one workspace, each of which must leave its work queues and (w4a16,
    # FC2 beside FC1) its per-tile counts at zero (the next call's tickets would start past the
    # first item, and its FC2 would read tiles FC1 has not finished); a call's FC2 waits for
    # FC1's tiles one by one, so a missed wait would show as a result that differs
    from moe_common.workspace import Workspace
    from moe_gated import fused_moe

    w = random_layer(64, 1024, 512, w4a4=mode == "w4a4")
    x = torch.randn(tokens, 1024, device="cuda").bfloat16()
    tw, ti = random_routing(tokens, 64, 8)
    ws = Workspace()
    first = fused_moe(x, w, tw, ti, quant_mode=mode, workspace=ws)
    assert_close(first, reference_moe(x, w, tw, ti, quant_mode=mode), "determinism run")
    for _ in range(8):
        assert torch.equal(fused_moe(x, w, tw, ti, quant_mode=mode, workspace=ws), first)
    assert ws._zeroed == {"moe-gated.queues", "moe-gated.tile_done"}
    for name in ws._zeroed:
        counters = ws._buffers[name]
        assert counters.count_nonzero().item() == 0, (name, counters.tolist())


def test_one_workspace_across_layers_and_a_rank_with_no_route():
    from moe_gated import fused_moe

    # 20000 routed pairs take the split routing path; both tile geometries
    check_one_workspace(fused_moe, [
        (300, 16, 1024, 256, 4), (2500, 32, 512, 384, 8), (700, 8, 768, 512, 2)])


def test_cuda_graph_replay_matches_eager():
    from moe_gated import fused_moe

    assert_graph_replay_matches_eager(fused_moe, tokens=512)


@pytest.mark.parametrize("tokens,top_k,experts,hidden,offset,bn", [
    (300, 4, 8, 2880, 0, 128),     # padded K (2880 -> 2944), one-CTA routing
    (4096, 8, 16, 1024, 16, 256),  # split routing, expert parallelism: half the pairs elsewhere
])
def test_row_scatter_places_each_routed_row(tokens, top_k, experts, hidden, offset, bn):
    """FC1's B: each routed pair's token row in its tile slot (128B-swizzled halves), zeros past
    the real K; pairs routed elsewhere are not written."""
    from moe_common.cute import jit
    from moe_common.kernel_package import Buffers, route_pairs
    from moe_gated import compile_cache
    from moe_gated.runner import swizzled_to_rows, tiles_capacity

    dev = torch.device("cuda")
    x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16)
    ids = torch.randint(0, experts + 2 * offset, (tokens, top_k), device=dev, dtype=torch.int32)
    P, kt = tokens * top_k, -(-hidden // 128)
    cap = tiles_capacity(P, experts, bn)
    stream = jit.current_stream(dev)
    routed = route_pairs(Buffers("t", None, dev), ids, offset, experts, bn, cap, stream)
    blocked = torch.full((cap, kt, bn * 128), float("nan"), device=dev, dtype=torch.bfloat16)
    compile_cache.row_scatter(bn)(x.data_ptr(), x.stride(0), hidden, tokens, top_k,
                                  routed.slots.data_ptr(), blocked.data_ptr(), kt, stream)
    torch.cuda.synchronize()
    rows = swizzled_to_rows(blocked, bn)
    slots = routed.slots.long()
    routed_pairs = torch.nonzero(slots >= 0).view(-1)
    local = ids.view(-1).long() - offset
    assert torch.equal(routed_pairs, torch.nonzero((local >= 0) & (local < experts)).view(-1))
    want = torch.zeros(routed_pairs.numel(), kt * 128, device=dev, dtype=torch.bfloat16)
    want[:, :hidden] = x[routed_pairs // top_k]
    assert torch.equal(rows[slots[routed_pairs]], want)
