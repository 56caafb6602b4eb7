"""Compiled kernels, keyed by their static facts (cute.compile does not memoize)."""
from __future__ import annotations

import threading

import torch

from .grouped_gemm import GemmConfig, GroupedGemm

ARCH_OPTIONS = "--gpu-arch=sm_90a"
_cache: dict = {}
_lock = threading.Lock()


def _example_args():
    from cutlass import Float32, Int32, Int64
    from cuda.bindings import driver as cuda

    z = Int64(0)
    return ([z] * 10 + [Int32(128), Int32(128), Int32(1), Int32(8), z, Int32(128), Int32(128), z, z,
                        Float32(1.0), Float32(1.0), Float32(1.0), Int32(1), Int32(1), cuda.CUstream(0)])


def config(phase: str, weight_format: str, activation: str, bn: int) -> GemmConfig:
    return GemmConfig(phase=phase, weight_format=weight_format,
                      activation=activation if phase == "fc1" else "none", bn=bn)


def compile_config(cfg: GemmConfig):
    import cutlass.cute as cute

    return cute.compile(GroupedGemm(cfg), *_example_args(), options=ARCH_OPTIONS)


def get(phase: str, weight_format: str, activation: str, bn: int):
    cfg = config(phase, weight_format, activation, bn)
    fn = _cache.get(cfg)
    if fn is None:
        with _lock:
            fn = _cache.get(cfg)
            if fn is None:
                fn = compile_config(cfg)
                _cache[cfg] = fn
    return fn


def current_stream(device):
    from cuda.bindings import driver as cuda

    return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)


def all_configs():
    """Every configuration the dispatcher can pick (CPU CI compiles each for sm_90a)."""
    from .runner import BN_CHOICES

    out = []
    for fmt in ("nvfp4", "mxfp4"):
        for bn in BN_CHOICES:
            for act in ("silu", "gelu_tanh", "swigluoai", "relu2"):
                out.append(config("fc1", fmt, act, bn))
            out.append(config("fc2", fmt, "none", bn))
    return out
