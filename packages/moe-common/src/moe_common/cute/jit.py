"""Compile cache and launch helpers shared by the kernels.

`cute.compile` does not memoize, and compiling takes 0.3-1 s, so every compiled kernel is kept
here keyed by its static facts. Kernels are compiled for sm_90a explicitly, so the same code
path compiles on a CPU-only machine (CI) and on the H200.

Two per-thread modes change what `compiled` does (FusedMoE uses both, see dispatcher.api):
  frozen()    a key that is not compiled yet raises CompileAfterWarmup instead of compiling
              (a compile inside a CUDA-graph capture, or on a decode step's first token, is
              a bug of the warm-up, never silently paid);
  probing(s)  nothing is compiled or launched: each key a runner asks for is added to the set
              s and a no-op stands in for the kernel, so a runner's host logic can be run to
              learn which variants a call would use.

A kernel's runtime operands (pointers and scalars) are one typing.NamedTuple of DSL scalar
types, defined once beside the kernel: the runner builds its values with `operands`, the
kernel's __call__ and kernel take it whole, and the compile cache compiles with `example`, so
the four places cannot disagree on an operand's place or type. The DSL passes a NamedTuple's
fields as separate kernel parameters, in field order. The kernel's own parameter is left
unannotated: the DSL names the kernel after its arguments, and an unannotated tuple adds to that
name what its fields given one by one would, so the kernel's PTX is the same as with separate
parameters (annotated, the name would carry the tuple's repr).

At launch the compiled function passes the kernel a pointer to each parameter's value. A
NamedTuple of DSL scalars costs the host about 2 us a field for that (each field a DSL object,
then a ctypes value and a pointer to it: 60 us for moe-static's 29 fields), so `operands`
returns an `OperandValues` instead: one ctypes structure holding every field as its C type
(Int64 c_int64, Int32 c_int32, Float32 c_float), whose `__c_pointers__` (the DSL's marshalling
protocol, asked before the DSL casts an argument itself) gives the address of each field in field order: the
same parameters, values and order, in one object (docs/HOST_OVERHEAD.md has the numbers).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
import types
import typing
from typing import Callable

import torch

ARCH_OPTIONS = "--gpu-arch=sm_90a"
# Programmatic dependent launch for the kernels of a layer call (routing, row scatter, GEMMs,
# reduce, moe-static's single kernel): each is launched with `use_pdl` and starts with
# ptx.grid_dependency_wait, so its launch overlaps the previous kernel's end (moe-gated at
# T = 128-512: 0.4-1.2% faster, ~3 us a call; moe-static at T <= 2: 1-3%, 0.2-0.5 us a call).
# An FC2 beside FC1 (moe-gated's GatedConfig.overlap, moe-generic's GemmConfig.overlap) waits
# at its end instead, per token tile on FC1.
PDL = True
_cache: dict = {}
_lock = threading.Lock()
_mode = threading.local()  # .frozen: bool, .probe: a set or None


class CompileAfterWarmup(RuntimeError):
    """A kernel variant was asked for while compiling is frozen (after FusedMoE.warmup())."""


def _no_launch(*_args, **_kwargs):
    return None


def compiled(key, build: Callable):
    """The compiled function for `key`, built once by `build()` (which calls cute.compile)."""
    probe = getattr(_mode, "probe", None)
    if probe is not None:
        probe.add(key)
        return _no_launch
    fn = _cache.get(key)
    if fn is None:
        if getattr(_mode, "frozen", False):
            raise CompileAfterWarmup(
                f"kernel variant {key!r} is not compiled, and compiling is frozen after "
                "FusedMoE.warmup(); warm up with this call's T (warmup(tokens=[...])) or report "
                "the variant the warm-up missed")
        with _lock:
            fn = _cache.get(key)
            if fn is None:
                fn = build()
                _cache[key] = fn
    return fn


@contextlib.contextmanager
def frozen(on: bool = True):
    """While active (in this thread), a variant that is not compiled raises CompileAfterWarmup."""
    before = getattr(_mode, "frozen", False)
    _mode.frozen = on
    try:
        yield
    finally:
        _mode.frozen = before


@contextlib.contextmanager
def probing(keys: set):
    """While active (in this thread), compiled() records keys into `keys` and launches nothing."""
    before = getattr(_mode, "probe", None)
    _mode.probe = keys
    try:
        yield keys
    finally:
        _mode.probe = before


def compile_kernel(kernel, *example_args):
    import cutlass.cute as cute

    return cute.compile(kernel, *example_args, options=ARCH_OPTIONS)


@functools.cache
def field_types(bundle: type) -> types.MappingProxyType:
    """An operand bundle's field -> DSL type (resolved once: the kernels' modules use postponed
    annotations, and resolving them costs 49 us for moe-static's)."""
    return types.MappingProxyType(typing.get_type_hints(bundle))


