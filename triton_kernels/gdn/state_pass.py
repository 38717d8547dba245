"""The sequential state pass of GDN's chunked forward (gdn.md §3.4-3.5) and its output: the Triton
pass (``gdn_fwd_h``'s states, or gdn_chunk's ``o`` directly), its Hopper twin from ``state_pass_sm90``
run after or beside the w/u kernel (``_overlap_pass``), the sequence-parallel variant's last step
(segments from ``segments``), and ``gdn_fwd_o``.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from ... import _env
from ..._checks import gdn as _checks
from .._launch import launch, tensor_key
from .._tune import Config, Tuner, cdiv, cuda_capability
from . import _common, plan, segments
from ._common import _dot_prec, _pass_copies_tiles, _pow2, _s3, _state_strides, _varlen_plan
from ._jit import (BT, CHUNK, LOG2E, _chain_operands, chunk_rows, chunk_span, gate_causal, length_agnostic,
                   load_rows, load_tile, rows_desc, segment_span, seq_span, store_tile, store_tile_t,
                   v_tile_head_row)


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


# ---------------------------------------------------------------------------------- launchers
def _chunk_offsets(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Row of ``h`` of each sequence's first chunk: exclusive cumsum of ``ceil(len / 64)`` (device ops)."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64).clamp_min(0)
    n_chunks = (lens + CHUNK - 1) // CHUNK
    return torch.cumsum(n_chunks, 0) - n_chunks


def _dummy(t: torch.Tensor) -> torch.Tensor:
    return t  # the Gluon pass's absent tensors: any valid pointer, its constexpr flags keep it unread


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
plan.TUNERS += [_STATE_PASS, _STATE_PASS_SM90]
# The overlapped pass (``_overlap_pass``) is not tuned: timing it alone would not measure it beside w/u.
_OVERLAP_PASS = _STATE_PASS_SM90.configs[0]


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
    if not (with_o and tma_ready and k.device.type == "cuda" and not _common.interpreting()):
        return False
    return (cuda_capability(k.device)[0] == 9 and k.dtype in (torch.float16, torch.bfloat16)
            and k.shape[3] in (64, 128) and _hopper_pass() is not None)


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
    if first is not None:
        plan.note_computed(first, _chunk_offsets, cu_seqlens)
    hs = (h.stride(1), h.stride(2), *((h.stride(4), h.stride(3)) if state_v_first else (h.stride(3), h.stride(4)))) \
        if h is not None else (0, 0, 0, 0)
    out_rows = o if with_o else v_new  # o and v_new share the [B, T, HV, V] layout
    segmented = cps > 0 and ready is None
    if segmented:
        S0, seg_table, NS, rows = segments._segment_starts(k, w, u, g_cum, initial_state, cu_seqlens, NT, NT_total, final,
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
        with _common.descriptor_workspace(k.device), _beside(k.device, w_u):
            run_pass(_OVERLAP_PASS)
        return final
    tma_ready = _pass_copies_tiles(k, w, u, q, a_qk)
    hopper = _hopper_pass_ready(k, tma_ready, with_o)
    one_wave_at_32 = rows * HV * cdiv(V, 32) <= _common.sm_count(k.device)
    key = (K, V, k.dtype, cu_seqlens is not None, state_v_first, with_o, h0 is not None, tma_ready,
           one_wave_at_32, segmented)
    with _common.descriptor_workspace(k.device):
        (_STATE_PASS_SM90 if hopper else _STATE_PASS)(key, run_pass, k.device)
    return final


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream the overlapped pass runs on, one per device, at the highest priority: in a replayed
    CUDA graph too (PyTorch instantiates graphs with per-node priorities), so the block scheduler places
    the pass's CTAs as soon as SMs free up instead of after every queued w/u CTA."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SIDE_STREAMS:
        _SIDE_STREAMS[idx] = torch.cuda.Stream(device=idx, priority=-100)  # clamped to the highest
    return _SIDE_STREAMS[idx]


plan.side_stream = _side_stream


@contextlib.contextmanager
def _beside(device: torch.device, first):
    """Launches in the block run on the side stream beside ``first()``, launched on the caller's stream
    after everything already queued there (every buffer the block reads, allocated and initialised on
    the caller's stream, which then waits for the side stream). ``first`` goes first so that a failing
    launch of it never leaves the block's kernels waiting for it."""
    main, side = torch.cuda.current_stream(device), _side_stream(device)
    plan.note_event("wait")  # a plan replays these steps (plan._Plan._event)
    side.wait_stream(main)
    first()
    plan.note_event("enter")
    with torch.cuda.stream(side):
        yield
    plan.note_event("exit")
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
    return cdiv(V, 64) * N * HV <= _common.sm_count(k.device) // 2


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
    cps = segments._segment_plan(k.device, N, HV, V, NT, NT_total, cu_seqlens is not None)
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
