"""``enable()`` and ``attn_implementation="aura"`` on real (tiny, random-weight) transformers models.

Served: greedy tokens and logits equal the model's own SDPA path, unpadded and left-padded
(flash_decode serves decode, over each row's real tokens when padded) and on sliding-window models
(flash_decode over the window the cache keeps, or the keys the mask leaves in it). Refused: every feature "aura" cannot compute exactly, by name, before
anything changes (attention implementation, GDN patch). ``disable()`` restores what the model had.
"""

import importlib

import pytest
import torch
from transformers.cache_utils import get_layer_types_and_kwargs
from _hf_models import greedy, teacher_forced, tiny_llama, tiny_qwen2_sliding, tiny_qwen3_next
from _hf_zoo import build, implementations

QWEN3_NEXT = "transformers.models.qwen3_next.modeling_qwen3_next"


@pytest.fixture(autouse=True)
def _nothing_patched(tat):
    from torch_aura.integrations.transformers import gdn

    gdn.unpatch()
    yield
    gdn.unpatch()


@pytest.fixture
def flash_decode_calls(tat, monkeypatch):
    """``(paged, seq_lens)`` of every one-token decode the "aura" attention serves itself: flash_decode
    (paged: through a block table of each row's visible keys), or on the CPU for an unmasked batch its
    grouped-query SDPA form."""
    from torch_aura.integrations.transformers import attention

    calls = []
    for name in ("flash_decode", "grouped_sdpa_decode"):
        real = getattr(attention, name)

        def counting(q, k, v, seq_lens, block_table, *args, _real=real, **kwargs):
            calls.append((block_table is not None, seq_lens.tolist()))
            return _real(q, k, v, seq_lens, block_table, *args, **kwargs)

        monkeypatch.setattr(attention, name, counting)
    return calls


def _same_as_own_path(tat, model, ids, mask=None, steps=19):
    ref = greedy(model, ids, mask, steps=steps, min_new_tokens=steps)
    before = implementations(model)
    try:
        assert tat.enable(model)["attention"] == "aura"
        assert set(implementations(model)) == {"aura"}
        out = greedy(model, ids, mask, steps=steps, min_new_tokens=steps)
    finally:
        tat.disable(model)
    assert implementations(model) == before
    assert torch.equal(out.sequences, ref.sequences)
    assert max((a - b).abs().max().item() for a, b in zip(out.logits, ref.logits)) <= 1e-4


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded-B1", "left-padded-B3"])
def test_aura_attention_matches_sdpa(hf_transformers, tat, flash_decode_calls, padded):
    model = tiny_llama(hf_transformers)
    g = torch.Generator().manual_seed(1)
    if padded:
        ids = torch.randint(1, 128, (3, 11), generator=g)
        mask = torch.ones_like(ids)
        mask[1, :4] = 0
        mask[2, :9] = 0
    else:
        ids, mask = torch.randint(1, 128, (1, 11), generator=g), None
    assert model.config._attn_implementation == "sdpa"
    _same_as_own_path(tat, model, ids, mask)
    assert len(flash_decode_calls) == 18 * 2  # every decode step of both layers
    if padded:  # each row attends its real tokens only: 11 + step positions less its padding
        assert all(paged for paged, _ in flash_decode_calls)
        assert flash_decode_calls[0][1] == [12, 8, 3] and flash_decode_calls[-1][1] == [29, 25, 20]
    else:
        assert not any(paged for paged, _ in flash_decode_calls)


@pytest.mark.parametrize("family", ["mistral", "gemma3_text", "qwen2-max-window-layers"])
def test_sliding_windows_are_served_exactly_over_the_kept_window(hf_transformers, tat, flash_decode_calls, family):
    """Decode crosses the 16-token window: flash_decode attends the window DynamicCache keeps."""
    if family == "qwen2-max-window-layers":
        model = tiny_qwen2_sliding(hf_transformers)
    else:
        model = build(family)
    types = get_layer_types_and_kwargs(model.config.get_text_config())[0]  # transformers' own reading
    assert "sliding_attention" in types
    ids = torch.randint(4, 128, (2, 12), generator=torch.Generator().manual_seed(2))
    _same_as_own_path(tat, model, ids, steps=12)
    # a sliding layer never hands flash_decode more than its window (past it transformers masks, and
    # SDPA serves); a full layer reads all 12 + 10 + 1 keys at the last of the 11 decode steps
    lengths = {max(seq_lens) for _, seq_lens in flash_decode_calls}
    assert max(lengths) == 23 if "full_attention" in types else max(lengths) <= 16


