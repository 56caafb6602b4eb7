"""tools/config_probe.py: the config fields given reach the kernel's compile_cache.config for the
probe's rows only, and its own choice is back afterwards, even when the bench fails (CPU; the
bench itself is replaced by a recorder)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
config_probe = importlib.import_module("config_probe")


def test_fields_parse_as_int_or_str():
    assert config_probe.parse_fields("team_fc1=1,geometry=tall,x=-2") == {
        "team_fc1": 1, "geometry": "tall", "x": -2}


@pytest.mark.parametrize("kernel, args, field, value", [
    ("moe-static", ("nvfp4", "silu"), "team_fc1", 1),
    ("moe-generic", ("fc1", "nvfp4", "silu", 32), "stages", 2),
])
def test_rows_see_the_replaced_config_and_the_default_returns(monkeypatch, kernel, args, field,
                                                               value):
    cache = importlib.import_module(kernel.replace("-", "_") + ".compile_cache")
    default = cache.config
    seen = []

    def bench(p, tokens, kernels, **kw):
        seen.append(getattr(cache.config(*args), field))
        return [{"kernel": kernels[0]}]

    monkeypatch.setattr(config_probe, "bench_preset", bench)
    monkeypatch.setattr(config_probe, "format_row", lambda r: r["kernel"])
    rows = config_probe.variant_rows(kernel, None, [1], f"{field}={value}", seed=1)
    assert seen == [value] and rows == [{"kernel": f"{kernel} {field}={value}"}]
    assert cache.config is default and getattr(cache.config(*args), field) != value

    def failing(*a, **kw):
        raise RuntimeError("bench failed")

    monkeypatch.setattr(config_probe, "bench_preset", failing)
    with pytest.raises(RuntimeError):
        config_probe.variant_rows(kernel, None, [1], f"{field}={value}", seed=1)
    assert cache.config is default
