"""Host side of moe-generic: weight preparation, compile cache and the layer call.

A call is: routing (torch ops on the device) -> [w4a4: NVFP4/MXFP4 quantization of the routed
token rows] -> FC1 grouped GEMM (+ activation) -> [w4a4: quantization of the intermediate] ->
FC2 grouped GEMM (+ router weight) into y[pair, H] fp32 -> sum over top-k -> bf16 out.
Every step is asynchronous on the current stream; nothing syncs with the host, so the call can
be captured in a CUDA graph once its kernels are compiled and its workspace allocated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from moe_common.formats import get_format
from moe_common.fragments import (
    TILE_K, gated_row_order, pad_gated, pad_rows, repack_codes, repack_scales,
)
from moe_common.types import Activation
from moe_common.weights import MoEWeights

from .routing import route

from .limits import KERNEL_NAME
BN_CHOICES = (8, 16, 32, 64)
ROW_TILE = 128  # CTA rows (4 warps x 2 groups x 16); FC1 and FC2 rows are padded to it


def _round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


@dataclass
class Prepared:
    """Weights of one layer in fragment order (see moe_common.fragments), on the device."""

    hidden: int
    intermediate: int
    hidden_padded: int
    intermediate_padded: int
    gated: bool
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w13_bias: torch.Tensor  # fp32 [E, N1p] (zeros without bias), in blob row order
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w2_bias: torch.Tensor  # fp32 [E, Hp]
    fc1_alpha: dict  # quant_mode -> fp32 [E]: weight scale_2 (x input_scale in w4a4)
    fc2_alpha: dict

    @property
    def fc1_rows(self) -> int:
        return self.w13.shape[1] * 16

    @property
    def fc2_rows(self) -> int:
        return self.w2.shape[1] * 16


def prepare(weights: MoEWeights) -> Prepared:
    cached = weights.kernel_cache.get(KERNEL_NAME)
    if cached is not None:
        return cached
    fmt = get_format(weights.weight_format)
    E, H, I = weights.num_local_experts, weights.hidden, weights.intermediate
    Hp, Ip = _round_up(H, TILE_K), _round_up(I, TILE_K)
    dev = weights.device
    w13, s13 = weights.w13, weights.w13_scale.view(torch.uint8)
    b13 = weights.w13_bias.float() if weights.w13_bias is not None else \
        torch.zeros(E, w13.shape[1], dtype=torch.float32, device=dev)
    if weights.gated:
        order = gated_row_order(I, Ip).to(dev)
        w13, s13, b13 = (pad_gated(t, I, Ip)[:, order] for t in (w13, s13, b13))
    else:
        w13, s13, b13 = (pad_rows(t, ROW_TILE) for t in (w13, s13, b13))
    b2 = weights.w2_bias.float() if weights.w2_bias is not None else \
        torch.zeros(E, H, dtype=torch.float32, device=dev)
    # Activation global scales exist for NVFP4 only (MXFP4 activations carry e8m0 block scales).
    one = torch.ones(E, dtype=torch.float32, device=dev)
    nv = weights.weight_format == "nvfp4"
    in_s = weights.input_scale.float() if nv and weights.input_scale is not None else one
    fc2_s = weights.fc2_input_scale.float() if nv and weights.fc2_input_scale is not None else one
    s2_13, s2_2 = weights.w13_scale_2.float(), weights.w2_scale_2.float()
    prep = Prepared(
        hidden=H, intermediate=I, hidden_padded=Hp, intermediate_padded=Ip, gated=weights.gated,
        w13=repack_codes(w13, ROW_TILE), w13_scale=repack_scales(s13, fmt.block_size, ROW_TILE),
        w13_bias=pad_rows(b13, ROW_TILE),
        w2=repack_codes(weights.w2, ROW_TILE),
        w2_scale=repack_scales(weights.w2_scale.view(torch.uint8), fmt.block_size, ROW_TILE),
        w2_bias=pad_rows(b2, ROW_TILE),
        # w4a4 activations are stored as q * block_scale (exact in bf16); their global scale
        # joins the weight's in the fp32 epilogue, as a Blackwell W4A4 kernel's alpha does.
        fc1_alpha={"w4a16": s2_13.contiguous(), "w4a4": (s2_13 * in_s).contiguous()},
        fc2_alpha={"w4a16": s2_2.contiguous(), "w4a4": (s2_2 * fc2_s).contiguous()},
    )
    weights.kernel_cache[KERNEL_NAME] = prep
    return prep


def pick_bn(pairs: int, local_experts: int) -> int:
    """Tokens per tile from the mean rows per expert (decode: 8, prefill: 64)."""
    mean = pairs / max(1, min(local_experts, pairs))
    for bn in BN_CHOICES[:-1]:
        if mean <= bn:
            return bn
    return BN_CHOICES[-1]


def _quantize_rows(v: torch.Tensor, fmt, gs: torch.Tensor | None) -> torch.Tensor:
    """Rows of v quantized to 4 bits and returned as q * block_scale in bf16 (exact)."""
    packed, scales = fmt.quantize(v.float(), gs)
    return fmt.dequantize(packed, scales).to(torch.bfloat16)


class _Buffers:
    def __init__(self, workspace, device):
        self.ws, self.dev = workspace, device

    def get(self, name, shape, dtype):
        if self.ws is not None:
            return self.ws.get(f"{KERNEL_NAME}.{name}", shape, dtype, self.dev)
        return torch.empty(shape, dtype=dtype, device=self.dev)


def run(x, weights: MoEWeights, topk_weights, topk_ids, *, activation: Activation,
        quant_mode: str = "w4a16", out=None, workspace=None, deterministic: bool = True):
    """The layer call. Always deterministic (each output element has one writer, fixed sum order)."""
    from . import compile_cache

    prep = prepare(weights)
    T, k = topk_ids.shape
    P = T * k
    E = weights.num_local_experts
    dev = x.device
    fmt = get_format(weights.weight_format)
    bufs = _Buffers(workspace, dev)
    bn = pick_bn(P, E)
    rt = route(topk_ids, weights.local_expert_offset, E, bn)
    if rt.max_tiles > 65535:
        raise ValueError(f"routing: {rt.max_tiles} tiles exceed the grid limit 65535")

    # FC1 B rows: token rows of x (w4a16) or per-pair quantized rows (w4a4)
    if quant_mode == "w4a4":
        tok = torch.arange(P, device=dev) // k
        gs = None
        if weights.weight_format == "nvfp4":
            local = topk_ids.reshape(-1).to(torch.int64) - weights.local_expert_offset
            gs = weights.input_scale.float()[local.clamp(0, E - 1)]
        src = bufs.get("xq", (P, prep.hidden), torch.bfloat16)
        src.copy_(_quantize_rows(x[tok], fmt, gs))
        row_src = rt.order
    else:
        src = x
        row_src = (rt.order // k).to(torch.int32)

    inter = bufs.get("inter", (P, prep.intermediate_padded), torch.bfloat16)
    y = bufs.get("y", (P, prep.hidden), torch.float32)
    route_w = topk_weights.reshape(-1).float()
    stream = compile_cache.current_stream(dev)
    Hp, Ip = prep.hidden_padded, prep.intermediate_padded
    limit = activation.limit if activation.limit is not None else math.inf

    fc1 = compile_cache.get("fc1", weights.weight_format, activation.name, bn)
    fc1(prep.w13.data_ptr(), prep.w13_scale.data_ptr(), prep.fc1_alpha[quant_mode].data_ptr(),
        prep.w13_bias.data_ptr(), rt.tile_expert.data_ptr(), rt.tile_start.data_ptr(),
        rt.tile_end.data_ptr(), rt.num_tiles.data_ptr(), row_src.data_ptr(), src.data_ptr(),
        src.stride(0), prep.hidden, Hp // TILE_K, prep.fc1_rows // 16,
        inter.data_ptr(), Ip, Ip, 0, 0, activation.alpha, activation.beta, limit,
        prep.fc1_rows // 128, rt.max_tiles, stream)

    if quant_mode == "w4a4":
        gs = None
        if weights.weight_format == "nvfp4":
            gs = weights.fc2_input_scale.float()[rt.expert_of_sorted.clamp(max=E - 1)]
        inter.copy_(_quantize_rows(inter, fmt, gs))

    fc2 = compile_cache.get("fc2", weights.weight_format, "none", bn)
    fc2(prep.w2.data_ptr(), prep.w2_scale.data_ptr(), prep.fc2_alpha[quant_mode].data_ptr(),
        prep.w2_bias.data_ptr(), rt.tile_expert.data_ptr(), rt.tile_start.data_ptr(),
        rt.tile_end.data_ptr(), rt.num_tiles.data_ptr(), rt.order.data_ptr(), inter.data_ptr(),
        Ip, Ip, Ip // TILE_K, prep.fc2_rows // 16,
        y.data_ptr(), prep.hidden, prep.hidden, rt.order.data_ptr(), route_w.data_ptr(),
        1.0, 1.0, math.inf, prep.fc2_rows // 128, rt.max_tiles, stream)

    if out is None:
        out = torch.empty(T, prep.hidden, dtype=torch.bfloat16, device=dev)
    yv = torch.where(rt.valid.view(T, k, 1), y.view(T, k, prep.hidden), 0.0)
    out.copy_(yv.sum(dim=1))
    return out
