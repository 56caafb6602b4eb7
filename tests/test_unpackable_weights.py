"""Every kernel declines MXFP4 weights whose scales the packed layout cannot hold, with
unpackable_reason's reason, so the reference runs them: can_handle never offers a call that
pack() would refuse. (Here, not in moe-common's tests: it needs every kernel package.)"""
from __future__ import annotations

import importlib

import pytest
import torch

from moe_common.packed import unpackable_reason
from moe_common.testing import unpackable_mxfp4_layer
from moe_common.types import Activation
from moe_common.validation import describe

KERNELS = ("moe_generic", "moe_gated", "moe_static")


@pytest.mark.parametrize("module", KERNELS)
def test_kernels_decline_weights_pack_cannot_hold(module):
    w = unpackable_mxfp4_layer()
    reason = unpackable_reason(w)
    assert reason is not None and "outside the kernels' exact range" in reason
    shape = describe(w, 4, 2, "w4a16", (9, 0), torch.bfloat16)
    plugin = importlib.import_module(f"{module}.plugin")
    answer = plugin.can_handle(shape, Activation("silu"))
    assert answer.reason == reason  # a Decline, with the reason
