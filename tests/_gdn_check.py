"""GDN kernel-vs-reference checks shared by tests/interp (Triton interpreter, CPU) and tests/cuda.

An ``impl`` is anything with the seven op functions as attributes (the Triton launchers, or the
public ``torch_aura`` wrappers on CUDA tensors). Each check builds FLA-style inputs (gdn.md §5:
L2-normalised q, k; ``g = logsigmoid(rand) / gate_norm`` with a fraction ``mask_p`` set to 0;
``beta = sigmoid(randn)``), runs the kernel and the reference on the same inputs, and compares:

* every stage against the reference stage fed the same reference inputs, so a failure names the
  stage (``check_stages``);
* ``gdn_chunk`` against the reference chunk pipeline (same rounding points) and against the fp64
  token-by-token recurrence (``check_chunk``);
* ``gdn_recurrent`` on a shuffled pool with skipped rows against the reference and the fp64
  recurrence, pool rows included (``check_recurrent``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from _util import GDN_CHUNK_RATIO, GDN_RECURRENT_RATIO, assert_close

from torch_aura.reference import gdn as ref

# kernel vs reference with identical rounding points: only accumulation order differs
STAGE_RATIO = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 5e-3}
# vs the fp64 recurrence: fp32 runs are far tighter than the 16-bit gates of gdn.md §5
CHUNK_RATIO = {torch.float32: 2e-4, torch.float16: GDN_CHUNK_RATIO, torch.bfloat16: GDN_CHUNK_RATIO}
RECURRENT_RATIO = {torch.float32: 1e-5, torch.float16: GDN_RECURRENT_RATIO, torch.bfloat16: GDN_RECURRENT_RATIO}


def make_inputs(device, B, T, H, HV, K, V, dtype, *, gate_norm=1.0, mask_p=0.0, seed=0):
    """``(q, k, v, g, beta)``; q, k, v in ``dtype``, g and beta fp32 (fp64 for fp64 runs), gdn.md §5."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64)
    g = F.logsigmoid(torch.rand(B, T, HV, generator=gen, dtype=torch.float64)) / gate_norm
    if mask_p > 0:
        g = torch.where(torch.rand(B, T, HV, generator=gen, dtype=torch.float64) < mask_p, 0.0, g)
    beta = torch.randn(B, T, HV, generator=gen, dtype=torch.float64).sigmoid()
    q, k, v = (x.to(device=device, dtype=dtype) for x in (q, k, v))
    gb = torch.float64 if dtype == torch.float64 else torch.float32  # fp64 runs stay fp64 throughout
    return q, k, v, g.to(device, gb), beta.to(device, gb)


def recurrence64(q, k, v, g, beta, h0=None, cu=None, scale=None, l2norm=False):
    """The fp64 token-by-token ground truth on CPU: ``(o, final_state)``."""
    N = q.shape[0] if cu is None else cu.shape[0] - 1
    HV, K, V = v.shape[2], q.shape[3], v.shape[3]
    pool = (torch.zeros(N, HV, K, V, dtype=torch.float64) if h0 is None
            else h0.detach().cpu().to(torch.float64).clone())
    args = [x.detach().cpu().to(torch.float64) for x in (q, k, v, g, beta)]
    cu = None if cu is None else cu.cpu()
    o = ref.gdn_recurrent(*args, pool, None, cu, scale, l2norm)
    return o, pool


