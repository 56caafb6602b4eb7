"""The README's single-package install works as written, with plain pip.

Steps:
1. Read the two shell blocks under the README's "Install one kernel package alone" heading:
   the install (build every member's wheel, export moe-static's locked requirements, make a
   fresh venv with `python3 -m venv`, install moe-common's and moe-static's wheels with that
   venv's pip) and the test run (export moe-static's test dependencies, install them with pip,
   run its CPU tests with the venv's Python from the package's directory).
2. Replace the scratch paths (/tmp/moe-wheels, /tmp/moe-static-env and the exported
   requirement files) with this test's temporary directory; nothing else of the text changes.
3. Run each install line with bash from the repository root.
4. In the fresh venv's Python, check: moe-common and moe-static import from that venv's
   site-packages (not the clone), moe-common was installed from its wheel (direct_url.json
   names the wheel file, no editable flag), pip (not uv) installed both, the entry points
   `reference` and `moe-static` of group `fused_moe.kernels` are visible, moe-static's plugin
   declines a CPU call with a reason, and neither the dispatcher nor another kernel package is
   installed.
5. Run each test-run line the same way; the last one's pytest must pass with no failure.
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
           "/tmp/moe-static-dev.txt": "dev.txt", "/tmp/moe-static-env": "env"}
# Seconds one README line may take: pip downloads torch and its CUDA libraries (about 3 GB) when
# its cache is cold.
LINE_TIMEOUT_S = 1800

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
    "installers": [(md.distribution(d).read_text("INSTALLER") or "").strip()
                   for d in ("moe-common", "moe-static")],
    "dists": sorted(d.metadata["Name"] for d in md.distributions()),
    "answer": getattr(answer, "reason", None),
}))
"""


def readme_blocks() -> list[list[str]]:
    """The lines of each ```sh block under HEADING in README.md (up to the next heading)."""
    text = (ROOT / "README.md").read_text()
    assert HEADING in text, f"README.md has no section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 2, f"expected two ```sh blocks (install, tests) under {HEADING!r}"
    return [[line for line in b.splitlines() if line.strip()] for b in blocks]


def run(args, **kw):
    r = subprocess.run(args, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{args}\n{r.stdout}\n{r.stderr}"
    return r


def run_lines(lines: list[str], tmp: Path) -> subprocess.CompletedProcess:
    """Each line with the scratch paths moved into tmp, by bash from the repository root, outside
    any active venv; returns the last line's result."""
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    r = None
    for line in lines:
        for scratch, name in SCRATCH.items():
            line = line.replace(scratch, str(tmp / name))
        assert "/tmp/" not in line.replace(str(tmp), ""), f"unexpected scratch path: {line}"
        r = run(["bash", "-c", line], cwd=ROOT, env=env, timeout=LINE_TIMEOUT_S)
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The README's install lines run into a temporary directory; returns that directory."""
    if shutil.which("uv") is None:
        pytest.skip("uv is not on PATH")
    tmp = tmp_path_factory.mktemp("standalone")
    run_lines(readme_blocks()[0], tmp)
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
    assert got["installers"] == ["pip", "pip"], got["installers"]
    assert not {"moe-dispatcher", "moe-generic", "moe-gated"} & set(got["dists"]), got["dists"]
    assert "needs a CUDA device" in got["answer"]


def test_kernel_cpu_tests_pass_against_the_installed_wheels(installed):
    r = run_lines(readme_blocks()[1], installed)
    assert re.search(r"\d+ passed", r.stdout) and " failed" not in r.stdout, r.stdout
