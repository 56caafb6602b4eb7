"""A ring of pipeline stages handed between warps by mbarriers: the producer/consumer state of
CUTLASS's `cutlass.pipeline`, in the 32-bit shared addresses the kernels' inline PTX takes.

1. Use g = 0, 1, 2, ... of the ring (a K-tile, a work item) sits in stage g % stages: its bytes
   at data + (g % stages) x stage_bytes, its mbarriers at full + 8 (g % stages) and, where the
   ring has one, empty + 8 (g % stages).
2. `full` completes when use g's data is there (the producer's arrivals, or the transaction
   bytes of its bulk copies); `empty` when every consumer has released use g.
3. An mbarrier's phase flips each time it completes, so use g waits on full for the phase of
   parity (g // stages) % 2. The producer of use g waits on empty for use g - stages's release:
   the parity before, which a freshly initialised barrier passes at once (the first round).

Each address is formed where it is used, in the order the kernels wrote it out by hand before
the ring was shared (tools/ptx_fingerprint.py: the same PTX).
"""
from __future__ import annotations

from cutlass import Int32

from . import ptx

MBARRIER_BYTES = 8


class StageRing:
    """full, empty, data: where stage 0's full mbarrier, its empty one (None where consumers
    release nothing) and its bytes are, each an Int32 shared address or (Int32, byte offset)
    whose sum is formed where it is used (a kernel that addresses shared memory from one base).
    bit_ops: uses are never negative and `stages` is a power of two, so stage and parity are bit
    operations (the DSL's // and % on Int32 are signed, with fix-ups for negative values).

    Not a NamedTuple: the DSL would carry its int fields through dynamic control flow as
    run-time values, and they must stay trace-time constants. Like cutlass.pipeline's
    PipelineState, it hands the DSL its run-time values (the base addresses) and takes them
    back."""

    def __init__(self, stages: int, stage_bytes: int, full, empty=None, data=None,
                 bit_ops: bool = False):
        assert not bit_ops or stages & (stages - 1) == 0
        self.stages, self.stage_bytes, self.bit_ops = stages, stage_bytes, bit_ops
        # (base, offset) each, or None
        self._full, self._empty, self._data = [
            p if isinstance(p, tuple) or p is None else (p, 0) for p in (full, empty, data)]

    def _places(self):
        return (self._full, self._empty, self._data)

    def __extract_mlir_values__(self):
        return [Int32(p[0]).ir_value() for p in self._places() if p is not None]

    def __new_from_mlir_values__(self, values):
        values = iter(values)
        full, empty, data = [None if p is None else (Int32(next(values)), p[1])
                             for p in self._places()]
        return StageRing(self.stages, self.stage_bytes, full, empty, data, self.bit_ops)

    def stage(self, g):
        if self.bit_ops:
            return g & (self.stages - 1)
        return g % self.stages

    def parity(self, g):
        """The parity of the full phase use g waits for."""
        if self.bit_ops:
            return (g >> (self.stages.bit_length() - 1)) & 1
        return (g // self.stages) % 2

    @staticmethod
    def _address(place, stage, size: int):
        base, off = place
        at = base + off if off else base
        return at + stage * size

    def at(self, g):
        """The shared address of use g's bytes."""
        return self._address(self._data, self.stage(g), self.stage_bytes)

    def full_bar(self, g):
        return self._address(self._full, self.stage(g), MBARRIER_BYTES)

    def empty_bar(self, g):
        return self._address(self._empty, self.stage(g), MBARRIER_BYTES)

    def init(self, full_count, empty_count=None):
        """One thread, before the CTA barrier that publishes them: every stage's mbarriers,
        stage by stage (the caller adds ptx.fence_mbarrier_init after its last barrier)."""
        for st in range(self.stages):
            ptx.mbarrier_init(self._address(self._full, st, MBARRIER_BYTES), full_count)
            if self._empty is not None:
                ptx.mbarrier_init(self._address(self._empty, st, MBARRIER_BYTES), empty_count)

    def wait_full(self, g):
        """Wait until use g's data is there."""
        ptx.mbarrier_wait(self.full_bar(g), self.parity(g))

    def wait_empty(self, g):
        """Wait until stage g % stages is free for use g (use g - stages released)."""
        ptx.mbarrier_wait(self.empty_bar(g), self.parity(g) ^ 1)

    def arrive_full(self, g):
        ptx.mbarrier_arrive(self.full_bar(g))

    def release(self, g):
        """One arrival on use g's empty barrier: this thread (or warp) is done with it."""
        ptx.mbarrier_arrive(self.empty_bar(g))
