"""`fused-moe explain --device sm90` answers what would run on an H100/H200 from any machine:
with every kernel installed, moe-static at decode and moe-gated at prefill for DeepSeek-V3."""
from __future__ import annotations

from dispatcher import cli


def test_explain_sm90_picks_the_kernels(capsys):
    assert cli.main(["explain", "--device", "sm90", "--preset", "deepseek-v3", "--tokens", "1", "8192"]) == 0
    out = capsys.readouterr().out
    assert "sm_90 GPU (H100/H200; described, not present)" in out
    assert "choice: moe-static" in out and "choice: moe-gated" in out
