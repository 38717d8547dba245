"""Device helpers shared by the GDN kernels (chunk bounds, tile addressing, pool rows, gates, the 16x16 solve).

Conventions of every GDN kernel:

* tensors are head-last (``x[b, t, head, col]``) with a unit last stride; kernels take the batch,
  token and head strides, so views (e.g. a transposed q) need no copy;
* token offsets are int64: ``T * H * K`` passes 2^31 at 1M tokens x 64 heads x 128;
* G (the chunk-local cumsum of g, natural log) is scaled by log2(e) on load and every gate is an
  ``exp2``;
* rows past a sequence's end are loaded as zeros and every gate that could see them is applied
  with ``tl.where`` (select), never by multiplying with a 0/1 mask: above the diagonal and past
  the end ``exp2`` may be inf, and ``0 * inf`` is NaN.
"""

from __future__ import annotations

import inspect

import triton
import triton.language as tl

# Kernel arguments that change with the prompt: lengths, chunk and segment counts, the pool size, the
# tokens per sequence of a decode step (L), the batch strides of the [B, T, HV] gate tensors (g: s_gb,
# g_cum: s_cb, beta: s_bb; T * HV, whose divisibility by 16 follows T where HV is small) and the conv
# input's row strides counted in token steps (s_xb_t, s_xn_l). Triton specialises an int argument on == 1
# and % 16 == 0 and compiles one variant per combination: each would recompile at new prompt lengths. None
# of them enters an address that could be vectorised (the gates are read a scalar per row; the conv's
# rows start at a multiple of their token step, whose facts are kept; its outputs are vectors of C).
LENGTH_ARGS = frozenset({"T", "NT", "NT_total", "NS", "CPS", "N", "n_seg", "P", "L", "s_gb", "s_cb", "s_bb",
                         "s_xb_t", "s_xn_l"})


def length_agnostic(jit):
    """``jit`` (``triton.jit``, ``gluon.jit``) with ``do_not_specialize`` set to the kernel's
    :data:`LENGTH_ARGS`, so one compiled variant serves every prompt length and batch mix."""
    def decorate(fn):
        return jit(do_not_specialize=[p for p in inspect.signature(fn).parameters if p in LENGTH_ARGS])(fn)
    return decorate


LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * log2(e))
CHUNK = 64  # chunk length (rows of every chunk tile), for the Python launchers
BT = tl.constexpr(CHUNK)  # the same, readable inside kernels (globals must be constexpr there)
G_MIN = tl.constexpr(-20.0)  # g is read as clamp(g, G_MIN, 0): reference.gdn.G_MIN says why


@triton.jit
def decay_log(g):
    """``g`` as every GDN op reads it (a log decay; -inf and g > 0 included), fp32."""
    return tl.minimum(tl.maximum(g.to(tl.float32), G_MIN), 0.0)


@triton.jit
def pool_row(n, state_indices, has_state, P, null):
    """Sequence ``n``'s state row (scalar or vector ``n``): ``(row, live, read)``. The row is
    ``state_indices[n]``, or n without indices; it is live in ``[0, P)`` and not ``null``, and its old entries are
    read where it is live and ``has_state[n]`` (every live row without ``has_state``). A dead row reads as 0."""
    row = n.to(tl.int64)
    if state_indices is not None:
        row = tl.load(state_indices + n).to(tl.int64)
    live = (row >= 0) & (row < P) & (row != null)
    read = live
    if has_state is not None:
        read = read & (tl.load(has_state + n) != 0)
    return tl.where(live, row, 0), live, read


@triton.jit
def gate_values(a, b, A_log, dt_bias, scale, threshold):
    """The GDN layers' gates from their projections, fp32, elementwise: ``g = -exp(A_log) * softplus(a +
    dt_bias)`` (softplus with ``scale`` as its beta, linear above ``threshold``, as torch's) and ``beta =
    sigmoid(b)``. One formula for the gates kernels and the decode rule that computes its own."""
    x = a.to(tl.float32) + dt_bias.to(tl.float32)
    z = scale * x
    e = tl.exp(tl.minimum(z, threshold))  # clamped: the linear branch below takes z > threshold
    u = 1.0 + e
    tiny = u == 1.0  # e below fp32's half ulp of 1: log(1 + e) = e
    log1p = tl.where(tiny, e, tl.log(u) * (e / tl.where(tiny, 1.0, u - 1.0)))  # to e's last digits (Goldberg)
    soft = tl.where(z > threshold, x, log1p / scale)
    return -tl.exp(A_log.to(tl.float32)) * soft, 1.0 / (1.0 + tl.exp(-b.to(tl.float32)))


