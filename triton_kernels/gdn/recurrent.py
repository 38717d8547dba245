"""Gated DeltaNet decode in Triton: the token-by-token recurrence over an in-place state pool (gdn.md §4).

One program per (V tile, sequence, value head), 1-D flattened. The program loads its ``[K, BV]``
slice of the sequence's pool row into fp32 registers, runs every token of the call, and writes it
back once (rounded to the pool's dtype), so a T-token call moves the state once, not T times.
Memory-bound at decode: ``2 * K * V * 4`` bytes per (sequence, head) for an fp32 pool.

Per token (S is ``[K, V]``): ``S <- e^g S;  r = v - S^T k;  S <- S + k (beta r)^T;  o = scale S^T q``.
With ``use_qk_l2norm`` q and k are normalised in fp32 registers and never rounded.

Pool rows: sequence n uses ``state_indices[n]`` (row n without indices). A negative index (or one
past the pool, which the reference rejects, or the launcher's ``null``) skips the sequence: no read, no
write, zeros in o.
Duplicate rows race; ``TORCH_AURA_DEBUG=1`` checks for them on the host (one sync).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import _env
from ..._checks import gdn as _checks
from ..._checks import common as _c
from ..._checks.common import remembered, tensor_facts
from .. import _launch
from .._launch import launch, tensor_key
from .._tune import cdiv, next_pow2, sm_count
from ._jit import decay_log, gate_values, length_agnostic, pool_row, seq_span, v_tile_head_row

_DEBUG = "TORCH_AURA_DEBUG"


@triton.jit
def _token(S, t, q, k, v, g, beta, o, A_h, dt_h, b, i_h, i_hv, kk, vv, k_ok, v_ok, live, scale, T, HV, V,
           s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh,
           L2NORM: tl.constexpr, RAW_GATES: tl.constexpr):
    """One token of the rule on this program's state tile S ``[BK, BV]`` (fp32): o written, S returned."""
    q_t = tl.load(q + b * s_qb + t * s_qt + i_h * s_qh + kk, mask=k_ok, other=0.0).to(tl.float32)
    k_t = tl.load(k + b * s_kb + t * s_kt + i_h * s_kh + kk, mask=k_ok, other=0.0).to(tl.float32)
    v_t = tl.load(v + b * s_vb + t * s_vt + i_hv * s_vh + vv, mask=v_ok, other=0.0).to(tl.float32)
    g_t = tl.load(g + b * s_gb + t * s_gt + i_hv * s_gh)
    b_t = tl.load(beta + b * s_bb + t * s_bt + i_hv * s_bh)
    if RAW_GATES:  # the gates kernel's formula, so the step equals gates-then-rule bit for bit
        g_t, b_t = gate_values(g_t, b_t, A_h, dt_h, 1.0, 20.0)
    g_t, b_t = decay_log(g_t), b_t.to(tl.float32)
    if L2NORM:
        q_t = q_t / tl.sqrt(tl.sum(q_t * q_t) + 1e-6)
        k_t = k_t / tl.sqrt(tl.sum(k_t * k_t) + 1e-6)
    S = S * tl.exp(g_t)  # 1. decay
    r = v_t - tl.sum(S * k_t[:, None], axis=0)  # 2. read with the decayed state
    S = S + k_t[:, None] * (b_t * r)[None, :]  # 3. rank-1 write
    o_t = scale * tl.sum(S * q_t[:, None], axis=0)  # 4. read after the write
    tl.store(o + ((b * T + t) * HV + i_hv) * V + vv, tl.where(live, o_t, 0.0).to(o.dtype.element_ty), mask=v_ok)
    return S


