"""The MMA loops of a kernel configuration's SASS, counted on the CPU (development tool).

    uv run python tools/sass_loops.py --package moe-gated --match "fc1.*nvfp4.*silu.*tall"

A consumer loop bound by its issue slots (moe-gated's at 32-64 tokens: BENCHMARKS.md) gets
faster only with fewer instructions per K-tile or more of them issued per cycle; the first is
visible before any GPU run. Steps:
1. Compile each configuration of the package whose description matches `--match` (a regular
   expression on the lines `tools/ptx_fingerprint.py` prints), keeping its PTX.
2. Assemble it for sm_90a with `ptxas -v` (registers, spills) and disassemble it (cuobjdump).
3. Find the innermost loops (backward branches) whose body holds MMA instructions (HGMMA,
   HMMA) and print, per loop, its address range, its instruction count, its MMAs and its most
   frequent opcodes.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MMA_OPS = ("HGMMA", "HMMA")
_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\s+(?:`\()?0x([0-9a-f]+)")


def parse_sass(text: str) -> list:
    """[(address, instruction)] of a cuobjdump -sass listing (one kernel)."""
    return [(int(m.group(1), 16), m.group(2)) for m in map(_INSTR.match, text.splitlines())
            if m]


def opcode(instr: str) -> str:
    """The opcode without predicate and modifiers: '@!P0 HGMMA.64x32x16.F32' -> 'HGMMA'."""
    parts = instr.split()
    op = parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]
    return op.split(".")[0]


def mma_loops(instrs: list) -> list:
    """The innermost loops holding an MMA: [(start, end, [instructions])], by address. A
    backward branch whose range only partly overlaps a smaller such loop is not a loop: ptxas
    places the retry of an mbarrier wait after the kernel's code and branches back into it."""
    spans = set()
    for addr, instr in instrs:
        m = _BRANCH.search(instr)
        if m and int(m.group(1), 16) < addr:
            spans.add((int(m.group(1), 16), addr))
    with_mma = {}
    for start, end in spans:
        body = [i for a, i in instrs if start <= a <= end]
        if any(opcode(i) in MMA_OPS for i in body):
            with_mma[(start, end)] = body

    def inside(a, b):  # span a within span b
        return b[0] <= a[0] and a[1] <= b[1] and a != b

    def crosses(a, b):  # a and b overlap, neither within the other
        return a[0] <= b[1] and b[0] <= a[1] and not inside(a, b) and not inside(b, a)

    return sorted((s, e, body) for (s, e), body in with_mma.items()
                  if not any(inside(o, (s, e)) or (crosses(o, (s, e)) and o[1] - o[0] < e - s)
                             for o in with_mma))


def summary(body: list, top: int = 8) -> str:
    ops = Counter(opcode(i) for i in body)
    mma = sum(ops[o] for o in MMA_OPS)
    common = ", ".join(f"{o} {n}" for o, n in ops.most_common(top))
    return f"{len(body)} instructions, {mma} MMA: {common}"


def _cuobjdump(assembler: str):
    """cuobjdump beside the assembler (triton ships both), else PATH's."""
    import shutil

    beside = Path(assembler).parent / "cuobjdump"
    return str(beside) if beside.exists() else shutil.which("cuobjdump")


def probe_listing(probe: str, args, kernel_glob: str, tmp_path) -> tuple:
    """(ptxas's report, [(address, SASS instruction)]) of the one kernel that `probe` compiles
    (moe_common.testing.ptxas_report, which skips the calling test without ptxas; this skips
    it without cuobjdump)."""
    import pytest

    from moe_common.testing import ptxas, ptxas_report

    text = ptxas_report(probe, args, kernel_glob, tmp_path)
    disassembler = _cuobjdump(ptxas())
    if disassembler is None:
        pytest.skip("no cuobjdump")
    sass = subprocess.run([disassembler, "-sass", str(Path(tmp_path) / "k.cubin")],
                          capture_output=True, text=True, check=True).stdout
    return text, parse_sass(sass)


def probe_sass(probe: str, args, kernel_glob: str, tmp_path) -> tuple:
    """(ptxas's report, [SASS instruction]): probe_listing without the addresses."""
    text, listing = probe_listing(probe, args, kernel_glob, tmp_path)
    return text, [i for _, i in listing]


def report(ptx: str, workdir: Path) -> str:
    """ptxas -v's summary lines and the MMA loops of one kernel's PTX."""
    from moe_common.testing import ptxas

    assembler = ptxas()
    disassembler = _cuobjdump(assembler) if assembler else None
    if disassembler is None:
        raise RuntimeError("needs ptxas and cuobjdump (torch's triton ships both)")
    src, cubin = workdir / "k.ptx", workdir / "k.cubin"
    src.write_text(ptx)
    res = subprocess.run([assembler, "-arch=sm_90a", "-v", str(src), "-o", str(cubin)],
                         capture_output=True, text=True, check=True)
    lines = [ln.split(":", 1)[-1].strip() for ln in (res.stdout + res.stderr).splitlines()
             if "registers" in ln or "spill" in ln]
    sass = subprocess.run([disassembler, "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    for start, end, body in mma_loops(parse_sass(sass)):
        lines.append(f"loop {start:#06x}-{end:#06x}: {summary(body)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--package", required=True, choices=("moe-static", "moe-gated",
                                                         "moe-generic", "moe-common"))
    ap.add_argument("--match", default=".", help="regular expression on the configuration")
    args = ap.parse_args(argv)
    os.environ["CUTE_DSL_KEEP"] = "ptx"
    os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="sass_loops_"))
    from ptx_fingerprint import BUILDERS, _ptx_of

    found = 0
    for name, build in BUILDERS[args.package]():
        if not re.search(args.match, name):
            continue
        found += 1
        print(name, flush=True)
        for text in _ptx_of(build()):
            with tempfile.TemporaryDirectory() as tmp:
                print("  " + report(text, Path(tmp)).replace("\n", "\n  "), flush=True)
    if not found:
        print(f"no {args.package} configuration matches {args.match!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
