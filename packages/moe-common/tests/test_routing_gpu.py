"""The device routing tables on the H200, both paths (one CTA, and split over CTAs), against
torch: counts, the tile table and `order` as a per-expert permutation of the routed pairs."""
from __future__ import annotations

import pytest
import torch

from moe_common.cute import jit
from moe_common.cute import routing
from moe_common.cute.routing import MAX_SPLIT_CTAS, ONE_CTA_MAX_PAIRS, SPLIT_MIN_PAIRS, split_ctas

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tokens,top_k,experts,offset,bn,dtype", [
    (3, 2, 8, 0, 8, torch.int32),                       # decode, one CTA
    (1000, 8, 128, 0, 64, torch.int64),                 # one CTA (8000 pairs), int64 ids
    (ONE_CTA_MAX_PAIRS // 8, 8, 256, 0, 48, torch.int32),  # one CTA's largest batch (forced)
    (-(-SPLIT_MIN_PAIRS // 4), 4, 256, 0, 128, torch.int32),  # the split path's smallest
    (8192, 8, 128, 64, 128, torch.int64),               # split, expert-parallel slice
    (40000, 6, 1024, 0, 16, torch.int32),               # split, 32 CTAs, E = 1024
])
def test_routing_tables(tokens, top_k, experts, offset, bn, dtype, monkeypatch):
    dev = "cuda"
    total = experts + 2 * offset
    P = tokens * top_k
    if P == ONE_CTA_MAX_PAIRS:  # the one-CTA kernel wherever the split path starts
        monkeypatch.setattr(routing, "SPLIT_MIN_PAIRS", ONE_CTA_MAX_PAIRS + 1)
    ids = torch.randint(0, total, (tokens, top_k), device=dev, dtype=dtype)
    ids.view(-1)[::97] = -1  # out of any range: dropped
    order = torch.full((P,), -7, dtype=torch.int32, device=dev)
    counts = torch.empty(experts, dtype=torch.int32, device=dev)
    cap = -(-P // bn) + min(P, experts)
    tiles = torch.full((3, cap), -7, dtype=torch.int32, device=dev)
    num_tiles = torch.empty(1, dtype=torch.int32, device=dev)
    slots = torch.full((P,), -7, dtype=torch.int32, device=dev)
    hist = torch.empty(MAX_SPLIT_CTAS + 1, experts, dtype=torch.int32, device=dev)
    jit.route(ids, P, offset, experts, bn, order, slots, counts, tiles, num_tiles, hist,
              jit.current_stream(torch.device(dev)))
    torch.cuda.synchronize()
    assert (split_ctas(P) > 0) == (P >= routing.SPLIT_MIN_PAIRS)

    local = ids.view(-1).long() - offset
    valid = (local >= 0) & (local < experts)
    want = torch.bincount(local[valid], minlength=experts)
    assert torch.equal(counts.long(), want)
    n = int(valid.sum())
    got = order[:n].long()
    # every routed pair exactly once, grouped by expert in expert order
    assert torch.equal(torch.sort(got).values, torch.nonzero(valid).view(-1))
    assert torch.equal(local[got], torch.sort(local[valid]).values)
    # tiles: per expert, consecutive chunks of at most bn sorted positions
    starts = torch.cumsum(want, 0) - want
    exp_tiles = [(e, int(s) + j, min(int(s) + j + bn, int(s) + int(c)))
                 for e, (s, c) in enumerate(zip(starts.tolist(), want.tolist())) for j in range(0, c, bn)]
    assert int(num_tiles) == len(exp_tiles)
    got_tiles = list(zip(*[t.tolist() for t in tiles[:, :len(exp_tiles)]]))
    assert got_tiles == exp_tiles
    # slots: each routed pair's tile * bn + its place in the tile; -1 for the others
    want_slots = torch.full((P,), -1, dtype=torch.long, device=dev)
    for t, (_, s0, s1) in enumerate(exp_tiles):
        want_slots[got[s0:s1]] = torch.arange(t * bn, t * bn + s1 - s0, device=dev)
    assert torch.equal(slots.long(), want_slots)
