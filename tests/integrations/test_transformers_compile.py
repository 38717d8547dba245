"""Compiled decode steps trace once, break no graph and equal eager (issue 39, deliverable 1).

Two caches under ``attn_implementation="aura"``: ``AuraKVCache(max_cache_len=...)`` (its static
layers keep every per-step value on the device: the length tensor, ``seq_lens``, the codes and
norms, all marked as static addresses) and transformers' own ``StaticCache``, whose one-token steps
"aura" decodes through ``flash_decode`` over each row's visible keys, read from the mask on the
device (not SDPA over the whole capacity). ``torch.compile(model.forward, fullgraph=True)`` over 20
decode steps of a left-padded batch compiles one graph (three for a model with sliding layers,
whose static window layers retrace as the window fills: transformers', not ours), with no graph
break; every step's logits equal eager's, and eager "aura" over a ``StaticCache`` equals the model's
own SDPA path with the mask. ``generate(...)`` with transformers' compile settings
(``compile_config``) does the same. The backend is ``aot_eager``: the dynamo trace and the
functionalised in-place updates are what is under test, not inductor's CPU code generation; the GPU
suite (tests/cuda/test_transformers_cuda.py) captures the same steps in CUDA graphs.
"""

from __future__ import annotations

import pytest
import torch
from _hf_models import static_generate_kwargs, tiny_llama, tiny_qwen2_sliding, tiny_qwen3_next


@pytest.fixture(scope="module")
def tat(hf_transformers):
    from torch_aura.integrations import transformers as tat

    return tat


BUILDERS = {"llama": tiny_llama, "qwen3_next": tiny_qwen3_next, "qwen2-sliding": tiny_qwen2_sliding}


def _recording_backend(graphs: list):
    """aot_eager that keeps each dynamo graph (a plain function: generate deep-copies its compile
    config, and a counter object would be copied with it)."""
    from torch._dynamo.backends.registry import lookup_backend

    def backend(gm, example_inputs):
        graphs.append(gm)
        return lookup_backend("aot_eager")(gm, example_inputs)

    return backend


