"""Expert parallelism (EP): one MoE layer's experts sharded over the ranks of a torch.distributed
process group, tokens moved between ranks with torch.distributed's collectives (NCCL on GPUs,
gloo on CPU).

Partition. Rank r of W holds the global experts ``expert_range(E, W, r)``: contiguous ranges in
rank order, the first E mod W ranks holding one more (``shard_weights`` cuts a full layer). A
rank's ``MoEWeights`` is its slice (``local_expert_offset``, ``num_experts`` = E); the
dispatcher's kernels already ignore routes to experts outside the slice.

``fused_moe_ep(x, weights, topk_weights, topk_ids, group=..., strategy=...)``, called by every
rank of the group with its own tokens (any T, zero included), returns this rank's ``out [T, H]``:

1. Local check (shapes, dtypes, the partition). A rank whose inputs are bad still takes part in
   step 2 with a flag, so every rank raises ValueError instead of waiting in a collective.
2. Metadata exchange: one all_gather of an int64 row per rank (its T, the layer's description,
   and how many of its tokens route to each rank). Every rank checks that the rows agree and
   picks the strategy from them, so all ranks take the same path.
3. Dispatch, local compute, combine, by strategy:

   * ``"all_to_all"``: each token row goes once to each rank owning one of its routed experts
     (rows sorted by destination rank, then token), with its full routing; one
     ``all_to_all_single`` with per-rank counts. The received rows run through the dispatcher's
     ``fused_moe`` on this rank's slice (routes to other ranks' experts contribute nothing);
     each result row (this rank's share of the token's weighted sum) goes back by the reverse
     ``all_to_all_single``.
   * ``"allgather"``: every rank's token rows and routing are all-gathered (padded to the
     largest T, padding rows routed nowhere); ``fused_moe`` runs on all of them on this rank's
     slice; the partial results are reduce-scattered back to their owners. The reduce-scatter
     is an equal-split ``all_to_all_single`` of the partial rows and an fp32 sum on the owner:
     the same bytes as a ring reduce-scatter, with one bf16 rounding and a fixed order.

4. The combine's sum, for both strategies: ``out[t] = bf16(sum over d = 0..W-1 of float(partial_d[t]))``,
   rank d's partial being zero where the token routes nowhere on d, summed in rank order, so the
   result is deterministic and the two strategies agree bitwise whenever the local kernel's rows
   do not depend on which other rows share its call (the reference's do not).

Numerics against the single-process layer: each rank's partial is rounded to bf16 before the
sum, so a token whose routes span several ranks differs by about one bf16 rounding of a partial
(relative L2 a few 1e-3); a token whose routes all sit on one rank is bitwise equal where the kernel's
rows do not depend on the call's other rows.

Strategy choice (``strategy=None``; ``choose_strategy`` is the rule, ``explain_ep`` shows it for
a call): "allgather" when the largest per-rank T is at most ``ALLGATHER_MAX_TOKENS`` (a few rows:
collective latency, not bytes, sets the time, and allgather needs no per-destination sort) or
when all_to_all would not cut the busiest rank's bytes below ``ALL_TO_ALL_MAX_SHARE`` of
allgather's (on W = 2 ranks with k = 8 random routes, DeepSeek-V3's, 99% of tokens reach both
ranks, so the two move the same bytes); "all_to_all" otherwise (many ranks, a token reaching few of them). These constants
are a traffic model, not measurements.

``FusedMoEEP`` is the CUDA-graph-capturable form: the allgather strategy with fixed sizes
(every rank pads to ``max_tokens_per_rank``), all buffers preallocated, no metadata exchange and
no host sync per step. With fixed sizes all_to_all would move the same padded bytes as
allgather (any token may route to any rank), so it has no fixed-size form here.
"""
from __future__ import annotations

import dataclasses
import time
import zlib
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import torch
import torch.distributed as dist

from moe_common.types import Activation
from moe_common.validation import validate_inputs
from moe_common.weights import MoEWeights

from .api import FusedMoE, _dummy_routing, fused_moe
from .options import CallOptions, takes_options

STRATEGIES = ("all_to_all", "allgather")
ALLGATHER_MAX_TOKENS = 64  # per-rank T at or below which allgather is chosen (latency-bound)
ALL_TO_ALL_MAX_SHARE = 0.75  # all_to_all is chosen when its busiest-rank bytes are <= this x allgather's
PHASES = ("dispatch", "compute", "combine")

