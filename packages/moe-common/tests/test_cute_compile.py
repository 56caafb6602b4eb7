"""The shared CuTe DSL kernels compile for sm_90a on a machine without a GPU."""
from __future__ import annotations

import ctypes
from typing import NamedTuple

import pytest
from cutlass import Float32, Float64, Int32, Int64

from moe_common.cute import jit


@pytest.mark.parametrize("ids_bytes", [4, 8])
def test_routing_and_reduce_compile(ids_bytes):
    assert jit.routing(ids_bytes) is not None
    assert all(k is not None for k in jit.routing_split(ids_bytes))
    # moe-generic's reduce (router weights applied by its GEMM) and moe-gated's two
    assert jit.topk_reduce(ids_bytes, paired=16, weighted=False) is not None
    assert jit.topk_reduce(ids_bytes, paired=16, weighted=True) is not None
    assert jit.topk_reduce(ids_bytes, paired=32, weighted=True) is not None


def test_paired_order_is_a_permutation_of_each_block():
    """Columns j, j + 8, ... of a block sit side by side (the order moe-gated's FC2 writes y in
    and the paired reduce reads it back)."""
    from moe_common.cute.topk_reduce import paired_position

    assert [paired_position(h, 16) for h in range(16)] == [0, 2, 4, 6, 8, 10, 12, 14,
                                                           1, 3, 5, 7, 9, 11, 13, 15]
    assert [paired_position(h, 32) for h in (0, 8, 16, 24, 1, 9, 7, 31, 32, 40)] == \
        [0, 1, 2, 3, 4, 5, 28, 31, 32, 33]
    for block in (16, 32):
        assert sorted(paired_position(h, block) for h in range(96)) == list(range(96))
        assert all(paired_position(h, block) // block == h // block for h in range(96))


def test_fragment_position_is_where_the_reduce_reads():
    """An MMA thread's rows (r and r + 8 of each of its 1 or 2 groups) land where the paired
    reduce of 16 x groups blocks looks for them, side by side and aligned for one vector store
    (moe-generic's FC2: 1 group; moe-gated's: 1 wide, 2 tall)."""
    from moe_common.cute.topk_reduce import fragment_position, paired_position

    for groups in (1, 2):
        for group0 in range(0, 8, groups):
            for r in range(8):
                cols = [fragment_position(16 * group0, r, gi, h, groups)
                        for gi in range(groups) for h in range(2)]
                assert cols == list(range(cols[0], cols[0] + 2 * groups))
                assert cols[0] % (2 * groups) == 0
                rows = [16 * (group0 + gi) + r + 8 * h for gi in range(groups) for h in range(2)]
                assert cols == [paired_position(row, 16 * groups) for row in rows]


def test_split_routing_thresholds():
    from moe_common.cute.routing import (MAX_SPLIT_CTAS, ONE_CTA_MAX_PAIRS, SPLIT_MIN_PAIRS,
                                         split_ctas)

    assert split_ctas(SPLIT_MIN_PAIRS - 1) == 0  # one launch for small batches
    assert split_ctas(ONE_CTA_MAX_PAIRS + 1) > 0  # the one-CTA kernel holds one batch per thread
    assert split_ctas(SPLIT_MIN_PAIRS) > 1
    assert split_ctas(65536 * 32) == MAX_SPLIT_CTAS  # the largest batch the kernels accept


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_dequantize_compiles(fmt):
    from moe_common.cute.dequant import compile_dequantize

    assert compile_dequantize(fmt) is not None


def test_route_pairs_buffers_and_launch(monkeypatch):
    """The runners' shared routing step: its tables live in the runner's workspace (so a frozen
    FusedMoE workspace holds them) and reach jit.route with the split path's scratch."""
    import torch

    from moe_common.cute.routing import MAX_SPLIT_CTAS
    from moe_common.kernel_package import Buffers, route_pairs
    from moe_common.workspace import Workspace

    calls = []
    monkeypatch.setattr(jit, "route", lambda *a: calls.append(a))
    ws = Workspace()
    ids = torch.zeros(5, 4, dtype=torch.int64)
    routed = route_pairs(Buffers("k", ws, "cpu"), ids, 8, 16, 64, 37, "stream")
    (got_ids, pairs, off, experts, bn, order, slots, counts, tiles, num_tiles, hist,
     stream), = calls
    assert got_ids is ids and (pairs, off, experts, bn, stream) == (20, 8, 16, 64, "stream")
    assert order.shape == (20,) and slots.shape == (20,) and counts.shape == (16,)
    assert tiles.shape == (3, 37)
    assert hist.shape == (MAX_SPLIT_CTAS + 1, 16) and num_tiles.shape == (1,)
    assert routed.order is order and routed.tiles is tiles and routed.num_tiles is num_tiles
    assert routed.slots is slots
    assert routed.tile_operands == dict(
        tile_expert=tiles[0].data_ptr(), tile_start=tiles[1].data_ptr(),
        tile_end=tiles[2].data_ptr(), num_tiles=num_tiles.data_ptr(), order=order.data_ptr())
    ws.freeze()  # the same call again is served from the frozen workspace
    route_pairs(Buffers("k", ws, "cpu"), ids, 8, 16, 64, 37, "stream")


def test_routing_tables_reach_the_kernels_in_field_order():
    """jit.route's RoutingTables arrive as RoutingKernel's and RoutingScan's parameters, one per
    field, in order and with their values, after the scalars ahead of them (checked without a
    GPU)."""
    from moe_common.cute import jit
    from moe_common.cute.routing import RoutingTables
    from moe_common.testing import check_operands_marshal

    stream = jit.example_stream()
    check_operands_marshal(jit.routing(4), RoutingTables, stream,
                           before=(1 << 40, 7, 0, 128, 8, 1 << 41, 1 << 42))
    _, scan, _ = jit.routing_split(8)
    check_operands_marshal(scan, RoutingTables, stream, before=(1 << 40, 3, 128, 8))


_ID_PROBE = """
from moe_common.cute import jit
jit.routing(8)
jit.topk_reduce(8, 16, False)
"""


def test_int64_ids_are_saturated_before_narrowing(tmp_path):
    """An int64 expert id is clamped to [-1, 2^31 - 1] before its low 32 bits are used, so
    2^32 + e cannot alias expert e (nor INT64_MIN expert 0): checked in the PTX of the int64
    routing and top-k reduce kernels, where every 64-bit id load is followed by the clamp."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", _ID_PROBE], env=env, check=True, cwd=tmp_path)
    ptx = {p.name: p.read_text() for p in Path(tmp_path).rglob("*.ptx")}
    assert any("Routing" in n for n in ptx) and any("TopkReduce" in n for n in ptx), list(ptx)
    for name, text in ptx.items():
        # the helper's inline asm block is one PTX line: load, clamp, then narrow
        loads = [ln.strip() for ln in text.splitlines() if "ld.global.nc.s64" in ln]
        assert loads, name
        for ln in loads:
            order = [ln.find(op) for op in ("ld.global.nc.s64 t,", "max.s64 t, t, -1;",
                                            "min.s64 t, t, 2147483647;", "cvt.u32.u64")]
            assert -1 not in order and order == sorted(order), (name, ln)


class Sample(NamedTuple):
    """An operand bundle of each field type."""
    ptr: Int64
    count: Int32
    scale: Float32


class Wide(NamedTuple):
    value: Float64  # a type no kernel parameter has


def test_operands_hold_each_field_as_its_c_type_in_field_order():
    """jit.operands' values: field i at the i-th address __c_pointers__ gives, as its C type
    (what the compiled launcher passes the kernel); the list keeps them alive."""
    pointers = jit.operands(Sample, scale=-1.5, ptr=(1 << 62) + 3, count=-(2**31)).__c_pointers__()
    got = [ctypes.cast(p, ctypes.POINTER(t)).contents.value
           for p, t in zip(pointers, (ctypes.c_int64, ctypes.c_int32, ctypes.c_float))]
    assert got == [(1 << 62) + 3, -(2**31), -1.5]


@pytest.mark.parametrize("values,message", [
    (dict(ptr=1, count=2), r"missing \['scale'\], unknown \[\]"),
    (dict(ptr=1, count=2, scale=1.0, extra=4), r"missing \[\], unknown \['extra'\]"),
    (dict(ptr=1, count=2**31, scale=1.0), r"Sample.count: got 2147483648; allowed: "
                                          r"-2147483648 <= value < 2147483648"),
    (dict(ptr=-(2**63) - 1, count=0, scale=1.0), r"Sample.ptr: got -9223372036854775809"),
])
def test_operands_reject_missing_unknown_and_out_of_range_fields(values, message):
    with pytest.raises(ValueError, match=message):
        jit.operands(Sample, **values)


def test_operands_reject_a_field_type_without_a_c_type():
    with pytest.raises(ValueError, match=r"Wide.value: type Float64; allowed: Int64, Int32, Float32"):
        jit.operands(Wide, value=1.0)
