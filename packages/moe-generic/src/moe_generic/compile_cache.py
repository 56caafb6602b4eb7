"""moe-generic's compiled kernels, keyed by their static facts (see moe_common.cute.jit)."""
from __future__ import annotations

from moe_common.cute import jit
from moe_common.types import ACTIVATIONS, WEIGHT_FORMATS

from .grouped_gemm import GemmConfig, GemmOperands, GroupedGemm

# the widths the kernel is built and tested at (the CPU CI compiles each, the GPU tests force
# each): runner.pick_bn dispatches 32, 48 and 64; 8 and 16 stay for probes and forced runs
BN_CHOICES = (8, 16, 32, 48, 64)


# Warps per CTA for the 64-token (prefill) tiles: 8 warps x 1 group holds the same 128 x 64 tile
# and shared memory as 4 x 2, with twice the warps per SM to hide the decode's latency.
# 256-row tiles of 16 warps x 1 group, one CTA per SM, where the rows allow it and the K loop
# is longer than 16 K-tiles: half the token-row traffic per weight row of the 128-row tiles, and
# the K loop long enough to pay for one CTA per SM. Measured on the H200 (BENCHMARKS.md,
# a87134d..19248e6): DeepSeek-V3 FC1 (56 K-tiles) and gpt-oss FC1 (23) faster by
# 3.5-4%, GEMMs of 16 K-tiles slower (Qwen3 T=8192 2.76 -> 2.88 ms with every GEMM tall).
WARPS64 = 8
TALL_MIN_KTILES = 17
STAGES = 4  # cp.async ring depth of every tile
# 32-token tiles: one copy-only warp feeding a 3-deep ring through mbarriers (GemmConfig.
# producer_warps) in place of the MMA warps' own copies and a CTA barrier per K-tile. Measured on
# the H200 (tools/band_probe.py --config '32:producer_warps=1,stages=3', BENCHMARKS.md decisions):
# DeepSeek-V3 T=256 / 512 -4.1% / -3.4%, Qwen3-30B-A3B T=128 / 256 -2.7% / -4.6% (5321ecb); the
# landed hand-over (256bc33) in a five-preset same-run A/B: -2.5% to -4.8% at T = 256-512. A
# producer warp at every width with 4 stages: level at 32 tokens, up to 6% slower at the 8- and
# 16-token tiles (DeepSeek-V3 T=128 1858.6 -> 1976.3 us). Its copies are bulk copies
# (GemmConfig.producer_bulk): five presets x 10 T against 52d4e0e, same run, -8% to -12% at the
# 32-token points (DeepSeek-V3 T=256 2185.7 -> 1913.7 us; 268912f). Where K has a tail the
# producer zeroes it itself (GemmConfig.k_tail): gpt-oss-120b T=256 / 512 563.3 / 683.2 ->
# 523.1 / 649.7 us (2d9a234, `tools/band_probe.py --config '32/fc1:producer_bulk=True'`).
# The 48-token tiles (runner.MID_MIN_ROWS) take the same producer with a 2-deep ring: at 112-116
# registers they run 3 CTAs per SM either way, and 2 stages were as fast or faster than 3 at all
# four 32-row points (DeepSeek-V3 T=1024 3274.4 against 3283.7 us, Qwen3.5-35B T=1024 321.5 /
# 332.9; `tools/gpu_steps.sh mid-widths`). 8 warps x 1 group: slower on the large experts
# (gpt-oss-120b T=1024 996.9 against 968.8), level on the small ones at 2 stages (Qwen3-30B-A3B
# T=512 224.8 against 223.1; `mid-small`).
PRODUCER_STAGES = {32: 3, 48: 2}  # the widths with the bulk producer warp: their ring depths


