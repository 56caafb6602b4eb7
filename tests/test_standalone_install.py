"""moe-common installed alone, from its wheel, is discovered through its entry point.

Builds moe-common's wheel with hatchling (no network), installs it by unpacking it into a
temporary directory (a pure-Python wheel's install is its unpacked contents), and in a
subprocess whose sys.path has that directory first, the dispatcher's source and the
environment's site-packages (for torch and pluggy) but not the workspace's editable install
of moe-common, checks that importlib metadata sees the "reference" entry point of group
"fused_moe.kernels" from the wheel and that the dispatcher's manager loads it from there.
"""
from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = r"""
import json, sys
target, dispatcher_src, purelib = sys.argv[1:4]
sys.path[:0] = [target, dispatcher_src]
sys.path.append(purelib)
import importlib_metadata as md
eps = [ep for ep in md.entry_points(group="fused_moe.kernels") if ep.name == "reference"]
import moe_common
import dispatcher
m = dispatcher.reload()
ex = dispatcher.explain(__import__("moe_common").types.MoEShape(
    tokens=1, hidden=64, intermediate=64, num_experts=4, num_local_experts=4, local_expert_offset=0,
    top_k=2, weight_format="nvfp4", quant_mode="w4a16", has_bias=False, device_capability=None))
print(json.dumps({
    "eps": [[ep.value, str(ep.dist._path) if ep.dist is not None else None] for ep in eps],
    "moe_common_file": moe_common.__file__,
    "plugin_file": m.plugins["reference"].__file__ if "reference" in m.plugins else None,
    "choice": ex.choice.kernel if ex.choice else None,
    "failures": [str(f) for f in m.failures],
}))
"""


def build_wheel(pkg: Path, out: Path) -> Path:
    r = subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(out)], cwd=pkg,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_moe_common_wheel_alone_is_discovered(tmp_path):
    wheel = build_wheel(ROOT / "packages" / "moe-common", tmp_path / "dist")
    target = tmp_path / "target"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(target)
    eps_txt = next(target.glob("moe_common-*.dist-info")) / "entry_points.txt"
    assert "[fused_moe.kernels]" in eps_txt.read_text()
    r = subprocess.run(
        [sys.executable, "-S", "-c", PROBE, str(target), str(ROOT / "dispatcher" / "src"),
         sysconfig.get_paths()["purelib"]],
        capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["eps"] and got["eps"][0][0] == "moe_common.reference_plugin"
    assert got["eps"][0][1].startswith(str(target)), got
    assert got["moe_common_file"].startswith(str(target)), got
    assert got["plugin_file"].startswith(str(target)), got
    assert got["choice"] == "reference"
