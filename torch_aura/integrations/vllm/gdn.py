"""Opt-in: vLLM's Gated DeltaNet layers (Qwen3-Next, Qwen3.5) run on torch_aura's GDN ops.

``TORCH_AURA_VLLM_GDN=1`` in the environment of the process that starts vLLM (its workers inherit
it) makes :func:`install` replace, in every vLLM process, the kernels that
``vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py`` calls (the same module and the same
names in vLLM 0.24 and 0.32) with adapters onto ``torch.ops.aura``:

==============================================  ===============================================
vLLM's function (module global)                 served by
==============================================  ===============================================
``causal_conv1d_fn`` (prefill conv)             ``aura.causal_conv1d`` on the gathered rows
``causal_conv1d_update`` (decode conv)          ``aura.causal_conv1d_update`` on the pool
``fused_post_conv_prep`` (split, l2norm, gates) torch, the fp32 gates in one launch (``gdn/gates.py``)
``fla_chunk_gated_delta_rule`` (prefill)        ``aura.gdn_chunk`` (``state_v_first``)
``fused_sigmoid_gating_delta_rule_update``      ``aura.gdn_recurrent`` on the pool
``fused_recurrent_gated_delta_rule_packed_decode``  ``aura.gdn_recurrent`` on the pool
==============================================  ===============================================

``ChunkGatedDeltaRule`` is pinned to its ``forward_native`` method (the one that calls
``fla_chunk_gated_delta_rule``; vLLM would otherwise pick FlashInfer on Hopper), and on vLLM's CPU
platform the layer runs its generic ``forward_cuda`` path (vLLM's CPU path is its own bf16-only op)
so that the routed functions serve it there too (its conv weight left as loaded: vLLM packs it for its own
CPU op on some hosts).

vLLM's layouts, served as they are: the SSM state pool ``[slots, HV, V, K]`` (our ``state_v_first``),
one slot per request in ``state_indices`` (``<= 0``: vLLM's null block or padding, skipped); the conv
pool ``[slots, C, W - 1]`` (a transposed view in vLLM's default layout); packed varlen tokens with
``query_start_loc`` offsets. Nothing here syncs with the host; slots are gathered and scattered by
index on the device.

Refused when vLLM builds its engine configuration (:func:`check_engine_config`, a named
:class:`GdnRefusal`): speculative decoding (multi-token state layouts: ``spec_state_indices [N, T]``,
``num_accepted_tokens``); linear-attention head dims above 256. A call whose arguments only show
at run time as unsupported (an extra vLLM feature such as the prefix-caching block indices) goes to
vLLM's own function, with the reason logged once per reason (:data:`FALLBACKS` counts them).
:data:`CALLS` counts the calls the adapters serve and :data:`HOST_NS` sums their host time; :data:`SLOW_CALLS`
and :data:`SLOW_NS` count those of them over ``SLOW_CALL_NS`` (a compile, a sync) apart from the steady ones.

At engine start, after vLLM's own kernel warm-up (the hook points are in ``_compat.py``),
:func:`warm_up` calls every routed adapter the layers call, on small inputs shaped as the first GDN
layer's (its dtypes, heads, conv weight, and state pools' dtypes, strides and alignment: scratch pools,
never the real ones), over the prefill lengths and decode batches that select the kernels' plans
(``triton_kernels/gdn/warmup.py``) within vLLM's token and sequence budgets, so no Triton kernel compiles
or tunes at the first requests. :data:`WARMED` counts its calls (they are not in :data:`CALLS`), and one
INFO line says what was warmed and how long it took.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import sys
import time

import torch
import torch.nn.functional as F

from ... import _env as _table
from ..._checks.gdn import MAX_HEAD_DIM
from ._env import GDN_ENV

MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
ROUTED = ("causal_conv1d_fn", "causal_conv1d_update", "fused_post_conv_prep", "fla_chunk_gated_delta_rule",
          "fused_sigmoid_gating_delta_rule_update", "fused_recurrent_gated_delta_rule_packed_decode")
L2NORM_EPS = 1e-6  # as vLLM's kernels: x / sqrt(sum x^2 + eps)

_log = logging.getLogger("vllm.torch_aura")
CALLS: collections.Counter = collections.Counter()  # adapter name -> eager calls served by torch_aura
FALLBACKS: collections.Counter = collections.Counter()  # "adapter: reason" -> calls sent to vLLM's own
HOST_NS: collections.Counter = collections.Counter()  # adapter name -> host ns of the calls torch_aura served
SLOW_CALL_NS = 2_000_000  # a served call longer than this on the host is counted apart as well
SLOW_CALLS: collections.Counter = collections.Counter()  # adapter name -> served calls over SLOW_CALL_NS
SLOW_NS: collections.Counter = collections.Counter()  # adapter name -> their host ns
WARMED: collections.Counter = collections.Counter()  # adapter name -> calls made by the engine-start warm-up
_originals: dict[str, object] = {}


class GdnRefusal(ValueError):
    """A configuration ``TORCH_AURA_VLLM_GDN=1`` cannot serve; the message says what and how to proceed."""


def enabled() -> bool:
    """Whether ``TORCH_AURA_VLLM_GDN`` asks for the routing (``1``; ``0`` or unset: off)."""
    return _table.get(GDN_ENV)


# ------------------------------------------------------------------------------- refusals
def refusals(*, speculative_method: str | None = None, head_k_dim: int | None = None,
             head_v_dim: int | None = None) -> list[str]:
    """One sentence per feature the routing cannot serve (empty: it can)."""
    out = []
    unset = f"unset {GDN_ENV} to run vLLM's own GDN kernels"
    if speculative_method is not None:
        out.append(f"speculative decoding ({speculative_method!r}): its GDN steps keep one state slot per "
                   f"draft token (spec_state_indices [N, T], num_accepted_tokens), which torch_aura's "
                   f"gdn_recurrent / causal_conv1d_update do not serve; drop --speculative-config, or {unset}")
    for name, dim in (("linear_key_head_dim", head_k_dim), ("linear_value_head_dim", head_v_dim)):
        if dim is not None and not 1 <= dim <= MAX_HEAD_DIM:
            out.append(f"{name} {dim}: torch_aura's GDN ops take head dims 1..{MAX_HEAD_DIM}; {unset}")
    return out


def check_engine_config(vllm_config) -> None:
    """Refuse, before any engine process starts, what the routing cannot serve (:class:`GdnRefusal`)."""
    model = vllm_config.model_config
    if model is None:
        return
    text = model.hf_text_config
    if getattr(text, "linear_key_head_dim", None) is None:
        _log.info("torch_aura: %s=1 has no effect on %s (no gated-delta-rule layers)", GDN_ENV,
                  getattr(text, "model_type", "this model"))
        return
    spec = vllm_config.speculative_config
    reasons = refusals(speculative_method=None if spec is None else (spec.method or "unknown"),
                       head_k_dim=text.linear_key_head_dim, head_v_dim=getattr(text, "linear_value_head_dim", None))
    if reasons:
        msg = (f"torch_aura's GDN routing ({GDN_ENV}=1) cannot serve this configuration:\n"
               + "\n".join(f"  - {r}" for r in reasons))
        _log.error("%s", msg)
        raise GdnRefusal(msg)


# ------------------------------------------------------------------------------- helpers
def _fallback(name: str, reason: str, *args, **kwargs):
    """Send the call to vLLM's own function, logging the reason once per (function, reason)."""
    key = f"{name}: {reason}"
    if key not in FALLBACKS:
        _log.warning("torch_aura: %s: %s; this call runs vLLM's own %s", name, reason, name)
    FALLBACKS[key] += 1
    return _originals[name](*args, **kwargs)


