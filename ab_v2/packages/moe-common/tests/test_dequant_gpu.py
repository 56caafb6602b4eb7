"""The CuTe DSL dequantizer is bit-exact against the torch dequantizer (on the H200)."""
from __future__ import annotations

import pytest
import torch

from moe_common.testing import random_layer

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("gated", [True, False])
def test_dsl_dequantize_bit_exact(fmt, gated):
    from moe_common.cute.dequant import dequantize_weights

    w = random_layer(6, 320, 96, weight_format=fmt, gated=gated)
    got13, got2 = dequantize_weights(w)
    ref13, ref2 = w.dequantize()
    assert torch.equal(got13, ref13.to(torch.bfloat16))
    assert torch.equal(got2, ref2.to(torch.bfloat16))
