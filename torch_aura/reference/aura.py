"""Pure-PyTorch reference of the AURA compressed KV cache family (aura-format.md).

Read top to bottom, this file is the format: sign masks (§3), codebooks (§4), the signed
Walsh-Hadamard rotation (§2), encode (§5), bit packing (§6), cache writes (§7), and decode attention
in the compressed domain as the kernels do it: pass 1 per block of tokens, pass 2 merging the block
partials and un-rotating (§8). All math is fp32; only the host-side tables use fp64 / Python ints.

Every op function takes its schema arguments and assumes ``torch_aura._checks.aura`` already
validated the metadata; only data-dependent errors (slot indices, ``seq_lens``, page indices) are
raised here, since only here may values be read.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import torch

from .._checks.aura import HEAD_DIMS, packed_words
from . import aura_codebooks

# =============================================================================== §3 sign masks
_M64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """One SplitMix64 output for the 64-bit input ``x`` (Steele, Lea, Flood 2014), Python ints."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def sign_mask_words(dim: int, seed: int = 0, layer: int = 0, kind: str = "k") -> list[int]:
    """The ``dim // 32`` mask words of (seed, layer, kind) as uint32 Python ints (§3).

    Counter-based: word i of the 64-bit stream depends only on (stream, i), so every backend
    regenerates the same bits without sharing RNG state, and a smaller D's mask is a prefix.
    """
    kind_id = {"k": 0, "v": 1}[kind]
    stream = splitmix64((seed ^ (2 * layer + kind_id)) & _M64)
    out = []
    for i in range(dim // 64):
        word = splitmix64((stream + i) & _M64)
        out += [word & 0xFFFFFFFF, word >> 32]  # low half first: bit j of the mask is sign j
    return out


def to_int32_bits(values) -> torch.Tensor:
    """uint32 bit patterns (Python ints or an int64 tensor) -> the int32 tensor holding them."""
    v = torch.as_tensor(values, dtype=torch.int64)
    # Two's complement by hand: values >= 2^31 become negative int32 with the same 32 bits.
    return torch.where(v >= 2**31, v - 2**32, v).to(torch.int32)


def signs_from_mask(sign_mask: torch.Tensor | None, dim: int, device=None) -> torch.Tensor:
    """fp32 ``[dim]`` of +-1: s_j = -1 where bit (j mod 32) of word (j div 32) is set; +1 without a mask."""
    if sign_mask is None:
        return torch.ones(dim, dtype=torch.float32, device=device)
    j = torch.arange(dim, device=sign_mask.device)
    # int64 widening sign-extends bit 31 upwards; (>> sh) & 1 still reads exactly bit sh.
    bit = (sign_mask.to(torch.int64)[j // 32] >> (j % 32)) & 1
    return (1 - 2 * bit).to(torch.float32)


# ================================================================================ §4 codebooks
@functools.lru_cache(maxsize=None)
def _codebook_cpu(bits: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.tensor(aura_codebooks.UNIT_POSITIVE[bits], dtype=torch.float32)
    unit = torch.cat([-pos.flip(0), pos])  # ascending, symmetric
    # Boundaries: the exact midpoint of two fp32 values (exact in fp64), rounded once to fp32.
    unit_bounds = ((unit[:-1].double() + unit[1:].double()) * 0.5).float()
    # Per-D tables in fp64 from the fp32 values, rounded once: exact for D = 64, 256 (sqrt is a
    # power of two), and the numbers every backend uses; kernels never derive their own.
    inv = 1.0 / math.sqrt(dim)
    return (unit.double() * inv).float(), (unit_bounds.double() * inv).float()


def codebook(bits: int, dim: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codebook fp32 [2**bits], boundaries fp32 [2**bits - 1])`` scaled by 1/sqrt(dim) (§4)."""
    cb, bd = _codebook_cpu(bits, dim)
    return cb.clone().to(device), bd.clone().to(device)


# ================================================================================ §2 rotation
def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised fast Walsh-Hadamard transform H x over the last dim (fp32, natural order).

    Butterfly strides 1, 2, ..., D/2; each stage pairs x[i] and x[i + h] within blocks of 2h and
    writes (a + b, a - b): D log2(D) adds and no multiplies. The result equals the Sylvester matrix
    H[i, j] = (-1)^popcount(i & j) times x, whatever the stage order, which is what lets a kernel
    do the low strides as lane shuffles and the high ones inside registers (§8).
    """
    D = x.shape[-1]
    lead = x.shape[:-1]
    h = 1
    while h < D:
        pairs = x.reshape(*lead, D // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2).reshape(*lead, D)
        h *= 2
    return x


def hadamard_rotate(x, sign_mask=None, scale=1.0, inverse=False):
    """Forward y = scale H(s * x)/sqrt(D), inverse x = scale s * (H y)/sqrt(D) (§2)."""
    D = x.shape[-1]
    s = signs_from_mask(sign_mask, D, device=x.device)
    xf = x.to(torch.float32)
    factor = float(scale) / math.sqrt(D)
    if inverse:
        y = s * fwht(xf) * factor  # signs after H: the transpose of H diag(s)
    else:
        y = fwht(s * xf) * factor  # signs before H, so structure is spread over every coordinate
    return y.to(x.dtype).contiguous()


# ============================================================================= §6 bit packing
def _bit_positions(D: int, bits: int, device):
    """For code j: word index w, shift sh inside it, and whether it spills into word w + 1."""
    bit = torch.arange(D, device=device, dtype=torch.int64) * bits
    w, sh = bit >> 5, bit & 31
    spills = (sh + bits) > 32  # only b = 3 straddles: j = 10, 21 (mod 32)
    return w, sh, spills


def pack_codes(idx: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes ``[..., D]`` (integers in [0, 2**bits)) -> int32 words ``[..., PW]`` (§6).

    One little-endian bit stream per vector: code j occupies bits [j b, j b + b), LSB first. The
    low part of a code goes to word w shifted left by sh; a 3-bit code crossing a word boundary
    puts its remaining high bits at the bottom of word w + 1. Work is in int64 so no shift is
    arithmetic; disjoint bits make add the same as or.
    """
    D = idx.shape[-1]
    PW = packed_words(D, bits)
    w, sh, spills = _bit_positions(D, bits, idx.device)
    code = idx.to(torch.int64)
    lo = (code << sh) & 0xFFFFFFFF
    hi = torch.where(spills, code >> (32 - sh), torch.zeros_like(code))
    words = torch.zeros(*idx.shape[:-1], PW + 1, dtype=torch.int64, device=idx.device)
    words.index_add_(-1, w, lo)
    words.index_add_(-1, w + 1, hi)  # word PW only ever receives zeros
    return to_int32_bits(words[..., :PW])


def unpack_codes(codes: torch.Tensor, bits: int, D: int) -> torch.Tensor:
    """int32 words ``[..., PW]`` -> codes int64 ``[..., D]``, the inverse of :func:`pack_codes`.

    Widened to int64 and masked to 32 bits first: torch's int32 right shift is arithmetic and
    would smear bit 31 of a word into the high codes (§6).
    """
    PW = codes.shape[-1]
    w, sh, spills = _bit_positions(D, bits, codes.device)
    words = codes.to(torch.int64) & 0xFFFFFFFF
    low = words[..., w] >> sh
    nxt = words[..., (w + 1).clamp(max=PW - 1)]
    high = torch.where(spills, nxt << (32 - sh), torch.zeros_like(nxt))
    return (low | high) & ((1 << bits) - 1)


# ================================================================================== §5 encode
def _row_norm(x: torch.Tensor) -> torch.Tensor:
    """sqrt(sum x^2) in fp32, as a kernel computes it (no overflow-avoiding rescale: a row whose
    squares overflow gets r = inf and is stored as zero, like a NaN/Inf row)."""
    return torch.sqrt((x * x).sum(-1))


def encode_indices(x: torch.Tensor, codebook_d: torch.Tensor, boundaries_d: torch.Tensor, bits: int,
                   sign_mask=None):
    """Steps 1-4 of §5 before packing: ``(idx int64 [..., D], norms fp32 [...])``."""
    x = x.to(torch.float32)
    r = _row_norm(x)
    bad = (r == 0) | ~torch.isfinite(r)  # any NaN/Inf element makes r NaN or inf
    # Divide good rows only: the codes of a bad row are fixed (2^(b-1)), its norm says what it was.
    u = torch.where(bad[..., None], torch.zeros_like(x), x / torch.where(bad, 1.0, r)[..., None])
    y = hadamard_rotate(u, sign_mask)
    # idx_j = #{k : y_j > boundaries[k]}, strict: a tie takes the lower index. bucketize with
    # right=False returns the count of boundaries strictly below y, i.e. exactly that count, and
    # equals nearest-centroid search because boundaries are the centroid midpoints. (Same answer
    # as searchsorted, which costs ~0.4 ms per call on small inputs on 2 cores: 12x bucketize.)
    idx = torch.bucketize(y, boundaries_d.contiguous(), right=False)
    c_hat = codebook_d[idx]
    # Corrected norm: the decoded vector norm * Pi^T c_hat keeps |x|, since |c_hat| != 1.
    norms = r / _row_norm(c_hat)
    idx = torch.where(bad[..., None], torch.full_like(idx, 1 << (bits - 1)), idx)
    # NaN / Inf propagate, as dense attention propagates them: the row's norm is NaN, so every
    # logit (K) or output (V) that reads it is NaN. A zero row is a valid vector of norm 0.
    norms = torch.where(r == 0, torch.zeros_like(norms), torch.where(bad, torch.full_like(norms, float("nan")), norms))
    return idx, norms.to(torch.float32)


def aura_encode(x, codebook, boundaries, bits, sign_mask=None):
    idx, norms = encode_indices(x, codebook, boundaries, bits, sign_mask)
    return pack_codes(idx, bits), norms.contiguous()


# ========================================================================== §7 cache writes
def aura_write_cache(x, codes_cache, norms_cache, slot_mapping, codebook, boundaries, bits,
                     sign_mask=None, paged=False):
    """Encode ``x [N, Hkv, D]`` and scatter row n to ``slot_mapping[n]``; slot < 0 skips the row."""
    return write_cache_with(REFERENCE, x, codes_cache, norms_cache, slot_mapping, codebook,
                            boundaries, bits, sign_mask, paged)


def aura_append(k, v, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, k_boundaries, v_codebook,
                v_boundaries, key_bits, value_bits, k_sign_mask=None, v_sign_mask=None, block_table=None):
    """Token i of row b to position ``seq_lens[b] + i`` (skipped at or past the capacity), ``seq_lens += L``."""
    return append_with(REFERENCE, k, v, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, k_boundaries,
                       v_codebook, v_boundaries, key_bits, value_bits, k_sign_mask, v_sign_mask, block_table)


def append_slots(seq_lens: torch.Tensor, L: int, codes: torch.Tensor, block_table=None,
                 strict: bool = True) -> torch.Tensor:
    """int64 ``[B * L]`` slots of ``aura_append`` in ``aura_write_cache``'s numbering (row b's tokens in
    order): position ``p = seq_lens[b] + i``; -1 (skip) where ``p`` is at or past the capacity. The
    data checks a kernel cannot make: ``seq_lens >= 0``; paged, a valid page for every written token.
    ``strict=False``: what the kernels do with such data instead (they read nothing on the host): the
    token concerned is skipped."""
    B = seq_lens.shape[0]
    lens = seq_lens.to(torch.int64)
    if strict and lens.numel() and int(lens.min()) < 0:
        raise ValueError(f"seq_lens: expected values >= 0, got {lens.tolist()[:8]}")
    pos = lens[:, None] + torch.arange(L, dtype=torch.int64, device=seq_lens.device)[None, :]  # [B, L]
    if block_table is None:
        capacity = codes.shape[2]
        slots = torch.arange(B, dtype=torch.int64, device=seq_lens.device)[:, None] * capacity + pos
        live = (pos >= 0) & (pos < capacity)
    else:
        num_blocks, page_size, max_blocks = codes.shape[0], codes.shape[1], block_table.shape[1]
        capacity = max_blocks * page_size
        if capacity == 0:
            return torch.full((B * L,), -1, dtype=torch.int64, device=seq_lens.device)
        live = (pos >= 0) & (pos < capacity)
        page = block_table.gather(1, (pos.clamp(min=0) // page_size).clamp(max=max_blocks - 1)).to(torch.int64)
        missing = live & ((page < 0) | (page >= num_blocks))
        if strict and bool(missing.any()):
            rows = missing.any(1).nonzero().flatten().tolist()
            raise ValueError(f"block_table: rows {rows[:8]} have no valid page (an entry outside [0, {num_blocks}), "
                             "e.g. -1) for tokens this append writes")
        live &= ~missing
        slots = page * page_size + pos % page_size
    return torch.where(live, slots, -1).reshape(-1)


def append_with(ops, k, v, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, k_boundaries, v_codebook,
                v_boundaries, key_bits, value_bits, k_sign_mask=None, v_sign_mask=None, block_table=None):
    """``aura_append`` as ``AuraCache.append`` composes it: the slots, ``aura_write_cache`` for K and V
    (with the ``aura_encode`` of ``ops``), then ``seq_lens += L`` in place (not clamped: a row past
    its capacity keeps counting, its tokens are not written)."""
    B, L, Hkv, D = k.shape
    slots = append_slots(seq_lens, L, k_codes, block_table)
    paged = block_table is not None
    write_cache_with(ops, k.reshape(B * L, Hkv, D), k_codes, k_norms, slots, k_codebook, k_boundaries, key_bits,
                     k_sign_mask, paged)
    write_cache_with(ops, v.reshape(B * L, Hkv, D), v_codes, v_norms, slots, v_codebook, v_boundaries, value_bits,
                     v_sign_mask, paged)
    seq_lens += L
    return None


class Kernels(NamedTuple):
    """The kernels :func:`decode_with` and :func:`write_cache_with` compose, by name: this module's
    references (``REFERENCE``, defined at the end) or a backend's own (``cpu/aura.py``'s ``NATIVE``)."""

    aura_encode: Callable
    hadamard_rotate: Callable
    aura_flash_p1: Callable
    aura_flash_p2: Callable


def write_cache_with(ops, x, codes_cache, norms_cache, slot_mapping, codebook, boundaries, bits,
                     sign_mask=None, paged=False):
    """``aura_write_cache`` with the ``aura_encode`` of ``ops`` (see ``decode_with``)."""
    if paged:
        num_blocks, page_size = codes_cache.shape[0], codes_cache.shape[1]
        n_slots, what = num_blocks * page_size, "num_blocks * page_size"
    else:
        B, T_cap = codes_cache.shape[0], codes_cache.shape[2]
        n_slots, what = B * T_cap, "B * T_cap"
    slots = slot_mapping.to(torch.int64)
    if slots.numel() and int(slots.max()) >= n_slots:  # data check: only the reference reads values
        raise ValueError(f"slot_mapping: expected slots < {what} = {n_slots} (or < 0 to skip), "
                         f"got max {int(slots.max())}")
    values, counts = slots[slots >= 0].unique(return_counts=True)
    if (counts > 1).any():  # two rows into one slot: which one lands would be a race in a kernel
        raise ValueError("slot_mapping: expected distinct slots (-1 may repeat), got duplicates "
                         f"{values[counts > 1].tolist()[:8]}")
    keep = slots >= 0
    rows, slots = x[keep], slots[keep]
    if rows.shape[0] == 0:
        return None
    codes, norms = ops.aura_encode(rows, codebook, boundaries, bits, sign_mask)  # [n, Hkv, PW], [n, Hkv]
    if paged:
        block, offset = slots // page_size, slots % page_size
        codes_cache[block, offset] = codes  # codes_cache[block, offset, :, :]
        norms_cache[block, offset] = norms
    else:
        b, t = slots // T_cap, slots % T_cap
        codes_cache[b, :, t] = codes  # advanced indices first: [n, Hkv, PW]
        norms_cache[b, :, t] = norms
    return None


def aura_dequantize(codes, norms, codebook, bits, sign_mask=None, out_dtype=None):
    """norm * codebook[idx] (rotated domain), or norm * Pi^T c_hat given the sign mask (§8)."""
    D = codes.shape[-1] * 32 // bits
    c_hat = codebook.to(torch.float32)[unpack_codes(codes, bits, D)]
    x = norms.to(torch.float32)[..., None] * c_hat
    if sign_mask is not None:
        x = hadamard_rotate(x, sign_mask, inverse=True)
    return x.to(out_dtype or torch.float32).contiguous()


# ================================================================ §8 compressed-domain attention
def _gather_block(codes, norms, seq_lens, block_table, t0: int, t1: int):
    """Rows t0 <= t < t1 of every sequence: ``codes [B, Hkv, n, PW]``, ``norms [B, Hkv, n]``, ``valid [B, n]``.

    Tokens at or past ``seq_lens[b]`` are never read by a kernel, so their page indices may be
    garbage: they are replaced by page 0 before the gather and masked by ``valid`` afterwards.
    """
    t = torch.arange(t0, t1, device=seq_lens.device)
    valid = t[None, :] < seq_lens.to(torch.int64)[:, None]  # [B, n]
    if block_table is None:
        block_codes, block_norms = codes[:, :, t0:t1], norms[:, :, t0:t1]
    else:
        page_size = codes.shape[1]
        pages = block_table.to(torch.int64)[:, t // page_size]  # [B, n]
        pages = torch.where(valid, pages, torch.zeros_like(pages))
        rows = (t % page_size)[None, :].expand_as(pages)
        # [num_blocks, page_size, Hkv, PW][pages, rows] -> [B, n, Hkv, PW] -> [B, Hkv, n, PW]
        block_codes, block_norms = codes[pages, rows].transpose(1, 2), norms[pages, rows].transpose(1, 2)
    # One dense tile per block (the kernel's shared-memory stage), whatever the cache layout, so
    # both layouts run the very same fp32 arithmetic and give bitwise-equal partials.
    return block_codes.contiguous(), block_norms.contiguous(), valid


class CacheGeometry(NamedTuple):
    """Static shape facts of a codes cache (§7): ``num_blocks`` and ``page_size`` are 0 when contiguous."""
    Hkv: int
    capacity: int  # token slots per sequence: T_cap, or max_blocks * page_size
    num_blocks: int
    page_size: int


def cache_geometry(k_codes: torch.Tensor, block_table: torch.Tensor | None) -> CacheGeometry:
    """From the layout: contiguous ``[B, Hkv, T_cap, PW]``, or paged ``[num_blocks, page_size, Hkv, PW]``
    read through ``block_table [B, max_blocks]``."""
    if block_table is None:
        return CacheGeometry(k_codes.shape[1], k_codes.shape[2], 0, 0)
    num_blocks, page_size, Hkv = k_codes.shape[0], k_codes.shape[1], k_codes.shape[2]
    return CacheGeometry(Hkv, block_table.shape[1] * page_size, num_blocks, page_size)


def _check_seq_lens(seq_lens, block_table, capacity: int, num_blocks: int, page_size: int) -> None:
    """Data-dependent checks of pass 1 (the reference is the only place allowed to read values)."""
    if seq_lens.numel() == 0:
        return
    lo, hi = int(seq_lens.min()), int(seq_lens.max())
    if lo < 0 or hi > capacity:
        where = "T_cap" if block_table is None else "max_blocks * page_size"
        raise ValueError(f"seq_lens: expected values in [0, {where} = {capacity}], got min {lo}, max {hi}")
    if block_table is not None and hi > 0:
        used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] * page_size
        live = used < seq_lens.to(torch.int64)[:, None]  # pages that hold a live token
        pages = block_table[live]
        if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= num_blocks):
            raise ValueError(f"block_table: expected page indices in [0, num_blocks = {num_blocks}) for "
                             f"live tokens, got min {int(pages.min())}, max {int(pages.max())}")


def aura_flash_p1(q_rot, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook,
                  key_bits, value_bits, block_table=None, block_size=64):
    """Pass 1: per (b, query, query head, block) unnormalised partials in the rotated domain.

    The loop is over blocks of ``block_size`` tokens, as the kernel's grid is; inside a block each
    KV head's codes are unpacked and looked up once and shared by the G query heads of its group
    (and the L causal queries), which is how the kernel must do it (§9: unpack dominates).
    """
    causal = q_rot.dim() == 4
    q = q_rot.to(torch.float32)
    if not causal:
        q = q[:, None]  # L = 1: the causal rule t <= seq_len - 1 is then the plain t < seq_len
    B, L, Hq, D = q.shape
    Hkv, capacity, num_blocks, page_size = cache_geometry(k_codes, block_table)
    _check_seq_lens(seq_lens, block_table, capacity, num_blocks, page_size)
    G = Hq // Hkv
    NB = -(-capacity // block_size)  # static: never derived from seq_lens
    qg = q.reshape(B, L, Hkv, G, D)  # query head h = kv * G + g reads KV head kv = h // G
    k_cb, v_cb = k_codebook.to(torch.float32), v_codebook.to(torch.float32)
    seq = seq_lens.to(torch.int64)
    # Absolute position of causal query i: p_i = seq_len - L + i; it sees tokens t <= p_i.
    pos = seq[:, None] - L + torch.arange(L, device=seq.device)[None, :]  # [B, L]

    o = torch.empty(B, L, Hkv, G, NB, D, dtype=torch.float32, device=q.device)
    m = torch.empty(B, L, Hkv, G, NB, dtype=torch.float32, device=q.device)
    l = torch.empty(B, L, Hkv, G, NB, dtype=torch.float32, device=q.device)
    for n in range(NB):
        t0, t1 = n * block_size, min((n + 1) * block_size, capacity)
        kc, kn, valid = _gather_block(k_codes, k_norms, seq_lens, block_table, t0, t1)
        vc, vn, _ = _gather_block(v_codes, v_norms, seq_lens, block_table, t0, t1)
        # Dequantise the block once per KV head (codebook values; norms kept apart as the kernel
        # applies them per token). Dead rows' norms may be NaN garbage: zero them, never read.
        k_hat = k_cb[unpack_codes(kc, key_bits, D)]  # [B, Hkv, n, D]
        v_hat = v_cb[unpack_codes(vc, value_bits, D)]
        kn = torch.where(valid[:, None, :], kn.to(torch.float32), 0.0)
        vn = torch.where(valid[:, None, :], vn.to(torch.float32), 0.0)
        # s_t = norm_K[t] * sum_j q_rot[j] c_K[idx_K[t, j]]   -> [B, L, Hkv, G, n]
        s = torch.einsum("blkgd,bknd->blkgn", qg, k_hat) * kn[:, None, :, None, :]
        t = torch.arange(t0, t1, device=q.device)
        sees = valid[:, None, :] & (t[None, None, :] <= pos[:, :, None])  # [B, L, n]
        sees = sees[:, :, None, None, :]
        s = torch.where(sees, s, -math.inf)
        m_blk = s.amax(-1)  # every block holds >= 1 token slot: NB = ceil(capacity / block_size)
        # An empty block keeps m = -inf, l = 0, o = 0; exp(s - m) is guarded, never exp(-inf + inf).
        m_safe = torch.where(torch.isfinite(m_blk), m_blk, 0.0)
        p = torch.where(sees, torch.exp(s - m_safe[..., None]), 0.0)
        l_blk = p.sum(-1)
        # o[j] = sum_t p_t * norm_V[t] * c_V[idx_V[t, j]]  (rotated domain, unnormalised)
        o_blk = torch.einsum("blkgn,bknd->blkgd", p * vn[:, None, :, None, :], v_hat)
        o[..., n, :], m[..., n], l[..., n] = o_blk, m_blk, l_blk
    o, m, l = o.reshape(B, L, Hq, NB, D), m.reshape(B, L, Hq, NB), l.reshape(B, L, Hq, NB)
    if not causal:
        o, m, l = o[:, 0], m[:, 0], l[:, 0]
    return o.contiguous(), m.contiguous(), l.contiguous()


def aura_flash_p2(o, m, l, v_sign_mask=None, out_dtype=None):
    """Pass 2: log-sum-exp merge of the block partials, then (given the V mask) the inverse rotation.

    Blocks with l == 0 are empty (pass 1 writes l = 0, m = -inf, o = 0 for them) and skipped, not
    weighted by 0: 0 * NaN is NaN (decode.md §5). With no live block: out = 0, lse = -inf. A live
    block whose l or m is NaN came from NaN / Inf data: the row is NaN, as dense attention gives.
    """
    poisoned = ((l != 0) & (l.isnan() | m.isnan())).any(-1)  # [...]: NaN/Inf in the data
    live = l > 0
    m_live = torch.where(live, m, -math.inf)
    M = m_live.amax(-1) if m.shape[-1] else torch.full(m.shape[:-1], -math.inf, device=m.device)
    any_live = torch.isfinite(M)
    M_safe = torch.where(any_live, M, 0.0)
    w = torch.where(live, torch.exp(m_live - M_safe[..., None]), 0.0)  # [..., NB]
    l_sum = (w * torch.where(live, l, 0.0)).sum(-1)
    o_sum = (w[..., None] * torch.where(live[..., None], o, 0.0)).sum(-2)
    denom = torch.where(any_live, l_sum, 1.0)
    o_rot = torch.where(any_live[..., None], o_sum / denom[..., None], 0.0)
    lse = torch.where(any_live, M_safe + torch.log(denom), -math.inf)
    o_rot = torch.where(poisoned[..., None], math.nan, o_rot)
    lse = torch.where(poisoned, math.nan, lse)
    if v_sign_mask is not None:
        # The fused reduce + un-rotation: out = s_V * H(o_rot) / sqrt(D), a butterfly, not a matmul.
        o_rot = hadamard_rotate(o_rot, v_sign_mask, inverse=True)
    return o_rot.to(out_dtype or torch.float32).contiguous(), lse.to(torch.float32).contiguous()


# Tokens per pass-1 block when aura_decode chooses (num_splits = 0): decode.md §4's 256-token floor
# under which a split costs more than the work it saves.
AUTO_BLOCK_TOKENS = 256


def decode_block_size(capacity: int, page_size: int | None = None, num_splits: int = 0) -> int:
    """Pass-1 block size ``aura_decode`` uses, from static values only (never from ``seq_lens``).

    * ``num_splits = 0``: blocks of ``AUTO_BLOCK_TOKENS`` (256) tokens, so the number of blocks
      grows with the cache capacity; a GPU kernel may pick its own split from the SM count
      (decode.md §4): the result differs only by fp32 rounding of the merge.
    * ``num_splits = S > 0``: ``ceil(capacity / S)`` tokens, i.e. at most S blocks.
    * Paged caches: rounded up to a whole number of pages, so a block resolves each page index once
      (then the block count may be below S).
    """
    bs = AUTO_BLOCK_TOKENS if num_splits <= 0 else -(-capacity // num_splits)
    bs = max(bs, 1)
    if page_size:
        bs = -(-bs // page_size) * page_size
    return bs


def aura_decode(q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook,
                k_sign_mask, v_sign_mask, key_bits, value_bits, block_table=None, scale=None,
                num_splits=0):
    """Rotate q with Pi_K (softmax scale folded in), pass 1, pass 2 with the fused un-rotation."""
    return decode_with(REFERENCE, q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook,
                       v_codebook, k_sign_mask, v_sign_mask, key_bits, value_bits, block_table, scale,
                       num_splits)


def decode_with(ops, q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook,
                k_sign_mask, v_sign_mask, key_bits, value_bits, block_table=None, scale=None,
                num_splits=0):
    """``aura_decode`` over the ``hadamard_rotate``, ``aura_flash_p1`` and ``aura_flash_p2`` of
    ``ops`` (a module with this module's signatures): the CPU fast path (torch_aura.cpu.aura)
    reuses this plan with its native kernels."""
    D = q.shape[-1]
    scale = D ** -0.5 if scale is None else float(scale)
    # q_rot . (Pi_K k) = scale * q . k: attention never leaves the rotated domain until the output.
    q_rot = ops.hadamard_rotate(q.to(torch.float32), k_sign_mask, scale=scale)
    geo = cache_geometry(k_codes, block_table)
    bs = decode_block_size(geo.capacity, geo.page_size or None, num_splits)
    o, m, l = ops.aura_flash_p1(q_rot, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook,
                                v_codebook, key_bits, value_bits, block_table, bs)
    return ops.aura_flash_p2(o, m, l, v_sign_mask, q.dtype)


# the references as the kernel table of the plans above
REFERENCE = Kernels(aura_encode=aura_encode, hadamard_rotate=hadamard_rotate, aura_flash_p1=aura_flash_p1,
                    aura_flash_p2=aura_flash_p2)
