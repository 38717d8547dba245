"""Chunked Gated DeltaNet forward in Triton: the fused ``gdn_chunk`` and the five stage ops (gdn.md).

Split by concern, as FLA splits its chunk pipeline; each kernel lives with its launchers:

* ``prep``        ``_gdn_chunk_cumsum_kernel`` (per chunk), ``_gdn_kkt_solve_kernel`` (per chunk and value
                  head: ``(I + A)^-1`` as 16x16 blocks), ``_gdn_recompute_w_u_kernel`` (``w``, ``u`` from
                  ``Ai``); their stage ops and ``_chunk_prep``;
* ``state_pass``  ``_gdn_state_pass_kernel`` (per V tile, sequence, value head: the sequential pass,
                  fwd_h), ``_gdn_fwd_o_kernel`` (chunk outputs from ``h``), the overlap with w/u;
* ``segments``    the sequence-parallel pass's plan, summary, scan and table kernels;
* ``_common``     host helpers and the hardware seams the plans read; ``_jit``: device helpers;
* here            ``gdn_chunk``, the L2 norm, and the stage ops re-exported for the op table.

``gdn_chunk`` runs three of them, two with a flag that only it sets, and never materialises the
per-chunk states ``h`` (512 B per token and value head in bf16 at K = V = 128, the largest
intermediate) or ``v_new``:

1. ``_gdn_kkt_solve_kernel`` with ``CUMSUM``: the chunk's cumsum of g, then kkt + solve;
2. ``_gdn_recompute_w_u_kernel`` with ``WITH_Q``: w, u and ``A_qk``, the chunk's gated, masked
   ``q k^T`` (the fwd_o operand that needs no state);
3. ``_gdn_state_pass_kernel`` with ``WITH_O``: its program holds the fp32 state of its V tile and
   the chunk's ``v_new``, so it emits ``o = scale (e^G (q rnd(S)) + A_qk rnd(v_new))``: fwd_o never runs.
   On sm_90 with 16-bit inputs and K in {64, 128}, the Gluon kernel of ``state_pass_sm90`` does the
   same with its warpgroup MMAs overlapped (``_hopper_pass_ready``; gdn.md §6), and for few sequences
   it runs beside step 2 on a side stream, chunk by chunk as w/u publishes them (``_overlap_pass``).

With few heads and sequences (tensor-parallel shards) step 3 is sequence-parallel instead
(``_segment_plan``): ``_gdn_segment_summary_kernel`` gives each segment of ``cps`` chunks its
zero-start end state and ``K x K`` transfer matrix, ``_gdn_segment_scan_kernel`` chains them into
every segment's start state, and the pass (either kernel, ``SEGMENTED``) runs all segments at once.

Every kernel rounds exactly where gdn.md §3.7 does: ``Ai``, the ``beta e^G k`` / ``beta v``
operands, ``w``, ``u``, the state operand ``rnd(S)``, ``v_new``, the gated ``v_new`` and the
masked ``q k^T``; G and the states are fp32. ``gdn_chunk`` computes its output in fwd_o's order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._checks import gdn as _checks
from ..._checks.common import remembered_check
from .._launch import launch, tensor_key
from . import plan, segments
from ._common import _pow2, _s3, _varlen_plan
from ._jit import length_agnostic
# the stage ops live with their kernels; the op table (triton_kernels.LAUNCHERS) and tests find them here too
from .prep import _chunk_prep, gdn_chunk_cumsum, gdn_kkt_solve, gdn_recompute_w_u  # noqa: F401
from .state_pass import _state_pass, gdn_fwd_h, gdn_fwd_o  # noqa: F401


_check_chunk = remembered_check(_checks.gdn_chunk)  # eager calls repeat their metadata: check it once


@triton.jit
def _l2norm_token(x, y, b, t, H, K, s_xb, s_xt, s_xh, s_yb, s_yt, s_yh, BH: tl.constexpr, BK: tl.constexpr):
    """``y = rnd(x / sqrt(sum_K x^2 + 1e-6))`` in fp32 for all heads of token (b, t) (gdn.md §3.6)."""
    hh = tl.arange(0, BH)
    kk = tl.arange(0, BK)
    mask = (hh < H)[:, None] & (kk < K)[None, :]
    v = tl.load(x + b * s_xb + t * s_xt + hh[:, None] * s_xh + kk[None, :], mask=mask, other=0.0).to(tl.float32)
    v = v / tl.sqrt(tl.sum(v * v, axis=1) + 1e-6)[:, None]
    tl.store(y + b * s_yb + t * s_yt + hh[:, None] * s_yh + kk[None, :], v.to(y.dtype.element_ty), mask=mask)


@length_agnostic(triton.jit)
def _l2norm_kernel(q, k, qn, kn, H, K, s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_nb, s_nt, s_nh, T,
                   BH: tl.constexpr, BK: tl.constexpr):
    """q (grid row 0) or k (row 1) of one token, normalised into ``qn`` / ``kn`` (same shape and strides):
    one launch for both, so a short prefill pays one launch, not two."""
    pid = tl.program_id(0)
    b, t = (pid // T).to(tl.int64), (pid % T).to(tl.int64)
    if tl.program_id(1) == 0:
        _l2norm_token(q, qn, b, t, H, K, s_qb, s_qt, s_qh, s_nb, s_nt, s_nh, BH, BK)
    else:
        _l2norm_token(k, kn, b, t, H, K, s_kb, s_kt, s_kh, s_nb, s_nt, s_nh, BH, BK)


def _l2norm(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-normalised copies of q and k ``[B, T, H, K]`` in their dtype (the chunk path rounds them,
    as FLA), from one launch."""
    B, T, H, K = q.shape
    qn = torch.empty((B, T, H, K), dtype=q.dtype, device=q.device)
    kn = torch.empty_like(qn)  # the kernel writes both with qn's strides
    if B * T * H:
        launch(_l2norm_kernel, (B * T, 2), (H, K, *map(tensor_key, (q, k, qn))), q, k, qn, kn, H, K, *_s3(q),
               *_s3(k), *_s3(qn), T, BH=_pow2(H, 1), BK=_pow2(K, 1), num_warps=4 if H * K <= 4096 else 8)
    return qn, kn


