"""``AuraKVCache``: a transformers ``Cache`` whose attention layers hold K/V AURA-compressed.

Each full-attention layer is an :class:`AuraKVLayer` that owns one contiguous
:class:`torch_aura.AuraCache` (``[B, Hkv, T_cap, PW]`` codes + fp32 norms). Every other layer keeps
the layer transformers' own ``DynamicCache`` would give it, read from the same
``get_layer_types_and_kwargs``: linear-attention (GDN, conv) layers their ``LinearAttentionLayer``,
so a hybrid model such as Qwen3-Next carries its recurrent state beside the compressed layers;
sliding-window and chunked layers their dense ``DynamicSlidingWindowLayer``, which holds only the
window (compressed instead when ``max_cache_len <= window``: no row can then leave the window).

How a forward step runs (with ``attn_implementation="aura"``):

- ``cache.update`` records the new K/V and puts the layer in the ``kwargs`` dict that
  transformers then passes to the attention function, which calls :meth:`AuraKVLayer.attend`.
  Contract relied on (transformers 5.x attention modules): ``cache.update(k, v, layer_idx,
  kwargs=kwargs)`` then ``attention_interface(..., **kwargs)`` with the same dict.
- The first step (prefill) attends exactly, by SDPA over the new K/V with the mask, then
  compresses them. Left-padded rows store only their real tokens (read off the mask), so each row
  is compact: its tokens sit at slots ``[0, seq_len)`` and later steps need no mask.
- Every later step appends its tokens compressed and attends in the compressed domain through
  :func:`torch_aura.aura_decode` (one query: split-K decode; several: the causal form). The cache
  is never dequantized as a whole.

The cache checks the model that uses it, not the config it was built from: a layer whose
recorded K/V were not attended by ``"aura"`` before its next update, a model whose attention is no
longer ``"aura"``, or a model of another depth or layer layout raises ``ValueError`` before that
step attends (another attention function would attend the new tokens alone).

Capacity grows by doubling (a copy of the compressed bytes, amortised); ``max_cache_len``
allocates once and is a hard limit. The contiguous layout, not the paged one, because paged decode
reads norms 32 bytes apart and runs ~30% slower (benchmarks/results/aura_h100.md).

With ``max_cache_len`` the layers are *static*, as transformers' ``StaticLayer``: their tensors are
allocated once and marked as static addresses, the length is a device tensor advanced in place, and
the attention mask spans ``max_cache_len``, so a compiled decode step (``torch.compile(model.forward)``,
CUDA graphs included) traces once and never again; what changes from step to step lives on the
device. The host-side length check then runs in eager steps only (a compiled step cannot read the
device): keep generation within ``max_cache_len``.
"""

from __future__ import annotations

import numbers

import torch
from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, STATIC_LAYER_TYPE_MAPPING, Cache, CacheLayerMixin
from transformers.cache_utils import get_layer_types_and_kwargs

from ...aura_cache import AuraCache, _check_schemes
from . import _support
from .attention import LAYER_KEY, NAME, sdpa_fallback

_GRANULE = 256  # capacity is a multiple of this many tokens (aura_decode's reference block)
_AUTO_QUERIES = 32  # the prefill's last queries that scheme="auto" measures each head with
_PREFILL_ROLLBACK = 64  # rollback slots a recorded prefill keeps: assisted generation's first drafts ride on it
# longest chunk over an exact window attended one token at a time (draft verification); a longer one (a
# compressed prefill, a new chat turn) takes one launch with the chunk's final window, not L decode steps
_STEPWISE_MAX = 64
_ENABLE = "call torch_aura.integrations.transformers.enable(model) first"


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _check_int(name: str, value, low: int, high: int | None = None, none_ok: bool = False) -> None:
    """``value`` is an int in ``[low, high)`` (or None when ``none_ok``), else a ValueError naming it."""
    if value is None and none_ok:
        return
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low or (high and value >= high):
        span = f">= {low}" if high is None else f"in [{low}, {high})"
        raise ValueError(f"AuraKVCache: {name} must be an int {span}{' or None' if none_ok else ''}, got {value!r}")


