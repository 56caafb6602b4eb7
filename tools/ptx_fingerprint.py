"""The md5 of the PTX of every production kernel configuration, compiled for sm_90a on the CPU.

A refactor of the kernel packages must leave every line of this tool's output unchanged:

    uv run python tools/ptx_fingerprint.py > before.txt      # at the base commit
    uv run python tools/ptx_fingerprint.py > after.txt       # after the change
    diff <(cut -d' ' -f1-2 before.txt) <(cut -d' ' -f1-2 after.txt)

(the first two columns: a configuration's description changes where a development-only field
leaves its config, its place in the list does not). One line takes 0.5-3 s; the whole list
(236 configurations) about 4 minutes on two cores.

Steps:
1. List every configuration the dispatcher can launch: each kernel package's
   compile_cache.all_configs(), moe-gated's row scatter per tile width, and moe-common's
   routing and top-k reduce kernels as the runners call them.
2. Compile each with the DSL keeping its PTX (CUTE_DSL_KEEP=ptx, set before cutlass is imported).
3. Print one line per configuration: md5 of the PTX, the package, the configuration.

`--only moe-static` (repeatable) limits the packages; `--dump DIR` also writes each PTX to DIR
(named by line number) for a diff where an md5 changed.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from pathlib import Path

PACKAGES = ("moe-common", "moe-static", "moe-gated", "moe-generic")


def _common():
    from moe_common.cute import jit

    out = []
    for idb in (4, 8):
        out.append((f"routing ids_bytes={idb}", lambda idb=idb: jit.routing(idb)))
        out.append((f"routing_split ids_bytes={idb}",
                    lambda idb=idb: jit.routing_split(idb)))
    return out


def _reduces(blocks: list, weighted: bool):
    """The top-k reduces a runner launches: one per paired block and ids width."""
    from moe_common.cute import jit

    tag = " weighted" if weighted else ""
    return [(f"topk_reduce ids_bytes={idb} paired={b}{tag}",
             lambda idb=idb, b=b: jit.topk_reduce(idb, paired=b, weighted=weighted))
            for b in blocks for idb in (4, 8)]


def _kernel_configs(module):
    return [(repr(cfg), lambda cfg=cfg: module.compile_config(cfg)) for cfg in module.all_configs()]


def _static():
    from moe_static import compile_cache

    return _kernel_configs(compile_cache)


def _gated():
    from moe_gated import compile_cache
    from moe_gated.kernel import GEOMETRIES, y_block

    widths = sorted({bn for bn, _ in GEOMETRIES.values()})
    scatters = [(f"row_scatter bn={bn}", lambda bn=bn: compile_cache.row_scatter(bn))
                for bn in widths]
    return (_kernel_configs(compile_cache) + scatters
            + _reduces([y_block(g) for g in GEOMETRIES], weighted=True))


def _generic():
    from moe_generic import compile_cache
    from moe_generic.grouped_gemm import Y_BLOCK

    return _kernel_configs(compile_cache) + _reduces([Y_BLOCK], weighted=False)


BUILDERS = {"moe-common": _common, "moe-static": _static, "moe-gated": _gated,
            "moe-generic": _generic}


def _ptx_of(compiled) -> list:
    """The PTX texts of a compiled function or of a tuple of them (routing_split)."""
    if isinstance(compiled, tuple):
        return [t for c in compiled for t in _ptx_of(c)]
    text = compiled.__ptx__
    if not text:
        raise RuntimeError("the DSL kept no PTX (CUTE_DSL_KEEP=ptx must be set before import)")
    return [text]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", choices=PACKAGES,
                    help="fingerprint only this package's kernels (repeatable)")
    ap.add_argument("--dump", type=Path, help="also write each configuration's PTX here")
    args = ap.parse_args(argv)
    os.environ["CUTE_DSL_KEEP"] = "ptx"
    os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="ptx_fingerprint_"))
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
    n = 0
    for package in args.only or PACKAGES:
        for name, build in BUILDERS[package]():
            text = "\n".join(_ptx_of(build()))
            n += 1
            if args.dump:
                (args.dump / f"{n:03d}.ptx").write_text(text)
            digest = hashlib.md5(text.encode()).hexdigest()
            print(f"{n:03d} {digest} {package} {name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
