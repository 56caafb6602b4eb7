"""The public entry points: fused_moe, explain and FusedMoE."""
from __future__ import annotations

import logging
import threading
from typing import Iterable, Optional, Sequence, Union

import torch

from moe_common.cute import jit
from moe_common.types import MoEShape, Offer
from moe_common.validation import check_quant_mode, describe, validate_inputs
from moe_common.weights import MoEWeights
from moe_common.workspace import Workspace

from .manager import Explanation, get_manager, resolve_forced
from .options import CallOptions, takes_options

log = logging.getLogger("dispatcher")

_REFERENCE_LOGGED: set = set()


def _note_reference_on_gpu(choice: Offer, shape: MoEShape) -> None:
    if choice.kernel == "reference" and shape.device_capability is not None:
        key = (shape.hidden, shape.intermediate, shape.num_experts, shape.top_k, shape.weight_format,
               shape.quant_mode, shape.device_capability)
        if key not in _REFERENCE_LOGGED:
            _REFERENCE_LOGGED.add(key)
            log.warning("fused_moe: running the torch reference on a GPU (sm_%d%d) for %s; "
                        "forced, or no kernel offered (see dispatcher.explain)",
                        *shape.device_capability, shape)


@takes_options
def fused_moe(
    x: torch.Tensor,
    weights: MoEWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    out: Optional[torch.Tensor] = None,
    options: CallOptions,
) -> torch.Tensor:
    """One fused MoE layer: ``out[t] = sum_j topk_weights[t,j] * FC2_e(act(FC1_e(x[t])))``.

    ``x`` [T, H] bf16; ``topk_ids`` [T, k] int32/int64 global expert ids; ``topk_weights``
    [T, k] fp32/bf16; returns ``out`` ([T, H] bf16, allocated when None). The keyword options
    (``activation="silu"``, ``quant_mode="w4a16"``, ``swiglu_alpha=1.702``, ``swiglu_beta=1.0``,
    ``swiglu_limit=7.0``, ``kernel=None``, ``deterministic=False``) are ``CallOptions``'. The
    kernel is the highest-priority offer among the installed plugins; ``kernel="name"`` (or the
    environment variable FUSED_MOE_KERNEL) forces one and raises ValueError with its decline
    reason if it cannot run this call. ``deterministic=True`` asks for bitwise-reproducible
    results.
    """
    act = options.make_activation()
    shape = validate_inputs(x, weights, topk_weights, topk_ids, activation=act,
                            quant_mode=options.quant_mode, out=out)
    choice = get_manager().select(shape, act, options.kernel)
    _note_reference_on_gpu(choice, shape)
    if out is None:
        out = torch.empty((shape.tokens, shape.hidden), dtype=torch.bfloat16, device=x.device)
    choice.run(x, weights, topk_weights, topk_ids, activation=act,
               quant_mode=options.quant_mode, out=out, workspace=None,
               deterministic=options.deterministic)
    return out


@takes_options
def explain(
    x: Union[torch.Tensor, MoEShape],
    weights: Optional[MoEWeights] = None,
    topk_weights: Optional[torch.Tensor] = None,
    topk_ids: Optional[torch.Tensor] = None,
    *,
    out: Optional[torch.Tensor] = None,
    options: CallOptions,
) -> Explanation:
    """Every plugin's answer for this call (offers with priority, declines with reasons,
    plugins that failed to load with their error) and the choice. Takes the same arguments as
    ``fused_moe`` (``deterministic`` is accepted and changes nothing), or a ``MoEShape`` in place
    of the tensors. Never runs a kernel; a forced kernel that cannot run is reported in
    ``.error`` instead of raised."""
    act = options.make_activation()
    if isinstance(x, MoEShape):
        shape = x
    else:
        if weights is None or topk_weights is None or topk_ids is None:
            raise TypeError("explain: pass (x, weights, topk_weights, topk_ids) or a MoEShape")
        shape = validate_inputs(x, weights, topk_weights, topk_ids, activation=act,
                                quant_mode=options.quant_mode, out=out)
    return get_manager().explain(shape, act, options.kernel)


