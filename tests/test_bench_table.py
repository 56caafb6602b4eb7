"""tools/bench_table.py on the CPU: the table, the A/B and the bars from recorded bench JSON,
against the numbers BENCHMARKS.md quotes for the same files."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
bench_table = importlib.import_module("bench_table")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name):
    return bench_table.load(str(BENCH / name))


def test_table_cells_are_the_times_and_the_kernels_that_ran():
    text = bench_table.tables(_load("2026-12-06-h200-5f71179-auto-all.json"))
    lines = text.splitlines()
    assert lines[0] == ("| preset | T=1 | T=8 | T=32 | T=64 | T=128 | T=256 | T=512 | T=1024 "
                        "| T=2048 | T=8192 |")
    # the H200 table at 5f71179 (benchmarks/HISTORY.md, the 4f28178 entry), first row
    assert lines[2] == ("| deepseek-v3 | 62.5 S | 370.1 N | 1000.2 N | 1368.2 N | 1576.5 N "
                        "| 1719.3 N | 2115.7 N | 2512.6 G | 3183.4 G | 9527.6 G |")
    assert len(lines) == 2 + 5


def test_benchmarks_md_tables_are_their_json():
    # the two current-results tables, line for line
    doc = (BENCH.parent / "BENCHMARKS.md").read_text()
    for name in ("2026-12-07-h100-8c84a7a-auto-all.json",
                 "2026-12-06-h200-4f28178-auto-all.json"):
        assert bench_table.tables(_load(name)) in doc, name


def test_the_landing_gate_of_8c84a7a(capsys):
    # BENCHMARKS.md: the decode over pairs of words against a7cec80, same run on an H100
    new, old = (str(BENCH / f"2026-12-07-h100-8c84a7a-pair-decode-ab-{c}.json")
                for c in ("8c84a7a", "a7cec80"))
    assert bench_table.main([new, "--against", old, "--gate", "0.995"]) == 0
    out = capsys.readouterr().out
    assert "geomean -0.53% over 10 points" in out
    assert "gate: geomean ratio 0.9947 against 0.995: pass" in out


def test_forced_kernels_get_a_table_each():
    text = bench_table.tables(_load("2026-12-06-h100-14ac7c2-cutover-mid-16.json"))
    assert "moe-generic:" in text and "moe-gated:" in text
    assert "| qwen3-30b-a3b | 149.5 N | 161.0 N | 170.9 N |" in text
    assert "| qwen3-30b-a3b | 160.2 G | 163.5 G | 168.2 G |" in text


def test_against_pairs_points_whose_kernel_changed():
    # benchmarks/HISTORY.md: 5f71179's H200 table against f35f74c's, geomean -0.73%, with the two
    # T=8 points that moved from moe-generic to moe-static among the 50
    text = bench_table.against(_load("2026-12-06-h200-5f71179-auto-all.json"),
                               _load("2026-12-05-h200-f35f74c-auto-all.json"))
    assert "geomean -0.73% over 50 points" in text
    assert "moe-static: 9 points, -9.0% (nemotron-relu2 T=8)" in text
    assert bench_table.against(_load("2026-12-06-h100-14ac7c2-cutover-mid-16.json"),
                               _load("2026-12-06-h200-5f71179-auto-all.json")) == (
        "no point in common")


def test_bars_of_the_recorded_h200_tables():
    # benchmarks/HISTORY.md: every bar met at 5f71179 on the H200 but DeepSeek-V3 T=512 and
    # T=1024 and Qwen3.5-35B T=512
    text, short = bench_table.bars(_load("2026-12-06-h200-5f71179-auto-all.json"))
    assert short == 3
    shorts = [line for line in text.splitlines() if line.endswith("SHORT")]
    assert [line.split(":")[0] for line in shorts] == [
        "deepseek-v3 T=512", "deepseek-v3 T=1024", "qwen3.5-35b T=512"]
    assert "nemotron-relu2 T=8192: 529 TFLOP/s against 450 met" in text
    assert "note:" not in text
    # BENCHMARKS.md: at 4f28178 those three and Qwen3.5-35B T=1024 (222.6 against 222)
    text, short = bench_table.bars(_load("2026-12-06-h200-4f28178-auto-all.json"))
    assert short == 4
    assert "qwen3.5-35b T=1024: 222.6 us against 222 (+0.3%) SHORT" in text
    assert "geomean +0.46% over 50 points" in bench_table.against(
        _load("2026-12-06-h200-4f28178-auto-all.json"),
        _load("2026-12-06-h200-5f71179-auto-all.json"))


def test_bars_name_another_gpu_and_missing_points():
    text, short = bench_table.bars(_load("2026-12-06-h100-14ac7c2-cutover-mid-16.json"))
    assert text.startswith("note: the bars were set on the H200; this run is on NVIDIA H100")
    assert short == len(bench_table.BARS) + len(bench_table.TFLOPS_BARS)


def test_command_line(capsys):
    new, old = (str(BENCH / f"2026-12-06-h100-{c}-auto-all.json") for c in ("0e50077", "b39fa11"))
    assert bench_table.main([new, "--bars", "--against", old]) == 0
    out = capsys.readouterr().out
    assert out.startswith("NVIDIA H100 80GB HBM3, commit 0e50077, seed 1")
    assert "geomean -0.97% over 50 points" in out
    assert "bars short or not measured" in out


def test_gate_passes_only_a_faster_new_run(capsys):
    # 0e50077's H100 table against b39fa11's: geomean -0.97%, so ratio 0.9903
    new, old = (str(BENCH / f"2026-12-06-h100-{c}-auto-all.json") for c in ("0e50077", "b39fa11"))
    assert bench_table.main([new, "--against", old, "--gate", "0.995"]) == 0
    assert "gate: geomean ratio 0.9903 against 0.995: pass" in capsys.readouterr().out
    assert bench_table.main([new, "--against", old, "--gate", "0.99"]) == 1
    assert bench_table.main([old, "--against", new, "--gate", "1.0"]) == 1
    other = str(BENCH / "2026-12-06-h100-14ac7c2-cutover-mid-16.json")
    assert bench_table.main([other, "--against", new, "--gate", "2.0"]) == 1
    with pytest.raises(SystemExit):
        bench_table.main([new, "--gate", "0.99"])
