"""The transformers integration on the GPU's kernels: tiny random-weight models (fp32 for exact
comparisons, bf16 for the dtype users run) against transformers' own path. Runs only where a CUDA
device and transformers exist; the CPU twins are in tests/integrations."""

from __future__ import annotations

import pytest
import torch

from _hf_models import greedy, static_generate_kwargs, teacher_forced, tiny_llama, tiny_qwen3_next

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("weight_fp32", [False, True], ids=["weight_same", "weight_fp32"])
def test_gated_norm_kernel_matches_transformers(dtype, weight_fp32):
    """The GDN layers' gated RMSNorm in one launch against transformers' forward, to one ulp of the dtype."""
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

    from torch_aura.triton_kernels.gdn.gated_norm import gated_rms_norm

    gen = torch.Generator(device=DEV).manual_seed(0)
    tol = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    for N, D in ((0, 128), (1, 128), (4097, 128), (33, 96), (7, 256)):
        norm = qwen3_next.Qwen3NextRMSNormGated(D, eps=1e-6).to(DEV, torch.float32 if weight_fp32 else dtype)
        norm.weight.data.normal_(1, 0.3, generator=gen)
        o = (3 * torch.randn(N, D, device=DEV, generator=gen)).to(dtype)
        z = (2 * torch.randn(N, D + 24, device=DEV, generator=gen)).to(dtype)[:, 5:5 + D]
        torch.testing.assert_close(gated_rms_norm(o, z, norm.weight, 1e-6), norm(o, z), rtol=tol, atol=tol)


def test_qwen3_next_norm_runs_the_kernel_in_inference_only(tat, monkeypatch):
    """Inside the model the layers' norm takes the kernel under no_grad / inference_mode, and transformers'
    forward where autograd records (the kernel has no backward)."""
    from torch_aura.triton_kernels.gdn import gated_norm

    calls = []
    kernel = gated_norm.gated_rms_norm
    monkeypatch.setattr(gated_norm, "gated_rms_norm", lambda *a: calls.append(1) or kernel(*a))
    model = tiny_qwen3_next(transformers, device=DEV, dtype=torch.bfloat16, head_dims=(64, 64))
    ids = _ids(1, 40, 3)
    tat.enable(model)
    try:
        with torch.inference_mode():
            model(ids)
        served = len(calls)
        model(ids)  # grad mode, weights requiring grad: autograd records the norm
    finally:
        tat.disable(model)
    layers = sum(t == "linear_attention" for t in model.config.layer_types)
    assert served == layers and len(calls) == served


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