def empty_chunk_inputs(B, T, H, HV, K, V, cu=None, dtype=torch.bfloat16, strided=False, h0=True,
                       state_v_first=False, with_ci=False, pad=8):
    """Uninitialised CPU inputs of one ``gdn_chunk`` call, for launches that compute nothing (the launch
    stub of tests/build): ``(q, k, v, g, beta, initial_state, cu_seqlens, chunk_indices)``. ``strided``:
    q, k, v as slices of one fused projection with ``pad`` spare columns, as a model's layer hands them
    over; ``cu``: a list of offsets (varlen, B = 1)."""
    if strided:
        qkv = torch.empty(B, T, 2 * H * K + HV * V + pad, dtype=dtype)
        q = qkv[..., :H * K].unflatten(-1, (H, K))
        k = qkv[..., H * K:2 * H * K].unflatten(-1, (H, K))
        v = qkv[..., 2 * H * K:2 * H * K + HV * V].unflatten(-1, (HV, V))
    else:
        q, k, v = (torch.empty(B, T, H, K, dtype=dtype), torch.empty(B, T, H, K, dtype=dtype),
                   torch.empty(B, T, HV, V, dtype=dtype))
    N = B if cu is None else len(cu) - 1
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    ci = ref.chunk_indices_from_cu_seqlens(cu_t) if with_ci and cu is not None else None
    state = torch.zeros(N, HV, *((V, K) if state_v_first else (K, V))) if h0 else None
    return q, k, v, torch.empty(B, T, HV), torch.empty(B, T, HV), state, cu_t, ci


def _cu(device, offsets):
    return None if offsets is None else torch.tensor(offsets, dtype=torch.int32, device=device)


def check_stages(impl, device, B, T, H, HV, K, V, dtype, *, offsets=None, gate_norm=1.0, mask_p=0.0,
                 h0=False, state_v_first=False, seed=0):
    q, k, v, g, beta = make_inputs(device, B, T, H, HV, K, V, dtype, gate_norm=gate_norm, mask_p=mask_p, seed=seed)
    cu = _cu(device, offsets)
    ci = None if cu is None else ref.chunk_indices_from_cu_seqlens(cu)
    r = STAGE_RATIO[dtype]
    g_cum = ref.gdn_chunk_cumsum(g, cu, ci)
    assert_close("gdn_chunk_cumsum", impl.gdn_chunk_cumsum(g, cu, ci), g_cum, r)
    Ai = ref.gdn_kkt_solve(k, g_cum, beta, cu, ci)
    assert_close("gdn_kkt_solve", impl.gdn_kkt_solve(k, g_cum, beta, cu, ci).float(), Ai.float(), r)
    w, u = ref.gdn_recompute_w_u(k, v, beta, Ai, g_cum, cu, ci)
    w_k, u_k = impl.gdn_recompute_w_u(k, v, beta, Ai, g_cum, cu, ci)
    assert_close("gdn_recompute_w_u.w", w_k.float(), w.float(), r)
    assert_close("gdn_recompute_w_u.u", u_k.float(), u.float(), r)
    N = B if cu is None else cu.shape[0] - 1
    sd = (V, K) if state_v_first else (K, V)
    init = torch.randn(N, HV, *sd, generator=torch.Generator().manual_seed(seed + 1)).to(device) if h0 else None
    h, v_new, fin = ref.gdn_fwd_h(k, w, u, g_cum, init, cu, ci, state_v_first)
    h_k, v_new_k, fin_k = impl.gdn_fwd_h(k, w, u, g_cum, init, cu, ci, state_v_first)
    assert_close("gdn_fwd_h.h", h_k.float(), h.float(), r)
    assert_close("gdn_fwd_h.v_new", v_new_k.float(), v_new.float(), r)
    assert_close("gdn_fwd_h.final_state", fin_k, fin, r)
    o = ref.gdn_fwd_o(q, k, v_new, h, g_cum, 0.7, cu, ci, state_v_first)
    assert_close("gdn_fwd_o", impl.gdn_fwd_o(q, k, v_new, h, g_cum, 0.7, cu, ci, state_v_first).float(),
                 o.float(), r)


