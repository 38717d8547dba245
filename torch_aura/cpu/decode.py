"""Dense decode on the CPU: ``flash_decode`` / ``flash_decode_out`` with the reference's signature,
checks and results up to fp32 rounding.

* A contiguous cache whose rows all hold the same length: ATen's fused CPU attention, the G query
  heads of a KV head as G query rows (it returns the lse too), in one call over a view. Its GEMM
  micro-kernels beat ours there (1 thread, 8/2 heads of 64, 4 x 2000 tokens: 0.60 against 1.5 ms).
* Anything else (paged, or rows of different lengths), with the native library
  (``csrc/cpu/decode.cpp`` through ``native``): one call for the whole batch, with no host pass over
  the lengths (the kernel checks them and the used page indices, and reads q and writes out and lse
  as they lie). Rows are read in place (fp32, bf16, fp16) up to each sequence's length only, so
  padding may hold anything; pass 1 is ``csrc/cpu/dense_avx2.h``'s item where the CPU has AVX2 / FMA /
  F16C (``TORCH_AURA_CPU_SIMD=0``: ``pass1.h``'s portable one); blocks of tokens are split across
  threads and merged, with a block size from the shapes alone (the answer does not depend on the
  thread count). ATen there needs a call per length (a mask would still read, and
  multiply, the padding) and a gathered copy of the pages: 2-4x slower on vLLM-shaped batches.
* Without the native library (no C++ compiler at install): ATen for every case, one call per row
  where lengths differ.

Either way rows of length 0 give ``out = 0`` and ``lse = -inf``, as the reference defines them, and
the split count of the CUDA plan (``num_splits``) is ignored: it changes nothing beyond rounding. The
reference replays that plan token by token in Python, 5-20x slower.
"""

from __future__ import annotations

import math

import torch

from ..reference import decode as ref
from . import native

_attend = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

def _tokens(cache: torch.Tensor, rows: slice, n: int, block_table: torch.Tensor | None) -> torch.Tensor:
    """Tokens ``[0, n)`` of the sequences ``rows`` as ``[r, Hkv, n, D]``: a view of a contiguous
    cache, a gather of the used pages of a paged one (ATen path)."""
    if block_table is None:
        return cache[rows, :, :n]
    page_size = cache.shape[1]
    pages = cache[block_table[rows, :-(-n // page_size)].long()]  # [r, n_pages, page_size, Hkv, D]
    r, n_pages, _, Hkv, D = pages.shape
    return pages.reshape(r, n_pages * page_size, Hkv, D)[:, :n].transpose(1, 2)


def _flash_decode_aten(q, k_cache, v_cache, lens, block_table, scale, Hkv):
    B, Hq, D = q.shape
    q_groups = q.reshape(B, Hkv, Hq // Hkv, D)  # the G query heads of KV head j are row j's queries
    if block_table is None and lens and lens[0] > 0 and all(n == lens[0] for n in lens):
        # the eager decode step of a model: one call, its outputs as they come (no row copies)
        o, l = _attend(q_groups, k_cache[:, :, :lens[0]], v_cache[:, :, :lens[0]], scale=scale)
        return o.reshape(B, Hq, D).contiguous(), l.reshape(B, Hq).contiguous()
    out = torch.zeros(B, Hq, D, dtype=q.dtype)
    lse = torch.full((B, Hq), -math.inf, dtype=torch.float32)
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


def flash_decode(q, k_cache, v_cache, seq_lens, block_table=None, scale=None, num_splits=0):
    out = torch.empty(q.shape, dtype=q.dtype)
    lse = torch.empty(q.shape[:2], dtype=torch.float32)
    return _decode_into(q, k_cache, v_cache, seq_lens, block_table, scale, out, lse, fresh=True)


def flash_decode_out(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits, out, lse):
    _decode_into(q, k_cache, v_cache, seq_lens, block_table, scale, out, lse, fresh=False)


def _decode_into(q, k_cache, v_cache, seq_lens, block_table, scale, out, lse, fresh: bool):
    """``(out, lse)``, filled. Paged caches go to the native kernel without a host pass over the
    lengths (it checks them and the used page indices itself, and computes in fp32 from q and into
    out as they lie); a contiguous cache with one length to ATen."""
    D = q.shape[-1]
    scale = D ** -0.5 if scale is None else float(scale)
    if native.LIB is None or block_table is None:
        lens = ref._validate_data(k_cache, seq_lens, block_table)
        Hkv = k_cache.shape[2] if block_table is not None else k_cache.shape[1]
        if native.LIB is None or all(n == lens[0] for n in lens):
            o, l = _flash_decode_aten(q, k_cache, v_cache, lens, block_table, scale, Hkv)
            if fresh:
                return o, l
            out.copy_(o)
            lse.copy_(l)
            return out, lse
    # The kernel writes rows with a unit last stride in q's dtype; anything else goes through a copy.
    direct = out.dtype == q.dtype and out.stride(-1) == 1 and lse.dtype == torch.float32
    o, l = (out, lse) if direct else (torch.empty(q.shape, dtype=q.dtype), torch.empty(q.shape[:2]))
    qc = q if q.stride(-1) == 1 else q.contiguous()  # bound to a local: alive for the native call
    lens = seq_lens.contiguous()
    if not native.flash_decode(qc, k_cache, v_cache, lens, block_table, scale, o, l):
        ref._validate_data(k_cache, seq_lens, block_table)  # raises the reference's error
        raise ValueError("flash_decode: seq_lens or block_table out of range")
    if not direct:
        out.copy_(o)
        lse.copy_(l)
    return out, lse