# The metadata row each rank contributes (step 2), then one count per destination rank.
_META = ("ok", "tokens", "hidden", "top_k", "num_experts", "layer", "strategy", "capacity")
_AGREE = ("hidden", "top_k", "num_experts", "layer", "strategy", "capacity")
_NO_STRATEGY = -1


# ----------------------------------------------------------------------------------------------
# partition
# ----------------------------------------------------------------------------------------------
def expert_range(num_experts: int, world_size: int, rank: int) -> tuple:
    """The global experts [start, stop) that rank ``rank`` of ``world_size`` holds."""
    if int(world_size) < 1 or int(num_experts) < int(world_size):
        raise ValueError(f"expert_range: got E = {num_experts} experts over W = {world_size} ranks; "
                         "allowed: W >= 1 and E >= W (every rank holds at least one expert)")
    if not 0 <= int(rank) < int(world_size):
        raise ValueError(f"expert_range: got rank {rank}; allowed: 0..{world_size - 1}")
    base, extra = divmod(int(num_experts), int(world_size))
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _range_starts(num_experts: int, world_size: int) -> list:
    return [expert_range(num_experts, world_size, r)[0] for r in range(world_size)]


def shard_weights(weights: MoEWeights, rank: int, world_size: int) -> MoEWeights:
    """Rank ``rank``'s slice of a full layer (copies, so the full tensors can be freed)."""
    if not isinstance(weights, MoEWeights):
        raise ValueError(f"weights: got {type(weights).__name__}; allowed: moe_common.MoEWeights")
    if weights.local_expert_offset != 0 or weights.num_local_experts != weights.num_experts:
        raise ValueError(
            f"weights: got a slice (experts {weights.local_expert_offset}.."
            f"{weights.local_expert_offset + weights.num_local_experts - 1} of {weights.num_experts}); "
            "allowed: the full layer")
    start, stop = expert_range(weights.num_experts, world_size, rank)
    sliced = {f.name: getattr(weights, f.name)[start:stop].clone() for f in dataclasses.fields(weights)
              if isinstance(getattr(weights, f.name), torch.Tensor)}
    # the copy starts with an empty kernel_cache (MoEWeights: not an __init__ field)
    return dataclasses.replace(weights, **sliced, local_expert_offset=start,
                               num_experts=weights.num_experts).validate()


def _check_partition(weights: MoEWeights, rank: int, world: int) -> None:
    start, stop = expert_range(weights.num_experts, world, rank)
    have = (weights.local_expert_offset, weights.local_expert_offset + weights.num_local_experts)
    if have != (start, stop):
        raise ValueError(
            f"weights: rank {rank} of {world} holds experts [{have[0]}, {have[1]}) of "
            f"{weights.num_experts}; allowed: [{start}, {stop}) (contiguous ranges in rank order, the "
            "first E mod W ranks holding one more; shard_weights(full, rank, W) cuts them)")


# ----------------------------------------------------------------------------------------------
# the process group
# ----------------------------------------------------------------------------------------------
class _Group:
    """A process group's rank, size and the two collectives used here. Backends without device
    support (gloo with CUDA tensors) get host copies of the data, staged through CPU memory."""

    def __init__(self, group):
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("group: torch.distributed is not initialized; allowed: call "
                             "torch.distributed.init_process_group (torchrun sets its environment) first")
        self.group = group
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ValueError("group: this process is not a member of it; allowed: a group that holds this rank")
        self.size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))

    @property
    def host_meta(self) -> bool:
        """Metadata goes through host memory where the group has gloo (no device sync to read it)."""
        return "gloo" in self.backend

    def meta_device(self, data_device: Optional[torch.device]) -> torch.device:
        """CPU with gloo; else the data's GPU (the current one where the data is unusable)."""
        if self.host_meta:
            return torch.device("cpu")
        if data_device is not None and data_device.type == "cuda":
            return data_device
        return torch.device("cuda", torch.cuda.current_device())

    def check_device(self, device: torch.device) -> None:
        if device.type == "cpu" and "gloo" not in self.backend:
            raise ValueError(f"weights: got CPU tensors with the {self.backend!r} backend; allowed: CUDA "
                             "tensors, or a group with the gloo backend")

    def _staged(self, inp: torch.Tensor) -> bool:
        return inp.device.type != "cpu" and "nccl" not in self.backend

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        if self._staged(inp):
            host = out.new_empty(out.shape, device="cpu")
            dist.all_gather_into_tensor(host, inp.cpu(), group=self.group)
            out.copy_(host)
        else:
            dist.all_gather_into_tensor(out, inp, group=self.group)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: Optional[list] = None,
                   in_splits: Optional[list] = None) -> None:
        if self._staged(inp):
            host = out.new_empty(out.shape, device="cpu")
            dist.all_to_all_single(host, inp.cpu(), out_splits, in_splits, group=self.group)
            out.copy_(host)
        else:
            dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group)


