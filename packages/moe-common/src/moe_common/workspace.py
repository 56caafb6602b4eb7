"""Preallocated device buffers that a runner reuses call after call.

A runner asks for buffers by name; the first (warm-up) call allocates them at the size it
needs. Once `freeze()` is called (FusedMoE does so after its warm-up at max_tokens), asking for
a buffer that is missing or too small is an error instead of an allocation, so a captured CUDA
graph can never see a new allocation.

Buffers asked for `zeroed` (counters that every launch leaves at zero: moe-gated's work queues
and per-tile counts, moe-static's grid barrier) are remembered, so `rezero()` can restore them
after a call that did not finish (FusedMoE calls it when a runner raises between launches).
"""
from __future__ import annotations

import math

import torch


def _device(device) -> torch.device:
    """The device a tensor allocated on `device` reports: "cuda" means the current CUDA device
    (a tensor's device always carries its index, so "cuda" never equals it as given)."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


class Workspace:
    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}
        self._zeroed: set = set()
        self.frozen = False

    def get(self, name: str, shape, dtype: torch.dtype, device, zeroed: bool = False) -> torch.Tensor:
        """The named buffer; `zeroed` buffers are zero-filled when allocated (only then: their
        users must leave them zero, as a grid barrier's counter does)."""
        numel = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != _device(device):
            if self.frozen:
                raise RuntimeError(
                    f"workspace buffer {name!r} {tuple(shape)} {dtype} is not preallocated; "
                    "the call is larger than the max_tokens this workspace was built for"
                )
            buf = (torch.zeros if zeroed else torch.empty)(numel, dtype=dtype, device=device)
            self._buffers[name] = buf
            if zeroed:
                self._zeroed.add(name)
        return buf[:numel].view(shape)

    def rezero(self):
        """Zero every `zeroed` buffer again (on the current stream)."""
        for name in self._zeroed:
            self._buffers[name].zero_()

    def freeze(self):
        self.frozen = True

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())
