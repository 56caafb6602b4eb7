"""tools/profile_split.py on the CPU: its arguments, and the per-kernel sums it prints (the
profiler's events replaced by stand-ins)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
profile_split = importlib.import_module("profile_split")


def _event(name, start, us):
    return SimpleNamespace(name=name, device_type=torch.autograd.DeviceType.CUDA,
                           time_range=SimpleNamespace(start=start), device_time_total=us)


def test_graph_arguments_and_their_limits():
    a = profile_split.parse_args(["--graph", "--copies", "4", "--warm", "0", "--replays", "3"])
    assert a.graph and (a.copies, a.warm, a.replays) == (4, 0.0, 3)
    for bad in (["--copies", "0"], ["--replays", "0"], ["--warm", "-1"], ["--tokens", "0"]):
        with pytest.raises(SystemExit):
            profile_split.parse_args(bad)


def test_per_kernel_means_and_repeated_names_in_launch_order():
    # two calls; "gemm" runs twice per call (FC1 then FC2), "route" once
    evs = [_event("route", 0, 8.0), _event("gemm", 1, 100.0), _event("gemm", 2, 50.0),
           _event("route", 3, 10.0), _event("gemm", 4, 110.0), _event("gemm", 5, 60.0),
           SimpleNamespace(name="host", device_type=torch.autograd.DeviceType.CPU,
                           time_range=SimpleNamespace(start=6), device_time_total=999.0)]
    per = profile_split.per_kernel(evs, calls=2)
    assert per == {"route": 9.0, "gemm [0]": 105.0, "gemm [1]": 55.0}


def test_report_gives_the_time_between_kernels(capsys):
    profile_split.report("t", {"a": 60.0, "b": 20.0}, wall_us=100.0)
    out = capsys.readouterr().out
    assert "80.0 us of GPU kernels" in out
    assert "between kernels 20.0 (20.0%)" in out