# ----------------------------------------------------------------------------------------------
# validation and metadata
# ----------------------------------------------------------------------------------------------
def _check_call(x, weights, topk_weights, topk_ids, activation: Activation, quant_mode: str, out) -> int:
    """validate_inputs, extended to a rank without tokens: a T = 0 call is checked as a one-token
    call with the same columns, dtypes and devices. Returns T."""
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0] == 0:
        for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights), ("out", out)):
            if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[0] != 0:
                raise ValueError(f"{name}: got {t.shape[0]} rows; allowed: T = 0 rows, as x")

        def one(t):
            return t.new_zeros((1, t.shape[1])) if isinstance(t, torch.Tensor) and t.dim() == 2 else t

        validate_inputs(one(x), weights, one(topk_weights), one(topk_ids), activation=activation,
                        quant_mode=quant_mode, out=None if out is None else one(out))
        return 0
    return validate_inputs(x, weights, topk_weights, topk_ids, activation=activation,
                           quant_mode=quant_mode, out=out).tokens


def _layer_key(weights: MoEWeights, activation: Activation, quant_mode: str) -> int:
    """A number that differs when two ranks' layers cannot be one layer (format, I, bias, mode, activation)."""
    desc = repr((weights.weight_format, weights.intermediate, weights.gated, weights.has_bias,
                 quant_mode, activation))
    return zlib.crc32(desc.encode())


def _meta_row(world: int, *, weights=None, activation=None, quant_mode=None, tokens=0, top_k=0,
              strategy=None, capacity=0) -> torch.Tensor:
    """This rank's metadata row (ok = 0 when ``weights`` is None: the rank rejected its inputs)."""
    row = torch.zeros(len(_META) + world, dtype=torch.int64)
    if weights is not None:
        vals = dict(ok=1, tokens=tokens, hidden=weights.hidden, top_k=top_k, num_experts=weights.num_experts,
                    layer=_layer_key(weights, activation, quant_mode),
                    strategy=_NO_STRATEGY if strategy is None else STRATEGIES.index(strategy),
                    capacity=capacity)
        row[: len(_META)] = torch.tensor([vals[f] for f in _META], dtype=torch.int64)
    return row


def _exchange(comm: _Group, row: torch.Tensor, weights, counts: Optional[torch.Tensor] = None) -> list:
    """All ranks' metadata rows as lists (one all_gather; ``counts``, if given, on the data's
    device, fills the row's tail there so that NCCL needs no extra host copy)."""
    dev = comm.meta_device(weights.device if isinstance(weights, MoEWeights) else None)
    mine = row.to(dev)
    if counts is not None:
        mine[len(_META):] = counts.to(dev)
    rows = torch.empty((comm.size, row.numel()), dtype=torch.int64, device=dev)
    comm.all_gather(rows, mine.view(1, -1))
    return rows.tolist()


def _agree(rows: list, rank: int, error: Optional[str]) -> None:
    """Raise the same ValueError on every rank when a rank rejected its inputs or the ranks'
    layers disagree (every rank sees the same rows, so every rank raises)."""
    bad = [r for r, row in enumerate(rows) if row[0] == 0]
    if error is not None:
        others = [r for r in bad if r != rank]
        raise ValueError(error + (f" (ranks {others} rejected theirs too)" if others else ""))
    if bad:
        raise ValueError(f"fused-moe EP: rank(s) {bad} of the group rejected their inputs (the reason is "
                         "raised there); nothing ran")
    for name in _AGREE:
        i = _META.index(name)
        vals = [row[i] for row in rows]
        if len(set(vals)) > 1:
            what = {"layer": "the layer (weight format, I, bias, quant_mode, activation)",
                    "strategy": "strategy", "capacity": "max_tokens_per_rank"}.get(name, name)
            shown = [None if v == _NO_STRATEGY else STRATEGIES[v] for v in vals] if name == "strategy" else vals
            raise ValueError(f"fused-moe EP: the ranks disagree on {what}: {shown} by rank; allowed: the "
                             "same on every rank")