@triton.jit
def chunk_span(i_c, cu_seqlens, chunk_indices, T, NT, IS_VARLEN: tl.constexpr, BT: tl.constexpr):
    """Flat chunk ``i_c`` -> ``(b, start, eos)``: its batch row, first token and sequence end.

    Fixed length: chunk ``i_c`` is chunk ``i_c % NT`` of batch row ``i_c // NT``. Varlen (B == 1):
    ``chunk_indices[i_c] = (sequence n, chunk c)`` and the sequence spans ``cu_seqlens[n:n+2]``.
    ``eos`` is clamped to T, so a corrupt ``cu_seqlens`` cannot send a load past the tensor.
    """
    if IS_VARLEN:
        n = tl.load(chunk_indices + i_c * 2).to(tl.int64)
        c = tl.load(chunk_indices + i_c * 2 + 1).to(tl.int64)
        bos = tl.load(cu_seqlens + n).to(tl.int64)
        eos = tl.minimum(tl.load(cu_seqlens + n + 1).to(tl.int64), T)
        b = n * 0
    else:
        b = (i_c // NT).to(tl.int64)
        c = (i_c % NT).to(tl.int64)
        bos = b * 0
        eos = bos + T
    return b, bos + c * BT, eos


@triton.jit
def seq_span(n, cu_seqlens, T, IS_VARLEN: tl.constexpr):
    """Sequence ``n`` -> ``(b, bos, eos)``: batch row and token range (varlen: row 0)."""
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + n).to(tl.int64)
        eos = tl.minimum(tl.load(cu_seqlens + n + 1).to(tl.int64), T)
        b = bos * 0
    else:
        b = n.to(tl.int64)
        bos = b * 0
        eos = bos + T
    return b, bos, eos


