"""Times moe-gated's token gather (TileGather) against the source-major RowScatter on one
layer's routing, and checks RowScatter's blocks hold the same rows (development tool).

    python tools/gather_probe.py [--preset qwen3-30b-a3b] [--tokens 8192]
"""
from __future__ import annotations

import argparse

import torch
from cutlass import Int32, Int64

from dispatcher.presets import PRESETS, random_inputs
from moe_common.cute import jit
from moe_common.fragments import TILE_K
from moe_common.kernel_package import Buffers, route_pairs
from moe_gated import compile_cache
from moe_gated.kernel import GEOMETRIES
from moe_gated.runner import _table_tiles, _token_slots, blocked_to_rows, geometry_for, tiles_capacity
from moe_gated.tile_gather import RowScatter


def timed(fn, reps=50):
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            for _ in range(reps):
                fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / reps)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-30b-a3b", choices=sorted(PRESETS))
    ap.add_argument("--tokens", type=int, default=8192)
    args = ap.parse_args()
    p = PRESETS[args.preset]
    gen = torch.Generator(device="cuda").manual_seed(2)
    x, _, ids = random_inputs(p, args.tokens, device="cuda", gen=gen)
    ids = ids.to(torch.int32).contiguous()
    T, k = ids.shape
    P, E, H = T * k, p.experts, x.shape[1]
    Hp = -(-H // TILE_K) * TILE_K
    kt1 = Hp // TILE_K
    geometry = geometry_for(P, E)
    bn, _ = GEOMETRIES[geometry]
    cap = tiles_capacity(P, E, bn)
    slots_n = _token_slots(P, E)
    bufs = Buffers("probe", None, x.device)
    stream = jit.current_stream(x.device)
    order, tiles, num_tiles = route_pairs(bufs, ids, 0, E, bn, _table_tiles(P, E), stream)
    torch.cuda.synchronize()
    # slot of each pair (host-side here; the routing would write it)
    nt = int(num_tiles.item())
    slot = torch.full((P,), -1, dtype=torch.int32, device=x.device)
    for t in range(nt):
        s0, s1 = int(tiles[1, t]), int(tiles[2, t])
        slot[order[s0:s1].long()] = torch.arange(t * bn, t * bn + s1 - s0, dtype=torch.int32,
                                                 device=x.device)
    old = torch.zeros((slots_n // bn, kt1, bn * TILE_K), dtype=torch.bfloat16, device=x.device)
    new = torch.zeros_like(old)
    gather = compile_cache.tile_gather(bn)
    z, i1 = Int64(0), Int32(1)
    scatter = jit.compiled(("probe", bn), lambda: jit.compile_kernel(
        RowScatter(bn), z, Int32(128), Int32(128), i1, i1, z, z, i1, jit.example_stream()))

    def run_old():
        gather(x.data_ptr(), x.stride(0), H, order.data_ptr(), k, tiles[1].data_ptr(),
               tiles[2].data_ptr(), num_tiles.data_ptr(), old.data_ptr(), kt1, cap,
               jit.current_stream(x.device))

    def run_new():
        scatter(x.data_ptr(), x.stride(0), H, T, k, slot.data_ptr(), new.data_ptr(), kt1,
                jit.current_stream(x.device))

    run_old()
    run_new()
    torch.cuda.synchronize()
    # unswizzle new: [tiles, kt, 2, bn, 8 chunks x 8] -> rows
    nv = new[:nt].view(nt, kt1, 2, bn, 8, 8)
    n_idx = torch.arange(bn, device=x.device).view(bn, 1)
    c_idx = torch.arange(8, device=x.device).view(1, 8)
    src_c = (c_idx ^ (n_idx % 8))  # logical chunk c sits at physical chunk c ^ (n % 8)
    nv = torch.gather(nv, 4, src_c.view(1, 1, 1, bn, 8, 1).expand(nt, kt1, 2, bn, 8, 8))
    rows_new = nv.permute(0, 3, 1, 2, 4, 5).reshape(nt * bn, kt1 * TILE_K)
    rows_old = blocked_to_rows(old[:nt], bn)
    used = torch.zeros(nt * bn, dtype=torch.bool, device=x.device)
    used[slot[slot >= 0].long()] = True
    same = torch.equal(rows_new[used], rows_old[used])
    t_old, t_new = timed(run_old), timed(run_new)
    mb = P * Hp * 2 / 1e6
    print(f"{p.name} T={T} {geometry}: gather {t_old:.1f} us, row scatter {t_new:.1f} us "
          f"({mb:.0f} MB written; {mb / t_new * 1e-3:.2f} TB/s), same rows: {same}")


if __name__ == "__main__":
    main()
