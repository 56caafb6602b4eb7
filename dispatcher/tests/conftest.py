"""Fixtures for the dispatcher's tests: tiny layers and fake plugin distributions; tests marked
`gpu` run only on an sm_90 (Hopper) CUDA GPU, also when pytest runs from dispatcher/."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

import dispatcher
from moe_common.testing import skip_gpu_test_without_hopper as pytest_runtest_setup  # noqa: F401

PLUGINS = Path(__file__).parent / "fixtures" / "plugins"

# distribution name -> (entry points {name: target}, modules to copy)
FAKE_DISTS = {
    "fake-high": ({"fake-high": "fused_moe_fake_high"}, ["fused_moe_fake_high"]),
    "fake-broken": ({"fake-broken": "fused_moe_fake_broken"}, ["fused_moe_fake_broken"]),
    "fake-ties": ({"tie-b": "fused_moe_fake_ties:tie_b", "tie-a": "fused_moe_fake_ties:tie_a"},
                  ["fused_moe_fake_ties"]),
    "fake-picky": ({"picky": "fused_moe_fake_picky"}, ["fused_moe_fake_picky"]),
    "fake-raiser": ({"raiser": "fused_moe_fake_raiser"}, ["fused_moe_fake_raiser"]),
    "fake-nohook": ({"nohook": "fused_moe_fake_nohook"}, ["fused_moe_fake_nohook"]),
}


def write_dist(site: Path, dist: str, entry_points: dict, modules: list) -> None:
    """Install a fake distribution into `site`: modules + a .dist-info with entry_points.txt."""
    info = site / f"{dist.replace('-', '_')}-0.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.0\n")
    eps = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text("[fused_moe.kernels]\n" + eps)
    for m in modules:
        shutil.copy(PLUGINS / f"{m}.py", site / f"{m}.py")


@pytest.fixture
def fake_plugins(tmp_path, monkeypatch):
    """install(*dist_names) -> the reloaded KernelManager with those fakes installed."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv(dispatcher.ENV_KERNEL, raising=False)
    installed = []

    def install(*names):
        for n in names:
            eps, mods = FAKE_DISTS[n]
            write_dist(site, n, eps, mods)
            installed.extend(mods)
        return dispatcher.reload()

    yield install
    for m in installed:
        sys.modules.pop(m, None)
    monkeypatch.undo()
    dispatcher.reload()


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(dispatcher.ENV_KERNEL, raising=False)
    dispatcher.reload()
    yield monkeypatch
    monkeypatch.undo()
    dispatcher.reload()


def tiny_layer(*, experts=4, hidden=64, intermediate=64, top_k=2, tokens=5, weight_format="nvfp4",
               activation="silu", bias=False, seed=0, device="cpu"):
    """A small random quantized layer and routing (CPU by default)."""
    from dispatcher.presets import Preset, random_inputs, random_weights

    p = Preset("tiny", experts, hidden, intermediate, top_k, weight_format, activation, bias)
    w = random_weights(p, device=device, seed=seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    x, tw, ids = random_inputs(p, tokens, device=device, gen=gen)
    return p, w, x, tw, ids


@pytest.fixture
def tiny():
    return tiny_layer
