"""bench_e2e_transformers.py judges each row against an fp32 truth on transformers' own torch paths.

Deep random-weight stacks amplify rounding: at 48 Qwen3-Next layers two exact bf16 paths end at logit
cosine ~0.96 to each other, so "is our path wrong" is asked of an fp32 copy of the stack, not of the
other bf16 path. These tests pin the verdict rule and that the truth really runs transformers' torch
functions (not FLA's, not ours), on tiny stacks on the CPU.
"""

import importlib
import inspect
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


@pytest.fixture
def bench(monkeypatch, hf_transformers):
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import their siblings (_harness) as run from there
    return importlib.import_module("bench_e2e_transformers")


def _row(prefill, decode):
    return {"truth_prefill_cos": prefill, "truth_decode_cos": decode, "prefill_cos": 0.0, "decode_cos": 0.0}


def test_judge_against_the_truth_scales_with_the_default_paths_error(bench):
    default = _row(0.96, 0.95)  # a deep stack: the default bf16 path is 0.04 / 0.05 away from fp32
    # within TRUTH_RATIO x the default's error plus 1 - 0.995: correct even though cos to default is 0
    assert bench.judge(_row(0.93, 0.91), 0.995, default)
    assert not bench.judge(_row(0.80, 0.95), 0.995, default)  # prefill 5x further than default's
    assert not bench.judge(_row(0.96, 0.85), 0.995, default)  # decode 3x further
    # a compressed scheme's floor widens the slack by its own 1 - cosine_min
    assert bench.judge(_row(0.90, 0.88), 0.95, default)


def test_judge_without_a_truth_compares_with_the_default_path(bench):
    row = {"prefill_cos": 0.999, "decode_cos": 0.994}
    assert not bench.judge(row, 0.995, None)
    assert bench.judge(row, 0.99, None)
    assert bench.judge(row, 0.99, {"variant": "default"})  # a default row without truth fields


def test_torch_only_runs_transformers_torch_functions_and_restores(bench, tat, transformers_torch_gdn):
    from torch_aura.integrations.transformers import gdn

    model = bench.build("qwen3-next", 2, True, __import__("torch").device("cpu"))
    name = "transformers.models.qwen3_next.modeling_qwen3_next"
    module = importlib.import_module(name)
    kinds = gdn.discover()[name]
    tat.enable(model)
    ours = {g: getattr(module, g) for g in kinds.values()}
    with bench.torch_only(model):
        for g in kinds.values():
            fn = getattr(module, g)
            assert fn is inspect.unwrap(fn) and fn.__module__ == name, g  # the undecorated torch function
    assert {g: getattr(module, g) for g in kinds.values()} != ours  # torch_only disabled ours ...
    tat.disable(model)
    assert all(getattr(module, g) is not inspect.unwrap(getattr(module, g)) for g in kinds.values())  # ... and restored


def test_tiny_run_reports_cosines_to_the_truth(tmp_path, hf_transformers, transformers_torch_gdn):
    cmd = [sys.executable, str(BENCH / "bench_e2e_transformers.py"), "--tiny", "--models", "llama3-8b,qwen3-next",
           "--contexts", "64", "--batches", "1,2", "--layers", "2", "--truth-tokens", "4096",
           "--variants", "default,aura-attn,aura4v2", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=BENCH, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for f in (tmp_path / "raw").glob("e2e_transformers_*.jsonl") for line in f.open()]
    e2e = [r for r in rows if r.get("kind") == "e2e"]
    assert {r["model"] for r in e2e} == {"llama3-8b", "qwen3-next"} and len(e2e) == 12
    for r in e2e:
        assert r["correct"], r
        floor = 0.999 if r["variant"] != "aura4v2" else 0.95
        assert min(r["truth_prefill_cos"], r["truth_decode_cos"]) >= floor, r
    assert "vs fp32: cos (prefill / decode), agreement" in (tmp_path / "e2e_transformers_qwen3-next_cpu.md").read_text()