def _refused(tat, model, match):
    from torch_aura.integrations.transformers import gdn

    before = implementations(model)
    with pytest.raises(ValueError, match=match) as e:
        tat.enable(model)
    assert "enable()" in str(e.value) and "keep the model's own attention implementation" in str(e.value)
    assert implementations(model) == before and gdn.patched() == []
    return str(e.value)


REFUSED = {
    "gemma2": r"soft-capping \(attn_logit_softcapping=50\.0\)",
    "gpt_oss": r"attention sinks \(GptOssAttention passes s_aux=a tensor.*does not support SDPA",
    "deepseek_v3": r"multi-head latent attention \(kv_lora_rank=32, K head dim 64, V head dim 64\)",
    "bart": r"cross attention \(BartAttention at model\.decoder\.layers\.0\.encoder_attn\)",
    "bloom": r"does not route attention through transformers' AttentionInterface",
    "mamba": r"no attention layer that calls ALL_ATTENTION_FUNCTIONS",
    "deepseek_v32": r"sparse attention \(DeepseekV32Attention passes indices=",
}


@pytest.mark.parametrize("family", REFUSED)
def test_enable_refuses_what_aura_cannot_compute_and_changes_nothing(tat, family):
    from transformers import AutoModelForCausalLM

    from _hf_zoo import tiny_config

    if family == "deepseek_v32":  # its own generate fails tiny (not built in the walk); enable() needs no forward
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_config(family)).eval()
    else:
        model = build(family)
    _refused(tat, model, REFUSED[family])


def test_enable_refuses_mla_k_v_head_dims_by_their_own_names(hf_transformers, tat):
    """The check once read the rope dim (config.head_dim of an MLA model) as the attention head dim."""
    cfg = hf_transformers.DeepseekV3Config(vocab_size=128, hidden_size=128, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=32,
                                           q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                                           n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                                           moe_intermediate_size=32, first_k_dense_replace=1)
    message = _refused(tat, hf_transformers.DeepseekV3ForCausalLM(cfg).eval(),
                       r"K head dim 192, V head dim 128")
    assert "head_dim 64" not in message


def test_enable_refuses_an_unsupported_head_dim_and_patches_no_gdn(hf_transformers, tat):
    _refused(tat, tiny_llama(hf_transformers, head_dim=48), r"head_dim 48: flash_decode supports \[64, 80, 96, 128")
    # a GDN model refused for its attention: the GDN patch must not happen either
    _refused(tat, tiny_qwen3_next(hf_transformers, attention_head_dim=48), r"head_dim 48")


def test_enable_without_attention_needs_gdn_layers(hf_transformers, tat):
    with pytest.raises(ValueError, match="no gated delta rule layers"):
        tat.enable(tiny_llama(hf_transformers), attention=False)


def test_aura_refuses_sinks_at_call_time_when_selected_by_hand(tat):
    """A model enable() refuses but set to "aura" anyway must raise, not drop its sinks."""
    model = build("gpt_oss")
    tat.enable()  # registers "aura" only
    model.set_attn_implementation("aura")
    with pytest.raises(ValueError, match=r"attention sinks \(s_aux\).*keep the model's own"):
        model(torch.randint(4, 128, (1, 5)))


def test_disable_restores_what_the_model_had(hf_transformers, tat):
    torch.manual_seed(0)
    cfg = hf_transformers.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    eager = hf_transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager").eval()
    assert eager.config._attn_implementation == "eager"
    tat.enable(eager)
    tat.enable(eager)  # a second enable() must not record "aura" as what the model had
    tat.disable(eager)
    assert eager.config._attn_implementation == "eager"
    tat.disable(eager)  # nothing left to undo: unchanged
    assert eager.config._attn_implementation == "eager"
    # a composite model: each sub-config gets its own implementation back
    vlm = build("gemma3")
    before = implementations(vlm)
    assert len(before) >= 2
    tat.enable(vlm)
    tat.disable(vlm)
    assert implementations(vlm) == before
    tat.disable(vlm, attn_implementation="eager")  # an explicit choice is applied
    assert set(implementations(vlm)) == {"eager"}