# ----------------------------------------------------------------------------------------------
# strategy choice
# ----------------------------------------------------------------------------------------------
def _row_bytes(hidden: int, top_k: int) -> int:
    return _RowLayout(hidden, top_k).nbytes + 2 * hidden  # dispatched row + its bf16 result row


def strategy_bytes(tokens_per_rank: Sequence[int], rows: Sequence[Sequence[int]], hidden: int,
                   top_k: int) -> dict:
    """Bytes the busiest rank sends plus receives over the network, per strategy.
    ``rows[s][d]``: token rows rank s sends to rank d under all_to_all."""
    w = len(tokens_per_rank)
    per_row = _row_bytes(hidden, top_k)
    a2a = max((sum(rows[r][d] for d in range(w) if d != r) + sum(rows[s][r] for s in range(w) if s != r))
              * per_row for r in range(w))
    return {"all_to_all": a2a, "allgather": 2 * (w - 1) * max(tokens_per_rank) * per_row}


def choose_strategy(tokens_per_rank: Sequence[int], rows: Sequence[Sequence[int]], hidden: int,
                    top_k: int) -> tuple:
    """(strategy, reason): the rule ``strategy=None`` applies (see the module docstring)."""
    w, tmax = len(tokens_per_rank), max(tokens_per_rank)
    b = strategy_bytes(tokens_per_rank, rows, hidden, top_k)
    if w == 1:
        return "allgather", "one rank: nothing moves between ranks"
    if tmax <= ALLGATHER_MAX_TOKENS:
        return "allgather", (f"largest per-rank T = {tmax} <= {ALLGATHER_MAX_TOKENS}: latency-bound, "
                             "allgather needs no per-destination sort")
    share = b["all_to_all"] / b["allgather"]
    if share <= ALL_TO_ALL_MAX_SHARE:
        return "all_to_all", (f"all_to_all moves {share:.2f}x allgather's bytes on the busiest rank "
                              f"(<= {ALL_TO_ALL_MAX_SHARE})")
    return "allgather", (f"all_to_all would move {share:.2f}x allgather's bytes on the busiest rank "
                         f"(> {ALL_TO_ALL_MAX_SHARE}): not worth its sort")


@dataclass
class EPExplanation:
    """What ``fused_moe_ep`` runs for one call, and why (the same on every rank)."""

    strategy: str
    reason: str
    requested: Optional[str]
    tokens_per_rank: list
    rows: list  # rows[s][d]: token rows rank s sends to rank d under all_to_all
    bytes: dict  # busiest rank's sent + received bytes per strategy

    def __str__(self) -> str:
        how = f"requested {self.requested!r}" if self.requested else f"chosen: {self.reason}"
        lines = [f"fused_moe_ep over {len(self.tokens_per_rank)} ranks: {self.strategy} ({how})",
                 f"  tokens per rank: {self.tokens_per_rank}",
                 f"  all_to_all rows sent [from][to]: {self.rows}"]
        lines += [f"  {s:<10} busiest rank moves {self.bytes[s] / 2**20:.3f} MiB" for s in STRATEGIES]
        return "\n".join(lines)


def _explanation(rows: list, hidden: int, top_k: int, requested: Optional[str]) -> EPExplanation:
    tokens = [row[_META.index("tokens")] for row in rows]
    matrix = [row[len(_META):] for row in rows]
    if requested is None:
        strategy, reason = choose_strategy(tokens, matrix, hidden, top_k)
    else:
        strategy, reason = requested, "requested"
    return EPExplanation(strategy, reason, requested, tokens, matrix,
                         strategy_bytes(tokens, matrix, hidden, top_k))


