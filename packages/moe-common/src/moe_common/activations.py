"""The MoE activations in fp32, exactly as docs/DESIGN.md section 5 defines them.

Every kernel's epilogue must reproduce these formulas; the reference uses this module.
"""
from __future__ import annotations

import torch

from .types import Activation

# sqrt(8/pi): gelu_tanh(g) = g * sigmoid(2 * sqrt(2/pi) * (g + 0.044715 g^3)).
GELU_TANH_K = 1.5957691216057308
GELU_TANH_C = 0.044715


def apply_activation(h: torch.Tensor, act: Activation | str) -> torch.Tensor:
    """Apply `act` to FC1's output `h` (fp32 [..., N1]) and return fp32 [..., I].

    Gated activations (silu, gelu_tanh, swigluoai) read gate = h[..., :I] and up = h[..., I:]
    (N1 = 2I); relu2 is elementwise (N1 = I).
    """
    if isinstance(act, str):
        act = Activation(act)
    h = h.float()
    if act.name == "relu2":
        r = torch.clamp_min(h, 0.0)
        return r * r
    n1 = h.shape[-1]
    if n1 % 2:
        raise ValueError(
            f"h: gated activation {act.name!r} needs an even last dimension [gate; up]; got {n1}"
        )
    i = n1 // 2
    g, u = h[..., :i], h[..., i:]
    if act.name == "silu":
        return g * torch.sigmoid(g) * u
    if act.name == "gelu_tanh":
        return g * torch.sigmoid(GELU_TANH_K * (g + GELU_TANH_C * g * g * g)) * u
    if act.name == "swigluoai":
        if act.limit is not None:
            g = torch.clamp_max(g, act.limit)
            u = torch.clamp(u, -act.limit, act.limit)
        return g * torch.sigmoid(act.alpha * g) * (u + act.beta)
    raise ValueError(f"activation: got {act.name!r}; no formula")  # unreachable: Activation checks
