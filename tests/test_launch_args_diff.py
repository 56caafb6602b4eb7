"""The runners pass every kernel the same values as at BASE_REV (tools/launch_args_diff.py, CPU).

BASE_REV is the last commit whose runners called the kernels with positional arguments; the
operand bundles that replaced them must put the same value (tensor + offset, or number) in every
kernel parameter. A second test swaps two fields in a copy of the tree and checks that the tool
reports exactly those parameters, so a passing comparison means something.

Since 8f1fb8d the packed weights are group records (codes and scales in one tensor): the
kernels lost their block-scale pointers, so the base's parameters that point into a packed
scale tensor are left out of the comparison and the ones after them renumbered (_without_scales).
Since b069cd2 moe-generic's y is bf16 in the paired order of 16 columns: its top-k reduce's
compile key changed (row order -> paired 16), not the values it is passed (_paired_reduce).
Since moe-generic's intermediate is K-tile blocks of padded rows (grouped_gemm.INTERMEDIATE_ROW),
its GEMMs take two more fields (src_kt_bytes, out_kt_bytes) and the intermediate's row stride
is the padded row, not Ip: those are left out of the comparison (_generic_intermediate).
Since b39fa11 moe-gated's GEMMs take two more fields (tile_done, tile_items: FC2 beside FC1),
left out of the comparison too (_without_gated_tile_counts), and so do moe-generic's since its
FC2 starts beside FC1 as well (GENERIC_NEW_FIELDS).
"""
from __future__ import annotations

import importlib.util
import itertools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# b8527ef: main just before the bundles were merged (its runners already narrow int64 ids on
# the host and pick moe-generic's width by expected cost, so only the bundles differ)
BASE_REV = "b8527ef"
# One case per package and shape class: moe-static with distinct sizes and int64 ids,
# moe-generic w4a4 with bias and w4a16 on an expert slice, moe-gated's wide geometry with the
# split routing path on an expert slice.
CASES = ["static-T1-mxfp4-gelu-ids64-wide", "generic-T40-nvfp4-swigluoai-w4a4-bias",
         "generic-T1-mxfp4-silu-w4a16-ids64-ep", "gated-T5000-mxfp4-gelu-w4a16-ep-ids64"]
# Compile-time config fields added or re-chosen since BASE_REV: they choose the code compiled,
# not a value passed at launch, so they are left out of the comparison (width_step: moe-generic's
# mainloop bodies per width class, 9c2e706; producer_warps and stages: its 32-token tiles'
# producer warp and 3-deep ring, e0df7bf; producer_bulk and k_tail: that warp's bulk copies,
# 268912f, and its own zeroing of a K tail; min_ctas: a register bound for ptxas, a candidate;
# cta_reduce: moe-static's FC2 by owned rows of H; overlap: moe-gated's and moe-generic's FC2
# beside FC1).
CONFIG_FIELDS_SINCE_BASE = ("width_step", "producer_warps", "stages", "producer_bulk", "k_tail",
                            "min_ctas", "cta_reduce", "overlap")
# (runner file, text, text with two fields swapped)
SWAPS = [
    ("packages/moe-static/src/moe_static/runner.py",
     "act_alpha=activation.alpha, act_beta=activation.beta",
     "act_alpha=activation.beta, act_beta=activation.alpha"),
    ("packages/moe-generic/src/moe_generic/runner.py",
     "src_stride=src.stride(0), src_kt_bytes=TILE_K * 2, k_real=H",
     "src_stride=H, src_kt_bytes=TILE_K * 2, k_real=src.stride(0)"),
]