def _count(name: str) -> None:
    if not torch.compiler.is_compiling():
        CALLS[name] += 1


def _timed(adapter):
    """The adapter, adding the host time of each call it serves (not its fallbacks) to :data:`HOST_NS`:
    outside full CUDA graphs vLLM runs these eagerly, so their Python is part of every such step."""
    name = adapter.__name__

    @functools.wraps(adapter)
    def timed(*args, **kwargs):
        if torch.compiler.is_compiling():
            return adapter(*args, **kwargs)
        served, start = CALLS[name], time.perf_counter_ns()
        out = adapter(*args, **kwargs)
        if CALLS[name] != served:
            took = time.perf_counter_ns() - start
            HOST_NS[name] += took
            if took > SLOW_CALL_NS:
                SLOW_CALLS[name] += 1
                SLOW_NS[name] += took
        return out
    return timed


def _slots(indices: torch.Tensor, n: int, *invalid: int | None) -> torch.Tensor:
    """vLLM's per-request slots -> our int32 pool rows, -1 where vLLM skips (padding, the null block).
    Two kernels in the usual case (invalid: negatives and 0): once per GDN layer and step, in every adapter."""
    idx = indices[:n]
    keep = idx > 0 if 0 in invalid else idx >= 0  # negative invalid values (padding) are below 0 already
    for value in invalid:
        if value is not None and value > 0:
            keep = keep & (idx != value)
    rows = torch.where(keep, idx, -1)
    return rows if rows.dtype == torch.int32 else rows.to(torch.int32)


def _too_wide(K: int, V: int) -> str | None:
    """Why our GDN ops cannot take these head dims (None: they can)."""
    return None if K <= MAX_HEAD_DIM and V <= MAX_HEAD_DIM else f"head dims K={K}, V={V} above {MAX_HEAD_DIM}"


def _activation(activation):
    if activation in (None, False):
        return None
    if activation is True or activation in ("silu", "swish"):
        return "silu"
    raise ValueError(activation)


