"""``AuraKVCache`` inside real (tiny, random-weight) transformers models: the compressed-domain
attention equals SDPA over the dequantized cache, aura8 keeps the dense model's argmax, padded
batches equal their rows run alone, crop, reset, growth and ``max_cache_len`` work, the memory is
reported, and a hybrid Qwen3-Next runs our GDN kernels beside the compressed attention layers.
(Refusals: test_transformers_cache_checks.py; generate modes: test_transformers_cache_generate.py.)"""

import pytest
import torch

import torch_aura
from _hf_models import teacher_forced, tiny_llama, tiny_qwen3_next


def test_compressed_decode_equals_sdpa_over_the_dequantized_cache(hf_transformers, tat):
    from torch_aura.integrations.transformers.cache import AuraKVLayer

    torch.manual_seed(3)
    B, Hq, Hkv, D, P = 2, 6, 2, 64, 37
    layer = AuraKVLayer("aura4v2", layer_idx=1)
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups = True, Hq // Hkv
    k, v, q = torch.randn(B, Hkv, P, D), torch.randn(B, Hkv, P, D), torch.randn(B, Hq, P, D)
    layer.attend(module, q, *layer.update(k, v, kwargs={}), None, D ** -0.5, 0.0, {})
    for _ in range(3):
        k1, v1, q1 = torch.randn(B, Hkv, 1, D), torch.randn(B, Hkv, 1, D), torch.randn(B, Hq, 1, D)
        kw = {}
        k1, v1 = layer.update(k1, v1, kwargs=kw)
        assert kw["aura_kv_layer"] is layer
        out = layer.attend(module, q1, k1, v1, None, D ** -0.5, 0.0, {})
    a = layer.aura
    T = a.seq_lens[0].item()
    assert a.seq_lens.tolist() == [P + 3] * B
    kd = torch_aura.aura_dequantize(a.k_codes[:, :, :T], a.k_norms[:, :, :T], a.k_codebook, a.key_bits, a.k_sign_mask)
    vd = torch_aura.aura_dequantize(a.v_codes[:, :, :T], a.v_norms[:, :, :T], a.v_codebook, a.value_bits, a.v_sign_mask)
    ref = torch.nn.functional.scaled_dot_product_attention(q1, kd, vd, enable_gqa=True)
    assert out.shape == (B, 1, Hq, D)
    assert (out - ref.transpose(1, 2)).abs().max().item() <= 1e-5


def test_aura8_keeps_the_dense_argmax(hf_transformers, tat, llama):
    g = torch.Generator().manual_seed(5)
    ids, steps = torch.randint(1, 128, (2, 24), generator=g), torch.randint(1, 128, (2, 40), generator=g)
    dense = teacher_forced(llama, ids, None, hf_transformers.DynamicCache(config=llama.config), steps)
    aura = teacher_forced(llama, ids, None, tat.AuraKVCache(llama.config, scheme="aura8"), steps)
    agree = (dense.argmax(-1) == aura.argmax(-1)).float().mean().item()
    assert agree >= 0.98, agree
    assert (dense - aura).abs().max().item() < 0.05 * dense.abs().max().item()


def test_left_padded_batch_equals_each_row_alone(hf_transformers, tat, llama):
    g = torch.Generator().manual_seed(6)
    lens = [13, 6, 1]
    ids = torch.zeros(3, max(lens), dtype=torch.long)
    mask = torch.zeros_like(ids)
    rows = []
    for b, n in enumerate(lens):
        rows.append(torch.randint(1, 128, (1, n), generator=g))
        ids[b, -n:], mask[b, -n:] = rows[b], 1
    steps = torch.randint(1, 128, (3, 9), generator=g)
    batch = teacher_forced(llama, ids, mask, tat.AuraKVCache(llama.config, scheme="aura4v2"), steps)
    for b in range(3):
        alone = teacher_forced(llama, rows[b], None, tat.AuraKVCache(llama.config, scheme="aura4v2"), steps[b:b + 1])
        assert (batch[b] - alone[0]).abs().max().item() <= 1e-4, b


