"""moe-static installed alone (with moe-common, without the dispatcher) from its wheel: its entry
point is registered, its plugin answers, and moe_static.fused_moe is callable directly."""
from __future__ import annotations

from pathlib import Path

from moe_common.testing import probe_wheel_alone

ROOT = Path(__file__).resolve().parents[3]


def test_moe_static_wheel_alone_offers_and_runs_directly(tmp_path):
    got = probe_wheel_alone(ROOT, tmp_path, "moe-static")
    assert got["eps"] == ["moe_static.plugin"]
    assert got["file"].startswith(got["target"]), got
    assert "needs a CUDA device" in got["answer"]
    assert got["error"].startswith("moe-static cannot run this call: needs a CUDA device")
    assert not got["dispatcher_imported"]
