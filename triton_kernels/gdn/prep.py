"""The chunk-parallel prep of GDN's chunked forward (gdn.md §3.1-3.3): the cumsum of g, kkt + the
64x64 solve, and the w/u recompute (with gdn_chunk's ``A_qk``), their stage ops, and ``_chunk_prep``,
gdn_chunk's two launches of them. Every program works on one chunk: no state crosses chunks here.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import triton
import triton.language as tl

from ..._checks import gdn as _checks
from .._launch import launch, tensor_key
from .._tune import Config, Tuner
from . import _common, plan, state_pass
from ._common import _dot_prec, _pow2, _s3, _varlen_plan
from ._jit import (BT, CHUNK, LOG2E, chunk_span, decay_log, dot_f32, fixed_tile, gate_causal, inv_unit_lower16,
                   length_agnostic, load_rows, load_tile, store_fixed_tile, store_tile)


# ------------------------------------------------------------------------------ stage bodies
@triton.jit
def _cumsum_head(g, g_cum, b, start, eos, i_hv, s_gb, s_gt, s_gh, s_cb, s_ct, s_ch):
    """Inclusive cumsum of one chunk of one head's g, stored fp32 (natural log units)."""
    rows = start + tl.arange(0, BT)
    ok = rows < eos
    x = decay_log(load_rows(g, b, rows, ok, i_hv, s_gb, s_gt, s_gh))
    tl.store(g_cum + b * s_cb + i_hv * s_ch + rows * s_ct, tl.cumsum(x, axis=0), mask=ok)


@triton.jit
def _store_block_row(Ai, b, rows, ok, i_hv, x0, x1, x2, x3, s_ab, s_at, s_ah):
    """Store one 16-row block row of ``Ai`` (its four 16x16 column blocks) to the input dtype."""
    c = tl.arange(0, 16)
    store_tile(Ai, x0, b, rows, ok, i_hv, c, 64, s_ab, s_at, s_ah)
    store_tile(Ai, x1, b, rows, ok, i_hv, c + 16, 64, s_ab, s_at, s_ah)
    store_tile(Ai, x2, b, rows, ok, i_hv, c + 32, 64, s_ab, s_at, s_ah)
    store_tile(Ai, x3, b, rows, ok, i_hv, c + 48, 64, s_ab, s_at, s_ah)


