"""``AuraKVCache``: a transformers ``Cache`` whose attention layers hold K/V AURA-compressed.

Each full-attention layer is an :class:`AuraKVLayer` that owns one contiguous
:class:`torch_aura.AuraCache` (``[B, Hkv, T_cap, PW]`` codes + fp32 norms); linear-attention
(GDN) layers keep transformers' own ``LinearAttentionLayer``, so a hybrid model such as Qwen3-Next
carries its recurrent state beside the compressed attention layers.

How a forward step runs (with ``attn_implementation="aura"``):

- ``cache.update`` records the new K/V and puts the layer in the ``kwargs`` dict that
  transformers then passes to the attention function, which calls :meth:`AuraKVLayer.attend`.
- The first step (prefill) attends exactly, by SDPA over the new K/V with the mask, then
  compresses them. Padded rows store only their real tokens (read off the mask), so each row is
  compact: its tokens sit at slots ``[0, seq_len)`` and later steps need no mask.
- Every later step appends its tokens compressed and attends in the compressed domain through
  :func:`torch_aura.aura_decode` (one query: split-K decode; several: the causal form). The cache
  is never dequantized as a whole.

Capacity grows by doubling (a copy of the compressed bytes, amortised); pass ``max_cache_len`` to
allocate once. The contiguous layout, not the paged one, because paged decode reads norms 32 bytes
apart and runs ~30% slower (benchmarks/results/aura_h100.md).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, LinearAttentionLayer

from ...aura_cache import AuraCache, parse_scheme
from ..._checks.aura import HEAD_DIMS as AURA_HEAD_DIMS
from .attention import LAYER_KEY, NAME, head_dim_of, sdpa_attention_forward

_GRANULE = 256  # capacity is a multiple of this many tokens (aura_decode's reference block)


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


class AuraKVLayer(CacheLayerMixin):
    """One full-attention layer's AURA-compressed K/V (see the module docstring).

    Args:
        scheme: ``"aura{kb}v{vb}"`` or ``"aura{b}"`` (bits in {2, 3, 4, 8}).
        layer_idx: the layer's index; with ``seed`` it selects the layer's sign masks.
        seed: seed of the sign masks.
        max_cache_len: tokens per row to allocate at the first write, or None (grow by doubling).
    """

    is_compileable = False
    is_sliding = False
    is_croppable = True
    supports_early_init = False

    def __init__(self, scheme: str, layer_idx: int, seed: int = 0, max_cache_len: int | None = None):
        super().__init__()
        self.scheme, self.layer_idx, self.seed, self.max_cache_len = scheme, layer_idx, seed, max_cache_len
        self.aura: AuraCache | None = None
        self.cumulative_length = 0  # positions seen (padding included): what generate counts
        self._new: tuple[torch.Tensor, torch.Tensor] | None = None

    def __repr__(self):
        return f"AuraKVLayer({self.aura!r})" if self.aura is not None else f"AuraKVLayer({self.scheme!r}, empty)"

    # ------------------------------------------------------------------------------ Cache API
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, Hkv, L, D = key_states.shape
        capacity = self.max_cache_len or _round_up(max(L, 1) + _GRANULE, _GRANULE)
        self.aura = AuraCache(self.scheme, batch=B, kv_heads=Hkv, head_dim=D, capacity=capacity,
                              seed=self.seed, layer=self.layer_idx, device=key_states.device)
        self.device, self.dtype = key_states.device, key_states.dtype
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, kwargs=None, **_):
        """Record the step's K/V ``[B, Hkv, L, D]`` and hand this layer to the attention function.

        Returns ``(key_states, value_states)``: the prefill attends to them exactly; later steps
        ignore them and attend to the compressed cache.
        """
        if kwargs is None:
            raise RuntimeError("AuraKVCache: the model called cache.update without its kwargs dict, so "
                               "the 'aura' attention cannot reach the compressed cache; this model's "
                               "attention is not supported")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._new = (key_states, value_states)
        kwargs[LAYER_KEY] = self
        return key_states, value_states

    def attend(self, module, query: torch.Tensor, attention_mask, scaling, dropout, kwargs) -> torch.Tensor:
        """Store the recorded K/V and attend ``query [B, Hq, L, D]``; returns ``[B, L, Hq, D]``."""
        k, v = self._new
        self._new = None
        L = k.shape[2]
        prefill = self.cumulative_length == 0
        self._reserve(L)
        self.cumulative_length += L
        k_rows, v_rows = k.transpose(1, 2), v.transpose(1, 2)  # [B, L, Hkv, D], AuraCache's layout
        if prefill:
            lengths = None
            if attention_mask is not None:
                # The last query row sees every real key of its row: those are the tokens to keep.
                last = attention_mask[:, 0, -1, :]
                valid = last if last.dtype == torch.bool else last == 0
                lengths = valid.sum(-1, dtype=torch.int32)
            self.aura.append(k_rows, v_rows, lengths=lengths, left_padded=True)
            return sdpa_attention_forward(module, query, k, v, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)[0]
        self.aura.append(k_rows, v_rows)
        q = query[:, :, 0] if L == 1 else query.transpose(1, 2)
        out, _ = self.aura.decode(q, scale=scaling)
        return out.unsqueeze(1) if L == 1 else out

    def _reserve(self, L: int) -> None:
        need = self.cumulative_length + L  # the cache's own upper bound moves with it
        if need > self.aura.capacity:
            self.aura.grow(_round_up(max(need, 2 * self.aura.capacity), _GRANULE))

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cumulative_length + query_length, 0

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        if self.aura is not None:
            self.aura.reset()
        self.cumulative_length = 0
        self._new = None

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` tokens (transformers' negative convention)."""
        if tokens_to_remove > 0:
            raise ValueError(f"AuraKVCache.crop: expected a negative count of tokens to remove, got {tokens_to_remove}")
        n = min(-tokens_to_remove, self.cumulative_length)
        if n and self.aura is not None:
            self.aura.crop(n)
            self.cumulative_length -= n

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.aura is not None:
            self.aura.select_rows(beam_idx.to(self.aura.device, torch.int64))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(torch.as_tensor(indices))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.aura is not None:
            rows = torch.arange(self.aura.batch, device=self.aura.device).repeat_interleave(repeats)
            self.aura.select_rows(rows)

    def offload(self):
        raise NotImplementedError("AuraKVCache does not offload to the CPU: the compressed cache is ~4-8x "
                                  "smaller than the dense one instead")

    prefetch = offload

    @property
    def batch_size(self) -> int:
        return self.aura.batch if self.aura is not None else -1

    # ---------------------------------------------------------------------------- reporting
    def memory_bytes(self) -> int:
        return self.aura.memory_bytes() if self.aura is not None else 0

    def dense_bytes(self, dtype: torch.dtype = torch.bfloat16) -> int:
        return self.aura.dense_bytes(dtype) if self.aura is not None else 0


