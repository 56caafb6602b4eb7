"""moe-generic's SASS on the CPU: the global round trips outside its K loop.

1. Prologue: a CTA loads the tile count and its tile's expert and rows together, before the
   branch on the count (grouped_gemm's relaxed loads: plain ones ptxas sinks past the branch,
   a second round trip before the first copy). Checked in every width's FC1 and FC2.
2. FC2's epilogue with the producer warp (the 32- and 48-token tiles): the pair indices and
   router weights come from the shared table the producer filled (_stage_columns: one 8-byte
   shared load per column), the global scale and the biases from the stage the producer stored
   them in after its K loop (_stage_operands: one 4-byte shared load each); no global load is
   left after the last K-tile. The producer loads the scale and biases before its K loop (one
   16-byte load per lane).
"""
from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))
sass_loops = importlib.import_module("sass_loops")

_PROBE = """
import sys
from moe_generic.compile_cache import compile_config, config
compile_config(config(sys.argv[1], "nvfp4", sys.argv[2], int(sys.argv[3])))
"""


def _sass(phase, act, bn, tmp_path) -> list:
    report, instrs = sass_loops.probe_sass(_PROBE, [phase, act, bn], "*GroupedGemm*.ptx",
                                           tmp_path)
    assert "0 bytes spill stores" in report, report
    return instrs


@pytest.mark.parametrize("phase,act,bn", [("fc1", "silu", 32), ("fc2", "none", 32),
                                          ("fc2", "none", 48), ("fc1", "silu", 64),
                                          ("fc2", "none", 64)])
def test_tile_fields_load_with_the_tile_count(phase, act, bn, tmp_path):
    instrs = _sass(phase, act, bn, tmp_path)
    first_exit = next(n for n, i in enumerate(instrs) if sass_loops.opcode(i) == "EXIT")
    loads = [i for i in instrs[:first_exit] if sass_loops.opcode(i) == "LDG"]
    assert len(loads) == 4, loads
    assert sum(".STRONG.GPU" in i for i in loads) == 3, loads


@pytest.mark.parametrize("bn,bodies", [(32, 4), (48, 6)])
def test_fc2_epilogue_reads_its_columns_and_operands_from_shared_memory(bn, bodies, tmp_path):
    from moe_generic.compile_cache import config
    from moe_generic.grouped_gemm import GroupedGemm

    cfg = config("fc2", "nvfp4", "none", bn)
    assert GroupedGemm(cfg).staged_columns and len(cfg.live_widths) == bodies
    instrs = _sass("fc2", "none", bn, tmp_path)
    ops = [sass_loops.opcode(i) for i in instrs]
    # each mainloop body releases its stages (an arrive on the empty barrier per K-tile),
    # then runs its epilogue: from the last release to the body's last store
    releases = [n for n, i in enumerate(instrs) if "SYNCS.ARRIVE.TRANS64.A1T0" in i]
    stores = [n for n, op in enumerate(ops) if op == "STG"]
    epilogues = []
    for n in releases:
        later = [s for s in stores if s > n]
        if later and not any(n < r < later[0] for r in releases):
            nxt = min([r for r in releases if r > n] + [len(ops)])
            epilogues.append((n, max(s for s in stores if s < nxt)))
    assert len(epilogues) == bodies, epilogues
    for lo, hi in epilogues:
        body = instrs[lo:hi]
        global_loads = [i for i in body if sass_loops.opcode(i) == "LDG"]
        assert not global_loads, global_loads  # the scale and biases too: _stage_operands
        shared = [i for i in body if sass_loops.opcode(i) == "LDS"]
        table_reads = [i for i in shared if ".64" in i]
        assert len(table_reads) == 2 * (bn // 8), table_reads  # a thread's columns
        operand_reads = [i for i in shared if not re.search(r"\bLDS\.", i)]  # 4 bytes
        assert len(operand_reads) == 1 + 2 * cfg.mw, operand_reads  # gscale, 2 biases per group
    # the producer, before its first copy: the biases (16 bytes per lane), the global scale
    first_copy = next(n for n, i in enumerate(instrs) if "UBLKCP" in i)
    early = [i for i in instrs[:first_copy] if ".CONSTANT" in i and sass_loops.opcode(i) == "LDG"]
    assert len(early) == 2 and sum(".128" in i for i in early) == 1, early
