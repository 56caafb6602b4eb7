"""The public entry points: fused_moe, explain and FusedMoE."""
from __future__ import annotations

import logging
from typing import Iterable, Optional, Sequence, Union

import torch

from moe_common.types import Activation, MoEShape, Offer
from moe_common.validation import check_quant_mode, describe, validate_inputs
from moe_common.weights import MoEWeights
from moe_common.workspace import Workspace

from .manager import Explanation, get_manager, resolve_forced

log = logging.getLogger("dispatcher")

_REFERENCE_LOGGED: set = set()


def make_activation(activation: Union[str, Activation] = "silu", swiglu_alpha: float = 1.702,
                    swiglu_beta: float = 1.0, swiglu_limit: Optional[float] = 7.0) -> Activation:
    """An Activation from a name and the swigluoai parameters (an Activation passes through)."""
    if isinstance(activation, Activation):
        return activation
    return Activation(activation, float(swiglu_alpha), float(swiglu_beta),
                      None if swiglu_limit is None else float(swiglu_limit))


def _note_reference_on_gpu(choice: Offer, shape: MoEShape) -> None:
    if choice.kernel == "reference" and shape.device_capability is not None:
        key = (shape.hidden, shape.intermediate, shape.num_experts, shape.top_k, shape.weight_format,
               shape.quant_mode, shape.device_capability)
        if key not in _REFERENCE_LOGGED:
            _REFERENCE_LOGGED.add(key)
            log.warning("fused_moe: running the torch reference on a GPU (sm_%d%d) for %s; "
                        "no kernel offered (see dispatcher.explain)",
                        *shape.device_capability, shape)


def fused_moe(
    x: torch.Tensor,
    weights: MoEWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: Union[str, Activation] = "silu",
    quant_mode: str = "w4a16",
    swiglu_alpha: float = 1.702,
    swiglu_beta: float = 1.0,
    swiglu_limit: Optional[float] = 7.0,
    out: Optional[torch.Tensor] = None,
    kernel: Optional[str] = None,
    deterministic: bool = False,
) -> torch.Tensor:
    """One fused MoE layer: ``out[t] = sum_j topk_weights[t,j] * FC2_e(act(FC1_e(x[t])))``.

    ``x`` [T, H] bf16; ``topk_ids`` [T, k] int32/int64 global expert ids; ``topk_weights``
    [T, k] fp32/bf16; returns ``out`` ([T, H] bf16, allocated when None). The kernel is the
    highest-priority offer among the installed plugins; ``kernel="name"`` (or the environment
    variable FUSED_MOE_KERNEL) forces one and raises ValueError with its decline reason if it
    cannot run this call. ``deterministic=True`` asks for bitwise-reproducible results.
    """
    act = make_activation(activation, swiglu_alpha, swiglu_beta, swiglu_limit)
    shape = validate_inputs(x, weights, topk_weights, topk_ids, activation=act,
                            quant_mode=quant_mode, out=out)
    choice = get_manager().select(shape, act, kernel)
    _note_reference_on_gpu(choice, shape)
    if out is None:
        out = torch.empty((shape.tokens, shape.hidden), dtype=torch.bfloat16, device=x.device)
    choice.run(x, weights, topk_weights, topk_ids, activation=act, quant_mode=quant_mode,
               out=out, workspace=None, deterministic=deterministic)
    return out


def explain(
    x: Union[torch.Tensor, MoEShape],
    weights: Optional[MoEWeights] = None,
    topk_weights: Optional[torch.Tensor] = None,
    topk_ids: Optional[torch.Tensor] = None,
    *,
    activation: Union[str, Activation] = "silu",
    quant_mode: str = "w4a16",
    swiglu_alpha: float = 1.702,
    swiglu_beta: float = 1.0,
    swiglu_limit: Optional[float] = 7.0,
    out: Optional[torch.Tensor] = None,
    kernel: Optional[str] = None,
    deterministic: bool = False,
) -> Explanation:
    """Every plugin's answer for this call (offers with priority, declines with reasons,
    plugins that failed to load with their error) and the choice. Takes the same arguments as
    ``fused_moe``, or a ``MoEShape`` in place of the tensors. Never runs a kernel; a forced
    kernel that cannot run is reported in ``.error`` instead of raised."""
    del deterministic  # accepted so that explain(**same kwargs as fused_moe) works
    act = make_activation(activation, swiglu_alpha, swiglu_beta, swiglu_limit)
    if isinstance(x, MoEShape):
        shape = x
    else:
        if weights is None or topk_weights is None or topk_ids is None:
            raise TypeError("explain: pass (x, weights, topk_weights, topk_ids) or a MoEShape")
        shape = validate_inputs(x, weights, topk_weights, topk_ids, activation=act,
                                quant_mode=quant_mode, out=out)
    return get_manager().explain(shape, act, kernel)


def _dummy_routing(tokens: int, top_k: int, weights: MoEWeights, device, gen: torch.Generator):
    """Valid routing that spreads T*k pairs over the local experts (distinct per token)."""
    n_local, offset = weights.num_local_experts, weights.local_expert_offset
    pool, base = (n_local, offset) if top_k <= n_local else (weights.num_experts, 0)
    start = torch.randint(0, pool, (tokens, 1), generator=gen)
    ids = (start + torch.arange(top_k).view(1, -1)) % pool + base
    tw = torch.full((tokens, top_k), 1.0 / top_k, dtype=torch.float32)
    return tw.to(device), ids.to(torch.int32).to(device)


