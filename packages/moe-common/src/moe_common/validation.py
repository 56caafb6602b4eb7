"""Input validation shared by the dispatcher, the reference and every kernel.

`validate_inputs` makes cheap host-side checks only (shapes, dtypes, devices, contiguity,
alignment, consistency with the weights): it reads no tensor values but an MXFP4 layer's block
scales, once per weights version (`describe`: packed.unpackable_reason, one host sync on the
first call with new weights), so afterwards it is safe to call while a CUDA graph is being
captured. Routed ids are not range-checked: ids outside this layer's local expert range
contribute nothing, by contract.

Each rule raises its own ValueError naming the argument, what it got and what is allowed.
"""
from __future__ import annotations

from typing import Optional

import torch

from .cute import jit
from .types import QUANT_MODES, WEIGHT_FORMATS, Activation, MoEShape
from . import weights as _weights  # module, not class: tolerates weights.py importing us

ALIGNMENT_BYTES = 16
ID_DTYPES = (torch.int32, torch.int64)
ROUTER_WEIGHT_DTYPES = (torch.float32, torch.bfloat16)


def _fail(msg: str):
    raise ValueError(msg)


def _is_aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % ALIGNMENT_BYTES == 0


def check_quant_mode(quant_mode: str, weights) -> None:
    """quant_mode is known, and w4a4 on NVFP4 weights has both activation global scales."""
    if quant_mode not in QUANT_MODES:
        _fail(f"quant_mode: got {quant_mode!r}; allowed: {', '.join(QUANT_MODES)}")
    if quant_mode == "w4a4" and weights.weight_format == "nvfp4":
        missing = [n for n in ("input_scale", "fc2_input_scale") if getattr(weights, n) is None]
        if missing:
            _fail(
                f"quant_mode: 'w4a4' on NVFP4 weights needs the activation global scales, but "
                f"weights.{' and weights.'.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                "None; pass input_scale= and fc2_input_scale= to MoEWeights.quantize (or the "
                "checkpoint's values to its constructor), or call weights.calibrate(x) on "
                "representative inputs first"
            )


def _as_activation(activation) -> Activation:
    if isinstance(activation, Activation):
        return activation
    if isinstance(activation, str):
        return Activation(activation)  # raises ValueError naming `activation` for unknown names
    _fail(
        f"activation: got {type(activation).__name__}; allowed: an Activation or one of its names"
    )


def _check_dense_on(dev, name: str, t: torch.Tensor) -> None:
    """x and out: on the weights' device, contiguous, and aligned for the kernels' vector loads."""
    if t.device != dev:
        _fail(f"{name}: got device {t.device}; allowed: the weights' device {dev}")
    if not t.is_contiguous():
        _fail(f"{name}: got a non-contiguous tensor (strides {t.stride()}); allowed: contiguous (call .contiguous())")
    if not _is_aligned(t):
        _fail(
            f"{name}: got data_ptr % {ALIGNMENT_BYTES} = {t.data_ptr() % ALIGNMENT_BYTES}; allowed: "
            f"{ALIGNMENT_BYTES}-byte aligned (an offset view of a larger tensor? use .clone())"
        )


def validate_inputs(
    x: torch.Tensor,
    weights: "_weights.MoEWeights",
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: Activation,
    quant_mode: str,
    out: Optional[torch.Tensor] = None,
    min_tokens: int = 1,
) -> MoEShape:
    """Check one fused-MoE call and describe it as a MoEShape (no host sync, no value reads).

    `min_tokens=0` accepts an empty batch (FusedMoE returns an empty view for it) with every
    other rule applied as usual."""
    # --- weights --------------------------------------------------------------------------
    if not isinstance(weights, _weights.MoEWeights):
        _fail(f"weights: got {type(weights).__name__}; allowed: moe_common.MoEWeights")
    if weights.weight_format not in WEIGHT_FORMATS:
        _fail(
            f"weights.weight_format: got {weights.weight_format!r}; "
            f"allowed: {', '.join(WEIGHT_FORMATS)}"
        )
    dev = weights.device
    hidden, inter = weights.hidden, weights.intermediate
    n1 = weights.w13.shape[1]
    if weights.w13.dim() != 3 or weights.w2.dim() != 3 or weights.w13.shape[0] != weights.w2.shape[0]:
        _fail(
            f"weights: w13 {tuple(weights.w13.shape)} and w2 {tuple(weights.w2.shape)} must be "
            "[E_local, N1, H/2] and [E_local, H, I/2] with the same E_local"
        )
    if weights.w13.shape[2] * 2 != hidden:
        _fail(
            f"weights.w13: got {tuple(weights.w13.shape)}; its last dim must be H/2 = {hidden // 2} "
            f"(H = {hidden} from w2)"
        )

    # --- activation (known name, consistent with the weights) -----------------------------
    activation = _as_activation(activation)
    want_n1 = 2 * inter if activation.gated else inter
    if n1 != want_n1:
        kind = "gated: needs [gate; up] = 2I" if activation.gated else "non-gated: needs I"
        _fail(
            f"activation: got {activation.name!r} ({kind} = {want_n1} rows in weights.w13), but "
            f"weights.w13 has {n1} rows (I = {inter}); allowed with these weights: "
            + ("relu2" if n1 == inter else "silu, gelu_tanh, swigluoai")
        )

    # --- quant mode ------------------------------------------------------------------------
    check_quant_mode(quant_mode, weights)

    # --- x ---------------------------------------------------------------------------------
    if not isinstance(x, torch.Tensor):
        _fail(f"x: got {type(x).__name__}; allowed: a torch.Tensor [T, H] bf16")
    if x.dim() != 2:
        _fail(f"x: got a {x.dim()}-D tensor {tuple(x.shape)}; allowed: 2-D [T, H]")
    if x.dtype != torch.bfloat16:
        _fail(f"x: got dtype {x.dtype}; allowed: torch.bfloat16")
    tokens = x.shape[0]
    if tokens < min_tokens:
        _fail(f"x: got T = {tokens} tokens; allowed: T >= {min_tokens}")
    if x.shape[1] != hidden:
        _fail(f"x: got hidden size {x.shape[1]} (shape {tuple(x.shape)}); allowed: H = {hidden} (weights.hidden)")
    _check_dense_on(dev, "x", x)

    # --- routing ---------------------------------------------------------------------------
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if not isinstance(t, torch.Tensor):
            _fail(f"{name}: got {type(t).__name__}; allowed: a torch.Tensor [T, k]")
        if t.dim() != 2:
            _fail(f"{name}: got a {t.dim()}-D tensor {tuple(t.shape)}; allowed: 2-D [T, k]")
    if topk_ids.dtype not in ID_DTYPES:
        _fail(f"topk_ids: got dtype {topk_ids.dtype}; allowed: torch.int32, torch.int64")
    if topk_weights.dtype not in ROUTER_WEIGHT_DTYPES:
        _fail(f"topk_weights: got dtype {topk_weights.dtype}; allowed: torch.float32, torch.bfloat16")
    if topk_ids.shape[0] != tokens:
        _fail(f"topk_ids: got {topk_ids.shape[0]} rows (shape {tuple(topk_ids.shape)}); allowed: T = {tokens} rows, as x")
    if topk_weights.shape[0] != tokens:
        _fail(
            f"topk_weights: got {topk_weights.shape[0]} rows (shape {tuple(topk_weights.shape)}); "
            f"allowed: T = {tokens} rows, as x"
        )
    top_k = topk_ids.shape[1]
    if topk_weights.shape[1] != top_k:
        _fail(
            f"topk_weights: top_k mismatch, got {topk_weights.shape[1]} columns while topk_ids has "
            f"{top_k}; allowed: the same k for both"
        )
    if top_k < 1:
        _fail(f"topk_ids: got top_k = {top_k}; allowed: top_k >= 1")
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if t.device != dev:
            _fail(f"{name}: got device {t.device}; allowed: the weights' device {dev}")
        if not t.is_contiguous():
            _fail(f"{name}: got a non-contiguous tensor (strides {t.stride()}); allowed: contiguous")

    # --- out -------------------------------------------------------------------------------
    if out is not None:
        if not isinstance(out, torch.Tensor):
            _fail(f"out: got {type(out).__name__}; allowed: None or a torch.Tensor [T, H] bf16")
        if out.dtype != torch.bfloat16:
            _fail(f"out: got dtype {out.dtype}; allowed: torch.bfloat16")
        if tuple(out.shape) != (tokens, hidden):
            _fail(f"out: got shape {tuple(out.shape)}; allowed: [T, H] = [{tokens}, {hidden}]")
        _check_dense_on(dev, "out", out)

    capability = None
    if x.is_cuda:
        props = jit.device_properties(x.device)
        capability = (props.major, props.minor)
    return describe(weights, tokens, top_k, quant_mode, capability, x.dtype)


def describe(weights, tokens: int, top_k: int, quant_mode: str, capability, dtype) -> MoEShape:
    """The MoEShape of a call on `weights` (weights_reason read once per weights version)."""
    from .packed import unpackable_reason  # packed imports weights, which imports this module

    return MoEShape(
        tokens=tokens,
        hidden=weights.hidden,
        intermediate=weights.intermediate,
        num_experts=weights.num_experts,
        num_local_experts=weights.num_local_experts,
        local_expert_offset=weights.local_expert_offset,
        top_k=top_k,
        weight_format=weights.weight_format,
        quant_mode=quant_mode,
        has_bias=weights.has_bias,
        device_capability=capability,
        dtype=dtype,
        weights_reason=unpackable_reason(weights) if capability is not None else None,
    )
