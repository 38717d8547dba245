"""Pure-PyTorch reference of the dense decode family: split-K flash decoding (decode.md).

This is the oracle the CUDA kernels (``csrc/cuda/decode.cuh``, launched from ``decode.cu``) are
diffed against, stage by stage, and the working fallback on every device. It computes exactly what
the kernels compute, in the same order of stages:

1. **Plan** (host, static values only): the split count ``S`` of the grid ``(S, Hkv, B)`` comes
   from ``B``, ``Hkv``, the SM count and ``num_splits`` (:func:`plan_num_splits`), never from
   ``seq_lens``: reading ``seq_lens`` on the host synchronises and breaks CUDA-graph replay.
2. **Split** (one CTA per (split s, KV head, sequence b) on the GPU): each sequence cuts its own
   ``T_b`` live tokens into ``S_b <= S`` chunks (:func:`split_chunk`); split ``s < S_b`` writes a
   *normalized* fp32 partial ``O_s`` and its ``lse_s``; splits ``s >= S_b`` write ``lse_s = -inf``
   and leave their partial unwritten (:func:`split_partials`).
3. **Merge** (:func:`merge_partials`, the same function ``merge_attn_states`` runs): the
   log-sum-exp combination of the partials, skipping ``-inf`` splits, cast once to q's dtype.

Rounding points (what a kernel must match): inputs are upcast to fp32 when loaded; q is scaled
before the dot product (the kernel folds ``scale * log2(e)`` into q and works in base 2; the
reference works in base e, the two agree to fp32 rounding); partials and lse are fp32; the only
rounding to a low-precision dtype is the final ``out`` cast after the merge.
"""

from __future__ import annotations

import math

import torch

# Head dims each kernel is instantiated for (torch_aura/_limits.py). The checks raise on anything else.
from .._limits import DECODE_HEAD_DIMS as SUPPORTED_HEAD_DIMS

# The plan (host, static values) is shared with the public decode_num_splits and the kernels' launchers:
# torch_aura/_decode_plan.py. Its names stay importable from here, the oracle's own plan.
from .._decode_plan import (  # noqa: F401
    MIN_CHUNK,
    _ceil_div,
    CONTIGUOUS_TILE,
    MAX_AUTO_SPLITS,
    MERGE_ONE_TRIP_SPLITS,
    STAND_IN_SMS,
    auto_splits,
    device_sms,
    plan_ctas_per_sm,
    plan_num_splits,
    plan_split_floor,
    split_chunk,
    tile_copies_fit,
)


def _validate_data(k_cache, seq_lens, block_table) -> list[int]:
    """Data-dependent checks the (metadata-only) checks cannot do; returns seq_lens as ints.

    Reading ``seq_lens`` here is fine: the reference is allowed to synchronise, the kernel reads
    each length on the device instead.
    """
    lens = [int(x) for x in seq_lens.tolist()]
    if block_table is None:
        capacity, where = k_cache.shape[2], "T_cap = k_cache.shape[2]"
    else:
        capacity = block_table.shape[1] * k_cache.shape[1]
        where = "max_blocks * page_size = block_table.shape[1] * k_cache.shape[1]"
    for b, n in enumerate(lens):
        if n < 0 or n > capacity:
            raise ValueError(f"seq_lens: expected values in [0, {capacity}] (the cache capacity, "
                             f"{where}), got seq_lens[{b}] = {n}")
    if block_table is not None and len(lens) > 0:
        page_size, num_blocks = k_cache.shape[1], k_cache.shape[0]
        # Only the pages a sequence actually uses must be valid: the tail of a block-table row
        # is padding (often -1 or stale indices) and is never read.
        used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] < torch.tensor(
            [_ceil_div(n, page_size) for n in lens], device=block_table.device)[:, None]
        bad = used & ((block_table < 0) | (block_table >= num_blocks))
        if bool(bad.any()):
            b, j = (int(i) for i in bad.nonzero()[0].tolist())
            raise ValueError(f"block_table: expected page indices in [0, {num_blocks}) (num_blocks = "
                             f"k_cache.shape[0]) for the {_ceil_div(lens[b], page_size)} pages used by "
                             f"sequence {b}, got block_table[{b}, {j}] = {int(block_table[b, j])}")
    return lens


