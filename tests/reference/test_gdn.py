"""Gated DeltaNet references against independent oracles (gdn.md §5, §8, scaled to a 2-core CPU).

The ground truth is ``oracle``: the token-by-token recurrence of gdn.md §1 in fp64, written here
with plain loops and without any package code. Against it:

* the chunked reference (``gdn_chunk`` and each stage) in fp64 to 1e-8, and in fp32 / bf16 / fp16
  with the §5 ratios (low precision compared with the fp64 oracle on the same rounded inputs);
* ``gdn_recurrent`` (pool, -1 skips, bf16 pool, varlen, layouts);
* every stage against a straightforward dense computation;
* every bad-input class, eagerly and at trace time (meta tensors run the fake).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torch_aura
from torch_aura.reference import gdn as ref

import _gdn_check
from _util import GDN_CHUNK_RATIO, GDN_RECURRENT_RATIO, assert_close, dtype_id

FP64_RATIO = 1e-8
STAGE_RATIO = 5e-3
LAYOUT_RATIO = 1e-4
BT = 64


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Thousands of tiny ops: intra-op threads only add barrier cost (badly so on a busy 2-core box).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# --------------------------------------------------------------------------------- inputs
def make_inputs(B, T, H, HV, K, V, dtype=torch.float32, gate_norm=1.0, mask_p=0.0, seed=0):
    """gdn.md §5 inputs on the CPU (the builder the kernel trees use)."""
    return _gdn_check.make_inputs("cpu", B, T, H, HV, K, V, dtype, gate_norm=gate_norm, mask_p=mask_p, seed=seed)


def randn_state(N, HV, K, V, seed=1, dtype=torch.float32):
    return torch.randn(N, HV, K, V, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def cu_tensor(lengths, dtype=torch.int32):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=dtype)


# --------------------------------------------------------------------------------- oracle
def oracle(q, k, v, g, beta, h0=None, scale=None, cu=None, l2norm=False):
    """fp64 recurrence of gdn.md §1, one sequence and token at a time (heads vectorised).

    Returns ``(o [B,T,HV,V], final [N,HV,K,V], delta [B,T,HV,V] = beta*r, starts)`` where
    ``starts[n]`` lists the state entering each 64-token chunk of sequence n.
    """
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    head = torch.arange(HV) // (HV // H)  # value head hv reads key head hv // (HV / H)
    scale = K ** -0.5 if scale is None else scale
    if cu is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        c = cu.tolist()
        seqs = [(0, c[n], c[n + 1]) for n in range(len(c) - 1)]
    o = torch.zeros(B, T, HV, V, dtype=torch.float64)
    delta = torch.zeros(B, T, HV, V, dtype=torch.float64)
    finals, starts = [], []
    for n, (b, bos, eos) in enumerate(seqs):
        S = torch.zeros(HV, K, V, dtype=torch.float64) if h0 is None else h0[n].double().clone()
        starts.append([])
        for t in range(bos, eos):
            if (t - bos) % BT == 0:
                starts[-1].append(S.clone())
            kt, qt = k[b, t, head], q[b, t, head]  # [HV, K]
            S = torch.exp(g[b, t])[:, None, None] * S
            r = v[b, t] - torch.einsum("hkv,hk->hv", S, kt)
            d = beta[b, t][:, None] * r
            S = S + kt[:, :, None] * d[:, None, :]
            o[b, t] = scale * torch.einsum("hkv,hk->hv", S, qt)
            delta[b, t] = d
        finals.append(S)
    final = torch.stack(finals) if finals else torch.zeros(0, HV, K, V, dtype=torch.float64)
    return o, final, delta, starts


def oracle_h(starts, fixed: bool):
    """Assemble ``h [B, NT, HV, K, V]`` from the oracle's chunk-entry states."""
    if fixed:
        return torch.stack([torch.stack(s) for s in starts]) if starts and starts[0] else None
    flat = [s for seq in starts for s in seq]
    return torch.stack(flat)[None]


def T_id(B, T, H, HV, K, V, dt=None, *extra):
    s = f"B{B}-T{T}-H{H}-HV{HV}-K{K}-V{V}"
    if dt is not None:
        s += f"-{dtype_id(dt)}"
    return "-".join([s, *[str(e) for e in extra]])


# -------------------------------------------------- chunked == recurrence, fp64 (round-off only)
FP64_CASES = [
    # (B, T, H, HV, K, V, h0, scale)
    (2, 0, 1, 1, 16, 16, "randn", None),
    (2, 1, 1, 2, 16, 60, "zeros", None),
    (1, 63, 2, 2, 60, 16, "randn", 1.0),
    (2, 64, 1, 3, 16, 100, "randn", 0.1),
    (1, 65, 2, 8, 100, 60, "randn", None),
    (2, 131, 3, 3, 60, 60, "zeros", 0.1),
    (1, 70, 1, 4, 128, 24, "randn", None),
    (1, 3, 1, 1, 256, 256, "randn", None),
]


@pytest.mark.parametrize("B,T,H,HV,K,V,h0,scale", FP64_CASES,
                         ids=[T_id(*c[:6], None, f"h0{c[6]}", f"scale{c[7]}") for c in FP64_CASES])
def test_chunked_equals_recurrence_fp64(B, T, H, HV, K, V, h0, scale):
    q, k, v, g, beta = make_inputs(B, T, H, HV, K, V, torch.float64, seed=T + K)
    state = randn_state(B, HV, K, V, dtype=torch.float64) if h0 == "randn" else None
    o_ref, final_ref, delta_ref, starts = oracle(q, k, v, g, beta, state, scale)

    o, final = ref.gdn_chunk(q, k, v, g, beta, scale, state)
    assert o.dtype == final.dtype == torch.float64
    assert_close("o", o, o_ref, FP64_RATIO)
    assert_close("final_state", final, final_ref, FP64_RATIO)

    # the stages individually: v_new IS the recurrence's per-token delta beta * r (gdn.md §2 (b)),
    # and h holds the recurrence's state entering each chunk
    g_cum = ref.gdn_chunk_cumsum(g)
    Ai = ref.gdn_kkt_solve(k, g_cum, beta)
    w, u = ref.gdn_recompute_w_u(k, v, beta, Ai, g_cum)
    h, v_new, final_h = ref.gdn_fwd_h(k, w, u, g_cum, state)
    assert_close("v_new", v_new, delta_ref, FP64_RATIO)
    assert h.shape == (B, math.ceil(T / BT), HV, K, V)
    if T:
        assert_close("h", h, oracle_h(starts, True), FP64_RATIO)

    pool = (torch.zeros(B, HV, K, V, dtype=torch.float64) if state is None else state.clone())
    o_rec = ref.gdn_recurrent(q, k, v, g, beta, pool, None, None, scale)
    assert_close("recurrent o", o_rec, o_ref, FP64_RATIO)
    assert_close("recurrent state", pool, final_ref, FP64_RATIO)


