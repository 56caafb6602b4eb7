"""Environment knobs of the kernel packages: read, checked and reported in one place.

A knob is an environment variable a package reads once, at import. Two kinds:

  tuning knobs (`changes_results=False`): another tiling, team shape or pipeline depth of the
      same math; results stay within the reference bar (the fp32 summation order may differ,
      so not bitwise equal to the default's). Honoured, with a warning naming them.
  development knobs (`changes_results=True`): timing variants that leave work out (wrong
      output by design). Honoured only while FUSED_MOE_DEV=1, which says so in a warning;
      otherwise ignored, with a warning.

A value that does not parse is ignored with a warning naming the variable and what is allowed:
a typo never disables a kernel (the plugin still loads and runs its default).
"""
from __future__ import annotations

import logging
import os
from typing import Callable, Optional, TypeVar

DEV_ENV = "FUSED_MOE_DEV"
log = logging.getLogger("moe_common.knobs")
T = TypeVar("T")


def dev_mode() -> bool:
    """True while FUSED_MOE_DEV=1: development knobs that change results are honoured."""
    return os.environ.get(DEV_ENV, "") == "1"


def knob(name: str, default: T, parse: Callable[[str], T], *, allowed: str,
         changes_results: bool = False) -> T:
    """The value of environment variable `name` (parse(text)), or `default` when it is unset,
    empty, malformed, or a development knob outside FUSED_MOE_DEV=1 (each logged)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = parse(text)
    except (TypeError, ValueError) as e:
        log.warning("%s=%r ignored: %s; allowed: %s", name, text, e, allowed)
        return default
    if changes_results and not dev_mode():
        log.warning("%s=%r ignored: it changes results (a timing variant); set %s=1 to honour "
                    "it", name, text, DEV_ENV)
        return default
    kind = "development knob (results are wrong by design)" if changes_results else "tuning knob"
    log.warning("%s=%r in effect: %s", name, text, kind)
    return value


def choice(options: tuple) -> Callable[[str], str]:
    """A parser accepting one of `options`."""
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(f"{text!r} is not one of them")
        return text
    return parse


def int_in(lo: int, hi: Optional[int] = None) -> Callable[[str], int]:
    """A parser of an integer in [lo, hi] (hi None: no upper bound)."""
    def parse(text: str) -> int:
        v = int(text)
        if v < lo or (hi is not None and v > hi):
            raise ValueError(f"{v} is outside {lo}..{'' if hi is None else hi}")
        return v
    return parse


def int_choice(options: tuple) -> Callable[[str], int]:
    """A parser of one integer from `options`."""
    def parse(text: str) -> int:
        v = int(text)
        if v not in options:
            raise ValueError(f"{v} is not one of {options}")
        return v
    return parse


def int_tuple(length: int, options: tuple) -> Callable[[str], tuple]:
    """A parser of `length` comma-separated integers, each one of `options`."""
    def parse(text: str) -> tuple:
        v = tuple(int(p) for p in text.split(","))
        if len(v) != length or any(p not in options for p in v):
            raise ValueError(f"{text!r} is not {length} of {options} separated by commas")
        return v
    return parse


def names(options: tuple) -> Callable[[str], frozenset]:
    """A parser of a comma-separated set of names from `options`."""
    def parse(text: str) -> frozenset:
        v = frozenset(p for p in text.split(",") if p)
        bad = sorted(v - set(options))
        if bad:
            raise ValueError(f"unknown {bad}")
        return v
    return parse
