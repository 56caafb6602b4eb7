"""moe-static without a GPU: every configuration compiles for sm_90a (three are assembled and
must not spill registers); limits, bids and the plugin's answers."""
from __future__ import annotations

import re

import pytest
import torch

from moe_common.cute import jit
from moe_common.testing import check_operands_marshal, make_shape, ptxas_report
from moe_common.types import ACTIVATIONS, PRIORITY_GENERIC, PRIORITY_STATIC, Activation
from moe_static.limits import CUTOVER_TOKENS, priority, unsupported_reason


_shape = make_shape


def test_every_dispatchable_config_compiles_for_sm90a():
    from moe_static.compile_cache import all_configs, compile_config

    configs = all_configs()
    # 2 formats x 4 activations x (int32, int64 ids) x 4 team shapes x FC2 by grid / owned rows
    assert len(configs) == 128
    for cfg in configs:
        assert compile_config(cfg) is not None, cfg


def test_operands_reach_the_kernel_in_field_order():
    """The runner's StaticOperands arrive as the kernel's parameters, one per field, in order
    and with their values (the launcher's marshalling, checked without a GPU)."""
    from moe_static.compile_cache import compile_config, config
    from moe_static.kernel import StaticOperands

    compiled = compile_config(config("nvfp4", "silu"))
    check_operands_marshal(compiled, StaticOperands, 132, jit.example_stream())


_PTX_PROBE = """
import sys
from moe_static.compile_cache import compile_config, config
fmt, act, fc1, fc2, own = sys.argv[1:]
compile_config(config(fmt, act, 4, (int(fc1), int(fc2)), own == "1"))
"""


@pytest.mark.parametrize("fmt,act,teams,own", [
    ("mxfp4", "swigluoai", (1, 2), 0),  # spilled 40 B at 64 registers before .minnctapersm 1
    ("nvfp4", "silu", (2, 2), 0),
    ("nvfp4", "relu2", (1, 1), 0),
    ("mxfp4", "swigluoai", (1, 1), 1),  # FC2 by owned rows (cta_reduce)
])
def test_kernel_assembles_without_register_spills(fmt, act, teams, own, tmp_path):
    """One CTA of 512 threads per SM leaves 128 registers a thread; without .minnctapersm 1
    ptxas held the kernel to 64 and spilled (gpt-oss-120b T=1 26.3 -> 28.0 us; .minnctapersm 1
    since e5076f5, benchmarks/HISTORY.md). Assemble the kernel and check it spills nothing."""
    report = ptxas_report(_PTX_PROBE, [fmt, act, *teams, str(own)], "*StaticMoE*.ptx", tmp_path)
    assert re.search(r"(?<!\d)0 bytes spill stores, 0 bytes spill loads", report), report
    _check_elected_copies(next(tmp_path.rglob("*StaticMoE*.ptx")).read_text())


def _check_elected_copies(ptx: str):
    """Every ring fill (FC1 and FC2, before and inside the step loop) starts a step's token row
    0 and its group records (one copy per K-tile, BLOCK_GROUPS records apart; the second only
    in a step of two K-tiles) behind its expect-tx from one elect.sync lane. Under `if lane ==
    0` ptxas wrapped each copy in a loop over the active lanes (FC1 loop 357 instead of 338
    SASS instructions, DeepSeek-V3 and gpt-oss-120b 2% slower at T = 8, 64); a loop over the
    records inside the asm measured 2.4-5% slower at T = 1 (7cea443, benchmarks/HISTORY.md)."""
    blocks = re.findall(r"elect\.sync _\|(\w+), 0xffffffff;\n@\1 mbarrier\.arrive\.expect_tx[^\n]*\n"
                        r"((?:(?:setp[^\n]*\n)?@\w+ cp\.async\.bulk\.shared::cluster\.global[^\n]*\n)"
                        r"{3})\}", ptx)
    assert len(blocks) >= 4, f"{len(blocks)} elected fills"
    assert all(b[1].count("setp.gt.and.s32") == 1 for b in blocks), blocks
    # the only other bulk copies are the token rows of lanes 1..nch-1, one per fill site
    loose = len(re.findall(r"^\s*(?:@%p\d+ )?cp\.async\.bulk\.shared::cluster\.global", ptx, re.M))
    assert loose == len(blocks), (loose, len(blocks))


