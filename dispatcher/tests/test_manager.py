"""Plugin discovery, ranking, forcing and explain (CPU only)."""
from __future__ import annotations

import pytest
import torch

import dispatcher
from dispatcher.manager import KernelManager
from moe_common.types import Activation, Decline, MoEShape, Offer


def shape(tokens=4, cap=None, **kw):
    base = dict(tokens=tokens, hidden=64, intermediate=64, num_experts=4, num_local_experts=4,
                local_expert_offset=0, top_k=2, weight_format="nvfp4", quant_mode="w4a16", has_bias=False,
                device_capability=cap)
    base.update(kw)
    return MoEShape(**base)


SILU = Activation("silu")


def test_real_entry_points_are_discovered(clean_env):
    m = dispatcher.get_manager()
    assert "reference" in m.names  # moe-common's entry point; the kernels' are checked in tests/
    ep_names = {a.plugin for a in m.answers(shape(), SILU)}
    assert "reference" in ep_names


def test_reference_is_chosen_on_cpu_and_offers_at_priority_zero(clean_env):
    ex = dispatcher.explain(shape(), activation="silu")
    ref = ex.answer("reference")
    assert ref.offered and ref.priority == 0
    # On a CPU no real kernel offers, so the reference runs.
    assert ex.choice.kernel == "reference"
    text = str(ex)
    assert "reference" in text and "choice: reference" in text


def test_manager_is_cached_and_reload_replaces_it(clean_env):
    a = dispatcher.get_manager()
    assert dispatcher.get_manager() is a
    b = dispatcher.reload()
    assert b is not a and dispatcher.get_manager() is b


def test_high_priority_fake_is_chosen_and_runs(fake_plugins, tiny):
    m = fake_plugins("fake-high")
    import fused_moe_fake_high as fake  # loaded through its entry point
    assert "fake-high" in m.names
    p, w, x, tw, ids = tiny()
    fake.CALLS.clear()
    out = dispatcher.fused_moe(x, w, tw, ids, activation="silu")
    assert len(fake.CALLS) == 1
    from moe_common.reference import reference_moe

    assert torch.equal(out, reference_moe(x, w, tw, ids, activation="silu"))
    ex = dispatcher.explain(x, w, tw, ids)
    assert ex.choice.kernel == "fake-high"
    assert "* fake-high" in str(ex)


def test_ties_broken_by_name(fake_plugins):
    fake_plugins("fake-ties")
    ex = dispatcher.explain(shape())
    assert [o.kernel for o in ex.offers][:2] == ["tie-a", "tie-b"]
    assert ex.choice.kernel == "tie-a"
    assert "tie broken by name" in str(ex)


def test_ranking_is_independent_of_registration_order():
    def offer(name, prio):
        return Offer(name, prio, run=lambda *a, **k: None)

    class EP:
        def __init__(self, name, obj):
            self.name, self.value, self.obj, self.dist = name, f"test:{name}", obj, None

        def load(self):
            return self.obj

    import pluggy

    hookimpl = pluggy.HookimplMarker("fused_moe")

    def plugin(o):
        class P:
            @hookimpl
            def can_handle(self, shape, activation):
                return o
        return P()

    offers = [offer("b", 5), offer("a", 5), offer("z", 9), offer("c", 1)]
    eps = [EP(o.kernel, plugin(o)) for o in offers]
    for order in (eps, eps[::-1], eps[1:] + eps[:1]):
        m = KernelManager(entry_points=order)
        assert [o.kernel for o in m.explain(shape(), SILU, use_env=False).offers] == ["z", "a", "b", "c"]
        assert m.select(shape(), SILU, use_env=False).kernel == "z"


def test_forced_kernel_by_argument_and_env(fake_plugins, tiny, monkeypatch):
    fake_plugins("fake-high")
    p, w, x, tw, ids = tiny()
    assert dispatcher.explain(x, w, tw, ids, kernel="reference").choice.kernel == "reference"
    import fused_moe_fake_high as fake

    fake.CALLS.clear()
    dispatcher.fused_moe(x, w, tw, ids, kernel="reference")
    assert fake.CALLS == []
    monkeypatch.setenv("FUSED_MOE_KERNEL", "reference")
    ex = dispatcher.explain(x, w, tw, ids)
    assert ex.choice.kernel == "reference" and ex.forced == "reference"
    assert "FUSED_MOE_KERNEL" in ex.forced_from
    dispatcher.fused_moe(x, w, tw, ids)
    assert fake.CALLS == []
    # The argument wins over the environment.
    assert dispatcher.explain(x, w, tw, ids, kernel="fake-high").choice.kernel == "fake-high"


def test_forced_kernel_that_declines_raises_with_reason(fake_plugins, tiny, monkeypatch):
    fake_plugins("fake-picky")
    p, w, x, tw, ids = tiny(tokens=8)
    with pytest.raises(ValueError, match=r"kernel 'picky'.*declined: T=8 > 4"):
        dispatcher.fused_moe(x, w, tw, ids, kernel="picky")
    monkeypatch.setenv("FUSED_MOE_KERNEL", "picky")
    with pytest.raises(ValueError, match=r"FUSED_MOE_KERNEL.*declined: T=8 > 4"):
        dispatcher.fused_moe(x, w, tw, ids)
    ex = dispatcher.explain(x, w, tw, ids)  # explain reports instead of raising
    assert ex.choice is None and "declined" in ex.error
    assert "choice: none" in str(ex)


