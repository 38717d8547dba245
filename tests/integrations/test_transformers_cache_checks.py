"""What ``AuraKVCache`` refuses, on real (tiny, random-weight) transformers models: bad arguments and
models it cannot hold at construction, by name; a model that uses it wrongly (not on ``"aura"``,
another layer layout, K/V changed before attention, right padding) at the step that would go wrong,
before anything is produced from it. Sliding windows: honoured per layer, or refused by name."""

import pytest
import torch
from _hf_models import teacher_forced, tiny_llama, tiny_qwen2_sliding
from _hf_zoo import build


def _ids(*shape, seed=0):
    return torch.randint(1, 128, shape, generator=torch.Generator().manual_seed(seed))


def _agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.argmax(-1) == b.argmax(-1)).float().mean().item()


# ---------------------------------------------------------------------------- construction
@pytest.mark.parametrize("kwargs, match", [
    ({"scheme": "aura5"}, r"scheme: expected 'aura\{kb\}v\{vb\}'.*got 'aura5'"),
    ({"max_cache_len": 0}, r"max_cache_len must be an int >= 1 or None, got 0"),
    ({"max_cache_len": -5}, r"max_cache_len must be an int >= 1 or None, got -5"),
    ({"max_cache_len": 16.0}, r"max_cache_len must be an int >= 1 or None, got 16\.0"),
    ({"max_cache_len": True}, r"max_cache_len must be an int >= 1 or None, got True"),
    ({"seed": -1}, r"seed must be an int in \[0, 18446744073709551616\), got -1"),
    ({"seed": 2 ** 64}, r"seed must be an int in \[0, 18446744073709551616\)"),
    ({"seed": "0"}, r"seed must be an int.*got '0'"),
], ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_bad_arguments_are_named(hf_transformers, tat, kwargs, match):
    with pytest.raises(ValueError, match=match):
        tat.AuraKVCache(tiny_llama(hf_transformers).config, **kwargs)


def test_a_config_that_is_not_a_transformers_config_is_named(tat):
    with pytest.raises(ValueError, match=r"config must be a transformers PretrainedConfig.*got dict"):
        tat.AuraKVCache({"num_hidden_layers": 2})


@pytest.mark.parametrize("family, match", [
    ("gemma2", r"soft-capping \(attn_logit_softcapping=50\.0\)"),
    ("deepseek_v3", r"multi-head latent attention \(kv_lora_rank=32"),
    ("gemma3n_text", r"KV sharing across layers"),
    ("falcon_h1", r"layer types \['hybrid'\]: AuraKVCache holds"),
    ("mamba", r"no attention layer to compress"),
])
def test_models_it_cannot_hold_are_refused_by_name(tat, family, match):
    with pytest.raises(ValueError, match=match) as e:
        tat.AuraKVCache(build(family).config)
    assert "use transformers' DynamicCache instead" in str(e.value)


def test_given_the_model_it_refuses_what_enable_refuses_at_construction(tat):
    model = build("gpt_oss")  # learned attention sinks: no config field says so, its attention code does
    with pytest.raises(ValueError, match=r"attention sinks \(GptOssAttention passes s_aux=.*use transformers' "
                                         r"DynamicCache instead"):
        tat.AuraKVCache(model)
    cache = tat.AuraKVCache(model.config)  # from the config alone: refused when the model runs
    with torch.no_grad():
        model(_ids(1, 5), cache=cache, use_cache=True)
        with pytest.raises(ValueError, match="never attended by attn_implementation='aura'"):
            model(_ids(1, 1), cache=cache, use_cache=True)


def test_an_unsupported_head_dim_is_named(hf_transformers, tat):
    with pytest.raises(ValueError, match=r"head_dim 96: AURA .*supports \[64, 128, 256, 512\]"):
        tat.AuraKVCache(tiny_llama(hf_transformers, head_dim=96, hidden=192).config)


# --------------------------------------------------------------------------- sliding windows
def test_a_model_whose_every_layer_slides_is_refused_unless_no_row_can_leave_the_window(hf_transformers, tat):
    """Mistral-style: sliding_window without layer_types. Every layer used to attend every token."""
    model = build("mistral")  # window 16, both layers slide
    with pytest.raises(ValueError, match=r"every attention layer slides \(layers \[0, 1\], window 16\).*"
                                         r"max_cache_len <= 16.*DynamicCache"):
        tat.AuraKVCache(model.config)
    tat.enable(model)
    try:
        cache = tat.AuraKVCache(model.config, scheme="aura8", max_cache_len=16)
        assert [s.kind for s in cache.layout] == ["aura", "aura"]
        ids, steps = _ids(3, 8), _ids(3, 8, seed=1)  # 16 tokens: the window, never more
        dense = teacher_forced(model, ids, None, hf_transformers.DynamicCache(config=model.config), steps)
        assert _agreement(teacher_forced(model, ids, None, cache, steps), dense) >= 0.95
        with pytest.raises(ValueError, match="max_cache_len=16 tokens per row, this step needs 17"):
            with torch.no_grad():
                model(steps[:, :1], cache=cache, use_cache=True)
    finally:
        tat.disable(model)


@pytest.mark.parametrize("family", ["gemma3_text", "qwen2-max-window-layers"])
def test_sliding_layers_keep_their_dense_window_beside_compressed_full_layers(hf_transformers, tat, family):
    from transformers.cache_utils import DynamicSlidingWindowLayer

    if family == "qwen2-max-window-layers":
        model = tiny_qwen2_sliding(hf_transformers)
    else:
        model = build(family)  # 5 sliding layers of window 16, then one full layer
    tat.enable(model)
    try:
        cache = tat.AuraKVCache(model.config, scheme="aura8")
        kinds = [s.kind for s in cache.layout]
        assert "aura" in kinds and "window" in kinds
        for spec, layer in zip(cache.layout, cache.layers):
            assert isinstance(layer, DynamicSlidingWindowLayer if spec.kind == "window" else tat.AuraKVLayer)
        ids, steps = _ids(3, 20), _ids(3, 20, seed=1)  # 40 tokens: far past the window
        dense = teacher_forced(model, ids, None, hf_transformers.DynamicCache(config=model.config), steps)
        assert _agreement(teacher_forced(model, ids, None, cache, steps), dense) >= 0.95
        window = next(layer for layer in cache.layers if isinstance(layer, DynamicSlidingWindowLayer))
        assert window.keys.shape[2] == 15  # transformers keeps window - 1 tokens between steps
    finally:
        tat.disable(model)


# -------------------------------------------------------------------- the model that uses it
def test_a_model_not_on_aura_is_refused_before_its_first_decode_output(hf_transformers, tat, llama):
    """The cache is built from an enabled model's config (which says "aura") but used by a model on
    SDPA, which would attend the new token alone (logits off by ~5): the model decides, not the config."""
    model = tiny_llama(hf_transformers)
    ids = _ids(2, 9)
    cache = tat.AuraKVCache(llama.config)
    with torch.no_grad():
        prefill = model(ids, cache=cache, use_cache=True).logits  # SDPA over the whole prompt: exact
        dense = model(ids, cache=hf_transformers.DynamicCache(config=model.config), use_cache=True).logits
        assert (prefill - dense).abs().max().item() <= 1e-5
        with pytest.raises(ValueError, match=r"AuraKVCache layer 0: the K/V of the previous step were never "
                                             r"attended by attn_implementation='aura'.*enable\(model\)"):
            model(ids[:, :1], cache=cache, use_cache=True)


def test_a_model_that_leaves_aura_mid_generation_is_refused_at_its_next_step(hf_transformers, tat):
    model = tiny_llama(hf_transformers)
    tat.enable(model)
    cache = tat.AuraKVCache(model.config, scheme="aura8")
    with torch.no_grad():
        model(_ids(2, 9), cache=cache, use_cache=True)
        tat.disable(model)
        with pytest.raises(ValueError, match=r"now runs attn_implementation='sdpa'"):
            model(_ids(2, 1), cache=cache, use_cache=True)
    assert cache.get_seq_length() == 9


def test_a_cache_built_for_another_layout_is_refused(hf_transformers, tat):
    shallow, deep = tiny_llama(hf_transformers, layers=2), tiny_llama(hf_transformers, layers=3)
    for model, other in ((deep, shallow), (shallow, deep)):
        tat.enable(model)
        try:
            cache = tat.AuraKVCache(other.config)
            with pytest.raises(ValueError, match=r"AuraKVCache was built for \d layers .*the model calling it has "
                                                 r"\d layers.*AuraKVCache\(model.config\)"):
                with torch.no_grad():
                    model(_ids(1, 5), cache=cache, use_cache=True)
            assert cache.get_seq_length() == 0  # refused at the first layer, before it stored anything
        finally:
            tat.disable(model)


def test_a_model_that_changes_k_v_before_attention_is_refused(tat):
    """DiffLlama splits V after cache.update and attends twice: the compressed cache would misread it."""
    model = build("diffllama")
    tat.enable(model)
    try:
        with pytest.raises(ValueError, match=r"DiffLlamaAttention changes K/V between cache.update and attention"):
            with torch.no_grad():
                model(_ids(1, 5), cache=tat.AuraKVCache(model.config), use_cache=True)
    finally:
        tat.disable(model)


def test_a_right_padded_prefill_is_refused(hf_transformers, tat, llama):
    ids = _ids(2, 8)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # right padding: the compact rows would store the pads
    cache = tat.AuraKVCache(llama.config)
    with pytest.raises(ValueError, match=r"not left padding.*padding_side='left'"):
        with torch.no_grad():
            llama(ids, attention_mask=mask, cache=cache, use_cache=True)
    assert cache.get_seq_length() == 0


def test_batch_size_change_without_reset_is_named(hf_transformers, tat, llama):
    cache = tat.AuraKVCache(llama.config, scheme="aura8")
    with torch.no_grad():
        llama(_ids(2, 6), cache=cache, use_cache=True)
        with pytest.raises(ValueError, match=r"holds 2 rows of 2 KV heads x 64.*this step has 3 x 2 x 64.*reset\(\)"):
            llama(_ids(3, 1), cache=cache, use_cache=True)
    assert cache.get_seq_length() == 6 and cache.batch_size == 2
