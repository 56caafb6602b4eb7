"""Environment knobs cannot change a result outside FUSED_MOE_DEV=1, and a malformed one never
disables a kernel (issue 31, item 10)."""
from __future__ import annotations

import importlib
import logging

import pytest

from moe_common import knobs


def _reload(module):
    return importlib.reload(importlib.import_module(module))


@pytest.fixture
def restore():
    yield
    for m in ("moe_gated.compile_cache", "moe_static.compile_cache", "moe_gated.runner",
              "moe_generic.compile_cache"):
        _reload(m)


def test_a_result_changing_knob_is_ignored_outside_dev_mode(monkeypatch, caplog, restore):
    monkeypatch.delenv(knobs.DEV_ENV, raising=False)
    monkeypatch.setenv("MOE_GATED_VARIANT", "nostore")
    monkeypatch.setenv("MOE_STATIC_SKIP", "tasks")
    monkeypatch.setenv("MOE_STATIC_VARIANT", "nomma")
    with caplog.at_level(logging.WARNING, logger="moe_common.knobs"):
        gated = _reload("moe_gated.compile_cache")
        static = _reload("moe_static.compile_cache")
    assert gated.config("fc1", "nvfp4", "silu").variant == "full"
    cfg = static.config("nvfp4", "silu")
    assert cfg.skip == frozenset() and cfg.variant == ""
    assert "MOE_GATED_VARIANT='nostore' ignored: it changes results" in caplog.text


def test_dev_mode_honours_it_and_says_so(monkeypatch, caplog, restore):
    monkeypatch.setenv(knobs.DEV_ENV, "1")
    monkeypatch.setenv("MOE_GATED_VARIANT", "nostore-fc2")
    with caplog.at_level(logging.WARNING, logger="moe_common.knobs"):
        gated = _reload("moe_gated.compile_cache")
    assert gated.config("fc2", "nvfp4", "none").variant == "nostore"
    assert gated.config("fc1", "nvfp4", "silu").variant == "full"
    assert "results are wrong by design" in caplog.text


@pytest.mark.parametrize("value", ["1;2", "3,1", "1", "a,b", "1,2,1"])
def test_a_malformed_knob_is_ignored_and_the_plugin_still_loads(monkeypatch, caplog, restore, value):
    monkeypatch.setenv("MOE_STATIC_TEAMS", value)
    with caplog.at_level(logging.WARNING, logger="moe_common.knobs"):
        static = _reload("moe_static.compile_cache")
    assert static.FORCED_TEAMS is None
    assert f"MOE_STATIC_TEAMS={value!r} ignored" in caplog.text and "allowed: two of 1, 2" in caplog.text
    from moe_common.testing import make_shape
    from moe_common.types import Activation
    from moe_static import plugin

    assert plugin.can_handle(make_shape(), Activation()).priority > 0  # still offers


def test_a_tuning_knob_is_honoured_with_a_warning(monkeypatch, caplog, restore):
    monkeypatch.delenv(knobs.DEV_ENV, raising=False)
    monkeypatch.setenv("MOE_STATIC_TEAMS", "1,2")
    monkeypatch.setenv("MOE_GATED_GEOMETRY", "tall")
    with caplog.at_level(logging.WARNING, logger="moe_common.knobs"):
        static = _reload("moe_static.compile_cache")
        runner = _reload("moe_gated.runner")
    assert static.FORCED_TEAMS == (1, 2)
    assert runner.geometry_for(10**6, 1) == "tall"
    assert "MOE_STATIC_TEAMS='1,2' in effect: tuning knob" in caplog.text


@pytest.mark.parametrize("module,var,bad", [("moe_generic.compile_cache", "MOE_GENERIC_WARPS64", "6"),
                                            ("moe_generic.compile_cache", "MOE_GENERIC_MMA", "wmma"),
                                            ("moe_gated.compile_cache", "MOE_GATED_PENDING", "x")])
def test_other_malformed_knobs_fall_back_to_the_default(monkeypatch, caplog, restore, module, var, bad):
    monkeypatch.setenv(var, bad)
    with caplog.at_level(logging.WARNING, logger="moe_common.knobs"):
        _reload(module)
    assert f"{var}={bad!r} ignored" in caplog.text