def test_gdn_patch_is_process_wide_and_said_so(hf_transformers, tat):
    first, second = tiny_qwen3_next(hf_transformers), tiny_qwen3_next(hf_transformers)
    module = importlib.import_module(QWEN3_NEXT)
    out = tat.enable(first)
    assert out["gdn"] == [QWEN3_NEXT] and out["gdn_scope"] == "process" and out["attention"] == "aura"
    # the other instance, never enabled, runs our kernels too (module globals), on its own attention
    from torch_aura.integrations.transformers import gdn

    assert module.torch_chunk_gated_delta_rule is gdn.chunk_gated_delta_rule
    assert second.config._attn_implementation == "sdpa"
    tat.disable(first)
    assert module.torch_chunk_gated_delta_rule is not gdn.chunk_gated_delta_rule and gdn.patched() == []


def test_aura_is_registered_for_attention_and_mask(hf_transformers, tat):
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    tat.enable()
    # without the mask entry transformers would build no mask for "aura" (padded rows unmasked)
    assert "aura" in ALL_MASK_ATTENTION_FUNCTIONS and "aura" in ALL_ATTENTION_FUNCTIONS


def test_the_attention_call_scan_reads_each_family_convention(hf_transformers, tat):
    """Contract with transformers: attention modules bind ALL_ATTENTION_FUNCTIONS to a local name
    and call it with keywords; the scan must find Llama's call and Gemma2's softcap argument."""
    from torch_aura.integrations.transformers import _support

    found = _support.attention_modules(tiny_llama(hf_transformers))
    assert len(found) == 2 and all(set(args) == {"dropout", "scaling"} for _, _, args in found)
    gemma2 = _support.attention_modules(build("gemma2"))
    assert {args["softcap"] for _, _, args in gemma2} == {50.0}


def test_unsupported_transformers_version_is_named(monkeypatch, hf_transformers):
    import sys

    from torch_aura.integrations.transformers import _version

    # the module object require_transformers will import (transformers may have replaced its own)
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "4.57.1")
    with pytest.raises(ImportError, match=r"supports transformers >= 5\.24, < 5\.25.*found 4\.57\.1"):
        _version.require_transformers()


def test_teacher_forced_helper_is_exact_on_the_dense_path(hf_transformers, tat):
    """The helper the cache tests compare against: enable() + DynamicCache equals the own path."""
    model = tiny_llama(hf_transformers)
    g = torch.Generator().manual_seed(3)
    ids, steps = torch.randint(1, 128, (2, 9), generator=g), torch.randint(1, 128, (2, 6), generator=g)
    ref = teacher_forced(model, ids, None, hf_transformers.DynamicCache(config=model.config), steps)
    tat.enable(model)
    try:
        ours = teacher_forced(model, ids, None, hf_transformers.DynamicCache(config=model.config), steps)
    finally:
        tat.disable(model)
    assert (ours - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("G", [1, 3, 4, 8])
def test_cpu_decode_route_equals_flash_decode(tat, G):
    """The CPU's grouped-query SDPA decode computes flash_decode's output (no lse) on the same call."""
    from torch_aura.integrations.transformers import attention

    g = torch.Generator().manual_seed(G)
    q = torch.randn(3, 2 * G, 64, generator=g)
    k, v = torch.randn(3, 2, 37, 64, generator=g), torch.randn(3, 2, 37, 64, generator=g)
    seq_lens = torch.full((3,), 37, dtype=torch.int32)
    out, lse = attention.grouped_sdpa_decode(q, k, v, seq_lens, None, 0.3, 0)
    ref, _ = torch.ops.aura.flash_decode(q, k, v, seq_lens, None, 0.3, 0)
    assert lse is None and out.shape == ref.shape
    assert (out - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("layout", ["contiguous", "token-major", "unviewable", "mask-batch-1"])
def test_masked_decode_equals_sdpa_with_the_mask(hf_transformers, tat, monkeypatch, layout):
    """A one-token decode with a boolean mask (left padding, a window, holes, unfilled static slots)
    is flash_decode over each row's visible keys, equal to SDPA with the mask; a cache that cannot be
    viewed as one-token pages (a row stride not a whole number of token strides) goes to SDPA."""
    import torch.nn.functional as F

    from torch_aura.integrations.transformers import attention

    module = tiny_llama(hf_transformers).model.layers[0].self_attn  # 6 query / 2 KV heads of 64
    g = torch.Generator().manual_seed(5)
    B, Hkv, T, D = 4, 2, 37, 64
    shapes = {"token-major": (B, T, Hkv, D), "unviewable": (B, Hkv, 3 * T + 1, D)}
    k, v = (torch.randn(shapes.get(layout, (B, Hkv, T, D)), generator=g) for _ in range(2))
    if layout == "token-major":
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    elif layout == "unviewable":  # token stride 3D, row stride 2 (3T + 1) D: not a multiple of it
        k, v = k[:, :, :3 * T:3], v[:, :, :3 * T:3]
    mask = torch.zeros(B, 1, 1, T, dtype=torch.bool)
    mask[0, ..., :] = True  # a full static cache
    mask[1, ..., 5:30] = True  # left padding, then slots not written yet
    mask[2, ..., 20:36] = True  # a sliding window
    mask[3, ..., :] = torch.rand(T, generator=g) < 0.5  # holes (a hand-made 2-D mask)
    mask[3, ..., [0, T - 1]] = True  # the last row's last token: the page view's last page
    if layout == "mask-batch-1":  # one mask row for every row (a mask transformers broadcasts)
        mask = mask[1:2]
    q = torch.randn(B, 6, 1, D, generator=g)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), attn_mask=mask,
                                         scale=0.125).transpose(1, 2)
    paged = attention.mask_pages(mask, k, v)
    assert (paged is None) == (layout == "unviewable")
    if paged is not None:  # flash_decode must serve: SDPA is not there to fall back on
        assert paged[2].tolist() == mask.expand(B, -1, -1, -1).sum((1, 2, 3)).tolist()
        monkeypatch.setattr(attention, "sdpa_attention_forward", None)
    out, _ = attention.aura_attention_forward(module, q, k, v, mask, scaling=0.125)
    assert (out - ref).abs().max().item() <= 1e-5


