"""The top-k reduce's SASS on the CPU (moe_common.cute.topk_reduce): a batch of routes is one
round trip for its ids and one for its y chunks. Every id (and router weight) load of a batch
comes before its first y load, and every y load before the first add, as the kernel's speed at
the band's token counts relies on (without LAUNCH_BOUNDS ptxas interleaved them route by route
to stay at 32 registers)."""
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
from moe_common.cute import jit
jit.topk_reduce(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1")
"""


@pytest.mark.parametrize("ids_bytes,paired,weighted", [(4, 32, True), (8, 16, False),
                                                       (4, 16, True)])
def test_a_batch_is_two_round_trips(ids_bytes, paired, weighted, tmp_path):
    from moe_common.cute.topk_reduce import ROUTE_BATCH

    report, instrs = sass_loops.probe_sass(_PROBE, [ids_bytes, paired, int(weighted)],
                                           "*TopkReduce*.ptx", tmp_path)
    assert "0 bytes spill stores" in report, report
    ops = [(sass_loops.opcode(i), i) for i in instrs]
    y_loads = [n for n, (op, i) in enumerate(ops) if op == "LDG" and ".128" in i]
    scalar_loads = [n for n, (op, i) in enumerate(ops) if op == "LDG" and ".128" not in i]
    adds = [n for n, (op, _) in enumerate(ops) if op in ("FADD", "FFMA")]
    assert len(y_loads) == ROUTE_BATCH, y_loads  # one batch's body, in the route loop
    ids_per_route = 2 if weighted else 1
    assert len(scalar_loads) == ids_per_route * ROUTE_BATCH, scalar_loads
    assert max(y_loads) < min(adds)
    # the ids: all before the first y load (the weights may go out among the y loads)
    assert sum(n < min(y_loads) for n in scalar_loads) >= ROUTE_BATCH
