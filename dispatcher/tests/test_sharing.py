"""One FusedMoE shared by threads (issue 31, item 2), int64 ids (item 7) and a call cut short
(item 11), on the CPU.

Threads: every thread gets its own output buffer and workspace, so a result is never
overwritten by another thread's call. int64 ids reach the kernels as int32 with every id
outside the local experts moved outside them again (never truncated into range). A runner
that raises between launches leaves the workspace's counters zeroed.
"""
from __future__ import annotations

import threading

import pytest
import torch

import dispatcher.api as api
from dispatcher import FusedMoE, fused_moe
from dispatcher.api import int32_ids
from moe_common.reference import reference_moe
from moe_common.testing import random_layer
from moe_common.types import Offer

INT64_MIN = -(2**63)


def test_two_threads_keep_their_own_results(clean_env, tiny):
    """Thread A calls, thread B calls, then A reads its result: A still sees its own."""
    p, w, x, tw, ids = tiny(tokens=8)
    layer = FusedMoE(w, max_tokens=8, top_k=p.top_k)
    xa, xb = x, (x * -2).contiguous()
    a_called, b_called = threading.Event(), threading.Event()
    got = {}

    def a():
        y = layer(xa, tw, ids)
        a_called.set()
        b_called.wait(10)
        got["a"] = y.clone()

    def b():
        a_called.wait(10)
        got["b"] = layer(xb, tw, ids).clone()
        b_called.set()

    threads = [threading.Thread(target=f) for f in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert torch.equal(got["a"], reference_moe(xa, w, tw, ids))
    assert torch.equal(got["b"], reference_moe(xb, w, tw, ids))


def test_many_threads_calling_freely_get_correct_results(clean_env, tiny):
    p, w, x, tw, ids = tiny(tokens=6)
    layer = FusedMoE(w, max_tokens=6, top_k=p.top_k)
    wrong, errors = [], []

    def worker(seed):
        g = torch.Generator().manual_seed(seed)
        try:
            for _ in range(40):
                t = int(torch.randint(1, 7, (1,), generator=g))
                xs = torch.randn(t, p.hidden, generator=g).bfloat16()
                y = layer(xs, tw[:t].contiguous(), ids[:t].contiguous()).clone()
                if not torch.equal(y, reference_moe(xs, w, tw[:t], ids[:t])):
                    wrong.append(seed)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not wrong


def test_each_thread_has_its_own_buffers(clean_env, tiny):
    p, w, x, tw, ids = tiny(tokens=4)
    layer = FusedMoE(w, max_tokens=4, top_k=p.top_k)
    mine = layer.out
    theirs = []
    th = threading.Thread(target=lambda: theirs.append((layer.out, layer.workspace)))
    th.start()
    th.join()
    assert theirs[0][0].data_ptr() != mine.data_ptr()
    assert theirs[0][1] is not layer.workspace


# -- int64 ids ---------------------------------------------------------------------------------

def _ep_layer():
    """Global experts 2..5 of 8 held here."""
    return random_layer(4, 64, 32, local_expert_offset=2, num_experts=8, device="cpu",
                        generator=torch.Generator().manual_seed(0))


def _wild_ids():
    e = 3  # a local expert: 2^32 + e must not run it
    return torch.tensor([[2**32 + e, 2], [INT64_MIN, 5], [-1, 4], [2**31 + 2, 3],
                         [7, -(2**32) + 3], [2, 3]], dtype=torch.int64)


def test_int32_ids_move_every_outside_id_outside():
    w = _ep_layer()
    ids = _wild_ids()
    got = int32_ids(ids, w)
    assert got.dtype == torch.int32
    inside = (ids >= 2) & (ids < 6)
    assert torch.equal(got[inside], ids[inside].int())
    assert bool(((got[~inside] < 2) | (got[~inside] >= 6)).all())
    same = torch.tensor([[1, 2]], dtype=torch.int32)
    assert int32_ids(same, w) is same


class _Spy:
    """A runner that records the ids it gets and runs the reference on them."""

    def __init__(self):
        self.ids = []

    def __call__(self, x, weights, tw, ids, *, activation, quant_mode, out, workspace, deterministic):
        self.ids.append(ids.clone())
        return out.copy_(reference_moe(x, weights, tw, ids, activation=activation))


def test_kernels_get_the_ids_each_entry_promises(clean_env, monkeypatch):
    """fused_moe hands int64 ids on as they are (the kernels saturate them to int32 as they read
    them: ptx.ld_nc_s64_as_s32); FusedMoE hands its frozen int32 buffer, every outside id kept
    outside, so its warm-up builds one variant per kernel."""
    w = _ep_layer()
    ids = _wild_ids()
    x = torch.randn(ids.shape[0], 64).bfloat16()
    tw = torch.rand(ids.shape)
    spy = _Spy()
    offer = Offer("spy", 99, run=spy)
    want = reference_moe(x, w, tw, ids)

    class Manager:
        def select(self, *a, **k):
            return offer

    monkeypatch.setattr(api, "get_manager", lambda: Manager())
    assert torch.equal(fused_moe(x, w, tw, ids), want)
    assert spy.ids[-1].dtype == torch.int64 and torch.equal(spy.ids[-1], ids)
    layer = FusedMoE(w, max_tokens=8, top_k=2).warmup()
    assert torch.equal(layer(x, tw, ids), want)  # after freeze: the ids buffer is preallocated
    got = spy.ids[-1]
    assert got.dtype == torch.int32
    assert torch.equal(got, int32_ids(ids, w))


# -- a call cut short --------------------------------------------------------------------------

def test_a_raising_runner_leaves_the_counters_zeroed(clean_env, tiny):
    p, w, x, tw, ids = tiny(tokens=4)
    layer = FusedMoE(w, max_tokens=4, top_k=p.top_k)

    def half_done(x, weights, tw, ids, *, workspace, **kw):
        workspace.get("k.counter", (2,), torch.int32, x.device, zeroed=True).fill_(7)
        raise RuntimeError("launch failed")

    layer._choices[4] = Offer("k", 1, run=half_done)
    with pytest.raises(RuntimeError, match="launch failed"):
        layer(x[:4], tw[:4], ids[:4])
    assert torch.equal(layer.workspace.get("k.counter", (2,), torch.int32, "cpu"),
                       torch.zeros(2, dtype=torch.int32))
