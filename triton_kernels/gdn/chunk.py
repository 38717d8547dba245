"""Chunked Gated DeltaNet forward in Triton: the five stage ops and the fused ``gdn_chunk`` (gdn.md).

Stage kernels (one op each; what the stage tests diff against the reference, stage by stage):

* ``_gdn_chunk_cumsum_kernel``   one program per chunk, all value heads of it;
* ``_gdn_kkt_solve_kernel``      per (chunk, value head): ``(I + A)^-1`` as 16x16 blocks;
* ``_gdn_recompute_w_u_kernel``  per (chunk, value head): ``w``, ``u`` from the stored ``Ai``;
* ``_gdn_state_pass_kernel``     per (V tile, sequence, value head): the sequential pass (fwd_h);
* ``_gdn_fwd_o_kernel``          per (V tile, chunk, value head): chunk outputs from ``h``.

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

import contextlib
from typing import Callable, NamedTuple

import torch
import triton
import triton.language as tl

from ... import _env
from ..._checks import gdn as _checks
from ..._checks.common import remembered
from .._launch import launch, tensor_key
from .._tune import (Config, Tuner, cdiv, cuda_capability, descriptor_workspace, has_tma, interpreting, next_pow2,
                     sm_count)
from ._jit import (BT, CHUNK, LOG2E, chunk_rows, chunk_span, decay_log, dot_f32, fixed_tile, gate_causal, inv_unit_lower16,
                   length_agnostic, load_rows, load_tile, load_tile_t, rows_desc, segment_span, seq_span,
                   store_fixed_tile, store_tile, store_tile_t, v_tile_head_row)

_check_chunk = remembered(_checks.gdn_chunk)  # eager calls repeat their metadata: check it once


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


@triton.jit
def _chain_operands(k, w, u, g_cum, k_d, w_d, u_d, b, start, rows, ok, eos, i_h, i_hv, vv, v0, K, V,
                    s_kb, s_kt, s_kh, s_wb, s_wt, s_wh, s_ub, s_ut, s_uh, s_gb, s_gt, s_gh,
                    TMA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """What one step of the state chain reads of the chunk at ``start`` (rows ``rows``, valid where
    ``ok``), the pass and the segment summary alike: the w and k tiles, ``u^T`` of the V tile
    ``vv = v0 + arange(BV)``, and the gates ``G_L`` (the last valid row) and ``G``, scaled to log2."""
    wt = chunk_rows(w, w_d, b, start, rows, ok, i_hv, 0, BK, K, s_wb, s_wt, s_wh, TMA)
    kt = chunk_rows(k, k_d, b, start, rows, ok, i_h, 0, BK, K, s_kb, s_kt, s_kh, TMA)
    if TMA:
        uT = tl.trans(chunk_rows(u, u_d, b, start, rows, ok, i_hv, v0, BV, V, s_ub, s_ut, s_uh, TMA))
    else:
        uT = load_tile_t(u, b, rows, ok, i_hv, vv, V, s_ub, s_ut, s_uh)
    last = tl.minimum(start + BT, eos) - 1
    G2_L = tl.load(g_cum + b * s_gb + last * s_gt + i_hv * s_gh) * LOG2E
    G2 = load_rows(g_cum, b, rows, ok, i_hv, s_gb, s_gt, s_gh) * LOG2E
    return wt, kt, uT, G2_L, G2


@length_agnostic(triton.jit)
def _gdn_state_pass_kernel(k, w, u, g_cum, h0, h, out, final, q, a_qk, cu_seqlens,
                           chunk_offsets, seg_table, scale, T, NT, NT_total, NS, CPS, HV, GROUP, K, V,
                           s_kb, s_kt, s_kh, s_wb, s_wt, s_wh, s_ub, s_ut, s_uh, s_ob, s_ot, s_oh,
                           s_gb, s_gt, s_gh, s_0n, s_0h, s_0k, s_0v, s_hc, s_hh, s_hk, s_hv, s_fn, s_fh, s_fk, s_fv,
                           s_ab, s_at, s_ah, s_qb, s_qt, s_qh,
                           IS_VARLEN: tl.constexpr, HAS_H0: tl.constexpr, STORE_H: tl.constexpr,
                           WITH_O: tl.constexpr, TMA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                           DOT_PREC: tl.constexpr, SEGMENTED: tl.constexpr):
    """The sequential pass over one sequence's chunks for one (V tile, value head).

    The program carries its V tile of the state transposed, ``M = S^T [BV, BK]`` in fp32
    registers, so that every product on the chunk-to-chunk chain takes a register operand on the
    left (``M_op``, then the gated ``v_new^T``) and a tile straight from shared memory on the right;
    nothing on the chain goes back through shared memory. Per chunk::

        M_op  = rnd(M)                       (STORE_H: h[c] = M_op^T, the state entering the chunk)
        v^T   = u^T - M_op @ w^T             (v_new^T, the per-token delta; the fwd_h op stores it)
        M     = e^(G_L) M + rnd(select(valid, v^T e^(G_L - G), 0)) @ k
        o^T   = scale ((M_op @ q^T) e^G + rnd(v^T) @ A_qk^T)                     (WITH_O, gdn_chunk)

    with L the chunk's last valid row: fwd_o's products in its order (``_gdn_fwd_o_kernel``), with
    ``A_qk`` from the w/u kernel, so neither the per-chunk states ``h`` nor ``v_new`` are written. The
    output's products read the chain's values but feed nothing back into it (gdn.md §6 has what an
    earlier operand ``q~``, folding ``A_qk v_new`` into the w/u kernel, cost and saved).

    ``TMA`` (Hopper, 16-byte aligned rows): every chunk tile (w, k, u, q, A_qk) arrives as a
    tensor-memory copy through a descriptor of this sequence's rows built in the kernel (``rows_desc``),
    which zero-fills past the sequence's end exactly as the masked loads do, and which the software
    pipeline runs ``num_stages`` deep: copies beat pointer loads, whose 64-bit address tiles spill
    (gdn.md §6.3 has the measurements).
    States use explicit (k, v) strides, so both layouts share this code. ``out`` receives ``o``
    (WITH_O) or ``v_new`` (the fwd_h op, with h).

    ``SEGMENTED`` (the sequence-parallel pass, ``_segment_starts``): a program walks one segment's
    chunks (``segment_span``) from the start state ``h0[j]`` that ``_gdn_segment_scan_kernel`` left for
    segment j, and only a sequence's last segment stores its final state.
    """
    i_v, i_hv, row = v_tile_head_row(V, BV, HV)
    i_h = i_hv // GROUP
    if SEGMENTED:
        n, b, bos, eos, c_lo, c_hi, seg_last = segment_span(row, seg_table, cu_seqlens, T, NT, NS, CPS, IS_VARLEN)
        h0_row = row
    else:
        n = row
        b, bos, eos = seq_span(n, cu_seqlens, T, IS_VARLEN)
        c_lo = 0
        c_hi = tl.cdiv(eos - bos, BT)
        h0_row = n
    w_d, k_d, u_d, q_d, a_d = w, k, u, q, a_qk  # the pointer path ignores these
    if TMA:
        w_d = rows_desc(w, b, i_hv, eos, s_wb, s_wt, s_wh, K, BK)
        k_d = rows_desc(k, b, i_h, eos, s_kb, s_kt, s_kh, K, BK)
        u_d = rows_desc(u, b, i_hv, eos, s_ub, s_ut, s_uh, V, BV)
        if WITH_O:
            q_d = rows_desc(q, b, i_h, eos, s_qb, s_qt, s_qh, K, BK)
            a_d = rows_desc(a_qk, b, i_hv, eos, s_ab, s_at, s_ah, BT, BT)
    if IS_VARLEN:
        first = tl.load(chunk_offsets + n).to(tl.int64)  # row of h of this sequence's first chunk
    else:
        first = n.to(tl.int64) * NT
    kk = tl.arange(0, BK)
    vv = i_v * BV + tl.arange(0, BV)
    vk_ok = (vv < V)[:, None] & (kk < K)[None, :]
    if HAS_H0:
        M = tl.load(h0 + h0_row * s_0n + i_hv * s_0h + vv[:, None] * s_0v + kk[None, :] * s_0k,
                    mask=vk_ok, other=0.0).to(tl.float32)
    else:
        M = tl.zeros([BV, BK], tl.float32)
    for c in range(c_lo, c_hi):
        start = bos + c * BT
        rows = start + tl.arange(0, BT)
        ok = rows < eos
        M_op = M.to(k.dtype.element_ty)
        if STORE_H:
            tl.store(h + (first + c) * s_hc + i_hv * s_hh + vv[:, None] * s_hv + kk[None, :] * s_hk,
                     M_op, mask=vk_ok & (first + c < NT_total))
        wt, kt, uT, G2_L, G2 = _chain_operands(
            k, w, u, g_cum, k_d, w_d, u_d, b, start, rows, ok, eos, i_h, i_hv, vv, i_v * BV, K, V,
            s_kb, s_kt, s_kh, s_wb, s_wt, s_wh, s_ub, s_ut, s_uh, s_gb, s_gt, s_gh, TMA, BK, BV)
        vT = uT.to(tl.float32) - tl.dot(M_op, tl.trans(wt), input_precision=DOT_PREC)
        if not WITH_O:
            store_tile_t(out, vT, b, rows, ok, i_hv, vv, V, s_ob, s_ot, s_oh)
        gated = tl.where(ok[None, :], tl.exp2(G2_L - G2)[None, :] * vT, 0.0).to(kt.dtype)
        M_next = M * tl.exp2(G2_L) + tl.dot(gated, kt, input_precision=DOT_PREC)
        if WITH_O:
            qt = chunk_rows(q, q_d, b, start, rows, ok, i_h, 0, BK, K, s_qb, s_qt, s_qh, TMA)
            At = chunk_rows(a_qk, a_d, b, start, rows, ok, i_hv, 0, BT, BT, s_ab, s_at, s_ah, TMA)
            oT = tl.dot(M_op, tl.trans(qt), input_precision=DOT_PREC) * tl.exp2(G2)[None, :] \
                + tl.dot(vT.to(uT.dtype), tl.trans(At), input_precision=DOT_PREC)
            store_tile_t(out, oT * scale, b, rows, ok, i_hv, vv, V, s_ob, s_ot, s_oh)
        M = M_next
    if SEGMENTED:
        vk_ok = vk_ok & seg_last  # only a sequence's last segment holds its final state
    tl.store(final + n * s_fn + i_hv * s_fh + vv[:, None] * s_fv + kk[None, :] * s_fk, M, mask=vk_ok)


@triton.jit
def _split_dot(a, b, acc, PREC: tl.constexpr):
    """``acc + a @ b`` for an fp32 ``a`` and a 16-bit tile ``b`` as loaded (exact data). ``"bf16x2"``:
    ``a`` split into two bf16 parts (``hi + lo``, ~16 mantissa bits), each multiplied by ``b`` as it is,
    so no fp32 copy of ``b`` goes through shared memory; else one product at ``PREC`` (tf32, ieee) of
    ``b`` in fp32."""
    if PREC == "bf16x2":
        hi = a.to(tl.bfloat16)
        lo = (a - hi.to(tl.float32)).to(tl.bfloat16)
        return tl.dot(lo, b, tl.dot(hi, b, acc))
    else:
        return tl.dot(a, b.to(tl.float32), acc, input_precision=PREC)


@length_agnostic(triton.jit)
def _gdn_segment_summary_kernel(k, w, u, g_cum, At, Bt, seg_table, cu_seqlens, T, NT, NS, CPS, HV, GROUP, K, V,
                                s_kb, s_kt, s_kh, s_wb, s_wt, s_wh, s_ub, s_ut, s_uh, s_gb, s_gt, s_gh,
                                IS_VARLEN: tl.constexpr, TMA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                                DOT_PREC: tl.constexpr, TRANSFER_PREC: tl.constexpr):
    """Summary of one segment for one value head, transposed as in the pass: a program per (row tile,
    value head, segment), tiles fastest, carries rows ``i_t * BV ..`` of two chains over the segment's
    chunks, which read each chunk's w and k tiles once:

    * ``B^T`` (``Bt [S, HV, V, K]``), the segment's zero-start end state: exactly the pass's update
      (``rnd(M)``, ``rnd(gated)``) without the output;
    * ``A^T`` (``At [S, HV, K, K]``), where ``A`` (``K x K``) maps the state entering the segment to its
      share of the state leaving it: per chunk ``A <- (e^(G_L) I - k^T diag(e^(G_L - G)) w) A``, the same
      update with ``u = 0`` from ``A^T = I``, kept in fp32 (products at ``TRANSFER_PREC``, ``_split_dot``)
      since every later segment's start state goes through it.

    Rows past V (of B) or K (of A) stay zero and are not stored. A sequence's last segment has no
    successor to feed: its program skips the chunks (the scan never reads its slot)."""
    n_tiles = tl.cdiv(tl.maximum(V, K), BV)
    pid = tl.program_id(0)
    i_t, rest = pid % n_tiles, pid // n_tiles
    i_hv, j = rest % HV, (rest // HV).to(tl.int64)
    i_h = i_hv // GROUP
    n, b, bos, eos, c_lo, c_hi, last = segment_span(j, seg_table, cu_seqlens, T, NT, NS, CPS, IS_VARLEN)
    c_hi = tl.where(last, c_lo, c_hi)
    w_d, k_d, u_d = w, k, u  # the pointer path ignores these
    if TMA:
        w_d = rows_desc(w, b, i_hv, eos, s_wb, s_wt, s_wh, K, BK)
        k_d = rows_desc(k, b, i_h, eos, s_kb, s_kt, s_kh, K, BK)
        u_d = rows_desc(u, b, i_hv, eos, s_ub, s_ut, s_uh, V, BV)
    kk = tl.arange(0, BK)
    rr = i_t * BV + tl.arange(0, BV)
    MA = tl.where((rr[:, None] == kk[None, :]) & (kk < K)[None, :], 1.0, 0.0)
    MB = tl.zeros([BV, BK], tl.float32)
    for c in range(c_lo, c_hi):
        start = bos + c * BT
        rows = start + tl.arange(0, BT)
        ok = rows < eos
        wt, kt, uT, G2_L, G2 = _chain_operands(
            k, w, u, g_cum, k_d, w_d, u_d, b, start, rows, ok, eos, i_h, i_hv, rr, i_t * BV, K, V,
            s_kb, s_kt, s_kh, s_wb, s_wt, s_wh, s_ub, s_ut, s_uh, s_gb, s_gt, s_gh, TMA, BK, BV)
        vB = uT.to(tl.float32) - tl.dot(MB.to(kt.dtype), tl.trans(wt), input_precision=DOT_PREC)
        vA = -_split_dot(MA, tl.trans(wt), tl.zeros([BV, BT], tl.float32), TRANSFER_PREC)
        gB = tl.where(ok[None, :], tl.exp2(G2_L - G2)[None, :] * vB, 0.0).to(kt.dtype)
        gA = tl.where(ok[None, :], tl.exp2(G2_L - G2)[None, :] * vA, 0.0)
        MB = MB * tl.exp2(G2_L) + tl.dot(gB, kt, input_precision=DOT_PREC)
        MA = _split_dot(gA, kt, MA * tl.exp2(G2_L), TRANSFER_PREC)
    k_ok = (kk < K)[None, :]
    tl.store(Bt + ((j * HV + i_hv) * V + rr[:, None]) * K + kk[None, :], MB, mask=(rr < V)[:, None] & k_ok)
    tl.store(At + ((j * HV + i_hv) * K + rr[:, None]) * K + kk[None, :], MA, mask=(rr < K)[:, None] & k_ok)


@triton.jit
def _scan_start(h0, final, n, i_hv, vv, cols, mask, ns, s_0n, s_0h, s_0k, s_0v, s_fn, s_fh, s_fk, s_fv,
                HAS_H0: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr):
    """The scan's start tile ``S^T[vv, cols]`` of sequence ``n`` (h0, or zeros), fp32; a sequence without
    chunks (``ns == 0``) has no segment, so its final state is this tile, stored here."""
    if HAS_H0:
        x = tl.load(h0 + n * s_0n + i_hv * s_0h + vv[:, None] * s_0v + cols[None, :] * s_0k, mask=mask,
                    other=0.0).to(tl.float32)
    else:
        x = tl.zeros([BV, BC], tl.float32)
    tl.store(final + n * s_fn + i_hv * s_fh + vv[:, None] * s_fv + cols[None, :] * s_fk, x, mask=mask & (ns == 0))
    return x


@length_agnostic(triton.jit)
def _gdn_segment_scan_kernel(h0, At, Bt, S0, final, cu_seqlens, seg_first, T, NS, CPS, HV, K, V,
                             s_0n, s_0h, s_0k, s_0v, s_fn, s_fh, s_fk, s_fv,
                             IS_VARLEN: tl.constexpr, HAS_H0: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,
                             PREC: tl.constexpr, IN_REGS: tl.constexpr):
    """The start state of every segment of one sequence, for one (V tile, value head): ``S0[j0] = h0``,
    then ``S_(s+1) = A_s S_s + B_s``, kept transposed (``S0 [S, HV, V, K]``, fp32, products at
    ``PREC``) as ``S0[j+1] = S0[j] A_j^T + B_j^T``. A sequence without chunks has no segment: its
    final state is the start state, written here.

    ``IN_REGS`` (``_scan_in_regs``; ``BC`` = the padded K, at most 128): the ``[BV, BC]`` state stays
    in registers across segments as the dot's operand and accumulator; each step loads ``A_j^T`` and
    ``B_j^T`` straight into the dot (the software pipeline copies step j+1's A into shared memory
    while step j multiplies) and stores ``S0[j+1]`` once, never reading it back: no CTA barrier or
    global round trip of the state in the loop. Else (fp32 inputs, or K > 128: the operands of a full
    ``K x K`` product would not fit) in ``BC``-wide column blocks through memory, the CTA barrier
    making a step's stores visible to the next step's loads."""
    i_v, i_hv, n = v_tile_head_row(V, BV, HV)
    if IS_VARLEN:
        b, bos, eos = seq_span(n, cu_seqlens, T, True)
        ns = tl.cdiv(tl.cdiv(tl.maximum(eos - bos, 0), BT), CPS)
        j0 = tl.load(seg_first + n).to(tl.int64)
    else:
        ns = NS
        j0 = n.to(tl.int64) * NS
    vv = i_v * BV + tl.arange(0, BV)
    v_ok = vv < V
    cc = tl.arange(0, BC)
    if IN_REGS:
        mask = v_ok[:, None] & (cc < K)[None, :]
        S = _scan_start(h0, final, n, i_hv, vv, cc, mask, ns, s_0n, s_0h, s_0k, s_0v, s_fn, s_fh, s_fk, s_fv,
                        HAS_H0, BV, BC)
        # scalar bases carried through the loop, loop-invariant offsets: no pointer tiles held in registers
        s_off = vv[:, None] * K + cc[None, :]
        s_base = S0 + (j0 * HV + i_hv) * V * K
        tl.store(s_base + s_off, S, mask=mask & (ns > 0))
        a_off = cc[:, None] * K + cc[None, :]
        a_ok = (cc < K)[:, None] & (cc < K)[None, :]
        a_base = At + (j0 * HV + i_hv) * K * K
        b_base = Bt + (j0 * HV + i_hv) * V * K
        for s in range(0, ns - 1):
            a = tl.load(a_base + a_off, mask=a_ok, other=0.0)  # zeros past K keep S's padding zero
            S = tl.dot(S, a, tl.load(b_base + s_off, mask=mask, other=0.0), input_precision=PREC)
            s_base += HV * V * K
            tl.store(s_base + s_off, S, mask=mask)
            a_base += HV * K * K
            b_base += HV * V * K
    else:
        for c0 in range(0, K, BC):
            cols = c0 + cc
            mask = v_ok[:, None] & (cols < K)[None, :]
            x = _scan_start(h0, final, n, i_hv, vv, cols, mask, ns, s_0n, s_0h, s_0k, s_0v, s_fn, s_fh, s_fk, s_fv,
                            HAS_H0, BV, BC)
            tl.store(S0 + ((j0 * HV + i_hv) * V + vv[:, None]) * K + cols[None, :], x, mask=mask & (ns > 0))
        for s in range(0, ns - 1):
            tl.debug_barrier()
            j = j0 + s
            row_s = (j * HV + i_hv) * V + vv[:, None]
            row_a = (j * HV + i_hv) * K
            for c0 in range(0, K, BC):
                cols = c0 + cc
                mask = v_ok[:, None] & (cols < K)[None, :]
                acc = tl.load(Bt + row_s * K + cols[None, :], mask=mask, other=0.0)
                for r0 in range(0, K, BC):
                    rr = r0 + cc
                    m = tl.load(S0 + row_s * K + rr[None, :], mask=v_ok[:, None] & (rr < K)[None, :], other=0.0)
                    a = tl.load(At + (row_a + rr[:, None]) * K + cols[None, :],
                                mask=(rr < K)[:, None] & (cols < K)[None, :], other=0.0)
                    acc += tl.dot(m, a, input_precision=PREC)
                tl.store(S0 + (row_s + HV * V) * K + cols[None, :], acc, mask=mask)


@length_agnostic(triton.jit)
def _gdn_segment_table_kernel(cu_seqlens, table, seg_first, N, T, CPS, n_seg, BLOCK: tl.constexpr):
    """The varlen plan of the sequence-parallel pass, one program (``_segment_table``): sequence ``n``
    has ``cdiv(its chunks, CPS)`` segments (its end clamped to T, as ``segment_span`` reads it); its
    first row ``seg_first[n]`` is the running count before it, and its segment ``s`` is row
    ``seg_first[n] + s`` of ``table``: ``(n, s * CPS)``. Rows from the total count up to the static
    bound ``n_seg`` hold ``-1``; rows past ``n_seg`` are never written. One launch replaces the dozen
    small torch ops the table took (eager host time, and their kernels in a graph)."""
    carry = tl.zeros([], tl.int64)
    for n0 in range(0, N, BLOCK):
        nn = n0 + tl.arange(0, BLOCK)
        ok = nn < N
        bos = tl.load(cu_seqlens + nn, mask=ok, other=0).to(tl.int64)
        eos = tl.minimum(tl.load(cu_seqlens + nn + 1, mask=ok, other=0).to(tl.int64), T)
        ns = tl.where(ok, tl.cdiv(tl.cdiv(tl.maximum(eos - bos, 0), BT), CPS), 0)
        first = carry + tl.cumsum(ns, 0) - ns
        tl.store(seg_first + nn, first, mask=ok)
        for s in range(0, tl.max(ns, 0)):
            row = first + s
            live = ok & (s < ns) & (row < n_seg)
            tl.store(table + row * 2, nn.to(tl.int32), mask=live)
            tl.store(table + row * 2 + 1, (s * CPS).to(tl.int32), mask=live)
        carry += tl.sum(ns, 0)
    for j0 in range(0, n_seg, BLOCK):
        jj = j0 + tl.arange(0, BLOCK)
        spare = (jj >= carry) & (jj < n_seg)
        tl.store(table + jj * 2, -1, mask=spare)
        tl.store(table + jj * 2 + 1, -1, mask=spare)


@length_agnostic(triton.jit)
def _gdn_fwd_o_kernel(q, k, v_new, h, g_cum, o, cu_seqlens, chunk_indices, scale, T, NT, HV, GROUP, K, V,
                      s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh,
                      s_hb, s_hc, s_hh, s_hk, s_hv, s_ob, s_ot, s_oh,
                      IS_VARLEN: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                      DOT_PREC: tl.constexpr):
    """Chunk outputs from the stored states, in gdn.md §3.5's order (shared with Metal)::

        b_o = q @ h[c];  b_A = q @ k^T        (one loop over K tiles, fp32)
        o = scale (e^G b_o + rnd(select(i >= j, b_A e^(G_i - G_j), 0)) @ v_new)
    """
    i_v, i_hv, i_c = v_tile_head_row(V, BV, HV)
    i_h = i_hv // GROUP
    b, start, eos = chunk_span(i_c, cu_seqlens, chunk_indices, T, NT, IS_VARLEN, BT)
    if IS_VARLEN:
        h_row = i_c.to(tl.int64)
    else:
        h_row = (i_c % NT).to(tl.int64)
    rows = start + tl.arange(0, BT)
    ok = rows < eos
    vv = i_v * BV + tl.arange(0, BV)
    b_o = tl.zeros([BT, BV], tl.float32)
    b_A = tl.zeros([BT, BT], tl.float32)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        qt = load_tile(q, b, rows, ok, i_h, cols, K, s_qb, s_qt, s_qh)
        kt = load_tile(k, b, rows, ok, i_h, cols, K, s_kb, s_kt, s_kh)
        ht = tl.load(h + b * s_hb + h_row * s_hc + i_hv * s_hh + cols[:, None] * s_hk + vv[None, :] * s_hv,
                     mask=(cols < K)[:, None] & (vv < V)[None, :], other=0.0)
        b_o += tl.dot(qt, ht, input_precision=DOT_PREC)
        b_A += tl.dot(qt, tl.trans(kt), input_precision=DOT_PREC)
    G2 = load_rows(g_cum, b, rows, ok, i_hv, s_gb, s_gt, s_gh) * LOG2E
    b_o *= tl.exp2(G2)[:, None]
    b_A = gate_causal(b_A, G2, G2, ok, ok, rows, rows, False)
    vn = load_tile(v_new, b, rows, ok, i_hv, vv, V, s_vb, s_vt, s_vh)
    b_o += tl.dot(b_A.to(vn.dtype), vn, input_precision=DOT_PREC)
    store_tile(o, b_o * scale, b, rows, ok, i_hv, vv, V, s_ob, s_ot, s_oh)


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


# ---------------------------------------------------------------------------------- launchers
def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, next_pow2(n))


def _s3(x: torch.Tensor) -> tuple[int, int, int]:
    """(batch, token, head) strides of a head-last ``[B, T, H, ...]`` tensor."""
    return x.stride()[:3]  # one call, not three: launchers take ~30 of these per gdn_chunk


def _dot_prec(dtype: torch.dtype) -> str:
    # fp32 inputs are compared at 0.005 against an fp32 reference: no tf32 anywhere (gdn.md §3.8)
    return "ieee" if dtype == torch.float32 else "tf32"


def _solve_precision(dtype: torch.dtype) -> dict[str, str]:
    """Products of the 64x64 solve (gdn.md §3.2), all fp32 x fp32. For 16-bit inputs both the diagonal
    16x16 inverses and the block merges run as ``"bf16x3"``: each fp32 operand split into two bf16
    parts, three tensor-core products (the lo x lo term dropped), ~2^-16 relative per product, so the
    inverse series' large cancelling terms keep their accuracy without the CUDA-core ``"ieee"`` path,
    whose operands go through shared memory (704 shared loads per program at one warp, sm_90 PTX);
    faster than ieee at the same or lower error (gdn.md §6.3). fp32 inputs keep full fp32 (no
    tensor-core rounding anywhere for them, gdn.md §3.8). The Triton interpreter accepts only
    ieee/tf32/tf32x3 (and computes every product in full precision): it gets ``"tf32x3"``."""
    p = "ieee" if dtype == torch.float32 else "tf32x3" if interpreting() else "bf16x3"
    return {"INV_PREC": p, "MERGE_PREC": p}


def _varlen_plan(T: int, B: int, cu_seqlens, chunk_indices):
    """``(chunk_indices or None, NT per sequence (fixed), NT_total)``.

    Eager varlen calls without chunk_indices build it here (one host sync, as the reference);
    CUDA-graph capture and compiled graphs should pass it.
    """
    NT = cdiv(T, CHUNK)
    if cu_seqlens is None:
        return None, NT, B * NT
    if chunk_indices is None:
        from ...reference.gdn import chunk_indices_from_cu_seqlens

        chunk_indices = chunk_indices_from_cu_seqlens(cu_seqlens)
    return chunk_indices.contiguous(), NT, chunk_indices.shape[0]


def _chunk_offsets(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Row of ``h`` of each sequence's first chunk: exclusive cumsum of ``ceil(len / 64)`` (device ops)."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64).clamp_min(0)
    n_chunks = (lens + CHUNK - 1) // CHUNK
    return torch.cumsum(n_chunks, 0) - n_chunks


def _state_strides(s: torch.Tensor | None, state_v_first: bool) -> tuple[int, int, int, int]:
    """(sequence, head, k, v) strides of a state tensor in either layout (zeros for None)."""
    if s is None:
        return 0, 0, 0, 0
    a, b, c, d = s.stride()
    return (a, b, d, c) if state_v_first else (a, b, c, d)


def _dummy(t: torch.Tensor) -> torch.Tensor:
    return t  # the Gluon pass's absent tensors: any valid pointer, its constexpr flags keep it unread


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


# BV is part of the config and the key says whether the BV = 32 programs fit in one wave: a chunk step
# costs nearly the same at either width (the chain is latency, not FLOPs), so halving BV pays only
# where it fills idle SMs (gdn.md §6.3). The last config (pointer loads, one stage) is the fallback
# that fits wherever the copies' stages do not.
_STATE_PASS = Tuner("gdn_state_pass", [
    Config({"BV": 64}, num_warps=4, num_stages=3), Config({"BV": 32}, num_warps=4, num_stages=3),
    Config({"BV": 64}, num_warps=4, num_stages=2), Config({"BV": 32}, num_warps=8, num_stages=2),
    Config({"BV": 16}, num_warps=4, num_stages=2), Config({"BV": 32, "TMA": False}, num_warps=4, num_stages=1),
])
# With the Hopper pass eligible (``_hopper_pass_ready``) its two depths come first, so untuned runs (and
# the GPU tests, TORCH_AURA_TUNE=0) take it; the Triton configs stay in the list and win where faster.
_STATE_PASS_SM90 = Tuner("gdn_state_pass_sm90", [
    Config({"SM90": True, "BV": 64}, num_warps=4, num_stages=3), Config({"SM90": True, "BV": 64}, num_warps=4, num_stages=2),
    *_STATE_PASS.configs,
])
# The overlapped pass (``_overlap_pass``) is not tuned: timing it alone would not measure it beside w/u.
_OVERLAP_PASS = _STATE_PASS_SM90.configs[0]
# Shared memory the TMA copies of one pipeline stage may take (w, k, u and, for o, q and A_qk): two
# stages must fit beside the rest (fp32 at K = V = 128 would need 256 KB; 16-bit at K = 256, 230 KB).
_TMA_STAGE_BYTES = 100 * 1024


def _tma_ready(*xs: torch.Tensor) -> bool:
    """Whether ``chunk_rows`` may copy these ``[B, T, H, C]`` tensors with TMA: a Hopper-class GPU (or
    the interpreter, which emulates the copies), 16-byte aligned base and strides, unit last stride."""
    dev = xs[0].device
    if not (has_tma(dev) if dev.type == "cuda" else interpreting()):
        return False
    for x in xs:  # plain loops: this runs several times per eager call
        st, es = x.stride(), x.element_size()
        if st[-1] != 1 or x.data_ptr() % 16 or not x.numel():
            return False
        for s in st[:-1]:
            if s * es % 16:
                return False
    return True


def _pass_copies_tiles(k, w, u, q=None, a_qk=None) -> bool:
    """Whether the state pass takes its TMA path: the tiles are copyable (``_tma_ready``) and two
    pipeline stages of them fit (``_TMA_STAGE_BYTES``); q and A_qk only with the output (gdn_chunk)."""
    K, V = k.shape[3], u.shape[3]
    with_o = q is not None
    tiles = (w, k, u, q, a_qk) if with_o else (w, k, u)
    stage_bytes = CHUNK * (2 * _pow2(K) + min(64, _pow2(V)) + (_pow2(K) + CHUNK if with_o else 0)) * w.element_size()
    return stage_bytes <= _TMA_STAGE_BYTES and _tma_ready(*tiles)


def _hopper_pass():
    """``state_pass_sm90.gdn_state_pass_sm90_kernel``, or None where Gluon (experimental in Triton) is
    missing or does not build it."""
    global _HOPPER_PASS
    if _HOPPER_PASS is None:
        try:
            from .state_pass_sm90 import gdn_state_pass_sm90_kernel
            _HOPPER_PASS = gdn_state_pass_sm90_kernel
        except Exception:  # noqa: BLE001 - any import failure of the experimental dialect disables the path
            _HOPPER_PASS = False
    return _HOPPER_PASS or None


_HOPPER_PASS = None


def _hopper_pass_ready(k, tma_ready: bool, with_o: bool) -> bool:
    """Whether gdn_chunk's pass may run the Gluon kernel of ``state_pass_sm90``: an sm_90 GPU (warpgroup
    MMA exists there only), 16-bit inputs, K in {64, 128}, copyable tiles, and Gluon importable."""
    if not (with_o and tma_ready and k.device.type == "cuda" and not interpreting()):
        return False
    return (cuda_capability(k.device)[0] == 9 and k.dtype in (torch.float16, torch.bfloat16)
            and k.shape[3] in (64, 128) and _hopper_pass() is not None)


def _w_u_tma(fixed_length: bool, *tiles: torch.Tensor) -> bool:
    """Whether the w/u kernel copies its tiles through host descriptors: fixed length only, since a
    descriptor over ``[B, T, H, C]`` zero-fills and clips at T, which is a varlen sequence's end only
    for the last sequence (its full-box stores would overwrite the next sequence's rows)."""
    return fixed_length and _tma_ready(*tiles)


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


def _state_pass(k, w, u, g_cum, initial_state, cu_seqlens, ci, NT, NT_total, state_v_first,
                h=None, v_new=None, q=None, a_qk=None, o=None, scale=1.0, ready=None, w_u=None, cps=0):
    """Launch ``_gdn_state_pass_kernel``: fwd_h (``h`` and ``v_new`` given) or gdn_chunk's outputs
    (``o``, from q and ``_chunk_prep``'s ``a_qk``). With ``ready`` and ``w_u`` (``_overlap_pass``): the
    Hopper kernel in its fixed config, on the side stream beside the w/u launch ``w_u()``, waiting for
    its per-chunk flags. With ``cps`` (``_segment_plan``): the sequence-parallel pass, segments of
    ``cps`` chunks (``_segment_starts``, then this pass once per segment)."""
    B, T, H, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    sd = (V, K) if state_v_first else (K, V)
    final = torch.empty((N, HV, *sd), dtype=torch.float32, device=k.device)
    if N == 0 or HV == 0:
        return final
    BK = _pow2(K)
    with_o = o is not None
    first = _chunk_offsets(cu_seqlens) if cu_seqlens is not None else None
    hs = (h.stride(1), h.stride(2), *((h.stride(4), h.stride(3)) if state_v_first else (h.stride(3), h.stride(4)))) \
        if h is not None else (0, 0, 0, 0)
    out_rows = o if with_o else v_new  # o and v_new share the [B, T, HV, V] layout
    segmented = cps > 0 and ready is None
    if segmented:
        S0, seg_table, NS, rows = _segment_starts(k, w, u, g_cum, initial_state, cu_seqlens, NT, NT_total, final,
                                                  state_v_first, cps)
        if rows == 0:  # no chunks at all: the scan wrote every final state
            return final
        h0, h0_strides = S0, _state_strides(S0, True)  # S0 is [segment, HV, V, K]
    else:
        seg_table, NS, rows = None, 0, N
        h0, h0_strides = initial_state, _state_strides(initial_state, state_v_first)
    # state_v_first permutes the state strides passed as ints (a 1 among them is specialised)
    facts = (H, HV, K, V, state_v_first, *map(tensor_key, (k, w, u, g_cum, h0, h, out_rows, q, a_qk, cu_seqlens)))

    def run_pass(cfg: Config):
        if cfg.kwargs.get("SM90"):
            return launch(
                _hopper_pass(), (cdiv(V, 64) * rows * HV,), facts,
                k, w, u, g_cum, _dummy(k) if h0 is None else h0, o, final, q, a_qk,
                _dummy(k) if cu_seqlens is None else cu_seqlens, _dummy(k) if ready is None else ready,
                _dummy(k) if first is None else first, _dummy(k) if seg_table is None else seg_table,
                scale, T, NT, NS, cps, HV, HV // H, K, V,
                *_s3(k), *_s3(w), *_s3(u), *_s3(o), *_s3(g_cum),
                *h0_strides, *_state_strides(final, state_v_first),
                *_s3(a_qk), *_s3(q), IS_VARLEN=cu_seqlens is not None, HAS_H0=h0 is not None,
                BK=K, BV=64, STAGES=cfg.num_stages, WAIT=ready is not None, SEGMENTED=segmented, num_warps=4)
        BV = min(cfg.kwargs["BV"], _pow2(V))
        tma = tma_ready and cfg.kwargs.get("TMA", True)
        launch(
            _gdn_state_pass_kernel, (cdiv(V, BV) * rows * HV,), facts,
            k, w, u, g_cum, h0, h, out_rows, final, q, a_qk, cu_seqlens, first, seg_table, scale,
            T, NT, NT_total, NS, cps, HV, HV // H, K, V,
            *_s3(k), *_s3(w), *_s3(u), *_s3(out_rows), *_s3(g_cum),
            *h0_strides, *hs, *_state_strides(final, state_v_first),
            *(_s3(a_qk) if with_o else (0, 0, 0)), *(_s3(q) if with_o else (0, 0, 0)),
            IS_VARLEN=cu_seqlens is not None, HAS_H0=h0 is not None, STORE_H=h is not None,
            WITH_O=with_o, TMA=tma, BK=BK, BV=BV, DOT_PREC=_dot_prec(k.dtype), SEGMENTED=segmented,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)

    if ready is not None:  # _overlap_pass has checked the Hopper kernel's eligibility; it reads no tma_ready
        with descriptor_workspace(k.device), _beside(k.device, w_u):
            run_pass(_OVERLAP_PASS)
        return final
    tma_ready = _pass_copies_tiles(k, w, u, q, a_qk)
    hopper = _hopper_pass_ready(k, tma_ready, with_o)
    one_wave_at_32 = rows * HV * cdiv(V, 32) <= sm_count(k.device)
    key = (K, V, k.dtype, cu_seqlens is not None, state_v_first, with_o, h0 is not None, tma_ready,
           one_wave_at_32, segmented)
    with descriptor_workspace(k.device):
        (_STATE_PASS_SM90 if hopper else _STATE_PASS)(key, run_pass, k.device)
    return final


# ------------------------------------------------------------------ the sequence-parallel pass
# Segments shorter than this many chunks spend more on their summary (two chains: B and A) and the
# scan than they save; fewer segments than _SEG_MIN_COUNT per sequence save little (the pass's
# latency is about 2 / count of the serial chain's, plus the scan).
_SEG_MIN_CHUNKS = 8
_SEG_MIN_COUNT = 4


def _segment_plan(device: torch.device, N: int, HV: int, V: int, NT: int, NT_total: int, varlen: bool) -> int:
    """Chunks per segment for the sequence-parallel pass, or 0 for the serial pass (gdn.md §6).

    The serial pass has one program per (64-wide V tile, value head, sequence), each a latency-bound
    chain over all of its sequence's chunks: with few heads and sequences (tensor-parallel shards)
    most SMs idle. Split each sequence into segments of ``cps`` chunks so that the per-segment pass
    fills about one wave of SMs. Only static facts decide (SM count, N, heads, V, the chunk count of
    the shapes: ``NT`` per sequence, or the total ``NT_total``, chunk_indices' length, for varlen), so
    the plan is the same in eager calls and CUDA-graph replays and needs no host sync. Varlen sizes the
    segments as if one sequence held every chunk and reserves one partial segment per sequence, so the
    segment count is bounded by ``cdiv(NT_total, cps) + N`` whatever the lengths are; it splits only
    where the spare slots give at least one segment per sequence. Shapes that already fill the GPU
    get 0: the serial path, unchanged.
    """
    if device.type != "cuda" or N == 0 or HV == 0:
        return 0
    slots = sm_count(device) // (HV * cdiv(V, 64))  # segments whose pass programs fit in one wave
    segs, chunks = (slots - N, NT_total) if varlen else (slots // N, NT)
    segs = min(segs, chunks // _SEG_MIN_CHUNKS)
    # varlen: fewer split segments than sequences lost to the serial pass (gdn.md §6)
    enough = segs >= _SEG_MIN_COUNT and (not varlen or segs >= N)
    return cdiv(chunks, segs) if enough else 0


def _segment_table(cu_seqlens: torch.Tensor, T: int, cps: int, n_seg: int):
    """Varlen segment bookkeeping in one launch (``_gdn_segment_table_kernel``; no host sync):
    ``seg_table [n_seg, 2]`` int32 rows ``(sequence, first chunk)`` in sequence order, ``-1`` rows past
    the real count (``n_seg`` is a static bound), and ``seg_first [N]``, each sequence's first row."""
    N = cu_seqlens.shape[0] - 1
    table = torch.empty((max(n_seg, 1), 2), dtype=torch.int32, device=cu_seqlens.device)
    seg_first = torch.empty(max(N, 1), dtype=torch.int64, device=cu_seqlens.device)
    launch(_gdn_segment_table_kernel, (1,), (tensor_key(cu_seqlens),), cu_seqlens, table, seg_first, N, T, cps, n_seg,
           BLOCK=1024, num_warps=4)
    return table[:n_seg], seg_first[:N]


# A program carries two fp32 [BV, K] chains (B and A), latency-bound like the pass's: 8 warps hold both at
# BV = 64 (ptxas, sm_90, bf16: 32 B of spill; 4 warps ~1 KB); narrower tiles give more programs where one
# wave is not full; the last config (pointer loads) fits where two copy stages do not.
_SEG_SUMMARY = Tuner("gdn_segment_summary", [
    Config({"BV": 64}, num_warps=8, num_stages=2), Config({"BV": 32}, num_warps=4, num_stages=2),
    Config({"BV": 64}, num_warps=8, num_stages=3), Config({"BV": 32, "TMA": False}, num_warps=4, num_stages=1),
])


def _scan_in_regs(K: int, dtype: torch.dtype) -> bool:
    """Whether the segment scan keeps its state in registers (``IN_REGS``): 16-bit inputs (tf32x3
    products) at K <= 128. Sized from ptxas's report for sm_90: at BV = 16 and 8 warps (warps split
    along A's 128 columns, 16 each) the three tf32 products' operands fit in 255 registers with ~100 B
    of spill and A's fp32 tile (64 KiB) plus its prefetched successor in shared memory; 4 warps spill
    kilobytes, and so does the fp32 (``ieee``, CUDA-core) product at any width, whose operands all sit
    in registers: fp32 inputs and K > 128 keep the column-block path."""
    return _pow2(K) <= 128 and dtype != torch.float32


def _transfer_prec(dtype: torch.dtype) -> str:
    # A is fp32 (gdn.md §6). On the summary's chain bf16 inputs split it in two bf16 parts (``_split_dot``,
    # ~16 mantissa bits against the 7 of the pass's bf16 state operand); fp16 inputs multiply it in tf32
    # (10 bits; an fp16 part could overflow where A's entries grow), fp32 inputs in full fp32. The scan
    # multiplies in tf32x3 (~fp32) for either 16-bit dtype.
    return {torch.float32: "ieee", torch.bfloat16: "bf16x2"}.get(dtype, "tf32")


def _segment_starts(k, w, u, g_cum, initial_state, cu_seqlens, NT, NT_total, final, state_v_first, cps):
    """Summary and scan of the sequence-parallel pass: per segment its zero-start end state B and
    transfer matrix A (``_gdn_segment_summary_kernel``, all segments in parallel), then per sequence
    the start state of each segment (``_gdn_segment_scan_kernel``), which also writes the final
    state of sequences without chunks. Returns ``(S0, seg_table, NS, n_seg)``: the start states
    ``[n_seg, HV, V, K]`` fp32, the varlen table (``_segment_table``), segments per sequence (fixed
    length) and the segment count (the pass's grid rows)."""
    B, T, H, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    dev = k.device
    varlen = cu_seqlens is not None
    N = final.shape[0]
    if varlen:
        NS, n_seg = 0, min(NT_total, cdiv(NT_total, cps) + N)
        seg_table, seg_first = _segment_table(cu_seqlens, T, cps, n_seg)
    else:
        NS = cdiv(NT, cps)
        n_seg = N * NS
        seg_table = seg_first = None
    rows = max(n_seg, 1)  # valid pointers without segments (the scan then only writes final states)
    At = torch.empty((rows, HV, K, K), dtype=torch.float32, device=dev)
    Bt = torch.empty((rows, HV, V, K), dtype=torch.float32, device=dev)
    S0 = torch.empty_like(Bt)
    cu = cu_seqlens
    facts = (H, HV, K, V, state_v_first, *map(tensor_key, (k, w, u, g_cum, initial_state, cu_seqlens)))
    if n_seg:
        tma_ready = _pass_copies_tiles(k, w, u)

        def summary(cfg: Config):
            BV = min(cfg.kwargs["BV"], _pow2(V))
            launch(
                _gdn_segment_summary_kernel, (cdiv(max(V, K), BV) * HV * n_seg,), facts,
                k, w, u, g_cum, At, Bt, seg_table, cu, T, NT, NS, cps, HV, HV // H, K, V,
                *_s3(k), *_s3(w), *_s3(u), *_s3(g_cum), IS_VARLEN=varlen,
                TMA=tma_ready and cfg.kwargs.get("TMA", True), BK=_pow2(K), BV=BV, DOT_PREC=_dot_prec(k.dtype),
                TRANSFER_PREC=_transfer_prec(k.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages)

        with descriptor_workspace(dev):
            _SEG_SUMMARY((K, V, k.dtype, varlen, tma_ready), summary, dev)
    # 16-bit inputs at K <= 128: the state in registers (_scan_in_regs); else 64-wide column blocks
    in_regs = _scan_in_regs(K, k.dtype)
    BV = min(16 if in_regs else 32, _pow2(V))
    launch(
        _gdn_segment_scan_kernel, (cdiv(V, BV) * N * HV,), facts,
        initial_state, At, Bt, S0, final, cu, seg_first,
        T, NS, cps, HV, K, V, *_state_strides(initial_state, state_v_first), *_state_strides(final, state_v_first),
        IS_VARLEN=varlen, HAS_H0=initial_state is not None, BV=BV, BC=_pow2(K) if in_regs else min(64, _pow2(K)),
        PREC="ieee" if k.dtype == torch.float32 else "tf32x3", IN_REGS=in_regs, num_warps=8 if in_regs else 4,
        **({"num_stages": 2} if in_regs else {}))  # the column-block path keeps Triton's default, as measured
    return S0, seg_table, NS, n_seg


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream the overlapped pass runs on, one per device, at the highest priority: in a replayed
    CUDA graph too (PyTorch instantiates graphs with per-node priorities), so the block scheduler places
    the pass's CTAs as soon as SMs free up instead of after every queued w/u CTA."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SIDE_STREAMS:
        _SIDE_STREAMS[idx] = torch.cuda.Stream(device=idx, priority=-100)  # clamped to the highest
    return _SIDE_STREAMS[idx]


@contextlib.contextmanager
def _beside(device: torch.device, first):
    """Launches in the block run on the side stream beside ``first()``, launched on the caller's stream
    after everything already queued there (every buffer the block reads, allocated and initialised on
    the caller's stream, which then waits for the side stream). ``first`` goes first so that a failing
    launch of it never leaves the block's kernels waiting for it."""
    main, side = torch.cuda.current_stream(device), _side_stream(device)
    side.wait_stream(main)
    first()
    with torch.cuda.stream(side):
        yield
    main.wait_stream(side)


def _overlap_pass(k, q, w, u, a_qk, cu_seqlens) -> bool:
    """Whether gdn_chunk runs its Hopper state pass beside the w/u kernel instead of after it.

    The pass of few sequences has one program per (64-wide V tile, value head, sequence) (64 at 1x32k,
    16/32 heads), each one SM's latency-bound chain, so half of an H100 idles through it while w/u,
    bound by memory, ran before it on all SMs. Overlapped, the pass starts on chunk 0 as soon as its
    w, u and A_qk are published (a flag per chunk and value head) and w/u's CTAs fill the other SMs.
    Spinning CTAs cannot starve the producer only while every pass program is resident with SMs to
    spare; w/u itself never waits, so any launch order completes. It pays only while w/u keeps most
    SMs, hence the bound of half of them: with more pass programs w/u starves on the SMs left over
    (gdn.md §6.3).
    ``TORCH_AURA_GDN_OVERLAP=0`` turns it off (the serial order is kept for every other shape). So does
    an MPS client limited to part of the GPU (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` below 100): the
    device still reports all its SMs, and spinning pass CTAs could then hold every SM the client gets."""
    if not _env.get("TORCH_AURA_GDN_OVERLAP"):
        return False
    if _env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") < 100:
        return False
    if not _hopper_pass_ready(k, _pass_copies_tiles(k, w, u, q, a_qk), True):
        return False
    N = k.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    HV, V = u.shape[2], u.shape[3]
    return cdiv(V, 64) * N * HV <= sm_count(k.device) // 2


def gdn_fwd_h(k, w, u, g_cum, initial_state=None, cu_seqlens=None, chunk_indices=None, state_v_first=False):
    _checks.gdn_fwd_h(k, w, u, g_cum, initial_state, cu_seqlens, chunk_indices, state_v_first)
    B, T, H, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    ci, NT, NT_total = _varlen_plan(T, B, cu_seqlens, chunk_indices)
    sd = (V, K) if state_v_first else (K, V)
    h = torch.empty((B, NT if cu_seqlens is None else NT_total, HV, *sd), dtype=k.dtype,
                    device=k.device)
    v_new = torch.empty((B, T, HV, V), dtype=u.dtype, device=k.device)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    cps = _segment_plan(k.device, N, HV, V, NT, NT_total, cu_seqlens is not None)
    final = _state_pass(k, w, u, g_cum, initial_state, cu_seqlens, ci, NT, NT_total, state_v_first,
                        h=h, v_new=v_new, cps=cps)
    return h, v_new, final


def gdn_fwd_o(q, k, v_new, h, g_cum, scale=None, cu_seqlens=None, chunk_indices=None, state_v_first=False):
    _checks.gdn_fwd_o(q, k, v_new, h, g_cum, scale, cu_seqlens, chunk_indices, state_v_first)
    B, T, H, K = q.shape
    HV, V = v_new.shape[2], v_new.shape[3]
    ci, NT, NT_total = _varlen_plan(T, B, cu_seqlens, chunk_indices)
    if cu_seqlens is not None and h.shape[1] != NT_total:
        raise ValueError(f"h: expected {NT_total} chunk states (h.shape[1], the chunks of cu_seqlens), "
                         f"got {h.shape[1]}")
    o = torch.empty((B, T, HV, V), dtype=q.dtype, device=q.device)
    if NT_total == 0:
        return o
    BV = min(64, _pow2(V))
    hs = (h.stride(0), h.stride(1), h.stride(2),
          *((h.stride(4), h.stride(3)) if state_v_first else (h.stride(3), h.stride(4))))
    launch(
        _gdn_fwd_o_kernel, (cdiv(V, BV) * NT_total * HV,),
        (H, HV, K, V, state_v_first, *map(tensor_key, (q, k, v_new, h, g_cum, o, cu_seqlens, ci))),
        q, k, v_new, h, g_cum, o, cu_seqlens, ci, float(K ** -0.5 if scale is None else scale), T, NT, HV, HV // H,
        K, V, *_s3(q), *_s3(k), *_s3(v_new), *_s3(g_cum), *hs, *_s3(o),
        IS_VARLEN=cu_seqlens is not None, BK=min(64, _pow2(K)), BV=BV, DOT_PREC=_dot_prec(q.dtype), num_warps=4)
    return o


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


# The solve is latency-bound on its chain of small 16x16 products: one warp per program keeps the most
# programs per SM for 16-bit inputs, two lead for fp32 (the tuner finds it). w/u is bound by its loads
# and stores: 4 warps, 3 stages (gdn.md §6.3).
_SOLVE = Tuner("gdn_chunk_solve", [Config(num_warps=1, num_stages=2), Config(num_warps=2, num_stages=2),
                                   Config(num_warps=2, num_stages=1), Config(num_warps=4, num_stages=2)])
_W_U = Tuner("gdn_chunk_w_u", [Config(num_warps=4, num_stages=3), Config(num_warps=4, num_stages=2),
                               Config(num_warps=4, num_stages=1), Config(num_warps=2, num_stages=2)])


# The prep kernels' parallelism bucket: a config tuned on a small grid is not the best on a large one
# (gdn.md §6.3). Two values: at most two tunings per head configuration and layout, whatever the lengths.
MANY_CHUNKS_PER_SM = 16


def many_chunks(NT_total: int, HV: int, device: torch.device) -> bool:
    """The bucket of the prep kernels' tuning key: ``NT_total * HV`` programs fill the GPU 16 times."""
    return NT_total * HV >= MANY_CHUNKS_PER_SM * sm_count(device)


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
    publish = overlap and NT_total > 0 and _overlap_pass(k, q, w, u, a_qk, cu_seqlens)
    ready = torch.zeros(NT_total * HV, dtype=torch.int32, device=dev) if publish else None
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


def gdn_chunk(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, chunk_indices=None,
              use_qk_l2norm=False, state_v_first=False):
    """Three kernels (plus the optional L2 norm): cumsum + kkt + solve, w/u with the output operand
    A_qk, then the sequential pass that emits o and the final state (beside w/u where
    ``_overlap_pass`` allows). Where ``_segment_plan`` splits the sequences (few heads and sequences),
    the pass is three kernels instead: segment summaries, the scan over segments, the per-segment pass.
    The per-chunk states h and v_new of the stage ops are never materialised."""
    _check_chunk(q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_indices, use_qk_l2norm,
                      state_v_first)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = float(K ** -0.5 if scale is None else scale)
    if use_qk_l2norm:
        q, k = _l2norm(q, k)
    ci, NT, NT_total = _varlen_plan(T, B, cu_seqlens, chunk_indices)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    cps = _segment_plan(k.device, N, HV, V, NT, NT_total, cu_seqlens is not None)
    p = _chunk_prep(q, k, v, g, beta, cu_seqlens, ci, NT, NT_total, overlap=cps == 0)
    o = torch.empty((B, T, HV, V), dtype=q.dtype, device=q.device)
    final = _state_pass(k, p.w, p.u, p.g_cum, initial_state, cu_seqlens, ci, NT, NT_total, state_v_first,
                        q=q, a_qk=p.a_qk, o=o, scale=scale, ready=p.ready, w_u=p.launch_w_u, cps=cps)
    return o, final
