"""What every CuTe DSL kernel package shares: the common support checks and the direct call.

No DSL import here: a package's plugin and limits import this to answer `can_handle` cheaply.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Callable, Optional

import torch

from .types import Activation
from .validation import validate_inputs


def hopper_reason(shape) -> Optional[str]:
    """The checks every sm_90a kernel makes first: a CUDA sm_90 device, the DSL, bf16 tokens."""
    if shape.device_capability is None:
        return "needs a CUDA device (sm_90); inputs are on the CPU"
    if shape.device_capability[0] != 9:
        major, minor = shape.device_capability
        return f"needs sm_90 (Hopper); device is sm_{major}{minor}"
    if importlib.util.find_spec("cutlass") is None:
        return "nvidia-cutlass-dsl is not installed"
    if shape.dtype != torch.bfloat16:
        return f"needs bf16 activations; got {shape.dtype}"
    return None


def dims_reason(shape, multiple: int) -> Optional[str]:
    for name, v in (("hidden", shape.hidden), ("intermediate", shape.intermediate)):
        if v % multiple:
            return f"{name}={v} is not a multiple of {multiple}"
    return None


def direct_call(kernel_name: str, unsupported_reason: Callable, runner_module: str):
    """A package's `fused_moe(...)`: validate, ask the package's own limits, run its runner
    (imported on first use, so importing the package never imports the DSL)."""

    def fused_moe(x, weights, topk_weights, topk_ids, *, activation="silu", quant_mode="w4a16",
                  swiglu_alpha=1.702, swiglu_beta=1.0, swiglu_limit=7.0, out=None, workspace=None,
                  deterministic=True):
        act = activation if isinstance(activation, Activation) else Activation(
            activation, swiglu_alpha, swiglu_beta, swiglu_limit)
        shape = validate_inputs(x, weights, topk_weights, topk_ids, activation=act,
                                quant_mode=quant_mode, out=out)
        reason = unsupported_reason(shape, act)
        if reason is not None:
            raise ValueError(f"{kernel_name} cannot run this call: {reason}")
        run = importlib.import_module(runner_module).run
        return run(x, weights, topk_weights, topk_ids, activation=act, quant_mode=quant_mode,
                   out=out, workspace=workspace, deterministic=deterministic)

    fused_moe.__doc__ = f"Run the layer with {kernel_name}; ValueError (with the reason) when it cannot."
    return fused_moe
