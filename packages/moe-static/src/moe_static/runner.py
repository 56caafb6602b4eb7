"""Host side of moe-static: one cooperative launch per layer call.

Weights are the shared fragment repack (moe_common.packed, cached per layer and shared with the
other kernels). Workspace: the bf16 intermediate [T * k, Ip], the fp32 routed FC2 outputs
[T * k, H] and the grid barrier's two counters (zeroed once, left zero by every launch).
Nothing syncs with the host.
"""
from __future__ import annotations

import math

import torch

from moe_common.cute import jit
from moe_common.fragments import TILE_K
from moe_common.kernel_package import Buffers
from moe_common.packed import pack
from moe_common.types import Activation
from moe_common.weights import MoEWeights

from .compile_cache import get
from .limits import KERNEL_NAME


def _grid(device) -> int:
    # One CTA of 16 warps per SM (its per-warp rings take ~200 KB of shared memory); a
    # cooperative launch needs every CTA resident.
    return torch.cuda.get_device_properties(device).multi_processor_count


def workspace_bytes(tokens: int, top_k: int, hidden: int, intermediate: int) -> int:
    """Bytes of workspace a call at T = tokens needs (intermediate and routed outputs)."""
    ip = -(-intermediate // TILE_K) * TILE_K
    return tokens * top_k * (ip * 2 + hidden * 4)


def run(x, weights: MoEWeights, topk_weights, topk_ids, *, activation: Activation,
        quant_mode: str = "w4a16", out=None, workspace=None, deterministic: bool = True):
    """The layer call in one launch. Always deterministic: each output element is summed by one
    thread in a fixed order (`deterministic` is accepted for the common runner signature)."""
    if quant_mode != "w4a16":
        raise ValueError(f"{KERNEL_NAME}: quant_mode={quant_mode!r}; allowed: 'w4a16'")
    prep = pack(weights)
    T, k = topk_ids.shape
    P = T * k
    H = prep.hidden
    dev = x.device
    ip = prep.intermediate_padded

    bufs = Buffers(KERNEL_NAME, workspace, dev)
    inter = bufs.get("inter", (P * ip,), torch.bfloat16)
    y = bufs.get("y", (P * H,), torch.float32)
    barrier = bufs.get("barrier", (2,), torch.int32, zeroed=True)
    if out is None:
        out = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.contiguous() if not x.is_contiguous() else x.clone()  # rows copied by 16-byte bulk copies
    ids = topk_ids.contiguous()
    route_w = topk_weights if topk_weights.dtype == torch.float32 else topk_weights.float()
    route_w = route_w.contiguous()
    limit = activation.limit if activation.limit is not None else math.inf
    _, kernel = get(weights.weight_format, activation.name, ids.element_size())
    kernel(prep.w13.data_ptr(), prep.w13_scale.data_ptr(), prep.fc1_alpha[quant_mode].data_ptr(),
           prep.w13_bias.data_ptr(), prep.w2.data_ptr(), prep.w2_scale.data_ptr(),
           prep.fc2_alpha[quant_mode].data_ptr(), prep.w2_bias.data_ptr(),
           ids.data_ptr(), route_w.data_ptr(), x.data_ptr(), x.stride(0),
           T, k, weights.local_expert_offset, weights.num_local_experts,
           H, prep.hidden_padded // TILE_K, prep.fc1_rows // 16, prep.fc2_rows // 16, ip // TILE_K,
           inter.data_ptr(), y.data_ptr(), out.data_ptr(), barrier.data_ptr(),
           activation.alpha, activation.beta, limit, _grid(dev), jit.current_stream(dev))
    return out