def _left_padded_steps(model, cache, forward, steps=12, prompt=10, pad=3, capacity=64):
    """Eager prefill of a 2-row batch whose row 1 is left-padded by ``pad``, then ``steps`` one-token
    steps through ``forward`` with one mask shape (a static cache's): ``[steps, 2, vocab]`` fp32 logits."""
    ids, feed = _ids(2, prompt, 2), _ids(2, steps, 3)
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    static_mask = torch.zeros(2, capacity, dtype=mask.dtype, device=DEV)
    static_mask[:, :prompt] = mask
    logits = []
    with torch.inference_mode():
        model(ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        for s in range(steps):
            static_mask[:, prompt + s] = 1
            positions = positions[:, -1:] + 1
            out = forward(feed[:, s:s + 1], cache=cache, attention_mask=static_mask, position_ids=positions,
                          use_cache=True)
            logits.append(out.logits[:, -1].float().clone())  # a CUDA-graph output is overwritten by the next replay
    return torch.stack(logits)


# "mixed": one scheme per KV head (both models have two) in every layer: a store and a decode per scheme
MIXED = ["aura8v4", "aura4"]


@pytest.mark.parametrize("cache_kind", ["static", "aura8", "mixed"])
@pytest.mark.parametrize("family", ["llama", "qwen3_next"])
def test_compiled_decode_is_a_cuda_graph(tat, caplog, family, cache_kind):
    """issue 39: a left-padded batch's decode step under torch.compile(mode="reduce-overhead",
    fullgraph=True), over transformers' StaticCache ("aura" attention: flash_decode over each row's
    visible keys) and over AuraKVCache(max_cache_len): one graph, captured (inductor logs no
    "skipping cudagraphs"), no graph break, and its replays equal eager steps."""
    import logging

    from torch._dynamo.utils import counters

    build = {"llama": tiny_llama, "qwen3_next": lambda t, **kw: tiny_qwen3_next(t, head_dims=(64, 64), **kw)}[family]
    model = build(transformers, device=DEV, dtype=torch.bfloat16)
    tat.enable(model)
    try:
        def cache():
            if cache_kind == "static":
                return transformers.StaticCache(config=model.config, max_cache_len=64)
            scheme = [MIXED] * model.config.num_hidden_layers if cache_kind == "mixed" else cache_kind
            return tat.AuraKVCache(model, scheme=scheme, max_cache_len=64)

        torch._dynamo.reset()
        counters.clear()
        eager = _left_padded_steps(model, cache(), model.forward)
        step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        with caplog.at_level(logging.DEBUG, logger="torch._inductor"):
            compiled = _left_padded_steps(model, cache(), step)
        graphs = counters["stats"]["unique_graphs"]
    finally:
        tat.disable(model)
    assert "skipping cudagraphs" not in caplog.text, caplog.text[-2000:]
    assert graphs == 1 and not counters["graph_break"], (graphs, dict(counters["graph_break"]))
    torch.testing.assert_close(compiled, eager, rtol=2e-2, atol=2e-2)


def test_aura_attention_over_static_cache_equals_sdpa_with_the_mask(tat):
    """fp32, a 300-token prompt left-padded by 100 in a 512-token StaticCache: the "aura" decode
    (flash_decode over each row's visible keys, many splits) equals the model's own masked SDPA."""
    model = tiny_llama(transformers, device=DEV, dtype=torch.float32)

    def run():
        cache = transformers.StaticCache(config=model.config, max_cache_len=512)
        return _left_padded_steps(model, cache, model.forward, steps=8, prompt=300, pad=100, capacity=512)

    own = run()
    tat.enable(model)
    try:
        ours = run()
    finally:
        tat.disable(model)
    assert (ours - own).abs().max().item() <= 1e-4 * own.abs().max().item()
    assert torch.equal(ours.argmax(-1), own.argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("D,G", [(64, 4), (128, 8), (256, 1)])
def test_mask_pages_flash_decode_equals_masked_sdpa(tat, dtype, D, G):
    """The CUDA kernel over mask_pages' in-place view (one-token pages aliasing a [B, Hkv, T, D]
    cache, a block table per row): full rows, left padding, a window, holes, the last row's last token
    (the view's last page), against SDPA with the mask in fp32."""
    import torch.nn.functional as F

    from torch_aura.integrations.transformers import attention

    g = torch.Generator().manual_seed(D + G)
    B, Hkv, T = 5, 2, 4099
    k, v = (torch.randn(B, Hkv, T, D, generator=g).to(DEV, dtype) for _ in range(2))
    q = torch.randn(B, Hkv * G, D, generator=g).to(DEV, dtype)
    mask = torch.zeros(B, 1, 1, T, dtype=torch.bool)
    mask[0, ..., :] = True
    mask[1, ..., 1000:3000] = True
    mask[2, ..., 2900:3029] = True
    mask[3, ..., :17] = True
    mask[4, ..., :] = torch.rand(T, generator=g) < 0.3
    mask[4, ..., T - 1] = True
    mask = mask.to(DEV)
    paged = attention.mask_pages(mask, k, v)
    out, lse = torch.ops.aura.flash_decode(q, *paged, D ** -0.5, 0)
    ref = F.scaled_dot_product_attention(q.float()[:, :, None], k.float().repeat_interleave(G, 1),
                                         v.float().repeat_interleave(G, 1), attn_mask=mask)[:, :, 0]
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}[dtype]
    assert (out.float() - ref).abs().max().item() <= tol * ref.abs().max().item()


@pytest.mark.parametrize("cache_kind", ["static", "aura8"])
def test_generate_with_compile_config_on_cuda(tat, caplog, cache_kind):
    """generate() compiles its decode step itself (transformers' default compile_config: inductor,
    reduce-overhead) for a StaticCache or an AuraKVCache: captured, and the tokens of eager generate."""
    import logging

    model = tiny_llama(transformers, device=DEV, dtype=torch.float32)
    ids = _ids(2, 9, 5)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    tat.enable(model)
    try:
        torch._dynamo.reset()
        with caplog.at_level(logging.DEBUG, logger="torch._inductor"):
            compiled = model.generate(ids, **static_generate_kwargs(tat, model, cache_kind, mask))
        eager = model.generate(ids, disable_compile=True, **static_generate_kwargs(tat, model, cache_kind, mask))
    finally:
        tat.disable(model)
    assert "skipping cudagraphs" not in caplog.text, caplog.text[-2000:]
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("policy, prompt, cudnn", [("auto", 301, False), ("0", 301, False), ("1", 301, True)])
def test_aura_prefill_leaves_cudnn_out_below_its_threshold(tat, monkeypatch, policy, prompt, cudnn):
    """The "aura" attention's prefill (SDPA) runs without cuDNN's per-length plans below
    CUDNN_FROM_QUERY_TOKENS (TORCH_AURA_SDPA_CUDNN=auto), never with 0, as SDPA chooses with 1; cuDNN is on
    again after, and the logits equal the default path's (cuDNN on)."""
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention

    def spying(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kwargs)

    monkeypatch.setenv("TORCH_AURA_SDPA_CUDNN", policy)
    torch.backends.cuda.enable_cudnn_sdp(True)
    model = tiny_llama(transformers, device=DEV, dtype=torch.bfloat16)
    ids = _ids(2, prompt, 5)
    with torch.no_grad():
        ref = model(ids).logits
        tat.enable(model)
        try:
            monkeypatch.setattr(F, "scaled_dot_product_attention", spying)
            out = model(ids).logits
        finally:
            tat.disable(model)
    assert seen and set(seen) == {cudnn}, seen
    assert torch.backends.cuda.cudnn_sdp_enabled()
    assert (out.float() - ref.float()).abs().max().item() <= 0.1
