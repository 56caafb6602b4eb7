"""Is a fused FC2 scatter-add (fp32 atomics into out rows) cheaper than the y round trip?
(development probe: would a fused, non-deterministic reduce pay in moe-gated's FC2?)

    python3 tools/scatter_add_probe.py

For a layer's P = T * k routed rows of H fp32 values (y) it times, under CUDA events:
  write    y.fill_: the FC2 epilogue's plain stores of y (write P * H * 4 bytes)
  reduce   y.view(T, k, H).sum(1): the top-k reduce's read of y
  scatter  acc.index_add_(0, token, y): fp32 atomics of every y row into its token's row, rows
           in expert-sorted order (token ids random, as FC2 meets them); its time minus `reduce`
           is what the atomics cost beyond reading y
"""
from __future__ import annotations

import torch


def timed(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps * 1e3  # us


def main():
    for name, T, k, H in (("qwen3-30b-a3b", 8192, 8, 2048), ("deepseek-v3", 8192, 8, 7168)):
        P = T * k
        y = torch.randn(P, H, device="cuda")
        acc = torch.zeros(T, H, device="cuda")
        token = torch.arange(P, device="cuda") // k
        token = token[torch.randperm(P, device="cuda")]  # rows in expert order: tokens random
        gb = P * H * 4 / 1e9
        t_write = timed(lambda: y.fill_(1.0))
        t_reduce = timed(lambda: y.view(T, k, H).sum(1))
        t_scatter = timed(lambda: acc.index_add_(0, token, y))
        t_zero = timed(lambda: acc.zero_())
        print(f"{name}: y {gb:.2f} GB; write {t_write:.0f} us ({gb / t_write * 1e6:.0f} GB/s), "
              f"reduce {t_reduce:.0f} us, scatter {t_scatter:.0f} us "
              f"(atomics beyond the read: {t_scatter - t_reduce:+.0f} us), zero acc {t_zero:.0f} us")


if __name__ == "__main__":
    main()