def _gather_tokens(cache: torch.Tensor, b: int, start: int, end: int, block_table) -> torch.Tensor:
    """Tokens ``[start, end)`` of sequence ``b`` as fp32 ``[Hkv, n, D]``, from either layout."""
    if block_table is None:
        rows = cache[b, :, start:end]  # [Hkv, n, D]: a strided view, no copy of the padding
    else:
        # Paged: token t lives in slot t % page_size of page block_table[b, t // page_size].
        page_size = cache.shape[1]
        t = torch.arange(start, end, device=cache.device)
        pages = block_table[b, t // page_size].long()
        rows = cache[pages, t % page_size].transpose(0, 1)  # [n, Hkv, D] -> [Hkv, n, D]
    return rows.float()


def split_partials(q, k_cache, v_cache, seq_lens, block_table=None, scale=None, num_splits=0):
    """Stage 2 of the kernel: the per-split normalized partials and their lse.

    Args: as :func:`flash_decode`.

    Returns:
        ``(partial_out [S, B, Hq, D] fp32, partial_lse [S, B, Hq] fp32)`` where S is the host
        plan (:func:`plan_num_splits`). For split ``s`` of sequence ``b``: if ``s < S_b``,
        ``partial_out[s, b]`` is the softmax-weighted mean of V over that split's tokens and
        ``partial_lse[s, b]`` the natural log of its softmax denominator (scale included);
        otherwise ``partial_lse[s, b] = -inf`` and ``partial_out[s, b]`` is *never written*
        (allocated with ``torch.empty``, as the kernel's workspace): the merge must skip it.
    """
    B, Hq, D = q.shape
    paged = block_table is not None
    Hkv = k_cache.shape[2] if paged else k_cache.shape[1]
    G = Hq // Hkv  # query heads per KV head: head h reads KV head h // G
    scale = D ** -0.5 if scale is None else float(scale)
    tile = k_cache.shape[1] if paged else CONTIGUOUS_TILE
    lens = _validate_data(k_cache, seq_lens, block_table)

    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[2]
    S = plan_num_splits(B, Hkv, q.device, num_splits, head_dim=D, paged=paged, capacity=capacity, tile=tile)
    # Deliberately torch.empty: empty splits leave their partial as whatever the workspace held
    # (NaN under the test suite's poisoning). Only partial_lse is written everywhere.
    partial_out = torch.empty((S, B, Hq, D), dtype=torch.float32, device=q.device)
    partial_lse = torch.full((S, B, Hq), -math.inf, dtype=torch.float32, device=q.device)

    # q pre-scaled once, grouped so the G query heads sharing KV head j sit in row j: one CTA
    # serves the whole group from a single read of each K/V stage (decode.md §3).
    q_groups = (q.float() * scale).reshape(B, Hkv, G, D)
    for b, T in enumerate(lens):
        chunk, S_b = split_chunk(T, S, tile)
        for s in range(S_b):
            start, end = s * chunk, min((s + 1) * chunk, T)
            k = _gather_tokens(k_cache, b, start, end, block_table)  # [Hkv, n, D]
            v = _gather_tokens(v_cache, b, start, end, block_table)
            logits = q_groups[b] @ k.transpose(1, 2)  # [Hkv, G, n]
            m = logits.amax(dim=-1, keepdim=True)  # finite: every live split has >= 1 token
            p = torch.exp(logits - m)
            l = p.sum(dim=-1, keepdim=True)
            partial_out[s, b] = ((p @ v) / l).reshape(Hq, D)  # normalized: O_s = sum p v / l
            partial_lse[s, b] = (m + torch.log(l)).reshape(Hq)
    return partial_out, partial_lse


def merge_partials(partial_out: torch.Tensor, partial_lse: torch.Tensor, out_dtype: torch.dtype):
    """The log-sum-exp merge of decode.md §5, in fp32; returns ``(out [B, Hq, D], lse [B, Hq])``.

    ``M = max_s lse_s``, ``w_s = exp(lse_s - M)``, ``out = sum_s w_s O_s / sum_s w_s``,
    ``lse = M + ln(sum_s w_s)``, with the two NaN guards every kernel must reproduce:

    * a split with ``lse_s = -inf`` is *skipped* (selected out), not multiplied by its weight 0:
      its partial was never written and ``0 * NaN`` is NaN;
    * when every split is empty (``M = -inf``, e.g. ``seq_len == 0``) ``exp(-inf - -inf)`` would be
      NaN, so the result is defined as ``out = 0``, ``lse = -inf``.
    """
    o = partial_out.float()
    lse_s = partial_lse.float()
    live = lse_s != -math.inf  # [S, B, Hq]
    M = lse_s.amax(dim=0)  # [B, Hq]
    empty = M == -math.inf
    M_safe = torch.where(empty, torch.zeros_like(M), M)  # keeps exp() away from -inf - -inf
    w = torch.where(live, torch.exp(lse_s - M_safe), torch.zeros_like(lse_s))
    acc = torch.where(live[..., None], w[..., None] * o, torch.zeros_like(o)).sum(dim=0)
    w_sum = w.sum(dim=0)
    out = acc / torch.where(empty, torch.ones_like(w_sum), w_sum)[..., None]
    lse = torch.where(empty, torch.full_like(M, -math.inf), M_safe + torch.log(w_sum))
    # One rounding to the output dtype, after the merge; fresh contiguous tensors, never views.
    return out.to(out_dtype).contiguous(), lse.contiguous()


def flash_decode(q, k_cache, v_cache, seq_lens, block_table=None, scale=None, num_splits=0):
    """Split-K decode attention: :func:`split_partials` then :func:`merge_partials`.

    With a host plan of ``S = 1`` the kernel's split stage writes ``out``/``lse`` itself; the merge
    of a single split is exact (``w = 1``), so routing it through the merge gives the same bits.
    """
    partial_out, partial_lse = split_partials(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits)
    return merge_partials(partial_out, partial_lse, q.dtype)


def flash_decode_out(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits, out, lse):
    """:func:`flash_decode` writing into the caller's ``out`` and ``lse`` (any strides), in place."""
    o, l = flash_decode(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits)
    out.copy_(o)
    lse.copy_(l)


def merge_attn_states(partial_out, partial_lse):
    """Merge ``[S, B, Hq, D]`` partials (+ fp32 ``[S, B, Hq]`` lse); out in partial_out's dtype."""
    return merge_partials(partial_out, partial_lse, partial_out.dtype)