def _calls(graphs: list, name: str) -> int:
    """Calls of the op or function ``name`` in the graphs (``aura.flash_decode``, ``scaled_dot_product``)."""
    return sum(name in str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function")


def _decode(model, cache, forward, steps: int = 20) -> torch.Tensor:
    """Eager prefill of a left-padded batch, then ``steps`` one-token steps through ``forward``:
    ``[steps, B, vocab]`` logits."""
    g = torch.Generator().manual_seed(39)
    ids, feed = torch.randint(1, 128, (2, 10), generator=g), torch.randint(1, 128, (2, steps), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # one left-padded row
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    # one 2-D mask shape for every step, as static caches' masks span max_cache_len (a growing mask
    # would be a new input shape each step)
    static_mask = torch.zeros(2, 64, dtype=mask.dtype)
    static_mask[:, :ids.shape[1]] = mask
    logits = []
    with torch.inference_mode():
        model(ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)  # as generate's
        for s in range(steps):
            static_mask[:, ids.shape[1] + s] = 1
            positions = positions[:, -1:] + 1
            out = forward(feed[:, s:s + 1], cache=cache, attention_mask=static_mask, position_ids=positions,
                          use_cache=True)
            logits.append(out.logits[:, -1].clone())
    return torch.stack(logits)


def _compiled_decode(model, cache, steps: int = 20):
    """The same steps eager and compiled (each over its own ``cache()``): returns (dynamo graphs,
    graph breaks, the compiled run's cache, eager logits)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    graphs = []
    eager = _decode(model, cache(), model.forward, steps)
    compiled_cache = cache()
    compiled = _decode(model, compiled_cache, torch.compile(model.forward, backend=_recording_backend(graphs),
                                                            fullgraph=True), steps)
    # the traced SDPA of a dense layer may sum in another order: fp32 rounding only
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    assert torch.equal(compiled.argmax(-1), eager.argmax(-1))
    return graphs, dict(counters["graph_break"]), compiled_cache, eager


# graphs transformers' own StaticCache compiles for the same 20 steps: one, or three where its
# sliding-window layers branch on a host length before and after the window fills
@pytest.mark.parametrize("family,graphs", [("llama", 1), ("qwen3_next", 1), ("qwen2-sliding", 3)])
def test_compiled_decode_traces_once_and_equals_eager(hf_transformers, tat, family, graphs, transformers_torch_gdn):
    model = BUILDERS[family](hf_transformers)
    attention_layers = sum(t != "linear_attention" for t in getattr(model.config, "layer_types", None) or
                           ["full_attention"] * model.config.num_hidden_layers)
    own = _decode(model, hf_transformers.StaticCache(config=model.config, max_cache_len=64), model.forward)
    tat.enable(model)
    try:
        ours, breaks, cache, _ = _compiled_decode(model, lambda: tat.AuraKVCache(model, scheme="aura8",
                                                                                 max_cache_len=64))
        assert cache.is_compileable and int(cache.get_seq_length()) == 30
        theirs, their_breaks, _, eager = _compiled_decode(
            model, lambda: hf_transformers.StaticCache(config=model.config, max_cache_len=64))
    finally:
        tat.disable(model)
    assert not breaks and not their_breaks, (breaks, their_breaks)
    assert len(ours) == len(theirs) == graphs, f"AuraKVCache: {len(ours)} graphs, StaticCache: {len(theirs)}"
    # "aura" over the StaticCache: flash_decode in every attention layer of every graph, no masked SDPA
    assert _calls(theirs, "aura.flash_decode") == graphs * attention_layers
    assert _calls(theirs, "scaled_dot_product") == 0 and _calls(ours, "scaled_dot_product") == 0
    # ... and it is the model's own SDPA path with the mask, left-padded row included
    torch.testing.assert_close(eager, own, rtol=1e-5, atol=1e-5)
    assert torch.equal(eager.argmax(-1), own.argmax(-1))


# per-head lists (one store and one decode per distinct scheme) and "auto" (chosen at the eager prefill)
MIXED_SCHEMES = {"per-layer-per-head": [["aura8v4", "aura4"], "aura4v2"], "auto": "auto"}


@pytest.mark.parametrize("kind", list(MIXED_SCHEMES))
def test_compiled_decode_with_mixed_schemes_traces_once(hf_transformers, tat, kind):
    model = tiny_llama(hf_transformers)
    extra = {"bits_per_coordinate": 4.5} if kind == "auto" else {}
    tat.enable(model)
    try:
        graphs, breaks, cache, _ = _compiled_decode(model, lambda: tat.AuraKVCache(
            model, scheme=MIXED_SCHEMES[kind], max_cache_len=64, **extra))
    finally:
        tat.disable(model)
    assert not breaks and len(graphs) == 1, (breaks, len(graphs))
    assert all(s is not None and len(s) == 2 for s in cache.schemes), cache.schemes
    if kind != "auto":
        assert cache.schemes == [["aura8v4", "aura4"], ["aura4v2", "aura4v2"]]
    assert _calls(graphs, "scaled_dot_product") == 0


@pytest.mark.parametrize("cache_kind", ["static", "aura8"])
@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_generate_with_compile_config_traces_once(hf_transformers, tat, family, cache_kind, transformers_torch_gdn):
    """transformers' own compiled generate (``compile_config``; ``_compile_all_devices`` lets it
    compile on the CPU): 20 tokens, one graph, no break, the tokens of the uncompiled generate."""
    from torch._dynamo.utils import counters

    model = BUILDERS[family](hf_transformers)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 128, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    graphs = []
    config = hf_transformers.CompileConfig(backend=_recording_backend(graphs), fullgraph=True, mode=None)
    config._compile_all_devices = True
    tat.enable(model)
    try:
        torch._dynamo.reset()
        counters.clear()
        compiled = model.generate(ids, compile_config=config, **static_generate_kwargs(tat, model, cache_kind, mask))
        eager = model.generate(ids, disable_compile=True, **static_generate_kwargs(tat, model, cache_kind, mask))
    finally:
        tat.disable(model)
    assert len(graphs) == 1 and not counters["graph_break"], (len(graphs), dict(counters["graph_break"]))
    assert _calls(graphs, "aura.flash_decode" if cache_kind == "static" else "aura.aura_decode") >= 1
    assert _calls(graphs, "scaled_dot_product") == 0
    assert compiled.shape == (2, 27) and torch.equal(compiled, eager)


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
            # a row reorder makes new tensors: still static addresses, or CUDA graphs would copy them each step
            cache.reorder_cache(torch.tensor([0, 0]))
            assert layer.aura.batch == 2 and all(
                getattr(t, "_dynamo_static_input_type", None) for t in (layer.aura.k_codes, layer.aura.seq_lens))
            cache.reset()
            assert layer.cumulative_length is length and int(length) == 0
            model(ids, cache=cache, use_cache=True)
            assert int(cache.get_seq_length()) == 12
    finally:
        tat.disable(model)
