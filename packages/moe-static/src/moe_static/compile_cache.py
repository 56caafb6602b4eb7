"""moe-static's compiled kernels, keyed by their static facts (see moe_common.cute.jit)."""
from __future__ import annotations

from moe_common.cute import jit
from moe_common.knobs import choice, int_in, int_tuple, knob, names

from .kernel import StaticConfig, StaticMoE

FORMATS = ("nvfp4", "mxfp4")
ACTIVATIONS = ("silu", "gelu_tanh", "swigluoai", "relu2")


# Warps per FC1 and per FC2 unit that the runner chooses between (runner.choose_teams)
TEAM_SHAPES = ((2, 2), (1, 1), (2, 1), (1, 2))

# Knobs for measuring variants (moe_common.knobs; the defaults are the measured best):
# MOE_STATIC_TEAMS=a,b forces the warps per FC1 and per FC2 unit (tuning).
FORCED_TEAMS = knob("MOE_STATIC_TEAMS", None, int_tuple(2, (1, 2)),
                    allowed="two of 1, 2 separated by a comma, e.g. 1,2")
# MOE_STATIC_SKIP=tasks,route,barriers,reduce leaves those parts out (wrong output: timing the
# fixed cost only; tasks = the FC1 and FC2 units). Needs FUSED_MOE_DEV=1.
SKIP = knob("MOE_STATIC_SKIP", frozenset(), names(("tasks", "route", "barriers", "reduce")),
            allowed="a comma-separated subset of tasks, route, barriers, reduce",
            changes_results=True)
# MOE_STATIC_VARIANT=nodecode|nob|nomma|stamps drops one stage of the stream or records
# timestamps (timing only, see kernel). Needs FUSED_MOE_DEV=1.
VARIANT = knob("MOE_STATIC_VARIANT", "", choice(("nodecode", "nob", "nomma", "stamps")),
               allowed="nodecode, nob, nomma, stamps", changes_results=True)
# MOE_STATIC_EVEN_GAIN=p: split a GEMM in even shares when that shortens the busiest warp's
# stream by at least p percent (default 10, see StaticMoE._even_share; tuning)
EVEN_GAIN = knob("MOE_STATIC_EVEN_GAIN", 10, int_in(0, 100), allowed="an integer 0..100")


def config(weight_format: str, activation: str, ids_bytes: int = 4,
           teams: tuple = TEAM_SHAPES[0]) -> StaticConfig:
    teams = FORCED_TEAMS or teams
    return StaticConfig(weight_format=weight_format, activation=activation, ids_bytes=ids_bytes,
                        team_fc1=teams[0], team_fc2=teams[1],
                        skip=SKIP, variant=VARIANT, even_gain=EVEN_GAIN)


def compile_config(cfg: StaticConfig):
    from cutlass import Float32, Int32, Int64

    z = Int64(0)
    i1 = Int32(1)
    args = ([z] * 11 + [Int32(128)] + [i1, i1, Int32(0), i1, Int32(128), i1, Int32(16), Int32(8), i1]
            + [z] * 5 + [Float32(1.0), Float32(1.0), Float32(1.0), i1, jit.example_stream()])
    return jit.compile_kernel(StaticMoE(cfg), *args)


def get(weight_format: str, activation: str, ids_bytes: int = 4, teams: tuple = TEAM_SHAPES[0]):
    cfg = config(weight_format, activation, ids_bytes, teams)
    return cfg, jit.compiled(("moe-static", cfg), lambda: compile_config(cfg))


def all_configs():
    """Every configuration the dispatcher can pick (CPU CI compiles each for sm_90a)."""
    return [config(f, a, b, t) for f in FORMATS for a in ACTIVATIONS for b in (4, 8)
            for t in TEAM_SHAPES]
