"""The shared CuTe DSL kernels compile for sm_90a on a machine without a GPU."""
from __future__ import annotations

import pytest

from moe_common.cute import jit


@pytest.mark.parametrize("ids_bytes", [4, 8])
def test_routing_and_reduce_compile(ids_bytes):
    assert jit.routing(ids_bytes) is not None
    assert all(k is not None for k in jit.routing_split(ids_bytes))
    assert jit.topk_reduce(ids_bytes) is not None


def test_split_routing_thresholds():
    from moe_common.cute.routing import MAX_SPLIT_CTAS, SPLIT_MIN_PAIRS, split_ctas

    assert split_ctas(SPLIT_MIN_PAIRS - 1) == 0  # one launch for small batches
    assert split_ctas(SPLIT_MIN_PAIRS) > 1
    assert split_ctas(65536 * 32) == MAX_SPLIT_CTAS  # the largest batch the kernels accept


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_dequantize_compiles(fmt):
    from moe_common.cute.dequant import compile_dequantize

    assert compile_dequantize(fmt) is not None
