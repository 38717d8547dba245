"""A compiled decode step over ``AuraKVCache(max_cache_len=...)`` traces once and equals eager (issue 39).

The cache's static layers keep every per-step value on the device (the length tensor, ``seq_lens``,
the codes and norms, all marked as static addresses) and hand transformers one mask shape, so
``torch.compile(model.forward, fullgraph=True)`` over 20 decode steps compiles one graph, as
transformers' own ``StaticCache`` does on the same model (three for a model with sliding layers,
whose static window layers retrace as the window fills: theirs, not ours); no graph break, and
every step's logits equal eager's. The backend is ``aot_eager``: the dynamo trace and the
functionalised in-place updates are what is under test, not inductor's CPU code generation; the
GPU suite (tests/cuda/test_transformers_cuda.py) captures the same step in a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch
from _hf_models import tiny_llama, tiny_qwen2_sliding, tiny_qwen3_next


@pytest.fixture(scope="module")
def tat(hf_transformers):
    from torch_aura.integrations import transformers as tat

    return tat


BUILDERS = {"llama": tiny_llama, "qwen3_next": tiny_qwen3_next, "qwen2-sliding": tiny_qwen2_sliding}


def _compiled_decode(model, cache, steps: int = 20):
    """Eager prefill then ``steps`` compiled decode steps (the same inputs through an eager twin of
    ``cache``): returns (graphs compiled, graph breaks, the cache)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(39)
    ids, feed = torch.randint(1, 128, (2, 10), generator=g), torch.randint(1, 128, (2, steps), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # one left-padded row
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    # one 2-D mask shape for every step, as static caches' masks span max_cache_len (a growing mask
    # would be a new input shape each step)
    static_mask = torch.zeros(2, 64, dtype=mask.dtype)
    static_mask[:, :ids.shape[1]] = mask
    eager_cache, compiled_cache = cache(), cache()
    counter = CompileCounterWithBackend("aot_eager")
    counters.clear()
    step = torch.compile(model.forward, backend=counter, fullgraph=True)
    with torch.inference_mode():
        for c in (eager_cache, compiled_cache):  # the prefill runs eagerly, as generate's does
            model(ids, attention_mask=mask, position_ids=positions, cache=c, use_cache=True)
        for s in range(steps):
            static_mask[:, ids.shape[1] + s] = 1
            positions = positions[:, -1:] + 1
            kw = dict(attention_mask=static_mask, position_ids=positions, use_cache=True)
            eager = model(feed[:, s:s + 1], cache=eager_cache, **kw).logits
            compiled = step(feed[:, s:s + 1], cache=compiled_cache, **kw).logits
            # the traced SDPA of a dense layer may sum in another order: fp32 rounding only
            torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5, msg=f"step {s}")
    return counter.frame_count, dict(counters["graph_break"]), compiled_cache


# graphs transformers' own StaticCache compiles for the same 20 steps: one, or three where its
# sliding-window layers branch on a host length before and after the window fills
@pytest.mark.parametrize("family,graphs", [("llama", 1), ("qwen3_next", 1), ("qwen2-sliding", 3)])
def test_compiled_decode_traces_as_static_cache_does_and_equals_eager(hf_transformers, tat, family, graphs,
                                                                    transformers_torch_gdn):
    model = BUILDERS[family](hf_transformers)
    tat.enable(model)
    try:
        frames, breaks, cache = _compiled_decode(model, lambda: tat.AuraKVCache(model, scheme="aura8", max_cache_len=64))
        assert cache.is_compileable and int(cache.get_seq_length()) == 30
        theirs, their_breaks, _ = _compiled_decode(
            model, lambda: hf_transformers.StaticCache(config=model.config, max_cache_len=64))
    finally:
        tat.disable(model)
    assert not breaks and not their_breaks, (breaks, their_breaks)
    assert frames == theirs == graphs, f"AuraKVCache: {frames} graphs, StaticCache: {theirs} (expected {graphs})"


def test_static_cache_reset_crop_and_length_tensor(hf_transformers, tat):
    """A static layer's length is a device tensor advanced in place (its address never changes);
    crop and reset move it, and an eager step past max_cache_len is refused before it writes."""
    model = tiny_llama(hf_transformers)
    tat.enable(model)
    try:
        cache = tat.AuraKVCache(model, scheme="aura8", max_cache_len=16)
        ids = torch.randint(1, 128, (1, 12), generator=torch.Generator().manual_seed(1))
        with torch.inference_mode():
            model(ids, cache=cache, use_cache=True)
            layer = cache.aura_layers[0]
            length = layer.cumulative_length
            assert isinstance(length, torch.Tensor) and int(length) == 12
            cache.crop(-2)
            assert layer.cumulative_length is length and int(length) == 10 and layer.aura.seq_lens.tolist() == [10]
            model(ids[:, :1], cache=cache, use_cache=True)
            with pytest.raises(ValueError, match="max_cache_len=16"):
                model(ids[:, :6], cache=cache, use_cache=True)
            cache.reset()
            assert layer.cumulative_length is length and int(length) == 0
            model(ids, cache=cache, use_cache=True)
            assert int(cache.get_seq_length()) == 12
    finally:
        tat.disable(model)
