"""The fp32 torch reference of the fused MoE layer (docs/DESIGN.md section 5).

This is the ground truth every kernel is tested against, and the dispatcher's last resort on
machines without a supported GPU. Per routed pair (t, j) with local expert
e = topk_ids[t, j] - local_expert_offset in [0, E_local) (other ids contribute nothing and are
never used to index anything):

    a = float(x[t])                               (w4a4: a = fake_quantize(a, input_scale[e]))
    h = a @ dequant(w13[e])^T (+ w13_bias[e])     fp32
    y = bf16(apply_activation(h))                 (w4a4: y = fake_quantize(y, fc2_input_scale[e]))
    z = y @ dequant(w2[e])^T (+ w2_bias[e])       fp32
    out[t] = bf16( sum_j float(topk_weights[t, j]) * z )

In w4a4, NVFP4 weights quantize activations to NVFP4 with the expert's global scale; MXFP4
weights quantize activations to MXFP4 (no global scale).

Two execution strategies, same math:

* gather (default): pairs are grouped by expert (nonzero/unique: a host sync), and only the
  experts that are hit are dequantized. Right for eager use and CPU.
* dense (``capturable=True``, chosen automatically while a CUDA graph is being captured): no
  host sync; every local expert processes all T tokens and routing masks select the
  contributions. Costs E_local x the FLOPs; meant for graph capture of the fallback path only.

Nothing is cached on the weights by default. With ``cache_dequantized=True`` the dense path
keeps the fp32 dequantized experts in ``weights.kernel_cache["reference"]``: that costs
4 * E_local * (N1*H + H*I) bytes (8x the 4-bit codes; e.g. 2.4 GB for one Qwen3-30B-A3B
layer), so use it only for small layers or tests, and make the first such call before a CUDA
graph capture (so the cache is not allocated from the graph's private pool).

Determinism: the dense path has no atomics; the gather path adds each expert group with
index_add_, which on CUDA is order-independent as long as a row of topk_ids has no repeated id
(routers never repeat one). The result is otherwise bitwise reproducible run to run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Union

import torch

from .activations import apply_activation
from .formats import FORMATS
from .types import Activation
from .validation import validate_inputs

if TYPE_CHECKING:  # weights.py may import this module (calibration); avoid the cycle
    from .weights import MoEWeights


def _format(weights: MoEWeights):
    return FORMATS[weights.weight_format]


def _dequant(weights: MoEWeights, which: str, idx) -> torch.Tensor:
    """fp32 dequantized w13 or w2 of the local experts `idx` (an int or a LongTensor)."""
    fmt = _format(weights)
    packed = getattr(weights, which)[idx]
    scales = getattr(weights, which + "_scale")[idx]
    scale_2 = getattr(weights, which + "_scale_2")[idx].float()
    gs = scale_2.unsqueeze(-1) if scale_2.dim() else scale_2  # broadcastable to packed.shape[:-1]
    # NVFP4: q * s * weight_scale_2. MXFP4: the e8m0 bytes carry the scale; scale_2 is 1 (exact).
    return fmt.dequantize(packed, scales, gs)


def _dense_weights(weights: MoEWeights, cache: bool):
    """(w13 fp32 [E,N1,H], w2 fp32 [E,H,I]) from the cache, or None when not caching."""
    if not cache:
        return None
    # Invalidated when a tensor is replaced or modified in place (torch bumps `_version`).
    tensors = [getattr(weights, n) for n in ("w13", "w13_scale", "w13_scale_2", "w2", "w2_scale", "w2_scale_2")]
    key = tuple((t.data_ptr(), t._version) for t in tensors)
    entry = weights.kernel_cache.get("reference")
    if entry is None or entry[0] != key:
        all_e = torch.arange(weights.num_local_experts, device=weights.device)
        entry = (key, _dequant(weights, "w13", all_e), _dequant(weights, "w2", all_e))
        weights.kernel_cache["reference"] = entry
    return entry[1], entry[2]


def _expert_forward(weights, e, a, w13_e, w2_e, activation, w4a4, fmt):
    """FC1 -> activation -> bf16 -> FC2 for fp32 rows `a` [n, H] of local expert e -> fp32 [n, H]."""
    nvfp4 = weights.weight_format == "nvfp4"
    if w4a4:
        a = fmt.fake_quantize(a, weights.input_scale[e].float() if nvfp4 else None)
    h = a @ w13_e.t()
    if weights.w13_bias is not None:
        h = h + weights.w13_bias[e].float()
    y = apply_activation(h, activation).to(torch.bfloat16).float()
    if w4a4:
        y = fmt.fake_quantize(y, weights.fc2_input_scale[e].float() if nvfp4 else None)
    z = y @ w2_e.t()
    if weights.w2_bias is not None:
        z = z + weights.w2_bias[e].float()
    return z


def reference_moe(
    x: torch.Tensor,
    weights: MoEWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: Union[Activation, str] = "silu",
    quant_mode: str = "w4a16",
    out: Optional[torch.Tensor] = None,
    capturable: bool = False,
    cache_dequantized: bool = False,
) -> torch.Tensor:
    """The fused MoE layer in fp32 torch; returns bf16 [T, H] (written into `out` if given).

    `capturable=True` (automatic while the current CUDA stream is capturing) selects the dense,
    host-sync-free strategy; both strategies compute the same math.
    """
    if isinstance(activation, str):
        activation = Activation(activation)
    validate_inputs(
        x, weights, topk_weights, topk_ids, activation=activation, quant_mode=quant_mode, out=out
    )
    capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
    fmt = _format(weights)
    w4a4 = quant_mode == "w4a4"
    T, H = x.shape
    k = topk_ids.shape[1]
    E = weights.num_local_experts
    acc = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    local = topk_ids.long() - weights.local_expert_offset  # [T, k]
    rw = topk_weights.float()

    if capturable or capturing:
        xf = x.float()
        cached = _dense_weights(weights, cache_dequantized)
        for e in range(E):
            hit = local == e  # [T, k]
            routed = hit.any(dim=1, keepdim=True)  # [T, 1]
            w = torch.where(hit, rw, 0.0).sum(dim=1, keepdim=True)  # [T, 1]
            if cached is not None:
                w13_e, w2_e = cached[0][e], cached[1][e]
            else:
                w13_e, w2_e = _dequant(weights, "w13", e), _dequant(weights, "w2", e)
            z = _expert_forward(weights, e, xf, w13_e, w2_e, activation, w4a4, fmt)
            # where, not multiply: tokens not routed here contribute exactly nothing (even inf/NaN).
            acc += torch.where(routed, w * z, 0.0)
    else:
        flat = local.reshape(-1)
        valid = (flat >= 0) & (flat < E)
        pairs = valid.nonzero().squeeze(1)  # host sync
        if pairs.numel():
            experts = flat[pairs]
            experts, order = torch.sort(experts, stable=True)
            pairs = pairs[order]
            uniq, counts = torch.unique_consecutive(experts, return_counts=True)
            rw_flat = rw.reshape(-1)
            start = 0
            for e, n in zip(uniq.tolist(), counts.tolist()):  # host sync
                p = pairs[start : start + n]
                start += n
                tok = p // k
                z = _expert_forward(
                    weights, e, x[tok].float(), _dequant(weights, "w13", e),
                    _dequant(weights, "w2", e), activation, w4a4, fmt,
                )
                # One add per (token, column) per launch unless a row repeats an id: deterministic.
                acc.index_add_(0, tok, z * rw_flat[p].unsqueeze(1))

    if out is None:
        return acc.to(torch.bfloat16)
    out.copy_(acc)
    return out
