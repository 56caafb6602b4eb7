"""How much of moe-gated's time each side of its pipeline holds (development tool, GPU).

    python tools/pipeline_probe.py --preset deepseek-v3 qwen3-30b-a3b --tokens 512 1024 2048 \
        [--modes MODE ...] [--seed 1] [--json out.json] [--mode-timeout 150]

moe-gated's consumer warps decode and multiply stages that its producer warp fills by bulk copy
(moe_gated.kernel). Whether a point is bound by the copies or by the consumers is read off by
taking one side away:
1. `full`: the kernel as shipped.
2. `consumers`: the producer still takes every stage in turn (it waits for the stage's release
   and completes the stage's full barrier) but copies nothing, neither weights nor token rows,
   expecting 0 bytes, so the consumers decode and multiply whatever the stage holds: the
   consumer side alone (the epilogues still write their outputs).
3. `producer`: the consumers wait for each stage and release it without decoding it or running
   its wgmmas: the copies alone.
Candidates for what the first three find, on the same footing:
4. `onecopy`: each K-tile's weights as one copy of the row tile's bytes, as record blocks of
   16 groups would have them, where the records (moe_common.fragments.BLOCK_GROUPS) come in
   blocks of 8: the tall geometry's two copies per K-tile made one (wrong results: the second
   half's bytes are not the ones the consumers expect). As `tilerec` (one copy per K-tile
   against one per group), before the blocks: 0.96-0.99 of the shipped time (BENCHMARKS.md).
5. `width48`: a 48-token MMA width in the tall geometry, between 32 and 64 (at 32 routed rows
   per expert, 1.21 MMA columns per routed pair instead of 1.43); results right, checked.
   Shipped in FC1 since the width was measured 1.7-4.8% faster at ~32 rows (BENCHMARKS.md), so
   the mode now adds it to FC2 alone (kernel.FC1_ONLY_WIDTHS).
6. `width16`: a 16-token MMA width in the tall geometry (at 16 routed rows per expert, 1.46 MMA
   columns per routed pair instead of 2.00; ptxas spills in the consumers, see BENCHMARKS.md);
   results right, checked. `width80`: an 80-token width between 64 and 96 (at 64 routed rows
   per expert, ~1.13 MMA columns per routed pair instead of ~1.24); results right, checked;
   measured 2-4% faster there and shipped since e999638 (the mode is then the shipped kernel).
   Each of these adds its width to the tall tile's shipped ones (moe_gated.kernel.WIDTHS), in
   FC1 and FC2 alike. `fc1ladder-W-W-...` (e.g. `fc1ladder-128-96-80-64-48-40-32`): FC1's
   tall widths exactly these, FC2's as shipped; results right, checked.
What the consumers' own time goes to, the same way (their ratios to `consumers` split it):
7. `nodecode`: the e2m1 decode and block-scale multiply taken away, each k16 slab's wgmmas
   fed the raw code words as A (wgmma_decode._slab_ptx patched): the copies, the shared-memory
   loads and the wgmmas.
8. `nomma`: the wgmmas taken away, each slab's decoded A registers folded into an accumulator
   by three XORs and an add (so the decode stays live) where its wgmmas were: the copies and
   the decode.
9. `mmaonly`: `consumers` and `nodecode` together: the wgmmas (and the stages' barriers) alone.
10. `noepilogue`: the epilogues taken away (FC1's scale, bias, activation and its staged
   stores of the intermediate; FC2's scale, bias and y stores): each consumer thread adds up its
   accumulators and stores nothing unless the sum is -3e38 (so the wgmmas stay live), FC2's
   token table and its barrier kept. The consumers' share that runs between items, when a CTA's
   wgmmas stop: what overlapping the epilogue with the next item's mainloop could win at most.
11. `nob`: the token rows (B) not copied: the producer copies and expects the weights alone and
   the consumers multiply whatever B the stage holds: what B's L2 -> shared-memory traffic
   costs (a K-tile's B is 8 KB at 32 tokens beside 18-20 KB of weight records in the tall
   tile). Two CTAs of a cluster sharing B by TMA multicast (the queue handing out pairs of row
   tiles of one token tile) would save at most half of it. `halfb`: each K-tile's B as its first
   64-column half alone (half the bytes read from L2 and written to shared memory): the most
   that multicast, which halves the L2 reads alone, could return.
What one-byte block scales would buy (the records hold bf16 scales: NVFP4's 1280-byte record
is 11% larger than the checkpoint's codes and e4m3 scales, MXFP4's 1152 6%):
12. `bytescales`: records of the checkpoint's size (1152 / 1088 bytes: the scale bytes as they
   come, so the values are wrong) with the conversion a one-byte format needs: a lane loads its
   rows' 16 (NVFP4) or 8 (MXFP4) scale bytes in one load and makes each bf16x2 scale word of
   two fields in place (one LOP3: mask, OR the exponent's offset) or after a rotation by 8
   (SHF, LOP3): 12 instructions for NVFP4's 8 words, 6 for MXFP4's 4, where bf16 scales take a
   second 16-byte load (measured: BENCHMARKS.md, not built).
What the padded MMA columns' data costs (a tile's token slots past its pairs, up to the MMA
width, hold whatever earlier calls left there: other routings' token rows; at the power cap a
tensor core multiplying zeros may draw less than one multiplying data):
13. `padzero` and `padnoise`: every input copy of the bench's rotation routed as the first (so
   no call writes a slot that another call pads) and moe-gated's tile-blocked B buffers
   (PAD_BUFFERS) zero-filled (`padzero`) or filled with randn bf16 (`padnoise`) when allocated:
   the same work, the padded columns all zeros or all data. Results right, checked.
`bytescales`, `padzero`, `padnoise` and `full` also run moe-generic or moe-static (`--kernel`).
With `--clocks` each (preset, T) is also timed beside `nvidia-smi`'s SM clock and board power
(every 50 ms, ClockSampler), summarized over the samples near the point's highest power (its
bench replays): a mode that takes work away can also raise the clock the rest runs at, since
these points run at the GPU's power cap (BENCHMARKS.md: 1538 MHz at 700 W with the weight
stream, 1980 MHz without, DeepSeek-V3 T=1024).
Each mode runs in a process of its own with moe_gated.kernel.GatedGemm (bytescales: moe-common's
records and their loads) patched before anything compiles (compiled kernels are cached per
configuration, not per patch); the shipped kernel is unchanged. `consumers`, `producer`,
`onecopy`, `nodecode`, `nomma`, `mmaonly`, `noepilogue`, `nob` and `bytescales` compute wrong
results by design (no check).
Rows print as `fused-moe bench` prints them, the kernel labelled with the mode, then a summary
of each mode's time over the shipped kernel's.
"""
from __future__ import annotations