def test_sdpa_fallback_backends_leave_out_cudnn_and_keep_the_users_switches(tat, monkeypatch):
    """Without cuDNN (a plan per new sequence length) the SDPA fallback's CUDA backends are every one the user
    left on; nothing to restrict where cuDNN is already off or is all that is on. TORCH_AURA_SDPA_CUDNN reads
    auto, 0 or 1 and refuses anything else by name."""
    from torch.nn.attention import SDPBackend
    from torch_aura.integrations.transformers import attention

    cuda = torch.backends.cuda
    saved = (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
             cuda.math_sdp_enabled())
    try:
        cuda.enable_cudnn_sdp(True)
        assert attention.sdpa_backends() == (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                             SDPBackend.MATH)
        cuda.enable_flash_sdp(False)  # the user's own choice survives
        assert attention.sdpa_backends() == (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)
        cuda.enable_mem_efficient_sdp(False)
        cuda.enable_math_sdp(False)
        assert attention.sdpa_backends() is None  # cuDNN alone: not ours to turn off
        cuda.enable_math_sdp(True)
        cuda.enable_cudnn_sdp(False)
        assert attention.sdpa_backends() is None
    finally:
        for enable, on in zip((cuda.enable_cudnn_sdp, cuda.enable_flash_sdp, cuda.enable_mem_efficient_sdp,
                               cuda.enable_math_sdp), saved):
            enable(on)
    monkeypatch.delenv("TORCH_AURA_SDPA_CUDNN", raising=False)
    assert attention.cudnn_policy() == "auto"
    for value in ("0", "1"):
        monkeypatch.setenv("TORCH_AURA_SDPA_CUDNN", value)
        assert attention.cudnn_policy() == value
    monkeypatch.setenv("TORCH_AURA_SDPA_CUDNN", "yes")
    with pytest.raises(ValueError, match="TORCH_AURA_SDPA_CUDNN"):
        attention.cudnn_policy()


def test_sdpa_backends_compile_without_a_graph_break(tat):
    """sdpa_backends() and cudnn_policy() read torch's host flags and the environment, which dynamo cannot
    trace: each is a constant of the compiled graph (``assume_constant_result``), so the CUDA fallback's
    ``sdpa_kernel`` block compiles in one graph."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    from torch_aura.integrations.transformers import attention

    def attend(q):
        assert attention.cudnn_policy() == "auto"
        with sdpa_kernel(list(attention.sdpa_backends())):
            return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    q = torch.randn(1, 2, 7, 16, generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    out = torch.compile(attend, fullgraph=True)(q)
    assert (out - attend(q)).abs().max().item() <= 1e-6
