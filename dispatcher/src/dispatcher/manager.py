"""Plugin loading and kernel selection.

Every entry point of the group ``fused_moe.kernels`` names one module; each is imported and
registered with a ``pluggy.PluginManager("fused_moe")`` under the entry point's name. A module
that fails to import (a missing DSL, a syntax error, a hook with the wrong signature) is
recorded with its error and skipped: it never makes the dispatcher unusable.

Selection asks every plugin's ``can_handle(shape, activation)`` hook *individually*, so a
plugin that raises is reported as a decline instead of aborting the call, and picks the offer
with the highest priority; ties are broken by kernel name (ascending), so the choice never
depends on installation or import order. Answers are pure host logic: the manager caches the
choice per (shape, activation, forced kernel), so repeated calls cost one dict lookup. The cache
holds at most MAX_CACHED_CHOICES entries (the oldest goes first), so a process that sees many
shapes (every T of a server's batches) keeps a bounded map; FusedMoE keeps its own per-T list and
selects without this cache.
"""
from __future__ import annotations

import importlib
import os
import threading
from dataclasses import dataclass, field
from typing import Iterable, Optional

import pluggy

from moe_common.types import Activation, Decline, MoEShape, Offer

from . import hookspecs
from .hookspecs import ENTRY_POINT_GROUP, PROJECT

ENV_KERNEL = "FUSED_MOE_KERNEL"
# Cached choices kept by a manager: a served model's calls vary in T (up to a few thousand
# distinct values per layer shape); an entry is a few hundred bytes.
MAX_CACHED_CHOICES = 4096


def _metadata():
    try:
        import importlib_metadata as md  # the backport tracks the newest behaviour
    except ImportError:  # pragma: no cover - the dependency is declared
        import importlib.metadata as md
    return md


@dataclass(frozen=True)
class LoadFailure:
    """An entry point that could not be used: its name, target and the error."""

    name: str
    target: str
    distribution: Optional[str]
    error: str

    def __str__(self) -> str:
        dist = f" (from {self.distribution})" if self.distribution else ""
        return f"{self.name} = {self.target}{dist}: {self.error}"


@dataclass(frozen=True)
class Answer:
    """One plugin's answer to one call.

    ``status`` is "offer", "decline" or "error" (the hook raised or returned something that is
    not an Offer/Decline; treated as a decline, ``reason`` holds the error).
    """

    plugin: str
    kernel: str
    status: str
    priority: Optional[int] = None
    reason: str = ""
    offer: Optional[Offer] = field(default=None, compare=False, repr=False)

    @property
    def offered(self) -> bool:
        return self.status == "offer"


def _rank(offer: Offer):
    # Highest priority first; among equal priorities the smallest name first.
    return (-offer.priority, offer.kernel)


