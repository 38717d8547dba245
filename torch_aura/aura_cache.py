"""``AuraCache``: one attention layer's AURA-compressed KV cache (aura-format.md §7-§8).

It owns what the ops would otherwise need fifteen arguments for: the scheme's bit widths, the
per-D codebooks and boundaries, the layer's K and V sign masks (seed, layer), the code and norm
tensors, and the device-side ``seq_lens``. A model needs three calls: construct, ``append``,
``decode``.
"""

from __future__ import annotations

import numbers
import re
from typing import NamedTuple

import torch

from ._checks import common as _c
from ._checks.aura import BITS, HEAD_DIMS, packed_words
from .reference import aura as _ref

_SCHEME = re.compile(r"^aura(\d)(?:v(\d))?$")


def parse_scheme(scheme: str) -> tuple[int, int]:
    """``"aura4v2"`` -> (4, 2); ``"aura4"`` -> (4, 4). Raises ``ValueError`` naming ``scheme``."""
    match = _SCHEME.match(scheme) if isinstance(scheme, str) else None
    kb = int(match.group(1)) if match else None
    vb = int(match.group(2) or match.group(1)) if match else None
    if kb not in BITS or vb not in BITS:
        raise ValueError(f"scheme: expected 'aura{{kb}}v{{vb}}' or 'aura{{b}}' with bits in {list(BITS)} "
                         f"(e.g. 'aura4v2', 'aura8v4'), got {scheme!r}")
    return kb, vb


class AuraTables(NamedTuple):
    """What encoding and attention need besides the codes: per-bits codebooks and boundaries, and
    the layer's K and V sign masks."""

    k_codebook: torch.Tensor
    k_boundaries: torch.Tensor
    v_codebook: torch.Tensor
    v_boundaries: torch.Tensor
    k_sign_mask: torch.Tensor
    v_sign_mask: torch.Tensor


def aura_tables(key_bits: int, value_bits: int, head_dim: int, seed: int, layer: int, device) -> AuraTables:
    """The tables of one layer (sign masks of ``(seed, layer)``), on ``device``."""
    from .ops.aura import aura_codebook, aura_sign_mask

    return AuraTables(*aura_codebook(key_bits, head_dim, device), *aura_codebook(value_bits, head_dim, device),
                      aura_sign_mask(head_dim, seed, layer, "k", device),
                      aura_sign_mask(head_dim, seed, layer, "v", device))


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _as_int(v):
    """NumPy (or any numbers.Integral) integers as Python ints; anything else unchanged for the checks."""
    return int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v


