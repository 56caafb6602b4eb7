"""moe_common.cute.ring.StageRing's bookkeeping, on Python ints (the kernels trace the same
arithmetic on Int32; tools/ptx_fingerprint.py checks what they emit)."""
from __future__ import annotations

import pytest

from moe_common.cute.ring import MBARRIER_BYTES, StageRing


@pytest.mark.parametrize("stages", [2, 3, 4, 8])
def test_uses_cycle_through_the_stages_and_flip_parity_each_round(stages):
    ring = StageRing(stages, 1000, (64, 16), (64, 16 + 8 * stages), 128)
    for g in range(5 * stages):
        st = g % stages
        assert ring.stage(g) == st
        assert ring.at(g) == 128 + st * 1000
        assert ring.full_bar(g) == 64 + 16 + st * MBARRIER_BYTES
        assert ring.empty_bar(g) == 64 + 16 + 8 * stages + st * MBARRIER_BYTES
        # round r = g // stages waits for phase r to complete: parity r % 2
        assert ring.parity(g) == (g // stages) % 2
    # the producer's first round waits for parity 1, which a fresh barrier reports complete
    assert all(ring.parity(g) ^ 1 == 1 for g in range(stages))


@pytest.mark.parametrize("stages", [1, 2, 4, 8])
def test_bit_operations_agree_with_division_for_uses(stages):
    by_div = StageRing(stages, 64, 0, data=4096)
    by_bits = StageRing(stages, 64, 0, data=4096, bit_ops=True)
    for g in range(6 * stages):
        assert by_bits.stage(g) == by_div.stage(g)
        assert by_bits.parity(g) == by_div.parity(g)
        assert by_bits.at(g) == by_div.at(g)


def test_bit_operations_need_a_power_of_two():
    with pytest.raises(AssertionError):
        StageRing(3, 64, 0, bit_ops=True)