class FusedMoE:
    """A fused MoE layer bound to one weights object, ready for CUDA-graph capture.

    Owns the output buffer ``[max_tokens, H]`` bf16 and a ``Workspace``. The kernel depends on
    T; the choice per T is host logic cached in a list, so a call does no selection work after
    the first call at that T. ``warmup()`` runs once for every distinct kernel the dispatcher
    would choose in ``1..max_tokens`` (at the largest T that kernel gets) and for each T you
    declare, so buffers are allocated and kernels compiled, then freezes the workspace. After
    that, ``__call__`` allocates nothing, never syncs with the host and compiles nothing for
    the warmed T, so it can be captured in a CUDA graph and replayed.

    ``__call__(x, topk_weights, topk_ids)`` returns ``out[:T]`` (a view of the owned buffer:
    the next call overwrites it).
    """

    def __init__(
        self,
        weights: MoEWeights,
        max_tokens: int,
        top_k: int,
        activation: Union[str, Activation] = "silu",
        quant_mode: str = "w4a16",
        swiglu_alpha: float = 1.702,
        swiglu_beta: float = 1.0,
        swiglu_limit: Optional[float] = 7.0,
        kernel: Optional[str] = None,
        deterministic: bool = False,
    ):
        if not isinstance(weights, MoEWeights):
            raise ValueError(f"weights: got {type(weights).__name__}; allowed: moe_common.MoEWeights")
        if int(max_tokens) < 1:
            raise ValueError(f"max_tokens: got {max_tokens}; allowed: >= 1")
        if int(top_k) < 1:
            raise ValueError(f"top_k: got {top_k}; allowed: >= 1")
        self.weights = weights
        self.max_tokens = int(max_tokens)
        self.top_k = int(top_k)
        self.activation = make_activation(activation, swiglu_alpha, swiglu_beta, swiglu_limit)
        self.quant_mode = quant_mode
        check_quant_mode(quant_mode, weights)
        self.deterministic = bool(deterministic)
        # The forced kernel (argument, else FUSED_MOE_KERNEL) is read once, here.
        self.kernel, self._forced_from = resolve_forced(kernel)
        self.device = weights.device
        self.capability = (tuple(torch.cuda.get_device_capability(self.device))
                           if self.device.type == "cuda" else None)
        self.out = torch.empty((self.max_tokens, weights.hidden), dtype=torch.bfloat16, device=self.device)
        self.workspace = Workspace()
        self._choices: list = [None] * (self.max_tokens + 1)
        self.warmed_tokens: tuple = ()

    # -- selection (host only) --------------------------------------------------------------
    def shape(self, tokens: int) -> MoEShape:
        return describe(self.weights, int(tokens), self.top_k, self.quant_mode, self.capability,
                        torch.bfloat16)

    def choice(self, tokens: int) -> Offer:
        """The kernel that runs at T = tokens (cached; raises ValueError if a forced one declines)."""
        c = self._choices[tokens]
        if c is None:
            shape = self.shape(tokens)
            c = get_manager().select(shape, self.activation, self.kernel, use_env=False, cache=False)
            _note_reference_on_gpu(c, shape)
            self._choices[tokens] = c
        return c

    def explain(self, tokens: int) -> Explanation:
        return get_manager().explain(self.shape(tokens), self.activation, self.kernel, use_env=False)

    # -- warm-up ----------------------------------------------------------------------------
    def plan(self, tokens: Optional[Iterable[int]] = None) -> list:
        """The token counts warmup() runs, largest first."""
        declared = sorted({int(t) for t in tokens}) if tokens is not None else []
        for t in declared:
            if not 1 <= t <= self.max_tokens:
                raise ValueError(f"warmup tokens: got T={t}; allowed: 1..max_tokens={self.max_tokens}")
            self.choice(t)  # a declared T that cannot run raises here
        largest: dict = {}
        for t in range(1, self.max_tokens + 1):
            try:
                largest[self.choice(t).kernel] = t
            except ValueError:
                continue  # a forced kernel that declines at this T: calls at T raise
        if not largest and not declared:
            self.choice(self.max_tokens)  # raises the decline reason
        return sorted(set(declared) | set(largest.values()), reverse=True)

    def warmup(self, tokens: Optional[Sequence[int]] = None, *, seed: int = 0) -> "FusedMoE":
        """Run once per planned T (see plan()), synchronize, freeze the workspace."""
        gen = torch.Generator().manual_seed(seed)
        h = self.weights.hidden
        runs = self.plan(tokens)
        for t in runs:
            x = (torch.randn((t, h), generator=gen) * 0.5).to(torch.bfloat16).to(self.device)
            tw, ids = _dummy_routing(t, self.top_k, self.weights, self.device, gen)
            self(x, tw, ids)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.workspace.freeze()
        self.warmed_tokens = tuple(sorted(runs))
        return self

    # -- the call -----------------------------------------------------------------------------
    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        t = x.shape[0] if x.dim() >= 1 else -1
        if t > self.max_tokens:
            raise ValueError(f"x: got T = {t} tokens; allowed: T <= max_tokens = {self.max_tokens}")
        if topk_ids.dim() == 2 and topk_ids.shape[1] != self.top_k:
            raise ValueError(f"topk_ids: got top_k = {topk_ids.shape[1]}; allowed: {self.top_k} "
                             "(the top_k this FusedMoE was built for)")
        out = self.out[:max(t, 0)]
        # Host-only checks (no value reads, no sync): safe under capture. An empty batch gets
        # every check too, then an empty result.
        validate_inputs(x, self.weights, topk_weights, topk_ids, activation=self.activation,
                        quant_mode=self.quant_mode, out=out, min_tokens=0)
        if t == 0:
            return out
        self.choice(t).run(x, self.weights, topk_weights, topk_ids, activation=self.activation,
                           quant_mode=self.quant_mode, out=out, workspace=self.workspace,
                           deterministic=self.deterministic)
        return out
