"""The problem description shared by every package: activation, shape, plugin answers.

These are the only types that cross the plugin boundary, so they stay small and frozen.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

ACTIVATIONS = ("silu", "gelu_tanh", "swigluoai", "relu2")
GATED_ACTIVATIONS = ("silu", "gelu_tanh", "swigluoai")
QUANT_MODES = ("w4a16", "w4a4")
WEIGHT_FORMATS = ("nvfp4", "mxfp4")


@dataclass(frozen=True)
class Activation:
    """An activation and its parameters (alpha/beta/limit are used by swigluoai only).

    `limit=None` disables the swigluoai clamp, in the reference and in every kernel. alpha and
    beta must be finite and limit positive and finite (or None): a NaN parameter would make every
    output NaN and a limit <= 0 every output 0, silently.
    """

    name: str = "silu"
    alpha: float = 1.702
    beta: float = 1.0
    limit: Optional[float] = 7.0

    def __post_init__(self):
        if self.name not in ACTIVATIONS:
            raise ValueError(f"activation: got {self.name!r}; allowed: {', '.join(ACTIVATIONS)}")
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"swiglu_{name}: got {v!r}; allowed: a finite number")
        lim = self.limit
        if lim is not None and (isinstance(lim, bool) or not isinstance(lim, (int, float))
                                or not math.isfinite(lim) or lim <= 0):
            raise ValueError(f"swiglu_limit: got {lim!r}; allowed: a positive finite number, or "
                             "None for no clamp")

    @property
    def gated(self) -> bool:
        return self.name in GATED_ACTIVATIONS


def make_activation(activation="silu", swiglu_alpha: float = Activation.alpha,
                    swiglu_beta: float = Activation.beta,
                    swiglu_limit: Optional[float] = Activation.limit) -> Activation:
    """An Activation from a name and the swigluoai parameters (an Activation passes through and
    the parameters are ignored): the one place the entry points' keywords become an Activation."""
    if isinstance(activation, Activation):
        return activation

    def number(v):  # numpy scalars and ints become floats; anything else goes to the check as is
        return float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else v

    return Activation(activation, number(swiglu_alpha), number(swiglu_beta), number(swiglu_limit))


@dataclass(frozen=True)
class MoEShape:
    """Everything a kernel needs to decide whether it can run a call (no tensors)."""

    tokens: int
    hidden: int
    intermediate: int
    num_experts: int  # global expert count (ids range over [0, num_experts))
    num_local_experts: int
    local_expert_offset: int
    top_k: int
    weight_format: str  # "nvfp4" | "mxfp4"
    quant_mode: str  # "w4a16" | "w4a4"
    has_bias: bool
    device_capability: Optional[tuple]  # (major, minor) of x's CUDA device; None on CPU
    dtype: torch.dtype = torch.bfloat16
    # Why the kernels' packed layout cannot hold these weights (moe_common.packed.
    # unpackable_reason), None when it can: every kernel declines with it, the reference runs.
    weights_reason: Optional[str] = None

    @property
    def routed_rows(self) -> int:
        return self.tokens * self.top_k

    @property
    def on_hopper(self) -> bool:
        return self.device_capability is not None and self.device_capability[0] == 9


# A kernel's runner. Called as
#   run(x, weights, topk_weights, topk_ids, *, activation, quant_mode, out, workspace,
#       deterministic) -> out
# `out` is a preallocated [T, H] bf16 tensor the runner must fully overwrite; `workspace` is a
# moe_common.workspace.Workspace (or None: the runner then allocates what it needs).
Runner = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Offer:
    """A plugin's yes: run me with `run`; the highest priority wins (ties: name order)."""

    kernel: str
    priority: int
    run: Runner = field(repr=False, compare=False)
    note: str = ""


@dataclass(frozen=True)
class Decline:
    """A plugin's no, with a one-line reason a human can act on."""

    kernel: str
    reason: str


PRIORITY_REFERENCE = 0
PRIORITY_GENERIC = 10
PRIORITY_GATED = 20
PRIORITY_STATIC = 30
