"""torch_aura inside Hugging Face transformers (``pip install 'torch_aura[transformers]'``).

- :func:`enable` routes every gated-delta-rule model's GDN layers (found by scanning
  transformers' model sources, no fixed list) to :func:`torch_aura.gdn_chunk` /
  :func:`torch_aura.gdn_recurrent`, and registers the ``"aura"`` attention implementation
  (one-token decode through :func:`torch_aura.flash_decode`; prefill and padded batches through
  SDPA with their mask).
- :class:`AuraKVCache` stores the attention layers' K/V AURA-compressed and attends in the
  compressed domain through :func:`torch_aura.aura_decode`.

Supported transformers versions: see ``_version.SUPPORTED`` (tested: ``_version.TESTED``); any
other version raises ``ImportError`` at import of this module.

Example:
    >>> import torch, transformers, torch_aura.integrations.transformers as tat
    >>> cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    >>> model = transformers.LlamaForCausalLM(cfg).eval()
    >>> tat.enable(model)["attention"]
    'aura'
    >>> model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, min_new_tokens=3, do_sample=False).shape
    torch.Size([1, 6])
"""

from __future__ import annotations

from ._version import SUPPORTED, TESTED, require_transformers

require_transformers()

from . import attention as _attention  # noqa: E402
from . import gdn as _gdn  # noqa: E402
from .cache import AuraKVCache, AuraKVLayer  # noqa: E402

__all__ = ["enable", "disable", "AuraKVCache", "AuraKVLayer", "SUPPORTED", "TESTED"]


def _check_attention(model) -> None:
    from ..._checks.decode import SUPPORTED_HEAD_DIMS

    name = type(model).__name__
    # the test set_attn_implementation itself applies (it only logs a warning when it fails)
    if not type(model)._can_set_attn_implementation():
        raise ValueError(f"enable(attention=True): {name} does not route attention through transformers' "
                         "AttentionInterface, so 'aura' cannot serve it; supported: models whose attention "
                         "calls ALL_ATTENTION_FUNCTIONS (Llama, Qwen2/3, Qwen3-Next, Qwen3.5, ...). "
                         "Pass attention=False to enable the GDN kernels alone")
    D = _attention.head_dim_of(model.config.get_text_config(decoder=True))
    if D is not None and D not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"enable(attention=True): {name} has attention head_dim {D}; flash_decode "
                         f"supports {list(SUPPORTED_HEAD_DIMS)}")


def enable(model=None, gdn: bool = True, attention: bool = True) -> dict:
    """Route transformers to torch_aura's kernels.

    Everything is checked before anything changes: on error nothing is patched.

    Args:
        model: a transformers model, or None. Given, only the GDN modules its layers come from are
            patched and its attention implementation is set to ``"aura"``; None patches every
            GDN model module transformers has and only registers ``"aura"`` (select it with
            ``attn_implementation="aura"`` when loading).
        gdn: route ``chunk_gated_delta_rule`` / ``fused_recurrent_gated_delta_rule``.
        attention: register (and, with a model, select) the ``"aura"`` attention.

    Returns:
        ``{"gdn": [patched module names], "attention": "aura" or None}``.

    Raises:
        ValueError: the model cannot take what was asked (no AttentionInterface routing, an
            attention head dim ``flash_decode`` lacks, GDN head dims over 256, or ``attention=False``
            on a model without GDN layers); names what is supported.
    """
    if model is not None and attention:
        _check_attention(model)  # before the GDN patch, which checks its own inputs first
    if model is not None and not attention and not _gdn.modules_of(model):
        raise ValueError(f"enable(attention=False): {type(model).__name__} has no gated delta rule "
                         f"layers; models that have them: {sorted(_gdn.discover())}")
    patched = _gdn.patch(model=model) if gdn else []
    if attention:
        _attention.register()
        if model is not None:
            model.set_attn_implementation(_attention.NAME)
    return {"gdn": patched, "attention": _attention.NAME if attention else None}


def disable(model=None, attn_implementation: str = "sdpa") -> None:
    """Undo :func:`enable`: restore transformers' GDN functions and, given a model, set its
    attention implementation back to ``attn_implementation``."""
    _gdn.unpatch()
    if model is not None:
        model.set_attn_implementation(attn_implementation)