import argparse
import json
import contextlib
import os
import re
import statistics
import subprocess
import sys
import tempfile

MODES = ("full", "consumers", "producer", "onecopy", "width48", "width16", "width80",
         "nodecode", "nomma", "mmaonly", "noepilogue", "nob", "halfb", "bytescales",
         "padzero", "padnoise")
# modes that patch moe-common or the bench, not moe-gated
ANY_KERNEL = ("full", "bytescales", "padzero", "padnoise")
# the modes whose results are right
CHECKED = ("full", "width48", "width16", "width80", "padzero", "padnoise")
# the tile-blocked B buffers whose token slots past a tile's pairs no kernel writes
PAD_BUFFERS = ("x_blocked", "inter_blocked")
LADDER = re.compile(r"^fc1ladder(-\d+)+$")  # FC1's tall widths (results right: checked)
ALLOWED = f"{', '.join(MODES)}, fc1ladder-W-W-..."  # what an unknown mode's error lists


def checked(mode: str) -> bool:
    """Whether the mode's results are right, so the bench checks them."""
    return mode in CHECKED or bool(LADDER.match(mode))


def mode_arg(mode: str) -> str:
    """A mode named on the command line: one of MODES or an FC1 ladder."""
    if mode in MODES or LADDER.match(mode):
        return mode
    raise argparse.ArgumentTypeError(f"mode {mode!r}; allowed: {ALLOWED}")


