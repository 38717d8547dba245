"""Input checks and output specs of the Gated DeltaNet family (gdn.md; rules in common.py).

Metadata only: these run in the fake under ``torch.compile`` with symbolic sizes, so they compare
sizes (guards) but never read values. Data-dependent checks (``cu_seqlens`` monotone and ending at
T, ``chunk_indices`` matching ``cu_seqlens``, ``state_indices`` in range and unique) live in
``torch_aura/reference/gdn.py``, which reads the values anyway.

The front end (ops.md §3b): the causal conv ``x [B, T, C]`` token-major, ``weight [C, W]``,
``conv_state [N, C, S]`` with ``S >= W - 1``.

Shapes (gdn.md §0): q, k ``[B, T, H, K]``; v ``[B, T, HV, V]`` with ``HV % H == 0``; g, beta,
g_cum ``[B, T, HV]``; states ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``);
``N = B`` or ``len(cu_seqlens) - 1`` (then ``B == 1``).
"""

from __future__ import annotations

import torch

from . import common as c

BT = 64  # chunk size of the chunked algorithm (fixed: kernels and Ai's last dim depend on it)
MAX_HEAD_DIM = 256  # fwd_h keeps a K x BV state in registers as up to four 64-row blocks
MAX_CONV_WIDTH = 8  # causal conv taps W: the kernels unroll them (Qwen3-Next uses 4)
ACTIVATIONS = (None, "silu", "swish")  # transformers' names: "swish" is SiLU


def _head_dim(arg: str, size, which: str) -> None:
    if not (1 <= size <= MAX_HEAD_DIM):
        c.fail(arg, f"head dim {which} (last dim) in 1..{MAX_HEAD_DIM}", size)


def _float(arg: str, t, ndim: int):
    return c.tensor(arg, t, ndim=ndim, dtypes=c.FLOATS, unit_last_stride=True)


def _heads(H, HV, arg: str = "v") -> None:
    # value head hv reads key head hv // (HV / H): more q/k heads than v heads is not supported
    c.divides(arg, HV, H, "HV (value heads)", "H (q/k heads)")


def _varlen(B, T, cu_seqlens, chunk_indices, main: str, *, need_chunk_indices: bool = False):
    """Validate the varlen metadata; returns ``(N, NT)``, ``NT`` = number of chunks (None if unknown)."""
    c.optional("cu_seqlens", cu_seqlens, ndim=1, dtypes=c.INDEX_DTYPES, contiguous=True)
    c.optional("chunk_indices", chunk_indices, ndim=2, dtypes=(torch.int32,), contiguous=True)
    if cu_seqlens is None:
        if chunk_indices is not None:
            c.fail("chunk_indices", "None when cu_seqlens is None (fixed-length chunks need no index)",
                   f"a tensor of shape {tuple(chunk_indices.shape)}")
        return B, (T + BT - 1) // BT
    if B != 1:
        c.fail(main, "batch size B == 1 when cu_seqlens is given (varlen packs sequences along T)",
               f"B = {B}")
    if cu_seqlens.shape[0] < 1:
        c.fail("cu_seqlens", "shape [N+1] with N >= 0 (at least the leading 0)", tuple(cu_seqlens.shape))
    N = cu_seqlens.shape[0] - 1
    if chunk_indices is None:
        if need_chunk_indices:
            c.fail("chunk_indices", "a [NT_total, 2] int32 tensor when cu_seqlens is given (h's shape "
                   "needs NT; build it with torch_aura.gdn_chunk_indices(cu_seqlens))", None)
        return N, None
    c.dim("chunk_indices", chunk_indices, 1, 2, "(sequence id, chunk index in sequence)")
    return N, chunk_indices.shape[0]


def _state_dims(K, V, state_v_first: bool) -> tuple:
    return (V, K) if state_v_first else (K, V)


def _state(arg: str, t, N, HV, K, V, state_v_first: bool, what: str) -> None:
    _float(arg, t, 4)
    layout = "[N, HV, V, K] (state_v_first)" if state_v_first else "[N, HV, K, V]"
    c.shape(arg, t, (N, HV, *_state_dims(K, V, state_v_first)), f"{layout}, {what}")


