"""The GDN front end in Triton: the depthwise causal conv over time, prefill and decode (ops.md §3b).

``y[t, c] = act(bias[c] + sum_j w[c, j] * x[t - (W - 1) + j, c])`` in fp32 (taps oldest first), rounded
once to x's dtype; the ``W - 1`` inputs before a sequence's first token are the last entries of its
state row (zeros without a state). Inputs are token-major ``[..., C]``, so every load is a vector
along the contiguous channels. State entries are ``s_ss`` apart: 1 in a ``[rows, C, S]`` pool, C in vLLM's
``[rows, S, C]`` pool seen through a transpose, which the kernels read and roll in place.

* ``_causal_conv1d_kernel``: one program per (block of BT tokens, block of BC channels). Each tap is
  a shifted ``[BT, BC]`` load of x: the rows the taps share are re-read from L1, not from memory.
  Packed (varlen) rows find their sequence by a binary search of ``cu_seqlens``, so a block may span
  sequences and the launch needs nothing from the host (no sync; graph-safe).
* ``_causal_conv1d_window_kernel`` (W <= 4, chosen by ``PREFILL_KERNEL``): the same outputs, one program per
  (block of BT tokens, block of BC channels) walking its tokens one at a time with the last three inputs in
  registers, so each input is loaded once; a sequence starting inside the block reads its context from its
  state row. The program's first token finds its sequence by the same binary search (no host metadata).
* ``_conv_state_kernel``: then, per (sequence, channel block), the state row becomes the last ``S``
  entries of ``[old row | the sequence's inputs]``. A second launch on the same stream, because
  whichever conv program holds a sequence's first rows reads the old row, at no fixed time.
* ``_causal_conv1d_update_kernel``: a decode step, per (sequence, channel block): its L outputs from
  the pool row and the new tokens, then the row rolled in place.

A sequence's state row is ``pool_row``'s: row n of the state, or, in the prefill launcher's pool form and
the decode step, the row its index names in a serving engine's pool (-1 and the engine's null slot skip). A
program that rewrites a state row reads every entry it moves before it stores any (``_roll_state``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._checks import gdn as _checks
from ..._checks.common import remembered_check
from .._launch import launch, tensor_key
from .._tune import cdiv, next_pow2
from ._jit import length_agnostic, pool_row, seq_span
from .recurrent import debug_check_pool_rows

_check_conv = remembered_check(_checks.causal_conv1d)  # eager calls repeat their metadata: check it once
_check_update = remembered_check(_checks.causal_conv1d_update)
_check_pool = remembered_check(_checks.causal_conv1d_pool)

# Fixed tiles, not tuned: a memory-bound stream whose tile only sets the vector width along C and the
# share of re-read halo rows ((W - 1) / BT); the [channels, S] kernels move a few values per channel.
CONV_BT, CONV_BC, ROW_BC = 32, 128, 64
# The prefill conv's kernel, "taps" or "window" (W <= 4; wider convs take "taps"): window loads each input once,
# and bench_vllm_gdn_ops.py --conv-kernels timed it faster on the H200 (docs/gdn.md §6.1)
PREFILL_KERNEL = "window"
# The window kernel's tokens, channels and warps per program, and the decode step's channels and warps: the
# fastest that bench_vllm_gdn_ops.py --conv-kernels / --conv-update-blocks timed on the H200 (docs/gdn.md §6.1)
WINDOW_BT, WINDOW_BC, WINDOW_WARPS = 32, 256, 2
UPDATE_BC, UPDATE_WARPS = 256, 4


# ------------------------------------------------------------------------------ device helpers
@triton.jit
def _conv(x_first, state_row, state_ok, p0, context, s_t, S, s_ss, weight, bias, cols, c_ok, ok, s_wc,
          W: tl.constexpr, SILU: tl.constexpr):
    """The outputs whose oldest tap is input ``p0`` of their sequence (shaped like ``ok``: ``[BT, BC]`` or
    ``[BC]``): ``act(bias + sum_j w[:, j] * input[p0 + j])``, fp32. Input ``p >= 0`` is token p
    (``x_first + p * s_t``), input ``p < 0`` (``>= -(W - 1) >= -S``) entry ``S + p`` of the state row
    (``state_row + (S + p) * s_ss``; zeros when ``state_row`` is None or where ``state_ok``, broadcast like
    ``ok``, is false), read only where ``context`` says some output of the tile needs it."""
    acc = tl.zeros(ok.shape, tl.float32)
    if bias is not None:
        acc += tl.load(bias + cols, mask=c_ok, other=0.0).to(tl.float32)
    for j in tl.static_range(W):
        p = p0 + j
        v = tl.load(x_first + p * s_t, mask=ok & (p >= 0), other=0.0).to(tl.float32)
        if state_row is not None:
            if j < W - 1:  # the newest tap is always a token
                old = tl.zeros(ok.shape, tl.float32)
                # addresses and mask outside the branch: inside it, Triton 3.6's layout pass fails (varlen)
                ptr = state_row + (S + p) * s_ss
                m = ok & (p < 0) & state_ok
                if context:  # a branch, not a mask: tiles inside a sequence issue no state loads at all
                    old = tl.load(ptr, mask=m, other=0.0).to(tl.float32)
                v = tl.where(p >= 0, v, old)
        w = tl.load(weight + cols * s_wc + j, mask=c_ok, other=0.0).to(tl.float32)
        acc += w * v
    if SILU:
        acc = acc * tl.sigmoid(acc)
    return acc


@triton.jit
def _roll_state(state_row, x_first, s_t, n_new, S, s_ss, ok, read, BS: tl.constexpr):
    """Overwrite the state rows ``state_row [BC]`` (pointers to entry 0, entries ``s_ss`` apart) with the last
    ``S`` entries of ``[row | n_new inputs from x_first]``, the inputs rounded to the state's dtype, the row read
    as zeros where ``read`` (a scalar) is false (a sequence without a state). All loads come before the barrier:
    another warp of the program may move an entry this one is about to overwrite."""
    s = tl.arange(0, BS)
    h = n_new + s  # new entry s is entry h of [row | inputs]
    keep = ok[:, None] & (s < S)[None, :]
    from_row = (h < S)[None, :]
    old = tl.load(state_row[:, None] + h[None, :] * s_ss, mask=keep & from_row & read, other=0.0)
    new = tl.load(x_first[:, None] + (h - S)[None, :] * s_t, mask=keep & ~from_row)
    rolled = tl.where(from_row, old, new.to(tl.float32).to(old.dtype))
    tl.debug_barrier()
    tl.store(state_row[:, None] + s[None, :] * s_ss, rolled, mask=keep)


@triton.jit
def _sequence_of(cu_seqlens, rows, N):
    """Each packed row's sequence ``n`` (the last with ``cu_seqlens[n] <= row``, so an empty sequence
    yields to the next) and that sequence's first row, clamped to ``[0, row]`` so that corrupt offsets
    cannot send a tap outside x or the state row. A binary search of ``[0, N)``: ceil(log2 N) halvings."""
    lo = tl.zeros_like(rows)
    hi = lo + N
    span = N
    while span > 1:
        mid = (lo + hi) // 2
        right = tl.load(cu_seqlens + mid) <= rows
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
        span = (span + 1) // 2
    bos = tl.load(cu_seqlens + lo).to(tl.int64)
    return lo, tl.minimum(tl.maximum(bos, 0), rows)


# ------------------------------------------------------------------------------------ kernels
@length_agnostic(triton.jit)
def _causal_conv1d_kernel(x, weight, bias, conv_state, cu_seqlens, state_indices, has_state, y, T, N, NT, C, S, P,
                          null, s_xb_t, s_xt, s_wc, s_sn, s_sc, s_ss, W: tl.constexpr, SILU: tl.constexpr,
                          BT: tl.constexpr, BC: tl.constexpr):
    """``y [B, T, C]`` (contiguous) for token block ``pid0 % NT`` of batch row ``pid0 // NT``, channel
    block ``pid1``; varlen (``cu_seqlens``, B == 1): each row continues its own sequence, whose state row
    :func:`pool_row` finds."""
    i_bt, i_c = tl.program_id(0), tl.program_id(1)
    b = (i_bt // NT).to(tl.int64)
    rows = (i_bt % NT).to(tl.int64) * BT + tl.arange(0, BT)
    cols = i_c * BC + tl.arange(0, BC)
    c_ok = cols < C
    ok = (rows < T)[:, None] & c_ok[None, :]
    if cu_seqlens is not None:
        n, bos = _sequence_of(cu_seqlens, rows, N)
    else:
        n, bos = rows * 0 + b, rows * 0
    state_row, state_ok = None, ok
    if conv_state is not None:
        row, _, read = pool_row(n, state_indices, has_state, P, null)
        state_row, state_ok = conv_state + row[:, None] * s_sn + cols[None, :] * s_sc, read[:, None]
    p = rows - bos  # each row's position in its sequence
    x_first = x + (b * s_xb_t + bos[:, None]) * s_xt + cols[None, :]
    acc = _conv(x_first, state_row, state_ok, p[:, None] - (W - 1), tl.min(p) < W - 1, s_xt, S, s_ss, weight, bias,
                cols, c_ok, ok, s_wc, W, SILU)
    tl.store(y + (b * T + rows)[:, None] * C + cols[None, :], acc.to(y.dtype.element_ty), mask=ok)


@triton.jit
def _input_at(x_first, state_row, state_ok, p, s_t, S, s_ss, c_ok):
    """Input ``p`` of the sequence whose token 0 is at ``x_first`` (``[BC]`` pointers): the token where ``p >= 0``,
    else entry ``S + p`` of the state row (zeros without one, where ``state_ok`` is false, or past its start),
    fp32. ``p`` and ``state_ok`` are scalars."""
    v = tl.load(x_first + p * s_t, mask=c_ok & (p >= 0), other=0.0).to(tl.float32)
    if state_row is not None:
        v += tl.load(state_row + (S + p) * s_ss, mask=c_ok & (p < 0) & (S + p >= 0) & state_ok,
                     other=0.0).to(tl.float32)
    return v


@triton.jit
def _context(x_first, state_row, state_ok, p, s_t, S, s_ss, c_ok):
    """Inputs ``p - 1``, ``p - 2``, ``p - 3`` of the sequence (as :func:`_input_at`): the left context of its input
    ``p``, newest first."""
    return (_input_at(x_first, state_row, state_ok, p - 1, s_t, S, s_ss, c_ok),
            _input_at(x_first, state_row, state_ok, p - 2, s_t, S, s_ss, c_ok),
            _input_at(x_first, state_row, state_ok, p - 3, s_t, S, s_ss, c_ok))


@triton.jit
def _tap(weight, cols, c_ok, s_wc, j: tl.constexpr, W: tl.constexpr):
    """Tap ``j`` back from the newest of each channel's filter (fp32, ``[BC]``); zeros past the filter's width."""
    if j < W:
        return tl.load(weight + cols * s_wc + (W - 1 - j), mask=c_ok, other=0.0).to(tl.float32)
    return tl.zeros(cols.shape, tl.float32)


@length_agnostic(triton.jit)
def _causal_conv1d_window_kernel(x, weight, bias, conv_state, cu_seqlens, state_indices, has_state, y, T, N, NT, C, S,
                                 P, null, s_xb_t, s_xt, s_wc, s_sn, s_sc, s_ss, W: tl.constexpr, SILU: tl.constexpr,
                                 BT: tl.constexpr, BC: tl.constexpr):
    """``_causal_conv1d_kernel``'s outputs for ``W <= 4``, walking the program's ``BT`` tokens one at a time with
    the last three inputs in registers: each token is loaded once, where the tile kernel loads it once per tap
    (from L1 after the first). A program's first token, and each sequence starting inside its block, read their
    left context from x or the state row."""
    i_bt, i_c = tl.program_id(0), tl.program_id(1)
    b = (i_bt // NT).to(tl.int64)
    t0 = (i_bt % NT).to(tl.int64) * BT
    cols = i_c * BC + tl.arange(0, BC)
    c_ok = cols < C
    w0, w1 = _tap(weight, cols, c_ok, s_wc, 0, W), _tap(weight, cols, c_ok, s_wc, 1, W)
    w2, w3 = _tap(weight, cols, c_ok, s_wc, 2, W), _tap(weight, cols, c_ok, s_wc, 3, W)
    b0 = tl.zeros(cols.shape, tl.float32)
    if bias is not None:
        b0 += tl.load(bias + cols, mask=c_ok, other=0.0).to(tl.float32)
    x_row = x + b * s_xb_t * s_xt + cols  # token t of batch row b at x_row + t * s_xt
    if cu_seqlens is not None:
        n, bos = _sequence_of(cu_seqlens, t0, N)
        next_bos = tl.load(cu_seqlens + n + 1).to(tl.int64)
    else:
        n, bos, next_bos = b, t0 * 0, t0 * 0 + T
    state_row, state_ok = None, False
    if conv_state is not None:
        row, _, state_ok = pool_row(n, state_indices, has_state, P, null)
        state_row = conv_state + row * s_sn + cols * s_sc
    h1, h2, h3 = _context(x_row + bos * s_xt, state_row, state_ok, t0 - bos, s_xt, S, s_ss, c_ok)
    for r in range(BT):
        t = t0 + r
        if t < T:
            if cu_seqlens is not None:
                if t >= next_bos:  # a sequence starts here (empty ones before it skipped): its state row's context
                    while (t >= next_bos) & (n < N - 1):
                        n += 1
                        next_bos = tl.load(cu_seqlens + n + 1).to(tl.int64)
                    if conv_state is not None:
                        row, _, state_ok = pool_row(n, state_indices, has_state, P, null)
                        state_row = conv_state + row * s_sn + cols * s_sc
                    h1, h2, h3 = _context(x_row, state_row, state_ok, t * 0, s_xt, S, s_ss, c_ok)
            xt = tl.load(x_row + t * s_xt, mask=c_ok, other=0.0).to(tl.float32)
            acc = b0 + w0 * xt + w1 * h1 + w2 * h2 + w3 * h3
            if SILU:
                acc = acc * tl.sigmoid(acc)
            tl.store(y + (b * T + t) * C + cols, acc.to(y.dtype.element_ty), mask=c_ok)
            h3, h2, h1 = h2, h1, xt


@length_agnostic(triton.jit)
def _conv_state_kernel(x, conv_state, cu_seqlens, state_indices, has_state, T, C, S, P, null, s_xb_t, s_xt, s_sn,
                       s_sc, s_ss, BC: tl.constexpr, BS: tl.constexpr):
    """After the conv: sequence ``pid0``'s state row (:func:`pool_row`) ends with the sequence's inputs after
    its old entries (zeros without ``has_state``); an empty sequence, or a skipped row, leaves it untouched."""
    n, i_c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    b, bos, eos = seq_span(n, cu_seqlens, T, cu_seqlens is not None)
    bos = tl.maximum(bos, 0)
    row, live, read = pool_row(n, state_indices, has_state, P, null)
    cols = i_c * BC + tl.arange(0, BC)
    if (eos > bos) & live:
        _roll_state(conv_state + row * s_sn + cols * s_sc, x + (b * s_xb_t + bos) * s_xt + cols, s_xt, eos - bos,
                    S, s_ss, cols < C, read, BS)


@length_agnostic(triton.jit)
def _causal_conv1d_update_kernel(x, conv_state, weight, bias, state_indices, y, L, C, S, P, null, s_xn_l, s_xl, s_sn,
                                 s_sc, s_ss, s_wc, W: tl.constexpr, SILU: tl.constexpr, BC: tl.constexpr,
                                 BS: tl.constexpr):
    """Decode step of sequence ``pid0``, channel block ``pid1``: ``y [N, L, C]`` (contiguous) from pool row
    ``state_indices[n]`` (row n without indices), which is then rolled by the L inputs. A row outside
    ``[0, P)`` (-1: skip) or equal to ``null`` is neither read nor written and the outputs are zeros."""
    n, i_c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    row, live, _ = pool_row(n, state_indices, None, P, null)
    cols = i_c * BC + tl.arange(0, BC)
    c_ok = cols < C
    ok = live & c_ok
    state_row = conv_state + row * s_sn + cols * s_sc
    x_first = x + n * s_xn_l * s_xl + cols
    for l in range(L):
        acc = _conv(x_first, state_row, live, l - (W - 1), l < W - 1, s_xl, S, s_ss, weight, bias, cols, c_ok, ok,
                    s_wc, W, SILU)
        tl.store(y + (n * L + l) * C + cols, tl.where(live, acc, 0.0).to(y.dtype.element_ty), mask=c_ok)
    _roll_state(state_row, x_first, s_xl, L, S, s_ss, ok, live, BS)


# ----------------------------------------------------------------------------------- launchers
def _rows_in_steps(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """``(x, outer stride in token steps, token step)`` of a ``[rows, tokens, C]`` input: the kernels address
    row r's token t at ``(r * outer + t) * step``, so the outer stride (T * step for a slice of a projection,
    a multiple of 16 or not as T is) is never specialised on, while the step keeps its alignment facts. An
    outer stride that is no whole number of steps (a rare view) is made contiguous first."""
    R, T = x.shape[:2]
    s_outer, s_step = x.stride(0), x.stride(1)
    if T == 1:
        s_step = s_outer  # one token: the step is never taken, so any step serves
    if R == 1:
        return x, 0, s_step
    if s_step == 0 or s_outer % s_step:
        x = x.contiguous()
        s_outer, s_step = x.stride(0), x.stride(1)
    return x, s_outer // s_step, s_step


def _channel_block(C: int, most: int) -> int:
    """A power-of-two channel block: C rounded up, within 16..most."""
    return min(most, max(16, next_pow2(C)))


def causal_conv1d(x, weight, bias=None, conv_state=None, cu_seqlens=None, activation=None, state_indices=None,
                  has_state=None, null: int = -1):
    """``torch_aura.causal_conv1d`` on CUDA (arguments there): ``y [B, T, C]`` in x's dtype; ``conv_state
    [N, C, S]`` rewritten in place after the conv, by a second launch. Three arguments the op does not have
    serve an engine's state pool in place (no gather or scatter around the call): ``conv_state [P, C, S]`` is
    then the pool and sequence n's row ``state_indices[n]`` (int32; -1 or ``null`` skip: zero context, no
    write), its old entries read only where ``has_state[n]`` (bool; every row without it)."""
    pool = state_indices is not None or has_state is not None
    if pool:
        _check_pool(x, weight, bias, conv_state, cu_seqlens, activation, state_indices, has_state)
    else:
        _check_conv(x, weight, bias, conv_state, cu_seqlens, activation)
    B, T, C = x.shape
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    y = torch.empty((B, T, C), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    if N == 0:  # tokens but no sequence: corrupt offsets (TORCH_AURA_DEBUG=1 raises), no row to read
        return y.zero_()
    P = 0 if conv_state is None else conv_state.shape[0]
    if state_indices is not None:
        debug_check_pool_rows(state_indices, P, null)
    S = 0 if conv_state is None else conv_state.shape[2]
    s_sn, s_sc, s_ss = (0, 0, 1) if conv_state is None else conv_state.stride()
    W = weight.shape[1]
    window = PREFILL_KERNEL == "window" and W <= 4
    if window:
        kernel, BT, BC, warps = _causal_conv1d_window_kernel, WINDOW_BT, _channel_block(C, WINDOW_BC), WINDOW_WARPS
    else:
        kernel, BT, BC, warps = _causal_conv1d_kernel, CONV_BT, _channel_block(C, CONV_BC), 4
    NT = cdiv(T, BT)
    x, s_xb_t, s_xt = _rows_in_steps(x)
    key = (C, S, int(null), *map(tensor_key, (x, weight, bias, conv_state, cu_seqlens, state_indices, has_state)))
    launch(kernel, (B * NT, cdiv(C, BC)), key,
           x, weight, bias, conv_state, cu_seqlens, state_indices, has_state, y, T, N, NT, C, S, P, int(null),
           s_xb_t, s_xt, weight.stride(0), s_sn, s_sc, s_ss, W=W, SILU=activation is not None, BT=BT, BC=BC,
           num_warps=warps)
    if conv_state is not None:  # after every read of the old rows: same stream, next launch
        BC = _channel_block(C, ROW_BC)
        launch(_conv_state_kernel, (N, cdiv(C, BC)), key, x, conv_state, cu_seqlens, state_indices, has_state, T, C,
               S, P, int(null), s_xb_t, s_xt, s_sn, s_sc, s_ss, BC=BC, BS=next_pow2(S), num_warps=2)
    return y


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, state_indices=None, null: int = -1):
    """``torch_aura.causal_conv1d_update`` on CUDA (arguments there): ``y`` shaped like x ``[N, (L,) C]``;
    the pool ``conv_state [P, C, S]`` rolled in place. ``null``: one more index that skips, as -1 does (a
    serving engine's null slot, so that its indices need no translation kernel first; the op has no such
    argument)."""
    _check_update(x, conv_state, weight, bias, activation, state_indices)
    P, _, S = conv_state.shape
    if state_indices is not None:
        debug_check_pool_rows(state_indices, P, null)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    x3 = x if x.dim() == 3 else x[:, None]  # one token per sequence: L = 1
    N, L, C = x3.shape
    BC = _channel_block(C, UPDATE_BC)
    x3, s_xn_l, s_xl = _rows_in_steps(x3)
    key = (C, S, int(null), *map(tensor_key, (x3, conv_state, weight, bias, state_indices)))
    launch(_causal_conv1d_update_kernel, (N, cdiv(C, BC)), key,
           x3, conv_state, weight, bias, state_indices, y, L, C, S, P, int(null), s_xn_l, s_xl,
           *conv_state.stride(), weight.stride(0), W=weight.shape[1], SILU=activation is not None, BC=BC,
           BS=next_pow2(S), num_warps=UPDATE_WARPS)
    return y
