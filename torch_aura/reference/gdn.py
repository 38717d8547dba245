"""Pure-PyTorch reference of the Gated DeltaNet family (gdn.md).

Two independent formulations of the same forward:

* ``gdn_recurrent``: the token-by-token recurrence of gdn.md §1 (decode, and the ground truth);
* ``gdn_chunk``: the chunked algorithm of §2, written as the five stage ops a kernel implements
  (``gdn_chunk_cumsum`` -> ``gdn_kkt_solve`` -> ``gdn_recompute_w_u`` -> ``gdn_fwd_h`` ->
  ``gdn_fwd_o``), each mirroring its kernel: 64-row chunk tiles (zero-filled past the sequence
  end, like a masked load; the chunk-parallel stages take a batch of chunks side by side, the
  kernel's grid; fwd_h walks them in order), fp32 accumulation, and a round trip to the input dtype
  exactly where §3.7 says a kernel stores a 16-bit intermediate. With fp32 inputs nothing is
  rounded; called directly with float64 inputs everything runs in float64 (the tests prove
  chunked == recurrent to 1e-8 that way).

Layouts: tensors are head-last (``[B, T, H, K]``); inside a chunk we work heads-first
(``[B, NC, HV, BT, K]`` for NC chunks) so every per-head product is one batched matmul. States are held as
``[.., K, V]`` internally; the ``[.., V, K]`` layout (``state_v_first``) is a transpose at load and
store, which is exact, so both layouts give bit-identical numbers here.

Varlen (``cu_seqlens``, B == 1): sequences are packed along T and a chunk never straddles two of
them; the flat chunk order (the rows of ``h``) is sequence by sequence, chunk by chunk, which is
what ``chunk_indices`` lists as ``(sequence id, chunk index in sequence)``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

BT = 64  # chunk length (gdn.md §2)
SUB = 16  # diagonal block size of the blocked triangular inverse (gdn.md §3.2)
L2NORM_EPS = 1e-6
CHUNK_BATCH = 32  # chunks processed side by side by the chunk-parallel stages (memory bound only)


# ----------------------------------------------------------------------------------- helpers
def _compute_dtype(*tensors) -> torch.dtype:
    """fp32 math, or fp64 when the caller passes fp64 (tests only; the ops accept up to fp32)."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _rnd(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round ``x`` to ``dtype`` and back: a kernel storing a 16-bit intermediate (RNE).

    fp32 and fp64 inputs are never rounded (gdn.md §3: "with fp32 inputs nothing is rounded").
    """
    if dtype in (torch.float16, torch.bfloat16):
        return x.to(dtype).to(x.dtype)
    return x


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum_K x^2 + 1e-6)`` per row (gdn.md §1), in x's (compute) dtype."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _seq_bounds(T: int, cu_seqlens) -> list[tuple[int, int]]:
    """Token ranges ``(bos, eos)`` of the sequences.

    Fixed length: a single range ``[0, T)`` shared by all B batch rows (they are processed together).
    Varlen: one range per sequence, read from ``cu_seqlens`` (one host sync); validated here because
    these are data-dependent facts the fake cannot check.
    """
    if cu_seqlens is None:
        return [(0, T)]
    cu = [int(x) for x in cu_seqlens.tolist()]
    if cu[0] != 0 or cu[-1] != T or any(b < a for a, b in zip(cu, cu[1:])):
        head = cu if len(cu) <= 8 else cu[:4] + ["..."] + cu[-3:]
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0 to T = {T}, got {head}")
    return list(zip(cu[:-1], cu[1:]))


def _pool_rows(state_indices, N: int, P: int) -> list[int]:
    """The pool row of each of N sequences (row n without indices); -1 skips. Validated here, where
    the values are read: in ``[0, P)`` or -1, and distinct (a duplicate row is a write race)."""
    if state_indices is None:
        return list(range(N))
    slots = [int(s) for s in state_indices.tolist()]
    bad = [s for s in slots if not -1 <= s < P]
    if bad:
        raise ValueError(f"state_indices: expected pool rows in [0, {P}) or -1 (skip), got {bad[:8]}")
    live = [s for s in slots if s >= 0]
    if len(set(live)) != len(live):
        raise ValueError("state_indices: expected distinct pool rows (a duplicate row is a write "
                         f"race), got duplicates in {slots if len(slots) <= 16 else slots[:16]}")
    return slots


def chunk_indices_from_cu_seqlens(cu_seqlens: torch.Tensor, chunk_size: int = BT) -> torch.Tensor:
    """``[NT_total, 2]`` int32 rows ``(sequence id, chunk index in the sequence)``, on cu's device.

    Built with device ops; the one host sync reads the total chunk count (the output's size).
    """
    cu = cu_seqlens.to(torch.int64)
    lens = cu[1:] - cu[:-1]
    if lens.numel() == 0:
        return torch.zeros(0, 2, dtype=torch.int32, device=cu_seqlens.device)
    n_chunks = (lens + chunk_size - 1) // chunk_size
    total, shortest = torch.stack([n_chunks.sum(), lens.min()]).tolist()  # the one host sync
    if shortest < 0:
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets, got a negative length {shortest}")
    seq = torch.repeat_interleave(torch.arange(lens.numel(), device=cu.device), n_chunks,
                                  output_size=total)
    first = torch.cumsum(n_chunks, 0) - n_chunks  # flat index of each sequence's first chunk
    local = torch.arange(total, device=cu.device) - first[seq]
    return torch.stack([seq, local], dim=1).to(torch.int32)


def _chunks(T: int, cu_seqlens, chunk_indices) -> list[tuple[int, int, int]]:
    """Chunks in flat order (the rows of ``h``): ``(sequence id, bos, eos)``, ``eos - bos <= 64``.

    A given ``chunk_indices`` must list exactly these chunks (a kernel trusts it; a wrong one would
    leave output rows unwritten), so the reference verifies it.
    """
    seqs = _seq_bounds(T, cu_seqlens)
    chunks = [(n, s, min(s + BT, eos)) for n, (bos, eos) in enumerate(seqs) for s in range(bos, eos, BT)]
    if chunk_indices is not None:
        expected = [[n, (s - seqs[n][0]) // BT] for n, s, _ in chunks]
        if chunk_indices.tolist() != expected:
            raise ValueError(f"chunk_indices: expected the {len(expected)} chunks of cu_seqlens "
                             f"(torch_aura.gdn_chunk_indices(cu_seqlens)), got {chunk_indices.shape[0]} "
                             "rows that differ")
    return chunks


class _Chunks(NamedTuple):
    """A batch of chunks processed side by side (the kernels' chunk-parallel grid, vectorised)."""

    ids: torch.Tensor  # [NC] flat chunk indices (rows of h)
    rows: torch.Tensor  # [NC, BT] token index of every tile row (past a chunk's end: its first row)
    valid: torch.Tensor  # [NC, 1, BT] row < chunk length; broadcasts against [B, NC, HV, BT]


def _batches(chunks, device, first: int = 0, size: int = CHUNK_BATCH):
    """Yield the chunks ``[(seq, bos, eos)]`` in batches of at most ``size`` (bounds memory only)."""
    r = torch.arange(BT, device=device)
    for c0 in range(0, len(chunks), size):
        part = chunks[c0 : c0 + size]
        bos = torch.tensor([b for _, b, _ in part], dtype=torch.long, device=device)
        n = torch.tensor([e - b for _, b, e in part], dtype=torch.long, device=device)
        valid = r < n[:, None]
        ids = torch.arange(first + c0, first + c0 + len(part), device=device)
        yield _Chunks(ids, bos[:, None] + torch.where(valid, r, 0), valid[:, None, :])


def _load(x: torch.Tensor, cb: _Chunks, dtype: torch.dtype) -> torch.Tensor:
    """Chunk tiles of ``x [B, T, H, ...]``, heads-first: ``[B, NC, H, BT, ...]`` in ``dtype``.

    Rows past a chunk's end are zero: a masked load. Zeros keep every dot product exact, but a zero
    ``g`` past the end makes ``exp(G_i - G_j)`` large, so every consumer also *selects* them away.
    """
    t = x[:, cb.rows].to(dtype).movedim(2, 3)  # [B, NC, BT, H, ...] -> [B, NC, H, BT, ...]
    mask = cb.valid.view(*cb.valid.shape, *(1,) * (x.dim() - 3))
    return torch.where(mask, t, 0.0)


def _save(out: torch.Tensor, cb: _Chunks, tile: torch.Tensor) -> None:
    """Store the valid rows of heads-first tiles ``[B, NC, H, BT, ...]`` into ``out [B, T, H, ...]``.

    The cast to ``out.dtype`` is the kernel's store: the one place a result is rounded.
    """
    valid = cb.valid[:, 0]  # [NC, BT]
    out[:, cb.rows[valid]] = tile.movedim(3, 2)[:, valid].to(out.dtype)


def _gva(x: torch.Tensor, HV: int) -> torch.Tensor:
    """Expand the q/k heads of a tile (dim 2) to value heads: value head hv reads key head hv // (HV/H)."""
    return x.repeat_interleave(HV // x.shape[2], dim=2)


def _load_state(s: torch.Tensor, dtype: torch.dtype, state_v_first: bool) -> torch.Tensor:
    """A stored state (``[.., K, V]`` or ``[.., V, K]``) as an internal ``[.., K, V]`` in ``dtype``."""
    s = s.to(dtype)
    return s.transpose(-1, -2) if state_v_first else s


def _stored_state(S: torch.Tensor, state_v_first: bool) -> torch.Tensor:
    """The internal ``[.., K, V]`` state in the stored layout."""
    return S.transpose(-1, -2) if state_v_first else S


def _solve_unit_lower(A: torch.Tensor) -> torch.Tensor:
    """``(I + A)^-1`` for strictly lower ``A [..., 64, 64]``, blocked as the kkt kernel does it.

    1. invert the four 16x16 diagonal blocks by forward substitution,
       ``X[i, :] = e_i - sum_{j<i} A[i, j] X[j, :]``;
    2. merge neighbours: for ``L = [[L11, 0], [L21, L22]]`` the inverse is
       ``[[X11, 0], [-X22 L21 X11, X22]]`` (16 -> 32 -> 64).
    The result is unit lower triangular with exact zeros above the diagonal.
    """
    n = A.shape[-1]
    # the diagonal blocks side by side: [..., n/16, 16, 16], all substituted at once
    diag = torch.stack([A[..., b0 : b0 + SUB, b0 : b0 + SUB] for b0 in range(0, n, SUB)], dim=-3)
    X = torch.eye(SUB, dtype=A.dtype, device=A.device).expand(diag.shape).clone()
    for i in range(1, SUB):
        # row i of X needs rows < i only: X[i, :] = e_i - A[i, :i] @ X[:i, :]
        X[..., i, :] -= (diag[..., i : i + 1, :i] @ X[..., :i, :]).squeeze(-2)
    blocks = [(b0, X[..., b, :, :]) for b, b0 in enumerate(range(0, n, SUB))]
    while len(blocks) > 1:
        merged = []
        for (o1, X11), (o2, X22) in zip(blocks[0::2], blocks[1::2]):
            s1, s2 = X11.shape[-1], X22.shape[-1]
            L21 = A[..., o2 : o2 + s2, o1 : o1 + s1]
            X = torch.zeros((*A.shape[:-2], s1 + s2, s1 + s2), dtype=A.dtype, device=A.device)
            X[..., :s1, :s1] = X11
            X[..., s1:, s1:] = X22
            X[..., s1:, :s1] = -(X22 @ (L21 @ X11))
            merged.append((o1, X))
        blocks = merged
    return blocks[0][1]


# ---------------------------------------------------------------------------- the gate domain
# g is a log decay. Every backend reads it as clamp(g, G_MIN, 0) (gdn.md §1): below G_MIN the decay
# e^g < 2.1e-9 is a full forget at fp32 precision, and -inf must not turn a chunk's cumsum into
# (-inf) - (-inf) = NaN; above 0 it would be growth, not decay, so it is read as 0 (no decay).
# The Triton (_jit.G_MIN) and Metal (GDN_G_MIN) kernels carry the same literal; a test keeps them equal.
G_MIN = -20.0


def decay_log(g: torch.Tensor) -> torch.Tensor:
    """``g`` as every GDN op reads it: ``clamp(g, G_MIN, 0)``."""
    return g.clamp(G_MIN, 0.0)


# ------------------------------------------------------------------------------ stage ops
def gdn_chunk_cumsum(g, cu_seqlens=None, chunk_indices=None):
    """Inclusive cumsum of ``g [B, T, HV]`` within each 64-token chunk -> ``g_cum`` fp32 (§3.1).

    Chunk-local on purpose: a global cumsum makes ``e^G`` underflow and ``e^-G`` overflow after a
    few hundred decaying tokens; chunk-local G stays >= 64 * min(g).
    """
    cd = _compute_dtype(g)
    B, T, HV = g.shape
    g_cum = torch.empty((B, T, HV), dtype=cd, device=g.device)
    for cb in _batches(_chunks(T, cu_seqlens, chunk_indices), g.device):
        _save(g_cum, cb, decay_log(_load(g, cb, cd)).cumsum(dim=-1))  # [B, NC, HV, BT]; zeros past the end
    return g_cum


def _gated_kkt(kc, G, beta, valid):
    """Strictly lower ``A[i, j] = beta_i (k_i . k_j) exp(G_i - G_j)``, ``[B, NC, HV, 64, 64]``.

    ``k k^T`` first (fp32 accumulate), then beta and the gate (beta after the dot, as FLA).
    Above the diagonal ``G_i - G_j > 0`` and exp may overflow to inf; zero rows past the end give
    ``0 * inf = NaN``: the mask is applied by SELECT, never by multiplying with 0/1.
    """
    rows = torch.arange(BT, device=kc.device)
    keep = (rows[:, None] > rows[None, :]) & valid[..., :, None] & valid[..., None, :]
    gated = (kc @ kc.transpose(-1, -2)) * beta[..., :, None] * torch.exp(G[..., :, None] - G[..., None, :])
    return torch.where(keep, gated, 0.0)


def gdn_kkt_solve(k, g_cum, beta, cu_seqlens=None, chunk_indices=None):
    """``Ai [B, T, HV, 64]`` (k.dtype): row t = row ``t % 64`` of its chunk's ``(I + A)^-1`` (§3.2).

    Columns past the chunk's valid length are 0 (the inverse is the identity on the masked rows).
    One rounding: the store to k.dtype.
    """
    cd = _compute_dtype(k, g_cum, beta)
    B, T, _, _ = k.shape
    HV = g_cum.shape[2]
    Ai = torch.empty((B, T, HV, BT), dtype=k.dtype, device=k.device)
    for cb in _batches(_chunks(T, cu_seqlens, chunk_indices), k.device):
        kc = _gva(_load(k, cb, cd), HV)  # [B, NC, HV, BT, K]
        A = _gated_kkt(kc, _load(g_cum, cb, cd), _load(beta, cb, cd), cb.valid)
        _save(Ai, cb, _solve_unit_lower(A))
    return Ai


def gdn_recompute_w_u(k, v, beta, Ai, g_cum, cu_seqlens=None, chunk_indices=None):
    """WY form (§3.3): ``w = Ai @ rnd(beta e^G k)`` ``[B,T,HV,K]``, ``u = Ai @ rnd(beta v)`` ``[B,T,HV,V]``.

    The operands are rounded to the input dtype before the matmul (fp32 accumulate), the results
    again on store.
    """
    cd = _compute_dtype(k, v, beta, Ai, g_cum)
    B, T, _, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    w = torch.empty((B, T, HV, K), dtype=k.dtype, device=k.device)
    u = torch.empty((B, T, HV, V), dtype=v.dtype, device=k.device)
    for cb in _batches(_chunks(T, cu_seqlens, chunk_indices), k.device):
        A_inv = _load(Ai, cb, cd)  # [B, NC, HV, BT, BT]; rows past the end are zero
        b = _load(beta, cb, cd)  # [B, NC, HV, BT]
        G = _load(g_cum, cb, cd)
        kb = _rnd(_gva(_load(k, cb, cd), HV) * (b * torch.exp(G))[..., None], k.dtype)
        vb = _rnd(_load(v, cb, cd) * b[..., None], v.dtype)
        _save(w, cb, A_inv @ kb)
        _save(u, cb, A_inv @ vb)
    return w, u


def gdn_fwd_h(k, w, u, g_cum, initial_state=None, cu_seqlens=None, chunk_indices=None,
              state_v_first=False):
    """The sequential state pass (§3.4): ``(h, v_new, final_state)``.

    ``h [B, NT, HV, K, V]`` (k.dtype; ``[.., V, K]`` with state_v_first) holds the state ENTERING
    each chunk; ``v_new [B, T, HV, V]`` (u.dtype) is the per-token delta ``u - w S`` stored ungated;
    ``final_state [N, HV, K, V]`` fp32. Per chunk, with S the fp32 running state:

        h[c] = rnd(S);  b_v = u_c - w_c @ rnd(S);  v_new_c = rnd(b_v)
        b_v = select(row valid, exp(G_L - G_j) * b_v, 0);  S = exp(G_L) S + k_c^T @ rnd(b_v)

    with ``L`` the chunk's last VALID row. A zero-length sequence has no chunks: its final state is
    its initial state (or 0). Sequences run one after another (fixed length: the B rows together);
    a kernel runs them in parallel.
    """
    cd = _compute_dtype(k, w, u, g_cum, initial_state)
    B, T, _, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    seqs = _seq_bounds(T, cu_seqlens)
    chunks = _chunks(T, cu_seqlens, chunk_indices)
    N = B if cu_seqlens is None else len(seqs)
    sd = (V, K) if state_v_first else (K, V)
    h = torch.empty((B, len(chunks), HV, *sd), dtype=k.dtype, device=k.device)
    v_new = torch.empty((B, T, HV, V), dtype=u.dtype, device=k.device)
    final_state = torch.empty((N, HV, *sd), dtype=cd, device=k.device)

    i = 0  # flat chunk index: the row of h
    for n, (bos, eos) in enumerate(seqs):
        rows = slice(None) if cu_seqlens is None else slice(n, n + 1)  # this sequence's state rows
        if initial_state is None:
            S = torch.zeros((B if cu_seqlens is None else 1, 1, HV, K, V), dtype=cd, device=k.device)
        else:
            S = _load_state(initial_state[rows], cd, state_v_first)[:, None]  # [b, 1, HV, K, V]
        for cb in _batches(chunks[i : i + (eos - bos + BT - 1) // BT], k.device, first=i, size=1):
            L = int(cb.valid.sum()) - 1  # last VALID row, not row 63
            S_op = _rnd(S, k.dtype)  # the stored h is what w @ S reads
            h[:, cb.ids] = _stored_state(S_op, state_v_first).to(k.dtype)
            G = _load(g_cum, cb, cd)  # [b, 1, HV, BT]
            b_v = _load(u, cb, cd) - _load(w, cb, cd) @ S_op  # [b, 1, HV, BT, V]
            _save(v_new, cb, b_v)
            G_L = G[..., L]
            gated = torch.where(cb.valid[..., None], torch.exp(G_L[..., None] - G)[..., None] * b_v, 0.0)
            kc = _gva(_load(k, cb, cd), HV)
            S = torch.exp(G_L)[..., None, None] * S + kc.transpose(-1, -2) @ _rnd(gated, k.dtype)
            i += 1
        final_state[rows] = _stored_state(S[:, 0], state_v_first)
    return h, v_new, final_state


def gdn_fwd_o(q, k, v_new, h, g_cum, scale=None, cu_seqlens=None, chunk_indices=None,
              state_v_first=False):
    """Chunk outputs (§3.5): ``o [B, T, HV, V]`` in q.dtype. Per chunk, in the kernel's order:

        b_o = q @ h[c];  b_A = q @ k^T                              (fp32)
        b_o *= exp(G_i);  b_A = select(i >= j, both valid, b_A * exp(G_i - G_j), 0)
        o = scale * (b_o + rnd(b_A) @ v_new)                         (one scale multiply)
    """
    cd = _compute_dtype(q, k, v_new, h, g_cum)
    B, T, _, K = q.shape
    HV, V = v_new.shape[2], v_new.shape[3]
    scale = K ** -0.5 if scale is None else scale
    chunks = _chunks(T, cu_seqlens, chunk_indices)
    if h.shape[1] != len(chunks):
        raise ValueError(f"h: expected {len(chunks)} chunk states (h.shape[1], the chunks of "
                         f"{'cu_seqlens' if cu_seqlens is not None else 'T'}), got {h.shape[1]}")
    o = torch.empty((B, T, HV, V), dtype=q.dtype, device=q.device)
    rows = torch.arange(BT, device=q.device)
    for cb in _batches(chunks, q.device):
        keep = (rows[:, None] >= rows[None, :]) & cb.valid[..., :, None] & cb.valid[..., None, :]  # inclusive
        qc = _gva(_load(q, cb, cd), HV)  # [B, NC, HV, BT, K]
        kc = _gva(_load(k, cb, cd), HV)
        G = _load(g_cum, cb, cd)  # [B, NC, HV, BT]
        b_o = (qc @ _load_state(h[:, cb.ids], cd, state_v_first)) * torch.exp(G)[..., None]
        b_A = torch.where(keep, (qc @ kc.transpose(-1, -2)) * torch.exp(G[..., :, None] - G[..., None, :]), 0.0)
        _save(o, cb, scale * (b_o + _rnd(b_A, q.dtype) @ _load(v_new, cb, cd)))
    return o


def gdn_chunk(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, chunk_indices=None,
              use_qk_l2norm=False, state_v_first=False):
    """The whole chunked forward (§3.6): ``(o [B, T, HV, V] q.dtype, final_state fp32)``."""
    cd = _compute_dtype(q, k, v, g, beta, initial_state)
    if use_qk_l2norm:
        # normalised in fp32, then rounded to the input dtype as FLA does (a fused kernel must too);
        # the recurrent op keeps them in fp32 instead (§4)
        q = _l2norm(q.to(cd)).to(q.dtype)
        k = _l2norm(k.to(cd)).to(k.dtype)
    if cu_seqlens is not None and chunk_indices is None:
        chunk_indices = chunk_indices_from_cu_seqlens(cu_seqlens)  # one host sync (eager only)
    g_cum = gdn_chunk_cumsum(g, cu_seqlens, chunk_indices)
    Ai = gdn_kkt_solve(k, g_cum, beta, cu_seqlens, chunk_indices)
    w, u = gdn_recompute_w_u(k, v, beta, Ai, g_cum, cu_seqlens, chunk_indices)
    h, v_new, final_state = gdn_fwd_h(k, w, u, g_cum, initial_state, cu_seqlens, chunk_indices,
                                      state_v_first)
    o = gdn_fwd_o(q, k, v_new, h, g_cum, scale, cu_seqlens, chunk_indices, state_v_first)
    return o, final_state


# --------------------------------------------------------------------------------- decode
def gdn_recurrent(q, k, v, g, beta, state, state_indices=None, cu_seqlens=None, scale=None,
                  use_qk_l2norm=False, state_v_first=False):
    """Token-by-token recurrence (§1, §4) over an in-place state pool; returns ``o [B, T, HV, V]``.

    Per token, per value head (S is ``[K, V]``, fp32, kept for all tokens of the call):

        S <- exp(g_t) S;  r_t = v_t - S^T k_t;  S <- S + k_t (beta_t r_t)^T;  o_t = scale S^T q_t

    Sequence n starts from ``state[state_indices[n]]`` (row n without indices) and writes its final
    state back there, rounded once to the pool's dtype. Index -1 skips the sequence: no read, no
    write, its o rows are 0. A zero-length sequence leaves its row untouched.
    """
    cd = _compute_dtype(q, k, v, g, beta, state)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    seqs = _seq_bounds(T, cu_seqlens)
    N = B if cu_seqlens is None else len(seqs)
    slots = _pool_rows(state_indices, N, state.shape[0])

    # o is zero where a sequence is skipped: allocate zeros deliberately
    o = torch.zeros((B, T, HV, V), dtype=q.dtype, device=q.device)
    qh, kh = q.to(cd), k.to(cd)
    if use_qk_l2norm:
        qh, kh = _l2norm(qh), _l2norm(kh)  # fp32 "registers", never rounded (unlike gdn_chunk)
    G = HV // H
    qh, kh = qh.repeat_interleave(G, dim=2), kh.repeat_interleave(G, dim=2)  # [B, T, HV, K]
    vh, gh, bh = v.to(cd), decay_log(g.to(cd)), beta.to(cd)

    # fixed length: all B sequences step together (batch row b = sequence b);
    # varlen: B == 1 and sequence n is rows [bos, eos) of batch row 0
    groups = ([(list(range(B)), 0, T)] if cu_seqlens is None
              else [([0], bos, eos) for bos, eos in seqs])
    for gi, (batch_rows, bos, eos) in enumerate(groups):
        seq_ids = batch_rows if cu_seqlens is None else [gi]
        pairs = [(b, slots[n]) for b, n in zip(batch_rows, seq_ids) if slots[n] >= 0]
        if eos == bos or not pairs:
            continue  # zero-length or skipped: the pool row is neither read nor written
        bs = torch.tensor([b for b, _ in pairs], dtype=torch.long, device=q.device)
        rows = torch.tensor([s for _, s in pairs], dtype=torch.long, device=state.device)
        S = _load_state(state[rows], cd, state_v_first)  # [b, HV, K, V]
        q_s, k_s, v_s, g_s, b_s = (x[bs, bos:eos] for x in (qh, kh, vh, gh, bh))  # this group's rows
        o_s = torch.empty((len(pairs), eos - bos, HV, V), dtype=cd, device=q.device)
        for t in range(eos - bos):
            k_t = k_s[:, t, :, None, :]  # [b, HV, 1, K]: row vectors, so S^T k is k @ S
            S = torch.exp(g_s[:, t])[..., None, None] * S  # 1. decay
            r = v_s[:, t] - (k_t @ S).squeeze(-2)  # 2. read with the decayed state  [b, HV, V]
            S = S + k_t.transpose(-1, -2) * (b_s[:, t, :, None] * r)[..., None, :]  # 3. rank-1 write
            o_s[:, t] = scale * (q_s[:, t, :, None, :] @ S).squeeze(-2)  # 4. read after the write
        o[bs, bos:eos] = o_s.to(o.dtype)
        state[rows] = _stored_state(S, state_v_first).to(state.dtype)  # one rounding, on store
    return o


# ======================================================================= the front end (ops.md §3b)
def _conv_rows(xs: torch.Tensor, weight: torch.Tensor, bias, activation) -> torch.Tensor:
    """``[C, W - 1 + n]`` inputs (left context first) -> the ``n`` outputs ``[n, C]``, fp32 (fp64 for
    fp64 tests): ``bias[c] + sum_j w[c, j] x[t - (W - 1) + j, c]``, then the activation."""
    cd = xs.dtype
    W = weight.shape[1]
    y = torch.nn.functional.conv1d(xs[None], weight.to(cd)[:, None], None if bias is None else bias.to(cd),
                                   groups=weight.shape[0])[0]  # [C, n]
    if activation is not None:  # "silu" or "swish": transformers' two names for x * sigmoid(x)
        y = torch.nn.functional.silu(y)
    assert y.shape[1] == xs.shape[1] - (W - 1)
    return y.transpose(0, 1)


def _left_context(conv_state, row: int, C: int, W: int, cd, device) -> torch.Tensor:
    """The ``W - 1`` inputs before a sequence, ``[C, W - 1]``: the last of its state row, else zeros."""
    if conv_state is None or row < 0 or W == 1:
        return torch.zeros(C, W - 1, dtype=cd, device=device)
    return conv_state[row, :, conv_state.shape[2] - (W - 1):].to(cd)


def _new_state(conv_state, row: int, xs: torch.Tensor) -> None:
    """Write the last ``S`` inputs of ``[old state | the sequence]`` into ``conv_state[row]``."""
    S = conv_state.shape[2]
    history = torch.cat([conv_state[row].to(xs.dtype), xs], dim=1)  # [C, S + n]
    conv_state[row].copy_(history[:, -S:])


def causal_conv1d(x, weight, bias=None, conv_state=None, cu_seqlens=None, activation=None):
    """Depthwise causal conv over time (ops.md §3b): ``y [B, T, C]`` in x's dtype.

    Sequence n (batch row n, or rows ``[cu[n], cu[n+1])`` of batch row 0) sees ``W - 1`` inputs of
    left context: the last ones of ``conv_state[n]`` when given, else zeros. With ``conv_state`` its
    row n is then overwritten, in place, by the last ``S`` inputs of the sequence (older state
    entries shift in where the sequence is shorter than ``S``). Computed in fp32, rounded once.
    """
    cd = _compute_dtype(x, weight, bias, conv_state)
    B, T, C = x.shape
    W = weight.shape[1]
    y = torch.empty((B, T, C), dtype=x.dtype, device=x.device)
    seqs = [(b, 0, T) for b in range(B)] if cu_seqlens is None else [
        (0, bos, eos) for bos, eos in _seq_bounds(T, cu_seqlens)]
    for n, (b, bos, eos) in enumerate(seqs):
        if eos == bos:  # an empty sequence: no output, its state row untouched
            continue
        xs = x[b, bos:eos].to(cd).transpose(0, 1)  # [C, n]
        context = _left_context(conv_state, n, C, W, cd, x.device)
        y[b, bos:eos] = _conv_rows(torch.cat([context, xs], dim=1), weight, bias, activation).to(x.dtype)
        if conv_state is not None:
            _new_state(conv_state, n, xs)
    return y


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, state_indices=None):
    """The decode step of :func:`causal_conv1d`: ``x [N, C]`` (one token) or ``[N, L, C]`` continues
    sequence n from ``conv_state[state_indices[n]]`` (row n without indices), which is updated in
    place; index -1 skips the sequence (output 0, pool untouched). Returns ``y`` shaped like x."""
    cd = _compute_dtype(x, weight, bias, conv_state)
    tokens = x if x.dim() == 3 else x[:, None]  # [N, L, C]
    N, L, C = tokens.shape
    W = weight.shape[1]
    rows = _pool_rows(state_indices, N, conv_state.shape[0])
    y = torch.zeros_like(tokens)  # a skipped sequence's rows are 0: deliberately zeros
    for n, row in enumerate(rows):
        if row < 0 or L == 0:  # skipped, or no new token: the row stays as it is
            continue
        xs = tokens[n].to(cd).transpose(0, 1)  # [C, L]
        context = _left_context(conv_state, row, C, W, cd, x.device)
        y[n] = _conv_rows(torch.cat([context, xs], dim=1), weight, bias, activation).to(x.dtype)
        _new_state(conv_state, row, xs)
    return y if x.dim() == 3 else y[:, 0]