def _launchers_here(t: torch.Tensor) -> bool:
    """Whether our Triton launchers can be called directly on ``t``: a CUDA tensor where the kernels exist,
    outside a torch.compile trace (which must see the registered ops)."""
    from ... import backends

    return t.is_cuda and not torch.compiler.is_compiling() and backends.has_kernel("gdn_recurrent", "cuda")


def _direct(t: torch.Tensor, slots: torch.Tensor | None) -> bool:
    """Whether an adapter calls our Triton launcher itself, handing it vLLM's ``slots`` as they are (the
    launcher-only ``null=`` and pool arguments spare a translation kernel, a copy or a gather per layer and
    step): :func:`_launchers_here`, and int32 slots of unit stride; else the registered op."""
    return (_launchers_here(t) and slots is not None and slots.dtype == torch.int32
            and slots.stride(-1) == 1)


def _fused_gates(a, b) -> bool:
    """Where the gates take the Triton launch: CUDA tensors of unit last stride, outside a torch.compile trace."""
    return a.is_cuda and a.stride(-1) == 1 and b.stride(-1) == 1 and not torch.compiler.is_compiling()


def _gates(a, b, A_log, dt_bias, beta: float = 1.0, threshold: float = 20.0, slots=None, n: int = 0):
    """vLLM's gating in fp32: ``(g, beta, rows)``, ``g = -exp(A_log) * softplus(a + dt_bias)``,
    ``beta = sigmoid(b)``, and given vLLM's ``slots`` (one per gate row: ``n`` of them), our pool rows
    (:func:`_slots` with vLLM's null slot 0), else None. On a GPU one Triton launch
    (``triton_kernels/gdn/gates.py``) instead of eight elementwise kernels, and ten with the rows: once per
    GDN layer and step."""
    if _fused_gates(a, b):
        from ...triton_kernels.gdn.gates import gdn_gates

        fused = slots is not None and a.numel() == n * a.shape[-1]  # one row per request: the decode step
        g, beta_t, rows = gdn_gates(a, b, A_log, dt_bias, beta, threshold, slots[:n] if fused else None, 0)
        return g, beta_t, (rows if fused else None if slots is None else _slots(slots, n, 0))
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float(), beta=beta, threshold=threshold)
    return g, torch.sigmoid(b.float()), None if slots is None else _slots(slots, n, 0)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum x^2 + eps)`` in fp32, rounded once to x's dtype, in two passes over x (the norms, the
    scaled copy): it runs over every prefill's q and k."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
    inv = norm.square_().add_(L2NORM_EPS).rsqrt_()
    return torch.mul(x, inv, out=torch.empty(x.shape, dtype=x.dtype, device=x.device))  # fp32 math, one rounding


# ------------------------------------------------------------------------------- adapters
@_timed
def causal_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None, has_initial_state=None,
                     activation="silu", pad_slot_id=-1, null_block_id=0, block_idx_first_scheduled_token=None,
                     block_idx_last_scheduled_token=None, initial_state_idx=None, num_computed_tokens=None,
                     block_size_to_align=0, metadata=None, validate_data=False):
    """vLLM's prefill conv: ``x [C, T]`` (channels-first view of packed tokens), the pool
    ``conv_states [slots, C, W - 1]``, sequence n = tokens ``[qsl[n], qsl[n+1])`` in slot
    ``cache_indices[n]`` (its old row read only where ``has_initial_state[n]``); returns ``[C, T]``."""
    name = "causal_conv1d_fn"
    args = (x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state, activation,
            pad_slot_id, null_block_id, block_idx_first_scheduled_token, block_idx_last_scheduled_token,
            initial_state_idx, num_computed_tokens, block_size_to_align, metadata, validate_data)
    if any(t is not None for t in (block_idx_first_scheduled_token, block_idx_last_scheduled_token,
                                   initial_state_idx, num_computed_tokens)):
        return _fallback(name, "prefix-caching block indices (mamba cache mode 'all')", *args)
    if cache_indices is None or cache_indices.dim() != 1 or x.dim() != 2:
        return _fallback(name, "not the varlen layout (x [C, T], 1-D cache_indices)", *args)
    try:
        act = _activation(activation)
    except ValueError:
        return _fallback(name, f"activation {activation!r}", *args)
    _count(name)
    n = query_start_loc.shape[0] - 1
    xt = x.transpose(0, 1)  # [T, C]
    if xt.stride(-1) != 1:
        xt = xt.contiguous()
    if _direct(xt, cache_indices) and pad_slot_id < 0 and (has_initial_state is None or has_initial_state.dim() == 1):
        from ...triton_kernels.gdn.conv import causal_conv1d as launch

        # vLLM's pool served in place: its slots as they are (padding and its null slot skip in the kernels),
        # the old rows read where has_initial_state says; no gather or scatter around the conv
        has = None if has_initial_state is None else has_initial_state[:n].to(torch.bool).contiguous()
        null = -1 if null_block_id is None else null_block_id
        y = launch(xt[None], weight, bias, conv_states, query_start_loc, act, state_indices=cache_indices[:n],
                   has_state=has, null=null)[0]
        return y.transpose(0, 1)
    rows = _slots(cache_indices, n, pad_slot_id, null_block_id)
    valid = rows >= 0
    gather = rows.clamp(min=0).long()
    keep = valid if has_initial_state is None else valid & has_initial_state[:n].bool()
    old = conv_states[gather]  # a copy [n, C, W - 1] (vLLM's [slots, W - 1, C] pool is transposed: the op takes any)
    state = torch.where(keep[:, None, None], old, torch.zeros((), dtype=old.dtype, device=old.device))
    y = torch.ops.aura.causal_conv1d(xt[None], weight, bias, state, query_start_loc, act)[0]
    # skipped sequences (padding, the null block) write their slot's old row back: the null block 0
    # and padding never name a real request's slot
    conv_states[gather] = torch.where(valid[:, None, None], state, old)
    return y.transpose(0, 1)


