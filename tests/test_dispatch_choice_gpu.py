"""The dispatcher's choice among the installed kernels on an sm_90 GPU (skipped elsewhere):
moe-gated for large gated batches, moe-static up to its cutover and only when forced past it.
These live beside the dispatcher's tests because the kernel packages do not depend on it."""
from __future__ import annotations

import pytest
import torch

import dispatcher
from moe_common.reference import reference_moe
from moe_common.testing import assert_close, random_layer, random_routing
from moe_static.limits import CUTOVER_TOKENS

pytestmark = pytest.mark.gpu


def test_dispatcher_picks_gated_for_large_gated_batches():
    w = random_layer(16, 512, 256)
    x = torch.randn(2048, 512, device="cuda").bfloat16()
    tw, ti = random_routing(2048, 16, 4)
    exp = dispatcher.explain(x, w, tw, ti, activation="silu")
    assert exp.choice is not None and exp.choice.kernel == "moe-gated"
    out = dispatcher.fused_moe(x, w, tw, ti, activation="silu")
    assert_close(out, reference_moe(x, w, tw, ti), "dispatcher auto")


def test_dispatcher_offers_static_and_runs_it_when_forced():
    w = random_layer(16, 256, 128)
    T = CUTOVER_TOKENS + 1
    x = torch.randn(T, 256, device="cuda").bfloat16()
    tw, ti = random_routing(T, 16, 2)
    ex = dispatcher.explain(x, w, tw, ti)
    assert "moe-static" in [a.kernel for a in ex.answers if hasattr(a, "priority")]
    assert ex.choice.kernel != "moe-static"  # past the cutover
    out = dispatcher.fused_moe(x, w, tw, ti, kernel="moe-static")
    assert_close(out, reference_moe(x, w, tw, ti), "forced moe-static")
    # up to the cutover moe-static bids highest and runs unforced
    for t in (1, CUTOVER_TOKENS):
        assert dispatcher.explain(x[:t], w, tw[:t], ti[:t]).choice.kernel == "moe-static"
        out_t = dispatcher.fused_moe(x[:t], w, tw[:t], ti[:t])
        assert_close(out_t, reference_moe(x[:t], w, tw[:t], ti[:t]), f"moe-static chosen at T={t}")
