"""moe-gated's compiled kernels, keyed by their static facts (see moe_common.cute.jit)."""
from __future__ import annotations

from moe_common.cute import jit
from moe_common.knobs import choice, int_in, knob

from .kernel import GEOMETRIES, GatedConfig, GatedGemm

FORMATS = ("nvfp4", "mxfp4")
ACTIVATIONS = ("silu", "gelu_tanh", "swigluoai")

# Knobs for measuring variants (moe_common.knobs; the defaults are the measured best):
# MOE_GATED_PENDING=j leaves j wgmma slabs in flight across K-tiles (default: the geometry's;
# tuning); MOE_GATED_VARIANT=nodecode|nomma|nostore times the kernel without the decode, without
# the MMA or without the epilogues' global stores (wrong output: timing only, needs
# FUSED_MOE_DEV=1); a suffix -fc1 or -fc2 applies the variant to that phase only.
PENDING = knob("MOE_GATED_PENDING", None, int_in(0), allowed="an integer >= 0")
VARIANT = knob("MOE_GATED_VARIANT", "full",
               choice(tuple(v + s for v in ("full", "nodecode", "nomma", "nostore")
                            for s in ("", "-fc1", "-fc2"))),
               allowed="full, nodecode, nomma or nostore, optionally with -fc1 or -fc2",
               changes_results=True)


def config(phase: str, weight_format: str, activation: str, geometry: str = "wide") -> GatedConfig:
    variant = VARIANT
    if variant.endswith(("-fc1", "-fc2")):  # e.g. nostore-fc2: one phase only
        variant, only = variant.rsplit("-", 1)
        variant = variant if only == phase else "full"
    return GatedConfig(phase=phase, weight_format=weight_format,
                       activation=activation if phase == "fc1" else "none", geometry=geometry,
                       pending=PENDING, variant=variant)


def compile_config(cfg: GatedConfig):
    from cutlass import Float32, Int32, Int64

    z = Int64(0)
    i1 = Int32(1)
    args = ([z] * 10 + [i1, Int32(16), z, Int32(128), Int32(128),
                        Float32(1.0), Float32(1.0), Float32(1.0), z, i1, jit.example_stream()])
    return jit.compile_kernel(GatedGemm(cfg), *args)


def row_scatter(bn: int):
    """The token-row scatter into FC1's tiles of bn tokens."""
    from cutlass import Int32, Int64

    from .row_scatter import RowScatter

    z = Int64(0)
    i1 = Int32(1)
    return jit.compiled(("moe-gated", "row_scatter", bn), lambda: jit.compile_kernel(
        RowScatter(bn), z, Int32(128), Int32(128), i1, i1, z, z, i1, jit.example_stream()))


def get(phase: str, weight_format: str, activation: str, geometry: str = "wide"):
    cfg = config(phase, weight_format, activation, geometry)
    return cfg, jit.compiled(("moe-gated", cfg), lambda: compile_config(cfg))


def all_configs():
    """Every configuration the dispatcher can pick (CPU CI compiles each for sm_90a)."""
    out = []
    for geometry in GEOMETRIES:
        for fmt in FORMATS:
            out += [config("fc1", fmt, a, geometry) for a in ACTIVATIONS]
            out.append(config("fc2", fmt, "none", geometry))
    return out