@triton.jit
def segment_span(j, seg_table, cu_seqlens, T, NT, NS, CPS, IS_VARLEN: tl.constexpr):
    """Segment ``j`` of the sequence-parallel pass -> ``(n, b, bos, eos, c_lo, c_hi, last)``: its
    sequence, batch row and token range, its chunks ``[c_lo, c_hi)`` (numbered within the sequence)
    and whether it is the sequence's last segment.

    A segment is up to ``CPS`` whole chunks of one sequence. Fixed length: ``NS`` segments per
    sequence, segment ``j`` is number ``j % NS`` of sequence ``j // NS``. Varlen: ``seg_table[j] =
    (n, c_lo)``, built on the device from cu_seqlens (``segments._segment_table``); the grid is a
    static upper bound, and rows past the real count hold ``n = -1``: such a program gets an empty
    chunk range and ``last = False``, so it reads and writes nothing. Scalar code (Gluon calls it too).
    """
    if IS_VARLEN:
        n = tl.load(seg_table + j * 2).to(tl.int64)
        c_lo = tl.load(seg_table + j * 2 + 1).to(tl.int64)
        live = n >= 0
        n = tl.maximum(n, 0)
        bos = tl.load(cu_seqlens + n).to(tl.int64)
        eos = tl.minimum(tl.load(cu_seqlens + n + 1).to(tl.int64), T)
        b = bos * 0
        nc = tl.maximum(eos - bos + BT - 1, 0) // BT
        c_hi = tl.where(live, tl.minimum(c_lo + CPS, nc), c_lo)
        last = live & (c_hi >= nc)
    else:
        n = (j // NS).to(tl.int64)
        c_lo = (j % NS).to(tl.int64) * CPS
        c_hi = tl.minimum(c_lo + CPS, NT)
        b = n
        bos = n * 0
        eos = bos + T
        last = c_hi >= NT
    return n, b, bos, eos, c_lo, c_hi, last


@triton.jit
def v_tile_head_row(V, BV: tl.constexpr, HV):
    """This program of a 1-D grid over (row, value head, V tile), V tiles fastest:
    ``(i_v, i_hv, row)``; a row is a sequence (state pass, recurrent) or a chunk (fwd_o)."""
    NV = tl.cdiv(V, BV)
    pid = tl.program_id(0)
    i_v, rest = pid % NV, pid // NV
    return i_v, rest % HV, rest // HV


@triton.jit
def tile_ptrs(base, b, rows, head, cols, s_b, s_t, s_h):
    """Addresses of ``x[b, rows, head, cols]``: ``[len(rows), len(cols)]``."""
    return base + b * s_b + head * s_h + rows[:, None] * s_t + cols[None, :]


@triton.jit
def load_tile(base, b, rows, row_ok, head, cols, ncols, s_b, s_t, s_h):
    """Zero-filled load of ``x[b, rows, head, cols]`` (rows past the end and cols >= ncols are 0)."""
    mask = row_ok[:, None] & (cols < ncols)[None, :]
    return tl.load(tile_ptrs(base, b, rows, head, cols, s_b, s_t, s_h), mask=mask, other=0.0)


@triton.jit
def store_tile(base, x, b, rows, row_ok, head, cols, ncols, s_b, s_t, s_h):
    """Store the valid part of a tile, rounding to the buffer's dtype (RNE) on the way."""
    mask = row_ok[:, None] & (cols < ncols)[None, :]
    tl.store(tile_ptrs(base, b, rows, head, cols, s_b, s_t, s_h), x.to(base.dtype.element_ty), mask=mask)


@triton.jit
def tile_ptrs_t(base, b, rows, head, cols, s_b, s_t, s_h):
    """``tile_ptrs`` transposed: addresses of ``x[b, rows, head, cols]^T``, ``[len(cols), len(rows)]``."""
    return base + b * s_b + head * s_h + rows[None, :] * s_t + cols[:, None]


@triton.jit
def load_tile_t(base, b, rows, row_ok, head, cols, ncols, s_b, s_t, s_h):
    """``load_tile`` transposed: ``x[b, rows, head, cols]^T`` as ``[len(cols), len(rows)]``, zero-filled."""
    mask = (cols < ncols)[:, None] & row_ok[None, :]
    return tl.load(tile_ptrs_t(base, b, rows, head, cols, s_b, s_t, s_h), mask=mask, other=0.0)


@triton.jit
def store_tile_t(base, xt, b, rows, row_ok, head, cols, ncols, s_b, s_t, s_h):
    """Store ``xt [len(cols), len(rows)]`` as the valid part of ``x[b, rows, head, cols]`` (RNE)."""
    mask = (cols < ncols)[:, None] & row_ok[None, :]
    tl.store(tile_ptrs_t(base, b, rows, head, cols, s_b, s_t, s_h), xt.to(base.dtype.element_ty), mask=mask)


@triton.jit
def rows_desc(base, b, head, eos, s_b, s_t, s_h, ncols, C: tl.constexpr):
    """In-kernel TMA descriptor of ``x[b, :eos, head, :ncols]`` in ``[BT, C]`` boxes, built once per
    program: a copy zero-fills rows at or past ``eos`` (the sequence's end) and columns past ``ncols``,
    as a masked load would, and a store drops them. Needs 16-byte aligned strides (the launcher checks)
    and a workspace allocator (``_tune.descriptor_workspace``)."""
    rows = tl.maximum(eos, 1).to(tl.int32)  # an empty sequence never loads; keep the shape valid
    return tl.make_tensor_descriptor(base + b * s_b + head * s_h, [rows, ncols], [s_t, 1], [BT, C])


@triton.jit
def chunk_rows(base, desc, b, start, rows, row_ok, head, col0, C: tl.constexpr, ncols, s_b, s_t, s_h,
               TMA: tl.constexpr):
    """The chunk's ``[BT, C]`` tile of ``x[b, rows, head, col0:col0 + C]``, zero past the sequence and
    past ``ncols``: one asynchronous tensor-memory copy through ``desc`` (``rows_desc``; the loop's
    software pipeline runs it ahead of use) with ``TMA``, else a masked pointer load."""
    if TMA:
        return desc.load([start.to(tl.int32), col0])
    else:
        return load_tile(base, b, rows, row_ok, head, col0 + tl.arange(0, C), ncols, s_b, s_t, s_h)


@triton.jit
def fixed_tile(base, desc, b, start, rows, row_ok, head, col0, C: tl.constexpr, ncols, s_b, s_t, s_h,
               TMA: tl.constexpr):
    """Fixed-length (``[B, T, H, C]``) chunk tile ``x[b, rows, head, col0:col0 + C]``, zero past T and
    past ``ncols``: with ``TMA`` one copy through ``desc``, a host descriptor of the whole tensor in
    ``[1, BT, 1, C]`` boxes (it zero-fills past T, which for fixed length is the sequence's end), else a
    masked pointer load."""
    if TMA:
        return desc.load([b.to(tl.int32), start.to(tl.int32), head, col0]).reshape(BT, C)
    else:
        return load_tile(base, b, rows, row_ok, head, col0 + tl.arange(0, C), ncols, s_b, s_t, s_h)


@triton.jit
def store_fixed_tile(base, desc, x, b, start, rows, row_ok, head, col0, C: tl.constexpr, ncols, s_b, s_t, s_h,
                     TMA: tl.constexpr):
    """``fixed_tile``'s store, rounding to the buffer's dtype: the copy drops rows past T and columns
    past ``ncols``, as the masked store does."""
    if TMA:
        desc.store([b.to(tl.int32), start.to(tl.int32), head, col0],
                   x.to(base.dtype.element_ty).reshape(1, BT, 1, C))
    else:
        store_tile(base, x, b, rows, row_ok, head, col0 + tl.arange(0, C), ncols, s_b, s_t, s_h)


@triton.jit
def load_rows(base, b, rows, row_ok, head, s_b, s_t, s_h):
    """fp32 ``x[b, rows, head]`` of a ``[B, T, H]`` tensor (g, g_cum, beta); 0 past the end."""
    return tl.load(base + b * s_b + head * s_h + rows * s_t, mask=row_ok, other=0.0).to(tl.float32)


@triton.jit
def gate_causal(a, G2_i, G2_j, ok_i, ok_j, rows_i, rows_j, STRICT: tl.constexpr):
    """``select(i > j (STRICT) or i >= j, both valid, a * exp2(G2_i - G2_j), 0)``.

    Above the diagonal the exponent is positive and may overflow: select, never multiply by a mask.
    """
    if STRICT:
        keep = rows_i[:, None] > rows_j[None, :]
    else:
        keep = rows_i[:, None] >= rows_j[None, :]
    keep = keep & ok_i[:, None] & ok_j[None, :]
    return tl.where(keep, a * tl.exp2(G2_i[:, None] - G2_j[None, :]), 0.0)


@triton.jit
def inv_unit_lower16(A, PREC: tl.constexpr):
    """``(I + A)^-1`` of a strictly lower 16x16 fp32 block.

    A is nilpotent (``A^16 = 0``), so ``(I + A)^-1 = sum_k (-A)^k = (I - A)(I + A^2)(I + A^4)(I + A^8)``:
    six 16x16 products (``dot_f32`` at ``PREC``). Row-by-row forward substitution (the reference's order) needs
    fifteen dependent steps, each two cross-warp reductions; in the prep kernel that took more time
    than all of FLA's kkt + solve (gdn.md §6.3). Terms of the series grow at
    most like ``C(15, k) |A|^k``; with ``|A_ij| = beta |k_i . k_j| e^(G_i - G_j) <= 1`` the fp32
    products stay far inside the bf16/fp16 rounding of the stored result. Those growing terms cancel,
    so tf32 inputs (2^-11) would cost accuracy; the launchers use ``"bf16x3"`` (~2^-16) or ``"ieee"``
    (``prep._solve_precision``).
    """
    A2 = dot_f32(A, A, PREC)
    A4 = dot_f32(A2, A2, PREC)
    r = tl.arange(0, 16)
    X = tl.where(r[:, None] == r[None, :], 1.0, 0.0) - A
    X += dot_f32(X, A2, PREC)
    X += dot_f32(X, A4, PREC)
    X += dot_f32(X, dot_f32(A4, A4, PREC), PREC)
    return X


@triton.jit
def dot_f32(a, b, PREC: tl.constexpr):
    """fp32 x fp32 product of the solve: ``"ieee"`` (full fp32, on the CUDA cores), ``"bf16x3"``
    (tensor cores: each operand split into two bf16 parts, three products, ~16 mantissa bits) or
    ``"tf32"`` (tensor cores; inputs keep 10 mantissa bits)."""
    return tl.dot(a, b, input_precision=PREC)


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