def check_chunk(impl, device, B, T, H, HV, K, V, dtype, *, offsets=None, gate_norm=1.0, mask_p=0.0,
                h0=False, scale=None, l2norm=False, state_v_first=False, pass_ci=True, seed=0):
    q, k, v, g, beta = make_inputs(device, B, T, H, HV, K, V, dtype, gate_norm=gate_norm, mask_p=mask_p, seed=seed)
    if l2norm:  # unnormalised inputs: the op normalises (and rounds) them
        gen = torch.Generator().manual_seed(seed + 2)
        q = (torch.randn(q.shape, generator=gen) * 3).to(device, dtype)
        k = (torch.randn(k.shape, generator=gen) * 3).to(device, dtype)
    cu = _cu(device, offsets)
    ci = ref.chunk_indices_from_cu_seqlens(cu) if cu is not None and pass_ci else None
    N = B if cu is None else cu.shape[0] - 1
    init = torch.randn(N, HV, K, V, generator=torch.Generator().manual_seed(seed + 1)).to(device) if h0 else None
    init_l = None if init is None else (init.transpose(-1, -2).contiguous() if state_v_first else init)
    o, fin = impl.gdn_chunk(q, k, v, g, beta, scale, init_l, cu, ci, l2norm, state_v_first)
    if state_v_first:
        fin = fin.transpose(-1, -2)
    o_ref, fin_ref = ref.gdn_chunk(q, k, v, g, beta, scale, init, cu, ci, l2norm, False)
    assert_close("gdn_chunk.o vs reference chunk", o.float(), o_ref.float(), STAGE_RATIO[dtype] * 2)
    assert_close("gdn_chunk.final_state vs reference chunk", fin, fin_ref, STAGE_RATIO[dtype] * 2)
    # the chunk path rounds normalised q, k to the input dtype (gdn.md §3.6): feed the truth the same
    if l2norm:
        q, k = ref._l2norm(q.double()).to(dtype), ref._l2norm(k.double()).to(dtype)
    o64, fin64 = recurrence64(q, k, v, g, beta, init, cu, scale)
    assert_close("gdn_chunk.o vs fp64 recurrence", o.double().cpu(), o64, CHUNK_RATIO[dtype])
    assert_close("gdn_chunk.final_state vs fp64 recurrence", fin.double().cpu(), fin64, CHUNK_RATIO[dtype])
    return o, fin


def check_recurrent(impl, device, B, T, H, HV, K, V, dtype, *, offsets=None, gate_norm=1.0, scale=None,
                    l2norm=False, state_v_first=False, pool_dtype=torch.float32, skip=True, seed=0):
    q, k, v, g, beta = make_inputs(device, B, T, H, HV, K, V, dtype, gate_norm=gate_norm, seed=seed)
    cu = _cu(device, offsets)
    N = B if cu is None else cu.shape[0] - 1
    P = N + 3
    gen = torch.Generator().manual_seed(seed + 1)
    pool64 = torch.randn(P, HV, K, V, generator=gen, dtype=torch.float64)
    rows = torch.randperm(P, generator=gen)[:N].to(torch.int32)  # shuffled pool rows
    if skip and N > 1:
        rows[1] = -1
    pool = pool64.to(pool_dtype)
    pool_l = (pool.transpose(-1, -2) if state_v_first else pool).to(device, copy=True).contiguous()
    o = impl.gdn_recurrent(q, k, v, g, beta, pool_l, rows.to(device), cu, scale, l2norm, state_v_first)
    after = (pool_l.transpose(-1, -2) if state_v_first else pool_l).cpu()
    # the reference on the same (rounded) pool: one fp32 recurrence, the same algorithm
    pool_r = pool.clone()
    o_ref = ref.gdn_recurrent(q.cpu(), k.cpu(), v.cpu(), g.cpu(), beta.cpu(), pool_r, rows, None if cu is None
                              else cu.cpu(), scale, l2norm)
    r = RECURRENT_RATIO[dtype] if pool_dtype == torch.float32 else GDN_RECURRENT_RATIO
    assert_close("gdn_recurrent.o vs reference", o.float().cpu(), o_ref.float(), r)
    assert_close("gdn_recurrent.state vs reference", after.float(), pool_r.float(), r)
    untouched = torch.ones(P, dtype=torch.bool)
    untouched[rows[rows >= 0].long()] = False
    if cu is not None:  # a zero-length sequence leaves its row untouched
        lens = (cu[1:] - cu[:-1]).cpu()
        untouched[rows[(rows >= 0) & (lens == 0)].long()] = True
    assert torch.equal(after[untouched], pool[untouched]), "gdn_recurrent wrote pool rows it does not own"
    for n in range(N):
        if rows[n] < 0:  # skipped sequence: zeros in o
            sl = (slice(n, n + 1), slice(None)) if cu is None else (slice(None), slice(int(cu[n]), int(cu[n + 1])))
            assert torch.all(o[sl].float() == 0), f"gdn_recurrent: skipped sequence {n} has non-zero o"
    return o


