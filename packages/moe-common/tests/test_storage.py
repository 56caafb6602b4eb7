"""moe_common.cute.storage: a kernel's shared memory as a cute.struct, its offsets read back."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute

from moe_common.cute.storage import shared_storage


def test_offsets_follow_field_order_and_alignment():
    mem = cute.struct.MemRange
    st = shared_storage("Probe", {
        "a": cute.struct.Align[mem[cutlass.Uint8, 100], 128],
        "b": mem[cutlass.Uint32, 3],
        "c": cutlass.Uint16,
        "d": mem[cutlass.Int64, 2],  # 8-byte aligned: 114 -> 120
        "e": mem[cutlass.Uint8, 0],  # an empty region takes no space
        "f": cutlass.Uint8,
    })
    assert st.offsets == {"a": 0, "b": 100, "c": 112, "d": 120, "e": 136, "f": 136}
    assert st.struct.size_in_bytes() == 256  # padded to the struct's 128-byte alignment