@triton.jit
def _kkt_solve_body(k, g_cum, beta, Ai, b, start, eos, i_h, i_hv, K,
                    s_kb, s_kt, s_kh, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh, s_ab, s_at, s_ah,
                    BK: tl.constexpr, DOT_PREC: tl.constexpr, INV_PREC: tl.constexpr, MERGE_PREC: tl.constexpr):
    """``Ai = (I + A)^-1`` of one chunk, ``A[i, j] = beta_i (k_i . k_j) e^(G_i - G_j)`` (i > j).

    The 64x64 problem is a 4x4 grid of 16x16 blocks: the ten lower blocks of ``k k^T`` accumulate
    in fp32 over K tiles; beta and the gate are applied after the dot (as FLA); the four diagonal
    blocks are inverted (``inv_unit_lower16`` at ``INV_PREC``) and the off-diagonal blocks of the
    inverse follow by block forward substitution, ``X_ij = -X_ii sum_{j <= m < i} A_im X_mj`` at
    ``MERGE_PREC`` (``_solve_precision``).
    """
    r = tl.arange(0, 16)
    rows0 = start + r
    rows1 = rows0 + 16
    rows2 = rows0 + 32
    rows3 = rows0 + 48
    ok0 = rows0 < eos
    ok1 = rows1 < eos
    ok2 = rows2 < eos
    ok3 = rows3 < eos
    a00 = tl.zeros([16, 16], tl.float32)
    a10 = tl.zeros([16, 16], tl.float32)
    a11 = tl.zeros([16, 16], tl.float32)
    a20 = tl.zeros([16, 16], tl.float32)
    a21 = tl.zeros([16, 16], tl.float32)
    a22 = tl.zeros([16, 16], tl.float32)
    a30 = tl.zeros([16, 16], tl.float32)
    a31 = tl.zeros([16, 16], tl.float32)
    a32 = tl.zeros([16, 16], tl.float32)
    a33 = tl.zeros([16, 16], tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        k_0 = load_tile(k, b, rows0, ok0, i_h, cols, K, s_kb, s_kt, s_kh)
        k_1 = load_tile(k, b, rows1, ok1, i_h, cols, K, s_kb, s_kt, s_kh)
        k_2 = load_tile(k, b, rows2, ok2, i_h, cols, K, s_kb, s_kt, s_kh)
        k_3 = load_tile(k, b, rows3, ok3, i_h, cols, K, s_kb, s_kt, s_kh)
        t0 = tl.trans(k_0)
        t1 = tl.trans(k_1)
        t2 = tl.trans(k_2)
        a00 += tl.dot(k_0, t0, input_precision=DOT_PREC)
        a10 += tl.dot(k_1, t0, input_precision=DOT_PREC)
        a11 += tl.dot(k_1, t1, input_precision=DOT_PREC)
        a20 += tl.dot(k_2, t0, input_precision=DOT_PREC)
        a21 += tl.dot(k_2, t1, input_precision=DOT_PREC)
        a22 += tl.dot(k_2, t2, input_precision=DOT_PREC)
        a30 += tl.dot(k_3, t0, input_precision=DOT_PREC)
        a31 += tl.dot(k_3, t1, input_precision=DOT_PREC)
        a32 += tl.dot(k_3, t2, input_precision=DOT_PREC)
        a33 += tl.dot(k_3, tl.trans(k_3), input_precision=DOT_PREC)
    G0 = load_rows(g_cum, b, rows0, ok0, i_hv, s_gb, s_gt, s_gh) * LOG2E
    G1 = load_rows(g_cum, b, rows1, ok1, i_hv, s_gb, s_gt, s_gh) * LOG2E
    G2 = load_rows(g_cum, b, rows2, ok2, i_hv, s_gb, s_gt, s_gh) * LOG2E
    G3 = load_rows(g_cum, b, rows3, ok3, i_hv, s_gb, s_gt, s_gh) * LOG2E
    b0 = load_rows(beta, b, rows0, ok0, i_hv, s_bb, s_bt, s_bh)[:, None]
    b1 = load_rows(beta, b, rows1, ok1, i_hv, s_bb, s_bt, s_bh)[:, None]
    b2 = load_rows(beta, b, rows2, ok2, i_hv, s_bb, s_bt, s_bh)[:, None]
    b3 = load_rows(beta, b, rows3, ok3, i_hv, s_bb, s_bt, s_bh)[:, None]
    a00 = gate_causal(a00 * b0, G0, G0, ok0, ok0, rows0, rows0, True)
    a10 = gate_causal(a10 * b1, G1, G0, ok1, ok0, rows1, rows0, True)
    a11 = gate_causal(a11 * b1, G1, G1, ok1, ok1, rows1, rows1, True)
    a20 = gate_causal(a20 * b2, G2, G0, ok2, ok0, rows2, rows0, True)
    a21 = gate_causal(a21 * b2, G2, G1, ok2, ok1, rows2, rows1, True)
    a22 = gate_causal(a22 * b2, G2, G2, ok2, ok2, rows2, rows2, True)
    a30 = gate_causal(a30 * b3, G3, G0, ok3, ok0, rows3, rows0, True)
    a31 = gate_causal(a31 * b3, G3, G1, ok3, ok1, rows3, rows1, True)
    a32 = gate_causal(a32 * b3, G3, G2, ok3, ok2, rows3, rows2, True)
    a33 = gate_causal(a33 * b3, G3, G3, ok3, ok3, rows3, rows3, True)

    x00 = inv_unit_lower16(a00, INV_PREC)
    x11 = inv_unit_lower16(a11, INV_PREC)
    x22 = inv_unit_lower16(a22, INV_PREC)
    x33 = inv_unit_lower16(a33, INV_PREC)
    x10 = -dot_f32(x11, dot_f32(a10, x00, MERGE_PREC), MERGE_PREC)
    x21 = -dot_f32(x22, dot_f32(a21, x11, MERGE_PREC), MERGE_PREC)
    x32 = -dot_f32(x33, dot_f32(a32, x22, MERGE_PREC), MERGE_PREC)
    x20 = -dot_f32(x22, dot_f32(a20, x00, MERGE_PREC) + dot_f32(a21, x10, MERGE_PREC), MERGE_PREC)
    x31 = -dot_f32(x33, dot_f32(a31, x11, MERGE_PREC) + dot_f32(a32, x21, MERGE_PREC), MERGE_PREC)
    x30 = -dot_f32(x33, dot_f32(a30, x00, MERGE_PREC) + dot_f32(a31, x10, MERGE_PREC)
                   + dot_f32(a32, x20, MERGE_PREC), MERGE_PREC)
    zero = tl.zeros([16, 16], tl.float32)
    _store_block_row(Ai, b, rows0, ok0, i_hv, x00, zero, zero, zero, s_ab, s_at, s_ah)
    _store_block_row(Ai, b, rows1, ok1, i_hv, x10, x11, zero, zero, s_ab, s_at, s_ah)
    _store_block_row(Ai, b, rows2, ok2, i_hv, x20, x21, x22, zero, s_ab, s_at, s_ah)
    _store_block_row(Ai, b, rows3, ok3, i_hv, x30, x31, x32, x33, s_ab, s_at, s_ah)


@triton.jit
def _w_u_body(k, v, beta, Ai, g_cum, w, u, q, a_qk, kd, vd, Ad, wd, ud, qd, aqd, b, start, eos, i_h, i_hv, K, V,
              s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_bb, s_bt, s_bh, s_ab, s_at, s_ah,
              s_gb, s_gt, s_gh, s_wb, s_wt, s_wh, s_ub, s_ut, s_uh, s_qb, s_qt, s_qh,
              BK: tl.constexpr, BV: tl.constexpr, DOT_PREC: tl.constexpr, WITH_Q: tl.constexpr,
              TMA: tl.constexpr):
    """``w = Ai @ rnd(beta e^G k)``, ``u = Ai @ rnd(beta v)`` for one chunk, 64-row tiles.

    ``WITH_Q`` (gdn_chunk only) also stores the chunk's share of the output that needs no state,
    ``A_qk = rnd(select(i >= j, (q k^T) e^(G_i - G_j), 0))`` ([64, 64] per chunk, with Ai's strides:
    the launcher allocates them alike), so the sequential pass needs no ``q k^T``. k is read twice
    (once for A_qk over all of K, once per K tile), the second time from L2.

    ``TMA`` (fixed length, Hopper, 16-byte aligned rows): every tile is a copy through the host
    descriptors ``kd .. aqd`` (``fixed_tile``), which drops the 64-bit address tiles of the pointer
    path (255 registers and 296 B of spills at 4 warps, cuobjdump of the sm_90 cubin).
    """
    rows = start + tl.arange(0, BT)
    ok = rows < eos
    A = fixed_tile(Ai, Ad, b, start, rows, ok, i_hv, 0, BT, BT, s_ab, s_at, s_ah, TMA)
    bt = load_rows(beta, b, rows, ok, i_hv, s_bb, s_bt, s_bh)
    G2 = load_rows(g_cum, b, rows, ok, i_hv, s_gb, s_gt, s_gh) * LOG2E
    if WITH_Q:
        b_A = tl.zeros([BT, BT], tl.float32)
        for k0 in range(0, K, BK):
            qt = fixed_tile(q, qd, b, start, rows, ok, i_h, k0, BK, K, s_qb, s_qt, s_qh, TMA)
            kt = fixed_tile(k, kd, b, start, rows, ok, i_h, k0, BK, K, s_kb, s_kt, s_kh, TMA)
            b_A += tl.dot(qt, tl.trans(kt), input_precision=DOT_PREC)
        b_A = gate_causal(b_A, G2, G2, ok, ok, rows, rows, False).to(A.dtype)
        store_fixed_tile(a_qk, aqd, b_A, b, start, rows, ok, i_hv, 0, BT, BT, s_ab, s_at, s_ah, TMA)
    # formed after gate_causal's use of G2: before it, the 2-warp compile fails (Triton 3.6, sm_90:
    # "math.exp2 requires the same encoding for all operands")
    kscale = bt * tl.exp2(G2)
    for k0 in range(0, K, BK):
        kt = fixed_tile(k, kd, b, start, rows, ok, i_h, k0, BK, K, s_kb, s_kt, s_kh, TMA)
        kb = (kt.to(tl.float32) * kscale[:, None]).to(kt.dtype)
        store_fixed_tile(w, wd, tl.dot(A, kb, input_precision=DOT_PREC), b, start, rows, ok, i_hv, k0, BK, K,
                         s_wb, s_wt, s_wh, TMA)
    for v0 in range(0, V, BV):
        vt = fixed_tile(v, vd, b, start, rows, ok, i_hv, v0, BV, V, s_vb, s_vt, s_vh, TMA)
        vb = (vt.to(tl.float32) * bt[:, None]).to(vt.dtype)
        store_fixed_tile(u, ud, tl.dot(A, vb, input_precision=DOT_PREC), b, start, rows, ok, i_hv, v0, BV, V,
                         s_ub, s_ut, s_uh, TMA)


# ------------------------------------------------------------------------------------ kernels
@length_agnostic(triton.jit)
def _gdn_chunk_cumsum_kernel(g, g_cum, cu_seqlens, chunk_indices, T, NT, HV,
                             s_gb, s_gt, s_cb, s_ct, IS_VARLEN: tl.constexpr, BHV: tl.constexpr):
    i_c = tl.program_id(0)
    b, start, eos = chunk_span(i_c, cu_seqlens, chunk_indices, T, NT, IS_VARLEN, BT)
    rows = start + tl.arange(0, BT)
    heads = tl.arange(0, BHV)
    mask = (rows < eos)[:, None] & (heads < HV)[None, :]
    x = tl.load(g + b * s_gb + rows[:, None] * s_gt + heads[None, :], mask=mask, other=0.0)
    tl.store(g_cum + b * s_cb + rows[:, None] * s_ct + heads[None, :],
             tl.cumsum(decay_log(x), axis=0), mask=mask)


@length_agnostic(triton.jit)
def _gdn_kkt_solve_kernel(k, g, g_cum, beta, Ai, cu_seqlens, chunk_indices, T, NT, HV, GROUP, K,
                          s_kb, s_kt, s_kh, s_gb, s_gt, s_gh, s_cb, s_ct, s_ch, s_bb, s_bt, s_bh,
                          s_ab, s_at, s_ah, IS_VARLEN: tl.constexpr, BK: tl.constexpr, DOT_PREC: tl.constexpr,
                          INV_PREC: tl.constexpr, MERGE_PREC: tl.constexpr, CUMSUM: tl.constexpr):
    """``Ai`` of one (chunk, value head). ``CUMSUM`` (gdn_chunk): first write this chunk's ``g_cum``
    from ``g``; the barrier makes those global writes visible to the CTA's other threads, which
    re-read them in the solve's tile shapes. Adjacent programs are the value heads of one chunk, so
    GVA heads sharing a key head read its k tiles from L2."""
    pid = tl.program_id(0)
    i_c, i_hv = pid // HV, pid % HV
    b, start, eos = chunk_span(i_c, cu_seqlens, chunk_indices, T, NT, IS_VARLEN, BT)
    if CUMSUM:
        _cumsum_head(g, g_cum, b, start, eos, i_hv, s_gb, s_gt, s_gh, s_cb, s_ct, s_ch)
        tl.debug_barrier()
    _kkt_solve_body(k, g_cum, beta, Ai, b, start, eos, i_hv // GROUP, i_hv, K,
                    s_kb, s_kt, s_kh, s_cb, s_ct, s_ch, s_bb, s_bt, s_bh, s_ab, s_at, s_ah, BK, DOT_PREC,
                    INV_PREC, MERGE_PREC)


@length_agnostic(triton.jit)
def _gdn_recompute_w_u_kernel(k, v, beta, Ai, g_cum, w, u, q, a_qk, kd, vd, Ad, wd, ud, qd, aqd,
                              cu_seqlens, chunk_indices, ready,
                              T, NT, HV, GROUP, K, V, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_bb, s_bt, s_bh,
                              s_ab, s_at, s_ah, s_gb, s_gt, s_gh, s_qb, s_qt, s_qh,
                              IS_VARLEN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                              DOT_PREC: tl.constexpr, WITH_Q: tl.constexpr, TMA: tl.constexpr,
                              PUBLISH: tl.constexpr):
    """``w``, ``u`` of one (chunk, value head); ``WITH_Q`` (gdn_chunk) also ``A_qk``. ``PUBLISH``: the
    Hopper state pass runs beside this kernel on another stream (``_overlap_pass``) and waits for
    ``ready[pid]``; the CTA barrier orders every thread's stores (pointer stores only: a TMA store's
    completion is not covered) before one thread's gpu-scope release. w and u are the launcher's
    contiguous ``[B, T, HV, K]`` / ``[B, T, HV, V]`` buffers: their strides follow from the shape."""
    pid = tl.program_id(0)
    i_c, i_hv = pid // HV, pid % HV
    b, start, eos = chunk_span(i_c, cu_seqlens, chunk_indices, T, NT, IS_VARLEN, BT)
    T64 = T.to(tl.int64)  # a batch stride passes 2^31 at 1M tokens
    _w_u_body(k, v, beta, Ai, g_cum, w, u, q, a_qk, kd, vd, Ad, wd, ud, qd, aqd, b, start, eos, i_hv // GROUP,
              i_hv, K, V,
              s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_bb, s_bt, s_bh, s_ab, s_at, s_ah,
              s_gb, s_gt, s_gh, T64 * HV * K, HV * K, K, T64 * HV * V, HV * V, V, s_qb, s_qt, s_qh, BK, BV, DOT_PREC,
              WITH_Q, TMA)
    if PUBLISH:  # the pass reads these stores through TMA (the async proxy): order them for it first
        tl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)
        tl.debug_barrier()
        tl.atomic_xchg(ready + pid, 1, sem="release", scope="gpu")


