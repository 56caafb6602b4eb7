"""Repository-wide pytest setup for `uv run pytest` at the root (every member's tests).

Tests marked `gpu` run only on an sm_90 (Hopper) CUDA GPU; each member's own conftest.py
applies the same rule (moe_common.testing.skip_gpu_test_without_hopper) when pytest runs
from that member's directory.
"""
from __future__ import annotations

from moe_common.testing import skip_gpu_test_without_hopper as pytest_runtest_setup  # noqa: F401

# pytest's importlib import mode names dispatcher/tests/test_x.py "dispatcher.tests.test_x" and,
# when no module "dispatcher" is loaded yet, makes the repository folder dispatcher/ (no
# __init__.py) a namespace package that shadows the installed `dispatcher`. Importing the real
# package first makes pytest reuse it as the parent. Where only some members are installed
# (`uv run --package moe-static pytest packages/moe-static packages/moe-common`) the dispatcher
# and its tests are absent and there is nothing to shadow.
try:
    import dispatcher  # noqa: F401
except ImportError:
    pass
