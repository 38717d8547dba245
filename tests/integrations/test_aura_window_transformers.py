"""``AuraKVCache(sink_tokens=S, recent_tokens=W)`` (issue 43, deliverable 1) in a tiny Llama: each
decode step equals SDPA over [exact sinks | dequantized middle | exact window]; a window that covers
the whole context equals the dense model; bad values are refused."""

import pytest
import torch

import torch_aura
from _hf_models import teacher_forced


def _mixed(layer, kind):
    a = layer.aura
    S, T = a.sink_tokens, int(a.seq_lens[0])
    rs = int(a._ring_start[0])
    codes, norms, cb, bits, mask = ((a.k_codes, a.k_norms, a.k_codebook, a.key_bits, a.k_sign_mask) if kind == "k" else
                                    (a.v_codes, a.v_norms, a.v_codebook, a.value_bits, a.v_sign_mask))
    middle = torch_aura.aura_dequantize(codes[:, :, :rs - S], norms[:, :, :rs - S], cb, bits, mask)
    return middle


def test_decode_equals_sdpa_over_sinks_dequantized_middle_and_window(hf_transformers, tat):
    from torch_aura.integrations.transformers.cache import AuraKVLayer

    torch.manual_seed(4)
    B, Hq, Hkv, D, P, S, W = 2, 6, 2, 64, 29, 3, 7
    layer = AuraKVLayer("aura3v2", layer_idx=0, sink_tokens=S, recent_tokens=W)
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups = True, Hq // Hkv
    k, v, q = torch.randn(B, Hkv, P, D), torch.randn(B, Hkv, P, D), torch.randn(B, Hq, P, D)
    layer.attend(module, q, *layer.update(k, v, kwargs={}), None, D ** -0.5, 0.0, {})
    ks, vs = [k], [v]
    for step in range(12):  # wraps the ring
        k1, v1, q1 = torch.randn(B, Hkv, 1, D), torch.randn(B, Hkv, 1, D), torch.randn(B, Hq, 1, D)
        ks.append(k1)
        vs.append(v1)
        out = layer.attend(module, q1, *layer.update(k1, v1, kwargs={}), None, D ** -0.5, 0.0, {})
        K, V = torch.cat(ks, 2), torch.cat(vs, 2)
        T = K.shape[2]
        kd, vd = _mixed(layer, "k"), _mixed(layer, "v")
        assert kd.shape[2] == T - S - W
        Km = torch.cat([K[:, :, :S], kd, K[:, :, T - W:]], 2)
        Vm = torch.cat([V[:, :, :S], vd, V[:, :, T - W:]], 2)
        ref = torch.nn.functional.scaled_dot_product_attention(q1, Km, Vm, enable_gqa=True)
        assert (out - ref.transpose(1, 2)).abs().max().item() <= 1e-5, step
        # the middle really is the compressed one (not exact): the check above is not vacuous
        assert (kd - K[:, :, S:T - W]).abs().max() > 1e-2


def test_window_covering_the_context_equals_the_dense_model(hf_transformers, tat, llama):
    g = torch.Generator().manual_seed(5)
    ids, steps = torch.randint(1, 128, (2, 12), generator=g), torch.randint(1, 128, (2, 10), generator=g)
    dense = teacher_forced(llama, ids, None, hf_transformers.DynamicCache(config=llama.config), steps)
    full = teacher_forced(llama, ids, None, tat.AuraKVCache(llama.config, scheme="aura2", sink_tokens=4,
                                                            recent_tokens=64), steps)
    plain = teacher_forced(llama, ids, None, tat.AuraKVCache(llama.config, scheme="aura2"), steps)
    assert (dense - full).abs().max().item() < 1e-4
    assert (dense - plain).abs().max().item() > 1e-3  # aura2 alone is visibly lossy


@pytest.mark.parametrize("name,value", [("sink_tokens", -1), ("recent_tokens", 2.5)])
def test_bad_window_values_are_refused(hf_transformers, tat, llama, name, value):
    with pytest.raises(ValueError, match=name):
        tat.AuraKVCache(llama.config, **{name: value})
