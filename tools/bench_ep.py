#!/usr/bin/env python3
"""`uv run tools/bench_ep.py --ep N ARGS` == `uv run fused-moe bench --ep N ARGS`: the expert-parallel
benchmark (dispatcher/src/dispatcher/bench_ep.py). Under torchrun --ep may be left out (WORLD_SIZE):

    torchrun --nproc-per-node 2 tools/bench_ep.py --preset deepseek-v3 --tokens 1 128 2048 8192 --json ep2.json
"""
import os
import sys

from dispatcher.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--ep" not in argv and "WORLD_SIZE" in os.environ:
        argv = ["--ep", os.environ["WORLD_SIZE"], *argv]
    sys.exit(main(["bench", *argv]))
