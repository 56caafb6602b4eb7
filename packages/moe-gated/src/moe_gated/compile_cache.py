"""moe-gated's compiled kernels, keyed by their static facts (see moe_common.cute.jit)."""
from __future__ import annotations

from moe_common.cute import jit
from moe_common.types import WEIGHT_FORMATS

from .kernel import GEOMETRIES, GatedConfig, GatedGemm, GatedOperands
from .limits import ACTIVATIONS


def config(phase: str, weight_format: str, activation: str, geometry: str = "wide",
           overlap: bool = False) -> GatedConfig:
    return GatedConfig(phase=phase, weight_format=weight_format,
                       activation=activation if phase == "fc1" else "none", geometry=geometry,
                       overlap=overlap)


def compile_config(cfg: GatedConfig):
    return jit.compile_kernel(GatedGemm(cfg), jit.example(GatedOperands), jit.example_stream())


def row_scatter(bn: int):
    """The token-row scatter into FC1's tiles of bn tokens."""
    from cutlass import Int32, Int64

    from .row_scatter import RowScatter

    z = Int64(0)
    i1 = Int32(1)
    return jit.compiled(("moe-gated", "row_scatter", bn), lambda: jit.compile_kernel(
        RowScatter(bn), z, Int32(128), Int32(128), i1, i1, z, z, i1, jit.example_stream()))


def get(phase: str, weight_format: str, activation: str, geometry: str = "wide",
        overlap: bool = False):
    cfg = config(phase, weight_format, activation, geometry, overlap)
    return cfg, jit.compiled(("moe-gated", cfg), lambda: compile_config(cfg))


def all_configs():
    """Every configuration the dispatcher can pick (CPU CI compiles each for sm_90a): with FC2
    beside FC1 (w4a16), then without (w4a4, where a requantization runs between them)."""
    out = []
    for overlap in (True, False):
        for geometry in GEOMETRIES:
            for fmt in WEIGHT_FORMATS:
                out += [config("fc1", fmt, a, geometry, overlap) for a in ACTIVATIONS]
                out.append(config("fc2", fmt, "none", geometry, overlap))
    return out
