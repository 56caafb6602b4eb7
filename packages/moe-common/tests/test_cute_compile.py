"""The shared CuTe DSL kernels compile for sm_90a on a machine without a GPU."""
from __future__ import annotations

import pytest

from moe_common.cute import jit


@pytest.mark.parametrize("ids_bytes", [4, 8])
def test_routing_and_reduce_compile(ids_bytes):
    assert jit.routing(ids_bytes) is not None
    assert jit.topk_reduce(ids_bytes) is not None


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_dequantize_compiles(fmt):
    from moe_common.cute.dequant import compile_dequantize

    assert compile_dequantize(fmt) is not None