def check_pass_ignores_rows_outside_sequences(chunk, device, K, V, dtype):
    """The sequential pass fetches whole 64-row chunks (TMA copies through per-sequence descriptors, or
    masked pointer loads): past a varlen sequence's end lie the next sequence's rows or, past
    ``cu_seqlens[-1]``, memory no kernel wrote. NaN in every such row of w, u, A_qk, q and k must
    change nothing. ``chunk`` is the launcher module (the seams are patched where they live:
    ``_common``, ``state_pass``); the TMA and pointer paths must also agree (bit for
    bit within the Triton kernel; to rounding where the default is the Hopper pass, whose MMAs sum in
    another order). Returns ``(tma, hopper)``: whether the default run copied its tiles, and whether it
    was the Hopper (Gluon) pass."""
    from torch_aura.triton_kernels.gdn import _common, state_pass

    T, H, HV = 150, 1, 2
    q, k, v, g, beta = make_inputs(device, 1, T, H, HV, K, V, dtype, seed=3)
    cu = _cu(device, [0, 40, 100])  # rows 100..149 belong to no sequence
    ci = ref.chunk_indices_from_cu_seqlens(cu)
    NT_total = ci.shape[0]
    p = chunk._chunk_prep(q, k, v, g, beta, cu, ci, 3, NT_total)

    def run(fill, tma=None, hopper=True):
        xs = {name: getattr(p, name).clone() for name in ("w", "u", "a_qk")}
        xs["q"] = q.clone()
        kk = k.clone()
        for x in (*xs.values(), kk):
            x[:, 100:] = fill
        o = torch.zeros(1, T, HV, V, dtype=dtype, device=device)
        ready, hopper_ready = _common._tma_ready, state_pass._hopper_pass_ready
        if tma is not None:
            _common._tma_ready = lambda *a: tma
        if not hopper:
            state_pass._hopper_pass_ready = lambda *a: False
        try:
            fin = chunk._state_pass(kk, xs["w"], xs["u"], p.g_cum, None, cu, ci, 3, NT_total, False,
                                    q=xs["q"], a_qk=xs["a_qk"], o=o, scale=K ** -0.5)
        finally:
            _common._tma_ready, state_pass._hopper_pass_ready = ready, hopper_ready
        return o[:, :100], fin

    tma = _common._pass_copies_tiles(k, p.w, p.u, q, p.a_qk)
    hopper = state_pass._hopper_pass_ready(k, tma, True)
    for use_hopper in (True, False) if hopper else (False,):  # both passes ignore those rows
        o0, f0 = run(0.0, hopper=use_hopper)
        o1, f1 = run(float("nan"), hopper=use_hopper)
        assert torch.isfinite(o1).all() and torch.isfinite(f1).all(), "rows outside every sequence leaked NaN"
        assert torch.equal(o0, o1) and torch.equal(f0, f1), "rows outside every sequence changed the result"
    o0, f0 = run(0.0, hopper=False)
    o2, f2 = run(0.0, tma=False)
    assert_close("state pass: pointer loads vs tensor-memory copies (o)", o2.float(), o0.float(), 1e-6)
    assert_close("state pass: pointer loads vs tensor-memory copies (final)", f2, f0, 1e-6)
    if hopper:
        o3, f3 = run(0.0)
        assert_close("state pass: Hopper (Gluon) vs Triton (o)", o3.float(), o0.float(), 2e-3)
        assert_close("state pass: Hopper (Gluon) vs Triton (final)", f3, f0, 2e-3)
    return tma, hopper