class _Layout:
    """The layer types a cache was built for, checked once against each config that calls it."""

    def __init__(self, layer_types: tuple[str, ...]):
        self.layer_types, self._seen = layer_types, set()

    def check(self, config) -> None:
        if config is None or id(config) in self._seen:
            return
        theirs = tuple(get_layer_types_and_kwargs(_support.text_config(config))[0])
        if theirs != self.layer_types:
            raise ValueError(f"AuraKVCache was built for {len(self.layer_types)} layers {list(self.layer_types)}; the "
                             f"model calling it has {len(theirs)} layers {list(theirs)}: build the cache from that "
                             "model's config, AuraKVCache(model.config)")
        self._seen.add(id(config))


class AuraKVLayer(CacheLayerMixin):
    """One attention layer's AURA-compressed K/V (see the module docstring).

    Args:
        scheme: ``"aura{kb}v{vb}"`` or ``"aura{b}"`` (bits in {2, 3, 4, 8}).
        layer_idx: the layer's index; with ``seed`` it selects the layer's sign masks.
        seed: seed of the sign masks.
        max_cache_len: tokens per row allocated at the first write and never exceeded, or None
            (grow by doubling).
        sink_tokens, recent_tokens: the first / last tokens of each row kept exact in the model's
            dtype (:class:`torch_aura.AuraCache`).
        bits_per_coordinate, candidates: the budget and choices of ``scheme="auto"`` (or a per-head
            list as ``scheme``), as :class:`torch_aura.AuraCache`.
        exact_prefill: the prefill attends its own K/V exactly (SDPA); False: through the
            compressed cache like every later chunk, so the output does not depend on how the
            tokens were chunked (assisted generation then equals greedy decoding token for token).
        _layout: the owning :class:`AuraKVCache`'s layer layout, checked against each model that
            attends through this layer (None: a layer used on its own, unchecked).
    """

    is_sliding = False
    is_croppable = True
    supports_early_init = False

    def __init__(self, scheme, layer_idx: int, seed: int = 0, max_cache_len: int | None = None,
                 _layout: _Layout | None = None, sink_tokens: int = 0, recent_tokens: int = 0,
                 bits_per_coordinate: float | None = None, candidates=None, exact_prefill: bool = True):
        super().__init__()
        self.scheme, self.layer_idx, self.seed, self.max_cache_len = scheme, layer_idx, seed, max_cache_len
        self.sink_tokens, self.recent_tokens = sink_tokens, recent_tokens
        self.bits_per_coordinate, self.candidates, self.exact_prefill = bits_per_coordinate, candidates, exact_prefill
        self.record_past = False  # transformers' rollback request (assisted generation): see activate_past_recording
        self.aura: AuraCache | None = None
        self.is_compileable = max_cache_len is not None  # static: see the module docstring
        # positions seen (padding included), what generate counts: a device tensor when static
        self.cumulative_length: int | torch.Tensor = 0
        self._filled = False  # the prefill has run: a host flag, constant over compiled decode steps
        self._new: tuple[torch.Tensor, torch.Tensor] | None = None
        self._config = None  # the config of the module that last attended: its implementation must stay "aura"
        self._layout = _layout

    def __repr__(self):
        return f"AuraKVLayer({self.aura!r})" if self.aura is not None else f"AuraKVLayer({self.scheme!r}, empty)"

    # ------------------------------------------------------------------------------ Cache API
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        B, Hkv, L, D = key_states.shape
        capacity = self.max_cache_len or _round_up(max(L, 1) + _GRANULE, _GRANULE)
        self.aura = AuraCache(self.scheme, batch=B, kv_heads=Hkv, head_dim=D, capacity=capacity,
                              seed=self.seed, layer=self.layer_idx, device=key_states.device,
                              sink_tokens=self.sink_tokens, recent_tokens=self.recent_tokens,
                              dtype=key_states.dtype, bits_per_coordinate=self.bits_per_coordinate,
                              candidates=self.candidates)
        self.device, self.dtype = key_states.device, key_states.dtype
        if self.is_compileable:
            self.cumulative_length = torch.zeros((), dtype=torch.int64, device=key_states.device)
        self._mark_static()
        self.is_initialized = True

    def _mark_static(self) -> None:
        """Mark a static layer's tensors as fixed data pointers: a compiled step mutates them in place,
        and CUDA graphs keep them (again after a row reorder, which makes new tensors)."""
        if self.is_compileable and not torch.compiler.is_compiling():  # (a traced prefill cannot mark)
            for t in (*self.aura.static_tensors(), self.cumulative_length):
                torch._dynamo.mark_static_address(t)

    def _length(self) -> int:
        """Positions seen, as a host int (one device read for a static layer; eager steps only)."""
        return int(self.cumulative_length)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, kwargs=None, **_):
        """Record the step's K/V ``[B, Hkv, L, D]`` and hand this layer to the attention function.

        Returns ``(key_states, value_states)``: the prefill attends to them exactly; later steps
        ignore them and attend to the compressed cache.

        Raises:
            ValueError: before anything changes, when the previous step's K/V were not attended by
                ``"aura"`` (the calling model is not on it), the model that attended last has left
                ``"aura"``, the shapes do not match the rows held (a new batch needs ``reset()``),
                or ``max_cache_len`` would be exceeded.
        """
        where = f"AuraKVCache layer {self.layer_idx}"
        if kwargs is None:
            raise ValueError(f"{where}: the model called cache.update without its kwargs dict, so the 'aura' "
                             f"attention cannot reach the compressed cache; {_support.USE_DYNAMIC}")
        if self._new is not None:
            raise ValueError(f"{where}: the K/V of the previous step were never attended by attn_implementation="
                             f"{NAME!r}: the model calling this cache attends with another implementation, which "
                             f"would see only the new tokens. {_ENABLE}, then reset() the cache")
        implementation = getattr(self._config, "_attn_implementation", NAME)
        if implementation != NAME:
            raise ValueError(f"{where}: the model that filled this cache now runs attn_implementation="
                             f"{implementation!r}, which would attend the new tokens alone; {_ENABLE}, or reset() "
                             f"the cache (or use transformers' DynamicCache)")
        B, Hkv, L, D = key_states.shape
        if value_states.shape[:-1] != key_states.shape[:-1] or value_states.shape[-1] != D:
            raise ValueError(f"{where}: K {tuple(key_states.shape)} and V {tuple(value_states.shape)} must share one "
                             f"shape (one head dim for K and V); {_support.USE_DYNAMIC}")
        a = self.aura
        held = None if a is None else (a.batch, a.kv_heads, a.head_dim, a.device)
        if held != (B, Hkv, D, key_states.device):
            if self._filled:
                raise ValueError(f"{where}: holds {held[0]} rows of {held[1]} KV heads x {held[2]} on {held[3]}; this "
                                 f"step has {B} x {Hkv} x {D} on {key_states.device}: reset() the cache for a new "
                                 "batch (or batch_select_indices / reorder_cache to change its rows)")
            self.lazy_initialization(key_states, value_states)  # the first step, or a new batch after reset()
        if (self.max_cache_len is not None and not torch.compiler.is_compiling()
                and self._length() + L > self.max_cache_len):
            raise ValueError(f"{where}: max_cache_len={self.max_cache_len} tokens per row, this step needs "
                             f"{self._length() + L}: pass a larger max_cache_len, or None to grow")
        self._new = (key_states, value_states)
        kwargs[LAYER_KEY] = self
        return key_states, value_states

    def attend(self, module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, scaling,
               dropout, kwargs) -> torch.Tensor:
        """Store the recorded K/V and attend ``query [B, Hq, L, D]``; returns ``[B, L, Hq, D]``.

        ``key`` and ``value`` must be the tensors :meth:`update` returned: the compressed cache
        attends what it recorded, so a model that changes them in between would be misread.

        Raises:
            ValueError: the model changed K/V between ``cache.update`` and attention, or calls
                attention twice per update (DiffLlama); it has another layer layout than the cache;
                dropout (training); a model-built additive mask or a position bias, or a mask other
                than left padding, which the compressed cache cannot apply.
        """
        recorded, self._new = self._new, None
        name = type(module).__name__
        if recorded is None or key is not recorded[0] or value is not recorded[1]:
            raise ValueError(f"AuraKVCache: {name} changes K/V between cache.update and attention, or attends twice "
                             "per update (as DiffLlama's split V does), and the compressed cache attends what it "
                             f"recorded; {_support.USE_DYNAMIC}")
        config = getattr(module, "config", None)
        if self._layout is not None:
            self._layout.check(config)
        self._config = config
        if dropout:
            raise ValueError(f"AuraKVCache: attention dropout {dropout} (training mode) is not supported: call "
                             "model.eval(), or use transformers' DynamicCache for training")
        if attention_mask is not None and attention_mask.dtype != torch.bool:
            raise ValueError(f"AuraKVCache: {name} builds its own additive attention mask ({attention_mask.dtype}; "
                             "'aura' makes boolean ones), which the compressed decode cannot apply; "
                             f"{_support.USE_DYNAMIC}")
        k, v = recorded
        L = k.shape[2]
        prefill = not self._filled
        if prefill:
            lengths = None if attention_mask is None else _left_padded_lengths(attention_mask)
        elif kwargs.get("position_bias") is not None:
            raise ValueError(f"AuraKVCache: {name} adds a position bias to the attention scores, which the "
                             f"compressed-domain decode cannot apply; {_support.USE_DYNAMIC}")
        elif L > 1 and attention_mask is not None:
            _check_chunk_mask(attention_mask, self.aura.seq_lens, L)
        if self.is_compileable:
            self.cumulative_length.add_(L)  # in place: its address is static
        else:
            self._reserve(L)
            self.cumulative_length += L
        self._filled = True
        k_rows, v_rows = k.transpose(1, 2), v.transpose(1, 2)  # [B, L, Hkv, D], AuraCache's layout
        if self.record_past and not torch.compiler.is_compiling():  # a crop of this chunk's tokens must restore the window
            self.aura.reserve_rollback(min(L, _PREFILL_ROLLBACK) if prefill else L)
        if prefill and self.exact_prefill:
            self._append_prefill(query, k_rows, v_rows, lengths, scaling)
            return sdpa_fallback(module, query, k, v, attention_mask, dropout, scaling, **kwargs)[0]
        if 1 < L <= _STEPWISE_MAX and self.aura.windowed:
            return self._attend_token_by_token(query, k_rows, v_rows, lengths if prefill else None, scaling)
        if prefill:
            self._append_prefill(query, k_rows, v_rows, lengths, scaling)
        else:
            self.aura.append(k_rows, v_rows)
        q = query[:, :, 0] if L == 1 else query.transpose(1, 2)
        out, _ = self.aura.decode(q, scale=scaling)
        return out.unsqueeze(1) if L == 1 else out

    def _append_prefill(self, query, k_rows, v_rows, lengths, scaling) -> None:
        """The prefill's K/V into the cache, with the last queries ``scheme="auto"`` measures heads with."""
        self.aura.append(k_rows, v_rows, lengths=lengths, left_padded=True, queries=_last_queries(query),
                         query_scale=scaling)
        self._mark_static()  # "auto" allocates its stores here

    def _attend_token_by_token(self, query, k_rows, v_rows, lengths, scaling) -> torch.Tensor:
        """A chunk of at most ``_STEPWISE_MAX`` tokens over an exact window, one decode step per token:
        each query sees the window it would have seen had its tokens come one at a time (the cache's
        own causal form attends the chunk's final window), so verified drafts match greedy decoding."""
        L = k_rows.shape[1]
        if self.aura.schemes is None:  # "auto" chooses from the whole chunk first
            self.aura.choose_schemes(k_rows, v_rows, _last_queries(query), scaling, lengths, left_padded=True)
            self._mark_static()
        outs = []
        for i in range(L):
            real = None if lengths is None else (lengths > L - 1 - i).to(torch.int32)  # left padding: the last n are real
            self.aura.append(k_rows[:, i:i + 1], v_rows[:, i:i + 1], lengths=real)
            outs.append(self.aura.decode(query[:, :, i], scale=scaling)[0])
        return torch.stack(outs, 1)

    def activate_past_recording(self) -> None:
        """transformers' request before assisted generation: the next ``crop`` must undo a whole
        chunk, so the exact window keeps that many spare ring slots (no-op without a window)."""
        self.record_past = True

    def _reserve(self, L: int) -> None:
        need = self.cumulative_length + L  # the cache's own upper bound moves with it
        if need > self.aura.capacity:
            self.aura.grow(_round_up(max(need, 2 * self.aura.capacity), _GRANULE))

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.is_compileable and self._filled:
            return self.max_cache_len, 0  # one mask shape for every decode step: nothing to retrace
        return (self._length() if self.is_compileable else self.cumulative_length) + query_length, 0

    def get_seq_length(self) -> int | torch.Tensor:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return self.max_cache_len or -1

    def reset(self) -> None:
        """Forget every token; the allocation is kept and reused when the next batch has its shape."""
        if self.aura is not None:
            self.aura.reset()
        if isinstance(self.cumulative_length, torch.Tensor):
            self.cumulative_length.zero_()
        else:
            self.cumulative_length = 0
        self._filled = False
        self._new = self._config = None

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` tokens (transformers' negative convention)."""
        if tokens_to_remove > 0:
            raise ValueError(f"AuraKVCache.crop: expected a negative count of tokens to remove, got {tokens_to_remove}")
        n = min(-tokens_to_remove, self._length())
        if n and self.aura is not None:
            self.aura.crop(n)
            self.cumulative_length -= n  # in place for a static layer's tensor

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.aura is not None and self._filled:
            self.aura.select_rows(beam_idx.to(self.aura.device, torch.int64))
            self._mark_static()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.reorder_cache(torch.as_tensor(indices))

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.aura is not None and self._filled:
            rows = torch.arange(self.aura.batch, device=self.aura.device).repeat_interleave(repeats)
            self.aura.select_rows(rows)
            self._mark_static()

    def offload(self):
        raise NotImplementedError("AuraKVCache does not offload to the CPU: the compressed cache is ~4-8x "
                                  "smaller than the dense one instead")

    prefetch = offload

    @property
    def batch_size(self) -> int:
        return self.aura.batch if self.aura is not None else -1

    # ---------------------------------------------------------------------------- reporting
    @property
    def schemes(self) -> list[str] | None:
        """The scheme of each KV head, once the first step allocated the layer (``"auto"`` chooses then)."""
        return None if self.aura is None else self.aura.schemes

    def bytes_per_token(self) -> int:
        return self.aura.bytes_per_token() if self.aura is not None and self.aura.schemes else 0

    def memory_bytes(self) -> int:
        return self.aura.memory_bytes() if self.aura is not None else 0

    def dense_bytes(self, dtype: torch.dtype = torch.bfloat16) -> int:
        return self.aura.dense_bytes(dtype) if self.aura is not None else 0


def _other_layer(spec: _support.LayerSpec, max_cache_len: int | None) -> CacheLayerMixin:
    """The layer transformers' own cache gives a layer AuraKVCache does not compress: ``DynamicCache``'s,
    or with ``max_cache_len`` ``StaticCache``'s (a dense window then keeps static buffers too, so the
    whole cache compiles)."""
    if max_cache_len is None:
        return DYNAMIC_LAYER_TYPE_MAPPING[spec.layer_type](**spec.kwargs)
    extra = {"max_cache_len": max_cache_len} if spec.kind == "window" else {}
    return STATIC_LAYER_TYPE_MAPPING[spec.layer_type](**spec.kwargs, **extra)


def _layer_schemes(scheme, n_layers: int, bits_per_coordinate, candidates) -> list:
    """One entry per layer (a scheme, "auto" or a per-head list), each checked before anything is built."""
    per_layer = list(scheme) if isinstance(scheme, (list, tuple)) else [scheme] * n_layers
    if len(per_layer) != n_layers:
        raise ValueError(f"AuraKVCache: scheme: expected a scheme, 'auto', or one entry per layer ({n_layers}), "
                         f"got {len(per_layer)} entries")
    if bits_per_coordinate is not None and "auto" not in per_layer:
        raise ValueError("AuraKVCache: bits_per_coordinate is the budget of scheme='auto' layers; none is 'auto'")
    for one in per_layer:
        try:
            auto = one == "auto"
            _check_schemes(one, len(one) if isinstance(one, (list, tuple)) else 1,
                           bits_per_coordinate if auto else None, candidates if auto else None)
        except ValueError as e:
            raise ValueError(f"AuraKVCache: {e}") from None
    return per_layer


def _last_queries(query: torch.Tensor) -> torch.Tensor:
    """A chunk's last ``_AUTO_QUERIES`` queries ``[B, Lq, Hq, D]`` (from transformers' ``[B, Hq, L, D]``)."""
    return query[:, :, -min(query.shape[2], _AUTO_QUERIES):].transpose(1, 2)


def _left_padded_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """Real tokens per row of a prefill, ``[B]`` int32; raises unless each row's real tokens come last.

    One host read of the mask: a right-padded row would otherwise store its padding as tokens.
    """
    last = attention_mask[:, 0, -1, :]  # the last query sees every real key of its row
    T = last.shape[-1]
    lengths = last.sum(-1, dtype=torch.int32)
    expected = torch.arange(T, device=last.device)[None, :] >= (T - lengths)[:, None]
    if not torch.equal(last, expected):
        raise ValueError("AuraKVCache: the prefill's mask is not left padding (each row's real tokens last), so "
                         "its rows cannot be stored compact; pad on the left (tokenizer padding_side='left'), or "
                         f"{_support.USE_DYNAMIC}")
    return lengths


def _check_chunk_mask(attention_mask: torch.Tensor, seq_lens: torch.Tensor, L: int) -> None:
    """A later chunk of L tokens (assisted decoding, a continued prompt) must see each row's
    ``seq_lens`` cached tokens and itself causally: what the compressed cache attends without a
    mask. One host read."""
    seen = attention_mask[:, 0].sum(-1)  # [B, L] keys each query sees
    expected = seq_lens[:, None].to(seen.dtype) + 1 + torch.arange(L, device=seen.device)[None, :]
    if not torch.equal(seen, expected):
        raise ValueError(f"AuraKVCache: a chunk of {L} new tokens comes with padding or a mask the compressed cache "
                         f"cannot apply (it attends each row's cached tokens and the chunk causally); "
                         f"{_support.USE_DYNAMIC}")


class AuraKVCache(Cache):
    """A transformers cache that stores every full-attention layer AURA-compressed.

    Pass it to ``generate(..., cache=AuraKVCache(model.config))`` (``past_key_values=`` on older
    5.x) or to a forward call, on a model whose attention implementation is ``"aura"``
    (:func:`torch_aura.integrations.transformers.enable` sets it). Layers it does not compress keep
    the layer ``DynamicCache`` would give them: linear attention its recurrent state, sliding windows
    and chunked attention their dense window (compressed too when ``max_cache_len`` fits the window).

    Args:
        config: the model's config, whose text config's layer types (transformers'
            ``get_layer_types_and_kwargs``) pick each layer's kind; or the model itself, which also
            refuses at construction what ``enable()`` refuses (from a config alone, such a model is
            refused at its first decode step: it cannot be on ``"aura"``).
        scheme: ``"aura8"``, ``"aura4"``, ``"aura4v2"``, ... (``"aura{kb}v{vb}"``, bits in {2, 3, 4, 8});
            ``"auto"``: each layer chooses each KV head's scheme from its prefill (the last 32
            queries against the prompt, :func:`torch_aura.aura_cache.plan_schemes`) within
            ``bits_per_coordinate``; or a list with one entry per model layer (entries of layers
            it does not compress are ignored), each a scheme, ``"auto"``, or a list of one scheme
            per KV head.
        bits_per_coordinate: the byte budget of ``"auto"`` layers, mean bits per K/V coordinate
            (codes + norms; ``"aura4"`` is 4.25 at head dim 128).
        candidates: the schemes ``"auto"`` chooses from (default ``AUTO_CANDIDATES``).
        seed: seed of the per-layer sign masks, an int in ``[0, 2**64)``.
        max_cache_len: tokens per row allocated up front and never exceeded (a step past it raises
            before anything changes), or None to grow by doubling.
        sink_tokens: the first tokens of each row kept exact in the model's dtype (attention
            sinks); recommended 4 (benchmarks/results/aura_quality_cpu.md, aura-format.md §14).
        recent_tokens: the last tokens of each row kept exact, a ring buffer (local heads);
            recommended 64-128 (docs/aura-quality.md). Default 0 and 0: every token compressed, so
            the cache's bytes are its scheme's. Under assisted generation (transformers' past recording) the
            ring keeps as many spare slots as the last chunk had tokens, so rejected drafts are
            cropped without shortening the window.
        exact_prefill: True: the prefill attends exactly (SDPA); False: through the compressed
            cache, so every token sees the same cache however the sequence was chunked and
            assisted generation returns greedy decoding's tokens exactly (docs/aura-quality.md).

    Attributes:
        layout: one ``_support.LayerSpec`` per layer: ``kind`` ``"aura"`` (compressed),
            ``"window"`` (dense sliding window), ``"linear"`` or ``"dummy"``.
        schemes: per layer, its KV heads' schemes (None for a layer not compressed or not yet
            filled); ``bytes_per_token()``: compressed bytes one token of one row costs.

    Raises:
        ValueError: a bad argument (scheme, seed, max_cache_len, a config that is not a transformers
            config), or a model it cannot hold, all named in one message with the alternative:
            soft-capping, MLA or K/V head dims that differ, encoder-decoder / cross attention, KV
            sharing, a layer type other than full, sliding, chunked or linear attention, a head dim
            AURA lacks, or no layer to compress (every attention layer slides past
            ``max_cache_len``).

    Example:
        >>> import torch, transformers, torch_aura.integrations.transformers as tat
        >>> cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64,
        ...     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64)
        >>> model = transformers.LlamaForCausalLM(cfg).eval()
        >>> _ = tat.enable(model)
        >>> cache = tat.AuraKVCache(model.config, scheme="aura8")
        >>> out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, min_new_tokens=4,
        ...                      do_sample=False, cache=cache)
        >>> out.shape, cache.get_seq_length(), [spec.kind for spec in cache.layout]
        (torch.Size([1, 7]), 6, ['aura', 'aura'])
    """

    def __init__(self, config, scheme="aura4v2", seed: int = 0, max_cache_len: int | None = None,
                 sink_tokens: int = 0, recent_tokens: int = 0, bits_per_coordinate: float | None = None,
                 candidates=None, exact_prefill: bool = True):
        model = config if isinstance(config, torch.nn.Module) else None
        config = getattr(model, "config", config)
        if not callable(getattr(config, "get_text_config", None)):
            raise ValueError("AuraKVCache: config must be a transformers PretrainedConfig (model.config) or model, "
                             f"got {type(config).__name__}")
        _check_int("seed", seed, 0, 2 ** 64)
        _check_int("max_cache_len", max_cache_len, 1, none_ok=True)
        _check_int("sink_tokens", sink_tokens, 0)
        _check_int("recent_tokens", recent_tokens, 0)
        specs, problems = _support.cache_layout(config, max_cache_len, model)
        if problems:
            raise ValueError(f"AuraKVCache cannot hold {type(config).__name__}: " + " ".join(problems.values()))
        per_layer = _layer_schemes(scheme, len(specs), bits_per_coordinate, candidates)
        layout = _Layout(tuple(s.layer_type for s in specs))
        layers = [AuraKVLayer(per_layer[i], i, seed, max_cache_len, layout, sink_tokens, recent_tokens,
                              bits_per_coordinate if per_layer[i] == "auto" else None,
                              candidates if per_layer[i] == "auto" else None, exact_prefill)
                  if s.kind == "aura" else _other_layer(s, max_cache_len) for i, s in enumerate(specs)]
        super().__init__(layers=layers)
        self.scheme, self.layout = scheme, tuple(specs)
        self.sink_tokens, self.recent_tokens = sink_tokens, recent_tokens

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if not 0 <= layer_idx < len(self.layers) or self.layout[layer_idx].kind not in ("aura", "window"):
            kinds = [s.layer_type for s in self.layout]
            raise ValueError(f"AuraKVCache: the model writes attention K/V to layer {layer_idx}, but the cache was "
                             f"built for {len(kinds)} layers {kinds}: build it from the calling model's config, "
                             "AuraKVCache(model.config)")
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    @property
    def aura_layers(self) -> list[AuraKVLayer]:
        return [layer for layer in self.layers if isinstance(layer, AuraKVLayer)]

    @property
    def schemes(self) -> list[list[str] | None]:
        """Per layer, the scheme of each KV head (None: a layer not compressed, or not filled yet)."""
        return [layer.schemes if isinstance(layer, AuraKVLayer) else None for layer in self.layers]

    def bytes_per_token(self) -> int:
        """Compressed bytes one token of one row costs over every filled compressed layer (K and V
        codes + norms; exact sinks/window not included)."""
        return sum(layer.bytes_per_token() for layer in self.aura_layers)

    def memory_bytes(self) -> int:
        """Bytes held by the compressed K/V of every compressed layer (codes + norms)."""
        return sum(layer.memory_bytes() for layer in self.aura_layers)

    def dense_bytes(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes a dense ``dtype`` K/V cache with the compressed layers' token slots would take."""
        return sum(layer.dense_bytes(dtype) for layer in self.aura_layers)

