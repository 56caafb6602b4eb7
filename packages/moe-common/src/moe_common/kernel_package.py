"""What every CuTe DSL kernel package shares: the common support checks, the plugin hook and
the direct call.

No DSL import here: a package's plugin and limits import this to answer `can_handle` cheaply.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Callable, NamedTuple, Optional

import torch

from .reference_plugin import hookimpl
from .types import Activation, Decline, Offer, make_activation
from .validation import validate_inputs


def hopper_reason(shape) -> Optional[str]:
    """The checks every sm_90a kernel makes first: a CUDA sm_90 device, the DSL, bf16 tokens,
    weights the packed layout can hold."""
    if shape.device_capability is None:
        return "needs a CUDA device (sm_90); inputs are on the CPU"
    if shape.device_capability[0] != 9:
        major, minor = shape.device_capability
        return f"needs sm_90 (Hopper); device is sm_{major}{minor}"
    if importlib.util.find_spec("cutlass") is None:
        return "nvidia-cutlass-dsl is not installed"
    if shape.dtype != torch.bfloat16:
        return f"needs bf16 activations; got {shape.dtype}"
    return shape.weights_reason


# Largest hidden or intermediate size a kernel takes. The top-k reduce
# (moe_common.cute.topk_reduce) counts T x H / 8 16-byte chunks in 32 bits: at T = 65536
# (size_reason's largest) that count would wrap from H = 262144 and leave rows unreduced; up to
# 65536 it stays at 2^29. Past it the dispatcher runs the reference.
MAX_DIM = 65536


def dims_reason(shape, multiple: int) -> Optional[str]:
    for name, v in (("hidden", shape.hidden), ("intermediate", shape.intermediate)):
        if v % multiple:
            return f"{name}={v} is not a multiple of {multiple}"
        if v > MAX_DIM:
            return f"{name}={v} exceeds the supported maximum {MAX_DIM}"
    return None


def size_reason(shape, *, max_top_k: int, max_local_experts: int, max_tokens: int) -> Optional[str]:
    """The common size limits (routing and tile tables), each with its own message."""
    if shape.top_k > max_top_k:
        return f"top_k={shape.top_k} exceeds the supported maximum {max_top_k}"
    if shape.num_local_experts > max_local_experts:
        return f"{shape.num_local_experts} local experts exceed the supported maximum {max_local_experts}"
    if shape.tokens > max_tokens:
        return f"tokens={shape.tokens} exceeds the supported maximum {max_tokens}"
    return None


class Buffers:
    """A runner's device buffers: named slots of the caller's Workspace (FusedMoE: allocated at
    warm-up, never during a captured call), or fresh tensors for a direct call."""

    def __init__(self, kernel_name: str, workspace, device):
        self.prefix, self.ws, self.dev = kernel_name, workspace, device

    def get(self, name, shape, dtype, zeroed: bool = False):
        if self.ws is not None:
            return self.ws.get(f"{self.prefix}.{name}", shape, dtype, self.dev, zeroed=zeroed)
        return (torch.zeros if zeroed else torch.empty)(shape, dtype=dtype, device=self.dev)


class CallFacts(NamedTuple):
    """What every runner reads off a call before its first launch (call_facts)."""
    prep: object  # the packed weights (moe_common.packed.pack)
    tokens: int  # T
    top_k: int  # k
    pairs: int  # P = T * k
    experts: int  # E, the local experts
    offset: int  # the first local expert's id
    bufs: Buffers
    stream: object  # the current CUDA stream, as the kernels take it
    ids: torch.Tensor  # topk_ids, contiguous


def call_facts(kernel_name: str, x, weights, topk_ids, workspace) -> CallFacts:
    """A runner's first step: the packed weights, the call's sizes, its buffers and stream."""
    from .cute import jit
    from .packed import pack

    T, k = topk_ids.shape
    return CallFacts(pack(weights), T, k, T * k, weights.num_local_experts,
                     weights.local_expert_offset, Buffers(kernel_name, workspace, x.device),
                     jit.current_stream(x.device), topk_ids.contiguous())


def router_weights(topk_weights: torch.Tensor) -> torch.Tensor:
    """The router weights as the kernels read them: fp32 [T, k], contiguous (a copy only when
    the caller's are another dtype or strided)."""
    return topk_weights.to(torch.float32).contiguous()


class RoutedPairs(NamedTuple):
    order: torch.Tensor  # [P] int32: sorted position -> pair index t * k + j
    slots: torch.Tensor  # [P] int32: pair index -> tile * bn + position in tile, -1: not local
    tiles: torch.Tensor  # [3, capacity] int32: tile expert, start, end
    num_tiles: torch.Tensor  # [1] int32

    @property
    def tile_operands(self) -> dict:
        """The tile table and the pair order as the grouped GEMMs' operand bundles name them
        (moe_common.cute.jit.operands): expert, start, end, count and order pointers."""
        return dict(tile_expert=self.tiles[0].data_ptr(), tile_start=self.tiles[1].data_ptr(),
                    tile_end=self.tiles[2].data_ptr(), num_tiles=self.num_tiles.data_ptr(),
                    order=self.order.data_ptr())


def route_pairs(bufs: Buffers, topk_ids, expert_offset: int, experts: int, bn: int,
                capacity: int, stream) -> RoutedPairs:
    """The routing step every grouped-GEMM runner starts with: (expert, up to bn sorted pairs)
    tiles built on the device in the runner's buffers (moe_common.cute.routing)."""
    from .cute import jit
    from .cute.routing import MAX_SPLIT_CTAS

    pairs = topk_ids.numel()
    order = bufs.get("order", (pairs,), torch.int32)
    slots = bufs.get("slots", (pairs,), torch.int32)
    counts = bufs.get("counts", (experts,), torch.int32)
    tiles = bufs.get("tiles", (3, capacity), torch.int32)
    num_tiles = bufs.get("num_tiles", (1,), torch.int32)
    # split-path scratch: per-CTA bases, then the slot shifts
    hist = bufs.get("route_hist", (MAX_SPLIT_CTAS + 1, experts), torch.int32)
    jit.route(topk_ids, pairs, expert_offset, experts, bn, order, slots, counts, tiles, num_tiles,
              hist, stream)
    return RoutedPairs(order, slots, tiles, num_tiles)


def quantize_rows(v: torch.Tensor, fmt, gs) -> torch.Tensor:
    """w4a4: rows of v quantized to 4 bits and returned as q * block_scale in bf16 (exact); the
    global scale gs (NVFP4) joins the kernels' fp32 epilogue instead."""
    packed, scales = fmt.quantize(v.float(), gs)
    return fmt.dequantize(packed, scales).to(torch.bfloat16)


def w4a4_fc1_rows(x, weights, topk_ids, out):
    """w4a4 FC1 input: one quantized row per routed pair (pair t * k + j uses its expert's
    input_scale) written into out [T * k, H] as q * block scale in bf16."""
    from .formats import get_format

    k = topk_ids.shape[1]
    E, off = weights.num_local_experts, weights.local_expert_offset
    gs = None
    if weights.weight_format == "nvfp4":
        local = topk_ids.reshape(-1).long() - off
        gs = weights.input_scale.float()[local.clamp(0, E - 1)]
    out.copy_(quantize_rows(x.repeat_interleave(k, dim=0), get_format(weights.weight_format), gs))
    return out


def w4a4_requantize_intermediate(inter, weights, topk_ids, order):
    """w4a4 FC2 input: the intermediate [P, I] in sorted order (row p is pair order[p]) requantized
    in place with each row's expert fc2_input_scale."""
    from .formats import get_format

    E, off = weights.num_local_experts, weights.local_expert_offset
    P = order.numel()
    gs = None
    if weights.weight_format == "nvfp4":
        # sorted rows past the routed count hold stale order entries: clamp, never read
        pair = order.long().clamp(0, P - 1)
        gs = weights.fc2_input_scale.float()[(topk_ids.reshape(-1)[pair].long() - off).clamp(0, E - 1)]
    inter.copy_(quantize_rows(inter, get_format(weights.weight_format), gs))


def can_handle_hook(kernel_name: str, unsupported_reason: Callable, priority: Callable[..., int],
                    runner_module: str):
    """A package's `can_handle(shape, activation)` hook (its plugin module binds it to the name
    `can_handle`): a Decline with the package's reason, else an Offer at `priority(shape)` whose
    runner is imported only then, so answering never imports the DSL kernels."""

    @hookimpl
    def can_handle(shape, activation):
        reason = unsupported_reason(shape, activation)
        if reason is not None:
            return Decline(kernel=kernel_name, reason=reason)
        run = importlib.import_module(runner_module).run
        return Offer(kernel=kernel_name, priority=priority(shape), run=run)

    return can_handle


def direct_call(kernel_name: str, unsupported_reason: Callable, runner_module: str):
    """A package's `fused_moe(...)`: validate, ask the package's own limits, run its runner
    (imported on first use, so importing the package never imports the DSL)."""

    def fused_moe(x, weights, topk_weights, topk_ids, *, activation=Activation.name,
                  quant_mode="w4a16", swiglu_alpha=Activation.alpha, swiglu_beta=Activation.beta,
                  swiglu_limit=Activation.limit, out=None, workspace=None, deterministic=True):
        act = make_activation(activation, swiglu_alpha, swiglu_beta, swiglu_limit)
        shape = validate_inputs(x, weights, topk_weights, topk_ids, activation=act,
                                quant_mode=quant_mode, out=out)
        reason = unsupported_reason(shape, act)
        if reason is not None:
            raise ValueError(f"{kernel_name} cannot run this call: {reason}")
        run = importlib.import_module(runner_module).run
        return run(x, weights, topk_weights, topk_ids, activation=act,
                   quant_mode=quant_mode, out=out, workspace=workspace, deterministic=deterministic)

    fused_moe.__doc__ = f"Run the layer with {kernel_name}; ValueError (with the reason) when it cannot."
    return fused_moe