def check_w_u_copies_match_pointer_loads(chunk, device, B, T, H, HV, K, V, dtype):
    """The w/u kernel's fixed-length TMA path (host descriptors, ``fixed_tile``) against its pointer
    path on the same inputs: w, u and A_qk equal bit for bit (same loads, same products), including a
    partial last chunk (T % 64 != 0, where the copies zero-fill and clip at T). Returns whether the TMA
    path ran."""
    q, k, v, g, beta = make_inputs(device, B, T, H, HV, K, V, dtype, seed=4)
    from torch_aura.triton_kernels.gdn import prep

    NT = -(-T // 64)
    ready, decided, runs = prep._w_u_tma, [], []

    def spy(*args):
        decided.append(ready(*args))
        return decided[-1]

    for choose in (spy, lambda *args: False):
        prep._w_u_tma = choose
        try:
            runs.append(chunk._chunk_prep(q, k, v, g, beta, None, None, NT, B * NT))
        finally:
            prep._w_u_tma = ready
    for name in ("w", "u", "a_qk"):
        assert torch.equal(getattr(runs[0], name), getattr(runs[1], name)), f"w/u {name}: copies vs pointer loads"
    return decided[0]


def decay_domain_inputs(device, dtype, B=1, T=150, H=1, HV=2, K=16, V=16, seed=3):
    """Inputs whose g leaves the usual range: -inf (a full forget) at a chunk start, a chunk end,
    twice in a row and on every head of one token, and g > 0 on a head and on a whole token."""
    q, k, v, g, beta = make_inputs(device, B, T, H, HV, K, V, dtype, seed=seed)
    g = g.clone()
    for t, h in ((5, 0), (63, 1), (100, 0), (101, 0), (149, 1)):
        g[:, t, h] = float("-inf")
    g[:, 64, :] = float("-inf")
    g[:, 20, :] = 0.7
    g[:, 120, 1] = 3.0
    return q, k, v, g, beta


def _exact_recurrence(q, k, v, g, beta):
    """fp64 loop written from gdn.md §1 with g as given (exp(-inf) = 0 exactly), fixed length."""
    q, k, v, g, beta = (x.detach().double().cpu() for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    S = torch.zeros(B, HV, K, V, dtype=torch.float64)
    o = torch.zeros(B, T, HV, V, dtype=torch.float64)
    for t in range(T):
        for hv in range(HV):
            h = hv // (HV // H)
            kt, qt = k[:, t, h], q[:, t, h]
            S[:, hv] *= torch.exp(g[:, t, hv])[:, None, None]
            r = v[:, t, hv] - torch.einsum("bk,bkv->bv", kt, S[:, hv])
            S[:, hv] += kt[:, :, None] * (beta[:, t, hv, None] * r)[:, None, :]
            o[:, t, hv] = K ** -0.5 * torch.einsum("bk,bkv->bv", qt, S[:, hv])
    return o, S


def check_decay_domain(impl, device, dtype):
    """``gdn_chunk`` and ``gdn_recurrent`` read g as clamp(g, G_MIN, 0): both equal the fp64
    recurrence with g = -inf as an exact forget and g > 0 as 0, and nothing is NaN."""
    q, k, v, g, beta = decay_domain_inputs(device, dtype)
    B, HV, K, V = q.shape[0], v.shape[2], q.shape[3], v.shape[3]
    o, fin = impl.gdn_chunk(q, k, v, g, beta, None, None, None, None, False, False)
    pool = torch.zeros(B, HV, K, V, device=device)
    o_rec = impl.gdn_recurrent(q, k, v, g, beta, pool, None, None, None, False, False)
    for name, x in (("gdn_chunk.o", o), ("gdn_chunk.final_state", fin), ("gdn_recurrent.o", o_rec),
                    ("gdn_recurrent.state", pool)):
        assert torch.isfinite(x).all(), f"{name}: non-finite values with g = -inf / g > 0"
    o64, fin64 = _exact_recurrence(q, k, v, g.clamp(max=0.0), beta)
    assert_close("gdn_chunk.o vs fp64 recurrence (g in [-inf, 0], g > 0 read as 0)", o.double().cpu(), o64,
                 CHUNK_RATIO[dtype])
    assert_close("gdn_chunk.final_state vs fp64 recurrence", fin.double().cpu(), fin64, CHUNK_RATIO[dtype])
    assert_close("gdn_recurrent.o vs fp64 recurrence", o_rec.double().cpu(), o64, RECURRENT_RATIO[dtype])
    assert_close("gdn_recurrent.state vs fp64 recurrence", pool.double().cpu(), fin64, RECURRENT_RATIO[dtype])


# ------------------------------------------------------------------ the sequence-parallel pass
# split vs serial on the same inputs: only the segment scan's association (and A's products) differ
SPLIT_RATIO = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 5e-3}


def force_split(monkeypatch, chunk, cps):
    """Make every launcher call take the sequence-parallel pass with ``cps`` chunks per segment (0: the
    serial pass, beside w/u where it would be); returns the list that records each summary + scan.
    ``chunk`` is the launcher module; the plan and the summary + scan live in ``segments``."""
    from torch_aura.triton_kernels.gdn import segments

    ran, real = [], segments._segment_starts
    monkeypatch.setattr(segments, "_segment_plan", lambda *a: cps)
    monkeypatch.setattr(segments, "_segment_starts", lambda *a, **kw: ran.append(a[-1]) or real(*a, **kw))
    return ran


def fwd_h_inputs(device, B, T, H, HV, K, V, dtype, offsets=None, h0=False, state_v_first=False, **_):
    """gdn_fwd_h's arguments from the reference stages (its h holds every chunk's entering state: with
    the split, the scanned segment start states themselves)."""
    q, k, v, g, beta = make_inputs(device, B, T, H, HV, K, V, dtype, gate_norm=20.0, mask_p=0.3, seed=7)
    cu = _cu(device, offsets)
    ci = None if cu is None else ref.chunk_indices_from_cu_seqlens(cu)
    N = B if cu is None else cu.shape[0] - 1
    sd = (V, K) if state_v_first else (K, V)
    init = torch.randn(N, HV, *sd, generator=torch.Generator().manual_seed(8)).to(device) if h0 else None
    g_cum = ref.gdn_chunk_cumsum(g, cu, ci)
    w, u = ref.gdn_recompute_w_u(k, v, beta, ref.gdn_kkt_solve(k, g_cum, beta, cu, ci), g_cum, cu, ci)
    return k, w, u, g_cum, init, cu, ci, state_v_first


def check_split(impl, device, monkeypatch, chunk, B, T, H, HV, K, V, dtype, cps, extra):
    """gdn_chunk with the pass forced sequence-parallel (``cps`` chunks per segment) against the
    reference and the fp64 recurrence (``check_chunk``), and against the serial pass on the same inputs;
    gdn_fwd_h's h, v_new and final state likewise. Weak decay (gate_norm 20, 30% of g at 0), so that a
    segment's start state still matters at its end."""
    kw = {"gate_norm": 20.0, "mask_p": 0.3, **extra}
    runs = []
    for c in (0, cps):
        ran = force_split(monkeypatch, chunk, c)
        runs.append((*check_chunk(impl, device, B, T, H, HV, K, V, dtype, **kw),
                     *impl.gdn_fwd_h(*fwd_h_inputs(device, B, T, H, HV, K, V, dtype, **extra))))
    assert ran == [cps, cps], "the sequence-parallel pass did not run"
    for name, a, b in zip(("gdn_chunk.o", "gdn_chunk.final_state", "gdn_fwd_h.h", "gdn_fwd_h.v_new",
                           "gdn_fwd_h.final_state"), runs[1], runs[0]):
        assert_close(f"{name}: sequence-parallel vs serial", a.float(), b.float(), SPLIT_RATIO[dtype])


def torch_gates(a, b, A_log, dt_bias, scale=1.0, threshold=20.0):
    """vLLM's GDN gates in PyTorch, fp32: ``(g, beta)``."""
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float(), beta=scale, threshold=threshold)
    return g, torch.sigmoid(b.float())


