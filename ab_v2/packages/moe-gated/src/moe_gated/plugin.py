"""moe-gated's plugin: bids above moe-generic for gated activations on large routed batches.

Depends on nothing but pluggy's marker and moe_common's types, so the package works installed
alone; the dispatcher finds it through the "fused_moe.kernels" entry point.
"""
from __future__ import annotations

import pluggy

from moe_common.types import Decline, Offer

from .limits import KERNEL_NAME, priority, unsupported_reason

hookimpl = pluggy.HookimplMarker("fused_moe")


@hookimpl
def can_handle(shape, activation):
    reason = unsupported_reason(shape, activation)
    if reason is not None:
        return Decline(kernel=KERNEL_NAME, reason=reason)
    from .runner import run

    return Offer(kernel=KERNEL_NAME, priority=priority(shape), run=run)
