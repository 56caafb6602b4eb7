"""What one launch of moe-static's shape costs with no work in it (development tool).

moe-static with every part left out (a timing build measured at 24a91be, benchmarks/HISTORY.md)
took 1.8 us per call in CUDA-graph replay. This times an empty kernel with the same grid (one CTA
per SM): cooperative or not, with moe-static's 231688 B of dynamic shared memory, less or
none, 512 or 256 threads. Each CTA writes one word so the kernel is not empty. Measured on the
H200: 1.07-1.38 us in every variant (at 4f755aa; benchmarks/HISTORY.md).

    python3 tools/launch_cost.py
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Int32, Int64

from dispatcher.bench import graph_time_us
from moe_common.cute import jit, ptx


class EmptyLaunch:
    def __init__(self, threads: int, smem: int, cooperative: bool):
        self.threads, self.smem, self.cooperative = threads, smem, cooperative

    @cute.jit
    def __call__(self, out: Int64, grid: Int32, stream):
        self.kernel(out).launch(grid=[grid, 1, 1], block=[self.threads, 1, 1], smem=self.smem,
                                stream=stream, cooperative=self.cooperative)

    @cute.kernel
    def kernel(self, out: Int64):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        if cutlass.const_expr(self.smem > 0):
            smem = cutlass.memory.SmemAllocator()
            buf = smem.allocate_array(cutlass.Uint8, self.smem, byte_alignment=128)
            if tid == 0:
                ptx.st_shared_u32(Int32(buf.toint()), bid)
        cute.arch.sync_threads()
        if tid == 0:
            ptx.st_u32(out + Int64(bid) * 4, bid)


def main():
    grid = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(grid, dtype=torch.int32, device="cuda")
    for threads, smem, coop in [(512, 231688, True), (512, 231688, False), (512, 118784, True),
                                (512, 0, True), (512, 0, False), (256, 231688, True)]:
        k = jit.compile_kernel(EmptyLaunch(threads, smem, coop), Int64(0), Int32(1),
                               jit.example_stream())
        t = graph_time_us([lambda: k(out.data_ptr(), grid, jit.current_stream(out.device))] * 20)
        print(f"threads {threads:4d} smem {smem // 1024:4d} KiB cooperative {coop!s:5s} "
              f"{t['median_us']:6.2f} us per launch", flush=True)


if __name__ == "__main__":
    main()