def _tool():
    spec = importlib.util.spec_from_file_location("launch_args_diff",
                                                  ROOT / "tools" / "launch_args_diff.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tool():
    return _tool()


@pytest.fixture(scope="module")
def current(tool):
    return tool.listing(ROOT, CASES)


def _changed(before: dict, after: dict) -> list:
    """(case, line number, before, after) for every line of the listings that differs."""
    return [(name, i, a, b) for name in CASES
            for i, (a, b) in enumerate(itertools.zip_longest(before[name], after[name],
                                                             fillvalue="<missing>"))
            if a != b]


def _without_new_config_fields(listing: dict) -> dict:
    drop = re.compile(r", (?:%s)=[^,)]*" % "|".join(CONFIG_FIELDS_SINCE_BASE))
    return {name: [drop.sub("", line) for line in lines] for name, lines in listing.items()}


# the base's packed block-scale tensors (moe_common.packed before 8f1fb8d)
SCALE_TENSORS = re.compile(r"^\s*\d+ packed-fragments\.w(?:13|2)_scale(?:[+\[]|$)")


def _without_scales(listing: dict) -> dict:
    """The listing without parameters that point into a packed scale tensor, each launch's
    parameters renumbered from 0."""
    out = {}
    for name, lines in listing.items():
        kept, i = [], 0
        for line in lines:
            if line.startswith("launch"):
                kept.append(line)
                i = 0
            elif not SCALE_TENSORS.match(line):
                kept.append(f"{i:4d} {line.split(maxsplit=1)[1]}")
                i += 1
        out[name] = kept
    return out


# moe-generic's fields added with the intermediate's layout and with FC2 beside FC1, and the
# intermediate's row stride (FC1's out_stride, FC2's src_stride), whose value the layout changed
GENERIC_NEW_FIELDS = ("src_kt_bytes", "out_kt_bytes", "tile_done", "tile_items")
GENERIC_INTER_STRIDE = {"fc1": "out_stride", "fc2": "src_stride"}


def _generic_intermediate(listing: dict, current: bool) -> dict:
    """moe-generic's GEMM launches with the new fields dropped (current listings) and the
    intermediate's row stride blanked (both)."""
    from moe_generic.grouped_gemm import GemmOperands

    fields = list(GemmOperands._fields)
    if not current:
        fields = [f for f in fields if f not in GENERIC_NEW_FIELDS]
    out = {}
    for name, lines in listing.items():
        kept, phase, i = [], None, 0
        for line in lines:
            if line.startswith("launch"):
                m = re.match(r"launch \('moe-generic', GemmConfig\(phase='(fc\d)'", line)
                phase, i = (m.group(1) if m else None), 0
                kept.append(line)
                continue
            n = int(line.split()[0])
            field = fields[n] if phase and n < len(fields) else None
            if field in GENERIC_NEW_FIELDS:
                continue
            if field == GENERIC_INTER_STRIDE.get(phase):
                line = f"{n:4d} <intermediate row stride>"
            kept.append(f"{i:4d} {line.split(maxsplit=1)[1]}" if phase else line)
            i += 1
        out[name] = kept
    return out


# moe-gated's fields added with FC2 beside FC1 (b39fa11), the last two of GatedOperands
GATED_NEW_FIELDS = ("tile_done", "tile_items")


def _without_gated_tile_counts(listing: dict) -> dict:
    """The current listing with moe-gated's GEMM launches' new fields dropped and the stream
    after them renumbered."""
    from moe_gated.kernel import GatedOperands

    fields = len(GatedOperands._fields)
    assert GatedOperands._fields[-2:] == GATED_NEW_FIELDS
    out = {}
    for name, lines in listing.items():
        kept, gated = [], False
        for line in lines:
            if line.startswith("launch"):
                gated = line.startswith("launch ('moe-gated', GatedConfig(")
                kept.append(line)
                continue
            n = int(line.split()[0])
            if gated and fields - 2 <= n < fields:
                continue
            if gated and n >= fields:
                line = f"{n - 2:4d} {line.split(maxsplit=1)[1]}"
            kept.append(line)
        out[name] = kept
    return out


# the base's row-order reduce (moe-generic's) and the paired one that replaced it
ROW_ORDER_REDUCE = re.compile(r"^launch \('topk_reduce', (\d), 0, False\)$")


def _paired_reduce(listing: dict) -> dict:
    return {name: [ROW_ORDER_REDUCE.sub(r"launch ('topk_reduce', \1, 16, False)", line)
                   for line in lines] for name, lines in listing.items()}


def test_launch_arguments_match_the_base(tool, current, tmp_path):
    probe = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{BASE_REV}^{{commit}}"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"git history with {BASE_REV} is not available")
    base = tool.listing(tool.extract(BASE_REV, tmp_path), CASES)
    lines = [sum(map(len, listing.values())) for listing in (base, _without_scales(base))]
    assert lines[0] - lines[1] == 8  # FC1 and FC2 scales of the static, generic x 2, gated cases
    assert _changed(_generic_intermediate(
        _paired_reduce(_without_new_config_fields(_without_scales(base))), current=False),
                    _generic_intermediate(_without_new_config_fields(
                        _without_gated_tile_counts(current)), current=True)) == []
    assert all(any(line.startswith("launch") for line in base[name]) for name in CASES)


def test_swapped_fields_are_reported(tool, current, tmp_path):
    shutil.copytree(ROOT / "packages", tmp_path / "packages",
                    ignore=shutil.ignore_patterns("__pycache__", "tests"))
    for path, text, swapped in SWAPS:
        src = (tmp_path / path).read_text()
        assert src.count(text) >= 1, (path, text)
        (tmp_path / path).write_text(src.replace(text, swapped))
    changed = _changed(current, tool.listing(tmp_path, CASES))
    by_case = {}
    for name, i, a, b in changed:
        by_case.setdefault(name, []).append((a.split()[-1], b.split()[-1]))
    # moe-static: act_alpha 1.702 (fp32) and act_beta 1.0 trade places
    assert sorted(by_case["static-T1-mxfp4-gelu-ids64-wide"]) == [
        ("1.0", "1.7020000219345093"), ("1.7020000219345093", "1.0")]
    # moe-generic FC1 (w4a16): x's row stride H + X_PAD and H trade places; w4a4 reads the
    # quantized rows, whose stride is H, so that case cannot tell
    hidden = 256
    assert sorted(by_case["generic-T1-mxfp4-silu-w4a16-ids64-ep"]) == [
        (str(hidden), str(hidden + tool.X_PAD)), (str(hidden + tool.X_PAD), str(hidden))]
    assert set(by_case) == {"static-T1-mxfp4-gelu-ids64-wide", "generic-T1-mxfp4-silu-w4a16-ids64-ep"}