def test_forced_unknown_kernel_lists_loaded(clean_env, tiny):
    p, w, x, tw, ids = tiny()
    with pytest.raises(ValueError, match=r"no such kernel; loaded: .*reference"):
        dispatcher.fused_moe(x, w, tw, ids, kernel="does-not-exist")
    clean_env.setenv("FUSED_MOE_KERNEL", "does-not-exist")
    with pytest.raises(ValueError, match="no such kernel"):
        dispatcher.fused_moe(x, w, tw, ids)


def test_decline_reasons_in_explain(fake_plugins):
    fake_plugins("fake-picky")
    ex = dispatcher.explain(shape(tokens=2), activation="relu2")
    a = ex.answer("picky")
    assert a.status == "decline" and a.reason == "relu2 is not supported (test)"
    assert "picky" in str(ex) and "declines: relu2 is not supported (test)" in str(ex)
    ex = dispatcher.explain(shape(tokens=2), activation="silu")
    assert ex.choice.kernel == "picky"
    ex = dispatcher.explain(shape(tokens=64), activation="silu")
    assert ex.choice.kernel == "reference" and "T=64 > 4" in str(ex)


def test_real_kernels_decline_on_cpu_with_a_reason(clean_env):
    ex = dispatcher.explain(shape())
    for a in ex.answers:
        if a.kernel != "reference":
            assert not a.offered, f"{a.kernel} offered on a CPU"
            assert a.reason


def test_plugin_that_fails_to_import_is_reported_not_fatal(fake_plugins, tiny):
    m = fake_plugins("fake-broken", "fake-nohook")
    names = {f.name: f for f in m.failures}
    assert "fake-broken" in names and "ImportError" in names["fake-broken"].error
    assert "CuTe DSL is not installed" in names["fake-broken"].error
    assert names["fake-broken"].distribution == "fake-broken"
    assert "nohook" in names and "no can_handle hook" in names["nohook"].error
    p, w, x, tw, ids = tiny()
    ex = dispatcher.explain(x, w, tw, ids)
    assert ex.choice.kernel == "reference"
    text = str(ex)
    assert "fake-broken" in text and "failed to load: ImportError" in text
    dispatcher.fused_moe(x, w, tw, ids)  # still runs
    with pytest.raises(ValueError, match="'fake-broken'.*failed to load: ImportError"):
        dispatcher.fused_moe(x, w, tw, ids, kernel="fake-broken")


def test_plugin_that_raises_is_a_decline(fake_plugins, tiny):
    fake_plugins("fake-raiser")
    p, w, x, tw, ids = tiny()
    ex = dispatcher.explain(x, w, tw, ids)
    a = ex.answer("raiser")
    assert a.status == "error" and "RuntimeError: raiser: boom" in a.reason
    assert ex.choice.kernel == "reference"
    dispatcher.fused_moe(x, w, tw, ids)
    with pytest.raises(ValueError, match="raiser.*boom"):
        dispatcher.fused_moe(x, w, tw, ids, kernel="raiser")


def test_explain_accepts_shape_and_reports_everything(fake_plugins):
    fake_plugins("fake-high", "fake-picky", "fake-broken", "fake-raiser")
    ex = dispatcher.explain(shape(tokens=16))
    statuses = {a.kernel: a.status for a in ex.answers}
    assert statuses["fake-high"] == "offer" and statuses["picky"] == "decline"
    assert statuses["raiser"] == "error" and statuses["reference"] == "offer"
    assert [f.name for f in ex.failures] == ["fake-broken"]
    assert ex.choice.kernel == "fake-high"
    assert [o.kernel for o in ex.offers] == ["fake-high", "reference"]


def test_selection_is_cached_per_shape(fake_plugins):
    m = fake_plugins("fake-picky")
    a = m.select(shape(tokens=2), SILU)
    assert m.select(shape(tokens=2), SILU) is a
    assert m.select(shape(tokens=9), SILU).kernel == "reference"


def test_hook_may_return_a_list():
    import pluggy

    hookimpl = pluggy.HookimplMarker("fused_moe")

    class Two:
        @hookimpl
        def can_handle(self, shape, activation):
            return [Decline("k1", "nope"), Offer("k2", 3, run=lambda *a, **k: None)]

    class EP:
        name, value, dist = "two", "test:two", None

        def load(self):
            return Two()

    m = KernelManager(entry_points=[EP()])
    ex = m.explain(shape(), SILU, use_env=False)
    assert {a.kernel: a.status for a in ex.answers} == {"k1": "decline", "k2": "offer"}
    assert ex.choice.kernel == "k2"
    assert m.select(shape(), SILU, "two", use_env=False).kernel == "k2"  # forcing by plugin name
