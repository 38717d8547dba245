"""Gated DeltaNet's per-token preparation in one launch, for serving engines that hand the raw projections
over (vLLM).

vLLM's GDN layers pass ``a, b [..., HV]`` (the projections), ``A_log [HV]`` and ``dt_bias [HV]``, and its
kernels compute, per token and value head, in fp32::

    g    = -exp(A_log) * softplus(a + dt_bias)      (softplus(x) = log(1 + e^(s x)) / s, x past threshold / s)
    beta = sigmoid(b)

* ``gdn_gates``: the gates alone. In PyTorch that is eight elementwise kernels per layer and step; here one
  program per token computes both rows, and, given vLLM's per-request state slots, the pool rows our ops
  take (``-1`` where vLLM skips: a negative slot, or its ``null`` slot), so a decode step's preparation is
  one launch instead of ten.
* ``gdn_post_conv``: a prefill's whole step between the conv and the chunked rule (vLLM's
  ``fused_post_conv_prep``): the conv output ``[L, 2*H*K + HV*V]`` split into contiguous q, k (each head
  l2-normalised in fp32, rounded once) and v, and the gates. In PyTorch, about fourteen kernels and three
  passes over q and k; here one read of the row and one write of each output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import launch, tensor_key
from .._tune import next_pow2
from ._jit import gate_values, length_agnostic

# q/k tiles of the post-conv kernel: whole heads, at most this many values per tile (registers of 4 warps)
POST_CONV_TILE = 4096


@triton.jit
def _gates_row(a_row, b_row, A_log, dt_bias, g_row, beta_row, HV, scale, threshold, G_EXP: tl.constexpr,
               BHV: tl.constexpr):
    """One token's ``g`` (or ``exp(g)``) and ``beta`` rows, fp32, from its ``a`` and ``b`` rows."""
    h = tl.arange(0, BHV)
    ok = h < HV
    g, beta = gate_values(tl.load(a_row + h, mask=ok, other=0.0), tl.load(b_row + h, mask=ok, other=0.0),
                          tl.load(A_log + h, mask=ok), tl.load(dt_bias + h, mask=ok), scale, threshold)
    if G_EXP:
        g = tl.exp(g)
    tl.store(g_row + h, g, mask=ok)
    tl.store(beta_row + h, beta, mask=ok)


@length_agnostic(triton.jit)
def _gdn_gates_kernel(a, b, A_log, dt_bias, g, beta, slots, rows, HV, s_a, s_b, scale, threshold, null,
                      WITH_ROWS: tl.constexpr, BHV: tl.constexpr):
    """Token ``n``'s ``g[n, :]`` and ``beta[n, :]`` (fp32, contiguous ``[M, HV]``), and ``rows[n]``."""
    n = tl.program_id(0).to(tl.int64)
    _gates_row(a + n * s_a, b + n * s_b, A_log, dt_bias, g + n * HV, beta + n * HV, HV, scale, threshold,
               False, BHV)
    if WITH_ROWS:
        slot = tl.load(slots + n)
        tl.store(rows + n, tl.where((slot >= 0) & (slot != null), slot, -1).to(tl.int32))


@triton.jit
def _normalised_heads(src, dst, H, eps, L2NORM: tl.constexpr, K: tl.constexpr, BH: tl.constexpr,
                      BK: tl.constexpr):
    """``H`` heads of ``K`` values from ``src`` (contiguous) to ``dst``, each divided by ``sqrt(sum x^2 + eps)``
    in fp32 and rounded once, ``BH`` heads at a time."""
    col = tl.arange(0, BK)
    for h0 in range(0, H, BH):
        head = h0 + tl.arange(0, BH)
        ok = (head < H)[:, None] & (col < K)[None, :]
        offs = head[:, None] * K + col[None, :]
        x = tl.load(src + offs, mask=ok, other=0.0).to(tl.float32)
        if L2NORM:
            x = x * tl.rsqrt(tl.sum(x * x, axis=1) + eps)[:, None]
        tl.store(dst + offs, x.to(dst.dtype.element_ty), mask=ok)


