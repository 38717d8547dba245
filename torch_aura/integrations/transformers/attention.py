"""The ``"aura"`` attention implementation for transformers models.

Registered under one name in both of transformers' registries (``AttentionInterface`` for the
attention function, ``AttentionMaskInterface`` for its mask: a name unknown to the mask registry
gets no mask at all, which would silently unmask padded batches). What serves a call:

- an :class:`~torch_aura.integrations.transformers.AuraKVCache` layer (it put itself in the
  ``kwargs`` dict that transformers hands to both ``cache.update`` and this function): the layer
  attends, in the compressed domain for every step after the prefill;
- one query token per row and no mask (an unpadded batch): :func:`torch_aura.flash_decode` over
  the cache's ``[B, Hkv, T, D]`` tensors, every row holding T live tokens; on the CPU, grouped-query
  SDPA instead (the G query heads of a KV head as G query rows of one attention: no head repeat),
  which beats both the op there (whose lse this call does not need, and whose checks cost more than
  a 100 us kernel) and transformers' ``enable_gqa`` path (benchmarks/results/cpu_2core.md);
- one query token per row with a boolean mask (a ``StaticCache``, whose K/V span its whole
  capacity; a left-padded batch; a sliding window): ``flash_decode`` over exactly the keys the mask
  lets each row see (:func:`mask_pages`): the cache is viewed in place as pages of one token, each
  row's block table lists its visible tokens in order and ``seq_lens`` counts them. Derived on the
  device from the mask alone (which already holds ``cache_position``'s causal bound, the padding and
  any window), so a compiled step has no host read and no data-dependent branch, and any boolean
  mask, holes included, is served exactly;
- anything else (prefill, a head dim ``flash_decode`` lacks, dropout, a position bias, an additive
  mask): transformers' own SDPA function with the mask, so a mask is never dropped (:func:`sdpa_fallback`:
  on CUDA below 16k query tokens without SDPA's cuDNN backend, which builds a plan for every new length).

So every call equals ``sdpa_attention_forward`` on the same inputs, or raises: an argument SDPA
would drop without computing it (attention sinks, sparse indices; ``_support.REFUSED_ARGUMENTS``)
raises ``ValueError`` instead. ``enable()`` refuses such models before this function is selected.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
# the package's __init__ has checked the transformers version before importing this module
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ... import _env
from ..._checks.decode import SUPPORTED_HEAD_DIMS as DECODE_HEAD_DIMS
from ._support import KEEP_OWN, REFUSED_ARGUMENTS

# The op, not its public wrapper: every backend's kernel checks its inputs, the wrapper would check twice.
flash_decode = torch.ops.aura.flash_decode.default

def grouped_sdpa_decode(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits):
    """``flash_decode``'s call for a batch whose rows all hold every cached token, as one SDPA call
    over the G query heads of each KV head as G query rows: ``(out [B, Hq, D], None)``; no lse."""
    B, Hq, D = q.shape
    Hkv = k_cache.shape[1]
    out = F.scaled_dot_product_attention(q.reshape(B, Hkv, Hq // Hkv, D), k_cache, v_cache, scale=scale)
    return out.reshape(B, Hq, D), None


# SDPA's CUDA backends other than cuDNN, each with the switch a user may have turned off
_NOT_CUDNN = ((SDPBackend.FLASH_ATTENTION, torch.backends.cuda.flash_sdp_enabled),
              (SDPBackend.EFFICIENT_ATTENTION, torch.backends.cuda.mem_efficient_sdp_enabled),
              (SDPBackend.MATH, torch.backends.cuda.math_sdp_enabled))
# Query tokens per row from which the fallback keeps cuDNN (TORCH_AURA_SDPA_CUDNN=auto). cuDNN builds a plan
# at each new sequence length; in the H200 prompt stream (Qwen3-Next, torch 2.11, docs/gdn.md §6.4) a new
# length cost 60-135 ms up to 12k tokens, where cuDNN's kernel saved 27 ms a prompt at 12k, and 12-18 ms at
# 30k, where it saved 150.
CUDNN_FROM_QUERY_TOKENS = 16384


@torch.compiler.assume_constant_result  # host flags and the environment: read once per compiled graph
def sdpa_backends() -> tuple[SDPBackend, ...] | None:
    """The SDPA backends a CUDA call of :func:`sdpa_fallback` chooses from when cuDNN is left out: those
    the user left on, less cuDNN; None where there is nothing to leave out (cuDNN off already, or the
    only backend on)."""
    if not torch.backends.cuda.cudnn_sdp_enabled():
        return None
    return tuple(backend for backend, enabled in _NOT_CUDNN if enabled()) or None


@torch.compiler.assume_constant_result
def cudnn_policy() -> str:
    """``TORCH_AURA_SDPA_CUDNN``: "auto" (cuDNN from :data:`CUDNN_FROM_QUERY_TOKENS`), "0" or "1"."""
    return _env.TORCH_AURA_SDPA_CUDNN


def sdpa_fallback(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, dropout: float, scaling: float | None, **kwargs):
    """transformers' ``sdpa_attention_forward`` (same arguments and result); on CUDA without SDPA's
    cuDNN backend (:func:`sdpa_backends`) unless ``TORCH_AURA_SDPA_CUDNN`` lets it serve this call."""
    backends = None
    if query.device.type == "cuda":
        policy = cudnn_policy()
        if policy == "0" or (policy == "auto" and query.shape[2] < CUDNN_FROM_QUERY_TOKENS):
            backends = sdpa_backends()
    with sdpa_kernel(list(backends)) if backends else contextlib.nullcontext():
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)


def mask_pages(attention_mask: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
    """The keys a one-query boolean mask lets each row see, in ``flash_decode``'s paged form.

    ``key`` / ``value`` ``[B, Hkv, T, D]`` (a static cache's buffers: any strides where a row's
    stride is a whole number of token strides) are viewed in place, never copied, as ``[N, 1, Hkv, D]``
    pages of one token (page ``b * (stride(0) // stride(2)) + t`` is row b's token t, all its heads;
    the view aliases memory, which the kernels only read). A per-row start offset is then a block
    table that starts later, and a mask with holes one that skips them: every mask is exact, where
    ``[start, end)`` ranges would need a schema change (and CUDA and Metal kernel changes) and pages
    of 16 tokens would run past the storage at the last row's end.

    Args:
        attention_mask: bool ``[B or 1, 1, 1, T]``, True where the query sees the key.
        key, value: ``[B, Hkv, T, D]``, one shape and one set of strides.

    Returns:
        ``(k_pages, v_pages [N, 1, Hkv, D], seq_lens [B] int32, block_table [B, T] int32)``, all derived
        on the device (no host read), or None when the layout cannot be viewed so (SDPA then serves).

    Example:
        >>> import torch
        >>> k = v = torch.zeros(2, 1, 4, 64)  # 2 rows of 4 slots: row 1 starts at page 4
        >>> mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 0]], dtype=torch.bool)[:, None, None]
        >>> _, _, seq_lens, block_table = mask_pages(mask, k, v)
        >>> seq_lens.tolist(), block_table[:, :2].tolist()
        ([3, 2], [[0, 1], [5, 6]])
    """
    B, Hkv, T, D = key.shape
    s0, s1, s2 = key.stride()[:3]
    if (value.shape != key.shape or value.stride() != key.stride() or attention_mask.dim() != 4
            or attention_mask.shape[1:] != (1, 1, T) or attention_mask.shape[0] not in (1, B)
            or s2 < 1 or (B > 1 and s0 % s2)):
        return None
    row = s0 // s2 if B > 1 else 0  # pages between two rows' first tokens
    pages = (B - 1) * row + T  # the last row's last token is the last page: the view stays in bounds
    k_pages = key.as_strided((pages, 1, Hkv, D), (s2, s2, s1, 1))
    v_pages = value.as_strided((pages, 1, Hkv, D), (s2, s2, s1, 1))
    live = attention_mask[:, 0, 0].expand(B, T)
    seq_lens = live.sum(-1, dtype=torch.int32)
    # each visible key's place in its row's list; hidden ones go to a spare column, cut off below
    slot = torch.where(live, live.cumsum(-1) - 1, T)
    page = (torch.arange(T, device=key.device) + torch.arange(B, device=key.device)[:, None] * row).int()
    block_table = torch.zeros(B, T + 1, dtype=torch.int32, device=key.device).scatter_(1, slot, page)[:, :T]
    return k_pages, v_pages, seq_lens, block_table


NAME = "aura"
# Key under which an AuraKVCache layer hands itself to the attention function (kwargs dict).
LAYER_KEY = "aura_kv_layer"


def aura_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, attention_mask: torch.Tensor | None,
                           dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """transformers attention function (``attn_implementation="aura"``).

    Args:
        module: the calling attention module (its ``is_causal`` and ``num_key_value_groups`` are
            read by the SDPA fallback).
        query: ``[B, Hq, L, D]``.
        key, value: ``[B, Hkv, T, D]`` as returned by ``cache.update`` (not head-repeated); value's
            head dim may differ from D (then SDPA serves the call).
        attention_mask: the ``"aura"`` mask (SDPA's boolean ``[B, 1, L, T]``) or None.
        dropout: attention dropout (training only; takes the SDPA path).
        scaling: softmax scale, default ``D ** -0.5``.
        **kwargs: transformers' per-call kwargs; may carry an AuraKVCache layer.

    Returns:
        ``(out [B, L, Hq, Dv] in query's dtype, None)``.

    Raises:
        ValueError: ``kwargs`` carries an argument SDPA does not compute (sinks, sparse indices,
            soft-capping), named with its module; nothing is attended.
    """
    refused = [REFUSED_ARGUMENTS[k] + f" ({k})" for k in REFUSED_ARGUMENTS if kwargs.get(k) is not None]
    if refused:
        raise ValueError(f"attn_implementation='aura': {type(module).__name__} asks for {', '.join(refused)}, which "
                         f"SDPA, the base of 'aura', does not compute; {KEEP_OWN}")
    layer = kwargs.pop(LAYER_KEY, None)
    if layer is not None:
        return layer.attend(module, query, key, value, attention_mask, scaling, dropout, kwargs), None
    B, Hq, L, D = query.shape
    if (L == 1 and dropout == 0.0 and kwargs.get("position_bias") is None
            and D in DECODE_HEAD_DIMS and key.shape[-1] == D and value.shape[-1] == D
            and key.stride(-1) == 1 and value.stride(-1) == 1):
        if attention_mask is None:
            decode = grouped_sdpa_decode if query.device.type == "cpu" else flash_decode
            seq_lens = torch.full((B,), key.shape[2], dtype=torch.int32, device=query.device)
            out, _ = decode(query[:, :, 0], key, value, seq_lens, None, scaling, 0)
            return out.unsqueeze(1), None
        paged = mask_pages(attention_mask, key, value) if attention_mask.dtype == torch.bool else None
        if paged is not None:
            out, _ = flash_decode(query[:, :, 0], *paged, scaling, 0)
            return out.unsqueeze(1), None
    return sdpa_fallback(module, query, key, value, attention_mask, dropout, scaling, **kwargs)


def register() -> None:
    """Register ``"aura"`` in transformers' attention and mask registries (idempotent)."""
    AttentionInterface.register(NAME, aura_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