class AuraCache:
    """One attention layer's compressed KV cache, contiguous or paged.

    Keys use ``key_bits`` and values ``value_bits`` per coordinate plus one fp32 norm per
    token-head; each has its own codebook and sign mask (K: ``kind="k"``, V: ``kind="v"`` of
    ``(seed, layer)``). Tensors live on ``device``; ``decode`` and a contiguous cache's ``append``
    never synchronise with the host (slots are computed on the device from ``seq_lens``), so both
    can be captured in a CUDA graph. A paged ``append`` reads the pages it writes once on the host
    to refuse an unallocated (-1) page before anything changes (skipped under graph capture).

    Sequences may hold different lengths: ``append(k, v, lengths)`` appends ``lengths[b]`` tokens
    of a padded chunk to row b (right- or left-padded). A contiguous cache also serves a
    generation loop's bookkeeping: ``select_rows`` (beam reorder, batch selection, repeat),
    ``crop`` (drop trailing tokens) and ``grow`` (more capacity); ``reset`` empties it.

    Overflow is checked on the host, without reading ``seq_lens``: the cache counts the tokens
    appended since ``reset`` (L per ``append`` whatever ``lengths`` holds, less what ``crop``
    drops), an upper bound of every ``seq_lens[b]``, and refuses an ``append`` that would take
    that count past ``capacity``. Inside ``torch.compile`` that count is neither checked nor
    advanced (a host value changing every step would retrace every step): a token past the
    capacity then gets the out-of-range slot, which the write rejects (the CPU raises, GPU kernels
    skip the row), as in transformers' ``StaticCache``.

    Args:
        scheme: ``"aura{kb}v{vb}"`` (``"aura4v2"``, ``"aura8v4"``) or ``"aura{b}"`` (= ``aura{b}v{b}``),
            bits in {2, 3, 4, 8}.
        batch: number of sequences B.
        kv_heads: KV heads Hkv.
        head_dim: D in {64, 128, 256, 512}.
        capacity: tokens per sequence of a contiguous cache (``[B, Hkv, capacity, PW]`` codes).
        num_blocks, page_size, block_table: a paged cache instead: ``[num_blocks, page_size, Hkv, PW]``
            codes and the caller's int32 ``[B, max_blocks]`` page table (capacity per sequence
            ``max_blocks * page_size``). The table is used by reference; update it in place.
        seed: uint64 seed of the sign masks (default 0).
        layer: 0-based layer index of the sign masks (default 0).
        device: device of every tensor (default: the block table's, else CPU).
        sink_tokens: S, the first S tokens of each row kept exact (contiguous layout only).
        recent_tokens: W, the last W tokens of each row kept exact in a ring buffer (contiguous
            only). Every token is also encoded as it arrives, so ``crop`` stays exact; decode
            attends ``[sinks | compressed middle | recent]`` and merges the two partial results
            by their lse (``merge_attn_states``), all on the device.
        dtype: dtype of the exact sink/recent tokens (the model's; default: that of the first
            ``append``).

    Attributes:
        k_codes, v_codes: int32 code tensors; k_norms, v_norms: fp32 norm tensors (zero-initialised:
            a zero cache is valid and decodes to zeros). ``select_rows`` and ``grow`` replace them
            (and ``seq_lens``) with new tensors.
        seq_lens: int32 ``[B]`` live tokens per sequence, on the device.
        batch, capacity: current B and tokens per sequence (``select_rows`` / ``grow`` change them).
        k_codebook, k_boundaries, v_codebook, v_boundaries, k_sign_mask, v_sign_mask: the tables.

    Raises:
        ValueError: unknown scheme, unsupported head dim, both or neither of the two layouts.

    Example:
        >>> import torch, torch_aura
        >>> cache = torch_aura.AuraCache("aura4v2", batch=2, kv_heads=2, head_dim=64, capacity=32)
        >>> cache.append(torch.randn(2, 7, 2, 64), torch.randn(2, 7, 2, 64))   # prefill, 7 tokens
        >>> cache.append(torch.randn(2, 2, 64), torch.randn(2, 2, 64))         # one decode token
        >>> out, lse = cache.decode(torch.randn(2, 8, 64))                    # 8 query heads
        >>> out.shape, cache.seq_lens.tolist()
        (torch.Size([2, 8, 64]), [8, 8])
        >>> round(cache.bf16_equivalent_bytes() / cache.memory_bytes(), 2)
        4.57
        >>> cache.append(torch.randn(2, 3, 2, 64), torch.randn(2, 3, 2, 64),
        ...              lengths=torch.tensor([3, 1]))                       # ragged chunk
        >>> cache.select_rows(torch.tensor([1, 0, 0]))                       # reorder, repeat
        >>> cache.crop(1)                                                     # drop a token
        >>> cache.batch, cache.seq_lens.tolist()
        (3, [8, 10, 10])
    """

    def __init__(self, scheme: str = "aura4v4", *, batch: int, kv_heads: int, head_dim: int,
                 capacity: int | None = None, num_blocks: int | None = None,
                 page_size: int | None = None, block_table: torch.Tensor | None = None,
                 seed: int = 0, layer: int = 0, device=None, sink_tokens: int = 0,
                 recent_tokens: int = 0, dtype: torch.dtype | None = None):
        self.scheme = scheme
        self.key_bits, self.value_bits = parse_scheme(scheme)
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim: expected one of {list(HEAD_DIMS)}, got {head_dim}")
        batch, kv_heads, head_dim, capacity, num_blocks, page_size, seed, layer = (
            _as_int(v) for v in (batch, kv_heads, head_dim, capacity, num_blocks, page_size, seed, layer))
        for name, v in (("batch", batch), ("kv_heads", kv_heads)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int, got {v!r}")
        paged_args = (num_blocks, page_size, block_table)
        if capacity is not None and any(a is not None for a in paged_args):
            raise ValueError("capacity: expected either capacity (contiguous) or num_blocks, page_size "
                             "and block_table (paged), got both")
        if capacity is None and any(a is None for a in paged_args):
            raise ValueError("capacity: expected capacity (contiguous) or all of num_blocks, page_size "
                             f"and block_table (paged), got capacity=None, num_blocks={num_blocks}, "
                             f"page_size={page_size}, block_table={'given' if block_table is not None else None}")
        self.batch, self.kv_heads, self.head_dim = batch, kv_heads, head_dim
        self.seed, self.layer = seed, layer
        self.paged = capacity is None
        sink_tokens, recent_tokens = _as_int(sink_tokens), _as_int(recent_tokens)
        for name, v in (("sink_tokens", sink_tokens), ("recent_tokens", recent_tokens)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
        self.sink_tokens, self.recent_tokens = sink_tokens, recent_tokens
        self.windowed = bool(sink_tokens or recent_tokens)
        if self.windowed and self.paged:
            raise ValueError("sink_tokens: exact sinks and recent window need the contiguous layout "
                             "(AuraCache(capacity=...)); this cache is paged")
        if self.paged:
            if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 \
                    or block_table.dim() != 2 or block_table.shape[0] != batch:
                got = (f"{block_table.dtype} {tuple(block_table.shape)}" if isinstance(block_table, torch.Tensor)
                       else type(block_table).__name__)
                raise ValueError(f"block_table: expected an int32 tensor [batch={batch}, max_blocks], got {got}")
            for name, v in (("num_blocks", num_blocks), ("page_size", page_size)):
                if not isinstance(v, int) or v < 1:
                    raise ValueError(f"{name}: expected a positive int, got {v!r}")
            device = block_table.device if device is None else torch.device(device)
            self.page_size = page_size
            self.capacity = block_table.shape[1] * page_size
            rows = (num_blocks, page_size, kv_heads)  # [num_blocks, page_size, Hkv(, PW)]
        else:
            if not isinstance(capacity, int) or capacity < 1:
                raise ValueError(f"capacity: expected a positive int, got {capacity!r}")
            device = torch.device("cpu") if device is None else torch.device(device)
            self.page_size = None
            self.capacity = capacity
            # windowed: compressed slot t - S holds token t >= S (the sinks are never compressed)
            rows = (batch, kv_heads, self._compressed_capacity())  # [B, Hkv, T_cap(, PW)]
        self.device = device
        self.block_table = block_table
        (self.k_codebook, self.k_boundaries, self.v_codebook, self.v_boundaries, self.k_sign_mask,
         self.v_sign_mask) = aura_tables(self.key_bits, self.value_bits, head_dim, seed, layer, device)
        # Zeros, not empty: a zero row is a valid AURA vector (codes decode, norm 0), so even a
        # stray read of an unwritten slot cannot produce NaN.
        pwk, pwv = packed_words(head_dim, self.key_bits), packed_words(head_dim, self.value_bits)
        self.k_codes = torch.zeros(*rows, pwk, dtype=torch.int32, device=device)
        self.v_codes = torch.zeros(*rows, pwv, dtype=torch.int32, device=device)
        self.k_norms = torch.zeros(*rows, dtype=torch.float32, device=device)
        self.v_norms = torch.zeros(*rows, dtype=torch.float32, device=device)
        self.seq_lens = torch.zeros(batch, dtype=torch.int32, device=device)
        # Host-side upper bound of every seq_lens[b] (tokens appended since reset), so overflow is
        # caught without reading seq_lens from the device.
        self._appended = 0
        # The tensors' own device ("cuda" -> "cuda:0"), what inputs are compared against.
        self._dev = self.k_codes.device
        # The ops themselves: the cache's own tensors are valid by construction, so the public
        # wrappers' re-validation of them would only cost host time on every decode step.
        self._write_op = torch.ops.aura.aura_write_cache.default
        self._encode_op = torch.ops.aura.aura_encode.default
        self._decode_op = torch.ops.aura.aura_decode.default
        self._dense_op = torch.ops.aura.flash_decode.default
        self._merge_op = torch.ops.aura.merge_attn_states.default
        self._layout_changed()
        self._exact_dtype = dtype
        self.k_exact = self.v_exact = None
        if self.windowed:
            self._window_state()
            if dtype is not None:
                self._alloc_exact(dtype)

    def _compressed_capacity(self) -> int:
        return max(self.capacity - self.sink_tokens, 1) if self.windowed else self.capacity

    def _layout_changed(self) -> None:
        """Recompute what slot computation needs after batch or capacity changed."""
        if self.paged:
            self._n_slots = self.k_codes.shape[0] * self.page_size
            self._row_base = None
        else:
            c_cap = self._compressed_capacity()
            self._n_slots = self.batch * c_cap
            self._rows = torch.arange(self.batch, dtype=torch.int64, device=self._dev)
            # Slot of (b, t) is row_base[b] + t: a one-token append is a single add.
            self._row_base = self._rows * c_cap
            if self.windowed:
                # exact buffer row b, slot s is page b * (S + W + 1) + s of flash_decode's paged view
                self._exact_base = self._rows[:, None] * (self.sink_tokens + self.recent_tokens + 1)

    # ------------------------------------------------------------------- exact sinks and window
    def _window_state(self) -> None:
        """Device-side window bookkeeping, updated in place by every append and crop.

        ``_ring_start[b]``: the first position of row b's exact recent tokens (at least S); the
        compressed middle is ``[S, _ring_start)``. ``_c_lens``: its length (aura_decode's
        seq_lens). ``_dense_lens`` / ``_dense_table``: the exact tokens as flash_decode's paged
        cache of one-token pages (sinks first, then the ring from its oldest token)."""
        S, W, B = self.sink_tokens, self.recent_tokens, self.batch
        self._ring_start = torch.full((B,), S, dtype=torch.int64, device=self._dev)
        self._c_lens = torch.zeros(B, dtype=torch.int32, device=self._dev)
        self._dense_lens = torch.zeros(B, dtype=torch.int32, device=self._dev)
        self._dense_table = torch.zeros(B, max(S + W, 1), dtype=torch.int32, device=self._dev)
        self._slot_j = torch.arange(max(S + W, 1), device=self._dev)[None, :]

    def window_tensors(self) -> tuple[torch.Tensor, ...]:
        """The device tensors the exact sinks/window add (mutated in place by append, crop and
        reset; new after select_rows), for callers that mark static addresses; () when unwindowed."""
        if not self.windowed:
            return ()
        exact = (self.k_exact, self.v_exact) if self.k_exact is not None else ()
        return (*exact, self._ring_start, self._c_lens, self._dense_lens, self._dense_table)

    def _alloc_exact(self, dtype: torch.dtype) -> None:
        self._exact_dtype = dtype
        # [B, S + W + 1, Hkv, D]: slot S + W is a scratch row that skipped writes land in
        shape = (self.batch, self.sink_tokens + self.recent_tokens + 1, self.kv_heads, self.head_dim)
        self.k_exact = torch.zeros(shape, dtype=dtype, device=self._dev)
        self.v_exact = torch.zeros(shape, dtype=dtype, device=self._dev)
        self._refresh_window()

    def _refresh_window(self) -> None:
        """Recompute the compressed length and the exact tokens' page table from ``seq_lens`` and
        ``_ring_start``, in place (fixed addresses for CUDA graphs)."""
        S, W = self.sink_tokens, self.recent_tokens
        n, rs = self.seq_lens.to(torch.int64), self._ring_start
        self._c_lens.copy_(rs - S)
        self._dense_lens.copy_(n.clamp(max=S) + (n - rs).clamp(min=0))
        j = self._slot_j
        ring = S + torch.remainder(rs[:, None] - S + (j - S), max(W, 1))
        slot = torch.where(j < S, j, ring) if W else j.expand(self.batch, -1)
        self._dense_table.copy_(self._exact_base + slot)

    def _append_windowed(self, k: torch.Tensor, v: torch.Tensor, n: torch.Tensor | None,
                         left_padded: bool, compiling: bool) -> None:
        """Every real token is encoded at compressed slot t - S (t >= S) and, when it is one of
        the first S or the last W of its row, also stored exact."""
        S, W, B = self.sink_tokens, self.recent_tokens, self.batch
        if self.k_exact is None:
            self._alloc_exact(k.dtype)
        # the exact dtype for both copies, so a token's compressed form does not depend on its path
        k, v = k.to(self._exact_dtype), v.to(self._exact_dtype)
        L = k.shape[1]
        i = torch.arange(L, device=self._dev)[None, :]
        if n is not None and left_padded:  # make the chunk right-padded: real token i is chunk[L - n + i]
            idx = (i + (L - n)[:, None]).clamp(max=L - 1)[:, :, None, None].expand_as(k)
            k, v = k.gather(1, idx), v.gather(1, idx)
        valid = i < (L if n is None else n[:, None])
        pos = self.seq_lens.to(torch.int64)[:, None] + i  # [B, L]
        n_new = self.seq_lens.to(torch.int64) + (L if n is None else n)
        in_cap = pos < self.capacity
        cslot = torch.where(in_cap, self._row_base[:, None] + (pos - S), self._n_slots)
        cslot = torch.where(valid & (pos >= S), cslot, -1).reshape(-1)
        flat_k, flat_v = (x.reshape(B * L, self.kv_heads, self.head_dim) for x in (k, v))
        self._write_op(flat_k, self.k_codes, self.k_norms, cslot, self.k_codebook, self.k_boundaries,
                       self.key_bits, self.k_sign_mask, False)
        self._write_op(flat_v, self.v_codes, self.v_norms, cslot, self.v_codebook, self.v_boundaries,
                       self.value_bits, self.v_sign_mask, False)
        eslot = torch.where(valid & (pos < S), pos, S + W)
        if W:  # only the last W of the row: earlier chunk tokens would collide in the ring
            recent = valid & in_cap & (pos >= S) & (pos >= n_new[:, None] - W)
            eslot = torch.where(recent, S + torch.remainder(pos - S, W), eslot)
        rows = self._rows[:, None].expand(B, L)
        self.k_exact.index_put_((rows, eslot), k)
        self.v_exact.index_put_((rows, eslot), v)
        self._ring_start.copy_(torch.maximum(self._ring_start, n_new - W))
        self.seq_lens.copy_(n_new)
        self._refresh_window()
        if not compiling:
            self._appended += L

    def _exact_positions(self) -> torch.Tensor:
        """int64 ``[B, S + W + 1]`` position held by each exact slot, -1 where the slot is not live."""
        S, W = self.sink_tokens, self.recent_tokens
        n, rs = self.seq_lens.to(torch.int64)[:, None], self._ring_start[:, None]
        s = torch.arange(S + W + 1, device=self._dev)[None, :]
        pos = torch.where(s < n, s, -1)
        if W:  # ring slot r holds the latest position p < n with (p - S) mod W = r
            r = s - S
            ring_pos = S + r + W * torch.div(n - 1 - S - r, W, rounding_mode="floor")
            ring_pos = torch.where((ring_pos >= rs) & (ring_pos < n), ring_pos, -1)
            pos = torch.where(s >= S, ring_pos, pos)
        pos[:, S + W:] = -1
        return pos

    def _decode_windowed(self, q: torch.Tensor, scale: float | None, num_splits: int):
        S, W, Hkv, D = self.sink_tokens, self.recent_tokens, self.kv_heads, self.head_dim
        if self.k_exact is None:
            self._alloc_exact(q.dtype)
        tables = (self.k_codebook, self.v_codebook, self.k_sign_mask, self.v_sign_mask,
                  self.key_bits, self.value_bits, None, scale, num_splits)
        codes = (self.k_codes, self.k_norms, self.v_codes, self.v_norms)
        if q.dim() == 3:
            out_c, lse_c = self._decode_op(q, *codes, self._c_lens, *tables)
            B1 = self.batch * (S + W + 1)
            out_d, lse_d = self._dense_op(q.to(self._exact_dtype), self.k_exact.view(B1, 1, Hkv, D),
                                          self.v_exact.view(B1, 1, Hkv, D), self._dense_lens,
                                          self._dense_table, scale, 0)
            return self._merge_op(torch.stack([out_c, out_d.to(out_c.dtype)]), torch.stack([lse_c, lse_d]))
        B, L, Hq, _ = q.shape
        G = Hq // Hkv
        # compressed middle: query i (position seq_len - L + i) sees all of it once i >= L - W
        full = q[:, max(L - W, 0):]
        Lf = full.shape[1]
        folded = full.view(B, Lf, Hkv, G, D).transpose(1, 2).reshape(B, Hkv * Lf * G, D)
        o, m = self._decode_op(folded, *codes, self._c_lens, *tables)
        out_c = o.view(B, Hkv, Lf, G, D).transpose(1, 2).reshape(B, Lf, Hq, D)
        lse_c = m.view(B, Hkv, Lf, G).transpose(1, 2).reshape(B, Lf, Hq)
        if L > W:  # the first L - W queries see a causal prefix of it
            o, m = self._decode_op(q[:, :L - W].contiguous(), *codes, self._c_lens, *tables)
            out_c, lse_c = torch.cat([o, out_c], 1), torch.cat([m, lse_c], 1)
        # exact sinks and window, causal by position (tokens of the chunk are in the window or compressed)
        pos = self._exact_positions()  # [B, S + W + 1]
        qpos = self.seq_lens.to(torch.int64)[:, None] - L + torch.arange(L, device=self._dev)[None, :]
        see = (pos[:, None, :] >= 0) & (pos[:, None, :] <= qpos[:, :, None])  # [B, L, slots]
        scale_ = D ** -0.5 if scale is None else scale
        qg = q.float().view(B, L, Hkv, G, D).transpose(1, 2)  # [B, Hkv, L, G, D]
        logits = scale_ * torch.einsum("bhlgd,bshd->bhlgs", qg, self.k_exact.float())
        logits = logits.masked_fill(~see[:, None, :, None, :], -torch.inf)
        lse_d = torch.logsumexp(logits, -1)
        p = torch.exp(logits - lse_d.clamp(min=-1e30)[..., None])
        out_d = torch.einsum("bhlgs,bshd->bhlgd", p, self.v_exact.float())
        out_d = out_d.transpose(1, 2).reshape(B, L, Hq, D)
        lse_d = lse_d.transpose(1, 2).reshape(B, L, Hq)
        out, lse = self._merge_op(torch.stack([out_c.reshape(B * L, Hq, D), out_d.to(out_c.dtype).reshape(B * L, Hq, D)]),
                                  torch.stack([lse_c.reshape(B * L, Hq), lse_d.reshape(B * L, Hq)]))
        return out.view(B, L, Hq, D), lse.view(B, L, Hq)

    def _contiguous_only(self, what: str) -> None:
        if self.paged:
            raise ValueError(f"{what}: only the contiguous layout (AuraCache(capacity=...)) supports it; "
                             "this cache is paged (its rows live in the caller's block_table)")

    # ------------------------------------------------------------------------------------ writes
    def _on_device(self, name: str, t: torch.Tensor) -> None:
        if t.device != self._dev:
            _c.fail(name, f"a tensor on the cache's device {self._dev}", t.device)

    def _check_tokens(self, name: str, t) -> None:
        """``t`` is ``[B, (L,) Hkv, D]`` floating point on the cache's device, unit last stride."""
        _c.tensor(name, t, ndim=(3, 4), dtypes=_c.FLOATS, unit_last_stride=True)
        shape = t.shape
        if shape[0] != self.batch or shape[-2] != self.kv_heads or shape[-1] != self.head_dim:
            _c.fail(name, f"[B={self.batch}, (L,) Hkv={self.kv_heads}, D={self.head_dim}]", tuple(shape))
        self._on_device(name, t)

    def _slots(self, L: int, n: torch.Tensor | None, left_padded: bool) -> torch.Tensor:
        """int64 ``[B * L]`` slots of a chunk of L tokens per sequence, computed on the device.

        ``n``: None (every token is written) or ``[B]`` tokens to keep per row, in ``[0, L]``;
        the others get slot -1, which the write skips.
        """
        rel = torch.arange(L, device=self._dev)[None, :]  # [1, L] offset past seq_lens
        if n is not None:
            n = n[:, None]
            if left_padded:  # the last n[b] tokens are real: token i lands at seq_len + i - (L - n)
                rel = rel - (L - n)
                valid = rel >= 0
            else:
                valid = rel < n
        pos = self.seq_lens[:, None] + rel  # [B, L] int64
        if self.paged:
            # Clamped lookups only: a skipped token's position may be negative, an overflowing
            # one past the table; both are replaced below.
            page_idx = (pos.clamp(min=0) // self.page_size).clamp_(max=self.block_table.shape[1] - 1)
            page = self.block_table.gather(1, page_idx).to(torch.int64)
            if not _capturing(page):
                self._check_pages(page, pos, None if n is None else valid)
            slots = page * self.page_size + pos % self.page_size
        else:
            slots = self._row_base[:, None] + pos
        # A position past the capacity must never land in a neighbour's row: map it to the
        # out-of-range slot n_slots, which the write rejects instead of corrupting the cache.
        slots = torch.where(pos < self.capacity, slots, self._n_slots)
        if n is not None:
            slots = torch.where(valid, slots, -1)
        return slots.reshape(-1)

    def _check_pages(self, page: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor | None) -> None:
        """Raise before anything is written if a token of this append has no page: a block-table
        entry outside ``[0, num_blocks)`` (e.g. -1, unallocated). One host read of a ``[B, L]``
        mask; skipped under CUDA-graph capture, where it cannot run."""
        used = pos < self.capacity if valid is None else valid & (pos < self.capacity)
        missing = used & ((page < 0) | (page >= self.k_codes.shape[0]))
        if bool(missing.any()):
            rows = missing.any(1).nonzero().flatten().tolist()
            raise ValueError(f"block_table: rows {rows[:8]} have no valid page (an entry outside [0, "
                             f"{self.k_codes.shape[0]}), e.g. -1) for tokens this append writes; "
                             "allocate the pages first (nothing was written)")

    def append(self, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor | None = None,
               left_padded: bool = False) -> None:
        """Encode new tokens at each sequence's current length and advance ``seq_lens``.

        Row b appends all L tokens (``lengths=None``) or ``lengths[b]`` of them: the first
        ``lengths[b]`` of a right-padded chunk, or the last ``lengths[b]`` of a left-padded one
        (``left_padded=True``); the others are not written. Everything happens on the device (no
        host sync), so the call can be captured in a CUDA graph; for the same reason
        ``lengths`` values are not checked but clamped to ``[0, L]``.

        Args:
            k, v: ``[B, Hkv, D]`` (one token per sequence) or ``[B, L, Hkv, D]`` (L tokens, e.g. a
                prefill chunk), fp16, bf16 or fp32, same shape, on the cache's device, unit last
                stride.
            lengths: None, or an int32 / int64 ``[B]`` tensor on the cache's device: tokens of the
                chunk that row b appends (0 appends nothing to that row).
            left_padded: with ``lengths``, the real tokens are the last ``lengths[b]`` of the
                chunk (padding first) instead of the first.

        Raises:
            ValueError: shapes, dtypes or devices that do not match the cache, bad ``lengths``, or
                more tokens than the capacity. The capacity check counts L tokens per call even
                with ``lengths`` (an upper bound: see the class docstring). Paged: a token whose
                block-table entry is not a page (-1: unallocated), found by one host read of the
                pages this call writes, before anything changes (not under CUDA-graph capture,
                where such tokens would be skipped: allocate pages before capturing).

        Example:
            >>> import torch, torch_aura
            >>> cache = torch_aura.AuraCache("aura4v2", batch=2, kv_heads=2, head_dim=64, capacity=16)
            >>> k, v = torch.randn(2, 5, 2, 64), torch.randn(2, 5, 2, 64)    # padded prefill chunk
            >>> cache.append(k, v, lengths=torch.tensor([5, 3]), left_padded=True)  # row 1: 2 pads
            >>> cache.append(torch.randn(2, 2, 64), torch.randn(2, 2, 64))  # one decode token each
            >>> cache.seq_lens.tolist()
            [6, 4]
        """
        self._check_tokens("k", k)
        self._check_tokens("v", v)
        if k.shape != v.shape:
            _c.fail("v", f"the shape of k {tuple(k.shape)}", tuple(v.shape))
        four_d = k.dim() == 4
        L = k.shape[1] if four_d else 1
        # A compiled step keeps no host bound (it would retrace at every new value): there the
        # device-side slot clamp below is the guard, as in transformers' StaticCache.
        compiling = torch.compiler.is_compiling()
        bound = L if compiling else self._appended + L
        if bound > self.capacity:
            raise ValueError(f"k: expected at most {self.capacity - (0 if compiling else self._appended)} more "
                             f"tokens (capacity {self.capacity}, {self._appended} appended), got {L}")
        n = None
        if lengths is not None:
            _c.tensor("lengths", lengths, ndim=1, dtypes=_c.INDEX_DTYPES)
            if lengths.shape[0] != self.batch:
                _c.fail("lengths", f"one length per sequence, [B={self.batch}]", tuple(lengths.shape))
            self._on_device("lengths", lengths)
            n = lengths.clamp(0, L)  # out-of-range values cannot be reported without a sync
        if self.windowed:
            self._append_windowed(k if four_d else k[:, None], v if four_d else v[:, None], n, left_padded, compiling)
            return
        if L == 1 and n is None and not self.paged and self._dev.type == "cpu" and not compiling:
            self._append_token_cpu(k[:, 0] if four_d else k, v[:, 0] if four_d else v)
            return
        if L == 1 and n is None and not self.paged:
            # The decode step: one add for the slots, one masked fill for overflow safety (as in
            # _slots, a row past its capacity gets the rejected slot n_slots).
            slots = self._row_base + self.seq_lens
            slots.masked_fill_(self.seq_lens >= self.capacity, self._n_slots)
        else:
            slots = self._slots(L, n, left_padded)
        if four_d:  # [B, L, Hkv, D] -> [B * L, Hkv, D], rows in the order of the slots
            k = k.reshape(self.batch * L, self.kv_heads, self.head_dim)
            v = v.reshape(self.batch * L, self.kv_heads, self.head_dim)
        self._write_op(k, self.k_codes, self.k_norms, slots, self.k_codebook, self.k_boundaries,
                       self.key_bits, self.k_sign_mask, self.paged)
        self._write_op(v, self.v_codes, self.v_norms, slots, self.v_codebook, self.v_boundaries,
                       self.value_bits, self.v_sign_mask, self.paged)
        self.seq_lens += L if n is None else n
        if not compiling:
            self._appended += L

    def _append_token_cpu(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """The CPU decode step: encode, then store at ``[b, :, seq_lens[b]]``. The write op's data
        checks (slot range, a sort for duplicates) are most of its CPU time, and these slots need
        neither: one per row, each below the capacity (``_appended`` bounds ``seq_lens``)."""
        t = self.seq_lens.long()
        if int(t.max()) >= self.capacity:  # seq_lens moved behind the cache's back; a CPU read is free
            _c.fail("seq_lens", f"every row below the capacity {self.capacity} (was seq_lens changed outside "
                    "the cache?)", t.tolist())
        for x, codes, norms, codebook, boundaries, bits, sign_mask in (
                (k, self.k_codes, self.k_norms, self.k_codebook, self.k_boundaries, self.key_bits, self.k_sign_mask),
                (v, self.v_codes, self.v_norms, self.v_codebook, self.v_boundaries, self.value_bits, self.v_sign_mask)):
            x_codes, x_norms = self._encode_op(x, codebook, boundaries, bits, sign_mask)
            codes[self._rows, :, t] = x_codes
            norms[self._rows, :, t] = x_norms
        self.seq_lens += 1
        self._appended += 1

    # ------------------------------------------------------------------------------------- reads
    def decode(self, q: torch.Tensor, scale: float | None = None,
               num_splits: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of ``q`` over the cached tokens (see :func:`torch_aura.aura_decode`).

        Args:
            q: ``[B, Hq, D]`` or causal ``[B, L, Hq, D]`` (the last L cached tokens of each row are
                the queries' own: query i sits at position ``seq_lens[b] - L + i``), Hq a multiple
                of Hkv, fp16, bf16 or fp32, on the cache's device, unit last stride.
            scale: softmax scale, default D ** -0.5.
            num_splits: 0 = automatic pass-1 split, else the number of blocks to aim for.

        Returns:
            ``(out [B, (L,) Hq, D] in q's dtype, lse [B, (L,) Hq] fp32)``.

        Raises:
            ValueError: a ``q`` whose shape, dtype or device does not match the cache.

        Example:
            >>> import torch, torch_aura
            >>> cache = torch_aura.AuraCache("aura4", batch=2, kv_heads=2, head_dim=64, capacity=16)
            >>> cache.append(torch.randn(2, 5, 2, 64), torch.randn(2, 5, 2, 64))
            >>> out, lse = cache.decode(torch.randn(2, 6, 64))           # Hq = 6, 3 per KV head
            >>> out.shape, lse.shape
            (torch.Size([2, 6, 64]), torch.Size([2, 6]))
        """
        _c.tensor("q", q, ndim=(3, 4), dtypes=_c.FLOATS, unit_last_stride=True)
        shape = q.shape
        if shape[0] != self.batch or shape[-1] != self.head_dim:
            _c.fail("q", f"[B={self.batch}, (L,) Hq, D={self.head_dim}]", tuple(shape))
        if shape[-2] < 1 or shape[-2] % self.kv_heads:
            _c.fail("q", f"query heads (shape[-2]) a positive multiple of KV heads ({self.kv_heads})",
                    tuple(shape))
        self._on_device("q", q)
        if self.windowed:
            return self._decode_windowed(q, scale, num_splits)
        return self._decode_op(q, self.k_codes, self.k_norms, self.v_codes, self.v_norms,
                               self.seq_lens, self.k_codebook, self.v_codebook, self.k_sign_mask,
                               self.v_sign_mask, self.key_bits, self.value_bits,
                               self.block_table if self.paged else None, scale, num_splits)

    # ------------------------------------------------------------------- rows and lengths
    def reset(self) -> None:
        """Forget every token (``seq_lens = 0``); the tensors stay allocated and are not cleared."""
        self.seq_lens.zero_()
        self._appended = 0
        if self.windowed:
            self._ring_start.fill_(self.sink_tokens)
            self._refresh_window()

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep, reorder or repeat sequences: row i becomes old row ``index[i]`` (contiguous only).

        Serves beam search's cache reorder, batch selection and repeat-interleave (a batch
        expanded for sampling). Codes, norms and ``seq_lens`` become ``t.index_select(0, index)``,
        new tensors (a CUDA graph captured before must be captured again); ``batch`` becomes
        ``len(index)``. No host sync: ``index`` values are not checked (they must lie in
        ``[0, batch)``).

        Args:
            index: int64 (or int32) ``[B']`` row indices on the cache's device, B' >= 1.

        Raises:
            ValueError: a paged cache, or ``index`` not a non-empty 1-D integer tensor on the
                cache's device.

        Example:
            >>> import torch, torch_aura
            >>> cache = torch_aura.AuraCache("aura4", batch=2, kv_heads=1, head_dim=64, capacity=8)
            >>> cache.append(torch.randn(2, 3, 1, 64), torch.randn(2, 3, 1, 64),
            ...              lengths=torch.tensor([3, 1]))
            >>> cache.select_rows(torch.tensor([1, 1, 0]))    # reorder and duplicate
            >>> cache.batch, cache.seq_lens.tolist(), tuple(cache.k_codes.shape)
            (3, [1, 1, 3], (3, 1, 8, 8))
        """
        self._contiguous_only("select_rows")
        _c.tensor("index", index, ndim=1, dtypes=_c.INDEX_DTYPES)
        if index.shape[0] < 1:
            _c.fail("index", "a non-empty tensor [B'] of row indices", tuple(index.shape))
        self._on_device("index", index)
        self.k_codes = self.k_codes.index_select(0, index)
        self.v_codes = self.v_codes.index_select(0, index)
        self.k_norms = self.k_norms.index_select(0, index)
        self.v_norms = self.v_norms.index_select(0, index)
        self.seq_lens = self.seq_lens.index_select(0, index)
        self.batch = index.shape[0]
        self._layout_changed()
        if self.windowed:
            ring_start, exact = self._ring_start.index_select(0, index), self.k_exact is not None
            kx, vx = (self.k_exact.index_select(0, index), self.v_exact.index_select(0, index)) if exact else (None, None)
            self._window_state()
            self._ring_start.copy_(ring_start)
            self.k_exact, self.v_exact = kx, vx
            self._refresh_window()

    def crop(self, n: int) -> None:
        """Drop the last ``n`` tokens of every sequence (contiguous only).

        ``seq_lens = max(seq_lens - n, 0)`` in place, on the device; the data stays allocated and
        the next ``append`` overwrites the dropped slots (e.g. rejected speculative tokens).

        Args:
            n: tokens to drop per sequence, an int >= 0.

        Raises:
            ValueError: a paged cache, or ``n`` not an int >= 0.

        Example:
            >>> import torch, torch_aura
            >>> cache = torch_aura.AuraCache("aura4", batch=2, kv_heads=1, head_dim=64, capacity=8)
            >>> cache.append(torch.randn(2, 5, 1, 64), torch.randn(2, 5, 1, 64),
            ...              lengths=torch.tensor([5, 2]))
            >>> cache.crop(3)
            >>> cache.seq_lens.tolist()
            [2, 0]
        """
        self._contiguous_only("crop")
        n = _as_int(n)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            _c.fail("n", "an int >= 0 (tokens to drop)", repr(n))
        if n:
            self.seq_lens.sub_(n).clamp_(min=0)
            self._appended = max(self._appended - n, 0)
            if self.windowed:  # dropped window tokens leave the middle's tail as the (shorter) window
                self._ring_start.copy_(torch.minimum(self._ring_start, self.seq_lens.to(torch.int64))
                                       .clamp_(min=self.sink_tokens))
                self._refresh_window()

    def grow(self, capacity: int) -> None:
        """Reallocate to ``capacity`` tokens per sequence, keeping the cached tokens (contiguous only).

        The code and norm tensors are replaced by zero-initialised ``[B, Hkv, capacity, ...]``
        ones holding a copy of the old ``[:, :, :old_capacity]`` (compressed bytes, never
        dequantized); a CUDA graph captured before must be captured again. A no-op when
        ``capacity`` is not larger than the current one.

        Args:
            capacity: new tokens per sequence, a positive int.

        Raises:
            ValueError: a paged cache, or ``capacity`` not a positive int.

        Example:
            >>> import torch, torch_aura
            >>> cache = torch_aura.AuraCache("aura4", batch=1, kv_heads=1, head_dim=64, capacity=4)
            >>> cache.append(torch.randn(1, 4, 1, 64), torch.randn(1, 4, 1, 64))   # full
            >>> cache.grow(16)
            >>> cache.append(torch.randn(1, 1, 64), torch.randn(1, 1, 64))
            >>> cache.capacity, cache.seq_lens.tolist(), tuple(cache.k_codes.shape)
            (16, [5], (1, 1, 16, 8))
        """
        self._contiguous_only("grow")
        capacity = _as_int(capacity)
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            _c.fail("capacity", "a positive int", repr(capacity))
        old = self.capacity
        if capacity <= old:
            return
        old_c = self._compressed_capacity()
        self.capacity = capacity
        for name in ("k_codes", "v_codes", "k_norms", "v_norms"):
            t = getattr(self, name)
            bigger = t.new_zeros(t.shape[0], t.shape[1], self._compressed_capacity(), *t.shape[3:])
            bigger[:, :, :old_c].copy_(t)
            setattr(self, name, bigger)
        self._layout_changed()

    # --------------------------------------------------------------------------------- reporting
    def memory_bytes(self) -> int:
        """Bytes held by the K and V codes and norms, and the exact sink/recent tokens."""
        held = [self.k_codes, self.k_norms, self.v_codes, self.v_norms]
        if self.k_exact is not None:
            held += [self.k_exact, self.v_exact]
        return sum(t.numel() * t.element_size() for t in held)

    def dense_bytes(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes an uncompressed K+V cache of ``dtype`` with the same token slots would take."""
        slots = self.batch * self.kv_heads * self.capacity if not self.paged else self.k_norms.numel()
        return 2 * slots * self.head_dim * dtype.itemsize

    def bf16_equivalent_bytes(self) -> int:
        """Bytes a bf16 K+V cache with the same token slots would take: ``dense_bytes(torch.bfloat16)``."""
        return self.dense_bytes(torch.bfloat16)

    def __repr__(self) -> str:
        layout = (f"paged num_blocks={self.k_codes.shape[0]} page_size={self.page_size}" if self.paged
                  else f"capacity={self.capacity}")
        return (f"AuraCache({self.scheme!r}, batch={self.batch}, kv_heads={self.kv_heads}, "
                f"head_dim={self.head_dim}, {layout}, seed={self.seed}, layer={self.layer}, "
                + (f"sink_tokens={self.sink_tokens}, recent_tokens={self.recent_tokens}, " if self.windowed else "")
                + f"device={self.device}, {self.memory_bytes()} bytes = "
                f"{self.bf16_equivalent_bytes() / self.memory_bytes():.2f}x smaller than bf16)")