# ---------------------------------------------------------------------------------- launchers
def _solve_precision(dtype: torch.dtype) -> dict[str, str]:
    """Products of the 64x64 solve (gdn.md §3.2), all fp32 x fp32. For 16-bit inputs both the diagonal
    16x16 inverses and the block merges run as ``"bf16x3"``: each fp32 operand split into two bf16
    parts, three tensor-core products (the lo x lo term dropped), ~2^-16 relative per product, so the
    inverse series' large cancelling terms keep their accuracy without the CUDA-core ``"ieee"`` path,
    whose operands go through shared memory (704 shared loads per program at one warp, sm_90 PTX);
    faster than ieee at the same or lower error (gdn.md §6.3). fp32 inputs keep full fp32 (no
    tensor-core rounding anywhere for them, gdn.md §3.8). The Triton interpreter accepts only
    ieee/tf32/tf32x3 (and computes every product in full precision): it gets ``"tf32x3"``."""
    p = "ieee" if dtype == torch.float32 else "tf32x3" if _common.interpreting() else "bf16x3"
    return {"INV_PREC": p, "MERGE_PREC": p}


def _w_u_tma(fixed_length: bool, *tiles: torch.Tensor) -> bool:
    """Whether the w/u kernel copies its tiles through host descriptors: fixed length only, since a
    descriptor over ``[B, T, H, C]`` zero-fills and clips at T, which is a varlen sequence's end only
    for the last sequence (its full-box stores would overwrite the next sequence's rows)."""
    return fixed_length and _common._tma_ready(*tiles)


