"""Repository-wide pytest setup: tests marked `gpu` run only on an sm_90 (Hopper) CUDA GPU."""
from __future__ import annotations

import pytest

# pytest's importlib import mode names dispatcher/tests/test_x.py "dispatcher.tests.test_x" and,
# when no module "dispatcher" is loaded yet, makes the repository folder dispatcher/ (no
# __init__.py) a namespace package that shadows the installed `dispatcher`. Importing the real
# package first makes pytest reuse it as the parent.
import dispatcher  # noqa: E402,F401


def _hopper_reason():
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return f"torch does not import: {e}"
    if not torch.cuda.is_available():
        return "no CUDA device"
    cap = tuple(torch.cuda.get_device_capability())
    if cap != (9, 0):
        return f"needs an sm_90 (Hopper) GPU; found sm_{cap[0]}{cap[1]}"
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [i for i in items if "gpu" in i.keywords]
    if not gpu_items:
        return
    reason = _hopper_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in gpu_items:
        item.add_marker(skip)
