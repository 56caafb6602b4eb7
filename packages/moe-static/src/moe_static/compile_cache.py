"""moe-static's compiled kernels, keyed by their static facts (see moe_common.cute.jit)."""
from __future__ import annotations

from moe_common.cute import jit
from moe_common.types import ACTIVATIONS, WEIGHT_FORMATS

from .kernel import StaticConfig, StaticMoE, StaticOperands

# Warps per FC1 and per FC2 unit that the runner chooses between (runner.choose_teams)
TEAM_SHAPES = ((2, 2), (1, 1), (2, 1), (1, 2))


def config(weight_format: str, activation: str, ids_bytes: int = 4,
           teams: tuple = TEAM_SHAPES[0], cta_reduce: bool = False) -> StaticConfig:
    return StaticConfig(weight_format=weight_format, activation=activation, ids_bytes=ids_bytes,
                        team_fc1=teams[0], team_fc2=teams[1], cta_reduce=cta_reduce)


def compile_config(cfg: StaticConfig):
    from cutlass import Int32

    return jit.compile_kernel(StaticMoE(cfg), jit.example(StaticOperands), Int32(1),
                              jit.example_stream())


def get(weight_format: str, activation: str, ids_bytes: int = 4, teams: tuple = TEAM_SHAPES[0],
        cta_reduce: bool = False):
    cfg = config(weight_format, activation, ids_bytes, teams, cta_reduce)
    return cfg, jit.compiled(("moe-static", cfg), lambda: compile_config(cfg))


def all_configs():
    """Every configuration the dispatcher can pick (CPU CI compiles each for sm_90a)."""
    return [config(f, a, b, t, c) for c in (False, True) for f in WEIGHT_FORMATS
            for a in ACTIVATIONS for b in (4, 8) for t in TEAM_SHAPES]
