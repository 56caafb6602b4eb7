"""moe-static installed alone (with moe-common, without the dispatcher) from its wheel: its entry
point is registered, its plugin answers, and moe_static.fused_moe is callable directly."""
from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROBE = r"""
import json, sys
target, purelib = sys.argv[1:3]
sys.path[:0] = [target]
sys.path.append(purelib)
import importlib_metadata as md
import torch
eps = [ep for ep in md.entry_points(group="fused_moe.kernels") if ep.name == "moe-static"]
plugin = eps[0].load()
from moe_common.types import Activation, MoEShape
from moe_common.testing import random_layer, random_routing
import moe_static
shape = MoEShape(tokens=1, hidden=64, intermediate=64, num_experts=4, num_local_experts=4,
                 local_expert_offset=0, top_k=2, weight_format="nvfp4", quant_mode="w4a16",
                 has_bias=False, device_capability=None, dtype=torch.bfloat16)
answer = plugin.can_handle(shape=shape, activation=Activation("silu"))
w = random_layer(4, 64, 32, device="cpu")
tw, ti = random_routing(2, 4, 2, device="cpu")
try:
    moe_static.fused_moe(torch.randn(2, 64).bfloat16(), w, tw, ti)
    err = None
except ValueError as e:
    err = str(e)
print(json.dumps({"eps": [ep.value for ep in eps], "file": moe_static.__file__,
                  "answer": getattr(answer, "reason", None), "error": err,
                  "dispatcher_imported": "dispatcher" in sys.modules}))
"""


def _wheel(pkg: Path, out: Path) -> Path:
    r = subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)],
                       cwd=pkg, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return next(out.glob(pkg.name.replace("-", "_") + "-*.whl"))


def test_moe_static_wheel_alone_offers_and_runs_directly(tmp_path):
    target = tmp_path / "target"
    for name in ("moe-common", "moe-static"):
        with zipfile.ZipFile(_wheel(ROOT / "packages" / name, tmp_path / name)) as z:
            z.extractall(target)
    r = subprocess.run([sys.executable, "-S", "-c", PROBE, str(target), sysconfig.get_paths()["purelib"]],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["eps"] == ["moe_static.plugin"]
    assert got["file"].startswith(str(target)), got
    assert "needs a CUDA device" in got["answer"]
    assert got["error"].startswith("moe-static cannot run this call: needs a CUDA device")
    assert not got["dispatcher_imported"]