class AuraKVCache(Cache):
    """A transformers cache that stores every full-attention layer AURA-compressed.

    Pass it to ``generate(..., cache=AuraKVCache(model.config))`` (``past_key_values=`` on older
    5.x) or to a forward call, on a model whose attention implementation is ``"aura"``
    (:func:`torch_aura.integrations.transformers.enable` sets it). Hybrid models keep their
    linear-attention layers' recurrent state in transformers' ``LinearAttentionLayer``.

    Args:
        config: the model's config (its text config's ``layer_types`` picks each layer's kind).
        scheme: ``"aura8"``, ``"aura4"``, ``"aura4v2"``, ... (``"aura{kb}v{vb}"``, bits in {2, 3, 4, 8}).
        seed: seed of the per-layer sign masks.
        max_cache_len: tokens per row to allocate up front, or None to grow by doubling.

    Raises:
        ValueError: an unknown scheme, or a layer type other than full or linear attention.

    Example:
        >>> import torch, transformers, torch_aura.integrations.transformers as tat
        >>> cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64,
        ...     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64)
        >>> model = transformers.LlamaForCausalLM(cfg).eval()
        >>> _ = tat.enable(model)
        >>> cache = tat.AuraKVCache(model.config, scheme="aura8")
        >>> out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, min_new_tokens=4,
        ...                      do_sample=False, cache=cache)
        >>> out.shape, cache.get_seq_length()
        (torch.Size([1, 7]), 6)
    """

    SUPPORTED_LAYER_TYPES = ("full_attention", "linear_attention")

    def __init__(self, config, scheme: str = "aura4v2", seed: int = 0, max_cache_len: int | None = None):
        parse_scheme(scheme)  # names a bad scheme before anything is built
        text = config.get_text_config(decoder=True)
        n = text.num_hidden_layers
        types = list(getattr(text, "layer_types", None) or ["full_attention"] * n)
        bad = sorted({t for t in types if t not in self.SUPPORTED_LAYER_TYPES})
        if bad:
            raise ValueError(f"AuraKVCache: layer types {bad} are not supported; supported: "
                             f"{list(self.SUPPORTED_LAYER_TYPES)}")
        D = head_dim_of(text)
        if "full_attention" in types and D not in AURA_HEAD_DIMS:
            raise ValueError(f"AuraKVCache: attention head_dim {D} is not supported; AURA supports "
                             f"{list(AURA_HEAD_DIMS)} (its Hadamard rotation needs a power of two)")
        layers = [AuraKVLayer(scheme, i, seed, max_cache_len) if t == "full_attention" else LinearAttentionLayer()
                  for i, t in enumerate(types)]
        super().__init__(layers=layers)
        self.scheme, self._text_config = scheme, text

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if self._text_config._attn_implementation != NAME:
            raise ValueError(f"AuraKVCache needs attn_implementation={NAME!r} (its layers attend in the "
                             f"compressed domain), the model uses {self._text_config._attn_implementation!r}: "
                             "call torch_aura.integrations.transformers.enable(model) first")
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    @property
    def aura_layers(self) -> list[AuraKVLayer]:
        return [layer for layer in self.layers if isinstance(layer, AuraKVLayer)]

    def memory_bytes(self) -> int:
        """Bytes held by the compressed K/V of every attention layer (codes + norms)."""
        return sum(layer.memory_bytes() for layer in self.aura_layers)

    def dense_bytes(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes a dense ``dtype`` K/V cache with the same token slots would take."""
        return sum(layer.dense_bytes(dtype) for layer in self.aura_layers)