# ----------------------------------------- low precision through the ops vs fp64 on rounded inputs
LOWP_CASES = [
    # (B, T, H, HV, K, V, dtype, gate_norm, mask_p, l2norm, scale)
    (2, 75, 2, 2, 64, 64, torch.float32, 0.01, 0.0, False, 1.0),
    (2, 130, 3, 3, 60, 60, torch.float16, 1.0, 0.0, False, 1.0),
    (1, 200, 2, 4, 64, 48, torch.bfloat16, 1.0, 0.5, False, 0.1),
    (1, 128, 2, 2, 100, 100, torch.bfloat16, 0.1, 0.0, True, None),
    (2, 97, 1, 2, 32, 32, torch.float16, 10.0, 1.0, False, 0.1),
    (1, 80, 2, 8, 32, 40, torch.float32, 1.0, 0.0, True, 0.1),
]


@pytest.mark.parametrize(
    "B,T,H,HV,K,V,dtype,gate_norm,mask_p,l2norm,scale", LOWP_CASES,
    ids=[T_id(*c[:7], f"gn{c[7]}", f"mask{c[8]}", f"l2{int(c[9])}", f"scale{c[10]}") for c in LOWP_CASES])
def test_chunk_and_recurrent_ops_vs_fp64_recurrence(B, T, H, HV, K, V, dtype, gate_norm, mask_p, l2norm,
                                                     scale):
    q, k, v, g, beta = make_inputs(B, T, H, HV, K, V, dtype, gate_norm, mask_p, seed=T)
    if l2norm:  # unnormalised inputs so the in-op normalisation matters
        q, k = (2.5 * q.float()).to(dtype), (0.5 * k.float()).to(dtype)
    h0 = randn_state(B, HV, K, V)
    o_ref, final_ref, _, _ = oracle(q, k, v, g, beta, h0, scale, l2norm=l2norm)

    o, final = torch_aura.gdn_chunk(q, k, v, g, beta, scale, h0, None, None, l2norm)
    assert o.dtype == dtype and final.dtype == torch.float32
    assert torch.isfinite(o).all() and torch.isfinite(final).all()
    assert_close("chunk o", o, o_ref, GDN_CHUNK_RATIO)
    assert_close("chunk final_state", final, final_ref, GDN_CHUNK_RATIO)

    pool = h0.clone()
    o_rec = torch_aura.gdn_recurrent(q, k, v, g, beta, pool, None, None, scale, l2norm)
    assert torch.isfinite(o_rec).all() and torch.isfinite(pool).all()
    assert_close("recurrent o", o_rec, o_ref, GDN_RECURRENT_RATIO)
    assert_close("recurrent state", pool, final_ref, GDN_RECURRENT_RATIO)


def test_low_precision_rounds_exactly_where_the_spec_says():
    # A bf16 pipeline must not be an fp32 pipeline in disguise: rounding the §3.7 intermediates
    # changes the result (slightly), and fp32 inputs are never rounded (bit-equal to fp64 -> fp32 math).
    q, k, v, g, beta = make_inputs(1, 100, 1, 1, 32, 32, torch.bfloat16, seed=3)
    o_bf16, _ = ref.gdn_chunk(q, k, v, g, beta)
    o_fp32, _ = ref.gdn_chunk(q.float(), k.float(), v.float(), g, beta)
    assert not torch.equal(o_bf16.float(), o_fp32.to(torch.bfloat16).float())
    assert_close("bf16 vs fp32 pipeline", o_bf16, o_fp32, 2e-2)
    # Ai: exactly one rounding, at the store (so the bf16 Ai is the fp32 Ai rounded)
    g_cum = ref.gdn_chunk_cumsum(g)
    Ai16 = ref.gdn_kkt_solve(k, g_cum, beta)
    Ai32 = ref.gdn_kkt_solve(k.float(), g_cum, beta)
    assert Ai16.dtype == torch.bfloat16 and torch.equal(Ai16, Ai32.to(torch.bfloat16))
    # w: the operand beta*e^G*k is rounded before the matmul
    w16, u16 = ref.gdn_recompute_w_u(k, v, beta, Ai16, g_cum)
    kb = (k.float() * (beta * g_cum.exp())[..., None]).to(torch.bfloat16).float()
    Aic = Ai16[0, :64, 0].float()
    expected = (Aic @ kb[0, :64, 0]).to(torch.bfloat16)
    assert torch.equal(w16[0, :64, 0], expected)


