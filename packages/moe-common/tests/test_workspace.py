"""moe_common.workspace: the preallocated buffers a runner reuses call after call."""
from __future__ import annotations

import pytest
import torch

from moe_common.workspace import Workspace, _device


def test_workspace_reuses_buffers_and_reads_cuda_as_the_current_device(monkeypatch):
    """A buffer asked for again (smaller or equal) is the same memory, also after freeze();
    "cuda" names the current device, so a caller passing it is not reallocated (and, frozen,
    refused) on every call."""
    ws = Workspace()
    a = ws.get("a", (4, 8), torch.float32, "cpu")
    ws.freeze()
    assert ws.get("a", (2, 8), torch.float32, "cpu").data_ptr() == a.data_ptr()
    with pytest.raises(RuntimeError, match="not preallocated"):
        ws.get("a", (8, 8), torch.float32, "cpu")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert _device("cuda") == torch.device("cuda", 3)
    assert _device("cuda:1") == torch.device("cuda", 1) and _device("cpu") == torch.device("cpu")
