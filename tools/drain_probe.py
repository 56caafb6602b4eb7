"""How long moe-gated's SMs sit idle at the start and the end of each GEMM (development tool,
GPU).

    python tools/drain_probe.py --preset deepseek-v3 --tokens 1024 [--seed 1] [--json out.json]

The persistent CTAs take equal-sized items from a queue, so they finish their last items at
different times: with N items of duration d on P CTAs the last one starts anywhere in the final
d, and a CTA waits on average about d / 2 for the slowest, a fraction P / (2 N) of the GEMM
(DeepSeek-V3 T=1024: FC1 4096 items, 1.6%; FC2 7168, 0.9%). `tools/gpu_steps.sh tail-probe`
asks a different question (does the last wave's size matter); this one measures the idle time
itself:
1. moe-gated's consumer side is patched (before anything compiles) to stamp the global timer
   into a buffer: per CTA the earliest consumer warp's start and the latest one's end, FC1 and
   FC2 apart;
2. the layer (moe-gated forced) runs as a CUDA graph of `--copies` calls on distinct inputs for
   `--warm` seconds (profile_split.warm_graph), so the GPU reaches its sustained clock and
   power (BENCHMARKS.md: the band runs at the power cap);
3. the buffer is reset and one call on the first input runs;
4. per GEMM: its span (first start to last end), the CTAs' mean start offset and mean idle
   before the last end, as us and as fractions of the span, and the queue's items (tiles x
   row tiles) with the P / (2 N) the model above expects.
The kernel's results are right (the stamps only add stores); they are not checked here.
At 1e99d1f on an H100 (benchmarks/HISTORY.md, 2026-12-06): DeepSeek-V3 T=1024 35.2 us after FC1
(2.0%) and 9.1 after FC2 (0.95%), 1.7% of the call; 3.5-6.3% of each GEMM at Qwen3-30B-A3B and
Qwen3.5-35B T = 512-2048; every CTA starts within 0.2 us of the first.
"""
from __future__ import annotations

import argparse
import json

import torch

PHASES = ("fc1", "fc2")
MAX_CTAS = 1024  # stamp slots per GEMM (one CTA per SM)


def patch(buf_addr: int) -> None:
    """GatedGemm._consumer wrapped: lane 0 of each consumer warp stamps the global timer with
    red.min into its CTA's start slot before its work and red.max into the end slot after."""
    import cutlass.cute as cute
    from cutlass import Int64
    from cutlass.cutlass_dsl import dsl_user_op

    from moe_common.cute import ptx
    from moe_gated.kernel import GatedGemm

    @dsl_user_op
    def stamp(addr, op: str, *, loc=None, ip=None):
        ptx._stmt([Int64(addr).ir_value(loc=loc, ip=ip)],
                  "{ .reg .u64 t; mov.u64 t, %globaltimer; red.global." + op + ".u64 [$0], t; }",
                  "l")

    consumer = GatedGemm._consumer

    @cute.jit
    def _consumer(self, s_base, warp, lane, total, ops):
        bid, _, _ = cute.arch.block_idx()
        slot = Int64(buf_addr) + (Int64(PHASES.index(self.cfg.phase) * MAX_CTAS) + Int64(bid)) * 16
        if lane == 0:
            stamp(slot, "min")
        consumer(self, s_base, warp, lane, total, ops)
        if lane == 0:
            stamp(slot + 8, "max")

    GatedGemm._consumer = _consumer


def items(ids: torch.Tensor, experts: int, fc_rows: dict) -> dict:
    """Work items per GEMM of the tall geometry: sum over experts of ceil(pairs / 128) token
    tiles, times the row tiles of 256 rows."""
    from moe_gated.kernel import GEOMETRIES, row_tile

    bn = GEOMETRIES["tall"][0]
    counts = torch.bincount(ids.flatten().long().clamp(min=0), minlength=experts)
    tiles = int(((counts + bn - 1) // bn).sum())
    return {ph: tiles * -(-rows // row_tile("tall")) for ph, rows in fc_rows.items()}


def summarize(stamps: torch.Tensor, n_items: int) -> dict:
    """One GEMM's [CTAs, 2] start / end stamps (ns; unused slots dropped) -> the summary."""
    used = stamps[stamps[:, 1] > 0].double()
    first, last = used[:, 0].min(), used[:, 1].max()
    span = float(last - first)
    start = float((used[:, 0] - first).mean())
    wait = last - used[:, 1]  # each CTA's idle time before the last one ends
    idle = float(wait.mean())
    ctas = used.shape[0]
    return {"ctas": ctas, "items": n_items, "span_us": span / 1e3,
            "start_offset_us": start / 1e3, "end_idle_us": idle / 1e3,
            "start_offset_frac": start / span, "end_idle_frac": idle / span,
            "model_end_idle_frac": ctas / (2 * n_items), "end_idle_max_us": float(wait.max()) / 1e3}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", nargs="+", default=["deepseek-v3"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1024])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--warm", type=float, default=2.0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    buf = torch.zeros(len(PHASES) * MAX_CTAS, 2, dtype=torch.int64, device="cuda")
    patch(buf.data_ptr())
    from dispatcher.presets import PRESETS, random_weights
    from profile_split import warm_graph

    rows = []
    for name in args.preset:
        p = PRESETS[name]
        w = random_weights(p, device="cuda", seed=args.seed)
        for t in args.tokens:
            layer, inputs, _ = warm_graph(p, w, t, "moe-gated", args.copies, args.warm,
                                          seed=args.seed + 1)
            buf[:, 0] = torch.iinfo(torch.int64).max
            buf[:, 1] = 0
            x, tw, ids = inputs[0]
            layer(x, tw, ids)
            torch.cuda.synchronize()
            stamps = buf.view(len(PHASES), MAX_CTAS, 2).cpu()
            n = items(ids, p.experts, {"fc1": p.n1, "fc2": p.hidden})
            for i, ph in enumerate(PHASES):
                r = {"preset": name, "tokens": t, "gemm": ph, **summarize(stamps[i], n[ph])}
                rows.append(r)
                pct = {k: 100 * r[k] for k in ("start_offset_frac", "end_idle_frac",
                                                   "model_end_idle_frac")}
                print(f"{name} T={t} {ph}: {r['ctas']} CTAs, {r['items']} items, span "
                      f"{r['span_us']:.1f} us; start offset {r['start_offset_us']:.1f} us "
                      f"({pct['start_offset_frac']:.2f}%), end idle {r['end_idle_us']:.1f} us "
                      f"({pct['end_idle_frac']:.2f}%; model {pct['model_end_idle_frac']:.2f}%; "
                      f"max {r['end_idle_max_us']:.1f} us)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
