"""moe-generic's compiled kernels, keyed by their static facts (see moe_common.cute.jit)."""
from __future__ import annotations

import dataclasses

from moe_common.cute import jit
from moe_common.knobs import choice, int_choice, int_in, knob

from .grouped_gemm import GemmConfig, GroupedGemm

BN_CHOICES = (8, 16, 32, 64)


# The mainloop's MMA. mma.sync measured faster than the synchronous-per-K-tile wgmma mainloop at
# every bench point on the H200 (2026-11-29, BENCHMARKS.md: DeepSeek-V3 T=8192 25.0 vs 27.5 ms),
# so it is the default; MOE_GENERIC_MMA=wgmma selects the warpgroup path (tested too).
USE_WGMMA = knob("MOE_GENERIC_MMA", "sync", choice(("sync", "wgmma")),
                 allowed="sync, wgmma") == "wgmma"
# Warps per CTA for the 64-token (prefill) tiles: 8 warps x 1 group holds the same 128 x 64 tile
# and shared memory as 4 x 2, with twice the warps per SM to hide the decode's latency
# (MOE_GENERIC_WARPS64=4 selects the 4-warp layout, for measuring).
# 256-row tiles of 16 warps x 1 group, one CTA per SM, where the rows allow it and the K loop
# is longer than 16 K-tiles: half the token-row traffic per weight row of the 128-row tiles, and
# the K loop long enough to pay for one CTA per SM. Measured on the H200 (BENCHMARKS.md,
# 2026-11-30 fourth session): DeepSeek-V3 FC1 (56 K-tiles) and gpt-oss FC1 (23) faster by
# 3.5-4%, GEMMs of 16 K-tiles slower (Qwen3 T=8192 2.76 -> 2.88 ms with every GEMM tall).
# MOE_GENERIC_TALL_MIN_KT / MOE_GENERIC_STAGES64 override, for measuring.
WARPS64 = knob("MOE_GENERIC_WARPS64", 8, int_choice((4, 8)), allowed="4, 8")
TALL_MIN_KTILES = knob("MOE_GENERIC_TALL_MIN_KT", 17, int_in(1), allowed="an integer >= 1")
STAGES64 = knob("MOE_GENERIC_STAGES64", 4, int_in(1), allowed="an integer >= 1")


def config(phase: str, weight_format: str, activation: str, bn: int, rows: int = 0,
           k_tiles: int = 0) -> GemmConfig:
    """The tile for one GEMM of `rows` weight rows (a multiple of 128) and `k_tiles` K-tiles."""
    warps = WARPS64 if bn == 64 and not USE_WGMMA else 4
    if warps == 8 and bn == 64 and not USE_WGMMA and k_tiles >= TALL_MIN_KTILES:
        warps = 16
    if warps * 16 > 128 and rows % (warps * 16) != 0:
        warps = 8
    mw = 1 if bn <= 16 else max(1, 8 // warps)
    stages = STAGES64 if warps > 8 else 4
    return GemmConfig(phase=phase, weight_format=weight_format,
                      activation=activation if phase == "fc1" else "none", bn=bn,
                      mw=mw, wgmma=USE_WGMMA, warps=warps, stages=stages)


def compile_config(cfg: GemmConfig):
    from cutlass import Float32, Int32, Int64

    z = Int64(0)
    args = ([z] * 9 + [Int32(1), z, Int32(128), Int32(128), Int32(1), Int32(8), z, Int32(128),
                       Int32(128), z, z, Float32(1.0), Float32(1.0), Float32(1.0), Int32(1), Int32(1),
                       jit.example_stream()])
    return jit.compile_kernel(GroupedGemm(cfg), *args)


def get(phase: str, weight_format: str, activation: str, bn: int, rows: int, k_tiles: int):
    cfg = config(phase, weight_format, activation, bn, rows, k_tiles)
    return cfg, jit.compiled(("moe-generic", cfg), lambda: compile_config(cfg))


def all_configs(wgmma: bool | None = None):
    """Every configuration the dispatcher can pick (CPU CI compiles each for sm_90a)."""
    out = []
    for fmt in ("nvfp4", "mxfp4"):
        for bn in BN_CHOICES:
            for act in ("silu", "gelu_tanh", "swigluoai", "relu2"):
                out.append(config("fc1", fmt, act, bn))
            out.append(config("fc2", fmt, "none", bn))
        # the 256-row tiles of long K loops
        for act in ("silu", "gelu_tanh", "swigluoai", "relu2"):
            out.append(config("fc1", fmt, act, 64, rows=256, k_tiles=TALL_MIN_KTILES))
        out.append(config("fc2", fmt, "none", 64, rows=256, k_tiles=TALL_MIN_KTILES))
    if wgmma:  # one warpgroup of 4 warps x 2 groups for the 32- and 64-token tiles
        out = [dataclasses.replace(c, wgmma=True, warps=4, mw=1 if c.bn <= 16 else 2, stages=4)
               for c in out]
    return list(dict.fromkeys(out))