def test_max_cache_len_allocates_once_and_is_a_hard_limit(hf_transformers, tat, llama):
    ids = torch.randint(1, 128, (2, 10), generator=torch.Generator().manual_seed(7))
    cache = tat.AuraKVCache(llama.config, scheme="aura8", max_cache_len=48)
    assert llama.generate(ids, max_new_tokens=30, do_sample=False, pad_token_id=0, cache=cache).shape == (2, 40)
    assert cache.layers[0].aura.capacity == 48 and cache.get_max_length() == 48
    held = cache.get_seq_length()
    with pytest.raises(ValueError, match=r"max_cache_len=48 tokens per row, this step needs 49"):
        with torch.no_grad():
            llama(torch.randint(1, 128, (2, 10)), cache=cache, use_cache=True)
    assert cache.get_seq_length() == held  # refused before anything was written


def test_memory_is_reported_and_4_5x_smaller_than_bf16_for_aura4v2(hf_transformers, tat):
    model = tiny_llama(hf_transformers, head_dim=128, hidden=192)
    tat.enable(model)
    try:
        cache = tat.AuraKVCache(model.config, scheme="aura4v2")
        model(torch.randint(1, 128, (2, 50)), cache=cache, use_cache=True)
        assert cache.memory_bytes() > 0
        assert cache.dense_bytes(torch.bfloat16) / cache.memory_bytes() >= 4.5
    finally:
        tat.disable(model)


def test_crop_reset_and_growth(hf_transformers, tat, llama):
    g = torch.Generator().manual_seed(8)
    ids, steps = torch.randint(1, 128, (2, 300), generator=g), torch.randint(1, 128, (2, 6), generator=g)
    cache = tat.AuraKVCache(llama.config, scheme="aura4v2")
    first = teacher_forced(llama, ids, None, cache, steps)
    layer = cache.layers[0]
    assert cache.get_seq_length() == 306 and layer.aura.capacity >= 306
    cache.crop(-4)
    assert cache.get_seq_length() == 302
    with torch.no_grad():
        again = [llama(steps[:, s:s + 1], cache=cache, use_cache=True).logits[:, -1] for s in range(2, 6)]
    assert (torch.stack(again, 1) - first[:, 3:]).abs().max().item() <= 1e-5
    cache.reset()
    assert cache.get_seq_length() == 0
    assert (teacher_forced(llama, ids, None, cache, steps) - first).abs().max().item() <= 1e-5


def test_hybrid_qwen3_next_runs_our_gdn_beside_the_compressed_cache(hf_transformers, tat, monkeypatch,
                                                                   transformers_torch_gdn):
    from torch_aura.integrations.transformers import gdn

    model = tiny_qwen3_next(hf_transformers)
    g = torch.Generator().manual_seed(9)
    ids, steps = torch.randint(1, 128, (2, 20), generator=g), torch.randint(1, 128, (2, 20), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    dense = teacher_forced(model, ids, mask, hf_transformers.DynamicCache(config=model.config), steps)
    calls = {"chunk": 0, "recurrent": 0}
    for kind, name in (("chunk", "gdn_chunk"), ("recurrent", "_recurrent_op")):
        real = getattr(gdn, name)

        def counting(*a, _real=real, _kind=kind, **k):
            calls[_kind] += 1
            return _real(*a, **k)

        monkeypatch.setattr(gdn, name, counting)
    tat.enable(model)
    try:
        cache = tat.AuraKVCache(model.config, scheme="aura8")
        ours = teacher_forced(model, ids, mask, cache, steps)
    finally:
        tat.disable(model)
    assert calls == {"chunk": 3, "recurrent": 3 * 20}  # 3 GDN layers: one prefill, 20 decode steps
    assert isinstance(cache.layers[3], tat.AuraKVLayer) and cache.layers[3].aura.seq_lens.tolist() == [40, 33]
    agree = (dense.argmax(-1) == ours.argmax(-1)).float().mean().item()
    assert agree >= 0.98, agree
