"""apply_activation vs independently written formulas (docs/DESIGN.md section 5)."""
import math

import pytest
import torch

from moe_common.activations import apply_activation
from moe_common.types import Activation


def _h(shape=(7, 2 * 24), scale=4.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


def test_silu_gate_first_then_up():
    h = _h()
    g, u = h[:, :24], h[:, 24:]
    want = g / (1.0 + torch.exp(-g)) * u
    got = apply_activation(h, Activation("silu"))
    assert got.shape == (7, 24) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # The split order matters: [up; gate] would give a different answer.
    swapped = u / (1.0 + torch.exp(-u)) * g
    assert not torch.allclose(got, swapped, rtol=1e-3, atol=1e-3)


def test_gelu_tanh_matches_tanh_formulation():
    h = _h(seed=1)
    g, u = h[:, :24], h[:, 24:]
    # The textbook form: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
    want = 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3))) * u
    got = apply_activation(h, Activation("gelu_tanh"))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # And torch's own tanh-approximated gelu agrees.
    torch.testing.assert_close(
        got, torch.nn.functional.gelu(g, approximate="tanh") * u, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("alpha,beta,limit", [(1.702, 1.0, 7.0), (1.5, 0.5, 2.0), (1.702, 1.0, None)])
def test_swigluoai(alpha, beta, limit):
    h = _h(scale=6.0, seed=2)  # plenty of values beyond the limit on both sides
    g, u = h[:, :24], h[:, 24:]
    if limit is not None:
        g2 = torch.where(g > limit, torch.full_like(g, limit), g)
        u2 = torch.where(u > limit, torch.full_like(u, limit), u)
        u2 = torch.where(u2 < -limit, torch.full_like(u2, -limit), u2)
    else:
        g2, u2 = g, u
    want = g2 / (1.0 + torch.exp(-alpha * g2)) * (u2 + beta)
    got = apply_activation(h, Activation("swigluoai", alpha=alpha, beta=beta, limit=limit))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_swigluoai_limit_none_really_disables_the_clamp():
    h = _h(scale=6.0, seed=3)
    assert h.abs().max() > 7.0
    clamped = apply_activation(h, Activation("swigluoai"))
    free = apply_activation(h, Activation("swigluoai", limit=None))
    assert not torch.allclose(clamped, free)
    # Gate is clamped only from above: very negative gates are untouched (silu-like tail -> 0).
    h2 = torch.tensor([[-20.0, 3.0]])
    torch.testing.assert_close(
        apply_activation(h2, Activation("swigluoai")),
        torch.tensor([[-20.0 / (1.0 + math.exp(1.702 * 20.0)) * 4.0]]),
    )


def test_relu2_non_gated():
    h = _h(shape=(3, 5, 16), seed=4)
    got = apply_activation(h, Activation("relu2"))
    assert got.shape == h.shape
    want = torch.where(h > 0, h * h, torch.zeros_like(h))
    torch.testing.assert_close(got, want)


def test_accepts_name_and_bf16_input_returns_fp32():
    h = _h(seed=5).to(torch.bfloat16)
    got = apply_activation(h, "silu")
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, apply_activation(h.float(), Activation("silu")))


def test_gated_needs_even_width():
    with pytest.raises(ValueError, match="h"):
        apply_activation(torch.zeros(2, 5), Activation("silu"))