def check_post_conv(post_conv, device, L, H, HV, K, V, dtype, l2norm=True, g_exp=False):
    """``post_conv`` (gdn/gates.py's ``gdn_post_conv``) on row views of a conv output and a ``[b | a]``
    projection against PyTorch's formulas in fp32 (each output rounded once): q, k, gates within a rounding, v
    a copy."""
    gen = torch.Generator().manual_seed(L * 1000 + H * 10 + HV)
    C = 2 * H * K + HV * V
    x = (3 * torch.randn(L, C + 12, generator=gen)).to(device, dtype)[:, 7:7 + C]
    ba = (4 * torch.randn(L, 2 * HV, generator=gen)).to(device, dtype)
    b, a = ba[:, :HV], ba[:, HV:]
    A_log, dt_bias = torch.randn(HV, generator=gen).to(device), torch.randn(HV, generator=gen).to(device)
    got = post_conv(x, a, b, A_log, dt_bias, H, K, V, l2norm, g_exp)
    q, k, v = x.float().split([H * K, H * K, HV * V], dim=-1)
    q, k = q.reshape(L, H, K), k.reshape(L, H, K)
    if l2norm:
        q, k = (t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6) for t in (q, k))
    g, beta = torch_gates(a, b, A_log, dt_bias)
    want = (q.to(dtype), k.to(dtype), v.reshape(L, HV, V).to(dtype), g.exp() if g_exp else g, beta)
    ulp = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    for name, u, w in zip(("q", "k", "v", "g", "beta"), got, want):
        assert u.shape == w.shape and u.dtype == w.dtype and u.is_contiguous(), name
        if name == "g" and g_exp:  # exp turns g's absolute error (2e-6 |g|: a GPU's exp is ~2 ulp) into a relative one
            bound = 2e-6 * (1 + g.abs()) * w.abs() + 1e-38
            worst = ((u - w).abs() / bound).max().item() if w.numel() else 0.0
            assert worst <= 1, f"exp(g): {worst:.2f}x the error bound 2e-6 (1 + |g|) relative"
            continue
        tol = 2e-6 if name in ("g", "beta") else ulp
        torch.testing.assert_close(u, w, rtol=tol, atol=tol if name in ("q", "k") else 1e-30,
                                   msg=lambda detail, name=name: f"{name}: {detail}")
    assert torch.equal(got[2], want[2]), "v is a copy"


