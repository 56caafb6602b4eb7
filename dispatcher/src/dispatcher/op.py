"""``torch.ops.fused_moe.fused_moe``: the dispatcher as a torch.library custom op.

Design: a ``MoEWeights`` is not a tensor, and kernels keep derived data (repacked weights,
compiled handles) in ``weights.kernel_cache``; rebuilding a MoEWeights from loose tensors on
every call would throw that cache away. So the op takes an integer *handle* to a registered
weights object plus the call's tensors and static options:

    fused_moe(x, topk_weights, topk_ids, weights_handle, activation, quant_mode,
              swiglu_alpha, swiglu_beta, swiglu_limit, kernel, deterministic) -> Tensor[T, H]

``register_weights(w)`` returns the handle (stable for the object's lifetime; it is kept in
``w.kernel_cache["dispatcher.op"]`` and the registry holds only a weak reference). The op
allocates and returns a new ``[T, H]`` bf16 tensor and mutates nothing, and its fake
(meta) implementation is ``x.new_empty(x.shape)``, so it traces under ``torch.compile``
(the weights are constants of the compiled graph, as module parameters would be). Register
the weights before compiling (or build them outside the compiled region) when you use
``fullgraph=True``: registration itself is a Python side effect that Dynamo runs eagerly.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from typing import Optional, Union

import torch

from moe_common.weights import MoEWeights

from . import api
from .options import CallOptions, takes_options

_CACHE_KEY = "dispatcher.op"
_registry: dict = {}
_counter = itertools.count(1)
_lock = threading.Lock()


def register_weights(weights: MoEWeights) -> int:
    """The op handle of ``weights`` (registered on first use; weakly referenced)."""
    if not isinstance(weights, MoEWeights):
        raise ValueError(f"weights: got {type(weights).__name__}; allowed: moe_common.MoEWeights")
    handle = weights.kernel_cache.get(_CACHE_KEY)
    if handle is not None and handle in _registry and _registry[handle]() is weights:
        return handle
    with _lock:
        handle = next(_counter)
        _registry[handle] = weakref.ref(weights, lambda _r, h=handle: _registry.pop(h, None))
        weights.kernel_cache[_CACHE_KEY] = handle
    return handle


def lookup_weights(handle: int) -> MoEWeights:
    ref = _registry.get(int(handle))
    w = ref() if ref is not None else None
    if w is None:
        raise ValueError(f"weights_handle: got {handle}; no live MoEWeights is registered under it "
                         "(was the weights object freed? call dispatcher.op.register_weights again)")
    return w


@torch.library.custom_op("fused_moe::fused_moe", mutates_args=())
def _fused_moe_op(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights_handle: int,
    activation: str,
    quant_mode: str,
    swiglu_alpha: float,
    swiglu_beta: float,
    swiglu_limit: Optional[float],
    kernel: Optional[str],
    deterministic: bool,
) -> torch.Tensor:
    weights = lookup_weights(weights_handle)
    return api.fused_moe(
        x, weights, topk_weights, topk_ids, activation=activation, quant_mode=quant_mode,
        swiglu_alpha=swiglu_alpha, swiglu_beta=swiglu_beta, swiglu_limit=swiglu_limit,
        kernel=kernel, deterministic=deterministic)


@_fused_moe_op.register_fake
def _fused_moe_fake(x, topk_weights, topk_ids, weights_handle, activation, quant_mode,
                    swiglu_alpha, swiglu_beta, swiglu_limit, kernel, deterministic):
    torch._check(x.dim() == 2, lambda: f"x: got a {x.dim()}-D tensor; allowed: 2-D [T, H]")
    torch._check(topk_ids.shape[0] == x.shape[0], lambda: "topk_ids: T must match x")
    return x.new_empty((x.shape[0], x.shape[1]), dtype=torch.bfloat16)


@takes_options
def fused_moe_op(
    x: torch.Tensor,
    weights: Union[MoEWeights, int],
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    options: CallOptions,
) -> torch.Tensor:
    """``dispatcher.fused_moe`` through the custom op (same arguments; no ``out``).

    ``weights`` may be a MoEWeights (registered on first use) or a handle from
    ``register_weights``."""
    act = options.make_activation()
    handle = weights if isinstance(weights, int) else register_weights(weights)
    return torch.ops.fused_moe.fused_moe(
        x, topk_weights, topk_ids, handle, act.name, options.quant_mode, float(act.alpha),
        float(act.beta), None if act.limit is None else float(act.limit), options.kernel,
        bool(options.deterministic))
