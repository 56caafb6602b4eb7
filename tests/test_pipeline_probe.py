"""tools/pipeline_probe.py on the CPU: each mode's patched moe-gated kernel assembles for
sm_90a and has changed what the mode says (the copies or the decode and wgmmas taken away, the
weight copies made one per K-tile, a 16-token MMA width added, FC1's widths replaced, the
decode or the wgmmas alone taken away, the epilogues taken away, the token rows' copies taken
away or halved, the records at the checkpoint's size with the one-byte scales' conversion),
and the padding modes' routing and buffer fills."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))
pipeline_probe = importlib.import_module("pipeline_probe")

_PROBE = f"""
import sys
sys.path.insert(0, {str(TOOLS)!r})
import pipeline_probe
pipeline_probe.patch(sys.argv[1])
from moe_gated import compile_cache
compile_cache.compile_config(compile_cache.config("fc1", "nvfp4", "silu", "tall"))
"""


@pytest.mark.parametrize("mode,copies,wgmmas", [("full", True, True),
                                                 ("consumers", False, True),
                                                 ("producer", True, False),
                                                 ("onecopy", True, True),
                                                 ("width48", True, True),
                                                 ("width16", True, True),
                                                 ("fc1ladder-128-80-64-48-40-32", True, True),
                                                 ("nodecode", True, True),
                                                 ("nomma", True, False),
                                                 ("mmaonly", False, True),
                                                 ("noepilogue", True, True),
                                                 ("nob", True, True),
                                                 ("halfb", True, True),
                                                 ("bytescales", True, True)])
def test_each_mode_changes_what_it_says(mode, copies, wgmmas, tmp_path):
    from moe_common.testing import inline_asm_blocks, ptxas_report

    report = ptxas_report(_PROBE, [mode], "*GatedGemm*.ptx", tmp_path)
    assert "C7512" not in report, report
    ptx = next(tmp_path.rglob("*GatedGemm*.ptx")).read_text()
    assert ("cp.async.bulk" in ptx) == copies
    assert ("wgmma.mma_async" in ptx) == wgmmas
    assert "mbarrier.arrive.expect_tx" in ptx  # the producer still completes every stage
    # the weight groups' copies: a loop over the row tile's blocks of records holding one copy
    # (a block's), or (onecopy) none
    looped = [b for b in inline_asm_blocks(ptx)[0] if "cp.async.bulk" in b and "bra" in b]
    assert len(looped) == (0 if mode in ("onecopy", "consumers", "mmaonly") else 1), looped
    assert all(b.count("cp.async.bulk") == 1 for b in looped), looped
    # B's halves: copies of their own outside the weights' loop, none in nob, one in halfb
    b_copies = [b for b in inline_asm_blocks(ptx)[0] if "cp.async.bulk" in b and "bra" not in b]
    if mode in ("full", "nob", "halfb"):
        assert sum(b.count("cp.async.bulk") for b in b_copies) == {"full": 2, "nob": 0,
                                                                   "halfb": 1}[mode], b_copies
    assert ("m64n48k16" in ptx) == wgmmas  # FC1 ships the 48 width (kernel.FC1_ONLY_WIDTHS)
    assert ("m64n16k16" in ptx) == (mode == "width16")
    ladder = mode.startswith("fc1ladder")  # FC1's tall widths exactly the ladder's
    assert ("m64n40k16" in ptx) == ladder and ("m64n96k16" in ptx) == (wgmmas and not ladder)
    # the block-scale multiplies are the decode's last step; nomma folds the decoded registers
    assert ("mul.rn.bf16x2" in ptx) == (mode not in ("producer", "nodecode", "mmaonly"))
    assert ("xor.b32 nmx" in ptx) == (mode == "nomma")
    # bytescales: a block of 8 NVFP4 records at the checkpoint's size (8 x 1152 bytes, else
    # 8 x 1280), the scale fields masked in place (0x0FF00FF0)
    assert ("9216" in ptx) == (mode == "bytescales")
    assert (str(0x0FF00FF0) in ptx) == (mode == "bytescales")
    # FC1's epilogue: silu's hardware exp2 (moe_common.cute.activation)
    assert ("ex2.approx" in ptx) == (mode != "noepilogue")


def test_unknown_mode_is_a_value_error():
    with pytest.raises(ValueError, match="allowed: full, consumers, producer"):
        pipeline_probe.patch("both")


def test_summary_is_each_mode_over_the_shipped_kernel():
    rows = [{"shape": "qwen3-30b-a3b", "T": 512, "kernel": f"moe-gated {m}", "time_us": us}
            for m, us in (("full", 200.0), ("consumers", 150.0), ("producer", 190.0))]
    rows.append({"shape": "qwen3-30b-a3b", "T": 1024, "kernel": "moe-gated full",
                 "error": "RuntimeError: x"})
    assert pipeline_probe.summary(rows).splitlines() == [
        "preset T full_us consumers/full producer/full",
        "qwen3-30b-a3b 512 200.0 0.75 0.95"]


def test_clock_samples_are_read_under_load():
    """--clocks: nvidia-smi's lines parsed (partial and N/A lines skipped), the clock and power
    taken over the samples near the highest power (the bench's replays, not its setup)."""
    text = "1980, 80.5\n1980, 76.0\n[N/A], [N/A]\n1545, 694.0\n1530, 699.9\n1560, 690.1\n19"
    samples = pipeline_probe.parse_samples(text)
    assert samples == [(1980.0, 80.5), (1980.0, 76.0), (1545.0, 694.0), (1530.0, 699.9),
                       (1560.0, 690.1)]
    assert pipeline_probe.under_load(samples) == (1545.0, 694.0)
    assert pipeline_probe.under_load([]) is None


def test_summary_lists_the_clocks_when_sampled():
    rows = [{"shape": "deepseek-v3", "T": 1024, "kernel": f"moe-gated {m}", "time_us": us,
             "sm_mhz": mhz, "power_w": w}
            for m, us, mhz, w in (("full", 2710.3, 1538.0, 694.0),
                                  ("consumers", 2188.7, 1980.0, 640.0))]
    assert pipeline_probe.summary(rows).splitlines() == [
        "preset T full_us consumers/full",
        "deepseek-v3 1024 2710.3 0.81",
        "preset T mode us sm_mhz power_w",
        "deepseek-v3 1024 full 2710.3 1538 694",
        "deepseek-v3 1024 consumers 2188.7 1980 640"]


@pytest.mark.parametrize("mode", ["padzero", "padnoise"])
def test_padding_modes_route_alike_and_fill_the_token_blocks(mode, monkeypatch):
    """padzero / padnoise: the bench's input copies share one routing (their token rows differ)
    and moe-gated's tile-blocked B buffers are filled at each new shape, not at each call."""
    import torch

    from dispatcher import bench
    from dispatcher.presets import PRESETS
    from moe_common import workspace

    monkeypatch.setattr(bench, "random_inputs", bench.random_inputs)  # restored afterwards
    monkeypatch.setattr(workspace.Workspace, "get", workspace.Workspace.get)
    pipeline_probe.patch(mode)
    p = PRESETS["qwen3-30b-a3b"]
    (x0, w0, ids0), (x1, w1, ids1) = (bench.random_inputs(p, 4) for _ in range(2))
    assert torch.equal(ids0, ids1) and torch.equal(w0, w1) and not torch.equal(x0, x1)
    ws = workspace.Workspace()
    ws.get("x_blocked", (4, 8), torch.bfloat16, "cpu").fill_(3)
    assert bool((ws.get("x_blocked", (4, 8), torch.bfloat16, "cpu") == 3).all())  # same shape
    refilled = ws.get("x_blocked", (2, 8), torch.bfloat16, "cpu")  # a new T's shape
    assert not bool((refilled == 3).any())
    assert bool((refilled == 0).all()) == (mode == "padzero")


@pytest.mark.parametrize("args", [["--kernel", "generic", "--probe-mode", "width48"],
                                  ["--kernel", "gated", "--probe-mode", "nob"]])
def test_gpu_check_runs_only_checked_modes(args):
    """tools/gpu_check.py --probe-mode: moe-gated and a mode whose results are right (a check
    of a mode that computes wrong results by design would only report that)."""
    import subprocess

    res = subprocess.run([sys.executable, str(TOOLS / "gpu_check.py"), *args],
                         capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    assert "needs --kernel gated and a mode whose results are right" in res.stderr
