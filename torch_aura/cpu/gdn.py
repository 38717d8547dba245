"""Fast CPU ``gdn_chunk``: the chunked Gated DeltaNet forward of gdn.md §2 as a few large batched matmuls.

Same signature, argument semantics and outputs as :func:`torch_aura.reference.gdn.gdn_chunk` (the
oracle this is tested against). The reference mirrors the GPU kernels stage by stage (16x16 blocked
inverse, batches of 32 chunks, a per-chunk state pass with several small ops); here every
chunk-parallel quantity is computed for ALL chunks and heads at once, and only the state recurrence
is a Python loop over chunk positions: three BLAS calls and one scaling per step, all heads and all
sequences of that position together.

Formulation (per chunk of 64 rows, per value head; gdn.md §2)::

    G      = cumsum(clamp(g, -20, 0))                       chunk-local, fp32
    D[i,j] = exp(G_i - G_j) for i >= j, else 0              selected, never multiplied by a 0/1 mask
    A      = diag(beta) (K K^T o D)                         its diagonal is never read (unitriangular solve)
    Ai     = (I + strict(A))^-1                             one batched triangular solve
    u      = (Ai diag(beta)) V,   w = (Ai diag(beta e^G)) K   Ai's columns scaled, not K's / V's rows
    loop over chunks:  v_new = u - w S;   qS = e^G Q S      (S: the state entering the chunk)
                       S <- e^{G_L} S + (K o e^{G_L - G})^T v_new
    o      = scale * (qS + (Q K^T o D) v_new)               one batched matmul after the loop

Padding: every chunk is a zero-filled 64-row tile. A padded row has k = q = v = beta = 0 and g = 0,
so it adds nothing to any product and leaves the cumsum unchanged: ``G[63]`` is the chunk's last
VALID row's G, and a chunk needs no length mask anywhere. Within a tile ``G_i - G_j >= -64 * 20``
below the diagonal; above it the difference is positive and exp may overflow to inf, which
``tril_`` then replaces by 0 (a select: no ``0 * inf = NaN``).

Tensor layouts (C = number of chunks, heads-first tiles, contiguous; GQA: ``HV = H * R``, value
head hv reads key head ``hv // R``):

* ``kq  [C, H, 128, K]``: rows 0..63 the chunk's k, rows 64..127 its q; one ``@ k^T`` gives both
  ``K K^T`` and ``Q K^T`` on the H key heads only, and the per-value-head gates broadcast them;
* ``w`` comes from one matmul per key head: the R value heads' scaled ``Ai`` stacked along rows
  ``[R*64, 64]`` times that head's ``K [64, K]`` (k is never copied per value head there);
* ``w, e^G q, k e^{G_L-G} [C*HV, 64, K]``; ``v, u, v_new, o [C*HV, 64, V]``; ``g, beta, G [C, HV, 64]``;
  state ``S [N*HV, K, V]`` in the compute dtype, updated in place.

Chunk order is position-major: all sequences' chunk 0, then all chunk 1, ... Sequences are sorted by
chunk count (longest first), so the sequences still running at step c are a prefix: step c works on a
contiguous slice of the chunk tensors and on ``S[:n_c]``, with no gather. Fixed length (no
cu_seqlens) is the case of B equal sequences; varlen (B == 1) scatters tokens into the tiles by
(chunk, row) and gathers o back. A zero-length sequence has no chunk; its final state is its initial
state (or 0). Long inputs run in groups of consecutive flat chunks (``GROUP_TILES`` chunk x head tiles
each) so the intermediates stay bounded; a group may cut a position, so a step is then a contiguous
run of sequences ``S[r0 : r0 + n]`` rather than a prefix.

Precision: everything is computed in fp32 (fp64 if an input is fp64, as in the reference), and 16-bit
inputs are NOT rounded at the intermediate stores the reference emulates (gdn.md §3.7); only the
in-op l2norm rounds q, k to the input dtype, because that is part of the op's definition (§3.6).
fp32 results match the reference to accumulation order; 16-bit ones are closer to the exact answer
than the reference is.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import NamedTuple

import torch

from ..reference import gdn as _ref

BT = _ref.BT  # chunk length, 64
GROUP_TILES = 2048  # (chunk, value head) tiles per group: ~10 intermediates of GROUP_TILES x 64 x 128 fp32


class _Plan(NamedTuple):
    """Where each chunk lives (see the module docstring)."""

    C: int  # number of chunks
    steps: list  # per chunk position c: (first flat chunk, number of sequences with a chunk c)
    order: torch.Tensor | None  # sorted position -> sequence id (None: identity, fixed length)
    cid: torch.Tensor | None  # varlen: [T] flat chunk of every token
    row: torch.Tensor | None  # varlen: [T] row of every token within its tile


def _plan(B: int, T: int, cu_seqlens, chunk_indices, device) -> _Plan:
    if cu_seqlens is None:
        nc = (T + BT - 1) // BT
        return _Plan(nc * B, [(c * B, B) for c in range(nc)], None, None, None)
    # the reference's helpers validate cu_seqlens and chunk_indices (the data checks live there)
    seqs = _ref._seq_bounds(T, cu_seqlens)
    if chunk_indices is not None:
        _ref._chunks(T, cu_seqlens, chunk_indices)
    lens = [e - b for b, e in seqs]
    ncs = [(n + BT - 1) // BT for n in lens]
    order = sorted(range(len(seqs)), key=lambda n: -ncs[n])  # stable: longest first, a prefix runs
    # n_c = number of sequences with more than c chunks = N - #(nc <= c)
    running = len(seqs) - torch.bincount(torch.tensor(ncs, dtype=torch.long), minlength=1).cumsum(0)
    counts = running[: max(ncs, default=0)].tolist()
    starts = [0]
    for n_c in counts:
        starts.append(starts[-1] + n_c)
    steps, start = list(zip(starts[:-1], counts)), starts[-1]
    offs = torch.tensor(starts, dtype=torch.long)
    rank = torch.empty(len(seqs), dtype=torch.long)
    rank[torch.tensor(order, dtype=torch.long)] = torch.arange(len(seqs))
    lens_t = torch.tensor(lens, dtype=torch.long)
    seq = torch.repeat_interleave(torch.arange(len(seqs)), lens_t, output_size=T)  # token -> sequence
    pos = torch.arange(T) - (torch.cumsum(lens_t, 0) - lens_t)[seq]  # token position in its sequence
    cid = offs[pos // BT] + rank[seq]
    return _Plan(start, steps, torch.tensor(order, dtype=torch.long, device=device),
                 cid.to(device), (pos % BT).to(device))


def _tiles(x: torch.Tensor, out: torch.Tensor, plan: _Plan) -> None:
    """Write ``x [B, T, heads, D]`` into heads-first tiles ``out [C, heads, 64, D]`` (any dtype -> out's),
    zero past each chunk's end."""
    B, T = x.shape[:2]
    if plan.cid is not None:  # varlen: scatter tokens by (chunk, row)
        out.zero_()
        out.permute(0, 2, 1, 3)[plan.cid, plan.row] = x[0].to(out.dtype)
        return
    nf, rem = divmod(T, BT)
    o5 = out.view(plan.C // B, B, *out.shape[1:])  # [NC, B, heads, 64, D]
    if nf:  # one strided copy per tensor: transpose and dtype conversion in the same pass
        o5[:nf].copy_(x[:, : nf * BT].view(B, nf, BT, *x.shape[2:]).permute(1, 0, 3, 2, 4))
    if rem:
        o5[nf, :, :, :rem].copy_(x[:, nf * BT :].transpose(1, 2))
        o5[nf, :, :, rem:].zero_()


def _untile(tiles: torch.Tensor, out: torch.Tensor, plan: _Plan) -> None:
    """Inverse of :func:`_tiles`: valid rows of ``tiles [C, HV, 64, V]`` into ``out [B, T, HV, V]``."""
    B, T = out.shape[:2]
    if plan.cid is not None:
        out[0] = tiles.permute(0, 2, 1, 3)[plan.cid, plan.row]
        return
    nf, rem = divmod(T, BT)
    t5 = tiles.view(plan.C // B, B, *tiles.shape[1:])
    if nf:
        out[:, : nf * BT].view(B, nf, BT, *out.shape[2:]).copy_(t5[:nf].permute(1, 0, 3, 2, 4))
    if rem:
        out[:, nf * BT :].copy_(t5[nf, :, :, :rem].transpose(1, 2))


def _steps_in(plan: _Plan, starts: list, a: int, b: int):
    """The state steps of flat chunks ``[a, b)``: ``(first flat chunk, first state row, count)``.

    Position c holds ranks ``0..n_c-1`` at flat ``starts[c] + rank``; a group may cut a position, so
    a step is any contiguous run of ranks (state rows ``S[r0 : r0 + count]``).
    """
    out = []
    for c in range(max(0, bisect_right(starts, a) - 1), len(starts)):
        start, n = plan.steps[c]
        if start >= b:
            break
        lo, hi = max(a, start), min(b, start + n)
        if lo < hi:
            out.append((lo, lo - start, hi - lo))
    return out


def gdn_chunk(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, chunk_indices=None,
              use_qk_l2norm=False, state_v_first=False):
    """The whole chunked forward: ``(o [B, T, HV, V] q.dtype, final_state [N, HV, K, V] fp32)``.

    Exactly the contract of :func:`torch_aura.reference.gdn.gdn_chunk` (``[N, HV, V, K]`` states with
    ``state_v_first``); inputs are not validated here beyond the data checks of varlen metadata.
    """
    cd = _ref._compute_dtype(q, k, v, g, beta, initial_state)
    dev = q.device
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    if use_qk_l2norm:
        # normalised in fp32, then rounded to the input dtype: the op's definition (gdn.md §3.6)
        q = _ref._l2norm(q.to(cd)).to(q.dtype)
        k = _ref._l2norm(k.to(cd)).to(k.dtype)
    plan = _plan(B, T, cu_seqlens, chunk_indices, dev)
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    C = plan.C

    # entering states, sorted like the chunks; a fresh fp32 [N, HV, K, V] tensor (updated in place)
    S = torch.empty((N, HV, K, V), dtype=cd, device=dev)  # a copy: the caller's state is never written
    if initial_state is None:
        S.zero_()
    else:
        h0 = _ref._load_state(initial_state, cd, state_v_first)  # a [.., K, V] view in cd
        S.copy_(h0 if plan.order is None else h0[plan.order])
    o = torch.empty((B, T, HV, V), dtype=q.dtype, device=dev)

    if C:
        # input tiles for all chunks (the size of the inputs); k and q share one buffer so that one
        # matmul gives K K^T and Q K^T
        kq = torch.empty((C, H, 2 * BT, K), dtype=cd, device=dev)
        _tiles(k, kq[:, :, :BT], plan)
        _tiles(q, kq[:, :, BT:], plan)
        vc = torch.empty((C, HV, BT, V), dtype=cd, device=dev)
        _tiles(v, vc, plan)
        gb = torch.empty((2, C, HV, BT, 1), dtype=cd, device=dev)  # g and beta tiles in one buffer
        _tiles(g.unsqueeze(-1), gb[0], plan)
        _tiles(beta.unsqueeze(-1), gb[1], plan)
        oc = torch.empty((C, HV, BT, V), dtype=cd, device=dev)
        # groups of chunks bound the ~10 intermediates of [chunks * HV, 64, 64 | K | V] (long prompts)
        size, starts = max(1, GROUP_TILES // HV), [st for st, _ in plan.steps]
        for a in range(0, C, size):
            b = min(C, a + size)
            _group(kq[a:b], vc[a:b], gb[:, a:b], S.view(N * HV, K, V), oc[a:b], _steps_in(plan, starts, a, b),
                   a, scale)
        _untile(oc, o, plan)

    if plan.order is not None:  # back to sequence order
        S = torch.empty_like(S).index_copy_(0, plan.order, S)
    final_state = S.transpose(-1, -2).contiguous() if state_v_first else S
    return o, final_state


def _group(kq, vc, gb, S3, oc, steps, first: int, scale: float) -> None:
    """Chunks ``[first, first + C)``: their chunk-parallel part, their state steps (``S3 [N*HV, K, V]``
    updated in place), and their output tiles ``oc [C, HV, 64, V]``."""
    C, H, _, K = kq.shape
    HV, V = vc.shape[1], vc.shape[3]
    R = HV // H  # value heads per key head: hv reads key head hv // R
    cd, dev = kq.dtype, kq.device
    kc, qc = kq[:, :, :BT], kq[:, :, BT:]
    G = _ref.decay_log(gb[0, ..., 0]).cumsum_(-1)  # [C, HV, 64]; padded rows add 0
    bc = gb[1, ..., 0]

    # ---- chunk-parallel part: all chunks and heads of the group at once
    # inclusive gates exp(G_i - G_j); above the diagonal exp may overflow: tril_ SELECTS it away
    D = (G[..., :, None] - G[..., None, :]).exp_().tril_().view(C, H, R, BT, BT)
    kkqk = kq @ kc.transpose(-1, -2)  # [C, H, 128, 64]: K K^T over Q K^T, on key heads only
    Aqk = (kkqk[:, :, None, BT:] * D).view(C * HV, BT, BT)  # Q K^T o D, inclusive
    A = D.mul_(kkqk[:, :, None, :BT]).mul_(bc.view(C, H, R, BT, 1))  # diag(beta) (K K^T o D), in D's memory
    del D, kkqk
    # unitriangular: A's diagonal (beta_i |k_i|^2) is never read, so this is (I + strict(A))^-1
    eye = torch.eye(BT, dtype=cd, device=dev)
    Ai = torch.linalg.solve_triangular(A.view(C * HV, BT, BT), eye, upper=False, unitriangular=True)
    del A
    eG = torch.exp(G)
    # w = Ai diag(beta e^G) K, u = Ai diag(beta) V: scale Ai's 64 columns rather than the K / V rows
    Ab = torch.empty((C, HV, BT, BT), dtype=cd, device=dev)  # row-major (the solve returns column-major)
    torch.mul(Ai.view(C, HV, BT, BT), bc[..., None, :], out=Ab)
    del Ai
    # u goes straight into v_new's buffer: the loop subtracts w S from it in place
    v_new = torch.empty((C * HV, BT, V), dtype=cd, device=dev)
    torch.bmm(Ab.view(C * HV, BT, BT), vc.view(C * HV, BT, V), out=v_new)
    # the R value heads of one key head, stacked along rows, share that head's K: one matmul, no expand
    w = torch.bmm(Ab.mul_(eG[..., None, :]).view(C * H, R * BT, BT), kq.view(C * H, 2 * BT, K)[:, :BT])
    w = w.view(C * HV, BT, K)
    del Ab
    qg = (qc[:, :, None] * eG.view(C, H, R, BT, 1)).view(C * HV, BT, K)  # e^G q
    kd = (kc[:, :, None] * torch.exp(G[..., -1:] - G).view(C, H, R, BT, 1)).view(C * HV, BT, K)  # k e^{G_L-G}
    kdT = kd.transpose(1, 2)  # BLAS reads the transpose in place
    eGL = eG[..., -1].reshape(C * HV, 1, 1)  # e^{G_L}: padded rows carry G_L to row 63

    # ---- the sequential part: per step, read the state twice and update it once (all heads)
    qS = oc.view(C * HV, BT, V)  # e^G q S, the inter-chunk output, written straight into o's tiles
    for lo, r0, n in steps:
        sl = slice((lo - first) * HV, (lo - first + n) * HV)
        Sn = S3[r0 * HV : (r0 + n) * HV]  # the sequences with a chunk at this position (contiguous rows)
        v_new[sl].baddbmm_(w[sl], Sn, alpha=-1.0)  # v_new = u - w S
        torch.bmm(qg[sl], Sn, out=qS[sl])
        Sn.mul_(eGL[sl]).baddbmm_(kdT[sl], v_new[sl])  # S <- e^{G_L} S + kd^T v_new
    # o = scale * (e^G q S + (Q K^T o D) v_new): one batched matmul for all chunks of the group
    qS.baddbmm_(Aqk, v_new, beta=scale, alpha=scale)
