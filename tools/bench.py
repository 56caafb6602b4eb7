#!/usr/bin/env python3
"""Thin wrapper: `uv run tools/bench.py ARGS` == `uv run fused-moe bench ARGS`.

The benchmark itself lives in dispatcher/src/dispatcher/bench.py (so the installed `fused-moe`
command has it); this file keeps the benchmark entry in tools/ (docs/DESIGN.md section 7).
"""
import sys

from dispatcher.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
