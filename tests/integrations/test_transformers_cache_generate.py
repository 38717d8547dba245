"""``AuraKVCache`` through transformers' ``generate`` modes, each against ``DynamicCache`` doing the
same: ``reset()`` then a new batch size, one cache reused by several ``generate`` calls, ``crop``,
beam search (``reorder_cache``), assisted generation with a draft model and with prompt lookup.

Two checks per mode: the dense ``"aura"`` path (``enable()`` + ``DynamicCache``) gives exactly the
model's own tokens, and ``AuraKVCache("aura8")`` gives a greedy path of the dense model: each token
it generates is the dense model's argmax given the tokens before it, up to the rare near-tie (tiny
random models have logit margins of ~0.05, aura8 moves logits by ~0.003). Comparing whole free
running outputs instead would count every token after one such flip; ~40 tokens per check, at
least 90% of them the dense choice.
"""

import pytest
import torch
from _hf_models import tiny_llama


@pytest.fixture
def model(hf_transformers, tat):
    """A tiny Llama on its own SDPA path (each test enables it where it compares)."""
    model = tiny_llama(hf_transformers)
    yield model
    tat.disable(model)


def _ids(*shape, seed=0):
    return torch.randint(1, 128, shape, generator=torch.Generator().manual_seed(seed))


def _generate(model, ids, cache=None, new=12, **kwargs):
    return model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                          cache=cache, **kwargs)


@torch.no_grad()
def _greedy_agreement(model, out: torch.Tensor, prompt: int) -> float:
    """Fraction of ``out[:, prompt:]`` that is the dense model's argmax given the tokens before it
    (one forward over the whole sequence, no cache: exact)."""
    choice = model(out).logits[:, prompt - 1:-1].argmax(-1)
    return (choice == out[:, prompt:]).float().mean().item()


@torch.no_grad()
def _log_prob(model, out: torch.Tensor, prompt: int) -> torch.Tensor:
    """``[B]`` dense log-probability of each row's generated tokens."""
    logp = model(out).logits[:, prompt - 1:-1].log_softmax(-1)
    return logp.gather(-1, out[:, prompt:, None])[..., 0].sum(-1)


def _rows(tat, cache) -> int:
    return cache.batch_size if isinstance(cache, tat.AuraKVCache) else cache.layers[0].keys.shape[0]


def _dense_and_aura(hf_transformers, tat, model, run):
    """``run(cache_factory)`` with the own path, the dense "aura" path and AuraKVCache aura8:
    returns (own, dense aura, compressed) outputs."""
    own = run(lambda: hf_transformers.DynamicCache(config=model.config))
    tat.enable(model)
    try:
        dense = run(lambda: hf_transformers.DynamicCache(config=model.config))
        compressed = run(lambda: tat.AuraKVCache(model.config, scheme="aura8"))
    finally:
        tat.disable(model)
    # the dense "aura" path is exact in every mode
    assert all(torch.equal(a, b) for a, b in zip(torch.utils._pytree.tree_leaves(dense),
                                                 torch.utils._pytree.tree_leaves(own)))
    return own, compressed


def test_reset_then_a_new_batch_size(hf_transformers, tat, model):
    """DynamicCache allows it; the compressed cache reallocates for the new rows."""
    def run(make):
        cache = make()
        first = _generate(model, _ids(2, 7), cache)
        cache.reset()
        assert cache.get_seq_length() == 0
        second = _generate(model, _ids(3, 5, seed=1), cache)
        assert _rows(tat, cache) == 3
        return first, second

    _, (first, second) = _dense_and_aura(hf_transformers, tat, model, run)
    assert _greedy_agreement(model, first, 7) >= 0.9 and _greedy_agreement(model, second, 5) >= 0.9
    # after reset the cache is as good as new: the same tokens as a fresh one
    tat.enable(model)
    cache = tat.AuraKVCache(model.config, scheme="aura8")
    _generate(model, _ids(2, 7), cache)
    cache.reset()
    assert torch.equal(_generate(model, _ids(3, 5, seed=1), cache),
                       _generate(model, _ids(3, 5, seed=1), tat.AuraKVCache(model.config, scheme="aura8")))


def test_one_cache_reused_by_several_generate_calls(hf_transformers, tat, model):
    """The second call continues from the cache: its prompt is the first call's output plus new
    tokens, of which only the uncached ones run (a multi-token step on a filled cache)."""
    def run(make):
        cache = make()
        first = _generate(model, _ids(4, 7), cache, new=10)
        prompt = torch.cat([first, _ids(4, 4, seed=2)], 1)
        # the mask says every token is real: generate would otherwise mask any generated pad id (0)
        second = _generate(model, prompt, cache, new=10, attention_mask=torch.ones_like(prompt))
        assert cache.get_seq_length() == second.shape[1] - 1
        return first, second

    _, (first, second) = _dense_and_aura(hf_transformers, tat, model, run)
    assert _greedy_agreement(model, first, 7) >= 0.9
    assert _greedy_agreement(model, second, first.shape[1] + 4) >= 0.9


def test_crop_drops_the_last_tokens_as_dynamic_cache_does(hf_transformers, tat, model):
    def run(make):
        cache = make()
        with torch.no_grad():
            model(_ids(2, 10), cache=cache, use_cache=True)
            cache.crop(-3)
            assert cache.get_seq_length() == 7
            return model(_ids(2, 4, seed=3), cache=cache, use_cache=True).logits

    own, compressed = _dense_and_aura(hf_transformers, tat, model, run)
    assert torch.equal(compressed.argmax(-1), own.argmax(-1))
    assert (compressed - own).abs().max().item() < 0.05 * own.abs().max().item()


def test_beam_search_reorders_the_compressed_rows(hf_transformers, tat, model):
    def run(make):
        cache = make()
        out = _generate(model, _ids(2, 10), cache, num_beams=3)
        assert _rows(tat, cache) == 2 * 3  # the cache followed the beams
        return out

    own, compressed = _dense_and_aura(hf_transformers, tat, model, run)
    # beams that lost their rows would score far lower; a near-tie may swap two beams of equal score
    assert (_log_prob(model, compressed, 10) >= _log_prob(model, own, 10) - 0.1).all()


@pytest.mark.parametrize("mode", ["assistant_model", "prompt_lookup_num_tokens"])
def test_assisted_generation_verifies_drafts_on_the_compressed_cache(hf_transformers, tat, model, mode):
    """Drafts are checked by a multi-token step on the filled cache, rejected ones cropped."""
    if mode == "assistant_model":
        kwargs = {"assistant_model": tiny_llama(hf_transformers, layers=1, hidden=96)}
        ids = _ids(1, 9)
    else:  # a prompt that repeats itself, so the n-gram lookup proposes drafts
        kwargs = {"prompt_lookup_num_tokens": 3}
        ids = _ids(1, 6).repeat(1, 3)
    plain = _generate(model, ids, hf_transformers.DynamicCache(config=model.config), new=16)

    def run(make):
        return _generate(model, ids, make(), new=16, **kwargs)

    own, compressed = _dense_and_aura(hf_transformers, tat, model, run)
    assert torch.equal(own, plain)  # assisted greedy decoding is greedy decoding
    assert _greedy_agreement(model, compressed, ids.shape[1]) >= 0.9
