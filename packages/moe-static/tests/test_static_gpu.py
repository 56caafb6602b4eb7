"""moe-static on the H200: the docs/DESIGN.md section 5 bar at decode sizes for every activation and
format, biases, expert parallelism, out-of-range ids, skewed routing (experts with more tokens
than one chunk), CUDA-graph replay and bitwise determinism."""
from __future__ import annotations

import itertools

import pytest
import torch

from moe_common.testing import (
    assert_graph_replay_matches_eager, check_case, check_one_workspace, check_out_of_range_ids,
    random_layer, random_routing,
)
from moe_common.types import ACTIVATIONS, WEIGHT_FORMATS

pytestmark = pytest.mark.gpu


# (T, E, H, I, top_k): decode sizes; H and I include 2880 and 704 (padded internally)
DECODE = [(1, 8, 256, 128, 2), (7, 128, 2048, 768, 8), (32, 256, 512, 704, 8), (64, 8, 2880, 256, 4),
          (128, 64, 1024, 512, 8)]


def _run(shape, act, fmt, bias, **kw):
    from moe_static import fused_moe

    return check_case(fused_moe, shape, act, fmt, bias=bias, **kw)


@pytest.mark.parametrize("act,fmt,bias",
                         list(itertools.product(ACTIVATIONS, WEIGHT_FORMATS, (False, True))))
def test_matches_reference(act, fmt, bias):
    for n, shape in enumerate(DECODE):
        if (n + ACTIVATIONS.index(act)) % 2 == 0 or shape[0] == 1:
            _run(shape, act, fmt, bias)


@pytest.mark.parametrize("fmt", WEIGHT_FORMATS)
def test_expert_parallel_slice(fmt):
    _run((40, 16, 512, 256, 4), "silu", fmt, True, ep=True)
    _run((3, 16, 512, 256, 4), "swigluoai", fmt, False, ep=True)


def test_skewed_routing_experts_with_many_chunks():
    # Zipf-like routing: the top experts get far more than one 16-token chunk; k = 1 lets one
    # expert take up to every token (P = 1024 = the cutover)
    _run((1024, 32, 512, 256, 1), "silu", "nvfp4", True, skew=3.0)
    _run((200, 64, 1024, 384, 8), "gelu_tanh", "mxfp4", False, skew=2.0, id_dtype=torch.int64)
    # FC2 by teams of one in K-tile shares that cut units in two (3072 units of 3 K-tiles on
    # 2112 warps: 5 K-tiles each on an H200), on experts of many chunks
    _run((256, 64, 768, 384, 8), "silu", "mxfp4", True, skew=2.0)


def test_fc1_units_cut_in_two():
    # FC1 by teams of one in even K-tile shares (about 3600 units of 23 K-tiles for 2112 warps
    # on an H200): the two pieces of a cut unit meet before the activation; H=2880 puts the
    # masked last K-tile into a piece
    _run((6, 64, 2880, 768, 8), "swigluoai", "mxfp4", True)
    _run((6, 64, 2880, 768, 8), "silu", "nvfp4", False)


