"""The transformers integration on the GPU's kernels: tiny random-weight models (fp32 for exact
comparisons, bf16 for the dtype users run) against transformers' own path. Runs only where a CUDA
device and transformers exist; the CPU twins are in tests/integrations."""

from __future__ import annotations

import pytest
import torch

from _hf_models import greedy, teacher_forced, tiny_llama, tiny_qwen3_next

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
transformers = pytest.importorskip("transformers")

DEV = "cuda"


@pytest.fixture(scope="module")
def tat():
    from torch_aura.integrations import transformers as tat

    return tat


def _ids(B, T, seed):
    return torch.randint(1, 128, (B, T), generator=torch.Generator().manual_seed(seed)).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_llama_aura_attention_matches_sdpa(tat, dtype):
    model = tiny_llama(transformers, device=DEV, dtype=dtype)
    ids = _ids(2, 33, 1)
    ref = greedy(model, ids)
    tat.enable(model)
    try:
        out = greedy(model, ids)
    finally:
        tat.disable(model)
    dl = max((a.float() - b.float()).abs().max().item() for a, b in zip(out.logits, ref.logits))
    if dtype == torch.float32:
        assert torch.equal(out.sequences, ref.sequences) and dl <= 1e-3
    else:
        assert (out.sequences == ref.sequences).float().mean().item() >= 0.9 and dl <= 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_qwen3_next_our_gdn_matches_transformers(tat, dtype):
    model = tiny_qwen3_next(transformers, device=DEV, dtype=dtype, head_dims=(64, 64))
    ids = _ids(2, 150, 2)
    mask = torch.ones_like(ids)
    mask[1, :40] = 0
    ref = greedy(model, ids, mask)
    tat.enable(model)
    try:
        out = greedy(model, ids, mask)
    finally:
        tat.disable(model)
    dl = max((a.float() - b.float()).abs().max().item() for a, b in zip(out.logits, ref.logits))
    scale = max(a.float().abs().max().item() for a in ref.logits)
    if dtype == torch.float32:
        assert torch.equal(out.sequences, ref.sequences) and dl <= 1e-3 * scale
    else:
        assert (out.sequences == ref.sequences).float().mean().item() >= 0.9 and dl <= 0.05 * scale


@pytest.mark.parametrize("scheme,min_agree", [("aura8", 0.98), ("aura4v2", 0.7)])
def test_aura_kv_cache_on_gpu(tat, scheme, min_agree):
    model = tiny_qwen3_next(transformers, device=DEV, dtype=torch.bfloat16, head_dims=(64, 64))
    ids, steps = _ids(2, 300, 3), _ids(2, 40, 4)
    mask = torch.ones_like(ids)
    mask[0, :100] = 0
    dense = teacher_forced(model, ids, mask, transformers.DynamicCache(config=model.config), steps)
    tat.enable(model)
    try:
        cache = tat.AuraKVCache(model.config, scheme=scheme)
        ours = teacher_forced(model, ids, mask, cache, steps)
        alone = teacher_forced(model, ids[:1, 100:], None, tat.AuraKVCache(model.config, scheme=scheme), steps[:1])
    finally:
        tat.disable(model)
    assert cache.layers[3].aura.seq_lens.tolist() == [240, 340]
    agree = (dense.argmax(-1) == ours.argmax(-1)).float().mean().item()
    assert agree >= min_agree, agree
    assert (ours[0].float() - alone[0].float()).abs().max().item() <= 0.05 * ours.float().abs().max().item()


def test_compiled_aura_kv_cache_decode_is_a_cuda_graph(tat, caplog):
    """issue 39: AuraKVCache(max_cache_len) under torch.compile(mode="reduce-overhead"): the decode
    step is captured (inductor logs no "skipping cudagraphs") and its replays equal eager steps."""
    import logging

    model = tiny_llama(transformers, device=DEV, dtype=torch.bfloat16)
    tat.enable(model)
    try:
        torch._dynamo.reset()
        ids, feed = _ids(2, 10, 2), _ids(2, 12, 3)
        eager_cache, compiled_cache = (tat.AuraKVCache(model, scheme="aura8", max_cache_len=64) for _ in range(2))
        step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        with torch.inference_mode(), caplog.at_level(logging.DEBUG, logger="torch._inductor"):
            for cache in (eager_cache, compiled_cache):
                model(ids, cache=cache, use_cache=True)
            for s in range(feed.shape[1]):
                eager = model(feed[:, s:s + 1], cache=eager_cache, use_cache=True).logits
                compiled = step(feed[:, s:s + 1], cache=compiled_cache, use_cache=True).logits.clone()
                torch.testing.assert_close(compiled.float(), eager.float(), rtol=2e-2, atol=2e-2)
        assert "skipping cudagraphs" not in caplog.text, caplog.text[-2000:]
    finally:
        tat.disable(model)