def _k_v(k, v, k_name: str = "k", v_name: str = "v"):
    """A key-like ``[B, T, H, K]`` and a value-like ``[B, T, HV, V]`` tensor (v, u or v_new) of one
    dtype, K, V <= 256, HV % H == 0; returns ``(B, T, H, HV, K, V)``."""
    _float(k_name, k, 4)
    B, T, H, K = k.shape
    _float(v_name, v, 4)
    c.shape(v_name, v, (B, T, None, None), f"[B, T, HV, V], B and T of {k_name}")
    HV, V = v.shape[2], v.shape[3]
    c.same_dtype(**{k_name: k, v_name: v})
    _head_dim(k_name, K, "K")
    _head_dim(v_name, V, "V")
    _heads(H, HV, v_name)
    return B, T, H, HV, K, V


def _qkv_g_beta(q, k, v, g, beta):
    """The common input block of gdn_chunk and gdn_recurrent; returns (B, T, H, HV, K, V)."""
    _float("q", q, 4)
    _float("k", k, 4)
    c.shape("k", k, tuple(q.shape), "the shape of q")
    _float("v", v, 4)
    c.same_dtype(q=q, k=k, v=v)  # named after q, the op's main input
    B, T, H, HV, K, V = _k_v(k, v)
    _float("g", g, 3)
    c.shape("g", g, (B, T, HV), "[B, T, HV]")
    _float("beta", beta, 3)
    c.shape("beta", beta, (B, T, HV), "[B, T, HV]")
    return B, T, H, HV, K, V


def _g_cum(g_cum, B, T, HV) -> None:
    # produced by gdn_chunk_cumsum: always fp32 (natural-log units)
    c.tensor("g_cum", g_cum, ndim=3, dtypes=(torch.float32,), unit_last_stride=True)
    c.shape("g_cum", g_cum, (B, T, HV), "[B, T, HV]")


def gdn_chunk(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, chunk_indices=None,
              use_qk_l2norm=False, state_v_first=False) -> list[c.TensorSpec]:
    B, T, H, HV, K, V = _qkv_g_beta(q, k, v, g, beta)
    N, _ = _varlen(B, T, cu_seqlens, chunk_indices, "q")
    if initial_state is not None:
        _state("initial_state", initial_state, N, HV, K, V, state_v_first, "one state per sequence")
    c.same_device(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, cu_seqlens=cu_seqlens,
                  chunk_indices=chunk_indices)
    return [c.TensorSpec((B, T, HV, V), q.dtype, q.device),
            c.TensorSpec((N, HV, *_state_dims(K, V, state_v_first)), torch.float32, q.device)]