def _w_u_tiles(K: int, V: int) -> tuple[int, int]:
    """The w/u kernel's ``(BK, BV)``: its K and V tile widths, which its descriptors' boxes must match."""
    return min(64, _pow2(K)), min(64, _pow2(V))


def _w_u_descriptors(tma: bool, BK: int, BV: int, k, v, Ai, w, u, q=None, a_qk=None) -> tuple:
    """The w/u kernel's ``kd, vd, Ad, wd, ud, qd, aqd``: host descriptors in ``[1, 64, 1, C]`` boxes
    (C: ``BK``, ``BV`` or 64) with ``tma`` (q and A_qk only with them given), else None (the pointer
    path reads none of them)."""
    if not tma:
        return None, None, None, None, None, None, None
    return (_descriptor(k, BK), _descriptor(v, BV), _descriptor(Ai, CHUNK), _descriptor(w, BK), _descriptor(u, BV),
            None if q is None else _descriptor(q, BK), None if a_qk is None else _descriptor(a_qk, CHUNK))


_DESCRIPTOR_SHAPES: set = set()


def _descriptor(x: torch.Tensor, C: int):
    """A host TMA descriptor of ``x [B, T, H, C']`` in ``[1, 64, 1, C]`` boxes. Triton's constructor
    re-validates the geometry at every call; a geometry that passed once (shape, strides, dtype, box;
    alignment was checked by ``_tma_ready``) is built without it."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    shape, strides = x.shape, x.stride()
    geometry = (shape, strides, x.dtype, C)
    if geometry not in _DESCRIPTOR_SHAPES:
        d = TensorDescriptor.from_tensor(x, [1, CHUNK, 1, C])
        if len(_DESCRIPTOR_SHAPES) >= 1024:
            _DESCRIPTOR_SHAPES.clear()
        _DESCRIPTOR_SHAPES.add(geometry)
        return d
    d = TensorDescriptor.__new__(TensorDescriptor)
    d.base, d.shape, d.strides, d.block_shape, d.padding = x, shape, strides, [1, CHUNK, 1, C], "zero"
    return d


def gdn_chunk_cumsum(g, cu_seqlens=None, chunk_indices=None):
    _checks.gdn_chunk_cumsum(g, cu_seqlens, chunk_indices)
    B, T, HV = g.shape
    ci, NT, NT_total = _varlen_plan(T, B, cu_seqlens, chunk_indices)
    g_cum = torch.empty((B, T, HV), dtype=torch.float32, device=g.device)
    if NT_total:
        launch(_gdn_chunk_cumsum_kernel, (NT_total,), (HV, *map(tensor_key, (g, cu_seqlens, ci))),
               g, g_cum, cu_seqlens, ci, T, NT, HV, g.stride(0), g.stride(1), g_cum.stride(0), g_cum.stride(1),
               IS_VARLEN=cu_seqlens is not None, BHV=_pow2(HV, 1))
    return g_cum


def gdn_kkt_solve(k, g_cum, beta, cu_seqlens=None, chunk_indices=None):
    _checks.gdn_kkt_solve(k, g_cum, beta, cu_seqlens, chunk_indices)
    B, T, H, K = k.shape
    HV = g_cum.shape[2]
    ci, NT, NT_total = _varlen_plan(T, B, cu_seqlens, chunk_indices)
    Ai = torch.empty((B, T, HV, CHUNK), dtype=k.dtype, device=k.device)
    if NT_total:
        launch(
            _gdn_kkt_solve_kernel, (NT_total * HV,), (H, HV, K, *map(tensor_key, (k, g_cum, beta, cu_seqlens, ci))),
            k, None, g_cum, beta, Ai, cu_seqlens, ci, T, NT, HV, HV // H, K,
            *_s3(k), *_s3(g_cum), *_s3(g_cum), *_s3(beta), *_s3(Ai),
            IS_VARLEN=cu_seqlens is not None, BK=min(64, _pow2(K)), DOT_PREC=_dot_prec(k.dtype),
            **_solve_precision(k.dtype), CUMSUM=False, num_warps=4)
    return Ai


def gdn_recompute_w_u(k, v, beta, Ai, g_cum, cu_seqlens=None, chunk_indices=None):
    _checks.gdn_recompute_w_u(k, v, beta, Ai, g_cum, cu_seqlens, chunk_indices)
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    ci, NT, NT_total = _varlen_plan(T, B, cu_seqlens, chunk_indices)
    w = torch.empty((B, T, HV, K), dtype=k.dtype, device=k.device)
    u = torch.empty((B, T, HV, V), dtype=v.dtype, device=k.device)
    if NT_total:
        tma = _w_u_tma(cu_seqlens is None, k, v, Ai, w, u)
        BK, BV = _w_u_tiles(K, V)
        launch(
            _gdn_recompute_w_u_kernel, (NT_total * HV,),
            (H, HV, K, V, *map(tensor_key, (k, v, beta, Ai, g_cum, cu_seqlens, ci))),
            k, v, beta, Ai, g_cum, w, u, None, None, *_w_u_descriptors(tma, BK, BV, k, v, Ai, w, u),
            cu_seqlens, ci, None, T, NT, HV, HV // H, K, V,
            *_s3(k), *_s3(v), *_s3(beta), *_s3(Ai), *_s3(g_cum), 0, 0, 0,
            IS_VARLEN=cu_seqlens is not None, BK=BK, BV=BV, DOT_PREC=_dot_prec(k.dtype), WITH_Q=False, TMA=tma,
            PUBLISH=False, num_warps=4)
    return w, u


# The solve is latency-bound on its chain of small 16x16 products: one warp per program keeps the most
# programs per SM for 16-bit inputs, two lead for fp32 (the tuner finds it). w/u is bound by its loads
# and stores: 4 warps, 3 stages (gdn.md §6.3).
_SOLVE = Tuner("gdn_chunk_solve", [Config(num_warps=1, num_stages=2), Config(num_warps=2, num_stages=2),
                                   Config(num_warps=2, num_stages=1), Config(num_warps=4, num_stages=2)], bucket=4)
_W_U = Tuner("gdn_chunk_w_u", [Config(num_warps=4, num_stages=3), Config(num_warps=4, num_stages=2),
                               Config(num_warps=4, num_stages=1), Config(num_warps=2, num_stages=2)], bucket=4)
plan.TUNERS += [_SOLVE, _W_U]


# The prep kernels' parallelism bucket: a config tuned on a small grid is not the best on a large one
# (gdn.md §6.3). Two values: at most two tunings per head configuration and layout, whatever the lengths.
MANY_CHUNKS_PER_SM = 16


def many_chunks(NT_total: int, HV: int, device: torch.device) -> bool:
    """The bucket of the prep kernels' tuning key: ``NT_total * HV`` programs fill the GPU 16 times."""
    return NT_total * HV >= MANY_CHUNKS_PER_SM * _common.sm_count(device)