def gdn_chunk(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, chunk_indices=None,
              use_qk_l2norm=False, state_v_first=False):
    """Three kernels (plus the optional L2 norm): cumsum + kkt + solve, w/u with the output operand
    A_qk, then the sequential pass that emits o and the final state (beside w/u where
    ``_overlap_pass`` allows). Where ``_segment_plan`` splits the sequences (few heads and sequences),
    the pass is three kernels instead: segment summaries, the scan over segments, the per-segment pass.
    The per-chunk states h and v_new of the stage ops are never materialised."""
    if plan.ENABLED:  # TORCH_AURA_GDN_PLAN: this geometry's launches replayed, its checks passed once (plan.py)
        return plan.chunk(_gdn_chunk, _check_chunk, q, k, v, g, beta, scale, initial_state, cu_seqlens,
                          chunk_indices, use_qk_l2norm, state_v_first)
    _check_chunk(q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_indices, use_qk_l2norm,
                 state_v_first)
    return _gdn_chunk(q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_indices, use_qk_l2norm,
                      state_v_first)


def _gdn_chunk(q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_indices, use_qk_l2norm, state_v_first):
    """``gdn_chunk``'s launchers, its arguments checked."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = float(K ** -0.5 if scale is None else scale)
    if use_qk_l2norm:
        q, k = _l2norm(q, k)
    ci, NT, NT_total = _varlen_plan(T, B, cu_seqlens, chunk_indices)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    cps = segments._segment_plan(k.device, N, HV, V, NT, NT_total, cu_seqlens is not None)
    p = _chunk_prep(q, k, v, g, beta, cu_seqlens, ci, NT, NT_total, overlap=cps == 0)
    o = torch.empty((B, T, HV, V), dtype=q.dtype, device=q.device)
    final = _state_pass(k, p.w, p.u, p.g_cum, initial_state, cu_seqlens, ci, NT, NT_total, state_v_first,
                        q=q, a_qk=p.a_qk, o=o, scale=scale, ready=p.ready, w_u=p.launch_w_u, cps=cps)
    return o, final

