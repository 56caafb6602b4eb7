"""tools/ncu_sass_top.py on a two-kernel source page (`ncu -c 2`: FC1 and FC2): one summary per
kernel, short rows between the tables read as empty (CPU; a hand-written CSV in ncu's layout)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "ncu_sass_top.py"
HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","stall_long_sb",'
          '"stall_wait","Instructions Executed"')
CSV = "\n".join([
    "==PROF== Connected to process 1",
    HEADER,
    '"0x7f0000000010","LDG.E R0, desc[UR4][R2.64]","1,200","1000","200","64"',
    '"0x7f0000000020","HMMA.16816.F32.BF16 R4, R8, R12, R4","300","0","300","128"',
    '"kernel_two"',
    HEADER,
    '"0x7f0000000010","STG.E desc[UR4][R2.64], R0","50","10","40"',
])


def test_each_kernel_summarized_and_short_rows_read_as_zero(tmp_path):
    path = tmp_path / "sass.csv"
    path.write_text(CSV)
    out = subprocess.run([sys.executable, str(TOOL), str(path), "--top", "2"], check=True,
                         capture_output=True, text=True).stdout
    first, second = out.split("== kernel 2 of 2")
    assert "== kernel 1 of 2" in first and "warp stall samples 1500" in first
    assert "stall_long_sb" in first and "66.7%" in first and "LDG.E" in first
    # the second table's row lacks its last cell: counted as 0, not an error
    assert "warp stall samples 50" in second and "STG.E" in second
    assert "Instructions Executed" in second and " 0\n" in second
