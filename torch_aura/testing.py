"""Comparison metrics and an exact attention oracle, shared by the tests, the benchmarks and
``python -m torch_aura`` (one definition each, so every report means the same number).

The oracle is plain fp64 attention through ``scaled_dot_product_attention``: independent of the
split-K reference in ``torch_aura.reference.decode``, which it is used to check.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["rel_rms", "max_rel", "dense_kv", "exact_decode_attention"]


def rel_rms(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative RMS error ``rms(out - ref) / rms(ref)`` in fp64 (FLA's metric); 0-size gives 0."""
    out, ref = out.double(), ref.double()
    den = ref.pow(2).mean().sqrt().item() if ref.numel() else 0.0
    num = (out - ref).pow(2).mean().sqrt().item() if ref.numel() else 0.0
    return num / den if den > 0 else num


def max_rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |out - ref| / max |ref|`` in fp64: relative to the reference's scale, not elementwise."""
    out, ref = out.double(), ref.double()
    den = ref.abs().max().item() if ref.numel() else 0.0
    num = (out - ref).abs().max().item() if ref.numel() else 0.0
    return num / den if den > 0 else num


def dense_kv(cache: torch.Tensor, b: int, n: int, block_table: torch.Tensor | None = None) -> torch.Tensor:
    """The first ``n`` tokens of sequence ``b`` as ``[Hkv, n, D]``, from a contiguous
    ``[B, Hkv, T_cap, D]`` cache or a paged ``[num_blocks, page_size, Hkv, D]`` one."""
    if block_table is None:
        return cache[b, :, :n]
    page = cache.shape[1]
    t = torch.arange(n, device=cache.device)
    return cache[block_table[b, t // page].long(), t % page].transpose(0, 1)


def exact_decode_attention(q, k_cache, v_cache, seq_lens, block_table=None, scale=None):
    """fp64 one-query attention per sequence over its live tokens, GQA by head // (Hq / Hkv).

    Args:
        q: ``[B, Hq, D]``; caches and ``block_table`` as ``torch_aura.flash_decode`` takes them.

    Returns:
        ``(out [B, Hq, D], lse [B, Hq])`` fp64 on q's device; a sequence of length 0 gives out 0
        and lse -inf (the flash_decode convention).
    """
    B, Hq, D = q.shape
    scale = D ** -0.5 if scale is None else scale
    out = torch.zeros(B, Hq, D, dtype=torch.float64, device=q.device)
    lse = torch.full((B, Hq), -math.inf, dtype=torch.float64, device=q.device)
    for b in range(B):
        n = int(seq_lens[b])
        if n == 0:
            continue
        k = dense_kv(k_cache, b, n, block_table).double()
        v = dense_kv(v_cache, b, n, block_table).double()
        G = Hq // k.shape[0]
        k, v = k.repeat_interleave(G, 0), v.repeat_interleave(G, 0)  # [Hq, n, D]
        qb = q[b].double()[:, None]  # [Hq, 1, D]
        out[b] = F.scaled_dot_product_attention(qb, k, v, scale=scale)[:, 0]
        lse[b] = torch.logsumexp((qb @ k.transpose(1, 2))[:, 0] * scale, -1)
    return out, lse
