"""What moe-generic supports, as one function every entry point asks (no DSL import here)."""
from __future__ import annotations

import importlib.util

import torch

KERNEL_NAME = "moe-generic"
MAX_TOP_K = 32
MAX_LOCAL_EXPERTS = 1024
MAX_TOKENS = 65536
DIM_MULTIPLE = 32  # H and I: multiples of 128 run natively, other multiples of 32 are zero-padded


def unsupported_reason(shape, activation):
    """None when the kernel can run this call, else a one-line reason."""
    if shape.device_capability is None:
        return "needs a CUDA device (sm_90); inputs are on the CPU"
    if shape.device_capability[0] != 9:
        major, minor = shape.device_capability
        return f"needs sm_90 (Hopper); device is sm_{major}{minor}"
    if importlib.util.find_spec("cutlass") is None:
        return "nvidia-cutlass-dsl is not installed"
    if shape.dtype != torch.bfloat16:
        return f"needs bf16 activations; got {shape.dtype}"
    for name, v in (("hidden", shape.hidden), ("intermediate", shape.intermediate)):
        if v % DIM_MULTIPLE:
            return f"{name}={v} is not a multiple of {DIM_MULTIPLE}"
    if shape.top_k > MAX_TOP_K:
        return f"top_k={shape.top_k} exceeds the supported maximum {MAX_TOP_K}"
    if shape.num_local_experts > MAX_LOCAL_EXPERTS:
        return f"{shape.num_local_experts} local experts exceed the supported maximum {MAX_LOCAL_EXPERTS}"
    if shape.tokens > MAX_TOKENS:
        return f"tokens={shape.tokens} exceeds the supported maximum {MAX_TOKENS}"
    return None
