"""A CuTe DSL kernel that dequantizes 4-bit weights (canonical layout) to bf16 on the GPU.

Each thread decodes 8 consecutive values of one row: one 4-byte load of codes, one scale byte,
`decode_e2m1x8` and a bf16x2 multiply per register (e2m1 x block scale is exact in bf16), then
the per-expert fp32 global scale in fp32 and one rounding to bf16 per value: bit-identical to
`MoEWeights.dequantize()` (fp32) rounded to bf16. One 16-byte store per thread.
"""
from __future__ import annotations

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64

from ..types import WEIGHT_FORMATS
from . import ptx
from .decode import decode_e2m1x8, mxfp4_scale_pair, nvfp4_scale_pair

THREADS = 256


class Dequantize:
    """Compiled once per format: [E, N, K] codes -> [E, N, K] bf16."""

    def __init__(self, weight_format: str):
        assert weight_format in WEIGHT_FORMATS
        self.weight_format = weight_format
        self.block = 16 if weight_format == "nvfp4" else 32

    @cute.jit
    def __call__(self, codes: Int64, scales: Int64, gscale: Int64, out: Int64, rows: Int32,
                 rows_per_expert: Int32, k: Int32, stream):
        items = rows * (k // 8)
        grid = (items + THREADS - 1) // THREADS
        self.kernel(codes, scales, gscale, out, items, rows_per_expert, k).launch(
            grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, codes: Int64, scales: Int64, gscale: Int64, out: Int64, items: Int32,
               rows_per_expert: Int32, k: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * THREADS + tidx
        if i < items:
            groups = k // 8
            row = i // groups
            k0 = (i - row * groups) * 8
            w = ptx.ld_nc_u32(codes + Int64(row) * Int64(k // 2) + Int64(k0 // 2))
            sidx = Int64(row) * Int64(k // self.block) + Int64(k0 // self.block)
            sword = ptx.ld_nc_u32(scales + (sidx & Int64(-4)))
            sword = sword >> (Int32(sidx & Int64(3)) * 8)  # wanted scale byte -> byte 0
            if cutlass.const_expr(self.weight_format == "nvfp4"):
                s = nvfp4_scale_pair(sword, 0)
            else:
                s = mxfp4_scale_pair(sword, 0)
            gs = ptx.ld_nc_f32(gscale + Int64(row // rows_per_expert) * 4)
            v = decode_e2m1x8(w)
            res = []
            for j in cutlass.range_constexpr(4):
                qs = ptx.mul_bf16x2(v[j], s)
                res.append(ptx.bf16x2_from_f32(ptx.bf16_lo_to_f32(qs) * gs, ptx.bf16_hi_to_f32(qs) * gs))
            ptx.st_v4(out + (Int64(row) * Int64(k) + Int64(k0)) * 2, res[0], res[1], res[2], res[3])


_compiled: dict = {}


def compile_dequantize(weight_format: str):
    fn = _compiled.get(weight_format)
    if fn is None:
        from cuda.bindings import driver as cuda

        z = Int64(0)
        fn = cute.compile(Dequantize(weight_format), z, z, z, z, Int32(1), Int32(1), Int32(8),
                          cuda.CUstream(0), options="--gpu-arch=sm_90a")
        _compiled[weight_format] = fn
    return fn


def _dequant_one(codes: torch.Tensor, scales: torch.Tensor, gscale: torch.Tensor, fmt: str):
    from cuda.bindings import driver as cuda

    E, N, half_k = codes.shape
    K = half_k * 2
    out = torch.empty(E, N, K, dtype=torch.bfloat16, device=codes.device)
    codes, scales = codes.contiguous(), scales.contiguous().view(torch.uint8)
    gscale = gscale.float().contiguous()
    stream = cuda.CUstream(torch.cuda.current_stream(codes.device).cuda_stream)
    compile_dequantize(fmt)(codes.data_ptr(), scales.data_ptr(), gscale.data_ptr(), out.data_ptr(),
                            E * N, N, K, stream)
    return out


def dequantize_weights(weights) -> tuple:
    """(w13, w2) of a MoEWeights on a CUDA device, dequantized to bf16 by the DSL kernel."""
    if weights.device.type != "cuda":
        raise ValueError(f"weights: on {weights.device}; the DSL dequantizer needs a CUDA device")
    fmt = weights.weight_format
    return (_dequant_one(weights.w13, weights.w13_scale, weights.w13_scale_2, fmt),
            _dequant_one(weights.w2, weights.w2_scale, weights.w2_scale_2, fmt))
