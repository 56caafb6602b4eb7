"""tools/sass_loops.py on the CPU: the loop finder on a listing in cuobjdump's form, and the
tall FC1 of moe-gated as the tool reports it."""
from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))
sass_loops = importlib.import_module("sass_loops")

# a K-tile loop (0x0100-0x0150) holding a short mbarrier-poll loop, and the poll's retry placed
# after the kernel's code, branching back into the K-tile loop (not a loop of its own)
LISTING = """
        /*0100*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*0110*/              @!P0 BRA 0x0300 ;
        /*0120*/                   LOP3.LUT R4, R5, 0xf, RZ, 0xc0, !PT ;
        /*0130*/                   HGMMA.64x32x16.F32.BF16 R24, R4, gdesc[UR8], R24 ;
        /*0140*/                   ISETP.NE.AND P1, PT, R6, RZ, PT ;
        /*0150*/               @P1 BRA 0x0100 ;
        /*0160*/                   EXIT ;
        /*0300*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*0310*/              @!P0 BRA 0x0300 ;
        /*0320*/                   BRA 0x0120 ;
"""


def test_innermost_mma_loops_without_the_out_of_line_retries():
    loops = sass_loops.mma_loops(sass_loops.parse_sass(LISTING))
    assert [(s, e) for s, e, _ in loops] == [(0x100, 0x150)]
    assert sass_loops.summary(loops[0][2]).startswith("6 instructions, 1 MMA")
    assert sass_loops.opcode("@!P0 HGMMA.64x32x16.F32.BF16 R24") == "HGMMA"


def test_tall_fc1_has_one_mma_loop_per_width():
    from moe_common.testing import ptxas

    if ptxas() is None:
        pytest.skip("no ptxas")
    out = subprocess.run([sys.executable, str(TOOLS / "sass_loops.py"), "--package", "moe-gated",
                          "--match", "fc1', weight_format='nvfp4', activation='silu', "
                          "geometry='tall', overlap=True"], capture_output=True, text=True,
                         check=True).stdout
    loops = [ln for ln in out.splitlines() if ln.strip().startswith("loop ")]
    # one per MMA width of the tall geometry, 16 wgmmas per K-tile each (2 groups x 8 k16 slabs)
    from moe_gated.kernel import WIDTHS

    assert len(loops) == len(WIDTHS[128]) and all(", 16 MMA:" in ln for ln in loops), out
    assert "0 bytes spill stores" in out, out
