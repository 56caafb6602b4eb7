"""tools/soak.py runs its argument parsing and dry run on the CPU, and says it needs a GPU."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SOAK = Path(__file__).resolve().parents[2] / "tools" / "soak.py"


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("soak_tool", SOAK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help(soak, capsys):
    with pytest.raises(SystemExit) as e:
        soak.main(["--help"])
    assert e.value.code == 0
    assert "--watchdog" in capsys.readouterr().out


def test_dry_run_prints_the_plan(soak, capsys):
    assert soak.main(["--dry-run", "--max-tokens", "100", "--seed", "3"]) == soak.EXIT_OK
    plan = json.loads(capsys.readouterr().out)
    assert plan["graph_tokens"] == [1, 8, 64, 100]
    assert len(plan["first_steps"]) == 10
    for s in plan["first_steps"]:
        assert s["op"] in soak.OPS and 1 <= s["tokens"] <= 100
        if s["op"] == "replay":
            assert s["tokens"] in plan["graph_tokens"]


def test_bad_arguments_are_refused(soak):
    with pytest.raises(SystemExit) as e:
        soak.main(["--max-tokens", "0", "--dry-run"])
    assert e.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_without_a_gpu_it_exits_4(soak, capsys):
    assert soak.main(["--seconds", "1"]) == soak.EXIT_NO_GPU
    assert "needs an sm_90" in capsys.readouterr().out


def test_each_step_makes_its_inputs_on_the_stream_that_reads_them(soak):
    """The side streams do not wait for the default stream: inputs made there race the kernel
    (and the allocator may hand their freed blocks to the next step while it still reads)."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    current = ["default"]

    @contextmanager
    def stream(s):
        before, current[0] = current[0], s
        yield
        current[0] = before

    class Out:
        def clone(self):
            return self

    seen = []
    run = soak.Soak.__new__(soak.Soak)
    run.torch = SimpleNamespace(cuda=SimpleNamespace(stream=stream))
    run.s1, run.s2 = "s1", "s2"
    run.counts = {op: 0 for op in soak.OPS}
    run.inputs = lambda t, int64, wild: seen.append(("inputs", current[0])) or ("x", "tw", "ids")
    call = lambda *a: seen.append(("call", current[0])) or Out()  # noqa: E731
    run.a = run.b = call
    run._fused_moe = lambda args: call(*args)
    static = tuple(SimpleNamespace(copy_=lambda src: None) for _ in range(3))
    run.graphs = {8: (SimpleNamespace(replay=lambda: seen.append(("call", current[0]))), static,
                      Out())}
    for op in soak.OPS:
        seen.clear()
        run.step({"op": op, "tokens": 8, "int64": False, "wild_ids": False}, keep=True)
        streams = {where for _, where in seen}
        assert len(streams) == 1 and "default" not in streams, (op, seen)
