"""moe-gated's tall K loops on the CPU: a K-tile's stage and barrier parity are bit operations
(moe_common.cute.ring.StageRing, bit_ops), not the signed division whose fix-ups sat between a
K-tile's count and its barrier wait (FC1 NVFP4 306 -> 293 SASS per K-tile)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))
sass_loops = importlib.import_module("sass_loops")

_PROBE = """
import sys
from moe_gated.compile_cache import all_configs, compile_config
compile_config(all_configs()[int(sys.argv[1])])
"""


# tall: FC1 NVFP4 silu, FC2 MXFP4 (all_configs' order)
@pytest.mark.parametrize("index", [10, 19])
def test_tall_k_loops_find_their_stage_without_signed_division(index, tmp_path):
    from moe_gated.compile_cache import all_configs

    assert all_configs()[index].geometry == "tall"
    report, listing = sass_loops.probe_listing(_PROBE, [index], "*GatedGemm*.ptx", tmp_path)
    assert "0 bytes spill stores" in report, report
    loops = sass_loops.mma_loops(listing)
    assert len(loops) >= 5, loops  # one per MMA width
    for _, _, body in loops:
        assert any("SYNCS.PHASECHK" in i for i in body), body  # the stage's full-barrier wait
        # (x + (x >> 31)): the sign fix-up of a signed division by a power of two
        assert not [i for i in body if "LEA.HI" in i], body
