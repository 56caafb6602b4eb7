"""What a long-running serving process relies on (issue 31): FusedMoE validates an empty batch
(item 6), the selection cache is bounded and FusedMoE's planning leaves it alone (item 8),
weights the kernels cannot hold are declined (item 4)."""
from __future__ import annotations

import pytest
import torch

import dispatcher
from dispatcher import FusedMoE, fused_moe
from dispatcher import explain, manager as manager_mod
from moe_common.reference import reference_moe
from moe_common.validation import describe
from moe_common.weights import MoEWeights


@pytest.mark.parametrize("bad,match", [
    (lambda x, tw, ids: (x.float(), tw, ids), "x: got dtype torch.float32"),
    (lambda x, tw, ids: (x[:, :32].contiguous(), tw, ids), "x: got hidden size 32"),
    (lambda x, tw, ids: (x, tw, ids.float()), "topk_ids: got dtype torch.float32"),
    (lambda x, tw, ids: (x, tw.to(torch.float16), ids), "topk_weights: got dtype"),
])
def test_fused_moe_layer_validates_an_empty_batch(clean_env, tiny, bad, match):
    p, w, x, tw, ids = tiny()
    layer = FusedMoE(w, max_tokens=8, top_k=p.top_k)
    args = bad(x[:0], tw[:0], ids[:0])
    with pytest.raises(ValueError, match=match):
        layer(*args)
    with pytest.raises(ValueError, match=match):  # fused_moe says the same about T = 1
        xb, twb, idb = bad(x[:1], tw[:1], ids[:1])
        fused_moe(xb, w, twb, idb)
    assert layer(x[:0], tw[:0], ids[:0]).shape == (0, p.hidden)


def test_selection_cache_is_bounded(clean_env, tiny, monkeypatch):
    monkeypatch.setattr(manager_mod, "MAX_CACHED_CHOICES", 8)
    p, w, x, tw, ids = tiny(tokens=20)
    m = dispatcher.get_manager()
    for t in range(1, 21):
        fused_moe(x[:t].contiguous(), w, tw[:t].contiguous(), ids[:t].contiguous())
    assert len(m._choices) == 8
    t = 20  # the newest entries are kept
    assert any(k[0].tokens == t for k in m._choices)


def test_fused_moe_layer_plan_leaves_the_manager_cache_alone(clean_env, tiny):
    p, w, x, tw, ids = tiny()
    m = dispatcher.get_manager()
    before = len(m._choices)
    FusedMoE(w, max_tokens=300, top_k=p.top_k).plan()
    assert len(m._choices) == before


def test_explain_shows_kernels_declining_unpackable_weights_and_the_reference_runs(clean_env):
    """Item 4: MXFP4 scales outside the packed layout's range: every kernel declines."""
    g = torch.Generator().manual_seed(0)
    w = MoEWeights.quantize(torch.randn(2, 128, 64, generator=g) * 1e-20,
                            torch.randn(2, 64, 64, generator=g) * 1e-20, weight_format="mxfp4")
    shape = describe(w, 4, 2, "w4a16", (9, 0), torch.bfloat16)
    ex = explain(shape)
    assert ex.choice.kernel == "reference"
    assert all("exact range" in a.reason for a in ex.declines)
    x = torch.randn(4, 64).bfloat16()
    tw, ids = torch.full((4, 2), 0.5), torch.tensor([[0, 1]] * 4, dtype=torch.int32)
    assert torch.equal(fused_moe(x, w, tw, ids), reference_moe(x, w, tw, ids))