def config(phase: str, weight_format: str, activation: str, bn: int, rows: int = 0,
           k_tiles: int = 0, k_tail: bool = False, overlap: bool = False) -> GemmConfig:
    """The tile for one GEMM of `rows` weight rows (a multiple of 128) and `k_tiles` K-tiles;
    `k_tail`: its real K stops inside the last K-tile (FC1 of a hidden size that is not a
    multiple of 128; FC2 reads the intermediate zero-padded to whole K-tiles); `overlap`: FC2
    follows FC1 directly (w4a16), and where the tile has the bulk producer FC2 starts beside
    FC1's last CTAs (GemmConfig.overlap; both GEMMs of a call take the same bn, so both or
    neither)."""
    warps = WARPS64 if bn == 64 else 4
    if warps == 8 and bn == 64 and k_tiles >= TALL_MIN_KTILES:
        warps = 16
    if warps * 16 > 128 and rows % (warps * 16) != 0:
        warps = 8
    mw = 1 if bn <= 16 else max(1, 8 // warps)
    producer = bn in PRODUCER_STAGES
    return GemmConfig(phase=phase, weight_format=weight_format,
                      activation=activation if phase == "fc1" else "none", bn=bn,
                      mw=mw, warps=warps, stages=PRODUCER_STAGES.get(bn, STAGES),
                      producer_warps=1 if producer else 0,
                      producer_bulk=producer, k_tail=producer and k_tail,
                      overlap=producer and overlap)


def compile_config(cfg: GemmConfig):
    from cutlass import Int32

    return jit.compile_kernel(GroupedGemm(cfg), jit.example(GemmOperands), Int32(1), Int32(1),
                              jit.example_stream())


def unfit_reason(cfg: GemmConfig, rows: int, k_tail: bool = False):
    """Why `cfg` (config's own, or a probe's or test's replacement) would compute a GEMM of
    `rows` weight rows, with or without a K tail, wrongly; None when it fits."""
    # the grid has rows // cta_rows CTAs along the rows: the rest would stay unwritten
    if rows % cfg.cta_rows:
        return f"{rows} weight rows are not a multiple of the tile's {cfg.cta_rows}"
    # bulk copies do not zero-fill: past a K tail only a producer that zeroes it itself
    if k_tail and cfg.producer_bulk and not cfg.k_tail:
        return "its bulk copies would read columns past the real K (k_tail not set)"
    # the overlap's count and wait sit in the bulk producer's path
    if cfg.overlap and not cfg.producer_bulk:
        return "FC2 beside FC1 (overlap) needs the bulk producer warp"
    return None


def get(phase: str, weight_format: str, activation: str, bn: int, rows: int, k_tiles: int,
        k_tail: bool = False, overlap: bool = False):
    cfg = config(phase, weight_format, activation, bn, rows, k_tiles, k_tail, overlap)
    reason = unfit_reason(cfg, rows, k_tail)
    if reason is not None:
        raise ValueError(f"moe-generic: {reason} ({cfg})")
    return cfg, jit.compiled(("moe-generic", cfg), lambda: compile_config(cfg))


def all_configs():
    """Every configuration the dispatcher or a forced width (BN_CHOICES) can run (CPU CI
    compiles each for sm_90a)."""
    out = []
    for fmt in WEIGHT_FORMATS:
        for bn in BN_CHOICES:
            for overlap in (False, True):  # one config where the width has no bulk producer
                for act in ACTIVATIONS:
                    for k_tail in (False, True):  # one config where the tail changes nothing
                        out.append(config("fc1", fmt, act, bn, k_tail=k_tail, overlap=overlap))
                out.append(config("fc2", fmt, "none", bn, overlap=overlap))
        # the 256-row tiles of long K loops
        for act in ACTIVATIONS:
            out.append(config("fc1", fmt, act, 64, rows=256, k_tiles=TALL_MIN_KTILES))
        out.append(config("fc2", fmt, "none", 64, rows=256, k_tiles=TALL_MIN_KTILES))
    return list(dict.fromkeys(out))