@_timed
def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None,
                         num_accepted_tokens=None, query_start_loc=None, max_query_len=-1, null_block_id=0,
                         block_idx_last_scheduled_token=None, initial_state_idx=None, validate_data=False, **kw):
    """vLLM's decode conv: ``x [N, C]`` (one token per request) or ``[N, C, L]``, the pool
    ``conv_state [slots, C, W - 1]`` updated in place at ``conv_state_indices``; 0.32's ``out=``."""
    name = "causal_conv1d_update"
    out = kw.pop("out", None)

    def fallback(reason):
        extra = {} if out is None else {"out": out}
        return _fallback(name, reason, x, conv_state, weight, bias, activation, conv_state_indices,
                         num_accepted_tokens, query_start_loc, max_query_len, null_block_id,
                         block_idx_last_scheduled_token, initial_state_idx, validate_data, **extra, **kw)

    if kw:
        return fallback(f"arguments {sorted(kw)} of a newer vLLM")
    if num_accepted_tokens is not None or query_start_loc is not None:
        return fallback("speculative-decoding layout (num_accepted_tokens / query_start_loc)")
    if block_idx_last_scheduled_token is not None or initial_state_idx is not None:
        return fallback("prefix-caching block indices (mamba cache mode 'all')")
    try:
        act = _activation(activation)
    except ValueError:
        return fallback(f"activation {activation!r}")
    _count(name)
    tokens = x if x.dim() == 2 else x.transpose(1, 2)  # vLLM's 3-D x is [N, C, L]; ours [N, L, C]
    if tokens.stride(-1) != 1:
        tokens = tokens.contiguous()
    n = tokens.shape[0]
    # vLLM's default pool is [slots, W - 1, C] seen through a transpose: the op rolls it in place at its strides
    if _direct(tokens, conv_state_indices):  # vLLM's slots as they are: its null slot skips in the kernel
        from ...triton_kernels.gdn.conv import causal_conv1d_update as launch

        y = launch(tokens, conv_state, weight, bias, act, conv_state_indices[:n], null=null_block_id)
    else:
        rows = (torch.arange(n, dtype=torch.int32, device=x.device) if conv_state_indices is None
                else _slots(conv_state_indices, n, null_block_id))
        y = torch.ops.aura.causal_conv1d_update(tokens, conv_state, weight, bias, act, rows)
    if x.dim() == 3:
        y = y.transpose(1, 2)
    if out is not None:
        out.copy_(y)
        return out
    return y


@_timed
def fused_post_conv_prep(conv_output, a, b, A_log, dt_bias, num_k_heads, head_k_dim, head_v_dim,
                         apply_l2norm=True, output_g_exp=False):
    """Split the conv output ``[L, 2*H*K + HV*V]`` into contiguous ``q, k [L, H, K]``, ``v [L, HV, V]``
    (q, k l2-normalised and rounded to the input dtype), and the fp32 gates ``g, beta [L, HV]``. On a GPU one
    Triton launch (``gdn_post_conv``) instead of about fourteen kernels, at every prefill step and layer
    (``docs/gdn.md`` §6.1)."""
    _count("fused_post_conv_prep")
    L, HV = conv_output.shape[0], a.shape[-1]
    H, K, V = num_k_heads, head_k_dim, head_v_dim
    if _fused_gates(a, b) and conv_output.stride(-1) == 1:
        from ...triton_kernels.gdn.gates import gdn_post_conv

        return gdn_post_conv(conv_output, a, b, A_log, dt_bias, H, K, V, apply_l2norm, output_g_exp, L2NORM_EPS)
    q, k, v = conv_output.split([H * K, H * K, conv_output.shape[1] - 2 * H * K], dim=-1)
    q, k, v = q.reshape(L, H, K), k.reshape(L, H, K), v.reshape(L, HV, V).contiguous()
    if apply_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    g, beta, _ = _gates(a, b, A_log, dt_bias)
    return q.contiguous(), k.contiguous(), v, (torch.exp(g) if output_g_exp else g), beta