def check_recurrent_raw_gates(recurrent, gates, device, N, H, HV, K, V, dtype):
    """The decode launcher with ``gates=(A_log, dt_bias)`` and ``null=0`` (vLLM's packed decode in one launch:
    ``g``, ``beta`` given as the projections a, b, row views of vLLM's ``[b | a]``; vLLM's slots with its null slot
    0) against the gates kernel then the rule on translated rows: o and the pool bit for bit, the null slot's row
    untouched and its o zeros; a gate vector of the wrong length is refused by name. ``recurrent`` and ``gates``:
    the modules ``triton_kernels.gdn.recurrent`` and ``.gates``."""
    gen = torch.Generator().manual_seed(N * 100 + HV)
    q, k, v, _, _ = make_inputs(device, N, 1, H, HV, K, V, dtype)
    ba = (4 * torch.randn(N, 2 * HV, generator=gen)).to(device, dtype)
    b, a = ba[:, None, :HV], ba[:, None, HV:]
    A_log, dt_bias = (torch.randn(HV, generator=gen).to(device) for _ in range(2))
    P = N + 3
    pool = torch.randn(P, HV, V, K, generator=gen).to(device, dtype)
    slots = (1 + torch.randperm(P - 1, generator=gen)[:N]).to(device, torch.int32)
    if N > 1:  # the null slot 0, and padding (-1) where there are three requests or more; the rest live
        slots[0] = 0
    if N > 2:
        slots[-1] = -1
    g, beta, rows = gates.gdn_gates(a, b, A_log, dt_bias, 1.0, 20.0, slots, 0)
    pool_a, pool_b = pool.clone(), pool.clone()
    want = recurrent.gdn_recurrent(q, k, v, g, beta, pool_a, rows, None, None, True, True)
    out = torch.full_like(want, float("nan"))
    got = recurrent.gdn_recurrent(q, k, v, a, b, pool_b, slots, None, None, True, True, out=out,
                                  gates=(A_log, dt_bias), null=0)
    assert got is out and torch.equal(out, want), (out - want).abs().max()
    assert torch.equal(pool_a, pool_b) and torch.equal(pool_b[0], pool[0]), "the null slot's row was written"
    skipped = (slots <= 0).nonzero().flatten()
    assert not out[skipped].any(), "a skipped request's o is not zero"
    assert not torch.equal(pool_b, pool), "no row was written"
    try:
        recurrent.gdn_recurrent(q, k, v, a, b, pool.clone(), slots, None, None, True, True,
                                gates=(A_log[:-1], dt_bias), null=0)
    except ValueError as e:
        assert "A_log" in str(e), e
    else:
        raise AssertionError("an A_log of HV - 1 values was accepted")


