"""torch_aura inside Hugging Face transformers (``pip install 'torch_aura[transformers]'``).

- :func:`enable` routes every gated-delta-rule model's GDN layers (found by scanning
  transformers' model sources, no fixed list) to :func:`torch_aura.gdn_chunk` /
  :func:`torch_aura.gdn_recurrent`, and registers the ``"aura"`` attention implementation
  (one-token decode through :func:`torch_aura.flash_decode`, over each row's visible keys where a
  mask is given: left padding, a ``StaticCache``'s unfilled slots, a window; prefill through SDPA
  with its mask). It refuses, before changing anything, a model whose attention ``"aura"``
  would not compute exactly as the model's own SDPA path (``_support.enable_refusals``).
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

import weakref
from typing import NamedTuple

from ._version import SUPPORTED, TESTED, require_transformers

require_transformers()

from . import _support  # noqa: E402
from . import attention as _attention  # noqa: E402
from . import gdn as _gdn  # noqa: E402
from .cache import AuraKVCache, AuraKVLayer  # noqa: E402

__all__ = ["enable", "disable", "AuraKVCache", "AuraKVLayer", "SUPPORTED", "TESTED"]

# What enable()'s GDN patch reaches: module globals, so every model built from those modules.
GDN_SCOPE = "process"


class _Before(NamedTuple):
    """What a model had before enable(): each of its configs' attention implementation (None:
    enable() left attention alone) and the GDN modules enable() patched for it."""

    attention: tuple[tuple[object, str | None], ...] | None
    gdn: tuple[str, ...]


_ENABLED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> _Before


def _configs(model) -> list:
    """Every distinct config of ``model``: its own, its submodels' and their sub-configs."""
    found, todo = {}, [model.config] + [m.config for m in model.modules() if hasattr(m, "config")]
    while todo:
        config = todo.pop()
        if id(config) not in found and hasattr(config, "sub_configs"):
            found[id(config)] = config
            todo += [getattr(config, key, None) for key in config.sub_configs]
    return list(found.values())


def _attention_of(model) -> tuple[tuple[object, str | None], ...]:
    # set_attn_implementation writes this same attribute on each config; reading it back is exact
    return tuple((config, config._attn_implementation_internal) for config in _configs(model))


def enable(model=None, gdn: bool = True, attention: bool = True) -> dict:
    """Route transformers to torch_aura's kernels.

    Everything is checked before anything changes: on error nothing is patched and the model's
    attention implementation is unchanged. :func:`disable` restores what ``model`` had.

    The GDN patch replaces module-level functions of transformers' modeling modules, so it reaches
    every model built from those modules in this process (``"gdn_scope": "process"``), not only
    ``model``; the attention implementation is set on ``model`` alone.

    Args:
        model: a transformers model, or None. Given, the GDN modules its layers come from are
            patched and its attention implementation is set to ``"aura"``; None patches every
            GDN model module transformers has and only registers ``"aura"`` (select it with
            ``attn_implementation="aura"`` when loading).
        gdn: route ``chunk_gated_delta_rule`` / ``fused_recurrent_gated_delta_rule``.
        attention: register (and, with a model, select) the ``"aura"`` attention.

    Returns:
        ``{"gdn": [patched module names], "attention": "aura" or None, "gdn_scope": "process"}``.

    Raises:
        ValueError: the model cannot take what was asked, one sentence per feature with its value,
            what is supported and the alternative: attention not routed through AttentionInterface,
            no attention layer, no SDPA support, soft-capping, attention sinks, sparse attention,
            MLA latents or K/V head dims that differ, encoder-decoder / cross attention, an
            attention argument outside the served set, a head dim ``flash_decode`` lacks, GDN head
            dims over 256, or ``attention=False`` on a model without GDN layers.

    Example:
        >>> import transformers, torch_aura.integrations.transformers as tat
        >>> cfg = transformers.Gemma2Config(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        ...     num_attention_heads=2, num_key_value_heads=1, head_dim=64)   # attention soft-capping
        >>> model = transformers.Gemma2ForCausalLM(cfg)
        >>> try:
        ...     tat.enable(model)
        ... except ValueError as e:
        ...     print(str(e).split(" (")[0])
        enable(): Gemma2ForCausalLM cannot be served: attention soft-capping
        >>> model.config._attn_implementation   # unchanged
        'eager'
    """
    if model is not None:
        has_gdn = bool(_gdn.modules_of(model))
        problems = list(_support.enable_refusals(model, has_gdn).values()) if attention else []
        if not attention and not has_gdn:
            problems.append(f"it has no gated delta rule layers; models that have them: {sorted(_gdn.discover())}.")
        if gdn:
            problems += _gdn.refusals(model)
        if problems:
            raise ValueError(f"enable(): {type(model).__name__} cannot be served: " + " ".join(problems))
    if attention:
        _attention.register()
    before = _attention_of(model) if model is not None and attention else None
    if model is not None and attention:
        model.set_attn_implementation(_attention.NAME)
    try:
        patched = _gdn.patch(model=model) if gdn else []
    except Exception:
        _restore_attention(before)
        raise
    if model is not None:
        patched_for, prior = set(patched), _ENABLED.get(model)
        if prior is not None:  # enabled before: what the model had then is what disable() restores
            before = prior.attention if prior.attention is not None else before
            patched_for |= set(prior.gdn)
        _ENABLED[model] = _Before(before, tuple(sorted(patched_for)))
    return {"gdn": patched, "attention": _attention.NAME if attention else None, "gdn_scope": GDN_SCOPE}


def _restore_attention(before) -> None:
    for config, implementation in before or ():
        config._attn_implementation_internal = implementation


def disable(model=None, attn_implementation: str | None = None) -> None:
    """Undo :func:`enable`.

    Args:
        model: a model passed to :func:`enable`, or None. Given, its configs get back the attention
            implementations they had before ``enable(model)`` (e.g. ``"eager"`` where the model had
            no SDPA) and the GDN modules patched for it are restored; None restores every patched
            GDN module. The GDN functions are module globals, so restoring them affects every model
            of those modules in the process.
        attn_implementation: set this implementation on ``model`` instead of the one it had.
    """
    if model is None:
        _gdn.unpatch()
        return
    before = _ENABLED.pop(model, None)
    if before is not None:
        _gdn.unpatch(before.gdn)
        _restore_attention(before.attention)
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
