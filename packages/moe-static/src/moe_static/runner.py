"""Host side of moe-static: one cooperative launch per layer call.

Weights are the shared fragment repack (moe_common.packed, cached per layer and shared with the
other kernels). Workspace: the bf16 intermediate [T * k, Ip], the fp32 routed FC2 outputs
[T * k, H], the grid barrier's counter (zeroed once; each barrier leaves its low 31 bits at 0, see
ptx.grid_barrier_arrive_wait) and, per warp of the grid, a meeting slot for an FC1 unit cut in
two (see StaticMoE._meet_leave).
Nothing syncs with the host.
"""
from __future__ import annotations

import math

import torch

from moe_common.cute import jit
from moe_common.fragments import TILE_K
from moe_common.kernel_package import call_facts, router_weights
from moe_common.types import Activation
from moe_common.weights import MoEWeights

from .compile_cache import get
from .kernel import MEET_BYTES, WARPS, StaticOperands
from .limits import KERNEL_NAME


# FC2 by owned rows where the busiest CTA's groups of H are at most this many percent above the
# mean (owns_rows). Measured on the H200 at bb43f59, moe-static forced, same seed: by the
# runner's choice against d3e246d (grid-wide FC2), Qwen3-30B-A3B T=1 15.0 -> 13.7 us,
# Qwen3.5-35B 13.1 -> 11.8, T=8 -1.1% / -2.4%, T=32 within 0.7% (H = 2048: 3%); forced on the
# uneven layers against their grid-wide FC2, T=1 / T=8: DeepSeek-V3 (18%) 63.3 / 406.1 -> 63.4 /
# 419.0, gpt-oss-120b (47%) 24.7 / 118.7 -> 24.4 / 128.1, nemotron-relu2 (57%) 18.9 / 79.0 ->
# 21.2 / 88.5 (benchmarks/2026-12-03-h200-bb43f59-owned-rows-*.json).
OWNED_ROWS_MAX_SPREAD = 5


def _grid(device) -> int:
    # One CTA of 16 warps per SM (its per-warp rings take ~200 KB of shared memory); a
    # cooperative launch needs every CTA resident.
    return jit.device_properties(device).multi_processor_count


def choose_teams(tokens: int, top_k: int, local_experts: int, fc1_groups: int, fc2_groups: int,
                 warps: int) -> tuple:
    """Warps per FC1 and per FC2 unit, each GEMM on its own: 1 where it has at least half a
    unit per warp, else 2. A unit is (active expert, 16-row group); a team of two warps splits
    a unit's K-tiles, which pays only while units are scarcer than warps. The active experts
    are bounded by min(T * k, local experts): the host does not see the routing.

    Measured on the H200 with every team shape forced (BENCHMARKS.md, 24a91be,
    one run, five presets at T = 1, 2, 4): this choice is the fastest or within 2.5% at every
    point. Units per warp where team 2 was faster: 0.24-0.48 (e.g. Qwen3-30B-A3B T=1, FC1 0.36
    and FC2 0.48: 18.4 us against 19.5 with FC2 teams of 1); where team 1 was: 0.66 and up
    (gpt-oss-120b T=1, FC1 0.68 and FC2 0.34: 31.2 us with (1, 2) against 33.3 with (2, 2);
    Qwen3.5-35B T=2, FC1 0.48 and FC2 0.97: 19.1 us with (2, 1) against 20.8 with (2, 2)).
    The earlier rule gave both GEMMs the team of the scarcer one."""
    active = min(tokens * top_k, local_experts)
    return tuple(1 if 2 * active * groups >= warps else 2 for groups in (fc1_groups, fc2_groups))


def owns_rows(hidden: int, grid: int) -> bool:
    """FC2 by owned rows (StaticConfig.cta_reduce) where H's 16-row groups spread over the CTAs
    with the busiest CTA at most OWNED_ROWS_MAX_SPREAD percent above the mean: each CTA then
    runs its own groups' FC2 units and reduces them, with no second grid barrier. H = 2048 on
    132 SMs: 128 groups, one per CTA (spread 3%); DeepSeek-V3's H = 7168: 3 or 4 per CTA (18%)."""
    groups = hidden // 16
    return -(-groups // grid) * grid * 100 <= groups * (100 + OWNED_ROWS_MAX_SPREAD)


def run(x, weights: MoEWeights, topk_weights, topk_ids, *, activation: Activation,
        quant_mode: str = "w4a16", out=None, workspace=None, deterministic: bool = True):
    """The layer call in one launch. Always deterministic: each output element is summed by one
    thread in a fixed order (`deterministic` is accepted for the common runner signature)."""
    if quant_mode != "w4a16":
        raise ValueError(f"{KERNEL_NAME}: quant_mode={quant_mode!r}; allowed: 'w4a16'")
    prep, T, k, P, E, off, bufs, stream, ids = call_facts(KERNEL_NAME, x, weights, topk_ids,
                                                          workspace)
    H = prep.hidden
    dev = x.device
    ip = prep.intermediate_padded
    inter = bufs.get("inter", (P * ip,), torch.bfloat16)
    y = bufs.get("y", (P * H,), torch.float32)
    barrier = bufs.get("barrier", (1,), torch.int32, zeroed=True)
    grid = _grid(dev)
    meet = bufs.get("meet", (grid * WARPS * MEET_BYTES // 4,), torch.int32)
    if out is None:
        out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.contiguous() if not x.is_contiguous() else x.clone()  # rows copied by 16-byte bulk copies
    route_w = router_weights(topk_weights)
    limit = activation.limit if activation.limit is not None else math.inf
    teams = choose_teams(T, k, E, prep.fc1_rows // 16, -(-H // 16), grid * WARPS)
    _, kernel = get(weights.weight_format, activation.name, ids.element_size(), teams,
                    owns_rows(H, grid))
    ops = jit.operands(
        StaticOperands,
        w13=prep.w13.data_ptr(),
        gscale13=prep.fc1_alpha[quant_mode].data_ptr(), b13=prep.w13_bias.data_ptr(),
        w2=prep.w2.data_ptr(),
        gscale2=prep.fc2_alpha[quant_mode].data_ptr(), b2=prep.w2_bias.data_ptr(),
        ids=ids.data_ptr(), route_w=route_w.data_ptr(), x=x.data_ptr(), x_stride=x.stride(0),
        tokens=T, top_k=k, expert_offset=off, experts=E, hidden=H,
        k_tiles1=prep.hidden_padded // TILE_K, groups1=prep.fc1_rows // 16,
        groups2=prep.fc2_rows // 16, k_tiles2=ip // TILE_K,
        inter=inter.data_ptr(), y=y.data_ptr(), out=out.data_ptr(), barrier=barrier.data_ptr(),
        meet=meet.data_ptr(), act_alpha=activation.alpha, act_beta=activation.beta,
        act_limit=limit)
    kernel(ops, grid, stream)
    return out