# (T, k, experts, FC1 groups, FC2 groups) on the H200's 132 SMs x 16 warps: Qwen3-30B-A3B (H=2048,
# I=768), DeepSeek-V3 (H=7168, I=2048), gpt-oss-120b (H=I=2880, k=4), Qwen3.5-35B (H=2048, I=512)
QWEN3, DEEPSEEK = (8, 128, 96, 128), (8, 256, 256, 448)
GPT_OSS, QWEN35 = (4, 128, 360, 180), (8, 256, 64, 128)


# the fastest forced team shapes (MOE_STATIC_TEAMS runs at edf81db..1ef1a68, benchmarks/HISTORY.md)
@pytest.mark.parametrize("tokens,layer,teams", [
    (1, QWEN3, (2, 2)),  # 768 FC1 and 1024 FC2 units for 2112 warps
    (1, DEEPSEEK, (1, 1)),  # 2048 FC1 units
    (2, QWEN3, (1, 1)),  # 1536 FC1 units
    (1, GPT_OSS, (1, 2)),  # 1440 FC1 and 720 FC2 units
    (2, QWEN35, (2, 1)),  # 1024 FC1 and 2048 FC2 units
    (8, QWEN3, (1, 1)),
    (64, DEEPSEEK, (1, 1)),
])
def test_team_choice_follows_the_measured_points(tokens, layer, teams):
    from moe_static.runner import choose_teams

    assert choose_teams(tokens, *layer, 132 * 16) == teams


@pytest.mark.parametrize("hidden,grid,owned", [
    (2048, 132, True),  # Qwen3-30B-A3B, Qwen3.5-35B: 128 groups, one per CTA, 4 CTAs without
    (7168, 132, False),  # DeepSeek-V3: 448 groups, 3 or 4 per CTA
    (2880, 132, False),  # gpt-oss-120b: 180 groups, 1 or 2
    (2688, 132, False),  # nemotron-relu2: 168 groups
    (4224, 132, True),  # 264 groups, 2 per CTA
    (1024, 132, False),  # 64 groups: half the CTAs would run FC2
])
def test_fc2_by_owned_rows_where_h_spreads_evenly(hidden, grid, owned):
    from moe_static.runner import owns_rows

    assert owns_rows(hidden, grid) == owned


def test_shared_memory_fits_one_cta_per_sm():
    from moe_static.compile_cache import all_configs
    from moe_static.kernel import StaticMoE

    for cfg in all_configs():
        assert StaticMoE(cfg).smem_bytes <= 227 * 1024, cfg


@pytest.mark.parametrize("kw,needle", [
    (dict(device_capability=None), "CUDA device"),
    (dict(device_capability=(12, 0)), "sm_90"),
    (dict(quant_mode="w4a4"), "w4a16 only"),
    (dict(hidden=2880 + 16), "multiple of 32"),
    (dict(hidden=65536 + 32), "hidden=65568 exceeds"),
    (dict(tokens=1025, top_k=2), "routed pairs"),
    (dict(num_local_experts=513, num_experts=1024), "local experts"),
    (dict(dtype=torch.float16), "bf16"),
])
def test_declines_with_reason(kw, needle):
    reason = unsupported_reason(_shape(**kw), Activation("silu"))
    assert reason is not None and needle in reason


def test_bids_above_every_kernel_only_up_to_the_cutover(monkeypatch):
    from moe_static import limits

    monkeypatch.setattr(limits, "CUTOVER_TOKENS", 128)
    assert priority(_shape(tokens=128, top_k=8)) == PRIORITY_STATIC
    assert 0 < priority(_shape(tokens=129, top_k=8)) < PRIORITY_GENERIC


