"""The fused-moe command line on a CPU."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from dispatcher import cli
from dispatcher.presets import PRESETS, resolve

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")


def test_explain_preset_lists_reference_and_declines(clean_env, capsys):
    assert cli.main(["explain", "--preset", "qwen3-30b-a3b", "--tokens", "1", "128", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "qwen3-30b-a3b: E=128 H=2048 I=768 k=8 nvfp4 silu" in out
    assert out.count("choice: reference") == 2
    assert "T=1 " in out and "T=128 " in out
    assert "reference" in out and "offers, priority 0" in out


def test_explain_explicit_shape(clean_env, capsys):
    assert cli.main(["explain", "--experts", "8", "--hidden", "256", "--intermediate", "128", "--top-k", "2",
                     "--format", "mxfp4", "--activation", "swigluoai", "--bias", "--tokens", "3",
                     "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "custom: E=8 H=256 I=128 k=2 mxfp4 swigluoai +bias" in out
    assert "bias=yes" in out and "mxfp4" in out


def test_explain_forced_unknown_kernel(clean_env, capsys):
    assert cli.main(["explain", "--tokens", "1", "--device", "cpu", "--kernel", "nope"]) == 0
    assert "no such kernel" in capsys.readouterr().out


def test_explain_bad_shape_is_an_error(clean_env, capsys):
    assert cli.main(["explain", "--hidden", "100", "--device", "cpu"]) == 2
    assert "multiple of the nvfp4 block" in capsys.readouterr().err


@needs_no_gpu
def test_demo_on_cpu_runs_the_reference_and_says_so(clean_env, capsys):
    rc = cli.main(["demo", "--experts", "4", "--hidden", "128", "--intermediate", "64", "--top-k", "2",
                   "--tokens", "3", "--seed", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "running the torch reference on CPU" in out
    assert "ran reference on cpu" in out and "PASS" in out
    assert "checked against the bf16 grouped-GEMM path" in out  # not the reference against itself


@needs_no_gpu
def test_demo_check_is_independent_of_the_reference(clean_env, capsys, monkeypatch):
    """A reference that is wrong must fail the CPU demo (it is not compared with itself)."""
    import moe_common.reference_plugin as plugin

    real = plugin.reference_moe
    monkeypatch.setattr(plugin, "reference_moe", lambda *a, **kw: real(*a, **kw).mul_(1.1))  # into out
    rc = cli.main(["demo", "--experts", "4", "--hidden", "128", "--intermediate", "64", "--top-k", "2",
                   "--tokens", "3", "--seed", "1"])
    out = capsys.readouterr().out
    assert rc == 1 and "FAIL" in out, out


def test_demo_cpu_shrinks_the_preset(clean_env, capsys):
    rc = cli.main(["demo", "--cpu", "--preset", "gpt-oss-120b", "--hidden", "256", "--intermediate", "128",
                   "--cpu-experts", "4", "--tokens", "2", "--seed", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "4 experts instead of 128" in out and "mxfp4 swigluoai +bias" in out


@needs_no_gpu
def test_bench_without_gpu_says_so_and_exits_zero(tmp_path, capsys):
    path = tmp_path / "b.json"
    assert cli.main(["bench", "--preset", "qwen3-30b-a3b", "--tokens", "1", "--json", str(path),
                     "--plot", str(tmp_path / "b.png")]) == 0
    out = capsys.readouterr().out
    assert "no CUDA device" in out and "Nothing was benchmarked" in out
    data = json.loads(path.read_text())
    assert data["skipped"] == "no CUDA device" and data["rows"] == []
    assert not (tmp_path / "b.png").exists()
    assert "no plot written" in out


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("fused-moe: moe-dispatcher ") and "moe-common" in out and "torch" in out


def test_explain_for_an_sm90_gpu_from_any_machine(clean_env, capsys):
    """The description and every installed plugin's answer (the kernels' choices:
    tests/test_cli_sm90.py, where they are installed)."""
    assert cli.main(["explain", "--device", "sm90", "--preset", "deepseek-v3", "--tokens", "1", "8192"]) == 0
    out = capsys.readouterr().out
    assert "sm_90 GPU (H100/H200; described, not present)" in out
    assert out.count("choice: ") == 2 and "T=1 " in out and "T=8192 " in out


def test_list(clean_env, capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "reference" in out and "deepseek-v3" in out


def test_console_script_is_installed():
    r = subprocess.run([sys.executable, "-m", "dispatcher.cli", "explain", "--tokens", "1", "--device", "cpu"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "choice:" in r.stdout


def test_presets_match_the_design():
    want = {"qwen3-30b-a3b": (128, 2048, 768, 8, "nvfp4", "silu", False),
            "qwen3.5-35b": (256, 2048, 512, 8, "nvfp4", "silu", False),
            "deepseek-v3": (256, 7168, 2048, 8, "nvfp4", "silu", False),
            "gpt-oss-120b": (128, 2880, 2880, 4, "mxfp4", "swigluoai", True),
            "nemotron-relu2": (128, 2688, 1856, 6, "nvfp4", "relu2", False)}
    for name, v in want.items():
        p = PRESETS[name]
        assert (p.experts, p.hidden, p.intermediate, p.top_k, p.weight_format, p.activation, p.bias) == v
    q = PRESETS["qwen3-30b-a3b"]
    assert q.flops(1) == 6 * 8 * 2048 * 768
    # docs/DESIGN.md section 7: Qwen3-30B-A3B at T=1 hits 8 experts, about 21 MB of 4-bit weights.
    assert 20e6 < 8 * q.expert_bytes() < 22e6
    assert resolve("qwen3-30b-a3b", top_k=4).name == "qwen3-30b-a3b*"
    assert resolve("qwen3-30b-a3b", top_k=8).name == "qwen3-30b-a3b"
    with pytest.raises(ValueError):
        resolve("nope")
