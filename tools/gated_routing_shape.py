"""What the routing's shape costs moe-gated (development tool).

Times the layer (CUDA-graph replay, four input copies, as `fused-moe bench`) on the preset's
random routing and on a balanced one, where every expert gets exactly T x k / E pairs (token t's
j-th route is expert (t + j E / k) mod E), so an expert's pairs fill whole tiles or none are
left over. Choosing T changes the leftover: at DeepSeek-V3 T=8192 every expert has 256 pairs
(one full wide tile each), at 8704 it has 272 (a full tile and a 16-token one).

    python3 tools/gated_routing_shape.py [--preset deepseek-v3] [--tokens 8192 8704]
"""
from __future__ import annotations

import argparse

import torch

from dispatcher import FusedMoE
from dispatcher.bench import graph_time_us
from dispatcher.presets import PRESETS, random_inputs, random_weights
from moe_common.types import Activation


def balanced_inputs(p, tokens: int, gen):
    x, tw, _ = random_inputs(p, tokens, device="cuda", gen=gen)
    assert p.experts % p.top_k == 0 and tokens * p.top_k % p.experts == 0
    t = torch.arange(tokens, device="cuda").unsqueeze(1)
    j = torch.arange(p.top_k, device="cuda").unsqueeze(0)
    ids = ((t + j * (p.experts // p.top_k)) % p.experts).to(torch.int32)
    return x, tw, ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="deepseek-v3", choices=sorted(PRESETS))
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 8704])
    ap.add_argument("--kernel", default="moe-gated")
    args = ap.parse_args()
    p = PRESETS[args.preset]
    w = random_weights(p, device="cuda", seed=1)
    gen = torch.Generator(device="cuda").manual_seed(2)
    for t in args.tokens:
        layer = FusedMoE(w, t, p.top_k, activation=Activation(p.activation), kernel=args.kernel)
        layer.warmup([t])
        for kind in ("random", "balanced"):
            if kind == "balanced" and t * p.top_k % p.experts:
                continue
            make = (lambda: random_inputs(p, t, device="cuda", gen=gen)) if kind == "random" \
                else (lambda: balanced_inputs(p, t, gen))
            inputs = [make() for _ in range(4)]
            per = t * p.top_k / p.experts
            r = graph_time_us([(lambda i=i: layer(*inputs[i])) for i in range(4)])
            tf = p.flops(t) / r["median_us"] / 1e6
            print(f"{p.name} T={t} {kind:>8} routing ({per:.0f} pairs per expert on average): "
                  f"{r['median_us']:9.1f} us  {tf:6.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
