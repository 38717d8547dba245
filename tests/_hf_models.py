"""Tiny random-weight transformers models built from config (no hub) and the loops that drive them,
shared by tests/integrations (CPU) and tests/cuda."""

from __future__ import annotations

import torch


def tiny_llama(transformers, head_dim=64, layers=2, hidden=192, device="cpu", dtype=torch.float32):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=hidden, intermediate_size=192,
                                   num_hidden_layers=layers, num_attention_heads=6,
                                   num_key_value_heads=2, head_dim=head_dim)
    return transformers.LlamaForCausalLM(cfg).to(device, dtype).eval()


def tiny_qwen3_next(transformers, device="cpu", dtype=torch.float32, head_dims=(16, 32), attention_head_dim=64):
    """3 GDN layers (2 key / 4 value heads) then one attention layer (4 / 2 heads of 64), 4 experts."""
    torch.manual_seed(0)
    cfg = transformers.Qwen3NextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=attention_head_dim, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=head_dims[0], linear_value_head_dim=head_dims[1])
    return transformers.Qwen3NextForCausalLM(cfg).to(device, dtype).eval()


def tiny_qwen2_sliding(transformers):
    """Qwen2 whose layer 0 is full and layer 1 slides (window 16): use_sliding_window + max_window_layers."""
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=128, hidden_size=128, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, use_sliding_window=True,
                                   sliding_window=16, max_window_layers=1)
    return transformers.Qwen2ForCausalLM(cfg).eval()


def greedy(model, ids, mask=None, steps=20, **kwargs):
    return model.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                          output_logits=True, return_dict_in_generate=True, pad_token_id=0, **kwargs)


def static_generate_kwargs(tat, model, cache_kind, mask, steps=20):
    """``generate`` keyword arguments for ``steps`` greedy tokens over a static cache: transformers'
    own (``cache_kind="static"``) or a fresh ``AuraKVCache`` of that scheme with ``max_cache_len=64``.
    Call once per ``generate``: each call gets its own cache."""
    cache = ({"cache_implementation": "static"} if cache_kind == "static"
             else {"cache": tat.AuraKVCache(model, scheme=cache_kind, max_cache_len=64)})
    return dict(attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=0,
                **cache)


@torch.no_grad()
def teacher_forced(model, ids, mask, cache, steps):
    """Prefill ``ids [B, P]`` then feed ``steps [B, S]`` one token at a time: ``[B, S + 1, vocab]`` logits.

    Positions count real tokens only, as ``generate`` does for left-padded rows.
    """
    pos = None if mask is None else (mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
    logits = [out.logits[:, -1]]
    for s in range(steps.shape[1]):
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            pos = pos[:, -1:] + 1
        out = model(steps[:, s:s + 1], attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        logits.append(out.logits[:, -1])
    return torch.stack(logits, 1)
