"""``AuraCache``: one attention layer's AURA-compressed KV cache (aura-format.md §7-§8).

It owns what the ops would otherwise need fifteen arguments for: the scheme's bit widths, the
per-D codebooks and boundaries, the layer's K and V sign masks (seed, layer), the code and norm
tensors, and the device-side ``seq_lens``. A model needs three calls: construct, ``append``,
``decode``.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Sequence
from typing import NamedTuple

import torch

from . import _env
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


AUTO_CANDIDATES = ("aura3v4", "aura4v3", "aura4", "aura8v3", "aura8v4")
# aura_append walks a row's chunk in one CTA: right for decode steps and drafts, not a prefill (aura-format.md)
FUSED_APPEND_MAX_TOKENS = 16
_AUTO = "auto"


def scheme_bits(scheme: str, head_dim: int) -> float:
    """Bits per coordinate of ``scheme`` at ``head_dim``: K and V codes plus their fp32 norms over 2 * D
    coordinates (``"aura4"`` at D = 128: 4.25)."""
    kb, vb = parse_scheme(scheme)
    return (kb + vb) / 2 + 64 / (2 * head_dim)


def _check_schemes(scheme, kv_heads, bits_per_coordinate, candidates):
    """A scheme string, ``"auto"``, or a list of per-head schemes (one distinct scheme -> that string)."""
    kv_heads = _as_int(kv_heads)
    if scheme == _AUTO:
        if isinstance(bits_per_coordinate, bool) or not isinstance(bits_per_coordinate, numbers.Real) \
                or not bits_per_coordinate > 0:
            raise ValueError(f"bits_per_coordinate: scheme='auto' needs a positive byte budget in bits per "
                             f"coordinate (e.g. 4.5), got {bits_per_coordinate!r}")
        if candidates is not None and (isinstance(candidates, str) or len(candidates) < 1):
            raise ValueError(f"candidates: expected a non-empty list of schemes, got {candidates!r}")
        for c in candidates or AUTO_CANDIDATES:
            parse_scheme(c)
        return None
    if bits_per_coordinate is not None or candidates is not None:
        raise ValueError(f"bits_per_coordinate: a byte budget (and candidates) only applies to scheme='auto', "
                         f"got scheme={scheme!r}")
    if isinstance(scheme, str):
        parse_scheme(scheme)
        return scheme
    if not isinstance(scheme, Sequence) or not isinstance(kv_heads, int) or len(scheme) != kv_heads:
        raise ValueError(f"scheme: expected a scheme string, 'auto', or one scheme per KV head "
                         f"(kv_heads={kv_heads}), got {scheme!r}")
    for one in scheme:
        parse_scheme(one)
    return scheme[0] if len(set(scheme)) == 1 else list(scheme)


def plan_schemes(k: torch.Tensor, v: torch.Tensor, queries: torch.Tensor, bits_per_coordinate: float,
                 candidates: Sequence[str] = AUTO_CANDIDATES, *, seed: int = 0, layer: int = 0,
                 sink_tokens: int = 0, recent_tokens: int = 0, scale: float | None = None,
                 lengths: torch.Tensor | None = None, left_padded: bool = False):
    """Choose each KV head's scheme from a prefill's own keys, values and last queries (``scheme="auto"``).

    For every KV head and candidate, the prefill's last queries attend (causally) to the chunk
    encoded with that candidate (exact where the cache keeps sinks / a window exact) and to the
    exact chunk; the head's error is the largest ``1 - cosine`` of the two outputs over its query
    heads and queries (what a sharp head loses shows in its worst query). This measures what the
    choice is for: a head whose softmax is peaked or nearly tied turns a small logit error into a
    large output error, which no key-only statistic sees. The choice minimises the summed
    *squared* error of the heads (an exact knapsack: costs are whole half bits) with the mean
    over heads within ``bits_per_coordinate`` (:func:`scheme_bits`: codes and norms; the exact
    sinks/window are extra): the quality that matters is the worst head's, and the squares spend
    the bytes on the largest errors first rather than on several small ones that add up to as
    much (docs/aura-quality.md §4: measured against the plain sum, the minimax and smoother
    per-head statistics).

    Args:
        k, v: ``[B, L, Hkv, D]`` the prefill chunk (fp16, bf16 or fp32).
        queries: ``[B, Lq, Hq, D]``, the queries of the chunk's last Lq positions, Hq a multiple of Hkv.
        bits_per_coordinate: the budget, mean over KV heads.
        candidates: the schemes a head may get.
        seed, layer: the layer's sign masks (as the cache's).
        sink_tokens, recent_tokens: tokens the cache keeps exact (no error there).
        scale: softmax scale, default D ** -0.5.
        lengths, left_padded: as ``AuraCache.append``: real tokens per row of a padded chunk.

    Returns:
        ``(schemes, errors)``: one scheme per KV head, and fp64 ``[Hkv, len(candidates)]`` errors.

    Raises:
        ValueError: the cheapest candidate exceeds the budget, or shapes that do not fit.
    """
    from .ops.aura import aura_codebook, aura_dequantize, aura_encode, aura_sign_mask

    B, L, Hkv, D = k.shape
    if queries.dim() != 4 or queries.shape[0] != B or queries.shape[-1] != D or queries.shape[2] % Hkv \
            or not 1 <= queries.shape[1] <= L:
        _c.fail("queries", f"[B={B}, Lq <= {L}, Hq (a multiple of Hkv={Hkv}), D={D}]", tuple(queries.shape))
    Lq, G = queries.shape[1], queries.shape[2] // Hkv
    cands = [(c, *parse_scheme(c)) for c in candidates]
    cost = torch.tensor([scheme_bits(c, D) for c in candidates], dtype=torch.float64)
    scale = D ** -0.5 if scale is None else scale
    dev = k.device
    i = torch.arange(L, device=dev)[None, :]
    n = torch.full((B,), L, device=dev) if lengths is None else lengths.to(dev).long().clamp(0, L)
    pos = i - (L - n)[:, None] if left_padded else i.expand(B, L)  # position of chunk token i in its row
    valid = (pos >= 0) & (pos < n[:, None])
    exact = (pos < sink_tokens) | (pos >= n[:, None] - recent_tokens) if (sink_tokens or recent_tokens) else None
    kf, vf = k.float(), v.float()

    def roundtrip(x, bits, kind):
        cb, bd = aura_codebook(bits, D, dev)
        mask = aura_sign_mask(D, seed, layer, kind, dev)
        codes, norms = aura_encode(x.contiguous(), cb, bd, bits, mask)
        y = aura_dequantize(codes, norms, cb, bits, mask)
        return y if exact is None else torch.where(exact[:, :, None, None], x, y)

    kq = {kb: roundtrip(kf, kb, "k") for kb in sorted({kb for _, kb, _ in cands})}
    vq = {vb: roundtrip(vf, vb, "v") for vb in sorted({vb for _, _, vb in cands})}
    qi = L - Lq + torch.arange(Lq, device=dev)  # chunk index of each query
    see = valid[:, None, :] & (i[:, None, :] <= qi[None, :, None])  # [B, Lq, L]
    live = valid[:, L - Lq:, None].expand(B, Lq, G).reshape(-1)  # [B * Lq * G]: the queries of real tokens
    per_query = []  # [Hkv][C] of [B * Lq * G]: each query's 1 - cos, on the device (no host sync per head)
    for h in range(Hkv):
        qh = queries[:, :, h * G:(h + 1) * G].float()  # [B, Lq, G, D]

        def attend(K, V):
            s = scale * torch.einsum("bjgd,bid->bjgi", qh, K[:, :, h])
            p = torch.softmax(s.masked_fill(~see[:, :, None, :], -torch.inf), -1).nan_to_num(0.0)
            return torch.einsum("bjgi,bid->bjgd", p, V[:, :, h])

        ref = attend(kf, vf)
        per_query.append(torch.stack([
            1 - torch.nn.functional.cosine_similarity(attend(kq[kb], vq[vb]), ref, dim=-1).reshape(-1)
            for _, kb, vb in cands]))
    worst = torch.stack(per_query).double().masked_fill(~live, -torch.inf).amax(-1)  # each head's worst live query
    errors = torch.where(live.any(), worst, torch.zeros_like(worst)).cpu()  # [Hkv, C]: the one host sync
    # Exact knapsack over heads: costs are whole numbers of half bits ((kb + vb) / 2 + a constant).
    units = [kb + vb for _, kb, vb in cands]
    cap = math.floor((float(bits_per_coordinate) - 32 / D) * 2 * Hkv + 1e-9)
    if min(units) * Hkv > cap:
        raise ValueError(f"bits_per_coordinate: {bits_per_coordinate} is below the cheapest candidate "
                         f"({candidates[units.index(min(units))]}: {float(cost.min()):.3f} bits per coordinate "
                         f"at head_dim {D})")
    err = (errors ** 2).tolist()  # the knapsack minimises the summed squares: the largest errors first
    best = {0: (0.0, [])}  # units spent -> (summed squared error, choices), the lowest per spend
    for h in range(Hkv):
        nxt = {}
        for spent, (e, picks) in best.items():
            for j, u in enumerate(units):
                key = spent + u
                cand = (e + err[h][j], picks + [j])
                if key <= cap and (key not in nxt or cand[0] < nxt[key][0]):
                    nxt[key] = cand
        best = nxt
    # the lowest summed square; among equal ones the cheapest
    _, cur = min(best.values(), key=lambda ep: (round(ep[0], 12), sum(units[j] for j in ep[1])))
    return [candidates[j] for j in cur], errors


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
            bits in {2, 3, 4, 8}; or a list of one scheme per KV head (heads grouped by scheme, one
            store and one decode per group, docs/aura-quality.md §3); or ``"auto"``: each head's
            scheme chosen at the first ``append`` (which then needs ``queries``) by
            :func:`plan_schemes` within ``bits_per_coordinate``.
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
        rollback_tokens: spare ring slots, so a ``crop`` of up to this many tokens restores the
            exact window (speculative decoding; ``reserve_rollback`` adds more later).
        bits_per_coordinate, candidates: the budget (mean bits per K/V coordinate, codes + norms,
            :func:`scheme_bits`) and the choices of ``scheme="auto"`` (default ``AUTO_CANDIDATES``).

    Attributes:
        k_codes, v_codes: int32 code tensors; k_norms, v_norms: fp32 norm tensors (zero-initialised:
            a zero cache is valid and decodes to zeros). ``select_rows`` and ``grow`` replace them
            (and ``seq_lens``) with new tensors.
        seq_lens: int32 ``[B]`` live tokens per sequence, on the device (a per-head cache: its
            first group's; every group holds the same lengths).
        schemes: the scheme of each KV head (None until ``"auto"`` chose); ``bytes_per_token()``
            and ``bits_per_token_coordinate()`` what a token costs; ``head_errors``: ``"auto"``'s
            fp64 ``[Hkv, len(candidates)]`` measured errors. A per-head cache has no ``k_codes`` /
            ``key_bits`` of its own (its groups, plain caches, do).
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

    def __init__(self, scheme: str | Sequence[str] = "aura4v4", *, batch: int, kv_heads: int, head_dim: int,
                 capacity: int | None = None, num_blocks: int | None = None,
                 page_size: int | None = None, block_table: torch.Tensor | None = None,
                 seed: int = 0, layer: int = 0, device=None, sink_tokens: int = 0,
                 recent_tokens: int = 0, dtype: torch.dtype | None = None, rollback_tokens: int = 0,
                 bits_per_coordinate: float | None = None, candidates: Sequence[str] | None = None):
        options = dict(batch=batch, head_dim=head_dim, capacity=capacity, num_blocks=num_blocks,
                       page_size=page_size, block_table=block_table, seed=seed, layer=layer, device=device,
                       sink_tokens=sink_tokens, recent_tokens=recent_tokens, dtype=dtype,
                       rollback_tokens=rollback_tokens)
        scheme = _check_schemes(scheme, kv_heads, bits_per_coordinate, candidates)
        self._mixed = not isinstance(scheme, str)
        if self._mixed:
            self._init_mixed(scheme, kv_heads, options, bits_per_coordinate, candidates)
            return
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
        self.schemes = [scheme] * kv_heads
        self.seed, self.layer = seed, layer
        self.paged = capacity is None
        sink_tokens, recent_tokens = _as_int(sink_tokens), _as_int(recent_tokens)
        rollback_tokens = _as_int(rollback_tokens)
        for name, v in (("sink_tokens", sink_tokens), ("recent_tokens", recent_tokens),
                        ("rollback_tokens", rollback_tokens)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
        self.sink_tokens, self.recent_tokens = sink_tokens, recent_tokens
        self.rollback_tokens = rollback_tokens if recent_tokens else 0
        self._ring = recent_tokens + self.rollback_tokens  # ring slots: the window plus what a crop may restore
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
        # On CUDA a plain append (lengths=None, no window) of up to FUSED_APPEND_MAX_TOKENS tokens per row is one
        # aura_append launch instead of slots + two writes + the advance; TORCH_AURA_FUSED_APPEND=0 keeps the
        # unfused path.
        self._append_op = torch.ops.aura.aura_append.default
        self._fused_append = bool(_env.get("TORCH_AURA_FUSED_APPEND")) and self._dev.type == "cuda"
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

    # ------------------------------------------------------------------- per-head schemes
    def _init_mixed(self, schemes, kv_heads, options, bits_per_coordinate, candidates) -> None:
        """KV heads grouped by scheme, one plain cache per group (``schemes`` None: ``"auto"``,
        grouped at the first append)."""
        kv_heads = _as_int(kv_heads)
        if not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads < 1:
            raise ValueError(f"kv_heads: expected a positive int, got {kv_heads!r}")
        self.kv_heads, self._options = kv_heads, options
        self.scheme = _AUTO if schemes is None else list(schemes)
        self.key_bits = self.value_bits = None
        self.bits_per_coordinate = bits_per_coordinate
        self.candidates = tuple(candidates or AUTO_CANDIDATES) if schemes is None else None
        self.head_errors = None
        self._groups = None
        self._q_index = {}
        if schemes is None:  # validates the shared options (and takes their derived values) with one head
            self._adopt(AuraCache(self.candidates[0], kv_heads=1, **options))
            self.schemes = None
        else:
            self._group(schemes)

    def _adopt(self, c: "AuraCache") -> None:
        """Take the shared attributes (rows, capacity, layout, window, seq_lens) of group ``c``."""
        for name in ("batch", "head_dim", "capacity", "paged", "page_size", "block_table", "device", "_dev",
                     "seed", "layer", "sink_tokens", "recent_tokens", "rollback_tokens", "windowed", "_exact_dtype"):
            setattr(self, name, getattr(c, name))
        self.seq_lens = c.seq_lens if self._groups is not None else torch.zeros_like(c.seq_lens)

    def _group(self, schemes) -> None:
        order = list(dict.fromkeys(schemes))
        self.schemes = list(schemes)
        self._heads = [[h for h, s in enumerate(schemes) if s == one] for one in order]
        self._groups = [AuraCache(one, kv_heads=len(heads), **self._options) for one, heads in zip(order, self._heads)]
        dev = self._groups[0]._dev
        self._kv_index = [torch.tensor(heads, dtype=torch.int64, device=dev) for heads in self._heads]
        self._adopt(self._groups[0])

    def _query_index(self, Hq: int):
        """Per group, the query heads of its KV heads (GQA: h * G ... h * G + G - 1), and the inverse
        permutation that puts the groups' concatenated outputs back in head order."""
        if Hq in self._q_index:
            return self._q_index[Hq]
        G, dev = Hq // self.kv_heads, self._dev
        sel = [[h * G + g for h in heads for g in range(G)] for heads in self._heads]
        order = [j for one in sel for j in one]
        inv = [0] * Hq
        for position, head in enumerate(order):
            inv[head] = position
        built = ([torch.tensor(one, dtype=torch.int64, device=dev) for one in sel],
                 torch.tensor(inv, dtype=torch.int64, device=dev))
        if not torch.compiler.is_compiling():  # a store inside a traced step changes a guarded dict: a retrace
            self._q_index[Hq] = built
        return built

    def choose_schemes(self, k: torch.Tensor, v: torch.Tensor, queries: torch.Tensor | None,
                       query_scale: float | None = None, lengths: torch.Tensor | None = None,
                       left_padded: bool = False) -> None:
        """``scheme="auto"``: choose each KV head's scheme from a prefill chunk (:func:`plan_schemes`)
        and allocate one store per chosen scheme, without appending; ``append`` calls it on its first
        chunk. A no-op once chosen. Args as ``append`` (``queries`` ``[B, Lq, Hq, D]``)."""
        if not self._mixed or self._groups is not None:
            return
        if queries is None:
            raise ValueError("queries: scheme='auto' chooses each KV head's scheme at the first append from "
                             "the prefill's last queries: pass queries=[B, Lq, Hq, D]")
        _c.tensor("queries", queries, ndim=4, dtypes=_c.FLOATS)
        self._on_device("queries", queries)
        k4, v4 = (k, v) if k.dim() == 4 else (k[:, None], v[:, None])
        schemes, self.head_errors = plan_schemes(
            k4, v4, queries, self.bits_per_coordinate, self.candidates, seed=self.seed, layer=self.layer,
            sink_tokens=self.sink_tokens, recent_tokens=self.recent_tokens, scale=query_scale,
            lengths=lengths, left_padded=left_padded)
        self._group(schemes)

    def _append_mixed(self, k, v, lengths, left_padded, queries, query_scale) -> None:
        self.choose_schemes(k, v, queries, query_scale, lengths, left_padded)
        if len(self._groups) == 1:
            self._groups[0].append(k, v, lengths, left_padded)
            return
        for g, idx in zip(self._groups, self._kv_index):
            g.append(k.index_select(-2, idx), v.index_select(-2, idx), lengths, left_padded)

    def _decode_mixed(self, q, scale, num_splits):
        if self._groups is None:
            raise ValueError("decode: scheme='auto' has not chosen its schemes yet; append the prefill first")
        if len(self._groups) == 1:
            return self._groups[0].decode(q, scale, num_splits)
        sel, inv = self._query_index(q.shape[-2])
        outs, lses = zip(*(g.decode(q.index_select(-2, idx), scale, num_splits) for g, idx in zip(self._groups, sel)))
        return torch.cat(outs, -2).index_select(-2, inv), torch.cat(lses, -1).index_select(-1, inv)

    def _each(self, method: str, *args) -> None:
        """Apply a row/length method to every group, then take group 0's new shared attributes."""
        for g in self._groups:
            getattr(g, method)(*args)
        self._adopt(self._groups[0])

    def static_tensors(self) -> tuple[torch.Tensor, ...]:
        """Every device tensor that ``append``, ``crop`` and ``reset`` mutate in place (codes, norms,
        ``seq_lens``, the window's buffers), for callers that mark static addresses; new tensors
        after ``select_rows`` / ``grow``."""
        if self._mixed:
            return () if self._groups is None else tuple(t for g in self._groups for t in g.static_tensors())
        return (self.k_codes, self.v_codes, self.k_norms, self.v_norms, self.seq_lens, *self.window_tensors())

    def bytes_per_token(self) -> int:
        """Compressed bytes one token of one row takes in this layer: K and V codes and fp32 norms
        of every KV head (the exact sinks/window are a fixed extra, in ``memory_bytes``).

        Example:
            >>> import torch_aura
            >>> cache = torch_aura.AuraCache(["aura8v4", "aura4"], batch=1, kv_heads=2, head_dim=64, capacity=8)
            >>> cache.schemes, cache.bytes_per_token(), cache.bits_per_token_coordinate()
            (['aura8v4', 'aura4'], 176, 5.5)
        """
        D = self.head_dim
        return sum(4 * (packed_words(D, kb) + packed_words(D, vb)) + 8
                   for kb, vb in (parse_scheme(s) for s in self.schemes))

    def bits_per_token_coordinate(self) -> float:
        """``bytes_per_token() * 8`` over the ``2 * Hkv * D`` coordinates of a token's K and V."""
        return self.bytes_per_token() * 8 / (2 * self.kv_heads * self.head_dim)

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
                # exact buffer row b, slot s is page b * (S + ring + 1) + s of flash_decode's paged view
                self._exact_base = self._rows[:, None] * self._exact_slots()

    # ------------------------------------------------------------------- exact sinks and window
    def _window_state(self) -> None:
        """Device-side window bookkeeping, updated in place by every append and crop.

        ``_ring_floor[b]``: the oldest position whose exact copy the ring (W + rollback slots)
        still holds, so a crop of up to ``rollback_tokens`` finds its window intact.
        ``_ring_start[b] = max(_ring_floor, seq_len - W)``: the first position of row b's exact
        recent tokens (at least S); the compressed middle is ``[S, _ring_start)``. ``_c_lens``:
        its length (aura_decode's seq_lens). ``_dense_lens`` / ``_dense_table``: the exact tokens
        as flash_decode's paged cache of one-token pages (sinks first, then the window in order)."""
        S, W, B = self.sink_tokens, self.recent_tokens, self.batch
        self._ring_floor = torch.full((B,), S, dtype=torch.int64, device=self._dev)
        self._ring_start = torch.full((B,), S, dtype=torch.int64, device=self._dev)
        self._c_lens = torch.zeros(B, dtype=torch.int32, device=self._dev)
        self._dense_lens = torch.zeros(B, dtype=torch.int32, device=self._dev)
        self._dense_table = torch.zeros(B, max(S + W, 1), dtype=torch.int32, device=self._dev)
        self._slot_j = torch.arange(max(S + W, 1), device=self._dev)[None, :]

    def window_tensors(self) -> tuple[torch.Tensor, ...]:
        """The device tensors the exact sinks/window add (mutated in place by append, crop and
        reset; new after select_rows), for callers that mark static addresses; () when unwindowed."""
        if self._mixed:
            return () if self._groups is None else tuple(t for g in self._groups for t in g.window_tensors())
        if not self.windowed:
            return ()
        exact = (self.k_exact, self.v_exact) if self.k_exact is not None else ()
        return (*exact, self._ring_floor, self._ring_start, self._c_lens, self._dense_lens, self._dense_table)

    def _exact_slots(self) -> int:
        """Slots of a row of the exact buffer: S sinks, the ring (W + rollback), one scratch."""
        return self.sink_tokens + self._ring + 1

    def _alloc_exact(self, dtype: torch.dtype) -> None:
        self._exact_dtype = dtype
        # [B, S + ring + 1, Hkv, D]: the last slot is a scratch row that skipped writes land in
        shape = (self.batch, self._exact_slots(), self.kv_heads, self.head_dim)
        self.k_exact = torch.zeros(shape, dtype=dtype, device=self._dev)
        self.v_exact = torch.zeros(shape, dtype=dtype, device=self._dev)
        self._refresh_window()

    def _refresh_window(self) -> None:
        """Recompute the compressed length and the exact tokens' page table from ``seq_lens`` and
        ``_ring_start``, in place (fixed addresses for CUDA graphs)."""
        S, W = self.sink_tokens, self.recent_tokens
        n = self.seq_lens.to(torch.int64)
        self._ring_start.copy_(torch.maximum(self._ring_floor, n - W))
        rs = self._ring_start
        self._c_lens.copy_(rs - S)
        self._dense_lens.copy_(n.clamp(max=S) + (n - rs).clamp(min=0))
        j = self._slot_j
        ring = S + torch.remainder(rs[:, None] - S + (j - S), max(self._ring, 1))
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
        R = self._ring
        eslot = torch.where(valid & (pos < S), pos, S + R)
        if W:  # only the last R of the row: earlier chunk tokens would collide in the ring
            recent = valid & in_cap & (pos >= S) & (pos >= n_new[:, None] - R)
            eslot = torch.where(recent, S + torch.remainder(pos - S, R), eslot)
        rows = self._rows[:, None].expand(B, L)
        self.k_exact.index_put_((rows, eslot), k)
        self.v_exact.index_put_((rows, eslot), v)
        self._ring_floor.copy_(torch.maximum(self._ring_floor, n_new - R))
        self.seq_lens.copy_(n_new)
        self._refresh_window()
        if not compiling:
            self._appended += L

    def _exact_positions(self, start: torch.Tensor | None = None) -> torch.Tensor:
        """int64 ``[B, S + ring + 1]`` position held by each exact slot, -1 where the slot is not
        live (ring positions before ``start``, default the window start ``_ring_start``)."""
        S, R = self.sink_tokens, self._ring
        n = self.seq_lens.to(torch.int64)[:, None]
        rs = (self._ring_start if start is None else start)[:, None]
        s = torch.arange(S + R + 1, device=self._dev)[None, :]
        pos = torch.where(s < n, s, -1)
        if R:  # ring slot r holds the latest position p < n with (p - S) mod R = r
            r = s - S
            ring_pos = S + r + R * torch.div(n - 1 - S - r, R, rounding_mode="floor")
            ring_pos = torch.where((ring_pos >= rs) & (ring_pos < n), ring_pos, -1)
            pos = torch.where(s >= S, ring_pos, pos)
        pos[:, S + R:] = -1
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
            B1 = self.batch * self._exact_slots()
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
        pos = self._exact_positions()  # [B, S + ring + 1]
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
               left_padded: bool = False, queries: torch.Tensor | None = None,
               query_scale: float | None = None) -> None:
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
        if self._mixed:
            self._append_mixed(k, v, lengths, left_padded, queries, query_scale)
            return
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
        if n is None and self._fused_append and L <= FUSED_APPEND_MAX_TOKENS:
            self._append_fused(k if four_d else k[:, None], v if four_d else v[:, None], L, compiling)
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

    def _append_fused(self, k: torch.Tensor, v: torch.Tensor, L: int, compiling: bool) -> None:
        """The plain append as one ``aura_append`` (k, v ``[B, L, Hkv, D]``): the same slots, writes and
        ``seq_lens += L`` as below, in one launch. Paged and eager, the pages are checked first as
        ``_slots`` does (one host read; not under capture or compile, where such tokens are skipped)."""
        if self.paged and not compiling and not _capturing(self.k_codes):
            self._slots(L, None, False)  # raises, naming the rows, before anything is written
        self._append_op(k, v, self.k_codes, self.k_norms, self.v_codes, self.v_norms, self.seq_lens,
                        self.k_codebook, self.k_boundaries, self.v_codebook, self.v_boundaries, self.key_bits,
                        self.value_bits, self.k_sign_mask, self.v_sign_mask, self.block_table if self.paged else None)
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
        if self._mixed:
            return self._decode_mixed(q, scale, num_splits)
        if self.windowed:
            return self._decode_windowed(q, scale, num_splits)
        return self._decode_op(q, self.k_codes, self.k_norms, self.v_codes, self.v_norms,
                               self.seq_lens, self.k_codebook, self.v_codebook, self.k_sign_mask,
                               self.v_sign_mask, self.key_bits, self.value_bits,
                               self.block_table if self.paged else None, scale, num_splits)

    # ------------------------------------------------------------------- rows and lengths
    def reset(self) -> None:
        """Forget every token (``seq_lens = 0``); the tensors stay allocated and are not cleared
        (``scheme="auto"`` keeps its choice)."""
        if self._mixed:
            if self._groups is not None:
                self._each("reset")
            return
        self.seq_lens.zero_()
        self._appended = 0
        if self.windowed:
            self._ring_floor.fill_(self.sink_tokens)
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
        if self._mixed:
            self._options["batch"] = index.shape[0]
            if self._groups is None:
                self.batch, self.seq_lens = index.shape[0], self.seq_lens.index_select(0, index)
            else:
                self._each("select_rows", index)
            return
        self.k_codes = self.k_codes.index_select(0, index)
        self.v_codes = self.v_codes.index_select(0, index)
        self.k_norms = self.k_norms.index_select(0, index)
        self.v_norms = self.v_norms.index_select(0, index)
        self.seq_lens = self.seq_lens.index_select(0, index)
        self.batch = index.shape[0]
        self._layout_changed()
        if self.windowed:
            floor, exact = self._ring_floor.index_select(0, index), self.k_exact is not None
            kx, vx = (self.k_exact.index_select(0, index), self.v_exact.index_select(0, index)) if exact else (None, None)
            self._window_state()
            self._ring_floor.copy_(floor)
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
        if self._mixed:
            if self._groups is not None:
                self._each("crop", n)
            return
        if n:
            self.seq_lens.sub_(n).clamp_(min=0)
            self._appended = max(self._appended - n, 0)
            if self.windowed:  # the ring still holds [floor, seq_len): a crop within the rollback slots keeps W
                self._ring_floor.copy_(torch.minimum(self._ring_floor, self.seq_lens.to(torch.int64))
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
        if self._mixed:
            self._options["capacity"] = max(capacity, self.capacity)
            if self._groups is None:
                self.capacity = self._options["capacity"]
            else:
                self._each("grow", capacity)
            return
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

    def reserve_rollback(self, tokens: int) -> None:
        """Let a ``crop`` of up to ``tokens`` restore the exact recent window (speculative decoding).

        The ring then holds W + ``tokens`` exact tokens, of which decode attends the last W; a
        deeper crop leaves a shorter window until new tokens refill it. Grows the ring only (a no-op
        without a window or when it already has the slots): the exact buffers become new tensors,
        re-laid on the device (eager; a CUDA graph captured before must be captured again).

        Args:
            tokens: rollback depth, an int >= 0.
        """
        tokens = _as_int(tokens)
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            _c.fail("tokens", "an int >= 0 (rollback depth)", repr(tokens))
        if self._mixed:
            self._options["rollback_tokens"] = max(tokens, self._options["rollback_tokens"])
            if self._groups is not None:
                self._each("reserve_rollback", tokens)
            return
        if not self.recent_tokens or tokens <= self.rollback_tokens:
            return
        S = self.sink_tokens
        held = self._exact_positions(self._ring_floor) if self.k_exact is not None else None
        self.rollback_tokens, self._ring = tokens, self.recent_tokens + tokens
        self._layout_changed()
        if held is None:
            return
        old_k, old_v = self.k_exact, self.v_exact
        self._alloc_exact(self._exact_dtype)
        slot = torch.where(held >= S, S + torch.remainder(held - S, self._ring), held)
        slot = torch.where(held >= 0, slot, S + self._ring)  # slots holding nothing go to the scratch row
        rows = self._rows[:, None].expand_as(slot)
        self.k_exact.index_put_((rows, slot), old_k)
        self.v_exact.index_put_((rows, slot), old_v)
        self._refresh_window()

    # --------------------------------------------------------------------------------- reporting
    def memory_bytes(self) -> int:
        """Bytes held by the K and V codes and norms, and the exact sink/recent tokens."""
        if self._mixed:
            return sum(g.memory_bytes() for g in self._groups or ())
        held = [self.k_codes, self.k_norms, self.v_codes, self.v_norms]
        if self.k_exact is not None:
            held += [self.k_exact, self.v_exact]
        return sum(t.numel() * t.element_size() for t in held)

    def dense_bytes(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes an uncompressed K+V cache of ``dtype`` with the same token slots would take."""
        if self._mixed and self.paged:
            return sum(g.dense_bytes(dtype) for g in self._groups or ())
        slots = self.batch * self.kv_heads * self.capacity if not self.paged else self.k_norms.numel()
        return 2 * slots * self.head_dim * dtype.itemsize

    def bf16_equivalent_bytes(self) -> int:
        """Bytes a bf16 K+V cache with the same token slots would take: ``dense_bytes(torch.bfloat16)``."""
        return self.dense_bytes(torch.bfloat16)

    def __repr__(self) -> str:
        if self._mixed:
            held = "not chosen yet" if self._groups is None else (
                f"{self.bits_per_token_coordinate():.2f} bits per coordinate, {self.memory_bytes()} bytes")
            return (f"AuraCache({self.scheme!r}, schemes={self.schemes}, batch={self.batch}, kv_heads={self.kv_heads}, "
                    f"head_dim={self.head_dim}, {'paged' if self.paged else f'capacity={self.capacity}'}, "
                    + (f"sink_tokens={self.sink_tokens}, recent_tokens={self.recent_tokens}, " if self.windowed else "")
                    + f"device={self.device}, {held})")
        layout = (f"paged num_blocks={self.k_codes.shape[0]} page_size={self.page_size}" if self.paged
                  else f"capacity={self.capacity}")
        return (f"AuraCache({self.scheme!r}, batch={self.batch}, kv_heads={self.kv_heads}, "
                f"head_dim={self.head_dim}, {layout}, seed={self.seed}, layer={self.layer}, "
                + (f"sink_tokens={self.sink_tokens}, recent_tokens={self.recent_tokens}, " if self.windowed else "")
                + f"device={self.device}, {self.memory_bytes()} bytes = "
                f"{self.bf16_equivalent_bytes() / self.memory_bytes():.2f}x smaller than bf16)")