def test_compare_falls_back_to_row_0_when_the_prefilled_rows_differ(bench):
    import torch

    g = torch.Generator().manual_seed(0)
    base = {"prefill_logits": torch.randn(4, 32, generator=g), "decode_logits": torch.randn(3, 4, 32, generator=g),
            "prefill_rows": 4}
    one_row = {"prefill_logits": base["prefill_logits"][:1].clone(), "prefill_rows": 1,
               "decode_logits": torch.cat([base["decode_logits"][:, :1], torch.randn(3, 3, 32, generator=g)], 1)}
    same = bench.compare(one_row, base)  # rows 1-3 repeat row 0's prompt: only row 0 is comparable
    assert same["prefill_cos"] > 0.9999 and same["decode_cos"] > 0.9999 and same["agreement"] == 1.0
    one_row["prefill_rows"] = 4  # claimed the same rows: every row compares, and rows 1-3 differ
    assert bench.compare(one_row, base)["decode_cos"] < 0.9


def test_stream_counts_the_triton_builds_of_a_prompt(bench):
    """The prompt stream attributes a stall to Triton by count: ``TritonCompiles`` records what Triton's
    compilation listener reports inside it (built or loaded from disk), calls a listener installed before,
    and puts that one back on exit; the stream table says what the first prompt built."""
    from triton import knobs

    earlier = []
    before = knobs.compilation.listener

    def outer(**kw):
        earlier.append(kw["cache_hit"])

    knobs.compilation.listener = outer
    try:
        with bench.H.TritonCompiles() as seen:
            times = knobs.CompileTimes(ir_initialization=1000, lowering_stages=[("ttir", 500000)], store_results=0)
            for hit, name in ((False, "_solve"), (True, "_w_u"), (False, "_solve")):
                knobs.compilation.listener(src=types.SimpleNamespace(name=name), metadata={}, metadata_group={},
                                           times=times, cache_hit=hit)
        assert knobs.compilation.listener is outer
    finally:
        knobs.compilation.listener = before
    assert earlier == [False, True, False]
    assert [from_disk for _, from_disk, _ in seen] == [False, True, False]
    summary = seen.summary()
    assert summary == {"triton_compiled": 2, "triton_loaded": 1, "triton_compile_s": pytest.approx(1.002),
                       "triton_compiled_names": ["_solve"]}
    assert bench.stream_builds(summary) == "2 compiled (1.00 s: _solve), 1 from disk"
    assert [v.split()[0] for v in seen.variants] == ["_solve", "_solve"]  # compiles only, each in words
    assert bench.stream_builds({"triton_compiled": 0, "triton_loaded": 0, "triton_compile_s": 0.0}) == "none"
    assert bench.stream_builds({}) == "-"


def test_rounds_take_turns_and_report_the_median_step(tmp_path, hf_transformers):
    """``--rounds 3``: every variant of a row is timed three times, the variants taking turns; the row's step is
    the median of its rounds and its prefill the fastest, and the report lists the rounds."""
    cmd = [sys.executable, str(BENCH / "bench_e2e_transformers.py"), "--tiny", "--models", "llama3-8b",
           "--contexts", "32", "--batches", "2", "--layers", "1", "--truth-tokens", "0", "--rounds", "3",
           "--variants", "default,aura-attn", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=BENCH, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for f in (tmp_path / "raw").glob("e2e_transformers_*.jsonl") for line in f.open()]
    e2e = [r for r in rows if r.get("kind") == "e2e"]
    assert [r["variant"] for r in e2e] == ["default", "aura-attn"]
    for r in e2e:
        assert len(r["step_ms_rounds"]) == 3 and len(r["prefill_ms_rounds"]) == 3, r
        assert r["step_ms"] == sorted(r["step_ms_rounds"])[1] and r["prefill_ms"] == min(r["prefill_ms_rounds"])
        assert r["tok_s"] == pytest.approx(r["B"] / r["step_ms"] * 1e3)
    order = [line.split()[1] for line in done.stdout.splitlines() if "decode step per round" in line]
    assert order == ["default", "aura-attn"]
    assert "## Decode step per round" in (tmp_path / "e2e_transformers_llama3-8b_cpu.md").read_text()


