"""Public wrappers of the AURA compressed KV cache family (aura-format.md).

Each op wrapper takes exactly its schema's arguments, runs the family check (the same function the
fake and the reference run, so errors are identical eagerly and at trace time) and calls
``torch.ops.aura.<op>``. ``aura_codebook`` and ``aura_sign_mask`` build the host-side tables the
ops take. ``AuraCache`` (``torch_aura/aura_cache.py``) builds on these wrappers: it imports this
module, never the reverse.
"""

from __future__ import annotations

import numbers

import torch

from .. import _debug
from .._checks import aura as _check
from .._checks.aura import BITS, HEAD_DIMS
from ..reference import aura as _ref
from ._call import checked_call

__all__ = [
    "hadamard_rotate",
    "aura_encode",
    "aura_write_cache",
    "aura_append",
    "aura_dequantize",
    "aura_flash_p1",
    "aura_flash_p2",
    "aura_decode",
    "aura_codebook",
    "aura_sign_mask",
]


def aura_codebook(bits: int, dim: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Lloyd-Max codebook and decision boundaries for ``bits``-bit codes at head dim ``dim``.

    The unit tables are the Lloyd-Max quantizers of N(0, 1) (aura-format.md §4: the 1-4-bit
    literals, and the project's converged 8-bit table); boundaries are the fp32 midpoints of
    neighbouring centroids. Both are divided by sqrt(dim) in fp64 and rounded once to fp32, the
    numbers every backend uses.

    Args:
        bits: code width, one of 1, 2, 3, 4, 8 (1 is for completeness; the ops take 2, 3, 4, 8).
        dim: head dim D, one of 64, 128, 256, 512.
        device: where to put the tables (default CPU).

    Returns:
        ``(codebook, boundaries)``: fp32 ``[2**bits]`` ascending centroids and fp32
        ``[2**bits - 1]`` boundaries, both scaled by ``1/sqrt(dim)``.

    Raises:
        ValueError: ``bits`` or ``dim`` unsupported.

    Example:
        >>> import torch_aura
        >>> cb, bd = torch_aura.aura_codebook(2, 64)
        >>> [round(v, 6) for v in cb.tolist()]
        [-0.188802, -0.056598, 0.056598, 0.188802]
        >>> bd.shape
        torch.Size([3])
    """
    if bits not in (1, *BITS):
        raise ValueError(f"bits: expected one of {[1, *BITS]}, got {bits}")
    if dim not in HEAD_DIMS:
        raise ValueError(f"head_dim: expected one of {list(HEAD_DIMS)}, got {dim} (dim)")
    return _ref.codebook(bits, dim, device)


def aura_sign_mask(dim: int, seed: int = 0, layer: int = 0, kind: str = "k", device=None) -> torch.Tensor:
    """The rotation's random sign vector for one (seed, layer, K or V), as packed bits.

    Counter-based SplitMix64 (aura-format.md §3), computed in Python integer arithmetic so every
    backend gets the same bits; bit j set means sign j is -1. Smaller dims give prefixes.

    Args:
        dim: head dim D, one of 64, 128, 256, 512.
        seed: uint64 seed (0 <= seed < 2**64).
        layer: 0-based attention layer index (>= 0).
        kind: ``"k"`` or ``"v"``: keys and values use independent streams.
        device: where to put the mask (default CPU).

    Returns:
        int32 ``[dim // 32]`` mask words (uint32 bit patterns).

    Raises:
        ValueError: unsupported ``dim``, ``kind`` not "k"/"v", ``seed`` or ``layer`` out of range.

    Example:
        >>> import torch_aura
        >>> [hex(w & 0xFFFFFFFF) for w in torch_aura.aura_sign_mask(128).tolist()]
        ['0x4d197e6f', '0xa706dd2f', '0xaf37e97f', '0x2a98f501']
    """
    if dim not in HEAD_DIMS:
        raise ValueError(f"head_dim: expected one of {list(HEAD_DIMS)}, got {dim} (dim)")
    if kind not in ("k", "v"):
        raise ValueError(f"kind: expected 'k' or 'v', got {kind!r}")
    for name, value in (("seed", seed), ("layer", layer)):  # int() would truncate 1.5 or parse "3"
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{name}: expected an int, got {value!r} ({type(value).__name__})")
    if not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed: expected a uint64 (0 <= seed < 2**64), got {seed}")
    if int(layer) < 0:
        raise ValueError(f"layer: expected a 0-based index >= 0, got {layer}")
    words = _ref.sign_mask_words(dim, int(seed), int(layer), kind)
    return _ref.to_int32_bits(words).to(device)


@_debug.validated
def hadamard_rotate(x: torch.Tensor, sign_mask: torch.Tensor | None = None, scale: float = 1.0,
                    inverse: bool = False) -> torch.Tensor:
    """Signed Walsh-Hadamard rotation of the last dim: ``scale * H diag(s) x / sqrt(D)``.

    A fast Walsh-Hadamard transform (D log2 D adds), signs applied before H; ``inverse=True``
    computes ``scale * s * (H y) / sqrt(D)``, the exact inverse when ``scale == 1``.

    Args:
        x: ``[..., D]`` fp16, bf16 or fp32, D in {64, 128, 256, 512}, unit last stride.
        sign_mask: int32 ``[D // 32]`` from :func:`aura_sign_mask`, or None for s = +1.
        scale: multiplies the result (e.g. the softmax scale folded into a query).
        inverse: apply the inverse rotation instead.

    Returns:
        ``[..., D]`` in x's dtype (math in fp32).

    Raises:
        ValueError: bad dtype, unsupported head dim, wrong mask shape/dtype, device mismatch.

    Example:
        >>> import torch, torch_aura
        >>> x = torch.randn(3, 64)
        >>> s = torch_aura.aura_sign_mask(64)
        >>> y = torch_aura.hadamard_rotate(x, s)
        >>> torch.allclose(torch_aura.hadamard_rotate(y, s, inverse=True), x, atol=1e-5)
        True
    """
    return checked_call(_check.hadamard_rotate, torch.ops.aura.hadamard_rotate, x, sign_mask, scale, inverse)


@_debug.validated
def aura_encode(x: torch.Tensor, codebook: torch.Tensor, boundaries: torch.Tensor, bits: int,
                sign_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise vectors to AURA codes: norm/direction split, rotation, Lloyd-Max, bit packing.

    Per vector (aura-format.md §5): r = |x|; zero or non-finite rows give codes 2**(bits-1) and
    norm 0 (zero row) or NaN (a NaN/Inf element: non-finite input propagates to the attention that
    reads it, as dense attention propagates it); else y = rotate(x / r), idx_j = #{k : y_j > boundaries[k]}, norm = r / |codebook[idx]|
    (the corrected norm, so the decoded vector keeps |x|), codes packed LSB first (§6).

    Args:
        x: ``[..., D]`` fp16, bf16 or fp32, D in {64, 128, 256, 512}, unit last stride.
        codebook: fp32 ``[2**bits]`` from :func:`aura_codebook` (for this D).
        boundaries: fp32 ``[2**bits - 1]`` from :func:`aura_codebook`.
        bits: 2, 3, 4 or 8.
        sign_mask: int32 ``[D // 32]``, or None (no random signs; not recommended, §2).

    Returns:
        ``(codes int32 [..., D * bits // 32], norms fp32 [...])``.

    Raises:
        ValueError: bad dtype/shape, unsupported head dim or bits, codebook size not 2**bits.

    Example:
        >>> import torch, torch_aura
        >>> cb, bd = torch_aura.aura_codebook(4, 128)
        >>> codes, norms = torch_aura.aura_encode(torch.randn(5, 128), cb, bd, 4,
        ...                                       torch_aura.aura_sign_mask(128))
        >>> codes.shape, codes.dtype, norms.shape
        (torch.Size([5, 16]), torch.int32, torch.Size([5]))
    """
    return checked_call(_check.aura_encode, torch.ops.aura.aura_encode, x, codebook, boundaries, bits, sign_mask)


@_debug.validated
def aura_write_cache(x: torch.Tensor, codes_cache: torch.Tensor, norms_cache: torch.Tensor,
                     slot_mapping: torch.Tensor, codebook: torch.Tensor, boundaries: torch.Tensor,
                     bits: int, sign_mask: torch.Tensor | None = None, paged: bool = False) -> None:
    """Encode ``x`` and write it into cache slots, in place (equals :func:`aura_encode` + scatter).

    Args:
        x: ``[N, Hkv, D]`` fp16, bf16 or fp32 new tokens (one row per token).
        codes_cache: int32 ``[B, Hkv, T_cap, PW]`` (contiguous) or ``[num_blocks, page_size, Hkv, PW]``
            (paged), PW = D * bits // 32; unit last stride, other strides free. Written in place.
        norms_cache: fp32 ``[B, Hkv, T_cap]`` or ``[num_blocks, page_size, Hkv]``. Written in place.
        slot_mapping: int64 ``[N]``: ``b * T_cap + t`` (contiguous) or ``page * page_size + offset``
            (paged); a negative slot skips its row (padding). Slots must be distinct (-1 may
            repeat): the reference raises on a duplicate, the kernels do not check (two rows into
            one slot race).
        codebook, boundaries: fp32 ``[2**bits]``, ``[2**bits - 1]`` from :func:`aura_codebook`.
        bits: 2, 3, 4 or 8.
        sign_mask: int32 ``[D // 32]`` or None.
        paged: selects the paged layout.

    Returns:
        None: ``codes_cache`` and ``norms_cache`` are updated in place.

    Raises:
        ValueError: bad dtype/shape/device, a slot past the end of the cache, or a duplicate slot.
            Data errors (values, not shapes) are raised on CPU always and on CUDA / MPS under
            ``TORCH_AURA_DEBUG=1``; otherwise the kernels clamp or skip them (README,
            "Out-of-range data").

    Example:
        >>> import torch, torch_aura
        >>> cb, bd = torch_aura.aura_codebook(4, 64)
        >>> codes = torch.zeros(2, 3, 10, 8, dtype=torch.int32)   # B=2, Hkv=3, T_cap=10
        >>> norms = torch.zeros(2, 3, 10)
        >>> slots = torch.tensor([0 * 10 + 4, -1, 1 * 10 + 7])      # (b=0, t=4), skip, (b=1, t=7)
        >>> torch_aura.aura_write_cache(torch.randn(3, 3, 64), codes, norms, slots, cb, bd, 4)
        >>> (norms[0, :, 4] > 0).all().item(), (norms[1, :, 7] > 0).all().item(), int((norms > 0).sum())
        (True, True, 6)
    """
    checked_call(_check.aura_write_cache, torch.ops.aura.aura_write_cache,
                 x, codes_cache, norms_cache, slot_mapping, codebook, boundaries, bits, sign_mask, paged)


@_debug.validated
def aura_append(k: torch.Tensor, v: torch.Tensor, k_codes: torch.Tensor, k_norms: torch.Tensor,
                v_codes: torch.Tensor, v_norms: torch.Tensor, seq_lens: torch.Tensor, k_codebook: torch.Tensor,
                k_boundaries: torch.Tensor, v_codebook: torch.Tensor, v_boundaries: torch.Tensor, key_bits: int,
                value_bits: int, k_sign_mask: torch.Tensor | None = None, v_sign_mask: torch.Tensor | None = None,
                block_table: torch.Tensor | None = None) -> None:
    """Append L tokens per sequence to an AURA cache in one op: encode K and V, write, advance ``seq_lens``.

    Equals :func:`AuraCache.append <torch_aura.AuraCache.append>` of a plain cache (one scheme, no
    window, ``lengths=None``): token i of row b goes to position ``seq_lens[b] + i``
    (:func:`aura_write_cache` of K and of V at those slots), then ``seq_lens += L``. A position at or
    past the capacity is not written, and ``seq_lens`` still advances by L (not clamped), as
    ``AuraCache.append`` does on a GPU. On CUDA it is one kernel launch with no host sync (CUDA-graph
    safe): one CTA per sequence reads ``seq_lens[b]``, writes the row's tokens, then advances it.

    Args:
        k, v: ``[B, L, Hkv, D]`` fp16, bf16 or fp32 (the same dtype), unit last stride.
        k_codes, v_codes: int32 ``[B, Hkv, T_cap, PW]`` (contiguous) or ``[num_blocks, page_size, Hkv, PW]``
            (paged), PW = D * bits // 32 with ``key_bits`` / ``value_bits``; unit last stride, other
            strides free. Written in place.
        k_norms, v_norms: fp32 ``k_codes.shape[:3]``. Written in place.
        seq_lens: int32 ``[B]``, each row's current length; advanced by L in place.
        k_codebook, k_boundaries, v_codebook, v_boundaries: fp32 ``[2**bits]``, ``[2**bits - 1]`` from
            :func:`aura_codebook`.
        key_bits, value_bits: 2, 3, 4 or 8.
        k_sign_mask, v_sign_mask: int32 ``[D // 32]`` or None.
        block_table: None (contiguous) or int32 ``[B, max_blocks]`` (paged: position p of row b is
            offset ``p % page_size`` of page ``block_table[b, p // page_size]``; capacity
            ``max_blocks * page_size``).

    Returns:
        None: the caches and ``seq_lens`` are updated in place.

    Raises:
        ValueError: bad dtype/shape/device; a negative ``seq_lens``, or (paged) a written token whose
            block-table entry is not a page. Data errors are raised on CPU always and on CUDA under
            ``TORCH_AURA_DEBUG=1``; otherwise the kernel skips those tokens (README, "Out-of-range data").

    Example:
        >>> import torch, torch_aura
        >>> kcb, kbd = torch_aura.aura_codebook(4, 64)
        >>> vcb, vbd = torch_aura.aura_codebook(2, 64)
        >>> kc, vc = torch.zeros(2, 3, 4, 8, dtype=torch.int32), torch.zeros(2, 3, 4, 4, dtype=torch.int32)
        >>> kn, vn = torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)              # B=2, Hkv=3, T_cap=4
        >>> seq_lens = torch.tensor([1, 3], dtype=torch.int32)
        >>> k, v = torch.randn(2, 2, 3, 64), torch.randn(2, 2, 3, 64)          # L=2 tokens per row
        >>> torch_aura.aura_append(k, v, kc, kn, vc, vn, seq_lens, kcb, kbd, vcb, vbd, 4, 2)
        >>> seq_lens.tolist(), (kn[0, :, 1:3] > 0).all().item(), int((kn[1] > 0).sum())  # row 1: 1 token fits
        ([3, 5], True, 3)
    """
    checked_call(_check.aura_append, torch.ops.aura.aura_append, k, v, k_codes, k_norms, v_codes, v_norms,
                 seq_lens, k_codebook, k_boundaries, v_codebook, v_boundaries, key_bits, value_bits,
                 k_sign_mask, v_sign_mask, block_table)


@_debug.validated
def aura_dequantize(codes: torch.Tensor, norms: torch.Tensor, codebook: torch.Tensor, bits: int,
                    sign_mask: torch.Tensor | None = None,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Decode AURA codes: ``norm * codebook[idx]`` (rotated domain), or un-rotated given the mask.

    Args:
        codes: int32 ``[..., PW]`` packed codes, PW = D * bits // 32.
        norms: fp32 ``[...]`` corrected norms.
        codebook: fp32 ``[2**bits]`` from :func:`aura_codebook`.
        bits: 2, 3, 4 or 8.
        sign_mask: int32 ``[D // 32]``: also apply the inverse rotation (original domain).
        out_dtype: fp32 (default), fp16 or bf16.

    Returns:
        ``[..., D]`` in ``out_dtype``.

    Raises:
        ValueError: bad dtype/shape, a PW that matches no supported head dim for ``bits``.

    Example:
        >>> import torch, torch_aura
        >>> cb, bd = torch_aura.aura_codebook(8, 64)
        >>> s = torch_aura.aura_sign_mask(64)
        >>> x = torch.randn(4, 64)
        >>> x_hat = torch_aura.aura_dequantize(*torch_aura.aura_encode(x, cb, bd, 8, s), cb, 8, s)
        >>> bool(torch.nn.functional.cosine_similarity(x, x_hat).min() > 0.999)
        True
    """
    return checked_call(_check.aura_dequantize, torch.ops.aura.aura_dequantize,
                        codes, norms, codebook, bits, sign_mask, out_dtype)


@_debug.validated
def aura_flash_p1(q_rot: torch.Tensor, k_codes: torch.Tensor, k_norms: torch.Tensor,
                  v_codes: torch.Tensor, v_norms: torch.Tensor, seq_lens: torch.Tensor,
                  k_codebook: torch.Tensor, v_codebook: torch.Tensor, key_bits: int,
                  value_bits: int, block_table: torch.Tensor | None = None,
                  block_size: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pass 1 of compressed decode: per-block softmax partials in the rotated domain.

    For each (sequence b, query head h, block n of ``block_size`` tokens below ``seq_lens[b]``):
    s_t = norm_K[t] * q_rot . codebook_K[idx_K[t]], m = max s_t, l = sum exp(s_t - m),
    o = sum exp(s_t - m) * norm_V[t] * codebook_V[idx_V[t]]. Query head h reads KV head h // G.
    An empty block gives m = -inf, l = 0, o = 0. With a 4-D ``q_rot`` (causal) query i sits at
    position ``seq_lens[b] - L + i`` and sees tokens t <= that position.

    Args:
        q_rot: ``[B, Hq, D]`` or causal ``[B, L, Hq, D]``, already rotated with the K sign mask and
            scaled (see :func:`aura_decode`). Its dtype picks the CUDA kernel: fp32 runs the exact
            one (fp32-grade products, 1e-4 of the reference); fp16/bf16 the fast warp-split tensor-core
            one (q_rot, codebooks and p * norm_V rounded to fp16: ~1e-3 relative, value norms must
            stay below fp16's 65504).
        k_codes, v_codes: int32 ``[B, Hkv, T_cap, PW]`` or paged ``[num_blocks, page_size, Hkv, PW]``
            (PW from ``key_bits`` / ``value_bits``).
        k_norms, v_norms: fp32 ``[B, Hkv, T_cap]`` or paged ``[num_blocks, page_size, Hkv]``.
        seq_lens: int32 ``[B]`` live tokens per sequence (0 allowed).
        k_codebook, v_codebook: fp32 ``[2**key_bits]``, ``[2**value_bits]``.
        key_bits, value_bits: each 2, 3, 4 or 8.
        block_table: int32 ``[B, max_blocks]`` page indices (paged), or None (contiguous).
        block_size: tokens per block (>= 1).

    Returns:
        ``(o, m, l)``: fp32 ``o [B, (L,) Hq, NB, D]``, ``m``, ``l`` ``[B, (L,) Hq, NB]`` with
        NB = ceil(T_cap / block_size), or ceil(max_blocks * page_size / block_size) when paged.

    Raises:
        ValueError: bad shapes/dtypes/devices, Hq not a multiple of Hkv, ``seq_lens`` past the
            cache, page indices out of range for live tokens.
            Data errors (values, not shapes) are raised on CPU always and on CUDA / MPS under
            ``TORCH_AURA_DEBUG=1``; otherwise the kernels clamp or skip them (README,
            "Out-of-range data").

    Example:
        >>> import torch, torch_aura
        >>> cb, bd = torch_aura.aura_codebook(4, 64)
        >>> kc, kn = torch_aura.aura_encode(torch.randn(1, 2, 10, 64), cb, bd, 4)
        >>> o, m, l = torch_aura.aura_flash_p1(torch.randn(1, 4, 64), kc, kn, kc, kn,
        ...     torch.tensor([7], dtype=torch.int32), cb, cb, 4, 4, block_size=4)
        >>> o.shape, m.shape, l[0, 0].gt(0).tolist()
        (torch.Size([1, 4, 3, 64]), torch.Size([1, 4, 3]), [True, True, False])
    """
    return checked_call(_check.aura_flash_p1, torch.ops.aura.aura_flash_p1,
                        q_rot, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook, key_bits,
                        value_bits, block_table, block_size)


@_debug.validated
def aura_flash_p2(o: torch.Tensor, m: torch.Tensor, l: torch.Tensor,
                  v_sign_mask: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass 2: merge the block partials of :func:`aura_flash_p1`; optionally un-rotate.

    Over blocks with l > 0 (others are skipped, never multiplied by 0): M = max m,
    w = exp(m - M), o_rot = sum w o / sum w l, lse = M + ln(sum w l). No live block: out 0,
    lse -inf. Given ``v_sign_mask`` the output is un-rotated, s_V * H(o_rot) / sqrt(D).

    Args:
        o: fp32 ``[B, (L,) Hq, NB, D]``.
        m, l: fp32 ``[B, (L,) Hq, NB]``.
        v_sign_mask: int32 ``[D // 32]`` of the value rotation, or None (rotated-domain output).
        out_dtype: output dtype (default fp32).

    Returns:
        ``(out [B, (L,) Hq, D] in out_dtype, lse [B, (L,) Hq] fp32)``.

    Raises:
        ValueError: bad shapes/dtypes, unsupported head dim.

    Example:
        >>> import torch, torch_aura
        >>> o, m, l = torch.ones(1, 2, 3, 64), torch.zeros(1, 2, 3), torch.tensor([[[2., 0., 2.]] * 2])
        >>> out, lse = torch_aura.aura_flash_p2(o, m, l)
        >>> out[0, 0, :3].tolist(), round(lse[0, 0].item(), 4)
        ([0.5, 0.5, 0.5], 1.3863)
    """
    return checked_call(_check.aura_flash_p2, torch.ops.aura.aura_flash_p2, o, m, l, v_sign_mask, out_dtype)


@_debug.validated
def aura_decode(q: torch.Tensor, k_codes: torch.Tensor, k_norms: torch.Tensor,
                v_codes: torch.Tensor, v_norms: torch.Tensor, seq_lens: torch.Tensor,
                k_codebook: torch.Tensor, v_codebook: torch.Tensor, k_sign_mask: torch.Tensor,
                v_sign_mask: torch.Tensor, key_bits: int, value_bits: int,
                block_table: torch.Tensor | None = None, scale: float | None = None,
                num_splits: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention straight from an AURA-compressed KV cache.

    q_rot = scale * Pi_K q (rotation with the K sign mask, softmax scale folded in), pass 1 over
    blocks, pass 2 with the fused inverse rotation by the V sign mask. Block size, from static
    values only: ``num_splits = 0`` -> automatic (the reference: 256 tokens; CUDA: enough blocks of
    >= 256 tokens to occupy every SM once, from batch, KV heads and the SM count);
    ``num_splits = S > 0`` -> ceil(capacity / S) tokens (at most S blocks); paged caches round it up
    to whole pages. The block size changes only the fp32 summation order, not the result's meaning.

    Args:
        q: ``[B, Hq, D]`` or causal ``[B, L, Hq, D]`` (query i at position ``seq_lens[b] - L + i``:
            write the L new tokens first), fp16, bf16 or fp32 (which picks the CUDA pass-1
            kernel as in :func:`aura_flash_p1`).
        k_codes, v_codes: int32 ``[B, Hkv, T_cap, PW]`` or paged ``[num_blocks, page_size, Hkv, PW]``.
        k_norms, v_norms: fp32 ``[B, Hkv, T_cap]`` or paged ``[num_blocks, page_size, Hkv]``.
        seq_lens: int32 ``[B]`` live tokens per sequence (0 gives out 0, lse -inf).
        k_codebook, v_codebook: fp32 ``[2**key_bits]``, ``[2**value_bits]`` for this D.
        k_sign_mask, v_sign_mask: int32 ``[D // 32]`` the cache was encoded with.
        key_bits, value_bits: each 2, 3, 4 or 8.
        block_table: int32 ``[B, max_blocks]`` (paged) or None.
        scale: softmax scale, default D ** -0.5.
        num_splits: 0 = automatic, else the number of pass-1 blocks to aim for.

    Returns:
        ``(out [B, (L,) Hq, D] in q's dtype, lse [B, (L,) Hq] fp32)``; lse is the natural-log
        softmax denominator with the scale included.

    Raises:
        ValueError: bad shapes/dtypes/devices, unsupported head dim or bits, Hq not a multiple of
            Hkv, ``seq_lens`` past the cache.
            Data errors (values, not shapes) are raised on CPU always and on CUDA / MPS under
            ``TORCH_AURA_DEBUG=1``; otherwise the kernels clamp or skip them (README,
            "Out-of-range data").

    Example:
        >>> import torch, torch_aura
        >>> cache = torch_aura.AuraCache("aura4v2", batch=1, kv_heads=2, head_dim=64, capacity=16)
        >>> cache.append(torch.randn(1, 5, 2, 64), torch.randn(1, 5, 2, 64))
        >>> out, lse = torch_aura.aura_decode(torch.randn(1, 4, 64), cache.k_codes, cache.k_norms,
        ...     cache.v_codes, cache.v_norms, cache.seq_lens, cache.k_codebook, cache.v_codebook,
        ...     cache.k_sign_mask, cache.v_sign_mask, 4, 2)
        >>> out.shape, lse.shape
        (torch.Size([1, 4, 64]), torch.Size([1, 4]))
    """
    return checked_call(_check.aura_decode, torch.ops.aura.aura_decode,
                        q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook, k_sign_mask,
                        v_sign_mask, key_bits, value_bits, block_table, scale, num_splits)
