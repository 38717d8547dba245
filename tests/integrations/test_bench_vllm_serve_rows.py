"""bench_vllm_serve.py joins a row's runs of other workloads only where they measured the same thing.

A GPU run holds one command for at most 10 minutes, so a row's workloads may be timed in separate runs
(``--workloads``) into one folder; the table must then show each workload's latest timing of the same
versions, commit and settings, and never mix in a run of another tree or other shapes. No vLLM needed.
"""

import collections
import importlib
import json
import types
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import their siblings (_harness) as run from there
    return importlib.import_module("bench_vllm_serve")


def _args(tmp_path, **kw):
    return types.SimpleNamespace(size="tiny", tp=1, out=str(tmp_path), gpu_memory_utilization=0.85,
                                 kv_cache_memory_bytes=64 << 20, block_size=32, eager=True, **kw)


def _run(bench, args, row, workloads, versions="GPU; vLLM 0.24.0; commit abc1234", error=None, **settings):
    r = {**bench.describe(row), "size": "tiny", "tp": 1, "versions": versions,
         "settings": {**bench.settings(args), **settings}, "workloads": list(workloads)}
    if error:
        return {**r, "error": error}
    return {**r, **{f"{w}_{unit}": 10.0 * (i + 1) for i, w in enumerate(workloads) for unit in ("tok_s", "s")}}


def _write(bench, args, runs):
    bench.jsonl_path(args).write_text("".join(json.dumps(r) + "\n" for r in runs))
    return bench.measured(args)


def test_runs_of_one_tree_join_across_a_failed_run(bench, tmp_path):
    args = _args(tmp_path)
    rows = _write(bench, args, [_run(bench, args, "bf16", ["long", "short"]),
                                _run(bench, args, "bf16", ["decode"], error="RuntimeError: boom"),
                                _run(bench, args, "bf16", ["decode"])])
    assert rows["bf16"]["workloads"] == ["long", "short", "decode"]
    assert (rows["bf16"]["long_s"], rows["bf16"]["short_s"], rows["bf16"]["decode_s"]) == (10.0, 20.0, 10.0)
    line = bench.table(list(rows.values()), "header", args).splitlines()[-1]
    assert "| 10 (1.00x) | 20 (1.00x) | 10 (1.00x) |" in line, line  # long, short, decode, each against itself


def test_a_failed_last_run_shows_its_error(bench, tmp_path):
    args = _args(tmp_path)
    rows = _write(bench, args, [_run(bench, args, "bf16", ["long"]),
                                _run(bench, args, "bf16", ["decode"], error="RuntimeError: boom")])
    assert rows["bf16"]["error"] == "RuntimeError: boom" and "long_s" not in rows["bf16"]


@pytest.mark.parametrize("other", [{"versions": "GPU; vLLM 0.24.0; commit def5678"},
                                   {"block_size": 16}, {"eager": False}])
def test_runs_of_another_tree_or_settings_replace(bench, tmp_path, other):
    args = _args(tmp_path)
    versions = other.pop("versions", "GPU; vLLM 0.24.0; commit abc1234")
    rows = _write(bench, args, [_run(bench, args, "aura4v2", ["long"]),
                                _run(bench, args, "aura4v2", ["decode"], versions=versions, **other)])
    assert rows["aura4v2"]["workloads"] == ["decode"] and "long_s" not in rows["aura4v2"]


def test_an_unknown_commit_never_joins(bench, tmp_path):
    args = _args(tmp_path)
    unknown = "CPU; vLLM 0.32.0; commit unknown"
    rows = _write(bench, args, [_run(bench, args, "bf16", ["long"], versions=unknown),
                                _run(bench, args, "bf16", ["short"], versions=unknown)])
    assert rows["bf16"]["workloads"] == ["short"]


def test_the_gdn_rows_adapter_host_time_is_tabled(bench, tmp_path):
    args = _args(tmp_path)
    calls, host = bench.host_per_call(collections.Counter(causal_conv1d_fn=4, fla_chunk_gated_delta_rule=0),
                                      collections.Counter(causal_conv1d_fn=209000))
    assert calls == {"causal_conv1d_fn": 4} and host == {"causal_conv1d_fn": 52.25}
    gdn = {**_run(bench, args, "gdn", ["short"]), "gdn_calls": calls, "gdn_host_us": host,
           "gdn_start_calls": {"causal_conv1d_fn": 2, "causal_conv1d_update": 8},
           "gdn_start_host_us": {"causal_conv1d_fn": 900.0, "causal_conv1d_update": 120.5}}
    text = bench.table([_run(bench, args, "bf16", ["short"]), gdn], "header", args)
    assert "| adapter | engine start: calls | host us / call | after: calls | host us / call |" in text
    assert "| causal_conv1d_fn | 2 | 900.0 | 4 | 52.2 |" in text
    assert "| causal_conv1d_update | 8 | 120.5 | 0 | - |" in text and "fla_chunk_gated_delta_rule |" not in text
    assert "calls over 2 ms" not in text  # a row without the slow-call counts (older runs) has no such line
    gdn["gdn_slow"], gdn["gdn_slow_over_ms"] = {"causal_conv1d_fn": [1, 180.4]}, 2.0
    text = bench.table([_run(bench, args, "bf16", ["short"]), gdn], "header", args)
    assert "the calls over 2 ms on the host (a compile, a sync) among them: causal_conv1d_fn 1 (180 ms)" in text


