"""tools/hf_bench.py's experts kernel time from a profiler trace: only kernels inside the
experts ranges' GPU spans count, and their durations, not the spans (CPU, synthetic trace)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("transformers")


def _hf_bench():
    path = Path(__file__).resolve().parents[1] / "tools" / "hf_bench.py"
    spec = importlib.util.spec_from_file_location("hf_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_kernel_time_counts_kernels_inside_the_spans_only():
    events = [
        # two experts calls; the host was slow, so each span holds idle time
        {"cat": "gpu_user_annotation", "name": "hf_bench.experts", "ts": 100.0, "dur": 50.0},
        {"cat": "gpu_user_annotation", "name": "hf_bench.experts", "ts": 300.0, "dur": 40.0},
        {"cat": "gpu_user_annotation", "name": "other", "ts": 200.0, "dur": 50.0},
        {"cat": "kernel", "name": "a", "ts": 100.0, "dur": 5.0},
        {"cat": "kernel", "name": "b", "ts": 140.0, "dur": 10.0},
        {"cat": "kernel", "name": "c", "ts": 300.0, "dur": 7.0},
        {"cat": "kernel", "name": "attention", "ts": 210.0, "dur": 30.0},  # outside: not counted
        {"cat": "cpu_op", "name": "hf_bench.experts", "ts": 90.0, "dur": 400.0},
    ]
    assert _hf_bench().kernel_ms_in_ranges(events, "hf_bench.experts") == pytest.approx(0.022)