@dataclass
class Explanation:
    """Every plugin's answer to one call and what the dispatcher would run.

    ``choice`` is the Offer that runs (None when nothing can, or when a forced kernel declines:
    then ``error`` says why, with the same message ``fused_moe`` raises).
    """

    shape: MoEShape
    activation: Activation
    answers: list
    failures: list
    choice: Optional[Offer]
    forced: Optional[str] = None
    forced_from: Optional[str] = None  # "argument" | "environment (FUSED_MOE_KERNEL)"
    error: Optional[str] = None

    @property
    def offers(self) -> list:
        """The offers, best first (the order the dispatcher ranks them)."""
        return sorted((a.offer for a in self.answers if a.offered), key=_rank)

    @property
    def declines(self) -> list:
        return [a for a in self.answers if not a.offered]

    def answer(self, kernel: str) -> Optional[Answer]:
        for a in self.answers:
            if a.kernel == kernel or a.plugin == kernel:
                return a
        return None

    def __str__(self) -> str:
        s = self.shape
        cap = "cpu" if s.device_capability is None else "sm_%d%d" % tuple(s.device_capability)
        act = self.activation.name
        if act == "swigluoai":
            act += f"(alpha={self.activation.alpha}, beta={self.activation.beta}, limit={self.activation.limit})"
        lines = [
            f"fused_moe call: T={s.tokens} H={s.hidden} I={s.intermediate} "
            f"E={s.num_experts} (local {s.num_local_experts} from {s.local_expert_offset}) "
            f"top_k={s.top_k} {s.weight_format} {s.quant_mode} activation={act} "
            f"bias={'yes' if s.has_bias else 'no'} device={cap} dtype={str(s.dtype).replace('torch.', '')}",
            "plugins:",
        ]
        width = max([len(a.kernel) for a in self.answers] + [len(f.name) for f in self.failures] + [6])
        best = self.offers
        for a in sorted(self.answers, key=lambda a: (not a.offered, -(a.priority or 0), a.kernel)):
            if a.offered:
                mark = "*" if self.choice is not None and a.offer is self.choice else " "
                note = f"  ({a.offer.note})" if a.offer is not None and a.offer.note else ""
                lines.append(f" {mark} {a.kernel:<{width}}  offers, priority {a.priority}{note}")
            elif a.status == "error":
                lines.append(f"   {a.kernel:<{width}}  error: {a.reason}")
            else:
                lines.append(f"   {a.kernel:<{width}}  declines: {a.reason}")
        for f in self.failures:
            lines.append(f"   {f.name:<{width}}  failed to load: {f.error}")
        if not self.answers and not self.failures:
            lines.append("   (no plugins installed in entry-point group %r)" % ENTRY_POINT_GROUP)
        if self.forced:
            lines.append(f"forced: {self.forced!r} (from {self.forced_from})")
        if self.choice is not None:
            why = "forced" if self.forced else (
                "highest priority" if len(best) < 2 or best[0].priority != best[1].priority
                else "highest priority, tie broken by name")
            lines.append(f"choice: {self.choice.kernel} (priority {self.choice.priority}, {why})")
        else:
            lines.append(f"choice: none ({self.error})")
        return "\n".join(lines)


