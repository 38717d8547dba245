"""Sample inputs for the Gated DeltaNet ops (see __init__.py).

Tiny, odd sizes (partial 64-token chunks, K and V not powers of two, head ratios 1, 2 and 3),
non-contiguous views with unit last stride, and the optional variants: varlen with a zero-length
sequence (with and without chunk_indices, int32 and int64 offsets), initial states, the
``[V, K]`` state layout, in-op l2norm, explicit scales, a bf16 case and, for ``gdn_recurrent``, a
shuffled pool with a skipped (-1) sequence and a bf16 pool. Stage inputs are produced by the
reference stages, so each stage sees realistic data.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_aura.reference import gdn as ref

from . import Sample


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _inputs(device, B, T, H, HV, K, V, dtype=torch.float32, seed=0):
    """q, k, v, g, beta with q a transposed view, v and g sliced views (unit last stride)."""
    gen = _gen(seed)
    q = F.normalize(torch.randn(B, H, T, K, generator=gen), dim=-1).transpose(1, 2)  # non-contiguous
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V + 3, generator=gen)[..., :V]  # non-contiguous
    g = F.logsigmoid(torch.randn(B, T, HV + 1, generator=gen))[..., :HV]  # non-contiguous
    beta = torch.rand(B, T, HV, generator=gen).sigmoid()
    q, k, v = (x.to(device=device, dtype=dtype) for x in (q, k, v))
    return q, k, v, g.to(device), beta.to(device)


def _state(device, N, HV, K, V, v_first=False, seed=1, dtype=torch.float32):
    s = torch.randn(N, HV, *((V, K) if v_first else (K, V)), generator=_gen(seed))
    return s.to(device=device, dtype=dtype)


def _cu(device, offsets, dtype=torch.int32):
    return torch.tensor(offsets, dtype=dtype, device=device)


def _ci(cu):
    return ref.chunk_indices_from_cu_seqlens(cu)


def _chunk(device):
    q, k, v, g, beta = _inputs(device, 2, 37, 2, 2, 12, 20)
    out = [Sample("B2-T37-H2-HV2-K12-V20-fp32", (q, k, v, g, beta))]
    q, k, v, g, beta = _inputs(device, 1, 70, 1, 3, 10, 7, torch.bfloat16, seed=2)
    h0 = _state(device, 1, 3, 10, 7, v_first=True)
    out.append(Sample("B1-T70-H1-HV3-K10-V7-bf16-h0-l2norm-vfirst",
                      (q, k, v, g, beta, None, h0, None, None, True, True)))
    q, k, v, g, beta = _inputs(device, 1, 70, 2, 4, 9, 11, seed=3)
    cu = _cu(device, [0, 5, 5, 70])
    out.append(Sample("varlen-N3-T70-H2-HV4-K9-V11-fp32-h0-ci-scale0.3",
                      (q, k, v, g, beta, 0.3, _state(device, 3, 4, 9, 11), cu, _ci(cu))))
    q, k, v, g, beta = _inputs(device, 1, 21, 1, 2, 5, 6, torch.float16, seed=4)
    out.append(Sample("varlen-N2-T21-H1-HV2-K5-V6-fp16-int64-noci",
                      (q, k, v, g, beta, None, None, _cu(device, [0, 1, 21], torch.int64))))
    return out


def _cumsum(device):
    g = _inputs(device, 2, 70, 1, 3, 4, 4)[3]
    cu = _cu(device, [0, 66, 66, 70])
    g1 = _inputs(device, 1, 70, 1, 3, 4, 4, seed=5)[3]
    return [Sample("B2-T70-HV3-fp32", (g,)),
            Sample("varlen-N3-T70-HV3-ci", (g1, cu, _ci(cu))),
            Sample("varlen-N3-T70-HV3-bf16-int64-noci",
                   (g1.to(torch.bfloat16), _cu(device, [0, 3, 3, 70], torch.int64)))]


def _kkt_inputs(device, B, T, H, HV, K, V, dtype, cu=None, seed=0):
    q, k, v, g, beta = _inputs(device, B, T, H, HV, K, V, dtype, seed)
    g_cum = ref.gdn_chunk_cumsum(g, cu)
    return q, k, v, g_cum, beta


def _kkt(device):
    _, k, _, g_cum, beta = _kkt_inputs(device, 2, 37, 1, 2, 12, 4, torch.float32)
    cu = _cu(device, [0, 64, 64, 69])
    _, k1, _, g1, b1 = _kkt_inputs(device, 1, 69, 3, 3, 17, 4, torch.bfloat16, cu, seed=6)
    return [Sample("B2-T37-H1-HV2-K12-fp32", (k.transpose(1, 2).contiguous().transpose(1, 2), g_cum, beta)),
            Sample("varlen-N3-T69-H3-HV3-K17-bf16-ci", (k1, g1, b1, cu, _ci(cu))),
            Sample("varlen-N3-T69-H3-HV3-K17-bf16-noci", (k1, g1, b1, cu))]


def _w_u(device):
    out = []
    for name, (B, T, H, HV, K, V, dt, offs) in {
        "B2-T37-H1-HV3-K12-V20-fp32": (2, 37, 1, 3, 12, 20, torch.float32, None),
        "varlen-N3-T70-H2-HV2-K9-V11-bf16-ci": (1, 70, 2, 2, 9, 11, torch.bfloat16, [0, 7, 7, 70]),
    }.items():
        cu = None if offs is None else _cu(device, offs)
        _, k, v, g_cum, beta = _kkt_inputs(device, B, T, H, HV, K, V, dt, cu, seed=7)
        Ai = ref.gdn_kkt_solve(k, g_cum, beta, cu)
        args = (k, v, beta, Ai, g_cum) + (() if cu is None else (cu, _ci(cu)))
        out.append(Sample(name, args))
    return out


def _stage_h_inputs(device, B, T, H, HV, K, V, dt, cu, seed):
    q, k, v, g_cum, beta = _kkt_inputs(device, B, T, H, HV, K, V, dt, cu, seed)
    Ai = ref.gdn_kkt_solve(k, g_cum, beta, cu)
    w, u = ref.gdn_recompute_w_u(k, v, beta, Ai, g_cum, cu)
    return q, k, w, u, g_cum


def _fwd_h(device):
    q, k, w, u, g_cum = _stage_h_inputs(device, 2, 70, 1, 2, 12, 20, torch.float32, None, 8)
    out = [Sample("B2-T70-H1-HV2-K12-V20-fp32", (k, w, u, g_cum))]
    out.append(Sample("B2-T70-H1-HV2-K12-V20-fp32-h0-vfirst",
                      (k, w, u, g_cum, _state(device, 2, 2, 12, 20, v_first=True), None, None, True)))
    cu = _cu(device, [0, 3, 3, 69], torch.int64)
    q, k, w, u, g_cum = _stage_h_inputs(device, 1, 69, 1, 3, 7, 5, torch.bfloat16, cu, 9)
    out.append(Sample("varlen-N3-T69-H1-HV3-K7-V5-bf16-h0-ci",
                      (k, w, u, g_cum, _state(device, 3, 3, 7, 5), cu, _ci(cu))))
    return out


def _fwd_o(device):
    out = []
    for name, (B, T, H, HV, K, V, dt, offs, vf) in {
        "B2-T37-H2-HV4-K12-V20-fp32": (2, 37, 2, 4, 12, 20, torch.float32, None, False),
        "varlen-N3-T70-H1-HV2-K9-V6-bf16-ci-vfirst": (1, 70, 1, 2, 9, 6, torch.bfloat16, [0, 66, 66, 70], True),
    }.items():
        cu = None if offs is None else _cu(device, offs)
        ci = None if cu is None else _ci(cu)
        q, k, w, u, g_cum = _stage_h_inputs(device, B, T, H, HV, K, V, dt, cu, 10)
        h0 = _state(device, B if cu is None else 3, HV, K, V, v_first=vf)  # non-zero entering states
        h, v_new, _ = ref.gdn_fwd_h(k, w, u, g_cum, h0, cu, ci, vf)
        out.append(Sample(name, (q, k, v_new, h, g_cum, 0.7, cu, ci, vf)))
    return out


def _recurrent(device):
    q, k, v, g, beta = _inputs(device, 3, 1, 1, 2, 12, 20, seed=11)
    pool = _state(device, 5, 2, 12, 20)
    idx = torch.tensor([4, -1, 1], dtype=torch.int32, device=device)
    out = [Sample("B3-T1-H1-HV2-K12-V20-fp32-pool5-shuffled-skip", (q, k, v, g, beta, pool, idx))]
    q, k, v, g, beta = _inputs(device, 2, 4, 2, 4, 9, 7, seed=12)
    out.append(Sample("B2-T4-H2-HV4-K9-V7-fp32-bf16pool-noidx",
                      (q, k, v, g, beta, _state(device, 2, 4, 9, 7, dtype=torch.bfloat16))))
    q, k, v, g, beta = _inputs(device, 1, 5, 1, 3, 6, 10, torch.bfloat16, seed=13)
    cu = _cu(device, [0, 2, 2, 5])
    pool = _state(device, 4, 3, 6, 10, v_first=True)
    idx = torch.tensor([2, 0, 3], dtype=torch.int32, device=device)
    out.append(Sample("varlen-N3-T5-H1-HV3-K6-V10-bf16-l2norm-vfirst-scale0.5",
                      (q, k, v, g, beta, pool, idx, cu, 0.5, True, True)))
    return out


def _conv_weights(device, C, W, seed, bias=True):
    gen = _gen(seed)
    w = torch.randn(C, W, generator=gen).to(device)
    return w, (torch.randn(C, generator=gen).to(device) if bias else None)


def _causal_conv1d(device):
    """x as a channel slice of a wider token-major tensor (a q | k | v projection), W 4 and 1, odd C,
    a varlen batch with a zero-length and a shorter-than-the-state sequence, fp16 and bf16."""
    gen = _gen(20)
    x = torch.randn(2, 37, 13, generator=gen)[..., 2:11].to(device)  # [2, 37, 9], unit last stride
    w, b = _conv_weights(device, 9, 4, 21)
    out = [Sample("B2-T37-C9-W4-fp32-bias-silu", (x, w, b, None, None, "silu"))]
    state = torch.randn(2, 9, 5, generator=gen).to(device)  # S = 5 > W - 1
    out.append(Sample("B2-T37-C9-W4-fp32-state5", (x, w, None, state)))
    xv = torch.randn(1, 11, 6, generator=gen).to(device=device, dtype=torch.float16)
    wv, bv = _conv_weights(device, 6, 3, 22)
    cu = _cu(device, [0, 0, 2, 11])
    out.append(Sample("varlen-N3-T11-C6-W3-fp16-state2-swish",
                      (xv, wv, bv, torch.randn(3, 6, 2, generator=gen).to(device), cu, "swish")))
    xb = torch.randn(2, 5, 16, generator=gen).to(device=device, dtype=torch.bfloat16)
    w1, _ = _conv_weights(device, 16, 1, 23, bias=False)
    out.append(Sample("B2-T5-C16-W1-bf16", (xb, w1, None, None, None, "silu")))
    return out


def _causal_conv1d_update(device):
    """One token and three (speculative) per sequence, a shuffled pool with a skipped (-1) row, and vLLM's
    pool layout (entries C apart)."""
    gen = _gen(24)
    w, b = _conv_weights(device, 10, 4, 25)
    pool = torch.randn(5, 10, 4, generator=gen).to(device)
    idx = torch.tensor([3, -1, 0], dtype=torch.int32, device=device)
    x = torch.randn(3, 10, generator=gen).to(device)
    out = [Sample("N3-C10-W4-fp32-pool5-shuffled-skip-silu", (x, pool, w, b, "silu", idx))]
    x3 = torch.randn(2, 3, 12, generator=gen)[..., :10].to(device=device, dtype=torch.bfloat16)
    out.append(Sample("N2-L3-C10-W4-bf16-noidx", (x3, torch.randn(2, 10, 3, generator=gen).to(device), w)))
    vllm_pool = torch.randn(5, 3, 10, generator=gen).to(device).transpose(1, 2)  # vLLM's [P, W - 1, C], transposed
    out.append(Sample("N3-C10-W4-fp32-transposed-pool-skip", (x, vllm_pool, w, b, "silu", idx)))
    return out


SAMPLES = {
    "gdn_chunk": _chunk,
    "gdn_chunk_cumsum": _cumsum,
    "gdn_kkt_solve": _kkt,
    "gdn_recompute_w_u": _w_u,
    "gdn_fwd_h": _fwd_h,
    "gdn_fwd_o": _fwd_o,
    "gdn_recurrent": _recurrent,
    "causal_conv1d": _causal_conv1d,
    "causal_conv1d_update": _causal_conv1d_update,
}