def _raw_codes_slab(g: int, s: int, codes, s_r: str, s_r8: str, half: int) -> list:
    """wgmma_decode._slab_ptx without the decode (nodecode): A registers = the raw code word
    of the slab (codes: the words of its slab pair)."""
    return [f"mov.b32 a{g}_{s}{j}, {codes[s % 2]};" for j in range(4)]


_WGMMA = re.compile(r"^wgmma\.mma_async\S* \{(\$\d+)[^}]*\}, \{([^}]*)\}, .*;$")


def _fold_wgmmas(text: str) -> str:
    """An inline-asm block with each wgmma replaced by XORs of its A registers added into its
    first accumulator (nomma); other blocks unchanged."""
    if "wgmma.mma_async" not in text:
        return text
    out = []
    for line in text.split("\n"):
        m = _WGMMA.match(line)
        if not m:
            out.append(line)
            if line == "{":
                out.append(".reg .b32 nmx; .reg .f32 nmf;")
            continue
        d0, regs = m.group(1), [r.strip() for r in m.group(2).split(",")]
        out += [f"xor.b32 nmx, {regs[0]}, {regs[1]};", f"xor.b32 nmx, nmx, {regs[2]};",
                f"xor.b32 nmx, nmx, {regs[3]};", "mov.b32 nmf, nmx;",
                f"add.f32 {d0}, {d0}, nmf;"]
    return "\n".join(out)


class _RewritingLlvm:
    """The llvm dialect module, its inline_asm text passed through `rewrite` first."""

    def __init__(self, module, rewrite):
        self._module, self._rewrite = module, rewrite

    def __getattr__(self, name):
        return getattr(self._module, name)

    def inline_asm(self, res, operands, text, constraints, **kw):
        return self._module.inline_asm(res, operands, self._rewrite(text), constraints, **kw)