@pytest.mark.parametrize("shape,act,teams", [
    ((1, 16, 1024, 1088, 8), "silu", (1, 2)),  # FC1 8 x 136 units, FC2 8 x 64 units
    ((2, 32, 2880, 256, 4), "relu2", (2, 1)),  # FC1 8 x 16 units, FC2 8 x 180 units
])
def test_mixed_team_shapes(shape, act, teams):
    # each GEMM picks its own team (runner.choose_teams): one warp per FC1 unit and two per
    # FC2 unit, and the other way round
    from moe_static.kernel import WARPS
    from moe_static.runner import choose_teams

    T, E, H, I, k = shape
    fc1_groups = (2 if act != "relu2" else 1) * (-(-I // 128) * 128) // 16  # padded as packed
    warps = torch.cuda.get_device_properties(0).multi_processor_count * WARPS
    if choose_teams(T, k, E, fc1_groups, H // 16, warps) != teams:
        pytest.skip(f"{warps} warps give another team shape for {shape}")
    for fmt in WEIGHT_FORMATS:
        _run(shape, act, fmt, True)


@pytest.fixture
def owned_rows(monkeypatch):
    """FC2 by owned rows (StaticConfig.cta_reduce) whatever the layer: the runner takes it only
    where H's groups spread evenly (H = 2048 above), but it must be right for any spread,
    CTAs that own no group or several included."""
    from moe_static import runner

    monkeypatch.setattr(runner, "owns_rows", lambda hidden, grid: True)


def test_fc2_by_owned_rows(owned_rows):
    from moe_static import fused_moe

    for n, act in enumerate(ACTIVATIONS):
        # H = 256: 16 groups, most CTAs own none; H = 2880: 180 groups, 1 or 2 per CTA
        _run((1, 8, 256, 128, 2), act, WEIGHT_FORMATS[n % 2], n % 2 == 0)
        _run((5, 32, 2880, 256, 4), act, WEIGHT_FORMATS[(n + 1) % 2], n % 2 == 1)
    _run((40, 16, 512, 256, 4), "silu", "mxfp4", True, ep=True)
    _run((200, 64, 1024, 384, 8), "gelu_tanh", "nvfp4", False, skew=2.0, id_dtype=torch.int64)
    # FC2 by teams of one whose CTA shares cut units (40 units of 4 K-tiles per CTA: 10 K-tiles
    # for each of its 16 warps), the pieces adding into zeroed y
    _run((100, 40, 768, 512, 8), "swigluoai", "mxfp4", True)
    check_out_of_range_ids(fused_moe, 16)
    _assert_bitwise_repeatable(100, 40, 768, 512)
    assert_graph_replay_matches_eager(fused_moe, tokens=24)


def test_one_token():
    # H = 2880 ends FC1 on a half K-tile (masked), I = 704 gives FC2 6 K-tiles
    for n, act in enumerate(ACTIVATIONS):
        _run((1, 64, 2880, 704, 8), act, WEIGHT_FORMATS[n % 2], n % 2 == 0)
    _run((1, 16, 2048, 768, 8), "silu", "nvfp4", True, ep=True)  # FC2 by owned rows
    _run((1, 16, 1024, 1088, 8), "gelu_tanh", "mxfp4", False)  # FC1 by teams of one


def test_one_token_routed_twice_to_an_expert():
    # a route repeated in topk_ids is two routed rows of one expert
    from moe_common.reference import reference_moe
    from moe_common.testing import assert_close
    from moe_static import fused_moe

    w = random_layer(16, 512, 256, bias=True)
    x = torch.randn(1, 512, device="cuda").bfloat16()
    ti = torch.tensor([[3, 3, 7, 3]], device="cuda", dtype=torch.int32)
    tw = torch.tensor([[0.4, 0.3, 0.2, 0.1]], device="cuda")
    out = torch.full((1, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    fused_moe(x, w, tw, ti, out=out)
    assert_close(out, reference_moe(x, w, tw, ti), "T=1, expert 3 routed three times")


def test_swiglu_without_limit():
    _run((16, 8, 256, 128, 2), "swigluoai", "mxfp4", True, limit=None)


def test_ids_out_of_range_are_ignored():
    from moe_static import fused_moe

    check_out_of_range_ids(fused_moe, 16)


def _assert_bitwise_repeatable(T, E, H, I):
    """Four calls on one random layer and routing (top_k 8) give the same bits."""
    from moe_static import fused_moe

    w = random_layer(E, H, I, bias=True)
    x = torch.randn(T, H, device="cuda").bfloat16()
    tw, ti = random_routing(T, E, 8)
    first = fused_moe(x, w, tw, ti)
    for _ in range(3):
        assert torch.equal(fused_moe(x, w, tw, ti), first)


def test_deterministic_bitwise():
    # on an H200: T=100 cuts FC2 units in two (their pieces add into y), T=7 FC1 units (their
    # pieces meet before the activation)
    for T, E, H, I in ((100, 64, 768, 512), (7, 128, 2048, 768)):
        _assert_bitwise_repeatable(T, E, H, I)


def test_one_workspace_across_layers_and_a_rank_with_no_route():
    from moe_static import fused_moe

    # P up to 800 routed pairs: FC2's even shares cut units (their pieces add into y)
    check_one_workspace(fused_moe, [
        (3, 16, 1024, 256, 4), (24, 32, 512, 384, 8), (100, 64, 768, 512, 8)])


def test_cuda_graph_replay_matches_eager():
    from moe_static import fused_moe

    assert_graph_replay_matches_eager(fused_moe, tokens=24)
