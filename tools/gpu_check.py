"""Quick GPU correctness sweep of moe-generic (or --kernel static|gated) and the DSL dequantizer (development tool).

    python tools/gpu_check.py [--quick]

Fresh random data each run, output poisoned with NaN, metrics per docs/DESIGN.md section 5.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
import time

import torch

from moe_common.formats import get_format, weight_global_scale
from moe_common.reference import reference_moe
from moe_common.types import WEIGHT_FORMATS, Activation
from moe_common.weights import MoEWeights


def build_weights(E, H, I, fmt, gated=True, bias=False, w4a4=False, dev="cuda", offset=0, num_experts=None):
    F = get_format(fmt)
    n1 = 2 * I if gated else I
    w13 = torch.randn(E, n1, H, device=dev) * 0.05
    w2 = torch.randn(E, H, I, device=dev) * 0.05
    out = {}
    for name, w in (("w13", w13), ("w2", w2)):
        gs = weight_global_scale(w, dim=(1, 2)) if fmt == "nvfp4" else torch.ones(E, device=dev)
        packed, scales = F.quantize(w, gs.view(E, 1) if fmt == "nvfp4" else None)
        out[name], out[name + "_scale"], out[name + "_scale_2"] = packed, scales, gs.float()
    kw = {}
    if bias:
        kw["w13_bias"] = torch.randn(E, n1, device=dev) * 0.1
        kw["w2_bias"] = torch.randn(E, H, device=dev) * 0.1
    if w4a4:
        kw["input_scale"] = torch.full((E,), 4.0 / 2688, device=dev) * (1 + torch.rand(E, device=dev))
        kw["fc2_input_scale"] = torch.full((E,), 0.5 / 2688, device=dev) * (1 + torch.rand(E, device=dev))
    return MoEWeights(weight_format=fmt, local_expert_offset=offset, num_experts=num_experts, **out, **kw)


def metrics(out, ref):
    o, r = out.float(), ref.float()
    rel = ((o - r).norm() / r.norm().clamp_min(1e-30)).item()
    cos = torch.nn.functional.cosine_similarity(o.flatten(), r.flatten(), dim=0).item()
    return rel, cos, bool(torch.isnan(o).any().item())


def check_dequant():
    from moe_common.cute.dequant import dequantize_weights
    rows = []
    for fmt in WEIGHT_FORMATS:
        w = build_weights(4, 256, 128, fmt)
        d13, d2 = dequantize_weights(w)
        F = get_format(fmt)
        r13 = F.dequantize(w.w13, w.w13_scale, w.w13_scale_2.view(-1, 1))
        r2 = F.dequantize(w.w2, w.w2_scale, w.w2_scale_2.view(-1, 1))
        ok = torch.equal(d13, r13.to(torch.bfloat16)) and torch.equal(d2, r2.to(torch.bfloat16))
        mism = (d13 != r13.to(torch.bfloat16)).sum().item()
        rows.append({"check": "dequant", "fmt": fmt, "bit_exact": ok, "mismatches": mism})
    return rows


def check_generic(cases, kernel="generic"):
    import importlib

    fused_moe = importlib.import_module(f"moe_{kernel}").fused_moe
    rows = []
    for (T, E, H, I, k, fmt, act, mode, bias, ep) in cases:
        torch.manual_seed(int(time.time() * 1000) % 100000)
        gated = act != "relu2"
        off, ne = (E // 2, 2 * E) if ep else (0, None)
        w = build_weights(E, H, I, fmt, gated, bias, mode == "w4a4", offset=off, num_experts=ne)
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        nglob = ne or E
        logits = torch.randn(T, nglob, device="cuda")
        tw, ti = torch.topk(torch.softmax(logits, -1), k, dim=-1)
        ti = ti.to(torch.int32)
        a = Activation(act, 1.702, 1.0, None if act == "swigluoai" and bias else 7.0)
        out = torch.full((T, H), float("nan"), device="cuda", dtype=torch.bfloat16)
        t0 = time.time()
        fused_moe(x, w, tw, ti, activation=a, quant_mode=mode, out=out)
        torch.cuda.synchronize()
        dt = time.time() - t0
        ref = reference_moe(x, w, tw, ti, activation=a, quant_mode=mode)
        rel, cos, nan = metrics(out, ref)
        ok = rel <= 1e-2 and cos >= 0.9999 and not nan
        rows.append({"T": T, "E": E, "H": H, "I": I, "k": k, "fmt": fmt, "act": act, "mode": mode,
                     "bias": bias, "ep": ep, "rel": rel, "cos": cos, "nan": nan, "ok": ok, "first_s": dt})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sanitize", action="store_true", help="one tiny case per format (for compute-sanitizer)")
    ap.add_argument("--kernel", default="generic", choices=["generic", "static", "gated"])
    ap.add_argument("--first", type=int, default=None,
                    help="with --sanitize: only the first N cases (racecheck is slow)")
    ap.add_argument("--probe-mode", default=None,
                    help="with --kernel gated: moe-gated patched as tools/pipeline_probe.py's "
                         "mode (one whose results are right), e.g. to run it under a sanitizer")
    args = ap.parse_args()
    if args.probe_mode is not None:
        import pipeline_probe  # beside this file

        if args.kernel != "gated" or not pipeline_probe.checked(args.probe_mode):
            ap.error(f"--probe-mode {args.probe_mode!r}: needs --kernel gated and a mode whose "
                     f"results are right: {', '.join(pipeline_probe.CHECKED)}")
        pipeline_probe.patch(args.probe_mode)  # before anything compiles
    if args.sanitize and args.kernel == "gated":
        # gated activations only; the first two take the tall geometry (the second's FC2,
        # H=320 with rows padded to 384, ends on a half-empty 256-row tile), the last two the
        # wide one (>= 256 routed pairs per expert)
        rows = check_generic([(70, 4, 256, 128, 4, "nvfp4", "silu", "w4a4", True, True),
                              (300, 4, 320, 96, 1, "mxfp4", "swigluoai", "w4a16", True, False),
                              (300, 4, 256, 128, 4, "nvfp4", "gelu_tanh", "w4a16", False, False),
                              (600, 4, 320, 96, 2, "mxfp4", "silu", "w4a4", True, True)
                              ][:args.first], args.kernel)
        sys.exit(0 if all(r["ok"] for r in rows) else 1)
    if args.sanitize:
        mode = "w4a4" if args.kernel == "generic" else "w4a16"
        cases = [(5, 4, 256, 128, 2, "nvfp4", "silu", mode, True, True),
                 (9, 4, 320, 96, 3, "mxfp4", "relu2", "w4a16", True, False),
                 (40, 4, 256, 128, 1, "nvfp4", "gelu_tanh", "w4a16", False, False),
                 (120, 4, 320, 96, 1, "mxfp4", "swigluoai", "w4a16", True, False)]
        if args.kernel == "static":
            # H = 2048: FC2 by owned rows (runner.owns_rows), by teams of two and of one, the
            # second's CTA shares cutting units (20 units of 4 K-tiles for 16 warps)
            cases += [(3, 8, 2048, 256, 2, "nvfp4", "silu", "w4a16", True, False),
                      (20, 20, 2048, 512, 8, "mxfp4", "swigluoai", "w4a16", True, False),
                      # T = 1, H = 320 ending on a masked half K-tile
                      (1, 8, 320, 96, 4, "nvfp4", "gelu_tanh", "w4a16", True, False)]
        rows = check_generic(cases[:args.first], args.kernel)
        sys.exit(0 if all(r["ok"] for r in rows) else 1)
    rows = []
    try:
        rows += check_dequant()
        print(rows, flush=True)
    except Exception:  # keep going: the MoE check matters more
        traceback.print_exc()
    cases = [
        (1, 8, 256, 128, 2, "nvfp4", "silu", "w4a16", False, False),
        (37, 8, 256, 128, 2, "nvfp4", "silu", "w4a16", False, False),
        (200, 16, 512, 256, 4, "mxfp4", "swigluoai", "w4a16", True, False),
        (64, 8, 256, 256, 2, "nvfp4", "relu2", "w4a16", False, False),
        (64, 8, 256, 128, 2, "nvfp4", "gelu_tanh", "w4a4", False, False),
        (64, 8, 256, 128, 2, "mxfp4", "silu", "w4a4", True, True),
        (33, 8, 2880 // 10 * 0 + 320, 704, 4, "mxfp4", "swigluoai", "w4a16", True, False),
    ]
    if not args.quick:
        cases += [
            (1024, 128, 2048, 768, 8, "nvfp4", "silu", "w4a16", False, False),
            (4096, 8, 2880, 2880, 4, "mxfp4", "swigluoai", "w4a16", True, False),
        ]
    rows += check_generic(cases)
    bad = [r for r in rows if not r.get("ok", r.get("bit_exact", False))]
    print(f"{len(rows) - len(bad)} passed, {len(bad)} failed")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
