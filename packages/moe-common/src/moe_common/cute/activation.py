"""Activations of the FC1 epilogue, in fp32, the formulas of docs/DESIGN.md section 5 (device side).

Gated activations take gate g and up u of the same intermediate column; the kernels' weight
layout (moe_common.fragments.gated_row_order) puts them in the same lane. Trace-time helpers:
`name` is static, alpha / beta / limit are run-time values (limit = +inf disables the clamp).

The sigmoid is one hardware exp2 and one hardware reciprocal (ex2.approx, rcp.approx: ~2^-22
relative error, far below the bf16 rounding of the result). The IEEE exp and division took
~20 more instructions per value, a division slow-path call among them: 1248 more SASS
instructions in moe-gated's FC1 epilogue (NVFP4 silu, wide tile), which both consumer
warpgroups run while the tensor cores idle.
"""
from __future__ import annotations

import cutlass.cute as cute
from cutlass import Float32

_LOG2E = 1.4426950408889634


def _times_sigmoid(x, z):
    """x * sigmoid(z) = x / (1 + 2^(-z log2 e)). z -> -inf gives x * rcp(inf) = 0; NaN stays NaN."""
    e = cute.math.exp2(z * Float32(-_LOG2E), fastmath=True)
    return x * cute.arch.rcp_approx(Float32(1.0) + e)


def gated(name: str, g, u, alpha, beta, limit):
    if name == "silu":
        return _times_sigmoid(g, g) * u
    if name == "gelu_tanh":
        z = Float32(1.5957691216057308) * (g + Float32(0.044715) * g * g * g)
        return _times_sigmoid(g, z) * u
    if name == "swigluoai":
        # min/max with limit = +inf (limit=None) are identities
        g = cute.arch.fmin(g, limit)
        u = cute.arch.fmax(cute.arch.fmin(u, limit), -limit)
        return _times_sigmoid(g, alpha * g) * (u + beta)
    raise ValueError(f"not a gated activation: {name!r}")


def relu2(v):
    a = cute.arch.fmax(v, Float32(0.0))
    return a * a
