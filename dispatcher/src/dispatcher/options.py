"""The keyword options every dispatcher entry point takes, in one place.

``fused_moe``, ``explain``, ``FusedMoE``, ``fused_moe_op`` and the expert-parallel
``fused_moe_ep``, ``explain_ep`` and ``FusedMoEEP`` all take the same keywords (``activation``,
``quant_mode``, ``swiglu_alpha``, ``swiglu_beta``, ``swiglu_limit``, ``kernel``,
``deterministic``). Their names, defaults and meaning live here only:

1. ``CallOptions`` is a frozen dataclass of those keywords with their defaults (the swiglu
   defaults are ``moe_common.types.Activation``'s).
2. ``takes_options`` decorates a function whose keyword-only parameter ``options`` is a
   ``CallOptions``. Callers pass the options as plain keywords; the wrapper moves exactly those
   keywords into one ``CallOptions`` (any other keyword goes to the function, so a misspelt one
   raises Python's usual TypeError) and calls the function with it.
3. The wrapper's signature, which ``help()`` and ``inspect.signature`` show, is the function's
   own parameters followed by the options as keyword-only parameters with their defaults, so
   every entry point still documents the whole keyword list.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import Optional, Union

from moe_common.types import Activation, make_activation


@dataclass(frozen=True)
class CallOptions:
    """How a layer call runs: the activation (a name with the swigluoai parameters, or an
    ``Activation``, which then overrides them), the quantization mode ("w4a16" or "w4a4"), a
    forced kernel (None: the dispatcher's choice, or FUSED_MOE_KERNEL) and whether results must
    be bitwise reproducible. Checked where they are used (``make_activation``,
    ``validate_inputs``, the manager)."""

    activation: Union[str, Activation] = Activation.name
    quant_mode: str = "w4a16"
    swiglu_alpha: float = Activation.alpha
    swiglu_beta: float = Activation.beta
    swiglu_limit: Optional[float] = Activation.limit
    kernel: Optional[str] = None
    deterministic: bool = False

    def make_activation(self) -> Activation:
        return make_activation(self.activation, self.swiglu_alpha, self.swiglu_beta, self.swiglu_limit)

    def keywords(self) -> dict:
        """The options as keywords of another entry point (``fused_moe(..., **o.keywords())``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(CallOptions))


def _option_parameters() -> list:
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                              annotation=f.type) for f in dataclasses.fields(CallOptions)]


def takes_options(fn):
    """Let ``fn(..., *, options: CallOptions)`` be called with the options as keywords (steps
    2-3 of the module docstring)."""
    own = inspect.signature(fn)
    if "options" not in own.parameters or own.parameters["options"].kind != inspect.Parameter.KEYWORD_ONLY:
        raise TypeError(f"takes_options: {fn.__qualname__} needs a keyword-only parameter 'options'")
    params = [p for p in own.parameters.values() if p.name != "options"]
    variadic = [p for p in params if p.kind == inspect.Parameter.VAR_KEYWORD]
    params = [p for p in params if p.kind != inspect.Parameter.VAR_KEYWORD] + _option_parameters() + variadic

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        options = CallOptions(**{name: kwargs.pop(name) for name in OPTION_NAMES if name in kwargs})
        return fn(*args, options=options, **kwargs)

    wrapper.__signature__ = own.replace(parameters=params)
    return wrapper
