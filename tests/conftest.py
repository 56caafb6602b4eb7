"""Fixtures for the cross-package tests: every test starts from a freshly loaded dispatcher
with no forced kernel, and leaves it reloaded."""
from __future__ import annotations

import pytest

import dispatcher


@pytest.fixture(autouse=True)
def _fresh_dispatcher(monkeypatch):
    monkeypatch.delenv(dispatcher.ENV_KERNEL, raising=False)
    dispatcher.reload()
    yield
    dispatcher.reload()
