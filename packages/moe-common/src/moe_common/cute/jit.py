"""Compile cache and launch helpers shared by the kernels.

`cute.compile` does not memoize, and compiling takes 0.3-1 s, so every compiled kernel is kept
here keyed by its static facts. Kernels are compiled for sm_90a explicitly, so the same code
path compiles on a CPU-only machine (CI) and on the H200.
"""
from __future__ import annotations

import threading
from typing import Callable

import torch

ARCH_OPTIONS = "--gpu-arch=sm_90a"
_cache: dict = {}
_lock = threading.Lock()


def compiled(key, build: Callable):
    """The compiled function for `key`, built once by `build()` (which calls cute.compile)."""
    fn = _cache.get(key)
    if fn is None:
        with _lock:
            fn = _cache.get(key)
            if fn is None:
                fn = build()
                _cache[key] = fn
    return fn


def compile_kernel(kernel, *example_args):
    import cutlass.cute as cute

    return cute.compile(kernel, *example_args, options=ARCH_OPTIONS)


def example_stream():
    from cuda.bindings import driver as cuda

    return cuda.CUstream(0)


def current_stream(device):
    from cuda.bindings import driver as cuda

    return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)


def ids_bytes(topk_ids: torch.Tensor) -> int:
    return topk_ids.element_size()


def routing(ids_nbytes: int):
    from cutlass import Int32, Int64

    from .routing import RoutingKernel

    z = Int64(0)
    return compiled(("routing", ids_nbytes), lambda: compile_kernel(
        RoutingKernel(ids_nbytes), z, Int32(1), Int32(0), Int32(1), Int32(8), z, z, z, z, z, z,
        example_stream()))


def topk_reduce(ids_nbytes: int):
    from cutlass import Int32, Int64

    from .topk_reduce import TopkReduce

    z = Int64(0)
    return compiled(("topk_reduce", ids_nbytes), lambda: compile_kernel(
        TopkReduce(ids_nbytes), z, z, z, Int32(1), Int32(1), Int32(8), Int32(0), Int32(1),
        example_stream()))
