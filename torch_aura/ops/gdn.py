"""Public wrappers of the Gated DeltaNet family (gdn.md).

Each wrapper takes exactly its op's schema arguments, runs the family check (the same function the
fake runs, so bad input raises the same named ``ValueError`` eagerly and at trace time) and calls
``torch.ops.aura.<op>``. Shapes: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]`` (``HV % H == 0``;
value head hv reads key head ``hv // (HV / H)``); g, beta ``[B, T, HV]``; ``1 <= K, V <= 256``;
states fp32 ``[N, HV, K, V]`` or ``[N, HV, V, K]`` with ``state_v_first``. Varlen: ``cu_seqlens``
``[N+1]`` int32/int64 with ``B == 1``, plus ``chunk_indices`` from :func:`gdn_chunk_indices`.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch

from .. import _debug
from .._checks import common as _common
from .._checks import gdn as _checks
from ..reference import gdn as _ref
from ._call import checked_call

__all__ = [
    "gdn_chunk",
    "gdn_chunk_cumsum",
    "gdn_kkt_solve",
    "gdn_recompute_w_u",
    "gdn_fwd_h",
    "gdn_fwd_o",
    "gdn_recurrent",
    "causal_conv1d",
    "causal_conv1d_update",
    "gdn_chunk_indices",
    "gdn_warmup",
    "GdnWarmup",
]


def gdn_chunk_indices(cu_seqlens: torch.Tensor, chunk_size: int = 64) -> torch.Tensor:
    """List the chunks of packed sequences: the ``chunk_indices`` argument of the gdn ops.

    Chunk c of sequence n covers tokens ``[cu[n] + c*chunk_size, min(cu[n] + (c+1)*chunk_size,
    cu[n+1]))``; chunks are listed sequence by sequence (the row order of ``gdn_fwd_h``'s ``h``).
    Zero-length sequences have no chunks. Costs one device-to-host sync (the total chunk count),
    so build it once per batch, before graph capture or outside ``torch.compile``.

    Args:
        cu_seqlens: ``[N+1]`` int32 or int64, non-decreasing offsets starting at 0.
        chunk_size: tokens per chunk; the gdn ops use 64.

    Returns:
        ``[NT_total, 2]`` int32 on ``cu_seqlens``'s device: rows ``(sequence id, chunk index in
        the sequence)``.

    Raises:
        ValueError: ``cu_seqlens`` is not a 1-D int32/int64 tensor, has a negative length, or
            ``chunk_size < 1``.

    Example:
        >>> import torch, torch_aura
        >>> torch_aura.gdn_chunk_indices(torch.tensor([0, 70, 70, 75])).tolist()
        [[0, 0], [0, 1], [2, 0]]
    """
    _common.tensor("cu_seqlens", cu_seqlens, ndim=1, dtypes=_common.INDEX_DTYPES)
    if chunk_size < 1:
        _common.fail("chunk_size", "a positive int", chunk_size)
    return _ref.chunk_indices_from_cu_seqlens(cu_seqlens, chunk_size)


@_debug.validated
def gdn_chunk(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, chunk_indices=None,
              use_qk_l2norm=False, state_v_first=False):
    """Chunked gated delta rule forward (prefill), 64-token chunks (gdn.md §2-3).

    Per sequence and value head, with state ``S [K, V]``: ``S <- exp(g_t) S``;
    ``S <- S + k_t (beta_t (v_t - S^T k_t))^T``; ``o_t = scale S^T q_t``. Runs the stages
    cumsum -> kkt_solve -> recompute_w_u -> fwd_h -> fwd_o; with 16-bit inputs the intermediates
    are rounded to the input dtype where gdn.md §3.7 says.

    Args:
        q: ``[B, T, H, K]`` fp16, bf16 or fp32, unit last stride.
        k: ``[B, T, H, K]``, dtype of q. Should be L2-normalised (or set ``use_qk_l2norm``).
        v: ``[B, T, HV, V]``, dtype of q, ``HV % H == 0``.
        g: ``[B, T, HV]`` float, log decay, used in fp32 and read as ``clamp(g, -20, 0)``:
            ``-inf`` is a full forget (no NaN), ``g > 0`` is read as 0.
        beta: ``[B, T, HV]`` float, write strength, used in fp32.
        scale: output scale; None means ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` (``[N, HV, V, K]`` if ``state_v_first``) float, or None
            for zeros; loaded to fp32.
        cu_seqlens: ``[N+1]`` int32/int64 sequence offsets (varlen, requires ``B == 1``), or None
            (then ``N = B``).
        chunk_indices: ``[NT_total, 2]`` int32 from :func:`gdn_chunk_indices`; optional (built
            here with one host sync when missing), pass it for CUDA graphs and compile.
        use_qk_l2norm: normalise q and k over K in fp32 (then round to the input dtype) first.
        state_v_first: states use the ``[V, K]`` layout.

    Returns:
        ``(o, final_state)``: o ``[B, T, HV, V]`` in q's dtype; final_state ``[N, HV, K, V]``
        (``[N, HV, V, K]`` if ``state_v_first``) fp32, always materialised.

    Raises:
        ValueError: bad dtype, rank, device, last-dim stride, K or V outside 1..256, ``HV % H != 0``,
            shape mismatch, or inconsistent ``cu_seqlens`` / ``chunk_indices``; names the argument.
            Data errors (values, not shapes) are raised on CPU always and on CUDA / MPS under
            ``TORCH_AURA_DEBUG=1``; otherwise the kernels clamp or skip them (README,
            "Out-of-range data").

    Example:
        >>> import torch, torch_aura
        >>> q = torch.nn.functional.normalize(torch.randn(1, 70, 2, 32), dim=-1)
        >>> k = torch.nn.functional.normalize(torch.randn(1, 70, 2, 32), dim=-1)
        >>> v, g = torch.randn(1, 70, 4, 48), -torch.rand(1, 70, 4)
        >>> o, state = torch_aura.gdn_chunk(q, k, v, g, torch.rand(1, 70, 4))
        >>> tuple(o.shape), tuple(state.shape), state.dtype
        ((1, 70, 4, 48), (1, 4, 32, 48), torch.float32)
    """
    return checked_call(_checks.gdn_chunk, torch.ops.aura.gdn_chunk,
                        q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_indices, use_qk_l2norm,
                        state_v_first)


@_debug.validated
def gdn_chunk_cumsum(g, cu_seqlens=None, chunk_indices=None):
    """Inclusive cumsum of the log decay within each 64-token chunk (gdn.md §3.1).

    The sum restarts at every chunk start (and at every sequence start in varlen), so
    ``exp(G)`` never underflows over long sequences.

    Args:
        g: ``[B, T, HV]`` fp16, bf16 or fp32 log decay, read as ``clamp(g, -20, 0)``.
        cu_seqlens: ``[N+1]`` int32/int64 sequence offsets (``B == 1``), or None.
        chunk_indices: ``[NT_total, 2]`` int32 from :func:`gdn_chunk_indices`, or None.

    Returns:
        ``g_cum [B, T, HV]`` fp32, natural-log units.

    Raises:
        ValueError: bad dtype, rank, device, stride or varlen metadata; names the argument.

    Example:
        >>> import torch, torch_aura
        >>> g_cum = torch_aura.gdn_chunk_cumsum(torch.full((1, 66, 1), -0.5))
        >>> g_cum[0, 63, 0].item(), g_cum[0, 65, 0].item()
        (-32.0, -1.0)
    """
    return checked_call(_checks.gdn_chunk_cumsum, torch.ops.aura.gdn_chunk_cumsum, g, cu_seqlens, chunk_indices)


@_debug.validated
def gdn_kkt_solve(k, g_cum, beta, cu_seqlens=None, chunk_indices=None):
    """Per chunk, ``(I + A)^-1`` of the gated strictly lower ``A = beta K K^T`` (gdn.md §3.2).

    ``A[i, j] = beta_i (k_i . k_j) exp(G_i - G_j)`` for ``i > j`` inside one chunk (0 elsewhere).

    Args:
        k: ``[B, T, H, K]`` fp16, bf16 or fp32.
        g_cum: ``[B, T, HV]`` fp32 from :func:`gdn_chunk_cumsum`; ``HV % H == 0``.
        beta: ``[B, T, HV]`` float.
        cu_seqlens: ``[N+1]`` int32/int64 sequence offsets (``B == 1``), or None.
        chunk_indices: ``[NT_total, 2]`` int32 from :func:`gdn_chunk_indices`, or None.

    Returns:
        ``Ai [B, T, HV, 64]`` in k's dtype: row t is row ``t % 64`` of its chunk's unit lower
        triangular inverse (columns past the chunk's end are 0).

    Raises:
        ValueError: bad dtype, rank, device, stride, K, head ratio, shapes or varlen metadata.

    Example:
        >>> import torch, torch_aura
        >>> k = torch.nn.functional.normalize(torch.randn(1, 40, 1, 16), dim=-1)
        >>> Ai = torch_aura.gdn_kkt_solve(k, torch.zeros(1, 40, 2), torch.rand(1, 40, 2))
        >>> Ai.shape, bool((Ai[0, :, 0].diagonal() == 1).all())
        (torch.Size([1, 40, 2, 64]), True)
    """
    return checked_call(_checks.gdn_kkt_solve, torch.ops.aura.gdn_kkt_solve, k, g_cum, beta, cu_seqlens, chunk_indices)


@_debug.validated
def gdn_recompute_w_u(k, v, beta, Ai, g_cum, cu_seqlens=None, chunk_indices=None):
    """WY representation: ``w = Ai (beta exp(G) k)``, ``u = Ai (beta v)`` per chunk (gdn.md §3.3).

    Args:
        k: ``[B, T, H, K]`` fp16, bf16 or fp32.
        v: ``[B, T, HV, V]``, dtype of k, ``HV % H == 0``.
        beta: ``[B, T, HV]`` float.
        Ai: ``[B, T, HV, 64]`` in k's dtype, from :func:`gdn_kkt_solve`.
        g_cum: ``[B, T, HV]`` fp32 from :func:`gdn_chunk_cumsum`.
        cu_seqlens: ``[N+1]`` int32/int64 sequence offsets (``B == 1``), or None.
        chunk_indices: ``[NT_total, 2]`` int32 from :func:`gdn_chunk_indices`, or None.

    Returns:
        ``(w, u)``: w ``[B, T, HV, K]`` in k's dtype, u ``[B, T, HV, V]`` in v's dtype.

    Raises:
        ValueError: bad dtype, rank, device, stride, K or V, head ratio, shapes or varlen metadata.

    Example:
        >>> import torch, torch_aura
        >>> k = torch.nn.functional.normalize(torch.randn(1, 40, 1, 16), dim=-1)
        >>> v, beta, g_cum = torch.randn(1, 40, 2, 24), torch.rand(1, 40, 2), torch.zeros(1, 40, 2)
        >>> Ai = torch_aura.gdn_kkt_solve(k, g_cum, beta)
        >>> w, u = torch_aura.gdn_recompute_w_u(k, v, beta, Ai, g_cum)
        >>> tuple(w.shape), tuple(u.shape)
        ((1, 40, 2, 16), (1, 40, 2, 24))
    """
    return checked_call(_checks.gdn_recompute_w_u, torch.ops.aura.gdn_recompute_w_u,
                        k, v, beta, Ai, g_cum, cu_seqlens, chunk_indices)


@_debug.validated
def gdn_fwd_h(k, w, u, g_cum, initial_state=None, cu_seqlens=None, chunk_indices=None,
              state_v_first=False):
    """The sequential state pass over the chunks (gdn.md §3.4).

    Per chunk c with state S (fp32): ``h[c] = S``; ``v_new = u - w S``;
    ``S = exp(G_L) S + k^T (exp(G_L - G) v_new)`` with L the chunk's last valid row.

    Args:
        k: ``[B, T, H, K]`` fp16, bf16 or fp32.
        w: ``[B, T, HV, K]``, dtype of k, from :func:`gdn_recompute_w_u`.
        u: ``[B, T, HV, V]``, dtype of k, from :func:`gdn_recompute_w_u`.
        g_cum: ``[B, T, HV]`` fp32 from :func:`gdn_chunk_cumsum`.
        initial_state: ``[N, HV, K, V]`` (``[N, HV, V, K]`` if ``state_v_first``) float, or None
            for zeros.
        cu_seqlens: ``[N+1]`` int32/int64 sequence offsets (``B == 1``), or None.
        chunk_indices: ``[NT_total, 2]`` int32 from :func:`gdn_chunk_indices`; REQUIRED with
            ``cu_seqlens`` (it fixes h's chunk count, which the fake cannot read from data).
        state_v_first: h and the states use the ``[V, K]`` layout.

    Returns:
        ``(h, v_new, final_state)``: h ``[B, NT, HV, K, V]`` (``[.., V, K]``) in k's dtype, the
        state entering each chunk (``NT = ceil(T / 64)`` or ``chunk_indices.shape[0]``); v_new
        ``[B, T, HV, V]`` in u's dtype (ungated per-token deltas); final_state ``[N, HV, K, V]``
        (``[.., V, K]``) fp32.

    Raises:
        ValueError: bad dtype, rank, device, stride, sizes, shapes, or varlen without chunk_indices.

    Example:
        >>> import torch, torch_aura
        >>> k = torch.nn.functional.normalize(torch.randn(1, 70, 1, 16), dim=-1)
        >>> w, u = 0.1 * torch.randn(1, 70, 1, 16), torch.randn(1, 70, 1, 8)
        >>> h, v_new, final = torch_aura.gdn_fwd_h(k, w, u, torch.zeros(1, 70, 1))
        >>> tuple(h.shape), tuple(v_new.shape), tuple(final.shape)
        ((1, 2, 1, 16, 8), (1, 70, 1, 8), (1, 1, 16, 8))
    """
    return checked_call(_checks.gdn_fwd_h, torch.ops.aura.gdn_fwd_h,
                        k, w, u, g_cum, initial_state, cu_seqlens, chunk_indices, state_v_first)


@_debug.validated
def gdn_fwd_o(q, k, v_new, h, g_cum, scale=None, cu_seqlens=None, chunk_indices=None,
              state_v_first=False):
    """Chunk outputs from the entering states and the intra-chunk part (gdn.md §3.5).

    ``o_i = scale (exp(G_i) q_i^T h[c] + sum_{j <= i} exp(G_i - G_j) (q_i . k_j) v_new_j)``.

    Args:
        q: ``[B, T, H, K]`` fp16, bf16 or fp32.
        k: ``[B, T, H, K]``, dtype of q.
        v_new: ``[B, T, HV, V]``, dtype of q, from :func:`gdn_fwd_h`.
        h: ``[B, NT, HV, K, V]`` (``[.., V, K]`` if ``state_v_first``), dtype of q, from
            :func:`gdn_fwd_h`.
        g_cum: ``[B, T, HV]`` fp32 from :func:`gdn_chunk_cumsum`.
        scale: output scale; None means ``K ** -0.5``.
        cu_seqlens: ``[N+1]`` int32/int64 sequence offsets (``B == 1``), or None.
        chunk_indices: ``[NT_total, 2]`` int32 from :func:`gdn_chunk_indices`, or None.
        state_v_first: h uses the ``[V, K]`` layout.

    Returns:
        ``o [B, T, HV, V]`` in q's dtype.

    Raises:
        ValueError: bad dtype, rank, device, stride, sizes, shapes or varlen metadata.

    Example:
        >>> import torch, torch_aura
        >>> q = k = torch.nn.functional.normalize(torch.randn(1, 70, 1, 16), dim=-1)
        >>> v_new, h = torch.randn(1, 70, 2, 8), torch.zeros(1, 2, 2, 16, 8)
        >>> torch_aura.gdn_fwd_o(q, k, v_new, h, torch.zeros(1, 70, 2)).shape
        torch.Size([1, 70, 2, 8])
    """
    return checked_call(_checks.gdn_fwd_o, torch.ops.aura.gdn_fwd_o,
                        q, k, v_new, h, g_cum, scale, cu_seqlens, chunk_indices, state_v_first)


@_debug.validated
def gdn_recurrent(q, k, v, g, beta, state, state_indices=None, cu_seqlens=None, scale=None,
                  use_qk_l2norm=False, state_v_first=False):
    """Token-by-token gated delta rule (decode) over an in-place state pool (gdn.md §4).

    Sequence n starts from ``state[state_indices[n]]`` (row n without indices), runs its tokens
    with the state in fp32 and writes the final state back to the same row, rounded once to the
    pool's dtype. Index -1 skips the sequence (row untouched, its o rows 0); a zero-length
    sequence leaves its row untouched.

    Args:
        q: ``[B, T, H, K]`` fp16, bf16 or fp32.
        k: ``[B, T, H, K]``, dtype of q.
        v: ``[B, T, HV, V]``, dtype of q, ``HV % H == 0``.
        g: ``[B, T, HV]`` float log decay, read as ``clamp(g, -20, 0)`` (as in ``gdn_chunk``).
        beta: ``[B, T, HV]`` float.
        state: the pool ``[P, HV, K, V]`` (``[P, HV, V, K]`` if ``state_v_first``), fp32 (or
            fp16/bf16), updated in place.
        state_indices: ``[N]`` int32 pool rows, -1 = skip; distinct; or None (row n).
        cu_seqlens: ``[N+1]`` int32/int64 sequence offsets (``B == 1``), or None (``N = B``).
        scale: output scale; None means ``K ** -0.5``.
        use_qk_l2norm: normalise q and k over K in fp32 (never rounded).
        state_v_first: the pool uses the ``[V, K]`` layout.

    Returns:
        ``o [B, T, HV, V]`` in q's dtype.

    Raises:
        ValueError: bad dtype, rank, device, stride, sizes or shapes; ``state_indices`` out of
            range or duplicated; inconsistent ``cu_seqlens``.
            Data errors (values, not shapes) are raised on CPU always and on CUDA / MPS under
            ``TORCH_AURA_DEBUG=1``; otherwise the kernels clamp or skip them (README,
            "Out-of-range data").

    Example:
        >>> import torch, torch_aura
        >>> q = k = torch.nn.functional.normalize(torch.randn(2, 1, 1, 16), dim=-1)
        >>> v, g, beta = torch.randn(2, 1, 2, 8), -torch.rand(2, 1, 2), torch.rand(2, 1, 2)
        >>> pool = torch.zeros(5, 2, 16, 8)
        >>> o = torch_aura.gdn_recurrent(q, k, v, g, beta, pool, torch.tensor([3, -1], dtype=torch.int32))
        >>> o.shape, bool(o[1].eq(0).all()), bool(pool[3].ne(0).any()), bool(pool[:3].eq(0).all())
        (torch.Size([2, 1, 2, 8]), True, True, True)
    """
    return checked_call(_checks.gdn_recurrent, torch.ops.aura.gdn_recurrent,
                        q, k, v, g, beta, state, state_indices, cu_seqlens, scale, use_qk_l2norm, state_v_first)


@_debug.validated
def causal_conv1d(x, weight, bias=None, conv_state=None, cu_seqlens=None, activation=None):
    """Depthwise causal convolution over time with the bias and SiLU fused: the GDN front end (ops.md §3b).

    ``y[b, t, c] = act(bias[c] + sum_j weight[c, j] * x[b, t - (W - 1) + j, c])``: each channel is
    filtered by its own W taps over the current and the ``W - 1`` previous tokens of its sequence.
    Before a sequence's first token come the last ``W - 1`` inputs of its ``conv_state`` row (zeros
    without a state); the row is then overwritten in place by the sequence's last ``S`` inputs, so a
    chunked prefill or :func:`causal_conv1d_update` continues it. x and y are token-major: the q, k
    and v channel slices of y are unit-stride views that :func:`gdn_chunk` reads without a copy.

    Args:
        x: ``[B, T, C]`` fp16, bf16 or fp32, unit stride over C (channels-first data: pass
            ``x.transpose(1, 2)`` of a ``[B, C, T]`` view of a token-major tensor).
        weight: ``[C, W]`` float taps, ``1 <= W <= 8`` (Qwen3-Next: 4); oldest token first.
        bias: ``[C]`` float, or None.
        conv_state: ``[N, C, S]`` float, ``S >= max(W - 1, 1)``: each sequence's previous inputs
            (oldest first), read and rewritten in place through its strides (any but a zero one: vLLM's
            ``[N, S, C]`` pool passes transposed); or None (zeros, nothing written).
        cu_seqlens: ``[N+1]`` int32/int64 offsets of packed sequences (``B == 1``), or None (``N = B``).
            Each sequence is convolved on its own.
        activation: None, or ``"silu"`` (``"swish"`` is accepted as its transformers name).

    Returns:
        ``y [B, T, C]`` in x's dtype, computed in fp32.

    Raises:
        ValueError: bad dtype, rank, device, stride or shapes, W outside 1..8, S < W - 1, an unknown
            activation, inconsistent ``cu_seqlens`` (values: on the CPU; on CUDA / MPS under
            ``TORCH_AURA_DEBUG=1``).

    Example:
        >>> import torch, torch_aura
        >>> x, weight = torch.randn(2, 6, 8), torch.randn(8, 4)       # B=2, T=6, C=8, W=4
        >>> state = torch.zeros(2, 8, 4)                               # S = 4
        >>> y = torch_aura.causal_conv1d(x, weight, conv_state=state, activation="silu")
        >>> y.shape, torch.equal(state[:, :, -1], x[:, -1])            # the state ends with the last input
        (torch.Size([2, 6, 8]), True)
    """
    if not torch.compiler.is_compiling():  # compiled, the op's fake makes this check
        _common.remembered_check(_checks.causal_conv1d)(x, weight, bias, conv_state, cu_seqlens, activation)
    elif conv_state is None:
        # Inductor (torch 2.13, auto_functionalized_v2) fails on a None mutable argument; a scratch
        # state of zeros is the same left context, and its update is dropped
        N = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
        conv_state = torch.zeros(N, x.shape[2], max(weight.shape[1] - 1, 1), device=x.device)
    return torch.ops.aura.causal_conv1d(x, weight, bias, conv_state, cu_seqlens, activation)


@_debug.validated
def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, state_indices=None):
    """The decode step of :func:`causal_conv1d`: new tokens continue each sequence from its state row.

    Sequence n reads ``conv_state[state_indices[n]]`` (row n without indices) as its left context,
    and the row is rolled in place: it ends with the new inputs. Index -1 skips the sequence (its
    outputs 0, the pool untouched). Several tokens per sequence (speculative decoding) run in order.

    Args:
        x: ``[N, C]`` (one token per sequence) or ``[N, L, C]``, fp16, bf16 or fp32, unit stride over C.
        conv_state: the pool ``[P, C, S]`` float, ``S >= max(W - 1, 1)``, updated in place through its
            strides (any but a zero one: vLLM's ``[P, W - 1, C]`` pool passes transposed).
        weight: ``[C, W]`` float taps, ``1 <= W <= 8``.
        bias: ``[C]`` float, or None.
        activation: None, or ``"silu"`` (``"swish"``).
        state_indices: ``[N]`` int32 pool rows, distinct, -1 = skip; or None (row n).

    Returns:
        ``y`` shaped like x, in x's dtype.

    Raises:
        ValueError: bad dtype, rank, device, stride or shapes; ``state_indices`` out of range or
            duplicated (values: on the CPU; on CUDA / MPS under ``TORCH_AURA_DEBUG=1``).

    Example:
        >>> import torch, torch_aura
        >>> x, weight = torch.randn(2, 7, 8), torch.randn(8, 4)
        >>> state = torch.zeros(2, 8, 4)
        >>> _ = torch_aura.causal_conv1d(x[:, :6], weight, conv_state=state)   # prefill: 6 tokens
        >>> y6 = torch_aura.causal_conv1d_update(x[:, 6], state, weight)         # decode: the 7th
        >>> torch.allclose(y6, torch_aura.causal_conv1d(x, weight)[:, 6], atol=1e-5)
        True
    """
    return checked_call(_checks.causal_conv1d_update, torch.ops.aura.causal_conv1d_update,
                        x, conv_state, weight, bias, activation, state_indices)


class GdnWarmup(NamedTuple):
    """What :func:`gdn_warmup` did: ``calls`` made, tuning ``keys_timed`` (0 where a tuned table
    held every decision), wall ``seconds``."""

    calls: int
    keys_timed: int
    seconds: float


def gdn_warmup(num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int, dtype: torch.dtype,
               device, *, varlen: bool = True, initial_state: bool = True, use_qk_l2norm: bool = True,
               state_v_first: bool = False, conv_width: int | None = None) -> GdnWarmup:
    """Compile and tune the GDN kernels for every plan of one head configuration, before serving.

    The CUDA kernels never recompile for a new prompt length or batch, but a head configuration has
    a few *plans* (fixed length or packed, the serial or the sequence-parallel state pass, the pass
    beside w/u or after it, few or many chunks per SM, the decode step's two tile widths), each
    compiled and tuned at its first call: seconds, which a server would otherwise pay at the first
    prompt that selects a plan. This visits them all with small calls (a few seconds with Triton's
    disk cache warm and a tuned table for the GPU; minutes on a GPU that has neither, once: the
    decisions persist, see README "Backends and switches"). Pass the flags the model's calls use.

    Args:
        num_k_heads: key heads H.
        num_v_heads: value heads HV, a multiple of H.
        head_k_dim, head_v_dim: K and V, in 1..256.
        dtype: the q / k / v dtype (fp16, bf16 or fp32).
        device: where the model runs; anything but a CUDA device with the Triton kernels does nothing.
        varlen: also prepare packed (``cu_seqlens``) prefills.
        initial_state: prefills carry an initial state (transformers' GDN layers do).
        use_qk_l2norm: q and k are L2-normalised in the kernel (transformers' GDN layers: yes).
        state_v_first: states are ``[N, HV, V, K]``.
        conv_width: also prepare the front end (:func:`causal_conv1d`, :func:`causal_conv1d_update`)
            for the layers' ``q | k | v`` conv of this many taps (Qwen3-Next: 4), as transformers'
            GDN layers call it; None leaves it out.

    Returns:
        A :class:`GdnWarmup`.

    Example:
        >>> import torch, torch_aura
        >>> torch_aura.gdn_warmup(16, 32, 128, 128, torch.bfloat16, "cpu")  # no GPU kernel to prepare
        GdnWarmup(calls=0, keys_timed=0, seconds=0.0)
    """
    from .. import backends

    device = torch.device(device)
    if device.type != "cuda" or not backends.has_kernel("gdn_chunk", "cuda"):
        return GdnWarmup(0, 0, 0.0)
    from ..triton_kernels.gdn import warmup

    start = time.perf_counter()
    with torch.inference_mode():
        calls, timed = warmup.run(num_k_heads, num_v_heads, head_k_dim, head_v_dim, dtype, device, varlen,
                                  initial_state, use_qk_l2norm, state_v_first)
        if conv_width is not None:
            channels = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim  # q | k | v
            calls += warmup.run_conv(channels, conv_width, dtype, device, varlen)
    return GdnWarmup(calls, timed, time.perf_counter() - start)