# ----------------------------------------------------------------------------------------------
# rows on the wire
# ----------------------------------------------------------------------------------------------
class _RowLayout:
    """One dispatched token row as bytes: x (bf16 [H]) | topk_ids (int32 [k]) | topk_weights
    (fp32 [k]), so a dispatch is one collective. Padding rows are routed nowhere (ids -1)."""

    def __init__(self, hidden: int, top_k: int):
        self.hidden, self.top_k = hidden, top_k
        self.nbytes = 2 * hidden + 8 * top_k

    def empty(self, rows: int, device) -> torch.Tensor:
        return torch.zeros((rows, self.nbytes), dtype=torch.uint8, device=device)

    def views(self, buf: torch.Tensor) -> tuple:
        h2, k4 = 2 * self.hidden, 4 * self.top_k
        return (buf[:, :h2].view(torch.bfloat16), buf[:, h2:h2 + k4].view(torch.int32),
                buf[:, h2 + k4:].view(torch.float32))

    def pack(self, buf: torch.Tensor, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
        """Rows [0, T) from the tensors (ids already in [-1, E]), rows [T, end) routed nowhere."""
        vx, vi, vw = self.views(buf)
        t = x.shape[0]
        vx[:t].copy_(x)
        vi[:t].copy_(topk_ids)
        vw[:t].copy_(topk_weights)
        vi[t:].fill_(-1)
        vw[t:].zero_()

    def unpack(self, buf: torch.Tensor, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
        """Copy the rows into contiguous tensors (what the kernels take)."""
        vx, vi, vw = self.views(buf)
        x.copy_(vx)
        topk_ids.copy_(vi)
        topk_weights.copy_(vw)


def _clamped_ids(topk_ids: torch.Tensor, num_experts: int, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Ids clamped to [-1, E]: a route outside [0, E) stays outside it (dropped on every rank)
    and fits int32 on the wire."""
    return torch.clamp(topk_ids, -1, num_experts, out=out)


def _destinations(ids: torch.Tensor, num_experts: int, world: int) -> torch.Tensor:
    """[T, W] bool: token t has a route to an expert of rank d (ids already clamped)."""
    starts = torch.tensor(_range_starts(num_experts, world)[1:], dtype=ids.dtype, device=ids.device)
    owner = torch.bucketize(ids, starts, right=True)
    owner = torch.where((ids >= 0) & (ids < num_experts), owner, world)
    mask = torch.zeros((ids.shape[0], world + 1), dtype=torch.bool, device=ids.device)
    return mask.scatter_(1, owner, True)[:, :world]


def _sum_in_rank_order(parts: Iterable[torch.Tensor], acc: torch.Tensor, out: torch.Tensor) -> None:
    """out = bf16(part_0 + part_1 + ...) accumulated in fp32 in the given (rank) order."""
    for d, part in enumerate(parts):
        if d == 0:
            acc.copy_(part)
        else:
            acc.add_(part)
    out.copy_(acc)


class _Clock:
    """Adds each phase's seconds to ``timings`` (synchronizing the device at each phase's end);
    does nothing when ``timings`` is None."""

    def __init__(self, timings: Optional[dict], device: Optional[torch.device] = None):
        self.timings, self.device = timings, device
        self.last = time.perf_counter() if timings is not None else 0.0

    def lap(self, phase: str) -> None:
        if self.timings is None:
            return
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.timings[phase] = self.timings.get(phase, 0.0) + now - self.last
        self.last = now


# ----------------------------------------------------------------------------------------------
# the functional layer
# ----------------------------------------------------------------------------------------------
@dataclass
class _Call:
    x: torch.Tensor
    weights: MoEWeights
    topk_weights: torch.Tensor
    ids: torch.Tensor  # clamped to [-1, E]
    activation: Activation  # options.make_activation()
    options: CallOptions
    tokens: int
    top_k: int

    def local(self, x, topk_weights, topk_ids) -> torch.Tensor:
        """This rank's experts on the received rows (the dispatcher picks the kernel)."""
        if x.shape[0] == 0:
            return x.new_empty((0, self.weights.hidden))
        return fused_moe(x, self.weights, topk_weights, topk_ids,
                         **{**self.options.keywords(), "activation": self.activation})


def _prepare(comm: _Group, x, weights, topk_weights, topk_ids, *, strategy, options: CallOptions,
             out) -> tuple:
    """Steps 1-2: the local check and the metadata exchange -> (call, explanation, the [T, W]
    destination mask)."""
    call, error, mask = None, None, None
    try:
        if strategy is not None and strategy not in STRATEGIES:
            raise ValueError(f"strategy: got {strategy!r}; allowed: None (chosen per call), "
                             + ", ".join(repr(s) for s in STRATEGIES))
        act = options.make_activation()
        tokens = _check_call(x, weights, topk_weights, topk_ids, act, options.quant_mode, out)
        comm.check_device(weights.device)
        _check_partition(weights, comm.rank, comm.size)
        ids = _clamped_ids(topk_ids, weights.num_experts)
        call = _Call(x, weights, topk_weights, ids, act, options, tokens, topk_ids.shape[1])
        mask = _destinations(ids, weights.num_experts, comm.size)
    except ValueError as e:
        error = str(e)
    if call is None:
        row, counts = _meta_row(comm.size), None
    else:
        row = _meta_row(comm.size, weights=weights, activation=call.activation,
                        quant_mode=options.quant_mode, tokens=call.tokens, top_k=call.top_k,
                        strategy=strategy)
        counts = mask.sum(0)
    rows = _exchange(comm, row, weights, counts)
    _agree(rows, comm.rank, error)
    return call, _explanation(rows, weights.hidden, call.top_k, strategy), mask


def _run_all_to_all(comm: _Group, call: _Call, plan: EPExplanation, mask: torch.Tensor, out: torch.Tensor,
                    clock: _Clock) -> None:
    me, w, h = comm.rank, comm.size, call.weights.hidden
    layout = _RowLayout(h, call.top_k)
    dev = call.x.device
    send_counts = list(plan.rows[me])
    recv_counts = [plan.rows[s][me] for s in range(w)]
    pairs = mask.t().nonzero()  # (destination, token), destination-major: the send order
    dest, tok = pairs[:, 0], pairs[:, 1]
    sent, received = len(tok), sum(recv_counts)
    send = layout.empty(sent, dev)
    layout.pack(send, call.x.index_select(0, tok), call.ids.index_select(0, tok),
                call.topk_weights.index_select(0, tok))
    recv = layout.empty(received, dev)
    comm.all_to_all(recv, send, recv_counts, send_counts)
    xr = torch.empty((received, h), dtype=torch.bfloat16, device=dev)
    idr = torch.empty((received, call.top_k), dtype=torch.int32, device=dev)
    twr = torch.empty((received, call.top_k), dtype=torch.float32, device=dev)
    layout.unpack(recv, xr, idr, twr)
    clock.lap("dispatch")
    partial = call.local(xr, twr, idr)
    clock.lap("compute")
    back = torch.empty((sent + 1, h), dtype=torch.bfloat16, device=dev)
    back[sent].zero_()  # the row a token reads from a rank it does not route to
    comm.all_to_all(back[:sent], partial, send_counts, recv_counts)
    where = torch.full((call.tokens, w), sent, dtype=torch.long, device=dev)
    where[tok, dest] = torch.arange(sent, device=dev)
    acc = torch.empty((call.tokens, h), dtype=torch.float32, device=dev)
    _sum_in_rank_order((back.index_select(0, where[:, d]) for d in range(w)), acc, out)
    clock.lap("combine")


def _run_allgather(comm: _Group, call: _Call, plan: EPExplanation, out: torch.Tensor, clock: _Clock) -> None:
    w, h, t = comm.size, call.weights.hidden, call.tokens
    cap = max(plan.tokens_per_rank)
    layout = _RowLayout(h, call.top_k)
    dev = call.x.device
    send = layout.empty(cap, dev)
    layout.pack(send, call.x, call.ids, call.topk_weights)
    recv = layout.empty(w * cap, dev)
    comm.all_gather(recv, send)
    xg = torch.empty((w * cap, h), dtype=torch.bfloat16, device=dev)
    idg = torch.empty((w * cap, call.top_k), dtype=torch.int32, device=dev)
    twg = torch.empty((w * cap, call.top_k), dtype=torch.float32, device=dev)
    layout.unpack(recv, xg, idg, twg)
    clock.lap("dispatch")
    partial = call.local(xg, twg, idg)
    clock.lap("compute")
    back = torch.empty((w, cap, h), dtype=torch.bfloat16, device=dev)
    comm.all_to_all(back.view(w * cap, h), partial)
    acc = torch.empty((t, h), dtype=torch.float32, device=dev)
    _sum_in_rank_order((back[d, :t] for d in range(w)), acc, out)
    clock.lap("combine")


@takes_options
def fused_moe_ep(
    x: torch.Tensor,
    weights: MoEWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    group=None,
    strategy: Optional[str] = None,
    out: Optional[torch.Tensor] = None,
    timings: Optional[dict] = None,
    options: CallOptions,
) -> torch.Tensor:
    """One expert-parallel MoE layer; every rank of ``group`` (default: the world) calls it.

    ``x`` [T, H] bf16 holds this rank's tokens (T may differ between ranks, and be 0);
    ``topk_ids`` [T, k] global expert ids (ids outside [0, E), e.g. -1, are dropped routes);
    ``weights`` this rank's slice (``expert_range``); returns this rank's ``out`` [T, H] bf16,
    the single-process layer's result (see the module docstring for the numerics).
    ``strategy``: "all_to_all", "allgather" or None (chosen per call, the same on every rank).
    The keyword options (``activation``, ``quant_mode``, ``swiglu_*``, ``kernel``,
    ``deterministic``) are ``fused_moe``'s (``CallOptions``) and go to it on the local slice.
    ``timings``: a dict to which the seconds of "dispatch", "compute" and "combine" are added
    (the device is synchronized between phases: for measurement only) and "strategy" is set.
    Bad inputs on any rank raise ValueError on every rank.
    """
    comm = _Group(group)
    clock = _Clock(timings)  # the metadata exchange counts as dispatch
    call, plan, mask = _prepare(comm, x, weights, topk_weights, topk_ids, strategy=strategy,
                                options=options, out=out)
    if out is None:
        out = torch.empty((call.tokens, weights.hidden), dtype=torch.bfloat16, device=x.device)
    if timings is not None:
        timings["strategy"] = plan.strategy
    clock.device = x.device
    if max(plan.tokens_per_rank) == 0:  # no rank has tokens: the exchange was the whole call
        for phase in PHASES:
            clock.lap(phase)
        return out
    if plan.strategy == "all_to_all":
        _run_all_to_all(comm, call, plan, mask, out, clock)
    else:
        _run_allgather(comm, call, plan, out, clock)
    return out


@takes_options
def explain_ep(x: torch.Tensor, weights: MoEWeights, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
               *, group=None, strategy: Optional[str] = None, options: CallOptions) -> EPExplanation:
    """The strategy ``fused_moe_ep`` would run for this call and why (every rank calls it: it
    exchanges the metadata, but moves no tokens and runs no kernel). Takes ``fused_moe_ep``'s
    arguments but ``out`` and ``timings`` (``kernel`` and ``deterministic`` change nothing)."""
    comm = _Group(group)
    return _prepare(comm, x, weights, topk_weights, topk_ids, strategy=strategy, options=options,
                    out=None)[1]


# ----------------------------------------------------------------------------------------------
# the capturable layer
# ----------------------------------------------------------------------------------------------
class FusedMoEEP:
    """An expert-parallel layer with fixed-size collectives, ready for CUDA-graph capture.

    Every rank of ``group`` builds one with the same ``max_tokens_per_rank`` (C) and ``top_k``
    and its own slice of the experts; the keyword options are ``fused_moe``'s (``CallOptions``).
    A step is the allgather strategy at fixed size: this rank's T <= C rows are padded to C,
    all-gathered (W x C rows), run through a ``FusedMoE`` of this rank's slice at T = W x C, and
    the partial rows go back by an equal-split ``all_to_all_single`` and are summed in rank
    order (fp32) into ``out``. Every buffer is
    preallocated; a step makes no host sync and exchanges no metadata, so after ``warmup()`` it
    can be captured in a CUDA graph (NCCL collectives are capturable) and replayed.

    Every rank must call every step (a rank without tokens passes T = 0 rows). Inputs are
    checked on each rank before the first collective; a rank that raises there leaves the others
    waiting in the collective (the process group's timeout ends that), so a step's inputs should
    be right on every rank. The constructor itself checks the ranks agree and raises on all.

    ``__call__(x, topk_weights, topk_ids, timings=None)`` returns ``out[:T]``, a view of the
    owned buffer (the next step overwrites it).
    """

    @takes_options
    def __init__(self, weights: MoEWeights, max_tokens_per_rank: int, top_k: int, *, group=None,
                 options: CallOptions):
        self.comm = comm = _Group(group)
        error = None
        try:
            if not isinstance(weights, MoEWeights):
                raise ValueError(f"weights: got {type(weights).__name__}; allowed: moe_common.MoEWeights")
            if isinstance(max_tokens_per_rank, bool) or int(max_tokens_per_rank) < 1:
                raise ValueError(f"max_tokens_per_rank: got {max_tokens_per_rank}; allowed: >= 1")
            comm.check_device(weights.device)
            _check_partition(weights, comm.rank, comm.size)
            cap = int(max_tokens_per_rank)
            self.layer = FusedMoE(weights, comm.size * cap, top_k, **options.keywords())
        except ValueError as e:
            error = str(e)
        if error is None:
            row = _meta_row(comm.size, weights=weights, activation=self.layer.activation,
                            quant_mode=options.quant_mode, top_k=self.layer.top_k, capacity=cap)
        else:
            row = _meta_row(comm.size)
        _agree(_exchange(comm, row, weights), comm.rank, error)
        self.weights, self.capacity, self.top_k = weights, cap, self.layer.top_k
        self.layout = _RowLayout(weights.hidden, self.top_k)
        dev, w, h, k = weights.device, comm.size, weights.hidden, self.top_k
        self.send = self.layout.empty(cap, dev)
        self.recv = self.layout.empty(w * cap, dev)
        self.x_all = torch.zeros((w * cap, h), dtype=torch.bfloat16, device=dev)
        self.ids_all = torch.full((w * cap, k), -1, dtype=torch.int32, device=dev)
        self.weights_all = torch.zeros((w * cap, k), dtype=torch.float32, device=dev)
        self.ids64 = torch.empty((cap, k), dtype=torch.int64, device=dev)  # clamping int64 ids in place
        self.back = torch.empty((w, cap, h), dtype=torch.bfloat16, device=dev)
        self.acc = torch.empty((cap, h), dtype=torch.float32, device=dev)
        self.out = torch.empty((cap, h), dtype=torch.bfloat16, device=dev)

    def warmup(self, *, seed: int = 0) -> "FusedMoEEP":
        """Compile and allocate the local layer at T = W x C (the only T a step runs), freeze its
        workspace, then run one step without tokens so the collectives are set up. Every rank
        calls it."""
        gen = torch.Generator().manual_seed(seed)
        rows = self.comm.size * self.capacity
        x = (torch.randn((rows, self.weights.hidden), generator=gen) * 0.5).to(torch.bfloat16).to(self.weights.device)
        tw, ids = _dummy_routing(rows, self.top_k, self.weights, self.weights.device, gen)
        self.layer.warmup([rows], seed=seed)  # compiles, synchronizes and freezes this thread's state
        k = self.top_k
        self(x[:0], tw[:0].reshape(0, k), ids[:0].reshape(0, k))
        return self

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 timings: Optional[dict] = None) -> torch.Tensor:
        t = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() >= 1 else -1
        if t > self.capacity:
            raise ValueError(f"x: got T = {t} tokens; allowed: T <= max_tokens_per_rank = {self.capacity}")
        if isinstance(topk_ids, torch.Tensor) and topk_ids.dim() == 2 and topk_ids.shape[1] != self.top_k:
            raise ValueError(f"topk_ids: got top_k = {topk_ids.shape[1]}; allowed: {self.top_k} "
                             "(the top_k this FusedMoEEP was built for)")
        # Host-only checks (no value reads, no sync): safe under capture.
        _check_call(x, self.weights, topk_weights, topk_ids, self.layer.activation, self.layer.quant_mode, None)
        clock = _Clock(timings, self.weights.device)
        w, cap = self.comm.size, self.capacity
        ids = topk_ids
        if ids.dtype == torch.int64:
            ids = _clamped_ids(ids, self.weights.num_experts, out=self.ids64[:t])
        # int32 ids need no clamp: any int32 outside [0, E) is outside every rank's range.
        self.layout.pack(self.send, x, ids, topk_weights)
        self.comm.all_gather(self.recv, self.send)
        self.layout.unpack(self.recv, self.x_all, self.ids_all, self.weights_all)
        clock.lap("dispatch")
        partial = self.layer(self.x_all, self.weights_all, self.ids_all)
        clock.lap("compute")
        self.comm.all_to_all(self.back.view(w * cap, -1), partial)
        _sum_in_rank_order((self.back[d, :t] for d in range(w)), self.acc[:t], self.out[:t])
        clock.lap("combine")
        return self.out[:t]
