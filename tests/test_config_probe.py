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


def test_fields_parse_as_int_bool_or_str():
    assert config_probe.parse_fields("team_fc1=1,geometry=tall,x=-2,producer_bulk=True,b=False") == {
        "team_fc1": 1, "geometry": "tall", "x": -2, "producer_bulk": True, "b": False}


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


def test_generic_candidates_keep_the_default_where_their_rows_do_not_divide(monkeypatch):
    """A 256-row moe-generic tile offered for a GEMM of 384 rows: its own 128-row tile runs
    (the grid has rows // cta_rows CTAs; compile_cache.get refuses the rest)."""
    from moe_generic import compile_cache

    seen = []

    def bench(p, tokens, kernels, **kw):
        for rows in (512, 384):
            seen.append(compile_cache.config("fc2", "nvfp4", "none", 32, rows, 16).cta_rows)
        return []

    monkeypatch.setattr(config_probe, "bench_preset", bench)
    config_probe.variant_rows("moe-generic", None, [1], "warps=8,mw=2", seed=1)
    assert seen == [256, 128]


def test_generic_bulk_candidates_keep_the_default_where_k_has_a_tail(monkeypatch):
    """A bulk-copy producer offered for every 16-token tile: taken where the real K is whole
    K-tiles, refused for an FC1 whose K stops inside its last K-tile (bulk copies do not
    zero-fill), unless the config's producer zeroes the tail itself (GemmConfig.k_tail: the
    32-token tiles)."""
    from moe_generic import compile_cache

    seen = []

    def bench(p, tokens, kernels, **kw):
        for tail in (False, True):
            seen.append(compile_cache.config("fc1", "mxfp4", "swigluoai", 16, 5760, 23,
                                             tail).producer_bulk)
        seen.append(compile_cache.config("fc1", "mxfp4", "swigluoai", 16, 5760, 23,
                                         k_tail=True).producer_bulk)
        seen.append(compile_cache.config("fc1", "mxfp4", "swigluoai", 32, 5760, 23,
                                         k_tail=True).producer_bulk)
        return []

    monkeypatch.setattr(config_probe, "bench_preset", bench)
    config_probe.variant_rows("moe-generic", None, [1],
                              "producer_warps=1,stages=3,producer_bulk=True", seed=1)
    assert seen == [True, False, False, True]


def test_generic_cache_refuses_rows_its_grid_would_miss(monkeypatch):
    import dataclasses

    from moe_generic import compile_cache

    default = compile_cache.config
    monkeypatch.setattr(compile_cache, "config", lambda *a, **kw: dataclasses.replace(
        default(*a, **kw), warps=8, mw=2))
    with pytest.raises(ValueError, match="384 weight rows are not a multiple of the tile's 256"):
        compile_cache.get("fc2", "nvfp4", "none", 32, 384, 16)
