"""The torch reference as a `fused_moe.kernels` plugin: always offers, at the lowest priority.

Registered as entry point "reference" in group "fused_moe.kernels" (moe-common's pyproject).
It is the dispatcher's last resort on machines without a supported GPU; when it does run on a
GPU, a warning is logged once (logger "moe_common.reference") because it is slow.
"""
from __future__ import annotations

import logging

import pluggy

from .reference import reference_moe
from .types import PRIORITY_REFERENCE, Offer

hookimpl = pluggy.HookimplMarker("fused_moe")

KERNEL_NAME = "reference"
logger = logging.getLogger("moe_common.reference")
_warned_on_gpu = False


def _run(
    x,
    weights,
    topk_weights,
    topk_ids,
    *,
    activation,
    quant_mode,
    out,
    workspace=None,
    deterministic=False,
):
    """Runner per moe_common.types.Runner. The reference is deterministic either way (fixed
    accumulation order, fp32, one final rounding), so `deterministic` changes nothing;
    `workspace` is unused (the reference allocates its temporaries)."""
    global _warned_on_gpu
    if x.is_cuda and not _warned_on_gpu:
        _warned_on_gpu = True
        logger.warning(
            "fused MoE: running the slow torch reference on GPU %s: forced, or no kernel plugin "
            "offered to handle this call (see dispatcher.explain(...) for why)",
            x.device,
        )
    return reference_moe(
        x, weights, topk_weights, topk_ids, activation=activation, quant_mode=quant_mode, out=out
    )


@hookimpl
def can_handle(shape, activation):
    return Offer(
        kernel=KERNEL_NAME,
        priority=PRIORITY_REFERENCE,
        run=_run,
        note="fp32 torch reference (slow; last resort)",
    )