@length_agnostic(triton.jit)
def _gdn_recurrent_kernel(q, k, v, g, beta, state, state_indices, cu_seqlens, o, A_log, dt_bias, scale, T, HV, GROUP,
                          K, V, P, null, s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh,
                          s_bb, s_bt, s_bh, s_pn, s_ph, s_pk, s_pv,
                          L2NORM: tl.constexpr, RAW_GATES: tl.constexpr, ONE_TOKEN: tl.constexpr,
                          BK: tl.constexpr, BV: tl.constexpr):
    """o ``[B, T, HV, V]`` is the launcher's own contiguous buffer: addressed from its shape, no strides.
    ``RAW_GATES``: ``g`` and ``beta`` hold a serving engine's gate projections ``a`` and ``b``, made into gates
    here with ``A_log`` and ``dt_bias`` (softplus beta 1, threshold 20). Pool row ``null`` skips, as -1 does.
    ``ONE_TOKEN``: every sequence is one token (T = 1, no ``cu_seqlens``), run without the token loop."""
    i_v, i_hv, n = v_tile_head_row(V, BV, HV)
    i_h = i_hv // GROUP
    b, bos, eos = seq_span(n, cu_seqlens, T, cu_seqlens is not None)
    slot, live, _ = pool_row(n, state_indices, None, P, null)
    A_h, dt_h = 0.0, 0.0
    if RAW_GATES:
        A_h, dt_h = tl.load(A_log + i_hv), tl.load(dt_bias + i_hv)
    kk = tl.arange(0, BK)
    vv = i_v * BV + tl.arange(0, BV)
    k_ok = kk < K
    v_ok = vv < V
    p_state = state + slot * s_pn + i_hv * s_ph + kk[:, None] * s_pk + vv[None, :] * s_pv
    tile_ok = live & k_ok[:, None] & v_ok[None, :]
    S = tl.load(p_state, mask=tile_ok, other=0.0).to(tl.float32)
    if ONE_TOKEN:
        S = _token(S, 0, q, k, v, g, beta, o, A_h, dt_h, b, i_h, i_hv, kk, vv, k_ok, v_ok, live, scale, T, HV, V,
                   s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh,
                   L2NORM, RAW_GATES)
        tl.store(p_state, S.to(state.dtype.element_ty), mask=tile_ok)
    else:
        for t in range(bos, eos):
            S = _token(S, t, q, k, v, g, beta, o, A_h, dt_h, b, i_h, i_hv, kk, vv, k_ok, v_ok, live, scale, T, HV,
                       V, s_qb, s_qt, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh,
                       L2NORM, RAW_GATES)
        if eos > bos:  # a zero-length sequence leaves its row untouched (as does a skipped one)
            tl.store(p_state, S.to(state.dtype.element_ty), mask=tile_ok)


def debug_check_pool_rows(state_indices: torch.Tensor, P: int, null: int = -1) -> None:
    """Under ``TORCH_AURA_DEBUG`` (read per call, so a test can set it), check a pool launcher's rows on the host (one
    sync): in ``[0, P)`` or -1 (skip), and no duplicates (two sequences writing one row race); ``null`` skips too."""
    if _env.unset(_DEBUG) or not _env.get("TORCH_AURA_DEBUG"):  # unset (the usual case) skips the parse
        return
    rows = state_indices.tolist()
    bad = [s for s in rows if not -1 <= s < P]
    live = [s for s in rows if s >= 0 and s != null]
    if bad or len(set(live)) != len(live):
        raise ValueError(f"state_indices: expected distinct pool rows in [0, {P}) or -1 (skip), got {rows[:16]}")


# Settings for A/B runs on a GPU (bench_vllm_gdn_ops.py --recurrent-tiles; docs/gdn.md §6.1 has the figures),
# each read when a geometry is first built. Triton's pipelining stages for the token loop (None: its default),
# which a decode step runs once:
LOOP_STAGES = None
# The rule's body without its token loop where every sequence is one token (T = 1 without cu_seqlens), as
# vLLM's packed decode kernel runs; off until timed:
ONE_TOKEN = False
# Registers per thread (ptxas .maxnreg; None: ptxas's choice), which set how many programs, so state bytes in
# flight, an SM holds (tools/gdn_rule_registers.py reads them without a GPU):
MAX_REGISTERS = None


def _tile(rows: int, V: int, BK: int, device: torch.device, v_first: bool = False) -> tuple[int, int]:
    """``(V tile, warps)`` of a launch over ``rows`` (sequence, value head) pairs.
    A ``[HV, V, K]`` state (``v_first``: a serving engine's pool, K contiguous): 16-wide V tiles on one warp, so
    the K reductions stay inside the warp (fastest at every batch on the H200, gdn.md §6.1). A ``[HV, K, V]``
    state: 64-wide V tiles when they still give >= 8 programs per SM, else 32, so small batches fill the GPU;
    4 warps up to 64 fp32 state values per thread, 8 beyond (gdn.md §6.3).
    ``benchmarks/bench_vllm_gdn_ops.py --recurrent-tiles`` times others."""
    if v_first:
        return 16, 1
    bv = min(32, max(16, next_pow2(V)))
    if V > 32 and rows * cdiv(V, 64) >= 8 * sm_count(device):
        bv = 64
    return bv, 4 if BK * bv <= 8192 else 8


class _Native:
    """A geometry's launch as one C call (``_launch.native_program``), made after its first launch through
    ``_launch.launch``; ``refused`` says why it cannot be one (then every call launches through ``_launch``)."""

    __slots__ = ("program", "refused")

    def __init__(self):
        self.program = self.refused = None