# ------------------------------------------------------------------------ stages, each alone
def dense_A(k, g_cum, beta, bos, n, b=0, hv=0, H_ratio=1):
    """The strict A of one chunk with explicit loops, fp64."""
    A = torch.zeros(n, n, dtype=torch.float64)
    kk, G, bb = k[b, bos:bos + n, hv // H_ratio].double(), g_cum[b, bos:bos + n, hv].double(), beta[b, bos:bos + n, hv].double()
    for i in range(n):
        for j in range(i):
            A[i, j] = bb[i] * (kk[i] @ kk[j]) * math.exp(G[i] - G[j])
    return A


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
def test_kkt_solve_properties_and_vs_solve_triangular(dtype):
    B, T, H, HV, K = 2, 100, 1, 2, 24  # chunks of 64 and 36 rows
    q, k, v, g, beta = make_inputs(B, T, H, HV, K, 8, dtype, seed=5)
    g_cum = torch_aura.gdn_chunk_cumsum(g)
    Ai = torch_aura.gdn_kkt_solve(k, g_cum, beta)
    assert Ai.shape == (B, T, HV, BT) and Ai.dtype == dtype
    for b in range(B):
        for hv in range(HV):
            for bos, n in ((0, 64), (64, 36)):
                X = Ai[b, bos:bos + n, hv].double()  # [n, 64]
                assert torch.equal(X[:, :n].diagonal(), torch.ones(n, dtype=torch.float64)), "diag != 1"
                assert torch.equal(X[:, :n].triu(1), torch.zeros(n, n, dtype=torch.float64)), "upper != 0"
                assert torch.equal(X[:, n:], torch.zeros(n, BT - n, dtype=torch.float64)), "cols past end"
                A = dense_A(k, g_cum, beta, bos, n, b, hv, HV // H)
                eye = torch.eye(n, dtype=torch.float64)
                exact = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
                assert_close("Ai vs solve_triangular", X[:, :n], exact,
                             1e-6 if dtype == torch.float32 else STAGE_RATIO)
                assert_close("(I + A) Ai", (eye + A) @ X[:, :n], eye,
                             1e-6 if dtype == torch.float32 else 2e-2)


def test_kkt_strong_decay_no_nan():
    # gate_norm 0.01: g in -69..-31 per token, read as -20 (G_MIN); G_i - G_j above the diagonal
    # still overflows exp() (|G| up to 1280 in a chunk); the select (not a 0/1 multiply) keeps NaN
    # out, also in the padded rows of a partial chunk
    q, k, v, g, beta = make_inputs(1, 77, 1, 1, 16, 16, torch.float32, gate_norm=0.01, seed=1)
    g_cum = ref.gdn_chunk_cumsum(g)
    assert g_cum.min() < -1000  # e^{-G_j} is inf in fp32 within a chunk
    Ai = ref.gdn_kkt_solve(k, g_cum, beta)
    assert torch.isfinite(Ai).all()
    # with such decay consecutive tokens barely interact: Ai ~ I
    assert (Ai[0, :64, 0, :64] - torch.eye(64)).abs().max() < 1e-6


def test_chunk_cumsum_resets_per_chunk_and_sequence():
    g = -torch.rand(1, 150, 3)
    cu = cu_tensor([70, 0, 5, 75])
    for c, ci in ((None, None), (cu, None), (cu, torch_aura.gdn_chunk_indices(cu))):
        got = torch_aura.gdn_chunk_cumsum(g, c, ci)
        assert got.dtype == torch.float32
        starts = [0] if c is None else c.tolist()[:-1]
        expected = torch.empty_like(g)
        seq_start = 0
        for t in range(150):
            if c is not None:
                seq_start = max(s for s in starts if s <= t)
            if (t - seq_start) % BT == 0:
                acc = torch.zeros(3)
            acc = acc + g[0, t]
            expected[0, t] = acc
        assert_close("g_cum", got, expected, 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
def test_recompute_w_u_vs_dense(dtype):
    B, T, H, HV, K, V = 1, 90, 2, 4, 20, 36
    q, k, v, g, beta = make_inputs(B, T, H, HV, K, V, dtype, seed=7)
    g_cum = ref.gdn_chunk_cumsum(g)
    Ai = ref.gdn_kkt_solve(k, g_cum, beta)
    w, u = torch_aura.gdn_recompute_w_u(k, v, beta, Ai, g_cum)
    assert w.dtype == u.dtype == dtype
    # dense per chunk and head, fp64 from the same (rounded) Ai
    w_ref = torch.zeros(B, T, HV, K, dtype=torch.float64)
    u_ref = torch.zeros(B, T, HV, V, dtype=torch.float64)
    for bos in range(0, T, BT):
        n = min(BT, T - bos)
        for hv in range(HV):
            X = Ai[0, bos:bos + n, hv, :n].double()
            bt, G = beta[0, bos:bos + n, hv].double(), g_cum[0, bos:bos + n, hv].double()
            w_ref[0, bos:bos + n, hv] = X @ (k[0, bos:bos + n, hv // 2].double() * (bt * G.exp())[:, None])
            u_ref[0, bos:bos + n, hv] = X @ (v[0, bos:bos + n, hv].double() * bt[:, None])
    ratio = 1e-6 if dtype == torch.float32 else STAGE_RATIO
    assert_close("w", w, w_ref, ratio)
    assert_close("u", u, u_ref, ratio)


def dense_fwd_h(k, w, u, g_cum, h0, H_ratio):
    """fwd_h of gdn.md §2 with token loops, fp64, fixed length: (h, v_new, final)."""
    B, T, _, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    k, w, u, G = k.double(), w.double(), u.double(), g_cum.double()
    head = torch.arange(HV) // H_ratio
    S = h0.double().clone()
    hs, v_new = [], torch.zeros(B, T, HV, V, dtype=torch.float64)
    for bos in range(0, T, BT):
        eos = min(bos + BT, T)
        hs.append(S.clone())
        for t in range(bos, eos):
            v_new[:, t] = u[:, t] - torch.einsum("bhk,bhkv->bhv", w[:, t], S)
        L = eos - 1
        S_next = torch.exp(G[:, L])[..., None, None] * S
        for t in range(bos, eos):
            S_next = S_next + torch.exp(G[:, L] - G[:, t])[..., None, None] * \
                k[:, t, head][..., :, None] * v_new[:, t][..., None, :]
        S = S_next
    return torch.stack(hs, 1), v_new, S


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("with_h0", [False, True], ids=["h0none", "h0randn"])
def test_fwd_h_vs_dense(dtype, with_h0):
    B, T, H, HV, K, V = 2, 100, 1, 2, 24, 20
    q, k, v, g, beta = make_inputs(B, T, H, HV, K, V, dtype, seed=8)
    g_cum = ref.gdn_chunk_cumsum(g)
    Ai = ref.gdn_kkt_solve(k, g_cum, beta)
    w, u = ref.gdn_recompute_w_u(k, v, beta, Ai, g_cum)
    h0 = randn_state(B, HV, K, V) if with_h0 else None
    h, v_new, final = torch_aura.gdn_fwd_h(k, w, u, g_cum, h0)
    assert h.dtype == v_new.dtype == dtype and final.dtype == torch.float32
    h_ref, vn_ref, f_ref = dense_fwd_h(k, w, u, g_cum, torch.zeros(B, HV, K, V) if h0 is None else h0, HV // H)
    ratio = 1e-5 if dtype == torch.float32 else STAGE_RATIO
    assert_close("h", h, h_ref, ratio)
    assert_close("v_new", v_new, vn_ref, ratio)
    assert_close("final_state", final, f_ref, ratio)
    if h0 is None:
        assert torch.equal(h[:, 0], torch.zeros_like(h[:, 0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
def test_fwd_o_from_recurrence_states(dtype):
    # feed fwd_o the oracle's chunk-entry states and deltas: its output must be the oracle's o
    B, T, H, HV, K, V = 2, 90, 2, 4, 16, 28
    q, k, v, g, beta = make_inputs(B, T, H, HV, K, V, dtype, seed=9)
    h0 = randn_state(B, HV, K, V)
    o_ref, _, delta, starts = oracle(q, k, v, g, beta, h0, 0.3)
    h = oracle_h(starts, True).to(dtype)
    g_cum = ref.gdn_chunk_cumsum(g)
    o = torch_aura.gdn_fwd_o(q, k, delta.to(dtype), h, g_cum, 0.3)
    assert o.dtype == dtype
    assert_close("o", o, o_ref, 1e-5 if dtype == torch.float32 else STAGE_RATIO)


# ------------------------------------------------------------------------------------ varlen
VARLEN_CASES = [
    # (lengths, H, HV, K, V, pass chunk_indices)
    ([15], 2, 2, 60, 60, False),
    ([31, 0, 63, 64, 65, 1], 2, 4, 24, 16, True),
    ([0, 0, 40], 1, 3, 16, 20, True),
]


@pytest.mark.parametrize("lengths,H,HV,K,V,with_ci", VARLEN_CASES,
                         ids=[f"L{'_'.join(map(str, c[0]))}-H{c[1]}-HV{c[2]}-K{c[3]}-V{c[4]}-ci{int(c[5])}"
                              for c in VARLEN_CASES])
def test_varlen_chunk_and_recurrent_fp64(lengths, H, HV, K, V, with_ci):
    T, N = sum(lengths), len(lengths)
    q, k, v, g, beta = make_inputs(1, T, H, HV, K, V, torch.float64, seed=N)
    cu = cu_tensor(lengths, torch.int64 if with_ci else torch.int32)
    ci = torch_aura.gdn_chunk_indices(cu) if with_ci else None
    h0 = randn_state(N, HV, K, V, dtype=torch.float64)
    o_ref, f_ref, delta, starts = oracle(q, k, v, g, beta, h0, None, cu)

    o, final = ref.gdn_chunk(q, k, v, g, beta, None, h0, cu, ci)
    assert_close("o", o, o_ref, FP64_RATIO)
    assert_close("final_state", final, f_ref, FP64_RATIO)
    for n, L in enumerate(lengths):
        if L == 0:  # no chunks: the state passes through untouched
            assert torch.equal(final[n], h0[n])

    ci = torch_aura.gdn_chunk_indices(cu)
    g_cum = ref.gdn_chunk_cumsum(g, cu)
    Ai = ref.gdn_kkt_solve(k, g_cum, beta, cu)
    w, u = ref.gdn_recompute_w_u(k, v, beta, Ai, g_cum, cu)
    h, v_new, _ = ref.gdn_fwd_h(k, w, u, g_cum, h0, cu, ci)
    assert h.shape[1] == ci.shape[0] == sum(math.ceil(L / BT) for L in lengths)
    assert_close("h", h, oracle_h(starts, False), FP64_RATIO)
    assert_close("v_new", v_new, delta, FP64_RATIO)

    # the [V, K] layout: same numbers, transposed
    o_vk, final_vk = ref.gdn_chunk(q, k, v, g, beta, None, h0.transpose(-1, -2).contiguous(), cu, ci,
                                   False, True)
    assert_close("o (state_v_first)", o_vk, o_ref, FP64_RATIO)
    assert_close("final_state (state_v_first)", final_vk.transpose(-1, -2), f_ref, FP64_RATIO)

    pool = torch.zeros(N + 2, HV, K, V, dtype=torch.float64)
    slots = torch.randperm(N + 2, generator=torch.Generator().manual_seed(0))[:N].to(torch.int32)
    pool[slots.long()] = h0
    before = pool.clone()
    o_rec = ref.gdn_recurrent(q, k, v, g, beta, pool, slots, cu)
    assert_close("recurrent o", o_rec, o_ref, FP64_RATIO)
    for n, L in enumerate(lengths):
        s = int(slots[n])
        assert torch.equal(pool[s], before[s]) if L == 0 else torch.allclose(pool[s], f_ref[n], atol=1e-10)


def test_varlen_many_short_documents_ops_fp32():
    # hundreds of 1-8 token documents (FlashInfer/serving style), through the ops in fp32
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (300,), generator=gen).tolist()
    lengths[7] = 0
    T, N, H, HV, K, V = sum(lengths), len(lengths), 1, 2, 16, 12
    q, k, v, g, beta = make_inputs(1, T, H, HV, K, V, torch.float32, seed=4)
    cu = cu_tensor(lengths)
    h0 = randn_state(N, HV, K, V)
    o_ref, f_ref, _, _ = oracle(q, k, v, g, beta, h0, None, cu)
    o, final = torch_aura.gdn_chunk(q, k, v, g, beta, None, h0, cu)  # builds chunk_indices itself
    assert_close("o", o, o_ref, 1e-5)
    assert_close("final_state", final, f_ref, 1e-5)
    assert torch.equal(final[7], h0[7])
    pool = h0.clone()
    o_rec = torch_aura.gdn_recurrent(q, k, v, g, beta, pool, None, cu)
    assert_close("recurrent o", o_rec, o_ref, 1e-5)
    assert_close("recurrent state", pool, f_ref, 1e-5)


def test_fwd_h_varlen_grid_beyond_65535():
    # 2050 short documents x 32 value heads = 65600 (chunk, head) programs: more than CUDA's grid
    # y/z limit, so kernels must flatten the grid. Shape through the fake (meta), values for real.
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 3, (2050,), generator=gen).tolist()
    T, HV, K, V = sum(lengths), 32, 4, 4
    cu = cu_tensor(lengths)
    ci = torch_aura.gdn_chunk_indices(cu)
    assert ci.shape == (2050, 2) and ci.shape[0] * HV > 65535
    meta = lambda *s: torch.zeros(*s, device="meta")  # noqa: E731
    h, v_new, final = torch.ops.aura.gdn_fwd_h(meta(1, T, 8, K), meta(1, T, HV, K), meta(1, T, HV, V),
                                               meta(1, T, HV), None, cu.to("meta"), ci.to("meta"))
    assert h.shape == (1, 2050, HV, K, V) and v_new.shape == (1, T, HV, V) and final.shape == (2050, HV, K, V)

    # real run of the sequential stage; a sample of documents checked against the dense form
    gen = torch.Generator().manual_seed(2)
    k = F.normalize(torch.randn(1, T, 8, K, generator=gen), dim=-1)
    w, u = 0.1 * torch.randn(1, T, HV, K, generator=gen), torch.randn(1, T, HV, V, generator=gen)
    g_cum = torch_aura.gdn_chunk_cumsum(-torch.rand(1, T, HV, generator=gen), cu, ci)
    h0 = randn_state(2050, HV, K, V)
    h, v_new, final = torch_aura.gdn_fwd_h(k, w, u, g_cum, h0, cu, ci)
    c = cu.tolist()
    for n in range(0, 2050, 97):
        s = slice(c[n], c[n + 1])
        h_ref, vn_ref, f_ref = dense_fwd_h(k[:, s], w[:, s], u[:, s], g_cum[:, s], h0[n:n + 1], HV // 8)
        assert_close(f"h[{n}]", h[:, n:n + 1], h_ref, 1e-5)
        assert_close(f"v_new[{n}]", v_new[:, s], vn_ref, 1e-5)
        assert_close(f"final_state[{n}]", final[n:n + 1], f_ref, 1e-5)


def test_chunk_indices_helper():
    cu = torch.tensor([0, 70, 70, 75, 203], dtype=torch.int64)
    ci = torch_aura.gdn_chunk_indices(cu)
    assert ci.dtype == torch.int32
    assert ci.tolist() == [[0, 0], [0, 1], [2, 0], [3, 0], [3, 1]]
    assert torch_aura.gdn_chunk_indices(cu.to(torch.int32), chunk_size=100).tolist() == [[0, 0], [2, 0], [3, 0], [3, 1]]
    assert torch_aura.gdn_chunk_indices(torch.tensor([0], dtype=torch.int32)).shape == (0, 2)
    with pytest.raises(ValueError, match="cu_seqlens"):
        torch_aura.gdn_chunk_indices(torch.tensor([0, 5, 3]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        torch_aura.gdn_chunk_indices(torch.tensor([0.0, 5.0]))
    with pytest.raises(ValueError, match="chunk_size"):
        torch_aura.gdn_chunk_indices(cu, chunk_size=0)


# ---------------------------------------------------------------------- layouts and gates
LAYOUT_CASES = [(1, 63, 1, 1, 64, 64), (2, 150, 3, 3, 60, 36), (1, 70, 2, 4, 32, 48)]


@pytest.mark.parametrize("B,T,H,HV,K,V", LAYOUT_CASES, ids=[T_id(*c) for c in LAYOUT_CASES])
def test_state_v_first_parity(B, T, H, HV, K, V):
    q, k, v, g, beta = make_inputs(B, T, H, HV, K, V, torch.float32, seed=11)
    h0 = randn_state(B, HV, K, V)
    o_kv, f_kv = torch_aura.gdn_chunk(q, k, v, g, beta, None, h0)
    o_vk, f_vk = torch_aura.gdn_chunk(q, k, v, g, beta, None, h0.transpose(-1, -2).contiguous(), None, None,
                                      False, True)
    assert f_vk.shape == (B, HV, V, K)
    assert_close("o", o_vk, o_kv, LAYOUT_RATIO)
    assert_close("final_state", f_vk.transpose(-1, -2), f_kv, LAYOUT_RATIO)

    g_cum = ref.gdn_chunk_cumsum(g)
    w, u = ref.gdn_recompute_w_u(k, v, beta, ref.gdn_kkt_solve(k, g_cum, beta), g_cum)
    h_kv, vn_kv, _ = torch_aura.gdn_fwd_h(k, w, u, g_cum, h0)
    h_vk, vn_vk, _ = torch_aura.gdn_fwd_h(k, w, u, g_cum, h0.transpose(-1, -2).contiguous(), None, None, True)
    assert_close("h", h_vk.transpose(-1, -2), h_kv, LAYOUT_RATIO)
    assert_close("v_new", vn_vk, vn_kv, LAYOUT_RATIO)
    o2 = torch_aura.gdn_fwd_o(q, k, vn_vk, h_vk, g_cum, None, None, None, True)
    assert_close("fwd_o", o2, o_kv, LAYOUT_RATIO)

    p_kv, p_vk = h0.clone(), h0.transpose(-1, -2).contiguous()
    r_kv = torch_aura.gdn_recurrent(q, k, v, g, beta, p_kv)
    r_vk = torch_aura.gdn_recurrent(q, k, v, g, beta, p_vk, None, None, None, False, True)
    assert_close("recurrent o", r_vk, r_kv, LAYOUT_RATIO)
    assert_close("recurrent state", p_vk.transpose(-1, -2), p_kv, LAYOUT_RATIO)


@pytest.mark.parametrize("gate", ["g0", "gate_norm0.01", "heads25pct_g0"])
def test_gate_extremes_finite_and_correct(gate):
    B, T, H, HV, K, V = 1, 140, 2, 4, 32, 32
    gate_norm, mask_p = (1.0, 1.0) if gate == "g0" else (0.01, 0.0) if gate == "gate_norm0.01" else (1.0, 0.0)
    q, k, v, g, beta = make_inputs(B, T, H, HV, K, V, torch.float32, gate_norm, mask_p, seed=12)
    if gate == "heads25pct_g0":
        g[..., 0] = 0.0  # one head in four never decays (FlashQLA's benchmark mix)
    if gate == "g0":
        assert (g == 0).all()
    h0 = randn_state(B, HV, K, V)
    o_ref, f_ref, _, _ = oracle(q, k, v, g, beta, h0)
    g_cum = torch_aura.gdn_chunk_cumsum(g)
    Ai = torch_aura.gdn_kkt_solve(k, g_cum, beta)
    w, u = torch_aura.gdn_recompute_w_u(k, v, beta, Ai, g_cum)
    h, v_new, final = torch_aura.gdn_fwd_h(k, w, u, g_cum, h0)
    o = torch_aura.gdn_fwd_o(q, k, v_new, h, g_cum)
    for name, t in dict(g_cum=g_cum, Ai=Ai, w=w, u=u, h=h, v_new=v_new, final=final, o=o).items():
        assert torch.isfinite(t).all(), f"{name} has NaN/Inf"
    assert_close("o", o, o_ref, 1e-4)
    assert_close("final_state", final, f_ref, 1e-4)


# ---------------------------------------------------------------------------- recurrent pool
def test_recurrent_shuffled_pool_skip_and_bf16_pool():
    B, T, H, HV, K, V, P = 4, 3, 1, 2, 16, 12, 7
    q, k, v, g, beta = make_inputs(B, T, H, HV, K, V, torch.float32, seed=13)
    idx = torch.tensor([5, -1, 0, 3], dtype=torch.int32)
    for pool_dtype in (torch.float32, torch.bfloat16):
        pool = randn_state(P, HV, K, V, seed=2, dtype=pool_dtype)
        before = pool.clone()
        o = torch_aura.gdn_recurrent(q, k, v, g, beta, pool, idx, None, 0.5)
        live = [0, 2, 3]
        o_ref, f_ref, _, _ = oracle(q[live], k[live], v[live], g[live], beta[live], before[idx[live].long()], 0.5)
        assert torch.equal(o[1], torch.zeros_like(o[1])), "skipped sequence must output zeros"
        untouched = [r for r in range(P) if r not in (5, 0, 3)]
        assert torch.equal(pool[untouched], before[untouched]), "rows not indexed must be untouched"
        assert_close("o", o[live], o_ref, 1e-5)
        if pool_dtype == torch.float32:
            assert_close("state", pool[idx[live].long()], f_ref, 1e-5)
        else:  # fp32 registers, rounded ONCE on the store: equal to the rounded fp32 result
            assert pool.dtype == torch.bfloat16
            exact = f_ref.to(torch.bfloat16).float()
            got = pool[idx[live].long()].float()
            assert (got - exact).abs().max() <= 2 ** -7 * exact.abs().max()
            assert_close("bf16 state", got, f_ref, 5e-3)


def test_recurrent_l2norm_never_rounded():
    # recurrent normalises in fp32 and never rounds (gdn.md §4), unlike the chunk path
    q, k, v, g, beta = make_inputs(2, 5, 1, 1, 32, 16, torch.bfloat16, seed=14)
    q, k = (3 * q.float()).to(torch.bfloat16), (0.3 * k.float()).to(torch.bfloat16)
    pool = torch.zeros(2, 1, 32, 16)
    o = ref.gdn_recurrent(q, k, v, g, beta, pool, None, None, None, True)
    o_ref, f_ref, _, _ = oracle(q, k, v, g, beta, None, None, None, l2norm=True)
    assert_close("state", pool, f_ref, 1e-6)  # fp32 state: nothing but fp32 round-off
    assert_close("o", o, o_ref, 5e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_chunk_then_recurrent_continuation(dtype):
    # prefill with gdn_chunk, then decode token by token with gdn_recurrent from its final state
    B, T1, T2, H, HV, K, V = 2, 70, 5, 1, 2, 32, 24
    q, k, v, g, beta = make_inputs(B, T1 + T2, H, HV, K, V, dtype, seed=15)
    o_ref, f_ref, _, _ = oracle(q, k, v, g, beta)
    o1, state = torch_aura.gdn_chunk(q[:, :T1], k[:, :T1], v[:, :T1], g[:, :T1], beta[:, :T1])
    outs = []
    for t in range(T1, T1 + T2):
        s = slice(t, t + 1)
        outs.append(torch_aura.gdn_recurrent(q[:, s], k[:, s], v[:, s], g[:, s], beta[:, s], state))
    o = torch.cat([o1, *outs], dim=1)
    ratio = 1e-5 if dtype == torch.float32 else GDN_CHUNK_RATIO
    assert_close("o", o, o_ref, ratio)
    assert_close("final_state", state, f_ref, ratio)


# ------------------------------------------------------------------------------ bad inputs
def _base(device, B=1, T=5, H=1, HV=2, K=8, V=6, dtype=torch.float32):
    z = lambda *s, dt=dtype: torch.zeros(*s, dtype=dt, device=device)  # noqa: E731
    return dict(q=z(B, T, H, K), k=z(B, T, H, K), v=z(B, T, HV, V), g=z(B, T, HV, dt=torch.float32),
                beta=z(B, T, HV, dt=torch.float32), g_cum=z(B, T, HV, dt=torch.float32),
                Ai=z(B, T, HV, BT), w=z(B, T, HV, K), u=z(B, T, HV, V), h=z(B, 1, HV, K, V),
                state=z(B, HV, K, V, dt=torch.float32))


def _args(op, d, **over):
    d = {**d, **over}
    return {
        "gdn_chunk": lambda: (d["q"], d["k"], d["v"], d["g"], d["beta"], None, d.get("initial_state"),
                              d.get("cu_seqlens"), d.get("chunk_indices")),
        "gdn_chunk_cumsum": lambda: (d["g"], d.get("cu_seqlens"), d.get("chunk_indices")),
        "gdn_kkt_solve": lambda: (d["k"], d["g_cum"], d["beta"], d.get("cu_seqlens"), d.get("chunk_indices")),
        "gdn_recompute_w_u": lambda: (d["k"], d["v"], d["beta"], d["Ai"], d["g_cum"], d.get("cu_seqlens"),
                                      d.get("chunk_indices")),
        "gdn_fwd_h": lambda: (d["k"], d["w"], d["u"], d["g_cum"], d.get("initial_state"), d.get("cu_seqlens"),
                              d.get("chunk_indices")),
        "gdn_fwd_o": lambda: (d["q"], d["k"], d["u"], d["h"], d["g_cum"], None, d.get("cu_seqlens"),
                              d.get("chunk_indices")),
        "gdn_recurrent": lambda: (d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"],
                                  d.get("state_indices"), d.get("cu_seqlens")),
    }[op]()


def _i32(*vals, device="cpu"):
    return torch.tensor(vals, dtype=torch.int32, device=device)


# (id, op, build(device) -> args, regex the message must match); metadata errors only
BAD = [
    ("dtype-q-int", "gdn_chunk", lambda dv: _args("gdn_chunk", _base(dv), q=torch.zeros(1, 5, 1, 8, dtype=torch.int32, device=dv)), r"^q: expected dtype"),
    ("dtype-q-fp64", "gdn_recurrent", lambda dv: _args("gdn_recurrent", _base(dv, dtype=torch.float64)), r"^q: expected dtype"),
    ("dtype-v-mismatch", "gdn_chunk", lambda dv: _args("gdn_chunk", _base(dv), v=torch.zeros(1, 5, 2, 6, dtype=torch.bfloat16, device=dv)), r"^v: expected dtype float32 \(the dtype of q\)"),
    ("dtype-g_cum-bf16", "gdn_kkt_solve", lambda dv: _args("gdn_kkt_solve", _base(dv), g_cum=torch.zeros(1, 5, 2, dtype=torch.bfloat16, device=dv)), r"^g_cum: expected dtype float32"),
    ("dtype-Ai", "gdn_recompute_w_u", lambda dv: _args("gdn_recompute_w_u", _base(dv), Ai=torch.zeros(1, 5, 2, BT, dtype=torch.float16, device=dv)), r"^Ai: expected dtype float32"),
    ("dtype-cu_seqlens-float", "gdn_chunk_cumsum", lambda dv: _args("gdn_chunk_cumsum", _base(dv), cu_seqlens=torch.zeros(2, device=dv)), r"^cu_seqlens: expected dtype int32 / int64"),
    ("dtype-chunk_indices-int64", "gdn_kkt_solve", lambda dv: _args("gdn_kkt_solve", _base(dv), cu_seqlens=_i32(0, 5, device=dv), chunk_indices=torch.zeros(1, 2, dtype=torch.int64, device=dv)), r"^chunk_indices: expected dtype int32"),
    ("dtype-state_indices-int64", "gdn_recurrent", lambda dv: _args("gdn_recurrent", _base(dv), state_indices=torch.zeros(1, dtype=torch.int64, device=dv)), r"^state_indices: expected dtype int32"),
    ("rank-q-3d", "gdn_recurrent", lambda dv: _args("gdn_recurrent", _base(dv), q=torch.zeros(5, 1, 8, device=dv)), r"^q: expected a 4-D tensor"),
    ("rank-h-4d", "gdn_fwd_o", lambda dv: _args("gdn_fwd_o", _base(dv), h=torch.zeros(1, 2, 8, 6, device=dv)), r"^h: expected a 5-D tensor"),
    ("rank-g-4d", "gdn_chunk_cumsum", lambda dv: _args("gdn_chunk_cumsum", _base(dv), g=torch.zeros(1, 5, 2, 1, device=dv)), r"^g: expected a 3-D tensor"),
    ("stride-q", "gdn_chunk", lambda dv: _args("gdn_chunk", _base(dv), q=torch.zeros(1, 5, 1, 16, device=dv)[..., ::2]), r"^q: expected a unit stride in the last dim"),
    ("stride-state", "gdn_recurrent", lambda dv: _args("gdn_recurrent", _base(dv), state=torch.zeros(1, 2, 6, 8, device=dv).transpose(-1, -2)), r"^state: expected a unit stride"),
    ("stride-w", "gdn_fwd_h", lambda dv: _args("gdn_fwd_h", _base(dv), w=torch.zeros(1, 5, 8, 2, device=dv).transpose(-1, -2)), r"^w: expected a unit stride"),
    ("size-K257", "gdn_chunk", lambda dv: _args("gdn_chunk", _base(dv, K=257)), r"^k: expected head dim K \(last dim\) in 1\.\.256, got 257"),
    ("size-V257", "gdn_recurrent", lambda dv: _args("gdn_recurrent", _base(dv, V=257)), r"^v: expected head dim V \(last dim\) in 1\.\.256, got 257"),
    ("size-K257-fwd_o", "gdn_fwd_o", lambda dv: _args("gdn_fwd_o", _base(dv, K=257)), r"^q: expected head dim K"),
    ("gva-HV4-H3", "gdn_chunk", lambda dv: _args("gdn_chunk", _base(dv, H=3, HV=4)), r"^v: expected HV \(value heads\) \(4\) to be a multiple of H"),
    ("gva-more-qk-heads", "gdn_kkt_solve", lambda dv: _args("gdn_kkt_solve", _base(dv, H=4, HV=2)), r"^g_cum: expected HV"),
    ("shape-g-T", "gdn_chunk", lambda dv: _args("gdn_chunk", _base(dv), g=torch.zeros(1, 4, 2, device=dv)), r"^g: expected shape \[1, 5, 2\]"),
    ("shape-beta-HV", "gdn_recurrent", lambda dv: _args("gdn_recurrent", _base(dv), beta=torch.zeros(1, 5, 3, device=dv)), r"^beta: expected shape"),
    ("shape-k-vs-q", "gdn_fwd_o", lambda dv: _args("gdn_fwd_o", _base(dv), k=torch.zeros(1, 5, 1, 7, device=dv)), r"^k: expected shape"),
    ("shape-Ai-BT", "gdn_recompute_w_u", lambda dv: _args("gdn_recompute_w_u", _base(dv), Ai=torch.zeros(1, 5, 2, 32, device=dv)), r"^Ai: expected shape \[1, 5, 2, 64\]"),
    ("shape-initial_state-N", "gdn_chunk", lambda dv: _args("gdn_chunk", _base(dv), initial_state=torch.zeros(2, 2, 8, 6, device=dv)), r"^initial_state: expected shape \[1, 2, 8, 6\]"),
    ("shape-initial_state-layout", "gdn_fwd_h", lambda dv: _args("gdn_fwd_h", _base(dv), initial_state=torch.zeros(1, 2, 6, 8, device=dv)), r"^initial_state: expected shape"),
    ("shape-h-NT", "gdn_fwd_o", lambda dv: _args("gdn_fwd_o", _base(dv), h=torch.zeros(1, 2, 2, 8, 6, device=dv)), r"^h: expected shape \[1, 1, 2, 8, 6\]"),
    ("shape-state-HV", "gdn_recurrent", lambda dv: _args("gdn_recurrent", _base(dv), state=torch.zeros(3, 1, 8, 6, device=dv)), r"^state: expected shape"),
    ("shape-state-too-few-rows", "gdn_recurrent", lambda dv: _args("gdn_recurrent", _base(dv, B=3), state=torch.zeros(1, 2, 8, 6, device=dv)), r"^state: expected at least N = 3 pool rows"),
    ("shape-state_indices-N", "gdn_recurrent", lambda dv: _args("gdn_recurrent", _base(dv), state_indices=_i32(0, 1, device=dv)), r"^state_indices: expected shape \[1\]"),
    ("shape-chunk_indices-cols", "gdn_chunk", lambda dv: _args("gdn_chunk", _base(dv), cu_seqlens=_i32(0, 5, device=dv), chunk_indices=torch.zeros(1, 3, dtype=torch.int32, device=dv)), r"^chunk_indices.shape\[1\]: expected 2"),
    ("varlen-B2", "gdn_chunk", lambda dv: _args("gdn_chunk", _base(dv, B=2), cu_seqlens=_i32(0, 2, 5, device=dv)), r"^q: expected batch size B == 1 when cu_seqlens"),
    ("varlen-B2-recurrent", "gdn_recurrent", lambda dv: _args("gdn_recurrent", _base(dv, B=2), cu_seqlens=_i32(0, 5, device=dv)), r"^q: expected batch size B == 1"),
    ("varlen-fwd_h-needs-chunk_indices", "gdn_fwd_h", lambda dv: _args("gdn_fwd_h", _base(dv), cu_seqlens=_i32(0, 2, 5, device=dv)), r"^chunk_indices: expected a \[NT_total, 2\] int32 tensor when cu_seqlens is given"),
    ("varlen-chunk_indices-without-cu", "gdn_chunk_cumsum", lambda dv: _args("gdn_chunk_cumsum", _base(dv), chunk_indices=torch.zeros(1, 2, dtype=torch.int32, device=dv)), r"^chunk_indices: expected None when cu_seqlens is None"),
    ("varlen-cu-2d", "gdn_recurrent", lambda dv: _args("gdn_recurrent", _base(dv), cu_seqlens=torch.zeros(1, 2, dtype=torch.int32, device=dv)), r"^cu_seqlens: expected a 1-D tensor"),
    ("device-k-meta", "gdn_chunk", lambda dv: _args("gdn_chunk", _base("cpu"), k=torch.zeros(1, 5, 1, 8, device="meta")), r"^k: expected device cpu \(the device of q\), got meta"),
    ("device-state-meta", "gdn_recurrent", lambda dv: _args("gdn_recurrent", _base("cpu"), state=torch.zeros(1, 2, 8, 6, device="meta")), r"^state: expected device cpu"),
    ("device-cu-meta", "gdn_fwd_h", lambda dv: _args("gdn_fwd_h", _base("cpu"), cu_seqlens=_i32(0, 5, device="meta"), chunk_indices=_i32(0, 0).reshape(1, 2)), r"^cu_seqlens: expected device cpu"),
]


@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_named_error_eagerly(case):
    _, op, build, match = case
    with pytest.raises(ValueError, match=match):
        getattr(torch_aura, op)(*build("cpu"))
    # the reference itself (what CPU dispatch runs) rejects it too, through the same check
    with pytest.raises(ValueError, match=match):
        getattr(torch.ops.aura, op)(*build("cpu"))


@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_same_error_at_trace_time(case):
    # meta tensors dispatch to the fake, i.e. what torch.compile runs while tracing
    _, op, build, match = case
    with pytest.raises(ValueError, match=match):
        getattr(torch.ops.aura, op)(*build("meta"))


DATA_BAD = [
    ("cu_seqlens-not-ending-at-T", "gdn_chunk", lambda: _args("gdn_chunk", _base("cpu"), cu_seqlens=_i32(0, 2, 4)), r"^cu_seqlens: expected non-decreasing offsets from 0 to T = 5"),
    ("cu_seqlens-decreasing", "gdn_recurrent", lambda: _args("gdn_recurrent", _base("cpu"), state=torch.zeros(3, 2, 8, 6), cu_seqlens=_i32(0, 4, 3, 5)), r"^cu_seqlens: expected non-decreasing"),
    ("chunk_indices-wrong", "gdn_kkt_solve", lambda: _args("gdn_kkt_solve", _base("cpu"), cu_seqlens=_i32(0, 2, 5), chunk_indices=torch.tensor([[0, 0], [0, 1]], dtype=torch.int32)), r"^chunk_indices: expected the 2 chunks of cu_seqlens"),
    ("chunk_indices-count-fwd_h", "gdn_fwd_h", lambda: _args("gdn_fwd_h", _base("cpu"), cu_seqlens=_i32(0, 2, 5), chunk_indices=torch.tensor([[0, 0]], dtype=torch.int32)), r"^chunk_indices: expected the 2 chunks"),
    ("h-NT-varlen-no-ci", "gdn_fwd_o", lambda: _args("gdn_fwd_o", _base("cpu"), cu_seqlens=_i32(0, 2, 5)), r"^h: expected 2 chunk states"),
    ("state_indices-out-of-range", "gdn_recurrent", lambda: _args("gdn_recurrent", _base("cpu"), state_indices=_i32(1)), r"^state_indices: expected pool rows in \[0, 1\) or -1"),
    ("state_indices-below-minus-one", "gdn_recurrent", lambda: _args("gdn_recurrent", _base("cpu"), state_indices=_i32(-2)), r"^state_indices: expected pool rows"),
    ("state_indices-duplicate", "gdn_recurrent", lambda: _args("gdn_recurrent", _base("cpu", B=2), state=torch.zeros(3, 2, 8, 6), state_indices=_i32(2, 2)), r"^state_indices: expected distinct pool rows"),
]


@pytest.mark.parametrize("case", DATA_BAD, ids=[b[0] for b in DATA_BAD])
def test_data_dependent_bad_input_raises_in_reference(case):
    _, op, build, match = case
    with pytest.raises(ValueError, match=match):
        getattr(torch_aura, op)(*build())