@_timed
def fla_chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, chunk_indices=None, chunk_offsets=None,
                               use_qk_l2norm_in_kernel=False, core_attn_out=None):
    """vLLM's chunked prefill: ``q, k [1, T, H, K]``, ``v [1, T, HV, V]``, ``g, beta [1, T, HV]``,
    ``initial_state [N, HV, V, K]`` (gathered by the caller); returns ``(o, final_state [N, HV, V, K])``."""
    name = "fla_chunk_gated_delta_rule"
    if reason := _too_wide(q.shape[-1], v.shape[-1]):
        return _fallback(name, reason, q, k, v, g, beta, scale,
                         initial_state, output_final_state, cu_seqlens, chunk_indices, chunk_offsets,
                         use_qk_l2norm_in_kernel, core_attn_out)
    _count(name)
    if chunk_indices is not None:  # vLLM's metadata: (sequence, chunk) pairs of 64-token chunks, as ours
        chunk_indices = chunk_indices.to(torch.int32) if chunk_indices.dim() == 2 else None
    o, final = torch.ops.aura.gdn_chunk(q, k, v, g, beta, scale, initial_state, cu_seqlens, chunk_indices,
                                        use_qk_l2norm_in_kernel, True)
    if core_attn_out is not None:
        flat = o.reshape(-1)
        core_attn_out.reshape(-1)[:flat.numel()].copy_(flat)
    return o, (final if output_final_state else None)


def _recurrent(q, k, v, g, beta, pool, rows, cu_seqlens, scale, use_qk_l2norm):
    return torch.ops.aura.gdn_recurrent(q, k, v, g, beta, pool, rows, cu_seqlens, scale, use_qk_l2norm, True)


def _rule_in_one_launch(q, k, v, a, b, A_log, dt_bias, pool, slots, n, cu_seqlens, scale, use_qk_l2norm, out=None):
    """On CUDA, the decode rule as vLLM's own kernels run it, in one launch: the gates made from ``a`` and ``b``
    in the kernel (softplus beta 1, threshold 20), vLLM's ``slots`` as they are (its null slot 0 skips there),
    o into ``out`` where given. Returns o, or None where that launch does not apply (then: the gates kernel
    with our rows, and the op)."""
    if not (_direct(q, slots) and (out is None or (out.is_contiguous() and out.dtype == q.dtype))):
        return None
    from ...triton_kernels.gdn.recurrent import gdn_recurrent as launch

    return launch(q, k, v, a, b, pool, slots[:n], cu_seqlens, scale, use_qk_l2norm, True,
                  out=None if out is None else out.view(v.shape), gates=(A_log, dt_bias), null=0)


@_timed
def fused_sigmoid_gating_delta_rule_update(A_log, a, b, dt_bias, q, k, v, beta=1.0, threshold=20.0, scale=None,
                                           initial_state=None, inplace_final_state=True, cu_seqlens=None,
                                           ssm_state_indices=None, num_accepted_tokens=None,
                                           use_qk_l2norm_in_kernel=False, is_kda=False):
    """vLLM's decode: gates from ``a, b [T, HV]``, ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``, the pool
    ``initial_state [slots, HV, V, K]`` updated in place at ``ssm_state_indices [N]`` (``<= 0``:
    skipped); returns ``(o [B, T, HV, V], the pool)``."""
    name = "fused_sigmoid_gating_delta_rule_update"
    args = (A_log, a, b, dt_bias, q, k, v, beta, threshold, scale, initial_state, inplace_final_state,
            cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel, is_kda)
    if num_accepted_tokens is not None or (ssm_state_indices is not None and ssm_state_indices.dim() != 1):
        return _fallback(name, "speculative-decoding layout (2-D ssm_state_indices / num_accepted_tokens)", *args)
    if is_kda:
        return _fallback(name, "per-channel (KDA) gates", *args)
    if not inplace_final_state or ssm_state_indices is None or initial_state is None:
        return _fallback(name, "not the in-place pool layout (inplace_final_state with ssm_state_indices)", *args)
    if reason := _too_wide(q.shape[-1], v.shape[-1]):
        return _fallback(name, reason, *args)
    _count(name)
    B, T, HV = v.shape[0], v.shape[1], v.shape[2]
    n = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    a, b = a.reshape(B, T, HV), b.reshape(B, T, HV)
    if beta == 1.0 and threshold == 20.0:  # the softplus the one-launch rule computes
        o = _rule_in_one_launch(q, k, v, a, b, A_log, dt_bias, initial_state, ssm_state_indices, n, cu_seqlens,
                                scale, use_qk_l2norm_in_kernel)
        if o is not None:
            return o, initial_state
    g, beta_t, rows = _gates(a, b, A_log, dt_bias, beta, threshold, ssm_state_indices, n)
    o = _recurrent(q, k, v, g, beta_t, initial_state, rows, cu_seqlens, scale, use_qk_l2norm_in_kernel)
    return o, initial_state