class ChunkPrep(NamedTuple):
    """What the chunk-parallel part of ``gdn_chunk`` leaves for the state pass. ``launch_w_u`` is set
    where the pass runs beside w/u (``_overlap_pass``): w/u has not been launched yet, and ``ready``
    holds its per-chunk flags. Plain fields on purpose: a closure stored in a container it refers to
    is a reference cycle, which keeps every buffer of the call alive until the garbage collector runs
    (a model's peak memory rose by the prep buffers of each GDN layer)."""

    g_cum: torch.Tensor
    w: torch.Tensor
    u: torch.Tensor
    a_qk: torch.Tensor
    ready: torch.Tensor | None
    launch_w_u: Callable[[], None] | None


def _chunk_prep(q, k, v, g, beta, cu_seqlens, ci, NT, NT_total, overlap: bool = False) -> ChunkPrep:
    """The chunk-parallel part of ``gdn_chunk``: ``g_cum``, ``Ai`` (scratch), ``w``, ``u`` and ``a_qk``
    (allocated like Ai). With ``overlap`` where the pass may run beside w/u (``_overlap_pass``), w/u is
    not launched: ``launch_w_u`` launches it, for ``_state_pass`` to call beside the pass, and ``ready``
    holds a flag per chunk and value head, which w/u sets as it finishes each.

    Two launches, the stage kernels with their gdn_chunk flags: cumsum + kkt + solve, then w/u +
    A_qk, so each phase gets its own occupancy and config (one fused kernel measured slower:
    gdn.md §6.3).
    """
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    dev = k.device
    g_cum = torch.empty((B, T, HV), dtype=torch.float32, device=dev)
    Ai = torch.empty((B, T, HV, CHUNK), dtype=k.dtype, device=dev)
    w = torch.empty((B, T, HV, K), dtype=k.dtype, device=dev)
    u = torch.empty((B, T, HV, V), dtype=v.dtype, device=dev)
    a_qk = torch.empty_like(Ai)
    publish = overlap and NT_total > 0 and state_pass._overlap_pass(k, q, w, u, a_qk, cu_seqlens)
    ready = torch.zeros(NT_total * HV, dtype=torch.int32, device=dev) if publish else None
    if publish:
        plan.note_zeros(ready)
    if NT_total == 0:
        return ChunkPrep(g_cum, w, u, a_qk, ready, None)
    key = (K, V, k.dtype, cu_seqlens is not None, many_chunks(NT_total, HV, dev))
    facts = (H, HV, K, V, *map(tensor_key, (q, k, v, g, beta, cu_seqlens, ci)))
    BK, BV = _w_u_tiles(K, V)

    def solve(cfg: Config):
        launch(
            _gdn_kkt_solve_kernel, (NT_total * HV,), facts,
            k, g, g_cum, beta, Ai, cu_seqlens, ci, T, NT, HV, HV // H, K,
            *_s3(k), *_s3(g), *_s3(g_cum), *_s3(beta), *_s3(Ai),
            IS_VARLEN=cu_seqlens is not None, BK=min(64, _pow2(K)), DOT_PREC=_dot_prec(k.dtype),
            **_solve_precision(k.dtype), CUMSUM=True, **cfg.launch_kwargs())

    tiles = (k, v, Ai, w, u, q, a_qk)
    tma = not publish and _w_u_tma(cu_seqlens is None, *tiles)
    descs = _w_u_descriptors(tma, BK, BV, *tiles)

    def w_u(cfg: Config):
        launch(
            _gdn_recompute_w_u_kernel, (NT_total * HV,), facts,
            k, v, beta, Ai, g_cum, w, u, q, a_qk, *descs, cu_seqlens, ci, ready, T, NT, HV, HV // H, K, V,
            *_s3(k), *_s3(v), *_s3(beta), *_s3(Ai), *_s3(g_cum), *_s3(q),
            IS_VARLEN=cu_seqlens is not None, BK=BK, BV=BV, DOT_PREC=_dot_prec(k.dtype), WITH_Q=True, TMA=tma,
            PUBLISH=publish, **cfg.launch_kwargs())

    _SOLVE(key, solve, dev)
    if publish:
        return ChunkPrep(g_cum, w, u, a_qk, ready, lambda: _W_U((*key, tma), w_u, dev))
    _W_U((*key, tma), w_u, dev)
    return ChunkPrep(g_cum, w, u, a_qk, None, None)