def _dummy_routing(tokens: int, top_k: int, weights: MoEWeights, device, gen: torch.Generator):
    """Valid routing that spreads T*k pairs over the local experts (distinct per token)."""
    n_local, offset = weights.num_local_experts, weights.local_expert_offset
    pool, base = (n_local, offset) if top_k <= n_local else (weights.num_experts, 0)
    start = torch.randint(0, pool, (tokens, 1), generator=gen)
    ids = (start + torch.arange(top_k).view(1, -1)) % pool + base
    tw = torch.full((tokens, top_k), 1.0 / top_k, dtype=torch.float32)
    return tw.to(device), ids.to(torch.int32).to(device)


class _ThreadState:
    """One thread's share of a FusedMoE: the output buffer, the workspace and the stream of its
    last eager call."""

    def __init__(self, max_tokens: int, hidden: int, device):
        self.out = torch.empty((max_tokens, hidden), dtype=torch.bfloat16, device=device)
        self.workspace = Workspace()
        self.stream = None  # torch.cuda.Stream of the last eager call (CUDA only)
        self.warmed_tokens: tuple = ()


class FusedMoE:
    """A fused MoE layer bound to one weights object, ready for CUDA-graph capture.

    ``FusedMoE(weights, max_tokens, top_k, *, activation=..., quant_mode=..., swiglu_alpha=...,
    swiglu_beta=..., swiglu_limit=..., kernel=None, deterministic=False)``: the keyword options
    are ``fused_moe``'s (``CallOptions``), fixed for the layer's life.

    Owns, per thread that calls it, the output buffer ``[max_tokens, H]`` bf16 and a
    ``Workspace``. The kernel depends on T; the choice per T is host logic cached in a list, so
    a call does no selection work after the first call at that T. ``warmup()`` runs once for
    every distinct kernel the dispatcher would choose in ``1..max_tokens`` (at the largest T that
    kernel gets), for each T you declare, and once for every other compiled variant a T up to
    max_tokens would use (see ``variant_tokens``), then freezes the workspace and the compile
    cache for this layer. After that, ``__call__`` allocates nothing, never syncs with the host
    and compiles nothing at any T <= max_tokens (a compile would raise
    ``moe_common.cute.jit.CompileAfterWarmup``), so it can be captured in a CUDA graph and
    replayed.

    ``__call__(x, topk_weights, topk_ids)`` returns ``out[:T]`` (a view of the calling thread's
    buffer: that thread's next call overwrites it).

    Sharing (docs/RELIABILITY.md):
      * threads: each thread gets its own output buffer and workspace on its first call, so
        concurrent calls from several threads never share memory (the weights and their packed
        copy are shared, read only). A thread that captures graphs calls ``warmup()`` itself.
      * streams: eager calls of one thread on different streams are ordered: a call on another
        stream than the previous call's first makes its stream wait for that one
        (``wait_stream``), so the shared workspace is never used by two launches at once. While a
        graph is being captured nothing is ordered (capture begins after a device sync); replays
        of a captured graph and eager calls of the same thread must be ordered by the caller.
      * a call that raises between launches leaves the workspace's counters re-zeroed.
    int64 ``topk_ids`` are narrowed to int32 on the device first (ids outside the local experts
    are dropped, as the reference drops them), so only int32 kernel variants are ever needed
    (``fused_moe`` passes them on: the kernels drop them as they read).
    """

    @takes_options
    def __init__(self, weights: MoEWeights, max_tokens: int, top_k: int, *, options: CallOptions):
        if not isinstance(weights, MoEWeights):
            raise ValueError(f"weights: got {type(weights).__name__}; allowed: moe_common.MoEWeights")
        if int(max_tokens) < 1:
            raise ValueError(f"max_tokens: got {max_tokens}; allowed: >= 1")
        if int(top_k) < 1:
            raise ValueError(f"top_k: got {top_k}; allowed: >= 1")
        self.weights = weights
        self.max_tokens = int(max_tokens)
        self.top_k = int(top_k)
        self.activation = options.make_activation()
        self.quant_mode = options.quant_mode
        check_quant_mode(self.quant_mode, weights)
        self.deterministic = bool(options.deterministic)
        # The forced kernel (argument, else FUSED_MOE_KERNEL) is read once, here.
        self.kernel, self._forced_from = resolve_forced(options.kernel)
        self.device = weights.device
        self.capability = (tuple(torch.cuda.get_device_capability(self.device))
                           if self.device.type == "cuda" else None)
        self._choices: list = [None] * (self.max_tokens + 1)
        self._threads = threading.local()
        self._state()  # the constructing thread's buffers exist from the start

    # -- per-thread state -------------------------------------------------------------------
    def _state(self) -> _ThreadState:
        st = getattr(self._threads, "state", None)
        if st is None:
            st = _ThreadState(self.max_tokens, self.weights.hidden, self.device)
            self._threads.state = st
        return st

    @property
    def out(self) -> torch.Tensor:
        """The calling thread's output buffer [max_tokens, H]."""
        return self._state().out

    @property
    def workspace(self) -> Workspace:
        """The calling thread's workspace."""
        return self._state().workspace

    @property
    def warmed_tokens(self) -> tuple:
        """The T values the calling thread's warmup() ran (empty before it)."""
        return self._state().warmed_tokens

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
        """The token counts warmup() runs first, largest first: the declared T and, per
        kernel, the largest T it gets (so every buffer reaches its largest size)."""
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

    def variants(self, tokens: int, inputs) -> frozenset:
        """The kernel and compiled variants a call at T = tokens uses, learned by running the
        chosen runner's host logic with nothing compiled or launched (jit.probing); inputs:
        (x, topk_weights, topk_ids) of max_tokens rows, sliced to T."""
        try:
            offer = self.choice(tokens)
        except ValueError:
            return frozenset({"declined"})
        keys: set = {("kernel", offer.kernel)}
        if offer.kernel == "reference":
            return frozenset(keys)  # torch only: nothing to compile, no need to run it
        x, tw, ids = (t[:tokens] for t in inputs)
        with jit.probing(keys):
            offer.run(x, self.weights, tw, ids, activation=self.activation,
                      quant_mode=self.quant_mode, out=self.out[:tokens], workspace=self.workspace,
                      deterministic=self.deterministic)
        return frozenset(keys)

    def variant_tokens(self, inputs, covered: Iterable[int] = ()) -> list:
        """One T per distinct set of variants over 1..max_tokens (its smallest T) that no T in
        `covered` already uses.

        Every T-dependent choice in the runners is a monotone step function of T (the kernel:
        moe-static, then moe-generic, then moe-gated; moe-static's team shape; moe-generic's
        tile width; moe-gated's geometry; the routing's one-CTA or split path), so when the
        variants at both ends of a range are equal, nothing changes inside it; ranges whose ends
        differ are halved until each change is pinned to one step. That is O(changes x
        log(max_tokens)) probes instead of max_tokens."""
        found = {}

        def note(t, v):
            if v not in found or t < found[v]:
                found[v] = t

        def scan(lo, hi, vlo, vhi):
            if vlo == vhi or hi - lo <= 1:
                return
            mid = (lo + hi) // 2
            vmid = self.variants(mid, inputs)
            note(mid, vmid)
            scan(lo, mid, vlo, vmid)
            scan(mid, hi, vmid, vhi)

        v1, vmax = self.variants(1, inputs), self.variants(self.max_tokens, inputs)
        note(1, v1)
        note(self.max_tokens, vmax)
        scan(1, self.max_tokens, v1, vmax)
        done = {self.variants(t, inputs) for t in covered} | {frozenset({"declined"})}
        return sorted(t for v, t in found.items() if v not in done)

    def _warmup_inputs(self, gen: torch.Generator):
        t, h = self.max_tokens, self.weights.hidden
        x = (torch.randn((t, h), generator=gen) * 0.5).to(torch.bfloat16).to(self.device)
        tw, ids = _dummy_routing(t, self.top_k, self.weights, self.device, gen)
        return x, tw, ids

    def warmup(self, tokens: Optional[Sequence[int]] = None, *, seed: int = 0) -> "FusedMoE":
        """Make the calling thread's calls capture-safe: run once per planned T (see plan()) and
        once per other variant T (see variant_tokens()), allocate the int64-ids buffer,
        synchronize, freeze the workspace. Later calls from this thread raise
        jit.CompileAfterWarmup rather than compile."""
        gen = torch.Generator().manual_seed(seed)
        inputs = self._warmup_inputs(gen)
        runs = self.plan(tokens)
        for t in runs:
            self(*(v[:t] for v in inputs))
        extra = self.variant_tokens(inputs, covered=runs)
        for t in extra:
            self(*(v[:t] for v in inputs))
        st = self._state()
        st.workspace.get(IDS_BUFFER, (self.max_tokens * self.top_k,), torch.int32, self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        st.workspace.freeze()
        st.warmed_tokens = tuple(sorted(set(runs) | set(extra)))
        return self

    # -- the call -----------------------------------------------------------------------------
    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        t = x.shape[0] if x.dim() >= 1 else -1
        if t > self.max_tokens:
            raise ValueError(f"x: got T = {t} tokens; allowed: T <= max_tokens = {self.max_tokens}")
        if topk_ids.dim() == 2 and topk_ids.shape[1] != self.top_k:
            raise ValueError(f"topk_ids: got top_k = {topk_ids.shape[1]}; allowed: {self.top_k} "
                             "(the top_k this FusedMoE was built for)")
        st = self._state()
        out = st.out[:max(t, 0)]
        # Host-only checks (no value reads, no sync): safe under capture. An empty batch gets
        # every check too, then an empty result.
        validate_inputs(x, self.weights, topk_weights, topk_ids, activation=self.activation,
                        quant_mode=self.quant_mode, out=out, min_tokens=0)
        if t == 0:
            return out
        ws = st.workspace
        if topk_ids.dtype != torch.int32:  # one build per kernel variant: the int32 one
            buf = ws.get(IDS_BUFFER, (t * self.top_k,), torch.int32, self.device)
            topk_ids = int32_ids(topk_ids, self.weights, buf.view(t, self.top_k))
        if self.device.type == "cuda":
            _order_streams(st, self.device)
        try:
            with jit.frozen(ws.frozen):
                self.choice(t).run(x, self.weights, topk_weights, topk_ids,
                                   activation=self.activation, quant_mode=self.quant_mode,
                                   out=out, workspace=ws, deterministic=self.deterministic)
        except BaseException:
            ws.rezero()  # a launch sequence cut short may leave a counter set
            raise
        return out


IDS_BUFFER = "dispatcher.ids32"  # FusedMoE's int32 copy of int64 topk_ids


def int32_ids(topk_ids: torch.Tensor, weights, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """topk_ids as the kernels read them: int32, every id outside this layer's local experts
    [offset, offset + E_local) moved to offset - 1 or offset + E_local (both still outside, both
    int32), so an int64 id such as 2^32 + e or INT64_MIN is dropped as the reference drops it
    instead of being truncated to expert e or 0. int32 ids pass through untouched. Two
    elementwise ops on the current stream (clamp, narrowing copy), no host sync; `out`: an int32
    buffer of topk_ids' shape (FusedMoE passes its workspace's).

    FusedMoE narrows so that its warm-up builds one variant per kernel (the int32 one);
    fused_moe passes int64 ids on, and the kernels read them saturated to int32
    (ptx.ld_nc_s64_as_s32), without these two launches."""
    if topk_ids.dtype == torch.int32:
        return topk_ids
    lo = weights.local_expert_offset
    hi = lo + weights.num_local_experts
    if out is None:
        out = torch.empty(topk_ids.shape, dtype=torch.int32, device=topk_ids.device)
    return out.copy_(topk_ids.clamp(lo - 1, hi))


def _order_streams(st: _ThreadState, device) -> None:
    """Make this call's stream wait for the previous eager call's stream when they differ, so
    two launches never use one workspace at once (skipped while capturing: capture starts
    after a device sync, and a capture stream is not a stream later calls run on)."""
    if torch.cuda.is_current_stream_capturing():
        return
    cur = torch.cuda.current_stream(device)
    prev = st.stream
    if prev is not None and prev != cur:
        cur.wait_stream(prev)
    st.stream = cur