@_timed
def fused_recurrent_gated_delta_rule_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                                                   ssm_state_indices, use_qk_l2norm_in_kernel=False):
    """vLLM's packed decode: one token per request, ``mixed_qkv [N, 2*H*K + HV*V]``, ``a, b [N, HV]``,
    the pool ``initial_state [slots, HV, V, K]`` at ``ssm_state_indices [N]`` (``<= 0``: skipped, o 0),
    written into ``out [N, 1, HV, V]``; returns ``(out, the pool)``."""
    name = "fused_recurrent_gated_delta_rule_packed_decode"
    HV, V, K = initial_state.shape[-3:]
    if reason := _too_wide(K, V):
        return _fallback(name, reason, mixed_qkv, a, b, A_log, dt_bias,
                         scale, initial_state, out, ssm_state_indices, use_qk_l2norm_in_kernel)
    _count(name)
    N = mixed_qkv.shape[0]
    H = (mixed_qkv.shape[1] - HV * V) // (2 * K)
    q, k, v = mixed_qkv.split([H * K, H * K, HV * V], dim=-1)
    q, k, v = q.reshape(N, 1, H, K), k.reshape(N, 1, H, K), v.reshape(N, 1, HV, V)
    a, b = a.reshape(N, 1, HV), b.reshape(N, 1, HV)
    if _rule_in_one_launch(q, k, v, a, b, A_log, dt_bias, initial_state, ssm_state_indices, N, None, scale,
                           use_qk_l2norm_in_kernel, out) is None:
        g, beta, rows = _gates(a, b, A_log, dt_bias, slots=ssm_state_indices, n=N)
        out.copy_(_recurrent(q, k, v, g, beta, initial_state, rows, None, scale, use_qk_l2norm_in_kernel))
    return out, initial_state


# ------------------------------------------------------------------------------- engine-start warm-up
def _routed_layers(worker) -> list:
    """The worker's GDN layers that run on the routed functions (none unless :func:`install` patched them)."""
    module = sys.modules.get(MODULE)
    if module is None or not all(getattr(getattr(module, n, None), "_torch_aura", False) for n in ROUTED):
        return []
    layers = worker.vllm_config.compilation_config.static_forward_context.values()
    return [layer for layer in layers if isinstance(layer, module.QwenGatedDeltaNetAttention)]


def _pools(layer):
    """The layer's bound ``(conv pool [P, C, W - 1] as its forward sees it, SSM pool [P, HV, V, K])``, or None."""
    cache = getattr(layer, "kv_cache", None)
    if not isinstance(cache, (list, tuple)) or len(cache) < 2:
        return None
    conv, ssm = cache[0], cache[1]
    if not all(isinstance(t, torch.Tensor) and t.numel() > 0 for t in (conv, ssm)):
        return None
    return (conv if sys.modules[MODULE].is_conv_state_dim_first() else conv.transpose(-1, -2)), ssm


def _scratch(pool: torch.Tensor, rows: int) -> torch.Tensor:
    """Zeros of ``rows`` pool rows with ``pool``'s strides, dtype and 16-byte alignment class (all of which
    Triton specialises on), in memory of their own."""
    shape, stride = (rows, *pool.shape[1:]), pool.stride()
    shift = (pool.data_ptr() % 16) // pool.element_size()
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    flat = torch.zeros(shift + extent, dtype=pool.dtype, device=pool.device)
    return flat.as_strided(shape, stride, shift)


def _jit_kernels(device: torch.device) -> bool:
    """Whether the GDN ops run JIT-compiled kernels here (elsewhere one call per adapter is all there is to run)."""
    from ... import backends

    return device.type == "cuda" and backends.has_kernel("gdn_chunk", "cuda")


CONV_LENGTHS = (65, 3)  # the prefill conv's one call (it compiles once for any lengths): across a 64-token chunk


def _warmup_shapes(HV: int, V: int, device: torch.device, max_tokens: int,
                   max_seqs: int) -> tuple[list[list[int]], list[int]]:
    """(prefill sequence lengths per call, decode batch sizes): the packed calls of ``gdn_warmup``'s plan grid
    and the decode step's two tile buckets that fit one vLLM step (``max_tokens`` tokens, ``max_seqs``
    sequences), and the one-sequence prefill of a whole step (a long prompt's chunks) where the grid's memory
    bound allows."""
    if not _jit_kernels(device):
        return [list(CONV_LENGTHS)], [2]
    from ...triton_kernels._tune import sm_count
    from ...triton_kernels.gdn import warmup

    sms = sm_count(device)
    prefills = [lengths for _, _, lengths in warmup.chunk_calls(HV, sms) if lengths is not None
                and sum(lengths) <= max_tokens and len(lengths) <= max_seqs]
    if [max_tokens] not in prefills and max_tokens * HV <= warmup.MAX_HEAD_TOKENS:  # the grid's memory bound
        prefills.append([max_tokens])
    decodes = sorted({B for B in warmup.recurrent_batches(HV, V, sms) if B <= max_seqs} | {1})
    return prefills, decodes