def test_measured_cutover_is_eight_tokens_for_small_experts():
    # ahead of or level with moe-generic at T <= 8 on Qwen3-30B-A3B and Qwen3.5-35B, 3-6% behind
    # at T=16 (static-small at d073081, an H100: limits.py)
    assert CUTOVER_TOKENS == 8
    for k in (1, 4, 8):
        assert priority(_shape(tokens=8, top_k=k)) == PRIORITY_STATIC
        assert 0 < priority(_shape(tokens=9, top_k=k)) < PRIORITY_GENERIC


@pytest.mark.parametrize("experts,top_k,hidden,inter,tokens,highest", [
    (128, 8, 2048, 768, 8, True),  # Qwen3-30B-A3B: 8 tokens, half a row, 1.5M weights
    (128, 8, 2048, 768, 16, False),  # 16 tokens
    (256, 8, 2048, 512, 16, False),  # Qwen3.5-35B: half a row, past 8 tokens
    (8, 2, 2048, 512, 8, True),  # small experts: up to 8 tokens whatever the rows (2 here)
    (128, 6, 2688, 1856, 8, True),  # nemotron-relu2, 4.8M: 8 tokens (0.38 rows)
    (128, 6, 2688, 1856, 9, False),  # 9 tokens
    (128, 4, 2880, 2880, 8, True),  # gpt-oss-120b, 7.9M: 8 tokens (a quarter row)
    (128, 4, 2880, 2880, 16, False),  # 16 tokens
    (256, 8, 7168, 2048, 7, True),  # DeepSeek-V3, 14.0M: 0.22 rows per expert
    (256, 8, 7168, 2048, 8, False),  # a quarter row
    (8, 2, 7168, 2048, 1, False),  # a quarter row at 1 token
])
def test_bids_highest_for_small_batches_by_expert_size(experts, top_k, hidden, inter,
                                                       tokens, highest):
    shape = _shape(tokens=tokens, top_k=top_k, num_experts=experts, num_local_experts=experts,
                   hidden=hidden, intermediate=inter)
    assert (priority(shape) == PRIORITY_STATIC) == highest


def test_plugin_offer_and_decline():
    from moe_static import plugin

    assert "CUDA" in plugin.can_handle(_shape(device_capability=None), Activation()).reason
    for act in ACTIVATIONS:
        offer = plugin.can_handle(_shape(hidden=2880, intermediate=704), Activation(act))
        assert offer.kernel == "moe-static" and offer.priority == priority(_shape())


def test_direct_call_rejects_unsupported_input_with_value_error():
    from moe_common.testing import random_layer, random_routing
    from moe_static import fused_moe

    w = random_layer(4, 64, 32, device="cpu")
    tw, ti = random_routing(2, 4, 2, device="cpu")
    with pytest.raises(ValueError, match="moe-static cannot run this call: needs a CUDA device"):
        fused_moe(torch.randn(2, 64).bfloat16(), w, tw, ti)


def test_shared_memory_layout():
    """The CTA's regions in order, without overlap (moe_common.cute.storage); the mbarriers
    8-byte aligned; the team buffers only where a GEMM has teams of two."""
    from moe_static.kernel import DEPTH, SLOT_BYTES, WARPS, StaticConfig, StaticMoE

    for teams in ((1, 1), (2, 2), (1, 2)):
        k = StaticMoE(StaticConfig("nvfp4", "silu", 4, *teams))
        off = k.storage.offsets
        assert list(off) == ["ring", "team", "cnt", "off", "act", "ord", "nact", "max", "mbar",
                             "flag", "end"]
        assert off["team"] == WARPS * DEPTH * SLOT_BYTES
        assert off["cnt"] - off["team"] == (0 if teams == (1, 1) else WARPS // 2 * 512)
        assert off["mbar"] % 8 == 0 and k.smem_bytes == off["flag"] + 4 * WARPS