class KernelManager:
    """The loaded plugins of group ``fused_moe.kernels`` and the selection logic."""

    def __init__(self, entry_points: Optional[Iterable] = None):
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.failures: list[LoadFailure] = []
        self.plugins: dict[str, object] = {}
        self._choices: dict = {}
        self._lock = threading.Lock()
        if entry_points is None:
            entry_points = _metadata().entry_points(group=ENTRY_POINT_GROUP)
        self._load(entry_points)

    # -- loading ----------------------------------------------------------------------------
    def _load(self, entry_points: Iterable) -> None:
        seen: dict[str, str] = {}
        for ep in sorted(entry_points, key=lambda e: e.name):
            dist = getattr(getattr(ep, "dist", None), "name", None)
            if ep.name in seen:
                self.failures.append(LoadFailure(
                    ep.name, ep.value, dist,
                    f"duplicate entry point name; {seen[ep.name]} already provides it"))
                continue
            seen[ep.name] = dist or ep.value
            try:
                module = ep.load()
                self.pm.register(module, name=ep.name)
            except Exception as e:  # noqa: BLE001 - any failure to import is reported, not fatal
                self.failures.append(LoadFailure(ep.name, ep.value, dist, f"{type(e).__name__}: {e}"))
                continue
            if not self.pm.get_hookcallers(module):
                self.pm.unregister(module)
                self.failures.append(LoadFailure(
                    ep.name, ep.value, dist,
                    "defines no can_handle hook marked with pluggy.HookimplMarker('fused_moe')"))
                continue
            self.plugins[ep.name] = module

    @property
    def names(self) -> list:
        """Names of the plugins that loaded (entry-point names), sorted."""
        return sorted(self.plugins)

    # -- asking -----------------------------------------------------------------------------
    def answers(self, shape: MoEShape, activation: Activation) -> list:
        """Every loaded plugin's answer, in plugin-name order; never raises for a plugin."""
        out: list[Answer] = []
        args = {"shape": shape, "activation": activation}
        impls = sorted(self.pm.hook.can_handle.get_hookimpls(), key=lambda i: i.plugin_name)
        for impl in impls:
            name = impl.plugin_name
            try:
                result = impl.function(*[args[a] for a in impl.argnames])
            except Exception as e:  # noqa: BLE001 - a raising plugin is a decline
                out.append(Answer(name, name, "error", reason=f"can_handle raised {type(e).__name__}: {e}"))
                continue
            results = result if isinstance(result, (list, tuple)) else [result]
            if not results:
                results = [None]
            for r in results:
                if isinstance(r, Offer):
                    out.append(Answer(name, r.kernel, "offer", priority=int(r.priority), offer=r))
                elif isinstance(r, Decline):
                    out.append(Answer(name, r.kernel, "decline", reason=r.reason))
                elif r is None:
                    out.append(Answer(name, name, "decline", reason="can_handle returned None (no answer)"))
                else:
                    out.append(Answer(name, name, "error",
                                      reason=f"can_handle returned {type(r).__name__}, not Offer/Decline"))
        return out

    def explain(self, shape: MoEShape, activation: Activation, kernel: Optional[str] = None,
                *, use_env: bool = True) -> Explanation:
        forced, source = resolve_forced(kernel, use_env=use_env)
        answers = self.answers(shape, activation)
        choice, error = self._decide(answers, forced, source)
        return Explanation(shape, activation, answers, list(self.failures), choice,
                           forced=forced, forced_from=source, error=error)

    def select(self, shape: MoEShape, activation: Activation, kernel: Optional[str] = None,
               *, use_env: bool = True, cache: bool = True) -> Offer:
        """The Offer that runs this call; raises ValueError if a forced kernel cannot.

        Cached per (shape, activation, forced kernel) unless `cache` is False (callers that
        keep their own): pure host logic, no device work.
        """
        forced, source = resolve_forced(kernel, use_env=use_env)
        key = (shape, activation, forced)
        choice = self._choices.get(key) if cache else None
        if choice is not None:
            return choice
        choice, error = self._decide(self.answers(shape, activation), forced, source)
        if choice is None:
            raise ValueError(error)
        if cache:
            with self._lock:
                while len(self._choices) >= MAX_CACHED_CHOICES:
                    del self._choices[next(iter(self._choices))]  # the oldest entry
                self._choices[key] = choice
        return choice

    def _decide(self, answers: list, forced: Optional[str], source: Optional[str]):
        if forced is not None:
            matching = [a for a in answers if a.kernel == forced]
            if not matching:
                matching = [a for a in answers if a.plugin == forced]
            offers = sorted((a.offer for a in matching if a.offered), key=_rank)
            if offers:
                return offers[0], None
            via = f" (from {source})" if source else ""
            if matching:
                reasons = "; ".join(a.reason for a in matching)
                return None, f"kernel {forced!r}{via} declined: {reasons}"
            for f in self.failures:
                if f.name == forced:
                    return None, f"kernel {forced!r}{via} failed to load: {f.error}"
            known = sorted({a.kernel for a in answers} | set(self.plugins))
            msg = f"kernel {forced!r}{via}: no such kernel; loaded: {', '.join(known) or 'none'}"
            if self.failures:
                msg += "; failed to load: " + ", ".join(f.name for f in self.failures)
            return None, msg
        offers = sorted((a.offer for a in answers if a.offered), key=_rank)
        if offers:
            return offers[0], None
        if not answers:
            msg = f"no fused-MoE kernel plugin is installed (entry-point group {ENTRY_POINT_GROUP!r})"
            if self.failures:
                msg += "; failed to load: " + "; ".join(str(f) for f in self.failures)
            return None, msg
        return None, "no kernel can run this call: " + "; ".join(
            f"{a.kernel}: {a.reason}" for a in answers)


def resolve_forced(kernel: Optional[str], *, use_env: bool = True):
    """(name, source) of the forced kernel: the argument wins over FUSED_MOE_KERNEL."""
    if kernel:
        return kernel, "argument"
    if use_env:
        env = os.environ.get(ENV_KERNEL, "").strip()
        if env:
            return env, f"environment {ENV_KERNEL}"
    return None, None


_MANAGER: Optional[KernelManager] = None
_MANAGER_LOCK = threading.Lock()


def get_manager() -> KernelManager:
    """The process-wide manager, loaded on first use."""
    global _MANAGER
    m = _MANAGER
    if m is None:
        with _MANAGER_LOCK:
            if _MANAGER is None:
                _MANAGER = KernelManager()
            m = _MANAGER
    return m


def reload() -> KernelManager:
    """Forget the loaded plugins and cached choices, rescan the entry points (tests, notebooks)."""
    global _MANAGER
    importlib.invalidate_caches()
    with _MANAGER_LOCK:
        _MANAGER = KernelManager()
        return _MANAGER
