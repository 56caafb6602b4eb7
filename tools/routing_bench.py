"""Time the two routing paths (moe_common.cute.routing) under CUDA-graph replay (development
tool: picks routing.SPLIT_MIN_PAIRS). Prints one line per (experts, pairs)."""
from __future__ import annotations

import torch

from moe_common.cute import jit
from moe_common.cute.routing import MAX_SPLIT_CTAS, ONE_CTA_MAX_PAIRS, PAIRS_PER_SPLIT_CTA


def _time_us(fn, calls=20, replays=10):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(replays):
        g.replay()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) * 1e3 / (calls * replays)


def main():
    dev = torch.device("cuda")
    for experts in (128, 256):
        for pairs in (1024, 2048, 4096, 6144, 8192, 16384, 32768, 65536, 262144):
            ids = torch.randint(0, experts, (pairs,), device=dev, dtype=torch.int32)
            order = torch.empty(pairs, dtype=torch.int32, device=dev)
            slots = torch.empty(pairs, dtype=torch.int32, device=dev)
            counts = torch.empty(experts, dtype=torch.int32, device=dev)
            tiles = torch.empty(3, pairs // 8 + experts, dtype=torch.int32, device=dev)
            num_tiles = torch.empty(1, dtype=torch.int32, device=dev)
            hist = torch.empty(MAX_SPLIT_CTAS + 1, experts, dtype=torch.int32, device=dev)
            tables = jit.routing_tables(counts, tiles, num_tiles)
            one = jit.routing(4)
            histogram, scan, scatter = jit.routing_split(4)
            ctas = max(1, min(MAX_SPLIT_CTAS, -(-pairs // PAIRS_PER_SPLIT_CTA)))

            # the stream is looked up at call time: graph capture runs on a side stream
            def single():
                stream = jit.current_stream(dev)
                one(ids.data_ptr(), pairs, 0, experts, 128, order.data_ptr(), slots.data_ptr(),
                    tables, stream)

            def split():
                stream = jit.current_stream(dev)
                histogram(ids.data_ptr(), pairs, 0, experts, ctas, hist.data_ptr(), 0, 0, stream)
                scan(hist.data_ptr(), ctas, experts, 128, tables, stream)
                scatter(ids.data_ptr(), pairs, 0, experts, ctas, hist.data_ptr(), order.data_ptr(),
                        slots.data_ptr(), stream)

            # the one-CTA kernel takes at most ONE_CTA_MAX_PAIRS
            one_us = f"{_time_us(single):7.1f}" if pairs <= ONE_CTA_MAX_PAIRS else "      -"
            print(f"experts={experts:4d} pairs={pairs:7d}  one CTA {one_us} us   "
                  f"split over {ctas:2d} CTAs {_time_us(split):7.1f} us", flush=True)


if __name__ == "__main__":
    main()
