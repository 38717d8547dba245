"""Speculative decoding over the compressed cache (issue 43, deliverable 4): transformers' assisted
generation (``assistant_model=``, real transformers, tiny random-weight models built from config)
with ``AuraKVCache(exact_prefill=False)`` returns exactly the tokens of plain greedy generation with
the same cache: drafts are verified by a multi-token step over the compressed cache and the rejected
ones cropped, the compressed part and the exact window rolling back exactly. With per-head and
per-layer schemes too.
"""

import pytest
import torch

from _hf_models import tiny_llama


def _ids(B, P, seed):
    return torch.randint(1, 128, (B, P), generator=torch.Generator().manual_seed(seed))


def _generate(model, ids, cache, new, attention_mask=None, **kwargs):
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask
    return model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                          do_sample=False, pad_token_id=0, cache=cache, **kwargs)


CASES = {
    "aura4v2": dict(scheme="aura4v2"),
    "aura2-window": dict(scheme="aura2", sink_tokens=2, recent_tokens=5),
    "per-layer-per-head": dict(scheme=[["aura8v4", "aura2"], "aura3v4"], sink_tokens=1, recent_tokens=3),
    "auto": dict(scheme="auto", bits_per_coordinate=4.5),
}


@pytest.mark.parametrize("case", list(CASES))
def test_assisted_generation_equals_greedy_on_the_same_cache(hf_transformers, tat, llama, case):
    assistant = tiny_llama(hf_transformers, layers=1, hidden=96)
    kwargs = CASES[case]
    for seed in range(3):
        ids = _ids(1, 9 + seed, seed)
        greedy = _generate(llama, ids, tat.AuraKVCache(llama.config, exact_prefill=False, **kwargs), new=24)
        cache = tat.AuraKVCache(llama.config, exact_prefill=False, **kwargs)
        assisted = _generate(llama, ids, cache, new=24, assistant_model=assistant)
        assert torch.equal(assisted, greedy), (case, seed)
        assert cache.get_seq_length() == assisted.shape[1] - 1
        assert all(layer.aura.seq_lens.tolist() == [assisted.shape[1] - 1] for layer in cache.aura_layers)
    if kwargs.get("recent_tokens"):  # the drafts really were cropped, and the ring kept slots to restore them
        assert all(layer.aura.rollback_tokens > 0 for layer in cache.aura_layers)
    if case == "auto":
        assert all(s is not None and len(s) == 2 for s in cache.schemes)


def test_the_compressed_prefill_is_lossy_so_the_equality_is_not_vacuous(hf_transformers, tat, llama):
    """The compressed prefill differs from the exact one, and the cheap cache from the dense model."""
    ids = _ids(1, 12, 7)
    exact = llama(ids, cache=tat.AuraKVCache(llama.config, scheme="aura2"), use_cache=True).logits
    compressed = llama(ids, cache=tat.AuraKVCache(llama.config, scheme="aura2", exact_prefill=False),
                       use_cache=True).logits
    dense = llama(ids, use_cache=False).logits
    assert (exact - dense).abs().max().item() < 1e-4
    assert (compressed - dense).abs().max().item() > 1e-3


def test_crop_of_a_verified_chunk_restores_the_window_exactly(hf_transformers, tat, llama):
    """A chunk of drafts appended then cropped (as assisted generation does) leaves the next step's
    logits equal to those of a cache that only ever saw the accepted tokens."""
    ids, drafts, nxt = _ids(1, 14, 8), _ids(1, 6, 9), _ids(1, 1, 10)
    kw = dict(scheme="aura2", sink_tokens=2, recent_tokens=4, exact_prefill=False)
    with torch.no_grad():
        rolled = tat.AuraKVCache(llama.config, **kw)
        rolled.activate_past_recording()
        llama(ids, cache=rolled, use_cache=True)
        llama(drafts, cache=rolled, use_cache=True)
        rolled.crop(-4)  # two of six accepted
        straight = tat.AuraKVCache(llama.config, **kw)
        llama(ids, cache=straight, use_cache=True)
        llama(drafts[:, :2], cache=straight, use_cache=True)
        a = llama(nxt, cache=rolled, use_cache=True).logits
        b = llama(nxt, cache=straight, use_cache=True).logits
    assert (a - b).abs().max().item() < 1e-5


@pytest.mark.parametrize("window", [(0, 0), (2, 4)])
def test_compressed_prefill_of_a_left_padded_batch_equals_each_row_alone(hf_transformers, tat, llama, window):
    S, W = window
    kw = dict(scheme="aura4v2", sink_tokens=S, recent_tokens=W, exact_prefill=False)
    long, short = _ids(1, 11, 11), _ids(1, 7, 12)
    ids = torch.cat([long, torch.cat([torch.zeros(1, 4, dtype=torch.long), short], 1)])
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    batch = _generate(llama, ids, tat.AuraKVCache(llama.config, **kw), new=8, attention_mask=mask)
    alone = _generate(llama, short, tat.AuraKVCache(llama.config, **kw), new=8)
    assert torch.equal(batch[1, 11:], alone[0, 7:])


def test_a_long_chunk_over_a_window_takes_one_launch_not_a_step_per_token(hf_transformers, tat, llama):
    """Past ``_STEPWISE_MAX`` tokens (a compressed prefill, a new chat turn) a chunk over an exact window
    is attended in one causal decode with the chunk's final window: one decode call per layer, not one
    per token; a short chunk (draft verification) still takes one step per token."""
    from torch_aura.integrations.transformers import cache as tcache

    L = tcache._STEPWISE_MAX + 7
    ids = _ids(1, L, 13)
    cache = tat.AuraKVCache(llama.config, scheme="aura4v2", sink_tokens=2, recent_tokens=8, exact_prefill=False)
    calls = []
    with torch.no_grad():
        llama(ids[:, :4], cache=cache, use_cache=True)  # the layers exist from here on
        for layer in cache.aura_layers:
            decode = layer.aura.decode
            layer.aura.decode = lambda *a, _d=decode, **k: (calls.append(1), _d(*a, **k))[1]
        llama(ids[:, 4:], cache=cache, use_cache=True)
    assert len(calls) == len(cache.aura_layers), calls
    short = tat.AuraKVCache(llama.config, scheme="aura4v2", sink_tokens=2, recent_tokens=8, exact_prefill=False)
    with torch.no_grad():  # a short chunk still goes one step per token (draft verification)
        llama(ids[:, :4], cache=short, use_cache=True)
        calls.clear()
        for layer in short.aura_layers:
            decode = layer.aura.decode
            layer.aura.decode = lambda *a, _d=decode, **k: (calls.append(1), _d(*a, **k))[1]
        llama(ids[:, 4:9], cache=short, use_cache=True)
    assert len(calls) == 5 * len(short.aura_layers)
