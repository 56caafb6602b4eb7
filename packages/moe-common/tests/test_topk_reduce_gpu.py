"""The top-k reduce (moe_common.cute.topk_reduce) on the H200, every mode the runners use
(paired 16 unweighted: moe-generic; paired 16 / 32 weighted: moe-gated), against a float64 sum
of the same bf16 y rows: k from 1 to 10, non-local and dropped routes (their y rows poisoned
with NaN: never read), the output poisoned first (every element written), bitwise equal run to
run."""
from __future__ import annotations

import pytest
import torch

from moe_common.cute import jit
from moe_common.cute.topk_reduce import paired_position

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("paired,weighted", [(16, False), (16, True), (32, True), (32, False)])
@pytest.mark.parametrize("tokens,top_k,hidden,dtype", [
    (1, 8, 64, torch.int32),                    # decode
    (37, 4, 96, torch.int64),                   # a partial CTA, int64 ids
    (300, 10, 128, torch.int32),                # k past 8
    (513, 6, 2048, torch.int64),                # the band's width
])
def test_topk_reduce_matches_float64(paired, weighted, tokens, top_k, hidden, dtype):
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(tokens * 131 + top_k)
    experts, offset = 16, 8  # local experts 8..23 of 32
    P = tokens * top_k
    ids = torch.randint(0, 32, (tokens, top_k), device=dev, dtype=dtype, generator=g)
    ids.view(-1)[::7] = -1  # dropped
    ids[0, :] = 0  # a token with no local route: its row is 0
    w = torch.rand(tokens, top_k, device=dev, generator=g)
    y = (torch.randn(P, hidden, device=dev, generator=g) * 4).bfloat16()
    local = ((ids >= offset) & (ids < offset + experts)).view(-1)
    y[~local] = float("nan")  # rows the GEMM never writes
    pos = torch.tensor([paired_position(h, paired) for h in range(hidden)], device=dev)
    y_stored = torch.empty_like(y)
    y_stored[:, pos] = y
    terms = y.double().view(tokens, top_k, hidden)
    if weighted:
        terms = terms * w.double().unsqueeze(-1)
    want = torch.where(local.view(tokens, top_k, 1), terms, 0.0).sum(1)

    def run():
        out = torch.full((tokens, hidden), float("nan"), device=dev, dtype=torch.bfloat16)
        jit.topk_reduce(ids.element_size(), paired, weighted)(
            y_stored.data_ptr(), ids.data_ptr(), w.data_ptr() if weighted else 0, out.data_ptr(),
            tokens, top_k, hidden, offset, experts, jit.current_stream(torch.device(dev)))
        torch.cuda.synchronize()
        return out

    out = run()
    assert not out.isnan().any()
    assert (out[0] == 0).all()
    # one fp32 sum then one rounding: within half a bf16 ulp of the exact sum, plus the fp32
    # sum's own error (up to k adds of 2^-24 x terms of ~20: 1e-4 covers it)
    err = (out.double() - want).abs()
    assert (err <= want.abs() * 2.0 ** -8 + 1e-4).all(), err.max()
    assert torch.equal(run().view(torch.int16), out.view(torch.int16))