@length_agnostic(triton.jit)
def _gdn_post_conv_kernel(x, a, b, A_log, dt_bias, q, k, v, g, beta, H, HV, s_x, s_a, s_b, scale, threshold,
                          eps, K: tl.constexpr, V: tl.constexpr, L2NORM: tl.constexpr, G_EXP: tl.constexpr,
                          BH: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BHV: tl.constexpr):
    """Token ``n``: ``q[n], k[n] [H, K]``, ``v[n] [HV, V]`` (contiguous) from row n of ``x`` (``[q | k | v]``),
    and its gates."""
    n = tl.program_id(0).to(tl.int64)
    row = x + n * s_x
    _normalised_heads(row, q + n * H * K, H, eps, L2NORM, K, BH, BK)
    _normalised_heads(row + H * K, k + n * H * K, H, eps, L2NORM, K, BH, BK)
    row_v, v_n = row + 2 * H * K, v + n * HV * V
    for o in range(0, HV * V, BV):
        i = o + tl.arange(0, BV)
        tl.store(v_n + i, tl.load(row_v + i, mask=i < HV * V), mask=i < HV * V)
    _gates_row(a + n * s_a, b + n * s_b, A_log, dt_bias, g + n * HV, beta + n * HV, HV, scale, threshold, G_EXP,
               BHV)


def _gate_rows(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a, b [..., HV]`` as ``[M, HV]`` views (engine layouts: rows of a wider buffer)."""
    HV = a.shape[-1]
    return a.reshape(-1, HV), b.reshape(-1, HV)


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float = 1.0,
              threshold: float = 20.0, slots: torch.Tensor | None = None, null: int = -1):
    """``(g, beta, rows)``: the gates of ``a, b [..., HV]`` (fp32, shaped like ``a``) and, given ``slots [M]``
    (one per leading row of ``a``; M = a.numel() // HV), ``rows [M]`` int32: the slot, or -1 where it is
    negative or ``null``; else None. ``a``, ``b``: any float dtype, unit last stride, leading dims that
    flatten to one stride; ``A_log``, ``dt_bias``: ``[HV]``."""
    HV = a.shape[-1]
    a2, b2 = _gate_rows(a, b)
    M = a2.shape[0]
    g = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    beta = torch.empty(a.shape, dtype=torch.float32, device=a.device)
    rows = None if slots is None else torch.empty(M, dtype=torch.int32, device=a.device)
    if M and HV:
        key = (HV, int(null), *map(tensor_key, (a2, b2, A_log, dt_bias, slots)))  # Triton specialises ints on % 16
        launch(_gdn_gates_kernel, (M,), key, a2, b2, A_log, dt_bias, g, beta, slots, rows, HV, a2.stride(0),
               b2.stride(0), float(scale), float(threshold), int(null), WITH_ROWS=slots is not None,
               BHV=max(16, next_pow2(HV)), num_warps=1)
    return g, beta, rows


def gdn_post_conv(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                  H: int, K: int, V: int, l2norm: bool = True, g_exp: bool = False, eps: float = 1e-6,
                  scale: float = 1.0, threshold: float = 20.0):
    """``(q, k, v, g, beta)`` of the conv output ``x [L, 2*H*K + HV*V]`` (unit last stride, any row stride):
    ``q, k [L, H, K]`` (each head divided by ``sqrt(sum x^2 + eps)`` where ``l2norm``), ``v [L, HV, V]``, all
    contiguous in x's dtype, and the gates of ``a, b [L, HV]`` as :func:`gdn_gates` (``exp(g)`` where
    ``g_exp``), fp32 ``[L, HV]``."""
    L, HV = x.shape[0], a.shape[-1]
    if x.shape[1] != 2 * H * K + HV * V:
        raise ValueError(f"gdn_post_conv: x has {x.shape[1]} channels, expected 2*H*K + HV*V = {2 * H * K + HV * V}")
    a2, b2 = _gate_rows(a, b)
    q = torch.empty((L, H, K), dtype=x.dtype, device=x.device)
    k = torch.empty_like(q)
    v = torch.empty((L, HV, V), dtype=x.dtype, device=x.device)
    g = torch.empty((L, HV), dtype=torch.float32, device=x.device)
    beta = torch.empty_like(g)
    if L:
        BK = max(16, next_pow2(K))
        BH = max(1, min(next_pow2(H), POST_CONV_TILE // BK))
        key = (H, HV, K, V, bool(l2norm), bool(g_exp), *map(tensor_key, (x, a2, b2, A_log, dt_bias)))
        launch(_gdn_post_conv_kernel, (L,), key, x, a2, b2, A_log, dt_bias, q, k, v, g, beta, H, HV, x.stride(0),
               a2.stride(0), b2.stride(0), float(scale), float(threshold), float(eps), K=K, V=V, L2NORM=bool(l2norm),
               G_EXP=bool(g_exp), BH=BH, BK=BK, BV=min(POST_CONV_TILE, max(16, next_pow2(HV * V))),
               BHV=max(16, next_pow2(HV)), num_warps=4)
    return q, k, v, g, beta
