"""The fast CPU ``gdn_chunk`` (torch_aura/cpu/gdn.py) against the reference ``gdn_chunk`` (the oracle).

Same inputs into both; fp32 must agree to rel RMS 1e-5 on o and the final state (only the
accumulation order differs), 16-bit to the family ratios of ``_util.RATIO`` (the fast path keeps
intermediates in fp32 where the reference rounds them to 16 bits). Covered: partial chunks (T = 0,
1, 63, 64, 65, 130), B = 1 and 2, GQA ratios 1, 2, 4, K != V, initial states in both layouts,
varlen with empty / 1 / 64 / 65-token sequences in an order the fast path must re-sort, g outside
(-inf, 0], in-op l2norm, explicit scales, non-contiguous views, the varlen data checks, that inputs
are never written, and (independent of the reference) the fp64 token-by-token recurrence.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import _gdn_check
from _util import RATIO, assert_close, dtype_id
from torch_aura.cpu import gdn as fast
from torch_aura.reference import gdn as ref

FAST = SimpleNamespace(gdn_chunk=fast.gdn_chunk, gdn_recurrent=ref.gdn_recurrent)
# g = logsigmoid(rand) / 10: a weak decay (e^{G} ~ e^-3 over a chunk), so the state entering a chunk,
# and the initial state, still weigh on o and on the final state; with gate_norm = 1 they decay by
# ~e^-32 per chunk and an error in the inter-chunk recurrence would hide below the fp32 tolerance
WEAK = 10.0


def _state(N, HV, K, V, state_v_first, seed=1, dtype=torch.float32):
    shape = (N, HV, V, K) if state_v_first else (N, HV, K, V)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _compare(q, k, v, g, beta, scale=None, h0=None, cu=None, ci=None, l2norm=False, vf=False, ratio=None):
    """Run both; check dtypes, shapes, finiteness and closeness; return the fast outputs."""
    o, fin = fast.gdn_chunk(q, k, v, g, beta, scale, h0, cu, ci, l2norm, vf)
    o_ref, fin_ref = ref.gdn_chunk(q, k, v, g, beta, scale, h0, cu, ci, l2norm, vf)
    assert o.shape == o_ref.shape and o.dtype == o_ref.dtype == q.dtype
    assert fin.shape == fin_ref.shape and fin.dtype == fin_ref.dtype == torch.float32
    assert fin.is_contiguous(), "final_state must be materialised in its stored layout"
    assert torch.isfinite(o).all() and torch.isfinite(fin).all()
    r = RATIO[q.dtype] if ratio is None else ratio
    assert_close("o", o.float(), o_ref.float(), r)
    assert_close("final_state", fin, fin_ref, r)
    return o, fin


# ------------------------------------------------------------------------- fixed length, fp32
GQA = [(2, 2), (2, 4), (1, 4)]  # (H, HV): ratios 1, 2, 4
KV = [(32, 48), (64, 64)]
STATES = [(False, False), (True, False), (True, True), (False, True)]  # (initial_state, state_v_first)


@pytest.mark.parametrize("h0,vf", STATES, ids=[f"h0{int(a)}-vfirst{int(b)}" for a, b in STATES])
@pytest.mark.parametrize("K,V", KV, ids=[f"K{a}-V{b}" for a, b in KV])
@pytest.mark.parametrize("H,HV", GQA, ids=[f"H{a}-HV{b}" for a, b in GQA])
@pytest.mark.parametrize("B", [1, 2])
@pytest.mark.parametrize("T", [0, 1, 63, 64, 65, 130])
def test_fixed_length_fp32_matches_reference(T, B, H, HV, K, V, h0, vf):
    q, k, v, g, beta = _gdn_check.make_inputs("cpu", B, T, H, HV, K, V, torch.float32, gate_norm=WEAK,
                                              mask_p=0.2 if B == 2 else 0.0, seed=T + 7 * HV + K)
    init = _state(B, HV, K, V, vf, seed=T + 1) if h0 else None
    o, fin = _compare(q, k, v, g, beta, h0=init, vf=vf)
    if T == 0:  # no chunk at all: the state passes through unchanged (or stays 0)
        want = init if h0 else torch.zeros_like(fin)
        assert torch.equal(fin, want)
    else:  # the comparison is not vacuous: the op really produced a non-trivial output
        assert o.abs().max() > 1e-3


def test_bench_shape_fp32_matches_reference():
    # the benchmark's shape (issue 25): 1 x 2048 tokens, 4 q/k heads, 8 v heads, K = V = 128
    for gate_norm in (1.0, WEAK):
        q, k, v, g, beta = _gdn_check.make_inputs("cpu", 1, 2048, 4, 8, 128, 128, torch.float32,
                                                  gate_norm=gate_norm, seed=25)
        _compare(q, k, v, g, beta, h0=_state(1, 8, 128, 128, False))


# ------------------------------------------------------------------------------------ varlen
VARLEN = [
    # (lengths, H, HV, K, V, h0, state_v_first, pass chunk_indices, cu dtype)
    ([1, 0, 64, 65], 2, 4, 32, 48, True, False, True, torch.int32),
    ([1, 0, 64, 65], 1, 4, 64, 64, False, True, False, torch.int64),
    ([65, 0, 1, 130, 64, 3], 2, 2, 32, 48, True, True, True, torch.int32),  # unsorted chunk counts
    ([0, 130, 0], 1, 2, 64, 64, True, False, False, torch.int32),
    ([130], 2, 4, 32, 48, True, False, True, torch.int64),
    ([0], 2, 2, 32, 48, True, False, False, torch.int32),  # T = 0, one empty sequence
    ([63, 1, 64, 2, 129], 1, 1, 64, 64, False, False, True, torch.int32),
]


@pytest.mark.parametrize("lengths,H,HV,K,V,h0,vf,pass_ci,cu_dtype", VARLEN,
                         ids=[f"L{'-'.join(map(str, c[0]))}-H{c[1]}-HV{c[2]}-K{c[3]}-V{c[4]}-h0{int(c[5])}"
                              f"-vfirst{int(c[6])}-ci{int(c[7])}" for c in VARLEN])
def test_varlen_fp32_matches_reference(lengths, H, HV, K, V, h0, vf, pass_ci, cu_dtype):
    T = sum(lengths)
    q, k, v, g, beta = _gdn_check.make_inputs("cpu", 1, T, H, HV, K, V, torch.float32, gate_norm=WEAK,
                                              seed=T + len(lengths))
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=cu_dtype)
    ci = ref.chunk_indices_from_cu_seqlens(cu) if pass_ci else None
    N = len(lengths)
    init = _state(N, HV, K, V, vf, seed=N) if h0 else None
    o, fin = _compare(q, k, v, g, beta, h0=init, cu=cu, ci=ci, vf=vf)
    for n, L in enumerate(lengths):  # an empty sequence's state passes through, bit for bit
        if L == 0:
            assert torch.equal(fin[n], init[n] if h0 else torch.zeros_like(fin[n]))
    # each sequence is independent of its neighbours: equal to running it alone (fixed length)
    for n, L in enumerate(lengths):
        if L:
            s = slice(int(cu[n]), int(cu[n + 1]))
            o1, f1 = fast.gdn_chunk(q[:, s], k[:, s], v[:, s], g[:, s], beta[:, s], None,
                                    None if init is None else init[n : n + 1], None, None, False, vf)
            assert_close(f"sequence {n} o alone", o1, o[:, s], RATIO[torch.float32])
            assert_close(f"sequence {n} final_state alone", f1, fin[n : n + 1], RATIO[torch.float32])


@pytest.mark.parametrize("chunks_per_group", [1, 3])
@pytest.mark.parametrize("varlen", [False, True], ids=["fixed-B2", "varlen"])
def test_groups_of_chunks_match_reference(monkeypatch, chunks_per_group, varlen):
    # long inputs run in groups of chunks (bounded memory); a group may end inside a chunk position,
    # so the state steps then cover a run of sequences that is not a prefix
    H, HV, K, V = 1, 2, 32, 48
    monkeypatch.setattr(fast, "GROUP_TILES", chunks_per_group * HV)
    lengths = [130, 1, 0, 65, 200, 64]
    B, T = (1, sum(lengths)) if varlen else (2, 200)
    q, k, v, g, beta = _gdn_check.make_inputs("cpu", B, T, H, HV, K, V, torch.float32, gate_norm=WEAK, seed=11)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist()) if varlen else None
    N = len(lengths) if varlen else B
    _compare(q, k, v, g, beta, h0=_state(N, HV, K, V, False, seed=4), cu=cu)


# ------------------------------------------------------------------- g outside (-inf, 0]
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_decay_domain_matches_reference(dtype, varlen):
    # g = -inf at a chunk start / end, twice in a row, on every head; g > 0 on a head and a token
    q, k, v, g, beta = _gdn_check.decay_domain_inputs("cpu", dtype, B=1, T=150, H=1, HV=2, K=16, V=24)
    assert torch.isinf(g).any() and (g > 0).any()
    cu = torch.tensor([0, 5, 5, 64, 150], dtype=torch.int32) if varlen else None
    init = _state(4 if varlen else 1, 2, 16, 24, False, seed=5)
    _compare(q, k, v, g, beta, h0=init, cu=cu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_decay_domain_vs_exact_recurrence(dtype):
    # independent of the reference chunk path: the fp64 loop with g = -inf an exact forget, g > 0 read as 0
    _gdn_check.check_decay_domain(FAST, "cpu", dtype)


# ------------------------------------------------------------------------------ 16-bit inputs
LOWP = [
    # (B, T, H, HV, K, V, dtype, h0, state_v_first, l2norm, scale, offsets)
    (2, 130, 2, 4, 32, 48, torch.bfloat16, True, False, False, None, None),
    (1, 65, 1, 4, 64, 64, torch.bfloat16, True, True, True, 0.3, None),
    (1, 200, 2, 2, 32, 48, torch.bfloat16, True, False, False, None, [0, 1, 1, 65, 130, 200]),
    (2, 130, 2, 4, 64, 64, torch.float16, False, False, True, 1.0, None),
    (1, 130, 1, 2, 32, 48, torch.float16, True, True, False, None, [0, 64, 65, 65, 130]),
]


@pytest.mark.parametrize("B,T,H,HV,K,V,dtype,h0,vf,l2norm,scale,offsets", LOWP,
                         ids=[f"B{c[0]}-T{c[1]}-H{c[2]}-HV{c[3]}-K{c[4]}-V{c[5]}-{dtype_id(c[6])}-h0{int(c[7])}"
                              f"-vfirst{int(c[8])}-l2{int(c[9])}-scale{c[10]}-{'varlen' if c[11] else 'fixed'}"
                              for c in LOWP])
def test_16bit_matches_reference(B, T, H, HV, K, V, dtype, h0, vf, l2norm, scale, offsets):
    q, k, v, g, beta = _gdn_check.make_inputs("cpu", B, T, H, HV, K, V, dtype, gate_norm=WEAK, seed=T + K)
    if l2norm:  # unnormalised, so the in-op normalisation (and its rounding to dtype) matters
        q, k = (3 * q.float()).to(dtype), (0.5 * k.float()).to(dtype)
    cu = None if offsets is None else torch.tensor(offsets, dtype=torch.int32)
    N = B if cu is None else cu.shape[0] - 1
    init = _state(N, HV, K, V, vf, seed=T) if h0 else None
    _compare(q, k, v, g, beta, scale, init, cu, None, l2norm, vf)


# --------------------------------------------------------------- other arguments and contracts
@pytest.mark.parametrize("scale", [None, 0.1, 1.0])
def test_l2norm_scale_and_noncontiguous_views_fp32(scale):
    gen = torch.Generator().manual_seed(3)
    B, T, H, HV, K, V = 2, 70, 2, 4, 24, 20
    q = (3 * torch.randn(B, H, T, K, generator=gen)).transpose(1, 2)  # non-contiguous views, unit last stride
    k = torch.randn(B, T, H, K + 5, generator=gen)[..., :K]
    v = torch.randn(B, T, HV, V + 3, generator=gen)[..., :V]
    g = (torch.nn.functional.logsigmoid(torch.randn(B, T, HV + 1, generator=gen)) / WEAK)[..., :HV]
    beta = torch.rand(B, T, HV, generator=gen).sigmoid()
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous() or g.is_contiguous())
    _compare(q, k, v, g, beta, scale, _state(B, HV, K, V, True), None, None, True, True)


def test_inputs_are_not_written():
    # the state recurrence runs in place on a working copy: the caller's initial_state must survive
    q, k, v, g, beta = _gdn_check.make_inputs("cpu", 1, 130, 2, 4, 32, 48, torch.float32, gate_norm=WEAK, seed=9)
    cu = torch.tensor([0, 1, 1, 66, 130], dtype=torch.int32)
    for cu_, N in ((None, 1), (cu, 4)):
        for vf in (False, True):
            init = _state(N, 4, 32, 48, vf)
            args = (q, k, v, g, beta, init)
            before = [x.clone() for x in args]
            o, fin = fast.gdn_chunk(q, k, v, g, beta, None, init, cu_, None, False, vf)
            for x, x0 in zip(args, before):
                assert torch.equal(x, x0), "gdn_chunk wrote one of its inputs"
            assert fin.data_ptr() != init.data_ptr()


def test_varlen_data_checks_as_reference():
    # the value checks of cu_seqlens / chunk_indices live in the reference, not in the shared checks
    q, k, v, g, beta = _gdn_check.make_inputs("cpu", 1, 70, 1, 2, 16, 16, torch.float32)
    with pytest.raises(ValueError, match="cu_seqlens"):
        fast.gdn_chunk(q, k, v, g, beta, None, None, torch.tensor([0, 40, 30, 70]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        fast.gdn_chunk(q, k, v, g, beta, None, None, torch.tensor([0, 40, 69]))
    cu = torch.tensor([0, 5, 5, 70], dtype=torch.int32)
    wrong = torch.tensor([[0, 0], [1, 0], [2, 0]], dtype=torch.int32)  # sequence 1 is empty: no chunk
    with pytest.raises(ValueError, match="chunk_indices"):
        fast.gdn_chunk(q, k, v, g, beta, None, None, cu, wrong)


CHUNK_CASES = [
    # (B, T, H, HV, K, V, dtype, offsets, h0, scale, l2norm, state_v_first, gate_norm, mask_p)
    (2, 130, 2, 4, 32, 48, torch.float32, None, True, None, False, False, WEAK, 0.0),
    (1, 200, 1, 4, 64, 64, torch.float32, [0, 64, 64, 65, 66, 200], True, 0.5, True, True, 0.1, 0.5),
    (1, 150, 2, 2, 60, 100, torch.float32, None, False, 1.0, False, False, 0.01, 0.0),  # strong decay
    (2, 100, 2, 2, 32, 32, torch.float32, None, True, None, False, True, 1.0, 1.0),  # g == 0 everywhere
    (1, 130, 2, 4, 32, 48, torch.bfloat16, [0, 1, 65, 130], True, None, False, False, WEAK, 0.0),
]


@pytest.mark.parametrize("B,T,H,HV,K,V,dtype,offsets,h0,scale,l2norm,vf,gate_norm,mask_p", CHUNK_CASES,
                         ids=[f"case{i}-{dtype_id(c[6])}" for i, c in enumerate(CHUNK_CASES)])
def test_vs_reference_and_fp64_recurrence(B, T, H, HV, K, V, dtype, offsets, h0, scale, l2norm, vf, gate_norm,
                                          mask_p):
    # the shared kernel check: vs the reference chunk path and vs the fp64 token-by-token recurrence
    _gdn_check.check_chunk(FAST, "cpu", B, T, H, HV, K, V, dtype, offsets=offsets, gate_norm=gate_norm,
                           mask_p=mask_p, h0=h0, scale=scale, l2norm=l2norm, state_v_first=vf, seed=T)