def test_unknown_variant_is_refused_before_any_row_runs(tmp_path, hf_transformers):
    """A misspelt ``--variants`` entry stops the bench before a model is built or a row timed (on the GPU a
    full-depth row costs minutes of device time before the loop would reach the bad name)."""
    cmd = [sys.executable, str(BENCH / "bench_e2e_transformers.py"), "--tiny", "--models", "llama3-8b",
           "--contexts", "32", "--batches", "1", "--layers", "1", "--variants", "default,aura-attn-compiled",
           "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=BENCH, timeout=600)
    assert done.returncode != 0
    assert "unknown aura-attn-compiled" in done.stderr and "aura-attn-static-compiled" in done.stderr
    assert "prefill" not in done.stdout and not (tmp_path / "raw").exists()


def test_rows_compare_with_default_no_cudnn_when_default_is_not_run(bench):
    """The dense eager path the other rows are compared with is ``default``, else ``default-no-cudnn``."""
    assert bench.reference_of(["default-no-cudnn", "aura8-compiled"]) == "default-no-cudnn"
    assert bench.reference_of(["aura8", "default-no-cudnn", "default"]) == "default"
    assert bench.reference_of(["aura8", "static-compiled"]) is None


def test_row_0_prompt_and_steps_do_not_depend_on_the_rows_prefilled(bench):
    """A row that falls back to a one-row prefill (out of memory at B) is compared on row 0: its prompt and
    teacher-forced steps must be those of the B-row run, else the comparison reads a correct path WRONG."""
    model = types.SimpleNamespace(config=types.SimpleNamespace(
        get_text_config=lambda: types.SimpleNamespace(vocab_size=1000)))
    ids8, steps8 = bench.prompts(model, 8, 16, "cpu")
    ids1, steps1 = bench.prompts(model, 8, 16, "cpu", prefill_rows=1)
    assert ids1.shape == (1, 16) and steps1.shape == steps8.shape == (bench.DECODE_STEPS, 8, 1)
    assert (ids1[0] == ids8[0]).all() and (steps1 == steps8).all()
    _, steps2 = bench.prompts(model, 2, 16, "cpu")
    assert (steps2 == steps8[:, :2]).all()  # a row's steps are its own at every B


def test_longest_context_reads_any_dense_row_and_compiled_scheme_rows(bench):
    # rows with only what the table reads (the prefill / decode table shows them as out of memory)
    rows = [{"kind": "e2e", "model": "llama3-8b", "layers": 32, "B": 8, "T": 8192, "variant": v,
             "bytes_per_token_layer": b}
            for v, b in (("default-no-cudnn", 4096.0), ("static-compiled", 4096.0), ("aura4v2-compiled", 832.0))]
    facts = {k: "x" for k in ("gpu", "torch", "transformers", "commit")}
    md = bench.render(facts, "-", rows, None)
    table = md[md.index("## Longest context"):]
    assert "| llama3-8b | dense (default-no-cudnn) | 4096 |" in table and "1.00x" in table
    assert "| llama3-8b | aura4v2 (aura4v2-compiled) | 832 |" in table and f"{4096 / 832:.2f}x" in table


def test_a_prefill_out_of_memory_falls_back_to_one_row_and_says_what_was_held(bench, tmp_path, monkeypatch, capsys):
    """A variant whose B-row prefill runs out of memory is prefilled as one row (the others repeat it); the row
    records what was held before the attempt and its peak, so a report can place the shortfall."""
    import torch

    real = bench.run_one

    def tight(model, variant, B, T, device, reps, prefill_rows=None):
        if variant == "aura-attn" and (prefill_rows or B) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (a stand-in)")
        return real(model, variant, B, T, device, reps, prefill_rows)

    monkeypatch.setattr(bench, "run_one", tight)
    assert bench.main(["--tiny", "--models", "llama3-8b", "--contexts", "32", "--batches", "2", "--layers", "1",
                       "--truth-tokens", "0", "--variants", "default,aura-attn", "--out", str(tmp_path)]) == 0
    rows = [json.loads(line) for f in (tmp_path / "raw").glob("e2e_transformers_*.jsonl") for line in f.open()]
    fell_back = next(r for r in rows if r.get("variant") == "aura-attn")
    assert fell_back["prefill_rows"] == 1 and fell_back["oom"] == ["prefill B=2: 0.0 GB held before, peak 0.0 GB"]
    assert fell_back["agreement"] == 1.0  # row 0 decoded the same steps as the default's two-row prefill
    assert "aura-attn B=2 T=32: out of memory, prefill B=2" in capsys.readouterr().out
