"""A kernel's shared memory declared as a cute.struct (the CuTe DSL's SharedStorage).

The kernels address shared memory by 32-bit addresses in inline PTX, so they need each
region's byte offset from the buffer's base; the struct computes them (natural alignment of
each field, `cute.struct.Align` where a region needs more). Region sizes may depend on the
kernel's config, so the struct is built per kernel instance from a field dict. The struct's
own size pads to its alignment; a last zero-size field marks the bytes used.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass.cute as cute


class SharedStorage(NamedTuple):
    struct: type  # the cute.struct
    offsets: dict  # field name -> byte offset from the buffer's base


def shared_storage(name: str, fields: dict) -> SharedStorage:
    """fields: name -> a cute.struct field type (MemRange, Align[...], or a scalar), in order."""
    struct = cute.struct(type(name, (), {"__annotations__": dict(fields)}))
    # the DSL computes the offsets while building the struct; nvidia-cutlass-dsl 4.8 keeps
    # them in `_offsets` and has no public accessor
    return SharedStorage(struct, dict(struct._offsets))