# The C type a kernel parameter of each DSL type is passed as, and the range of the integers.
C_TYPES = {"Int64": ctypes.c_int64, "Int32": ctypes.c_int32, "Float32": ctypes.c_float}
INT_RANGES = {"Int64": (-2**63, 2**63), "Int32": (-2**31, 2**31)}


class OperandValues(ctypes.Structure):
    """An operand bundle's values for a launch (see the module docstring): a subclass per
    bundle (`values_type`) holds them as C values; the compiled launcher passes the address of
    each, in field order, as the kernel's parameters."""

    _names: frozenset = frozenset()
    _offsets: tuple = ()
    _int_ranges: tuple = ()  # (field, lo, hi) of every integer field

    def __c_pointers__(self) -> list:
        base = ctypes.addressof(self)
        pointers = [ctypes.c_void_p(base + offset) for offset in self._offsets]
        # The values live while the list does (the DSL holds it until the C call has read
        # them). One owner, not one per pointer: 29 owners cost moe-static's launch 4 us.
        if pointers:
            pointers[0]._owner = self
        return pointers


@functools.cache
def values_type(bundle: type) -> type:
    """The OperandValues subclass of an operand bundle: its fields in order, each of its DSL
    type's C type."""
    fields = []
    for name, ty in field_types(bundle).items():
        if ty.__name__ not in C_TYPES:
            raise ValueError(f"{bundle.__name__}.{name}: type {ty.__name__}; allowed: "
                             f"{', '.join(C_TYPES)}")
        fields.append((name, C_TYPES[ty.__name__]))
    cls = type(f"{bundle.__name__}Values", (OperandValues,), {"_fields_": fields})
    cls._names = frozenset(bundle._fields)
    cls._offsets = tuple(getattr(cls, name).offset for name, _ in fields)
    cls._int_ranges = tuple((name, *INT_RANGES[ty.__name__])
                            for name, ty in field_types(bundle).items() if ty.__name__ in INT_RANGES)
    return cls


def operands(bundle: type, **values) -> OperandValues:
    """The launch values of an operand bundle: every field of `bundle` given once, each an int
    (Int64, Int32 fields: in the type's range) or a float (Float32 fields)."""
    cls = values_type(bundle)
    if values.keys() != cls._names:
        fields = bundle._fields
        raise ValueError(f"{bundle.__name__}: missing {[f for f in fields if f not in values]}, "
                         f"unknown {[k for k in values if k not in fields]}; "
                         f"the fields are {list(fields)}")
    for name, lo, hi in cls._int_ranges:
        if not lo <= values[name] < hi:
            raise ValueError(f"{bundle.__name__}.{name}: got {values[name]}; allowed: "
                             f"{lo} <= value < {hi}")
    return cls(**values)


def example(bundle: type):
    """A bundle for cute.compile: every field a value of its type (pointers 0, integers 1,
    floats 1.0; only the types matter, every field being a run-time kernel parameter)."""
    from cutlass import Float32, Int64

    def value(ty):
        return ty(0) if ty is Int64 else ty(1.0) if ty is Float32 else ty(1)

    types = field_types(bundle)
    return bundle(**{f: value(types[f]) for f in bundle._fields})


# The fields every grouped GEMM's bundle (moe-gated, moe-generic) starts with, all pointers:
# the GEMM's packed weights (moe_common.packed): the group records (each group tile's codes and
# block scales), the per-expert global scale gscale (fp32 [E]), the bias; then the routing's tiles
# (moe_common.cute.routing, kernel_package.RoutedPairs.tile_operands): each tile's expert, first
# and end sorted pair, the tile count (int32 on the device) and the sorted pair order.
GROUPED_GEMM_FIELDS = ("records", "gscale", "bias", "tile_expert", "tile_start", "tile_end",
                       "num_tiles", "order")