def _warm_layer(layer, conv_pool, ssm_pool, dtype: torch.dtype, prefills, decodes, decode: bool) -> None:
    """The routed calls of ``layer``'s forward (vLLM's ``_forward_core`` and its packed decode path), in its
    argument forms, on scratch copies of its pools."""
    module = sys.modules[MODULE]
    fn = {name: getattr(module, name) for name in ROUTED}  # what the layer calls
    device = ssm_pool.device
    gen = torch.Generator(device).manual_seed(0)  # vLLM has seeded the global generator by now

    def randn(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen, device=device, dtype=dt)

    H, HV = layer.num_k_heads // layer.tp_size, layer.num_v_heads // layer.tp_size
    K, V = layer.head_k_dim, layer.head_v_dim
    weight = layer.conv1d.weight.view(layer.conv1d.weight.size(0), layer.conv1d.weight.size(2))
    C = weight.shape[0]
    rows = max(len(CONV_LENGTHS), *decodes) + 1  # row 0: vLLM's null block
    conv_s, ssm_s = _scratch(conv_pool, rows), _scratch(ssm_pool, rows)

    def qsl(lengths):
        return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)

    fn["causal_conv1d_fn"](randn(sum(CONV_LENGTHS), C).transpose(0, 1), weight, layer.conv1d.bias,
                           activation=layer.activation, conv_states=conv_s,
                           has_initial_state=torch.tensor([False, True], device=device),
                           cache_indices=torch.tensor([1, 2], dtype=torch.int32, device=device),
                           query_start_loc=qsl(CONV_LENGTHS), metadata=None)
    from ...ops.gdn import gdn_chunk_indices

    for lengths in prefills:
        T, cu = sum(lengths), qsl(lengths)
        q, k, v, g, beta = fn["fused_post_conv_prep"](randn(T, C), randn(T, HV), randn(T, HV), layer.A_log,
                                                      layer.dt_bias, H, K, V, apply_l2norm=True, output_g_exp=False)
        h0 = ssm_s[torch.ones(len(lengths), dtype=torch.long, device=device)]  # vLLM's gathered copy
        fn["fla_chunk_gated_delta_rule"](q[None], k[None], v[None], g[None], beta[None], initial_state=h0,
                                         output_final_state=True, cu_seqlens=cu, chunk_indices=gdn_chunk_indices(cu),
                                         chunk_offsets=None, use_qk_l2norm_in_kernel=False)
    if not decode:
        return
    for B in decodes:
        idx = torch.arange(1, B + 1, dtype=torch.int32, device=device)
        y = fn["causal_conv1d_update"](randn(B, C), conv_s, weight, layer.conv1d.bias, layer.activation,
                                       conv_state_indices=idx, validate_data=False)
        a, b = randn(B, HV), randn(B, HV)
        if getattr(layer, "enable_packed_recurrent_decode", False):  # vLLM's pure-decode step
            out = torch.zeros(B, HV, V, dtype=dtype, device=device).unsqueeze(1)
            fn["fused_recurrent_gated_delta_rule_packed_decode"](
                mixed_qkv=y, a=a, b=b, A_log=layer.A_log, dt_bias=layer.dt_bias, scale=K ** -0.5,
                initial_state=ssm_s, out=out, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
        q, k, v = layer.rearrange_mixed_qkv(y)  # the decode rows of a mixed step (and decode without packing)
        fn["fused_sigmoid_gating_delta_rule_update"](
            A_log=layer.A_log, a=a, b=b, dt_bias=layer.dt_bias, q=q, k=k, v=v, initial_state=ssm_s,
            inplace_final_state=True, cu_seqlens=torch.arange(B + 1, dtype=torch.int32, device=device),
            ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)


def warm_up(worker) -> None:
    """Run in each vLLM worker at engine start (``_compat.install_warmup``): the routed adapters once per plan
    on the first routed GDN layer's shapes, so that their kernels compile and tune now, not while serving.
    Does nothing without routed GDN layers; a failure is logged, and the first requests then compile."""
    layers = _routed_layers(worker)
    if not layers or getattr(worker, "_torch_aura_gdn_warmed", False):
        return
    layer, pools = layers[0], _pools(layers[0])
    if pools is None:
        _log.info("torch_aura: GDN warm-up skipped: layer %s has no bound state pools", layer.prefix)
        return
    worker._torch_aura_gdn_warmed = True
    config = worker.vllm_config
    scheduler = config.scheduler_config
    conv_pool, ssm_pool = pools
    prefills, decodes = _warmup_shapes(layer.num_v_heads // layer.tp_size, layer.head_v_dim, ssm_pool.device,
                                       scheduler.max_num_batched_tokens, scheduler.max_num_seqs)
    decode = not getattr(worker.model_runner, "is_pooling_model", False)  # pooling runs whole prefills only
    counted = [(c, c.copy()) for c in (CALLS, HOST_NS, SLOW_CALLS, SLOW_NS)]  # warm-up calls are not served calls
    start = time.perf_counter()
    try:
        with torch.inference_mode():
            _warm_layer(layer, conv_pool, ssm_pool, config.model_config.dtype, prefills, decodes, decode)
        if ssm_pool.is_cuda:
            torch.cuda.synchronize(ssm_pool.device)
    except Exception:
        _log.warning("torch_aura: GDN warm-up failed; the routed kernels compile at the first requests instead",
                     exc_info=True)
        return
    finally:
        warmed = CALLS - counted[0][1]
        WARMED.update(warmed)
        for counter, before in counted:
            counter.clear()
            counter.update(before)
    _log.info("torch_aura: warmed the routed GDN kernels in %.2f s: %d calls (%d prefills of up to %d sequences and "
              "%d tokens; decode batches %s) on %s's shapes (%d/%d heads, K %d, V %d, %s, state %s)",
              time.perf_counter() - start, sum(warmed.values()), len(prefills), max(map(len, prefills)),
              max(map(sum, prefills)), decodes if decode else "none", layer.prefix,
              layer.num_k_heads // layer.tp_size, layer.num_v_heads // layer.tp_size, layer.head_k_dim,
              layer.head_v_dim, str(config.model_config.dtype).removeprefix("torch."),
              str(ssm_pool.dtype).removeprefix("torch."))


def _warm_up(worker) -> None:
    warm_up(worker)  # looked up per call: tests wrap it


# ------------------------------------------------------------------------------- patching
def _pin_native_prefill(original_init):
    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self._forward_method = self.forward_native  # the method that calls fla_chunk_gated_delta_rule
    __init__._torch_aura = True
    return __init__


def _keep_conv_weight_plain(conv1d) -> None:
    """After loading, vLLM's CPU platform packs the conv weight in place for its own CPU op (0.24: on AMX
    hosts, whatever the dtype, and the packing op takes bf16 only; 0.32: bf16 on AVX-512 BF16 and Arm
    hosts); the routed path reads it as ``[C, 1, W]``. So this layer's weight processing keeps it as loaded,
    as vLLM does for the layers it exempts (``cpu_linear`` is F.linear, never called for a conv)."""
    method = conv1d.quant_method
    original = method.process_weights_after_loading

    def process_weights_after_loading(layer):
        if layer is not conv1d:  # a method object shared with other layers: theirs as before
            return original(layer)
        layer.cpu_linear = F.linear
    method.process_weights_after_loading = process_weights_after_loading


def _generic_path_on_cpu(original_init):
    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        from vllm.platforms import current_platform

        if current_platform.is_cpu():  # vLLM's CPU path is its own bf16-only op: take the routed one
            self._forward_method = self.forward_cuda
            _keep_conv_weight_plain(self.conv1d)
    __init__._torch_aura = True
    return __init__


def install() -> bool:
    """Idempotent: replace the routed functions of vLLM's Qwen GDN layer module (import-time names,
    so the patch must run before the model is built: ``register()`` calls it in every vLLM process), and
    hook :func:`warm_up` into vLLM's engine-start warm-up. Returns whether the module was patched."""
    import importlib

    module = importlib.import_module(MODULE)
    here = globals()
    for name in ROUTED:
        current = getattr(module, name)
        if getattr(current, "_torch_aura", False):
            continue
        _originals[name] = current
        adapter = here[name]
        adapter._torch_aura = True
        setattr(module, name, adapter)
    for cls, make in ((module.ChunkGatedDeltaRule, _pin_native_prefill),
                      (module.QwenGatedDeltaNetAttention, _generic_path_on_cpu)):
        if not getattr(cls.__init__, "_torch_aura", False):
            cls.__init__ = make(cls.__init__)
    from . import _compat

    _compat.install_warmup(_warm_up)
    _log.info("torch_aura: %s=1: vLLM's GDN layers run on torch_aura's ops (%s)", GDN_ENV, ", ".join(ROUTED))
    return True


def uninstall() -> None:
    """Undo :func:`install` (tests; a layer built while installed keeps its routed method choice)."""
    module = sys.modules.get(MODULE)
    if module is None:
        return
    for name, original in list(_originals.items()):
        setattr(module, name, original)
        del _originals[name]
    for cls in (module.ChunkGatedDeltaRule, module.QwenGatedDeltaNetAttention):
        if getattr(cls.__init__, "_torch_aura", False):
            cls.__init__ = cls.__init__.__wrapped__
    from . import _compat

    _compat.uninstall_warmup()
