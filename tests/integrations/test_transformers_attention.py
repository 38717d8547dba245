"""``attn_implementation="aura"`` on a real (tiny, random-weight) transformers Llama: greedy tokens
and logits equal SDPA's, unpadded (flash_decode serves decode) and left-padded (SDPA with the mask
serves it); ``enable`` refuses what it cannot serve and then changes nothing."""

import pytest
import torch
from _hf_models import greedy, tiny_llama


@pytest.fixture(scope="module")
def tat(hf_transformers):
    from torch_aura.integrations import transformers as tat

    return tat


@pytest.fixture
def flash_decode_calls(tat, monkeypatch):
    from torch_aura.integrations.transformers import attention

    calls = []
    real = attention.flash_decode

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "flash_decode", counting)
    return calls


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
    ref = greedy(model, ids, mask)
    assert model.config._attn_implementation == "sdpa"
    try:
        assert tat.enable(model)["attention"] == "aura"
        assert model.config._attn_implementation == "aura"
        out = greedy(model, ids, mask)
    finally:
        tat.disable(model)
    assert torch.equal(out.sequences, ref.sequences)
    dlogits = max((a - b).abs().max().item() for a, b in zip(out.logits, ref.logits))
    assert dlogits <= 1e-4
    if padded:
        assert flash_decode_calls == []  # a padded batch must keep its mask: SDPA serves decode
    else:
        assert len(flash_decode_calls) == 19 * 2  # every decode step of both layers


def test_enable_refuses_an_unsupported_head_dim_and_changes_nothing(hf_transformers, tat):
    from torch_aura.integrations.transformers import gdn

    model = tiny_llama(hf_transformers, head_dim=48)
    with pytest.raises(ValueError, match=r"head_dim 48.*\[64, 80, 96, 128, 192, 256, 512\]"):
        tat.enable(model)
    assert model.config._attn_implementation == "sdpa"
    assert gdn.patched() == []


def test_enable_refuses_a_model_without_attention_interface(hf_transformers, tat, monkeypatch):
    from torch_aura.integrations.transformers import gdn

    model = tiny_llama(hf_transformers)
    # what transformers decides from the model's source for models that predate the interface
    monkeypatch.setattr(type(model), "_can_set_attn_implementation", classmethod(lambda cls: False))
    with pytest.raises(ValueError, match="AttentionInterface"):
        tat.enable(model)
    assert model.config._attn_implementation == "sdpa" and gdn.patched() == []


def test_enable_without_attention_needs_gdn_layers(hf_transformers, tat):
    with pytest.raises(ValueError, match="no gated delta rule layers"):
        tat.enable(tiny_llama(hf_transformers), attention=False)


def test_aura_is_registered_for_attention_and_mask(hf_transformers, tat):
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    tat.enable()
    try:
        # without the mask entry transformers would build no mask for "aura" (padded rows unmasked)
        assert "aura" in ALL_MASK_ATTENTION_FUNCTIONS and "aura" in ALL_ATTENTION_FUNCTIONS
    finally:
        tat.disable()


def test_unsupported_transformers_version_is_named(monkeypatch, hf_transformers):
    import sys

    from torch_aura.integrations.transformers import _version

    # the module object require_transformers will import (transformers may have replaced its own)
    monkeypatch.setattr(sys.modules["transformers"], "__version__", "4.57.1")
    with pytest.raises(ImportError, match=r"supports transformers >= 5\.24, < 5\.25.*found 4\.57\.1"):
        _version.require_transformers()
