"""Activations of the FC1 epilogue, in fp32, exactly as DESIGN section 5 (device side).

Gated activations take gate g and up u of the same intermediate column; the kernels' weight
layout (moe_common.fragments.gated_row_order) puts them in the same lane. Trace-time helpers:
`name` is static, alpha / beta / limit are run-time values (limit = +inf disables the clamp).
"""
from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32


def gated(name: str, g, u, alpha, beta, limit):
    if name == "silu":
        return g / (Float32(1.0) + cute.math.exp(-g, fastmath=False)) * u
    if name == "gelu_tanh":
        z = Float32(1.5957691216057308) * (g + Float32(0.044715) * g * g * g)
        return g / (Float32(1.0) + cute.math.exp(-z, fastmath=False)) * u
    if name == "swigluoai":
        # min/max with limit = +inf (limit=None) are identities
        g = cute.arch.fmin(g, limit)
        u = cute.arch.fmax(cute.arch.fmin(u, limit), -limit)
        return g / (Float32(1.0) + cute.math.exp(-(alpha * g), fastmath=False)) * (u + beta)
    raise ValueError(f"not a gated activation: {name!r}")


def relu2(v):
    a = cute.arch.fmax(v, Float32(0.0))
    return a * a
