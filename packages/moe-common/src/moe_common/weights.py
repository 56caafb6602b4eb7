"""MoEWeights: the prepared 4-bit weights of one MoE layer, in the canonical layout.

Canonical layout (what every kernel and the reference read; kernels may cache their own repack
of it in `kernel_cache`):

  w13        uint8 [E_local, N1, H/2]   e2m1 codes, element 2i in the low nibble of byte i.
                                         N1 = 2I with rows [gate; up] for gated activations,
                                         N1 = I for relu2.
  w13_scale  NVFP4: float8_e4m3fn [E_local, N1, H/16];  MXFP4: uint8 (e8m0 bytes) [E_local, N1, H/32]
  w13_scale_2 float32 [E_local]          per-expert global scale (ModelOpt weight_scale_2); 1 for MXFP4
  w2         uint8 [E_local, H, I/2]
  w2_scale   as w13_scale, [E_local, H, I/bs]
  w2_scale_2 float32 [E_local]
  w13_bias   float32 [E_local, N1] or None
  w2_bias    float32 [E_local, H] or None
  input_scale      float32 [E_local] or None   NVFP4 activation global scale of FC1's input (w4a4)
  fc2_input_scale  float32 [E_local] or None   same for FC2's input (the activation output)
  local_expert_offset, num_experts: this object holds global experts
      [local_expert_offset, local_expert_offset + E_local) of num_experts.

Dequantized weight = e2m1(code) * scale * scale_2 (NVFP4) or e2m1(code) * 2^(byte-127) (MXFP4).
H and I must be multiples of the format's block size (16 / 32).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass(eq=False)
class MoEWeights:
    weight_format: str
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w13_scale_2: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w2_scale_2: torch.Tensor
    w13_bias: Optional[torch.Tensor] = None
    w2_bias: Optional[torch.Tensor] = None
    input_scale: Optional[torch.Tensor] = None
    fc2_input_scale: Optional[torch.Tensor] = None
    local_expert_offset: int = 0
    num_experts: Optional[int] = None
    # Kernel-private derived data (repacked weights, compiled handles), keyed by kernel name.
    kernel_cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.num_experts is None:
            self.num_experts = self.local_expert_offset + self.w13.shape[0]

    @property
    def num_local_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.w2.shape[1]

    @property
    def intermediate(self) -> int:
        return self.w2.shape[2] * 2

    @property
    def gated(self) -> bool:
        """True when w13 holds [gate; up] (2I rows); False for relu2 weights (I rows)."""
        return self.w13.shape[1] == 2 * self.intermediate

    @property
    def has_bias(self) -> bool:
        return self.w13_bias is not None or self.w2_bias is not None

    @property
    def device(self) -> torch.device:
        return self.w13.device
