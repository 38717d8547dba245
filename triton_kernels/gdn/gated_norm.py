"""The gated RMSNorm that ends a transformers Gated DeltaNet layer, in one launch (eager calls on CUDA).

Every transformers GDN family (Qwen3-Next, Qwen3.5, Qwen3.5-MoE, OLMo-Hybrid) normalises the rule's output
``o [N, D]`` (N = tokens x value heads, D = the value head dim) with its ``*RMSNormGated`` module and the gate
``z [N, D]``::

    h   = (o.float() * rsqrt(mean(o.float() ** 2) + eps)).to(o.dtype)
    p   = weight * h                      (in promote(weight, o)'s dtype, so rounded there when 16-bit)
    out = (p.float() * silu(z.float())).to(o.dtype)

Eagerly that is ten elementwise kernels with fp32 intermediates, ~260 KB of memory traffic per token and
layer at 32 value heads of 128 (issue 40, docs/gdn.md §6.2); here one program reads a block of o and z rows
once and writes ``out`` once, with the same three roundings. Compiled graphs keep the module's own forward:
inductor fuses it there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import launch, tensor_key
from .._tune import cdiv, next_pow2
from ._jit import length_agnostic

MAX_DIM = 4096  # one row's D lives in one program's registers
_BLOCK = 4096  # elements per program (rows x BD)


@length_agnostic(triton.jit)
def _gated_rms_norm_kernel(o, z, w, out, N, D, s_o, s_z, eps, ROUND_P: tl.constexpr, ROWS: tl.constexpr,
                           BD: tl.constexpr):
    """Rows ``[pid * ROWS, pid * ROWS + ROWS)`` of ``out [N, D]`` (contiguous, o's dtype)."""
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, BD)
    ok = (r < N)[:, None] & (d < D)[None, :]
    x = tl.load(o + r[:, None] * s_o + d[None, :], mask=ok, other=0.0).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)
    h = (x * rstd[:, None]).to(o.dtype.element_ty).to(tl.float32)
    p = tl.load(w + d, mask=d < D, other=0.0).to(tl.float32)[None, :] * h
    if ROUND_P:  # weight * h is a 16-bit product in PyTorch when both are that dtype
        p = p.to(o.dtype.element_ty).to(tl.float32)
    g = tl.load(z + r[:, None] * s_z + d[None, :], mask=ok, other=0.0).to(tl.float32)
    tl.store(out + r[:, None] * D + d[None, :], (p * (g / (1.0 + tl.exp(-g)))).to(out.dtype.element_ty), mask=ok)


def gated_rms_norm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``out``, shaped and typed like ``o``: the gated RMSNorm above over o's last dim.

    ``o``, ``z``: one shape ``[..., D]``, float dtypes, unit last stride (rows of D at any row stride once the
    leading dims are flattened; ``reshape`` copies where they do not flatten to one); ``weight``: ``[D]``,
    contiguous; ``D <= MAX_DIM``.
    """
    D = o.shape[-1]
    o2, z2 = o.reshape(-1, D), z.reshape(-1, D)
    N = o2.shape[0]
    out = torch.empty((N, D), dtype=o.dtype, device=o.device)
    if N and D:
        round_p = torch.promote_types(weight.dtype, o.dtype) in (torch.float16, torch.bfloat16)
        BD = next_pow2(D)
        rows = max(1, _BLOCK // BD)
        key = (D, *map(tensor_key, (o2, z2, weight)))  # Triton specialises ints on % 16: D is no length
        launch(_gated_rms_norm_kernel, (cdiv(N, rows),), key, o2, z2, weight, out, N, D, o2.stride(0), z2.stride(0),
               float(eps), ROUND_P=round_p, ROWS=rows, BD=BD, num_warps=4)
    return out.view(o.shape)
