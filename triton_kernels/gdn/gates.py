"""Gated DeltaNet's gates in one launch, for serving engines that hand the raw gate projections over (vLLM).

vLLM's GDN layers pass ``a, b [..., HV]`` (the projections), ``A_log [HV]`` and ``dt_bias [HV]``, and its
kernels compute, per token and value head, in fp32::

    g    = -exp(A_log) * softplus(a + dt_bias)      (softplus(x) = log(1 + e^(s x)) / s, x past threshold / s)
    beta = sigmoid(b)

In PyTorch that is eight elementwise kernels per layer and step; here one program per token computes both
rows, and, given vLLM's per-request state slots, the pool rows our ops take (``-1`` where vLLM skips: a
negative slot, or its ``null`` slot), so a decode step's preparation is one launch instead of ten.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import launch, tensor_key
from .._tune import next_pow2
from ._jit import length_agnostic

@length_agnostic(triton.jit)
def _gdn_gates_kernel(a, b, A_log, dt_bias, g, beta, slots, rows, HV, s_a, s_b, scale, threshold, null,
                      WITH_ROWS: tl.constexpr, BHV: tl.constexpr):
    """Token ``n``'s ``g[n, :]`` and ``beta[n, :]`` (fp32, contiguous ``[M, HV]``), and ``rows[n]``."""
    n = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BHV)
    ok = h < HV
    x = tl.load(a + n * s_a + h, mask=ok, other=0.0).to(tl.float32) + tl.load(dt_bias + h, mask=ok).to(tl.float32)
    z = scale * x
    e = tl.exp(tl.minimum(z, threshold))  # clamped: the linear branch below takes z > threshold
    u = 1.0 + e
    tiny = u == 1.0  # e below fp32's half ulp of 1: log(1 + e) = e
    log1p = tl.where(tiny, e, tl.log(u) * (e / tl.where(tiny, 1.0, u - 1.0)))  # to e's last digits (Goldberg)
    soft = tl.where(z > threshold, x, log1p / scale)
    tl.store(g + n * HV + h, -tl.exp(tl.load(A_log + h, mask=ok).to(tl.float32)) * soft, mask=ok)
    y = tl.load(b + n * s_b + h, mask=ok, other=0.0).to(tl.float32)
    tl.store(beta + n * HV + h, 1.0 / (1.0 + tl.exp(-y)), mask=ok)
    if WITH_ROWS:
        slot = tl.load(slots + n)
        tl.store(rows + n, tl.where((slot >= 0) & (slot != null), slot, -1).to(tl.int32))


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float = 1.0,
              threshold: float = 20.0, slots: torch.Tensor | None = None, null: int = -1):
    """``(g, beta, rows)``: the gates of ``a, b [..., HV]`` (fp32, shaped like ``a``) and, given ``slots [M]``
    (one per leading row of ``a``; M = a.numel() // HV), ``rows [M]`` int32: the slot, or -1 where it is
    negative or ``null``; else None. ``a``, ``b``: any float dtype, unit last stride, leading dims that
    flatten to one stride; ``A_log``, ``dt_bias``: ``[HV]``."""
    HV = a.shape[-1]
    a2, b2 = a.reshape(-1, HV), b.reshape(-1, HV)  # views for engine layouts ([N, HV] rows of a wider buffer)
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