def check_one_token_body(recurrent, device, N, H, HV, K, V, dtype):
    """``recurrent.ONE_TOKEN`` (the rule without its token loop where every sequence is one token) against the
    loop: o and the pool bit for bit, through both decode forms (the op's rows with -1 padding; vLLM's raw gates
    and slots with its null slot 0), on a ``[P, HV, V, K]`` pool. A varlen call or T > 1 keeps the loop."""
    gen = torch.Generator().manual_seed(N * 10 + V)
    q, k, v, g, beta = make_inputs(device, N, 1, H, HV, K, V, dtype)
    a, b = ((4 * torch.randn(N, 1, HV, generator=gen)).to(device, dtype) for _ in range(2))
    A_log, dt_bias = (torch.randn(HV, generator=gen).to(device) for _ in range(2))
    P = N + 3
    pool = torch.randn(P, HV, V, K, generator=gen).to(device, dtype)
    slots = (1 + torch.randperm(P - 1, generator=gen)[:N]).to(device, torch.int32)
    slots[0] = 0  # vLLM's null slot (a live row for the op's form)
    if N > 2:
        slots[-1] = -1
    forms = {"rows": ((q, k, v, g, beta), {}), "vllm": ((q, k, v, a, b), dict(gates=(A_log, dt_bias), null=0))}
    saved = recurrent.ONE_TOKEN
    try:
        for name, (inputs, extra) in forms.items():
            results = []
            for one in (False, True):
                recurrent.ONE_TOKEN = one
                recurrent._geometry_of.forget()
                options = recurrent._geometry(*inputs, pool, slots, None, None, True, True,
                                              *((A_log, dt_bias, 0) if extra else ()))[4]
                assert options["ONE_TOKEN"] == one, options
                p = pool.clone()
                results.append((recurrent.gdn_recurrent(*inputs, p, slots, None, None, True, True, **extra), p))
            (o_loop, p_loop), (o_one, p_one) = results
            assert torch.equal(o_one, o_loop), f"{name}: o differs by {(o_one - o_loop).abs().max()}"
            assert torch.equal(p_one, p_loop), f"{name}: the pool differs"
            assert not torch.equal(p_one, pool), f"{name}: no row was written"
        # the loop stays where a sequence may hold other than one token
        cu = torch.arange(N + 1, device=device, dtype=torch.int32)
        flat = [t.reshape(1, N, *t.shape[2:]) for t in (q, k, v, g, beta)]
        assert not recurrent._geometry(*flat, pool, slots, cu, None, True, True)[4]["ONE_TOKEN"]
        two = [torch.cat([t, t], 1) for t in (q, k, v, g, beta)]
        assert not recurrent._geometry(*two, pool, slots, None, None, True, True)[4]["ONE_TOKEN"]
    finally:
        recurrent.ONE_TOKEN = saved
        recurrent._geometry_of.forget()
