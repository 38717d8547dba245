"""Compile and tune every plan of the GDN kernels for one head configuration before the first prompt.

The kernels never specialise on lengths (``_jit.LENGTH_ARGS``) and the tuning keys hold only static
facts and two-valued buckets, so a head configuration has a bounded set of *plans*: fixed length or
varlen, the serial or the sequence-parallel state pass, the pass beside w/u or after it, few or many
chunks per SM, one V-tile width or the other in the decode step. Each plan compiles its kernels once
and tunes its keys once. :func:`run` visits them all with calls on small buffers, so that no
prompt of any length met later compiles or tunes (what a chat server would otherwise pay at a new
length: seconds). It is cheap where the Triton cache on disk and a tuned table
(``_tune.TuneTable``) already hold the answers. The public entry is ``torch_aura.gdn_warmup``.
"""

from __future__ import annotations

import itertools

import torch

from .._tune import cdiv, sm_count
from ._jit import CHUNK
from .prep import MANY_CHUNKS_PER_SM

# Sequences per call and tokens per sequence of the grid: plans change with N (pass programs per
# wave, the overlap bound, segments per sequence) and with chunks per sequence (segmenting).
SEQUENCES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)
TOKENS = (64, 512, 4096, 32768)
# Largest call of the grid, in tokens x value heads (the buffers of one call: ~1 GB at V = 128, bf16).
MAX_HEAD_TOKENS = 1 << 22


def chunk_calls(num_v_heads: int, sms: int, varlen: bool = True) -> list[tuple[int, int, list[int] | None]]:
    """``(B, T, lengths)`` calls that visit every plan of ``gdn_chunk``: the grid of SEQUENCES x TOKENS
    (within MAX_HEAD_TOKENS) and the two sides of the many-chunks bucket, fixed length (``lengths``
    None) and, with ``varlen``, the same sequences packed in one row (``B = 1``)."""
    shapes = {(n, t) for n in SEQUENCES for t in TOKENS if n * t * num_v_heads <= MAX_HEAD_TOKENS}
    threshold = cdiv(MANY_CHUNKS_PER_SM * sms, num_v_heads) * CHUNK  # tokens where the bucket flips
    shapes |= {(1, threshold - CHUNK), (1, threshold + CHUNK)}
    calls = [(n, t, None) for n, t in sorted(shapes)]
    if varlen:
        calls += [(1, n * t, [t] * n) for n, t in sorted(shapes)]
    return calls


def recurrent_batches(num_v_heads: int, head_v_dim: int, sms: int) -> tuple[int, ...]:
    """Batch sizes of the decode step on each side of its V-tile rule (``recurrent._tile``)."""
    wide = cdiv(8 * sms, num_v_heads * cdiv(head_v_dim, 64))
    return (1, max(wide, 2))


def run_conv(C: int, W: int, dtype: torch.dtype, device: torch.device, varlen: bool) -> int:
    """The front end's variants as transformers' GDN layers call them (no bias, SiLU; the prefill
    without a state, the decode step over a state of W entries); returns the calls made. Lengths
    take no part in them (``_jit.LENGTH_ARGS``): one call of each form is enough."""
    x = torch.randn(1, 2 * CHUNK, C, dtype=dtype, device=device)
    weight = torch.randn(C, W, dtype=dtype, device=device)
    calls = [(None,), (torch.tensor([0, CHUNK, 2 * CHUNK], dtype=torch.int32, device=device),)] if varlen \
        else [(None,)]
    for (cu,) in calls:
        torch.ops.aura.causal_conv1d(x, weight, None, None, cu, "silu")
    state = torch.zeros(2, C, W, dtype=dtype, device=device)
    torch.ops.aura.causal_conv1d_update(x[0, :2], state, weight, None, "silu", None)
    return len(calls) + 1


def run(H: int, HV: int, K: int, V: int, dtype: torch.dtype, device: torch.device, varlen: bool,
        initial_state: bool, use_qk_l2norm: bool, state_v_first: bool) -> tuple[int, int]:
    """The calls of :func:`torch_aura.gdn_warmup` on a CUDA device; returns ``(calls, keys timed)``."""
    from . import chunk as chunk_mod

    tuners = (chunk_mod._SOLVE, chunk_mod._W_U, chunk_mod._STATE_PASS, chunk_mod._STATE_PASS_SM90,
              chunk_mod._SEG_SUMMARY)
    timed_before, calls = sum(t.timed for t in tuners), 0
    sms = sm_count(device)
    sd = (V, K) if state_v_first else (K, V)
    for B, T, lengths in chunk_calls(HV, sms, varlen):
        q = torch.randn(B, T, H, K, dtype=dtype, device=device)
        v = torch.randn(B, T, HV, V, dtype=dtype, device=device)
        N = B if lengths is None else len(lengths)
        cu = None if lengths is None else torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32,
                                                       device=device)
        h0 = torch.zeros(N, HV, *sd, device=device) if initial_state else None
        torch.ops.aura.gdn_chunk(q, torch.randn_like(q), v, -torch.rand(B, T, HV, device=device),
                                 torch.rand(B, T, HV, device=device), None, h0, cu, None, use_qk_l2norm, state_v_first)
        calls += 1
    for B in recurrent_batches(HV, V, sms):
        q = torch.randn(B, 1, H, K, dtype=dtype, device=device)
        v = torch.randn(B, 1, HV, V, dtype=dtype, device=device)
        torch.ops.aura.gdn_recurrent(q, torch.randn_like(q), v, -torch.rand(B, 1, HV, device=device),
                                     torch.rand(B, 1, HV, device=device), torch.zeros(B, HV, *sd, device=device),
                                     None, None, None, use_qk_l2norm, state_v_first)
        calls += 1
    torch.cuda.synchronize(device)
    return calls, sum(t.timed for t in tuners) - timed_before
