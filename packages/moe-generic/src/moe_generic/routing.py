"""Device-side routing preparation for the grouped GEMMs (torch ops, no host sync).

Routed pairs (t, j) are flattened to pair = t * k + j and sorted by local expert (stable, so
the order is deterministic); pairs routed to experts outside the local range go to a trailing
bucket that no tile covers. Tiles are (expert, up to `bn` consecutive sorted pairs); their
count is only known on the device, so the kernel grid uses a host-side upper bound and CTAs
past the device count exit at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Routing:
    order: torch.Tensor  # int32 [P]: sorted position -> original pair index
    expert_of_sorted: torch.Tensor  # int64 [P]: local expert of each sorted pair (E_local = none)
    valid: torch.Tensor  # bool [P] in original pair order
    tile_expert: torch.Tensor  # int32 [max_tiles]
    tile_start: torch.Tensor  # int32 [max_tiles]
    tile_end: torch.Tensor  # int32 [max_tiles]
    num_tiles: torch.Tensor  # int32 [1]
    max_tiles: int


def max_tiles_bound(pairs: int, local_experts: int, bn: int) -> int:
    # sum over non-empty experts of ceil(c / bn) <= ceil(P / bn) + (#non-empty experts)
    return -(-pairs // bn) + min(pairs, local_experts)


def route(topk_ids: torch.Tensor, local_expert_offset: int, local_experts: int, bn: int) -> Routing:
    dev = topk_ids.device
    ids = topk_ids.reshape(-1).to(torch.int64) - local_expert_offset
    pairs = ids.numel()
    valid = (ids >= 0) & (ids < local_experts)
    key = torch.where(valid, ids, torch.full_like(ids, local_experts))
    sorted_key, order = torch.sort(key, stable=True)
    counts = torch.zeros(local_experts + 1, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:local_experts]
    starts = torch.cumsum(counts, 0) - counts
    tiles_per = (counts + bn - 1) // bn
    tile_cum = torch.cumsum(tiles_per, 0)
    max_tiles = max_tiles_bound(pairs, local_experts, bn)
    i = torch.arange(max_tiles, device=dev)
    te = torch.searchsorted(tile_cum, i, right=True).clamp_(max=local_experts - 1)
    first = tile_cum[te] - tiles_per[te]
    ts = starts[te] + (i - first) * bn
    tend = torch.minimum(ts + bn, starts[te] + counts[te])
    return Routing(
        order=order.to(torch.int32),
        expert_of_sorted=sorted_key,
        valid=valid,
        tile_expert=te.to(torch.int32),
        tile_start=ts.to(torch.int32),
        tile_end=tend.to(torch.int32),
        num_tiles=tile_cum[-1:].to(torch.int32),
        max_tiles=max_tiles,
    )
