"""``AuraCache``: one attention layer's AURA-compressed KV cache (aura-format.md §7-§8).

It owns what the ops would otherwise need fifteen arguments for: the scheme's bit widths, the
per-D codebooks and boundaries, the layer's K and V sign masks (seed, layer), the code and norm
tensors, and the device-side ``seq_lens``. A model needs three calls: construct, ``append``,
``decode``.
"""

from __future__ import annotations

import re

import torch

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


class AuraCache:
    """One attention layer's compressed KV cache, contiguous or paged.

    Keys use ``key_bits`` and values ``value_bits`` per coordinate plus one fp32 norm per
    token-head; each has its own codebook and sign mask (K: ``kind="k"``, V: ``kind="v"`` of
    ``(seed, layer)``). Tensors live on ``device``; ``append`` and ``decode`` never synchronise
    with the host (slots are computed on the device from ``seq_lens``), so both can be captured in
    a CUDA graph.

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

    Attributes:
        k_codes, v_codes: int32 code tensors; k_norms, v_norms: fp32 norm tensors (zero-initialised:
            a zero cache is valid and decodes to zeros).
        seq_lens: int32 ``[B]`` live tokens per sequence, on the device.
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
    """

    def __init__(self, scheme: str = "aura4v4", *, batch: int, kv_heads: int, head_dim: int,
                 capacity: int | None = None, num_blocks: int | None = None,
                 page_size: int | None = None, block_table: torch.Tensor | None = None,
                 seed: int = 0, layer: int = 0, device=None):
        from .ops.aura import aura_codebook, aura_sign_mask

        self.scheme = scheme
        self.key_bits, self.value_bits = parse_scheme(scheme)
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim: expected one of {list(HEAD_DIMS)}, got {head_dim}")
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
            rows = (batch, kv_heads, capacity)  # [B, Hkv, T_cap(, PW)]
        self.device = device
        self.block_table = block_table
        self.k_codebook, self.k_boundaries = aura_codebook(self.key_bits, head_dim, device)
        self.v_codebook, self.v_boundaries = aura_codebook(self.value_bits, head_dim, device)
        self.k_sign_mask = aura_sign_mask(head_dim, seed, layer, "k", device)
        self.v_sign_mask = aura_sign_mask(head_dim, seed, layer, "v", device)
        # Zeros, not empty: a zero row is a valid AURA vector (codes decode, norm 0), so even a
        # stray read of an unwritten slot cannot produce NaN.
        pwk, pwv = packed_words(head_dim, self.key_bits), packed_words(head_dim, self.value_bits)
        self.k_codes = torch.zeros(*rows, pwk, dtype=torch.int32, device=device)
        self.v_codes = torch.zeros(*rows, pwv, dtype=torch.int32, device=device)
        self.k_norms = torch.zeros(*rows, dtype=torch.float32, device=device)
        self.v_norms = torch.zeros(*rows, dtype=torch.float32, device=device)
        self.seq_lens = torch.zeros(batch, dtype=torch.int32, device=device)
        # Host-side count of tokens appended since reset (every sequence advances together), so
        # overflow is caught without reading seq_lens from the device.
        self._appended = 0

    # ------------------------------------------------------------------------------------ writes
    def _slots(self, L: int) -> torch.Tensor:
        """int64 ``[B * L]`` slots of the next L tokens of every sequence, computed on the device."""
        pos = self.seq_lens.to(torch.int64)[:, None] + torch.arange(L, device=self.device)  # [B, L]
        if self.paged:
            n_slots = self.k_codes.shape[0] * self.page_size
            page_idx = (pos // self.page_size).clamp(max=self.block_table.shape[1] - 1)
            page = self.block_table.to(torch.int64).gather(1, page_idx)
            slots = page * self.page_size + pos % self.page_size
        else:
            n_slots = self.batch * self.capacity
            b = torch.arange(self.batch, device=self.device)[:, None]
            slots = b * self.capacity + pos
        # A position past the capacity must never land in a neighbour's row: map it to the
        # out-of-range slot n_slots, which the write rejects instead of corrupting the cache.
        slots = torch.where(pos < self.capacity, slots, torch.full_like(slots, n_slots))
        return slots.reshape(-1)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Encode new tokens at each sequence's current length and advance ``seq_lens``.

        Args:
            k, v: ``[B, Hkv, D]`` (one token per sequence) or ``[B, L, Hkv, D]`` (L tokens, e.g. a
                prefill chunk), fp16, bf16 or fp32, same shape.

        Raises:
            ValueError: shapes that do not match the cache, or more tokens than the capacity.
        """
        from .ops.aura import aura_write_cache

        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() not in (3, 4):
                raise ValueError(f"{name}: expected a [B, Hkv, D] or [B, L, Hkv, D] tensor, got "
                                 f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
            want = (self.batch, self.kv_heads, self.head_dim)
            if (t.shape[0], t.shape[-2], t.shape[-1]) != want:
                raise ValueError(f"{name}: expected [B={self.batch}, (L,) Hkv={self.kv_heads}, "
                                 f"D={self.head_dim}], got {tuple(t.shape)}")
        if k.shape != v.shape:
            raise ValueError(f"v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
        L = k.shape[1] if k.dim() == 4 else 1
        if self._appended + L > self.capacity:
            raise ValueError(f"k: expected at most {self.capacity - self._appended} more tokens "
                             f"(capacity {self.capacity}, {self._appended} appended), got {L}")
        slots = self._slots(L)
        # [B, L, Hkv, D] -> [B * L, Hkv, D], rows in the order of the slots.
        kx = k.reshape(self.batch * L, self.kv_heads, self.head_dim)
        vx = v.reshape(self.batch * L, self.kv_heads, self.head_dim)
        aura_write_cache(kx, self.k_codes, self.k_norms, slots, self.k_codebook, self.k_boundaries,
                         self.key_bits, self.k_sign_mask, self.paged)
        aura_write_cache(vx, self.v_codes, self.v_norms, slots, self.v_codebook, self.v_boundaries,
                         self.value_bits, self.v_sign_mask, self.paged)
        self.seq_lens += L
        self._appended += L

    # ------------------------------------------------------------------------------------- reads
    def decode(self, q: torch.Tensor, scale: float | None = None,
               num_splits: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of ``q`` over the cached tokens (see :func:`torch_aura.aura_decode`).

        Args:
            q: ``[B, Hq, D]`` or causal ``[B, L, Hq, D]`` (the last L cached tokens are the
                queries' own: query i sits at position ``seq_lens - L + i``), Hq a multiple of Hkv.
            scale: softmax scale, default D ** -0.5.
            num_splits: 0 = automatic pass-1 split, else the number of blocks to aim for.

        Returns:
            ``(out [B, (L,) Hq, D] in q's dtype, lse [B, (L,) Hq] fp32)``.
        """
        from .ops.aura import aura_decode

        return aura_decode(q, self.k_codes, self.k_norms, self.v_codes, self.v_norms, self.seq_lens,
                           self.k_codebook, self.v_codebook, self.k_sign_mask, self.v_sign_mask,
                           self.key_bits, self.value_bits, self.block_table if self.paged else None,
                           scale, num_splits)

    def reset(self) -> None:
        """Forget every token (``seq_lens = 0``); the tensors stay allocated and are not cleared."""
        self.seq_lens.zero_()
        self._appended = 0

    # --------------------------------------------------------------------------------- reporting
    def memory_bytes(self) -> int:
        """Bytes held by the K and V codes and norms."""
        return sum(t.numel() * t.element_size() for t in (self.k_codes, self.k_norms, self.v_codes, self.v_norms))

    def dense_bytes(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes an uncompressed K+V cache of ``dtype`` with the same token slots would take."""
        slots = self.k_norms.numel()  # token-heads
        return 2 * slots * self.head_dim * dtype.itemsize

    def bf16_equivalent_bytes(self) -> int:
        """Bytes a bf16 K+V cache with the same token slots would take: ``dense_bytes(torch.bfloat16)``."""
        return self.dense_bytes(torch.bfloat16)

    def __repr__(self) -> str:
        layout = (f"paged num_blocks={self.k_codes.shape[0]} page_size={self.page_size}" if self.paged
                  else f"capacity={self.capacity}")
        return (f"AuraCache({self.scheme!r}, batch={self.batch}, kv_heads={self.kv_heads}, "
                f"head_dim={self.head_dim}, {layout}, seed={self.seed}, layer={self.layer}, "
                f"device={self.device}, {self.memory_bytes()} bytes = "
                f"{self.bf16_equivalent_bytes() / self.memory_bytes():.2f}x smaller than bf16)")
