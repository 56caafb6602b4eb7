"""The device epilogue's activations (moe_common.cute.activation) value by value against
moe_common.activations (issue 31, item 16).

A layer test cannot see an activation's small errors (GELU with erf instead of tanh is 1.7e-3
relative L2 on a layer, under the 1e-2 bar) nor a clamp that its data never reaches, so a tiny
kernel applies the device formulas to a grid of gate / up values reaching far past the
swigluoai limit, and each result must match the reference formula to 1e-5 relative (the
hardware exp2 / reciprocal are good to ~2^-22). It compiles on the CPU; the values are checked
on an sm_90 GPU.
"""
from __future__ import annotations

import pytest
import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from moe_common.activations import apply_activation
from moe_common.cute import activation, jit, ptx
from moe_common.types import ACTIVATIONS, Activation

THREADS = 256
CASES = [Activation("silu"), Activation("gelu_tanh"), Activation("relu2"),
         Activation("swigluoai"), Activation("swigluoai", 1.5, 0.5, 2.0),
         Activation("swigluoai", limit=None)]


class Elementwise:
    """out[i] = act(g[i], u[i]) with the epilogue's device formulas (relu2: of g[i])."""

    def __init__(self, name: str):
        self.name = name

    @cute.jit
    def __call__(self, g: Int64, u: Int64, out: Int64, n: Int32, alpha: Float32, beta: Float32,
                 limit: Float32, stream):
        self.kernel(g, u, out, n, alpha, beta, limit).launch(
            grid=[(n + THREADS - 1) // THREADS, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, g: Int64, u: Int64, out: Int64, n: Int32, alpha: Float32, beta: Float32,
               limit: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * THREADS + tidx
        if i < n:
            gv = ptx.ld_nc_f32(g + Int64(i) * 4)
            if cutlass.const_expr(self.name == "relu2"):
                r = activation.relu2(gv)
            else:
                uv = ptx.ld_nc_f32(u + Int64(i) * 4)
                r = activation.gated(self.name, gv, uv, alpha, beta, limit)
            ptx.st_f32(out + Int64(i) * 4, r)


def _compiled(name: str):
    z = Int64(0)
    return jit.compiled(("test-activation", name), lambda: jit.compile_kernel(
        Elementwise(name), z, z, z, Int32(1), Float32(1.0), Float32(1.0), Float32(1.0),
        jit.example_stream()))


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_device_activation_compiles(name):
    assert _compiled(name) is not None


def _grid():
    """Every pair of 161 values in [-20, 20] (past the default limit 7 on both sides)."""
    v = torch.linspace(-20, 20, 161)
    g, u = torch.meshgrid(v, v, indexing="ij")
    return g.reshape(-1).contiguous(), u.reshape(-1).contiguous()


@pytest.mark.gpu
@pytest.mark.parametrize("act", CASES, ids=lambda a: f"{a.name}-{a.alpha}-{a.beta}-{a.limit}")
def test_device_activation_matches_the_reference_value_by_value(act):
    g, u = (t.cuda() for t in _grid())
    out = torch.full_like(g, float("nan"))
    limit = float("inf") if act.limit is None else act.limit
    _compiled(act.name)(g.data_ptr(), u.data_ptr(), out.data_ptr(), g.numel(), act.alpha,
                        act.beta, limit, jit.current_stream(g.device))
    torch.cuda.synchronize()
    h = g[:, None] if act.name == "relu2" else torch.stack([g, u], dim=1)
    want = apply_activation(h, act).reshape(-1)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
