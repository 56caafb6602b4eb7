"""The README's single-package install works as written.

Steps:
1. Read the shell block under the README's "Install one kernel package alone" heading.
2. Replace its three scratch paths (/tmp/moe-wheels, /tmp/moe-static-env and the exported
   requirements file) with this test's temporary directory; nothing else of the text changes.
3. Run each line with bash from the repository root: build every member's wheel, export the
   locked requirements of moe-static, make a fresh venv, install moe-common's and moe-static's
   wheels into it (uv resolves torch and the DSL from its cache or the index).
4. In the fresh venv's Python, check: moe-common and moe-static import from that venv's
   site-packages (not the clone), moe-common was installed from its wheel (direct_url.json
   names the wheel file, no editable flag), the entry points `reference` and `moe-static` of
   group `fused_moe.kernels` are visible, moe-static's plugin declines a CPU call with a reason,
   and neither the dispatcher nor another kernel package is installed.
5. Install moe-static's locked test dependencies into that venv and run its CPU tests there
   against the installed wheels (all but the compile-every-config test, which the workspace
   run covers), from the package's directory with the current directory off sys.path.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## Install one kernel package alone"
SCRATCH = {"/tmp/moe-wheels": "wheels", "/tmp/moe-static-locked.txt": "locked.txt",
           "/tmp/moe-static-env": "env"}

PROBE = r"""
import importlib.metadata as md, json, sys
import torch
import moe_common, moe_static
from moe_common.types import Activation, MoEShape
eps = {ep.name: ep.value for ep in md.entry_points(group="fused_moe.kernels")}
plugin = [ep for ep in md.entry_points(group="fused_moe.kernels") if ep.name == "moe-static"][0].load()
shape = MoEShape(tokens=1, hidden=64, intermediate=64, num_experts=4, num_local_experts=4,
                 local_expert_offset=0, top_k=2, weight_format="nvfp4", quant_mode="w4a16",
                 has_bias=False, device_capability=None, dtype=torch.bfloat16)
answer = plugin.can_handle(shape=shape, activation=Activation("silu"))
print(json.dumps({
    "eps": eps,
    "files": [moe_common.__file__, moe_static.__file__],
    "prefix": sys.prefix,
    "direct_url": json.loads(md.distribution("moe-common").read_text("direct_url.json")),
    "dists": sorted(d.metadata["Name"] for d in md.distributions()),
    "answer": getattr(answer, "reason", None),
}))
"""


def readme_commands() -> list[str]:
    """The lines of the first ```sh block after HEADING in README.md."""
    text = (ROOT / "README.md").read_text()
    assert HEADING in text, f"README.md has no section {HEADING!r}"
    block = re.search(r"```sh\n(.*?)```", text.split(HEADING, 1)[1], re.S)
    assert block, f"no ```sh block under {HEADING!r}"
    return [line for line in block.group(1).splitlines() if line.strip()]


def run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{args}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The README's lines run into a temporary directory; returns that directory."""
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH")
    tmp = tmp_path_factory.mktemp("standalone")
    for line in readme_commands():
        for scratch, name in SCRATCH.items():
            line = line.replace(scratch, str(tmp / name))
        assert "/tmp/" not in line.replace(str(tmp), ""), f"unexpected scratch path: {line}"
        run(["bash", "-c", line], cwd=ROOT, timeout=900)
    return tmp


def test_readme_single_package_install(installed):
    r = run([str(installed / "env" / "bin" / "python"), "-c", PROBE], timeout=600)
    got = json.loads(r.stdout.strip().splitlines()[-1])

    assert got["eps"] == {"reference": "moe_common.reference_plugin",
                          "moe-static": "moe_static.plugin"}, got["eps"]
    for f in got["files"]:
        assert f.startswith(got["prefix"]) and not f.startswith(str(ROOT)), got
    url = got["direct_url"]
    assert not url.get("dir_info", {}).get("editable"), url
    assert url["url"].startswith("file://") and url["url"].endswith(".whl"), url
    assert not {"moe-dispatcher", "moe-generic", "moe-gated"} & set(got["dists"]), got["dists"]
    assert "needs a CUDA device" in got["answer"]


def test_kernel_cpu_tests_pass_against_the_installed_wheels(installed):
    dev = installed / "dev.txt"
    run(["uv", "export", "--package", "moe-static", "--only-group", "dev", "--no-emit-workspace",
         "--no-hashes", "--output-file", str(dev)], cwd=ROOT, timeout=300)
    run(["uv", "pip", "install", "--python", str(installed / "env"), "-r", str(dev)], timeout=900)
    env = dict(os.environ, PYTHONSAFEPATH="1")
    env.pop("VIRTUAL_ENV", None)
    r = run([str(installed / "env" / "bin" / "python"), "-m", "pytest", "-q", "-p",
             "no:cacheprovider", "tests/test_static_cpu.py", "-k",
             "not every_dispatchable_config"], cwd=ROOT / "packages" / "moe-static", env=env,
            timeout=1200)
    assert " passed" in r.stdout and " failed" not in r.stdout, r.stdout