def _load_byte_scale_words(ga, lane, weight_format: str):
    """fragment_mma.load_group_words for one-byte scale fields (bytescales): the same code
    words, then this lane's rows' scale bytes in one load, each word giving two bf16x2 scale
    words: its fields at bits 4..11 and 20..27 (NVFP4: exponent offset and 3 mantissa bits;
    MXFP4 7..14 and 23..30, the exponent) masked in place, and the other two after a rotation
    by 8 (the values are not the shipped ones' scales: the probe times, it does not check)."""
    from cutlass import Int32

    from moe_common.cute import ptx

    codes = ptx.ld_shared_v4(ga + lane * 32) + ptx.ld_shared_v4(ga + lane * 32 + 16)
    if weight_format == "nvfp4":
        raw = ptx.ld_shared_v4(ga + 1024 + (lane // 4) * 16)
        mask, offset = 0x0FF00FF0, 0x60006000
    else:
        raw = ptx.ld_shared_v2(ga + 1024 + (lane // 4) * 8)
        mask, offset = 0x7F807F80, 0
    words = []
    for w in raw:
        words += [ptx.or_and(Int32(offset), w, Int32(mask)),
                  ptx.or_and(Int32(offset), ptx.rotl(w, 8), Int32(mask))]
    return codes + tuple(words)


def patch(mode: str) -> None:
    """Patch moe-gated's kernel (or, `ANY_KERNEL`, moe-common's weight records) for `mode`
    (before anything compiles)."""
    if mode == "full":
        return
    if mode in ("padzero", "padnoise"):
        _patch_padding(mode == "padzero")
        return
    if mode == "bytescales":
        from moe_common import fragments
        from moe_common.cute import fragment_mma

        fragments.scales_to_bf16 = lambda tiles, weight_format: tiles  # the bytes as they come
        fragment_mma.scale_bytes_per_row = lambda weight_format: (
            8 if weight_format == "nvfp4" else 4)
        fragment_mma.load_group_words = _load_byte_scale_words
        return
    if mode in ("nodecode", "nomma", "mmaonly"):
        from moe_common.cute import wgmma_decode

        if mode == "nomma":
            wgmma_decode.llvm = _RewritingLlvm(wgmma_decode.llvm, _fold_wgmmas)
            return
        wgmma_decode._slab_ptx = _raw_codes_slab
        if mode == "nodecode":
            return
        mode = "consumers"
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int64

    from moe_common.cute import ptx
    from moe_gated import kernel
    from moe_gated.kernel import GatedGemm

    if mode == "consumers":
        @cute.jit
        def _produce(self, s_base, g, kt0, n_kt, halves: cutlass.Constexpr, src):
            s = g % self.stages
            ptx.mbarrier_wait(s_base + self.empty_off + s * 8, ((g // self.stages) % 2) ^ 1)
            ptx.bulk_copies_g2s_elected(s_base + self.full_off + s * 8, 0, [])

        GatedGemm._produce = _produce
    elif mode in ("nob", "halfb"):
        b_halves = 0 if mode == "nob" else 1  # B's halves copied per K-tile (shipped: 2)

        @cute.jit
        def _produce(self, s_base, g, kt0, n_kt, halves: cutlass.Constexpr, src):
            """GatedGemm._produce with the B copies left out (nob) or each K-tile's B as its
            first 64-column half alone (halfb); A with B's first half."""
            b_tile, b_copy, _, sub, a_off, a_src = src
            s = g % self.stages
            ptx.mbarrier_wait(s_base + self.empty_off + s * 8, ((g // self.stages) % 2) ^ 1)
            bar = s_base + self.full_off + s * 8
            with_a = halves < 2
            tx = a_src[3] * self.a_group_bytes
            if cutlass.const_expr(b_halves):
                tx = tx + b_copy
            ptx.bulk_copies_g2s_elected(bar, n_kt * (tx if with_a else 0), [])
            if cutlass.const_expr(with_a):
                for q in cutlass.range(n_kt, unroll=1):
                    at = s_base + s * self.stage_bytes + q * sub
                    if cutlass.const_expr(b_halves):
                        ptx.bulk_copies_g2s_elected(
                            bar, None, [(at, b_tile + Int64(kt0 + q) * self.b_bytes, b_copy)])
                    self._copy_a(at + a_off, kt0 + q, a_src, bar)

        GatedGemm._produce = _produce
    elif mode == "producer":
        @cute.jit
        def _mma(self, n_tok: cutlass.Constexpr, acc, words, b_at, half: cutlass.Constexpr,
                 slabs: cutlass.Constexpr, accumulate=None):
            return

        GatedGemm._mma = _mma
    elif mode == "onecopy":
        @cute.jit
        def _copy_a(self, dst, kt, a_src, bar):
            records, first, k_tiles, groups_here = a_src
            block = kernel.BLOCK_GROUPS * self.a_group_bytes
            ptx.bulk_copies_g2s_elected(bar, None, [
                (dst, records + (first + Int64(kt)) * block, groups_here * self.a_group_bytes)])

        GatedGemm._copy_a = _copy_a
    elif mode == "noepilogue":
        from cutlass import Float32, Int32

        @cute.jit
        def _keep_live(self, acc, out):
            """acc summed; one store, never taken, keeps the wgmmas that fill it."""
            v = Float32(0.0)
            for gi in cutlass.range_constexpr(self.gpw):
                for j in cutlass.range_constexpr(self.bn // 8):
                    for q in cutlass.range_constexpr(4):
                        v = v + acc[gi, j, q]
            if v == Float32(-3.0e38):
                ptx.st_u32(out, Int32(0))

        @cute.jit
        def _epilogue_fc1(self, acc, tile, p0, p1, group0, gscale, bv, stg, lane, out,
                          out_stride, act_alpha, act_beta, act_limit):
            _keep_live(self, acc, out)

        @cute.jit
        def _epilogue_fc2(self, acc, p0, p1, group0, gscale, bv, tok, lane, out, out_stride,
                          out_rows):
            _keep_live(self, acc, out)

        GatedGemm._epilogue_fc1 = _epilogue_fc1
        GatedGemm._epilogue_fc2 = _epilogue_fc2
    elif mode in ("width48", "width16", "width80"):  # the tall tile's widths and this one
        width = int(mode[5:])  # in FC1 and FC2 (FC1_ONLY_WIDTHS would keep it from FC2)
        kernel.WIDTHS[128] = tuple(sorted(set(kernel.WIDTHS[128]) | {width}, reverse=True))
        kernel.FC1_ONLY_WIDTHS = tuple(w for w in kernel.FC1_ONLY_WIDTHS if w != width)
    elif LADDER.match(mode):
        widths = tuple(sorted({int(w) for w in mode.split("-")[1:]}, reverse=True))
        init = GatedGemm.__init__

        def __init__(self, cfg):
            init(self, cfg)
            if cfg.phase == "fc1" and self.bn == 128:
                self.widths = widths

        GatedGemm.__init__ = __init__
    else:
        raise ValueError(f"mode {mode!r}; allowed: {ALLOWED}")


def _patch_padding(zero: bool) -> None:
    """padzero / padnoise: the bench's input copies share the first copy's routing, and the
    PAD_BUFFERS are zero- or randn-filled when allocated."""
    from dispatcher import bench, presets
    from moe_common import workspace

    first = {}
    draw = presets.random_inputs

    def random_inputs(p, tokens, **kw):
        x, weights, ids = draw(p, tokens, **kw)
        weights, ids = first.setdefault((p.name, tokens), (weights, ids))
        return x, weights, ids

    bench.random_inputs = random_inputs
    get = workspace.Workspace.get
    asked = {}  # (workspace, buffer) -> the shape last filled

    def get_filled(self, name, shape, dtype, device, zeroed=False):
        buf = get(self, name, shape, dtype, device, zeroed)
        # filled at each new shape (a new T: its first call is the bench's eager warm-up, so
        # the fill is never captured in the timed graph), as slots of an earlier T hold data
        if name in PAD_BUFFERS and asked.get((id(self), name)) != tuple(shape):
            asked[(id(self), name)] = tuple(shape)
            whole = self._buffers[name]
            if zero:
                whole.zero_()
            else:
                whole.normal_()
        return buf

    workspace.Workspace.get = get_filled


def parse_samples(text: str) -> list:
    """nvidia-smi's `clocks.sm,power.draw` CSV lines (no header, no units) -> [(MHz, W)]; lines
    that do not parse (a first partial line, "[N/A]") are skipped."""
    samples = []
    for line in text.splitlines():
        try:
            mhz, watts = (float(v) for v in line.split(","))
        except ValueError:
            continue
        samples.append((mhz, watts))
    return samples


def under_load(samples, within: float = 0.9):
    """(median MHz, median W) over the samples whose power is at least `within` of the highest
    (a bench's replays, not its setup), or None without samples."""
    if not samples:
        return None
    top = max(w for _, w in samples)
    hot = [(mhz, w) for mhz, w in samples if w >= within * top]
    return statistics.median(m for m, _ in hot), statistics.median(w for _, w in hot)


class ClockSampler:
    """`nvidia-smi`'s SM clock and board power of this process's GPU every 50 ms while the
    block runs; `samples` after it."""

    def __enter__(self):
        import torch

        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        gpu = visible.split(",")[0] if visible else str(torch.cuda.current_device())
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
             "-lms", "50", "-i", gpu], stdout=subprocess.PIPE, text=True)
        self.samples = []
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        self.samples = parse_samples(out)


def run_mode(mode: str, presets, tokens, seed: int, clocks: bool = False,
             kernel: str = "moe-gated") -> list:
    """This process: patch, then time `kernel` forced at every (preset, T); with `clocks`,
    each point on its own beside a ClockSampler (its rows get sm_mhz and power_w)."""
    patch(mode)
    from dispatcher.bench import bench_preset, format_row
    from dispatcher.presets import PRESETS

    rows = []
    for name in presets:
        for batch in ([[t] for t in tokens] if clocks else [tokens]):
            sampler = ClockSampler() if clocks else contextlib.nullcontext()
            with sampler:
                got = bench_preset(PRESETS[name], batch, kernels=[kernel], seed=seed,
                                   check=checked(mode), log=lambda s: None)
            load = under_load(sampler.samples) if clocks else None
            for r in got:
                r["kernel"] = f"{kernel} {mode}"
                if load:
                    r["sm_mhz"], r["power_w"] = load
                print(format_row(r), flush=True)
                rows.append(r)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", nargs="+", default=["deepseek-v3", "qwen3-30b-a3b"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[512, 1024, 2048])
    ap.add_argument("--modes", nargs="+", default=list(MODES), type=mode_arg)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--mode-timeout", type=float, default=150.0, help="seconds per mode")
    ap.add_argument("--kernel", default="moe-gated",
                    choices=("moe-gated", "moe-generic", "moe-static"),
                    help=f"the kernel forced (other than moe-gated: modes {', '.join(ANY_KERNEL)})")
    ap.add_argument("--clocks", action="store_true",
                    help="sample the SM clock and power beside each point (nvidia-smi)")
    ap.add_argument("--one", type=mode_arg, help=argparse.SUPPRESS)  # a child process's mode
    args = ap.parse_args(argv)
    if args.kernel != "moe-gated" and not set([args.one] if args.one else args.modes) <= set(
            ANY_KERNEL):
        ap.error(f"--kernel {args.kernel} runs the modes {', '.join(ANY_KERNEL)} alone")
    common = ["--preset", *args.preset, "--tokens", *map(str, args.tokens),
              "--seed", str(args.seed), "--kernel", args.kernel] + (
                  ["--clocks"] if args.clocks else [])
    if args.one:
        _write_json(args.json, run_mode(args.one, args.preset, args.tokens, args.seed,
                                        args.clocks, args.kernel))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            # a mode that fails or hangs (a patched pipeline can deadlock) costs its own rows
            # and at most --mode-timeout seconds, not the other modes'
            out = os.path.join(tmp, f"{mode}.json")
            try:
                res = subprocess.run([sys.executable, __file__, "--one", mode, "--json", out,
                                      *common], timeout=args.mode_timeout)
                failed = f"exit status {res.returncode}" if res.returncode else None
            except subprocess.TimeoutExpired:
                failed = f"no result within {args.mode_timeout} s"
            if failed:
                print(f"# mode {mode}: {failed}", flush=True)
                continue
            with open(out) as f:
                rows += json.load(f)
    print(summary(rows), flush=True)
    _write_json(args.json, rows)
    return 0


def _write_json(path, rows) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def summary(rows) -> str:
    """One line per (preset, T): each mode's time over the shipped kernel's (`full`)."""
    times = {}
    for r in rows:
        if "time_us" in r:
            times.setdefault((r["shape"], r["T"]), {})[r["kernel"].split()[-1]] = r["time_us"]
    seen = [m for t in times.values() for m in t]
    modes = [m for m in MODES if m in seen] + [m for m in dict.fromkeys(seen) if m not in MODES]
    lines = ["preset T full_us " + " ".join(f"{m}/full" for m in modes if m != "full")]
    for (shape, t), by_mode in times.items():
        full = by_mode.get("full")
        cells = [f"{by_mode[m] / full:.2f}" if full and m in by_mode else "-"
                 for m in modes if m != "full"]
        lines.append(f"{shape} {t} {full if full is None else round(full, 1)} " + " ".join(cells))
    clocked = [r for r in rows if "sm_mhz" in r]
    if clocked:  # --clocks: each mode's clock and power under load
        lines.append("preset T mode us sm_mhz power_w")
        lines += [f"{r['shape']} {r['T']} {r['kernel'].split()[-1]} {r['time_us']:.1f} "
                  f"{r['sm_mhz']:.0f} {r['power_w']:.0f}" for r in clocked]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
