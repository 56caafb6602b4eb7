"""tools/pipeline_probe.py on the CPU: each mode's patched moe-gated kernel assembles for
sm_90a and has taken away what the mode says (the copies, or the decode and wgmmas)."""
from __future__ import annotations

from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"

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
                                                 ("producer", True, False)])
def test_each_mode_takes_one_side_away(mode, copies, wgmmas, tmp_path):
    from moe_common.testing import ptxas_report

    report = ptxas_report(_PROBE, [mode], "*GatedGemm*.ptx", tmp_path)
    assert "error" not in report.lower(), report
    ptx = next(tmp_path.rglob("*GatedGemm*.ptx")).read_text()
    assert ("cp.async.bulk" in ptx) == copies
    assert ("wgmma.mma_async" in ptx) == wgmmas
    assert "mbarrier.arrive.expect_tx" in ptx  # the producer still completes every stage


def test_unknown_mode_is_a_value_error():
    import sys

    sys.path.insert(0, str(TOOLS))
    import pipeline_probe

    with pytest.raises(ValueError, match="allowed: full, consumers, producer"):
        pipeline_probe.patch("both")