def gdn_chunk_cumsum(g, cu_seqlens=None, chunk_indices=None) -> list[c.TensorSpec]:
    _float("g", g, 3)
    B, T, HV = g.shape
    _varlen(B, T, cu_seqlens, chunk_indices, "g")
    c.same_device(g=g, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
    return [c.TensorSpec((B, T, HV), torch.float32, g.device)]


def gdn_kkt_solve(k, g_cum, beta, cu_seqlens=None, chunk_indices=None) -> list[c.TensorSpec]:
    _float("k", k, 4)
    B, T, H, K = k.shape
    _head_dim("k", K, "K")
    c.tensor("g_cum", g_cum, ndim=3)
    HV = g_cum.shape[2]
    _g_cum(g_cum, B, T, HV)
    _heads(H, HV, "g_cum")
    _float("beta", beta, 3)
    c.shape("beta", beta, (B, T, HV), "[B, T, HV], HV of g_cum")
    _varlen(B, T, cu_seqlens, chunk_indices, "k")
    c.same_device(k=k, g_cum=g_cum, beta=beta, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
    return [c.TensorSpec((B, T, HV, BT), k.dtype, k.device)]


def gdn_recompute_w_u(k, v, beta, Ai, g_cum, cu_seqlens=None, chunk_indices=None) -> list[c.TensorSpec]:
    B, T, H, HV, K, V = _k_v(k, v)
    _float("beta", beta, 3)
    c.shape("beta", beta, (B, T, HV), "[B, T, HV]")
    _float("Ai", Ai, 4)
    c.shape("Ai", Ai, (B, T, HV, BT), f"[B, T, HV, {BT}] from gdn_kkt_solve")
    c.same_dtype(k=k, Ai=Ai)
    _g_cum(g_cum, B, T, HV)
    _varlen(B, T, cu_seqlens, chunk_indices, "k")
    c.same_device(k=k, v=v, beta=beta, Ai=Ai, g_cum=g_cum, cu_seqlens=cu_seqlens,
                  chunk_indices=chunk_indices)
    return [c.TensorSpec((B, T, HV, K), k.dtype, k.device),
            c.TensorSpec((B, T, HV, V), v.dtype, k.device)]


def gdn_fwd_h(k, w, u, g_cum, initial_state=None, cu_seqlens=None, chunk_indices=None,
              state_v_first=False) -> list[c.TensorSpec]:
    B, T, H, HV, K, V = _k_v(k, u, v_name="u")
    _float("w", w, 4)
    c.shape("w", w, (B, T, HV, K), "[B, T, HV, K]")
    c.same_dtype(k=k, w=w, u=u)
    _g_cum(g_cum, B, T, HV)
    N, NT = _varlen(B, T, cu_seqlens, chunk_indices, "k", need_chunk_indices=True)
    if initial_state is not None:
        _state("initial_state", initial_state, N, HV, K, V, state_v_first, "one state per sequence")
    c.same_device(k=k, w=w, u=u, g_cum=g_cum, initial_state=initial_state, cu_seqlens=cu_seqlens,
                  chunk_indices=chunk_indices)
    sd = _state_dims(K, V, state_v_first)
    return [c.TensorSpec((B, NT, HV, *sd), k.dtype, k.device),
            c.TensorSpec((B, T, HV, V), u.dtype, k.device),
            c.TensorSpec((N, HV, *sd), torch.float32, k.device)]


def gdn_fwd_o(q, k, v_new, h, g_cum, scale=None, cu_seqlens=None, chunk_indices=None,
              state_v_first=False) -> list[c.TensorSpec]:
    B, T, H, HV, K, V = _k_v(q, v_new, k_name="q", v_name="v_new")
    _float("k", k, 4)
    c.shape("k", k, (B, T, H, K), "the shape of q")
    _g_cum(g_cum, B, T, HV)
    _, NT = _varlen(B, T, cu_seqlens, chunk_indices, "q")
    _float("h", h, 5)
    # without chunk_indices a varlen NT is only known from the data: the reference checks it
    c.shape("h", h, (B, NT, HV, *_state_dims(K, V, state_v_first)),
            "[B, NT, HV, V, K] (state_v_first)" if state_v_first else "[B, NT, HV, K, V]")
    c.same_dtype(q=q, k=k, v_new=v_new, h=h)
    c.same_device(q=q, k=k, v_new=v_new, h=h, g_cum=g_cum, cu_seqlens=cu_seqlens,
                  chunk_indices=chunk_indices)
    return [c.TensorSpec((B, T, HV, V), q.dtype, q.device)]


def gdn_recurrent(q, k, v, g, beta, state, state_indices=None, cu_seqlens=None, scale=None,
                  use_qk_l2norm=False, state_v_first=False) -> list[c.TensorSpec]:
    B, T, H, HV, K, V = _qkv_g_beta(q, k, v, g, beta)
    N, _ = _varlen(B, T, cu_seqlens, None, "q")
    _float("state", state, 4)
    layout = "[P, HV, V, K] (state_v_first)" if state_v_first else "[P, HV, K, V]"
    c.shape("state", state, (None, HV, *_state_dims(K, V, state_v_first)), f"a state pool {layout}")
    if state_indices is None:
        # sequence n uses pool row n
        if state.shape[0] < N:
            c.fail("state", f"at least N = {N} pool rows (sequence n uses row n without state_indices)",
                   f"{state.shape[0]} rows")
    else:
        c.tensor("state_indices", state_indices, ndim=1, dtypes=(torch.int32,), contiguous=True)
        c.shape("state_indices", state_indices, (N,), "one pool row per sequence, -1 = skip")
    c.same_device(q=q, k=k, v=v, g=g, beta=beta, state=state, state_indices=state_indices,
                  cu_seqlens=cu_seqlens)
    return [c.TensorSpec((B, T, HV, V), q.dtype, q.device)]


# ------------------------------------------------------------------ the front end (ops.md §3b)
def _conv_params(x, weight, bias, conv_state, activation, C: int, rows_name: str, rows) -> int:
    """weight ``[C, W]``, bias ``[C]``, conv_state ``[rows, C, S >= W - 1]``, the activation; returns W."""
    c.tensor("weight", weight, ndim=2, dtypes=c.FLOATS, unit_last_stride=True)
    c.shape("weight", weight, (C, None), "[C, W]: one filter of W taps per channel of x")
    W = weight.shape[1]
    if not 1 <= W <= MAX_CONV_WIDTH:
        c.fail("weight", f"W (taps, weight.shape[1]) in 1..{MAX_CONV_WIDTH}", W)
    c.optional("bias", bias, ndim=1, dtypes=c.FLOATS)
    if bias is not None:
        c.shape("bias", bias, (C,), "one per channel of x")
    if conv_state is not None:  # any strides: vLLM's pool is [P, S, C], handed over transposed
        c.tensor("conv_state", conv_state, ndim=3, dtypes=c.FLOATS, distinct=True)
        c.shape("conv_state", conv_state, (rows, C, None), f"[{rows_name}, C, S]")
        if conv_state.shape[2] < max(W - 1, 1):
            c.fail("conv_state", f"S = shape[2] >= max(W - 1, 1) = {max(W - 1, 1)} inputs of left context",
                   conv_state.shape[2])
    if activation not in ACTIVATIONS:
        c.fail("activation", f"one of {list(ACTIVATIONS)}", repr(activation))
    c.same_device(x=x, weight=weight, bias=bias, conv_state=conv_state)
    return W


def causal_conv1d(x, weight, bias=None, conv_state=None, cu_seqlens=None, activation=None) -> list[c.TensorSpec]:
    _float("x", x, 3)
    B, T, C = x.shape
    N, _ = _varlen(B, T, cu_seqlens, None, "x")
    _conv_params(x, weight, bias, conv_state, activation, C, "N (sequences)", N)
    c.same_device(x=x, cu_seqlens=cu_seqlens)
    return [c.TensorSpec((B, T, C), x.dtype, x.device)]


def _pool_rows(x, conv_state, state_indices, N: int) -> None:
    """A state pool's rows for N sequences: ``state_indices [N]`` int32 (-1 = skip), else row n for sequence n."""
    if state_indices is None:
        if conv_state.shape[0] < N:  # sequence n uses pool row n
            c.fail("conv_state", f"at least N = {N} pool rows (sequence n uses row n without state_indices)",
                   f"{conv_state.shape[0]} rows")
    else:
        c.tensor("state_indices", state_indices, ndim=1, dtypes=(torch.int32,), contiguous=True)
        c.shape("state_indices", state_indices, (N,), "one pool row per sequence, -1 = skip")
        c.same_device(x=x, state_indices=state_indices)


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, state_indices=None) -> list[c.TensorSpec]:
    c.tensor("x", x, ndim=(2, 3), dtypes=c.FLOATS, unit_last_stride=True)
    N, C = x.shape[0], x.shape[-1]
    c.tensor("conv_state", conv_state, ndim=3, dtypes=c.FLOATS)
    _conv_params(x, weight, bias, conv_state, activation, C, "P (state pool rows)", None)
    _pool_rows(x, conv_state, state_indices, N)
    return [c.TensorSpec(tuple(x.shape), x.dtype, x.device)]


def causal_conv1d_pool(x, weight, bias, conv_state, cu_seqlens, activation, state_indices,
                       has_state) -> list[c.TensorSpec]:
    """The prefill conv over a serving engine's state pool (the CUDA launcher's ``state_indices=`` form):
    ``conv_state [P, C, S]`` at ``state_indices [N]``, the old row read where ``has_state [N]`` (bool) says."""
    _float("x", x, 3)
    B, T, C = x.shape
    N, _ = _varlen(B, T, cu_seqlens, None, "x")
    c.tensor("conv_state", conv_state, ndim=3, dtypes=c.FLOATS)
    _conv_params(x, weight, bias, conv_state, activation, C, "P (state pool rows)", None)
    _pool_rows(x, conv_state, state_indices, N)
    if has_state is not None:
        c.tensor("has_state", has_state, ndim=1, dtypes=(torch.bool,), contiguous=True)
        c.shape("has_state", has_state, (N,), "one flag per sequence: read its state row")
    c.same_device(x=x, cu_seqlens=cu_seqlens, has_state=has_state)
    return [c.TensorSpec((B, T, C), x.dtype, x.device)]