def test_start_up_and_the_warm_up_calls_are_tabled(bench, tmp_path):
    """What a user meets before the first token is a table of its own: engine start, the first requests, each
    workload's warm-up call; and the gdn row's engine-start warm-up calls."""
    args = _args(tmp_path)
    bf16 = {**_run(bench, args, "bf16", ["short"]), "engine_s": 41.25, "first_requests_s": 1.5, "short_warm_s": 0.25}
    gdn = {**_run(bench, args, "gdn", ["short"]), "engine_s": 52.0, "first_requests_s": 12.75,
           "gdn_warmed": {"causal_conv1d_fn": 1, "fla_chunk_gated_delta_rule": 9}}
    text = bench.table([bf16, gdn], "header", args)
    assert "| row | engine start | first requests |" in text
    warm = " | ".join("0.25" if w == "short" else "-" for w in bench.WORKLOADS)
    assert f"| bf16 | 41.2 | 1.50 | {warm} |" in text
    assert f"| gdn | 52.0 | 12.75 | {' | '.join('-' for _ in bench.WORKLOADS)} |" in text
    assert "calls of the engine-start warm-up: causal_conv1d_fn 1, fla_chunk_gated_delta_rule 9" in text


def test_a_profiled_slice_is_tabled_with_its_top_kernels(bench, tmp_path):
    """``--profile-requests``: the slice's wall time, the device's busy time and its heaviest kernels (on the
    CPU, the aten ops), largest first, each with its share of the busy time."""
    import torch

    a, b = torch.randn(64, 64), torch.randn(64, 64)
    prof = bench.profiled(lambda: [torch.mm(a, b) for _ in range(3)] + [a + b])
    names, times = [name for name, _, _ in prof["kernels"]], [ms for _, _, ms in prof["kernels"]]
    assert set(names) >= {"aten::mm", "aten::add"} and times == sorted(times, reverse=True), prof["kernels"]
    calls = {name: n for name, n, _ in prof["kernels"]}
    assert calls["aten::mm"] == 3 and calls["aten::add"] == 1
    assert prof["wall_s"] > 0 and prof["busy_ms"] == pytest.approx(sum(ms for _, _, ms in prof["kernels"]))
    args = _args(tmp_path)
    gdn = {**_run(bench, args, "gdn", ["short"]),
           "profile": {"workload": "short", "requests": 8, "new_tokens": 64, "wall_s": 1.5, "busy_ms": 200.0,
                       "kernels": [["_gdn_kernel", 48, 150.0], ["fused_moe_kernel", 96, 50.0]]}}
    text = bench.table([_run(bench, args, "bf16", ["short"]), gdn], "header", args)
    assert "gdn: one profiled slice of the short workload (8 requests, 64 new tokens each): 1.50 s, the device busy 200 ms" in text
    assert "| `_gdn_kernel` | 48 | 150.0 | 75.0% |" in text and "| `fused_moe_kernel` | 96 | 50.0 | 25.0% |" in text
    assert "of them in torch_aura's kernels" not in text  # a slice of an older run has no own_ms
    gdn["profile"]["own_ms"] = 150.0
    text = bench.table([_run(bench, args, "bf16", ["short"]), gdn], "header", args)
    assert "the device busy 200 ms, 150 of them in torch_aura's kernels; its top kernels:" in text


def test_own_kernels_are_told_from_the_rest():
    """The profiles' share of torch_aura's kernels: Triton (and Gluon) kernels by their names, CUDA C++ kernels
    inside a profiler's template signature; a peer's kernel of a similar name is not ours."""
    import _harness as H

    totals = {"_gdn_recurrent_kernel": [3, 2.0], "gdn_state_pass_sm90_kernel": [1, 3.0],
              "void aura::flash_decode_split_simt_kernel<__nv_bfloat16>(aura::DecodeParams)": [2, 1.5],
              "_gdn_post_conv_kernel": [1, 0.25], "fused_recurrent_gated_delta_rule_packed_decode_kernel": [4, 8.0],
              "chunk_fwd_kernel_o": [1, 1.0], "my_gdn_recurrent_kernel_v2": [1, 4.0]}
    assert H.own_kernel_ms(totals) == pytest.approx(6.75)
