"""Dense decode on the CPU through ATen's fused CPU attention kernel.

``flash_decode`` is one query token per sequence; grouped by KV head it is ``G = Hq / Hkv`` query
rows attending one KV head, which is exactly what ATen's CPU flash-attention kernel
(``_scaled_dot_product_flash_attention_for_cpu``) computes, with fp32 accumulation and the log-sum-exp
it returns beside the output. So the CPU needs no kernel of its own: this module adapts the layout.

* Contiguous cache ``[B, Hkv, T_cap, D]``: a view of each row's live tokens, no copy.
* Paged cache ``[num_blocks, page_size, Hkv, D]``: the used pages gathered into one copy.
* One call for a batch whose rows have one length, else one call per row: a mask would still
  read the padding past a row's length, which may hold anything (NaN included). Rows of length 0
  give ``out = 0`` and ``lse = -inf``, as the reference defines them.

The reference (``torch_aura.reference.decode``) runs the CUDA kernel's split plan token by token in
Python, ~5-20x slower; the split count does not change the result beyond fp32 rounding, so it is
ignored here. Data errors raise exactly as in the reference (the same ``_validate_data``).
"""

from __future__ import annotations

import math

import torch

from ..reference import decode as ref

_attend = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def _tokens(cache: torch.Tensor, rows: slice, n: int, block_table: torch.Tensor | None) -> torch.Tensor:
    """Tokens ``[0, n)`` of the sequences ``rows`` as ``[r, Hkv, n, D]``: a view of a contiguous
    cache, a gather of the used pages of a paged one. Nothing past ``n`` is read (padding may be NaN)."""
    if block_table is None:
        return cache[rows, :, :n]
    page_size = cache.shape[1]
    pages = cache[block_table[rows, :-(-n // page_size)].long()]  # [r, n_pages, page_size, Hkv, D]
    r, n_pages, _, Hkv, D = pages.shape
    return pages.reshape(r, n_pages * page_size, Hkv, D)[:, :n].transpose(1, 2)


def flash_decode(q, k_cache, v_cache, seq_lens, block_table=None, scale=None, num_splits=0):
    lens = ref._validate_data(k_cache, seq_lens, block_table)
    B, Hq, D = q.shape
    Hkv = k_cache.shape[2] if block_table is not None else k_cache.shape[1]
    scale = D ** -0.5 if scale is None else float(scale)
    q_groups = q.reshape(B, Hkv, Hq // Hkv, D)  # the G query heads of KV head j are row j's queries
    out = torch.zeros(B, Hq, D, dtype=q.dtype)  # a row of length 0: zeros and lse = -inf
    lse = torch.full((B, Hq), -math.inf, dtype=torch.float32)
    # One call when every row has the same length; else one per row, since a mask would still read
    # (and multiply) the padding, which may hold NaN.
    if lens and all(n == lens[0] for n in lens):
        batches = [(slice(None), lens[0])]
    else:
        batches = [(slice(b, b + 1), n) for b, n in enumerate(lens)]
    for rows, n in batches:
        if n == 0:
            continue
        o, l = _attend(q_groups[rows], _tokens(k_cache, rows, n, block_table),
                       _tokens(v_cache, rows, n, block_table), scale=scale)
        out[rows] = o.reshape(-1, Hq, D)
        lse[rows] = l.reshape(-1, Hq)
    return out, lse


def flash_decode_out(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits, out, lse):
    o, l = flash_decode(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits)
    out.copy_(o)
    lse.copy_(l)