def _geometry(q, k, v, g, beta, state, state_indices, cu_seqlens, scale, use_qk_l2norm, state_v_first, A_log=None,
              dt_bias=None, null=-1):
    """The checks, then what a call of this metadata launches beside its tensors: o's shape, dtype and device, the
    grid (None: no program), the launch key, the scalar and stride arguments, the constexprs and options, and the
    geometry's native launch (:class:`_Native`)."""
    _checks.gdn_recurrent(q, k, v, g, beta, state, state_indices, cu_seqlens, scale, use_qk_l2norm, state_v_first)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    raw_gates = A_log is not None
    if raw_gates:
        for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
            _c.tensor(name, t, ndim=1, dtypes=_c.FLOATS, contiguous=True)
            _c.shape(name, t, (HV,), "one per value head")
        _c.same_device(q=q, A_log=A_log, dt_bias=dt_bias)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    scale = float(K ** -0.5 if scale is None else scale)  # an int 1 would specialise the kernel
    o = ((B, T, HV, V), q.dtype, q.device)  # kept: reading a tensor's dtype and device costs per call
    if N * HV == 0:
        return o, None, None, None, None, None
    BK = max(16, next_pow2(K))
    BV, warps = _tile(N * HV, V, BK, q.device, state_v_first)
    sp = state.stride()
    pool = (sp[0], sp[1], sp[3], sp[2]) if state_v_first else sp
    key = (HV, H, K, V, state_v_first, int(null),
           *map(tensor_key, (q, k, v, g, beta, state, state_indices, cu_seqlens, A_log, dt_bias)))
    ints = (scale, T, HV, HV // H, K, V, state.shape[0], int(null), *q.stride()[:3], *k.stride()[:3],
            *v.stride()[:3], *g.stride(), *beta.stride(), *pool)
    one_token = ONE_TOKEN and T == 1 and cu_seqlens is None
    options = dict(L2NORM=use_qk_l2norm, RAW_GATES=raw_gates, ONE_TOKEN=one_token, BK=BK, BV=BV, num_warps=warps)
    if LOOP_STAGES is not None:
        options["num_stages"] = LOOP_STAGES
    if MAX_REGISTERS is not None:
        options["maxnreg"] = MAX_REGISTERS
    return o, (cdiv(V, BV) * N * HV,), key, ints, options, _Native()


def _call_facts(args) -> tuple:
    """The memo key of a call: every fact of each tensor the checks and the launch key read (``tensor_facts``:
    shape, strides, dtype, device, 16-byte alignment; a test in tests/build/test_gdn_launch.py changes each),
    the other arguments, and _launch.ENABLED, which changes the key _geometry builds."""
    return tensor_facts((*args, _launch.ENABLED), True)


# eager calls repeat their metadata: one pass over the tensors' facts finds the whole launch
_geometry_of = remembered(_geometry, facts=_call_facts)
_launch._on_clear.append(_geometry_of.forget)  # entries hold launch keys and V tiles (the stub's SM count)


def gdn_recurrent(q, k, v, g, beta, state, state_indices=None, cu_seqlens=None, scale=None,
                  use_qk_l2norm=False, state_v_first=False, out=None, gates=None, null=-1):
    """``torch_aura.gdn_recurrent`` on CUDA (arguments there), with three arguments the op does not have, for a
    serving engine's decode step in one launch: ``out``, where to write o instead of a new tensor (contiguous, o's
    shape and dtype: the engine's own buffer, so no copy follows); ``gates = (A_log, dt_bias)`` (``[HV]`` each),
    which makes ``g`` and ``beta`` the gate projections ``a`` and ``b`` (any float dtype), the gates computed in
    the kernel as ``torch_aura``'s gates kernel does (softplus beta 1, threshold 20); ``null``, one more pool row
    that skips as -1 does (the engine's null slot, so its indices need no translation)."""
    A_log, dt_bias = (None, None) if gates is None else gates
    # the op's calls pass the op's arguments only: one memo entry per geometry, whichever caller looks it up
    engine = () if gates is None and null == -1 else (A_log, dt_bias, null)
    (shape, dtype, device), grid, key, ints, options, native = _geometry_of(
        q, k, v, g, beta, state, state_indices, cu_seqlens, scale, use_qk_l2norm, state_v_first, *engine)
    if state_indices is not None and not _env.unset(_DEBUG):  # unset, the usual case: no frame, no state.shape read
        debug_check_pool_rows(state_indices, state.shape[0], null)
    if out is None:
        o = torch.empty(shape, dtype=dtype, device=device)
    elif out.shape != shape or out.dtype != dtype or out.device != device or not out.is_contiguous():
        raise ValueError(f"gdn_recurrent: out must be a contiguous {dtype} tensor of shape {tuple(shape)} on {device}, "
                         f"got {out.dtype} {tuple(out.shape)} on {out.device}")
    else:
        o = out
    if grid is None:
        return o
    # a decode step's host time is mostly launch overhead: one C call with the addresses (gdn.md §6.1)
    if native.program is not None and _launch.run_native(native.program, (
            q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr(), state.data_ptr(),
            0 if state_indices is None else state_indices.data_ptr(),
            0 if cu_seqlens is None else cu_seqlens.data_ptr(), o.data_ptr(),
            0 if A_log is None else A_log.data_ptr(), 0 if dt_bias is None else dt_bias.data_ptr())):
        return o
    args = (q, k, v, g, beta, state, state_indices, cu_seqlens, o, A_log, dt_bias, *ints)
    launch(_gdn_recurrent_kernel, grid, key, *args, **options)
    if native.program is None and native.refused is None:
        native.program, native.refused = _launch.native_program(_gdn_recurrent_kernel, grid, key, args, options, 11)
    return o