def grouped_gemm_operands(name: str, doc: str, fields: list) -> type:
    """A grouped GEMM's operand bundle: GROUPED_GEMM_FIELDS, then the kernel's own (field, DSL
    type) pairs, in kernel-parameter order."""
    from cutlass import Int64

    bundle = typing.NamedTuple(name, [(f, Int64) for f in GROUPED_GEMM_FIELDS] + list(fields))
    bundle.__doc__ = doc
    return bundle


def example_stream():
    from cuda.bindings import driver as cuda

    return cuda.CUstream(0)


@functools.lru_cache(maxsize=None)
def device_properties(device: torch.device):
    """torch.cuda.get_device_properties(device), read once per device: a device's properties do
    not change while the process runs, and validate_inputs and the runners ask on every call."""
    return torch.cuda.get_device_properties(device)


def current_stream(device):
    from cuda.bindings import driver as cuda

    return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)


def ids_bytes(topk_ids: torch.Tensor) -> int:
    return topk_ids.element_size()


def routing(ids_nbytes: int):
    from cutlass import Int32, Int64

    from .routing import RoutingKernel, RoutingTables

    z = Int64(0)
    return compiled(("routing", ids_nbytes), lambda: compile_kernel(
        RoutingKernel(ids_nbytes), z, Int32(1), Int32(0), Int32(1), Int32(8), z, z,
        example(RoutingTables), example_stream()))


def routing_split(ids_nbytes: int):
    """The split routing path's (histogram, scan, scatter) kernels (see routing.py)."""
    from cutlass import Int32, Int64

    from .routing import RoutingScan, RoutingSlices, RoutingTables

    z = Int64(0)
    one = Int32(1)
    passes = [compiled(("routing_split", scatter, ids_nbytes), lambda scatter=scatter: compile_kernel(
        RoutingSlices(ids_nbytes, scatter), z, one, Int32(0), one, one, z, z, z, example_stream()))
        for scatter in (False, True)]
    scan = compiled(("routing_split", "scan"), lambda: compile_kernel(
        RoutingScan(), z, one, one, Int32(8), example(RoutingTables), example_stream()))
    return passes[0], scan, passes[1]


def routing_tables(counts, tiles, num_tiles):
    """The routing kernels' RoutingTables bundle over the tables' tensors (counts [E], tiles
    [3, capacity], num_tiles [1]; int32)."""
    from .routing import RoutingTables

    return operands(RoutingTables, counts=counts.data_ptr(), tile_expert=tiles[0].data_ptr(),
                    tile_start=tiles[1].data_ptr(), tile_end=tiles[2].data_ptr(),
                    num_tiles=num_tiles.data_ptr())


def route(ids, pairs: int, expert_offset: int, experts: int, bn: int, order, slots, counts,
          tiles, num_tiles, hist, stream):
    """Routing tables (see routing.py) on `stream`: the one-CTA kernel for small batches, the
    split path over routing.split_ctas(pairs) CTAs otherwise. ids: topk_ids (contiguous);
    order/slots/counts/num_tiles: int32 tensors; tiles: int32 [3, capacity]; hist: int32
    [routing.MAX_SPLIT_CTAS + 1, experts] scratch."""
    from .routing import split_ctas

    idb = ids.element_size()
    tables = routing_tables(counts, tiles, num_tiles)
    ctas = split_ctas(pairs)
    if ctas == 0:
        routing(idb)(ids.data_ptr(), pairs, expert_offset, experts, bn, order.data_ptr(),
                     slots.data_ptr(), tables, stream)
        return
    histogram, scan, scatter = routing_split(idb)
    histogram(ids.data_ptr(), pairs, expert_offset, experts, ctas, hist.data_ptr(), 0, 0, stream)
    scan(hist.data_ptr(), ctas, experts, bn, tables, stream)
    scatter(ids.data_ptr(), pairs, expert_offset, experts, ctas, hist.data_ptr(),
            order.data_ptr(), slots.data_ptr(), stream)


def topk_reduce(ids_nbytes: int, paired: int, weighted: bool):
    """The top-k reduce; paired: the block of y's paired column order (moe_common.cute.topk_reduce),
    16 or 32; weighted: it multiplies each route by its router weight (else the GEMM has)."""
    from cutlass import Int32, Int64

    from .topk_reduce import TopkReduce

    z = Int64(0)
    return compiled(("topk_reduce", ids_nbytes, paired, weighted), lambda: compile_kernel(
        TopkReduce(ids_nbytes, paired, weighted), z, z, z, z, Int32(1), Int32(1), Int32(8),
        Int32(0), Int32(1), example_stream()))
