"""The one hook every fused-MoE kernel plugin implements.

A kernel package registers a module in the entry-point group ``fused_moe.kernels``::

    [project.entry-points."fused_moe.kernels"]
    moe-generic = "moe_generic.plugin"

and that module marks its answer with its *own* marker (so the package never imports the
dispatcher and can be installed alone)::

    import pluggy
    from moe_common.types import Decline, Offer, PRIORITY_GENERIC

    hookimpl = pluggy.HookimplMarker("fused_moe")

    @hookimpl
    def can_handle(shape, activation):
        if not shape.on_hopper:
            return Decline("moe-generic", "needs sm_90 (Hopper); got " + str(shape.device_capability))
        return Offer("moe-generic", PRIORITY_GENERIC, run)
"""
from __future__ import annotations

import pluggy

PROJECT = "fused_moe"
ENTRY_POINT_GROUP = "fused_moe.kernels"

hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def can_handle(shape, activation):
    """Can this plugin run the call described by ``shape`` with ``activation``?

    :param shape: a ``moe_common.types.MoEShape`` (tokens, hidden, intermediate, global and
        local expert counts and offset, top_k, weight format, quant mode, bias present,
        device capability (``None`` on CPU), dtype). No tensors: deciding is pure host logic,
        so the dispatcher may call this while a CUDA graph is being captured and may cache the
        answer per shape.
    :param activation: a ``moe_common.types.Activation`` (name, alpha, beta, limit).
    :return: an ``Offer(kernel, priority, run)`` (the highest priority wins; ties are broken
        by kernel name, ascending), a ``Decline(kernel, reason)`` with a one-line reason a
        human can act on (e.g. "no CUDA device", "needs sm_90"), a list of those (a module
        that hosts several kernels), or ``None`` (no opinion; reported as a decline).

    ``run`` is called as ``run(x, weights, topk_weights, topk_ids, *, activation, quant_mode,
    out, workspace, deterministic) -> out`` and must fully overwrite ``out`` ([T, H] bf16).
    An exception raised here is reported by ``dispatcher.explain`` as a decline, never fatal.
    """
