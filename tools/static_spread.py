"""When each warp of moe-static finishes FC1 and FC2 (development tool).

Runs a layer with the "stamps" variant (StaticConfig.variant; right results, each warp leaves
its %globaltimer at each of kernel.STAMPS and its %smid in the workspace) a few times on one
routing and prints, per stamp, the spread over the grid's warps and CTAs, and whether the
same SMs are the late ones from call to call (the rank correlation of the CTAs' FC1 ends,
by SM, between calls).

    python3 tools/static_spread.py [--tokens 8] [--experts 128 --hidden 2048 --intermediate 768]
"""
from __future__ import annotations

import argparse

import torch

from moe_common.testing import random_layer, random_routing
from moe_common.workspace import Workspace
from moe_static import compile_cache, fused_moe
from moe_static.kernel import STAMP_WORDS, STAMPS, WARPS


def _ranks(v: torch.Tensor) -> torch.Tensor:
    return v.argsort().argsort().double()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--fresh-routing", action="store_true", dest="fresh",
                    help="a new routing every call (late SMs that stay late are the SMs', "
                    "not the work's)")
    args = ap.parse_args()
    compile_cache.VARIANT = "stamps"
    w = random_layer(args.experts, args.hidden, args.intermediate)
    x = torch.randn(args.tokens, args.hidden, device="cuda").bfloat16()
    tw, ti = random_routing(args.tokens, args.experts, 8)
    ws = Workspace()
    grid = torch.cuda.get_device_properties(0).multi_processor_count
    by_sm, by_cta, sms = [], [], []
    for call in range(args.calls + 1):
        if args.fresh:
            tw, ti = random_routing(args.tokens, args.experts, 8)
        fused_moe(x, w, tw, ti, workspace=ws)
        torch.cuda.synchronize()
        if call == 0:
            continue  # the first call compiles
        m = ws.get("moe-static.meet", (grid * WARPS * 2 * STAMP_WORDS,), torch.int32, x.device)
        m = m.view(torch.int64).view(grid * WARPS, STAMP_WORDS).cpu()
        t0 = m[:, 0].min()
        at = {name: (m[:, i] - t0).double() / 1000 for i, name in enumerate(STAMPS)}  # us
        fc1 = at["fc1 end"]
        sm = (m[:, len(STAMPS)] & 0xFFFFFFFF).view(grid, WARPS)[:, 0]
        cta_fc1 = fc1.view(grid, WARPS).max(1).values
        q = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0], dtype=torch.float64)
        print(f"call {call}: us from the first warp's start, warps min/p10/p50/p90/max "
              "(and the slowest warp of each CTA)")
        for name in STAMPS[1:]:
            wv = at[name]
            cv = wv.view(grid, WARPS).max(1).values
            wq = " ".join(f"{v:6.2f}" for v in wv.quantile(q).tolist())
            cq = " ".join(f"{v:6.2f}" for v in cv.quantile(q).tolist())
            print(f"  {name:>12}: {wq}   CTAs {cq}   mean warp wait for its CTA "
                  f"{(cv.repeat_interleave(WARPS) - wv).mean():.2f}")
        order = torch.empty(grid, dtype=torch.float64)
        order[sm.long()] = cta_fc1
        by_sm.append(order)
        by_cta.append(cta_fc1)
        sms.append(sm)
        print("  latest 8 CTAs' SMs at FC1's end:", cta_fc1.argsort(descending=True)[:8].tolist(),
              "->", sm[cta_fc1.argsort(descending=True)[:8]].tolist())
    for name, runs in (("SM", by_sm), ("CTA", by_cta)):
        r = [_ranks(v) for v in runs]
        cors = [torch.corrcoef(torch.stack([r[i], r[i + 1]]))[0, 1].item()
                for i in range(len(r) - 1)]
        print(f"rank correlation of the CTAs' FC1 ends by {name}, call to call:",
              " ".join(f"{c:.2f}" for c in cors))
    same = [(sms[i] == sms[i + 1]).double().mean().item() for i in range(len(sms) - 1)]
    print("CTAs on the same SM as in the call before:", " ".join(f"{v:.2f}" for v in same))


if __name__ == "__main__":
    main()
