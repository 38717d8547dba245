"""The CUDA AURA kernels against the pure-PyTorch reference (aura-format.md §11.6, targets.md).

Attention kernels read reference-encoded caches and must agree with the reference to a max relative
error of 1e-4 in fp32; encode kernels may differ from the reference only where the rotated value is
within 1e-5/sqrt(D) of a boundary, and then by one index. Runs only where a CUDA device exists;
there, a missing kernel is a failure, not a skip.
"""

from __future__ import annotations

import math

import pytest
import torch

import torch_aura as ta
from torch_aura import backends
from torch_aura.reference import aura as R

from _samples.aura import append_cache, append_cases, append_tokens, cache_state, fused_args, unfused_append
from _aura_cache import EncodedCache, check_codes_near_boundaries, check_non_finite_propagation, synthetic_attention
from _util import assert_max_rel, dtype_id, max_rel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

DEV = "cuda"
HEAD_DIMS = (64, 128, 256, 512)
BITS = (2, 3, 4, 8)
PAIRS = [(kb, vb) for kb in BITS for vb in BITS]
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
OPS = ("hadamard_rotate", "aura_encode", "aura_write_cache", "aura_append", "aura_dequantize", "aura_flash_p1",
       "aura_flash_p2", "aura_decode")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen(seed)).to(dtype)


def test_cuda_kernels_are_registered():
    for op in OPS:
        assert backends.has_kernel(op, "cuda"), backends.status()[op]["cuda"]


# ================================================================================ rotation
@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("D", HEAD_DIMS, ids=[f"D{d}" for d in HEAD_DIMS])
def test_hadamard_rotate_matches_reference(D, dtype):
    x = _randn(7, 3, D, seed=D, dtype=dtype).transpose(0, 1)  # a view: strides (D, 3D, 1)
    mask = ta.aura_sign_mask(D, layer=2)
    for m, scale, inverse in ((mask, 1.0, False), (mask, 0.3, True), (None, 2.0, False)):
        got = ta.hadamard_rotate(x.to(DEV), None if m is None else m.to(DEV), scale, inverse)
        want = R.hadamard_rotate(x, m, scale, inverse)
        assert got.dtype == dtype and got.shape == x.shape and got.is_contiguous()
        if dtype == torch.float32:
            assert_max_rel(f"rotate D{D}", got.cpu(), want, 1e-6)
        else:  # the same fp32 math, one final rounding each: at most an ulp of the output dtype apart
            assert max_rel(got.cpu().float(), want.float()) <= 1e-2
    y = ta.hadamard_rotate(x.to(DEV).float(), mask.to(DEV))
    assert_max_rel("inverse(forward)", ta.hadamard_rotate(y, mask.to(DEV), inverse=True).cpu(), x.float(), 1e-5)


# ================================================================================== encode
@pytest.mark.parametrize("bits", BITS, ids=[f"b{b}" for b in BITS])
@pytest.mark.parametrize("D", HEAD_DIMS, ids=[f"D{d}" for d in HEAD_DIMS])
def test_encode_matches_reference(D, bits):
    x = _randn(5, 67, D, seed=D + bits) * 3
    x[0, 3] = 0.0
    x[1, 4, 2] = float("nan")
    x[2, 5, 9] = float("inf")
    mask = ta.aura_sign_mask(D, layer=1)
    cb, bd = ta.aura_codebook(bits, D)
    codes, norms = ta.aura_encode(x.to(DEV), cb.to(DEV), bd.to(DEV), bits, mask.to(DEV))
    assert codes.shape == (5, 67, D * bits // 32) and codes.dtype == torch.int32 and norms.dtype == torch.float32
    ref_codes, ref_norms = R.aura_encode(x, cb, bd, bits, mask)
    check_codes_near_boundaries(x, codes.cpu(), norms.cpu(), ref_codes, ref_norms, bits, mask)
    # zero and non-finite rows: codes 2^(b-1); norm 0 (zero row) or NaN (propagates, as dense attention)
    assert norms[0, 3].item() == 0.0 and bool(norms[1, 4].isnan()) and bool(norms[2, 5].isnan())
    for b_, t_ in ((0, 3), (1, 4), (2, 5)):
        assert bool((R.unpack_codes(codes[b_, t_].cpu(), bits, D) == 2 ** (bits - 1)).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_encode_low_precision_views_and_no_mask(dtype):
    x = _randn(9, 4, 128, seed=3, dtype=dtype).transpose(0, 1)
    cb, bd = ta.aura_codebook(3, 128)
    for mask in (ta.aura_sign_mask(128), None):
        got = ta.aura_encode(x.to(DEV), cb.to(DEV), bd.to(DEV), 3, None if mask is None else mask.to(DEV))
        want = R.aura_encode(x, cb, bd, 3, mask)
        check_codes_near_boundaries(x, got[0].cpu(), got[1].cpu(), *want, 3, mask)


@pytest.mark.parametrize("bits,cos", [(2, 0.9406), (3, 0.9831), (4, 0.9954), (8, 0.99998)])
def test_encode_quality_targets_on_gpu(bits, cos):
    """targets.md: mean cosine(x, x_hat) at D = 128 (+-0.001) and |x_hat| = |x| (rel 1e-5), all on the GPU."""
    D = 128
    x = torch.randn(8192, D, generator=torch.Generator(device=DEV).manual_seed(11), device=DEV)
    cb, bd = (t.to(DEV) for t in ta.aura_codebook(bits, D))
    mask = ta.aura_sign_mask(D, device=DEV)
    x_hat = ta.aura_dequantize(*ta.aura_encode(x, cb, bd, bits, mask), cb, bits, mask)
    got = torch.nn.functional.cosine_similarity(x, x_hat, dim=-1).mean().item()
    assert got == pytest.approx(cos, abs=1e-3)
    ratio = x_hat.double().norm(dim=-1) / x.double().norm(dim=-1)
    assert (ratio - 1).abs().max().item() <= 1e-5


def _garbage(shape, seed):
    g = _gen(seed)
    codes = torch.randint(-2**31, 2**31 - 1, shape, generator=g, dtype=torch.int64).to(torch.int32)
    return codes.to(DEV), (torch.rand(shape[:-1], generator=g) + 7.0).to(DEV)


@pytest.mark.parametrize("bits", BITS, ids=[f"b{b}" for b in BITS])
@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged5"])
def test_write_cache_equals_encode_plus_scatter(bits, paged):
    Hkv, D, N = 3, 128, 11
    PW = D * bits // 32
    shape = (6, 5, Hkv, PW) if paged else (3, Hkv, 10, PW)
    n_slots = 30
    base_c, base_n = _garbage((2, *shape), bits)  # a vLLM-style (2, ...) buffer: the cache is a view
    codes, norms = base_c[1], base_n[1]
    before_c, before_n = base_c.clone(), base_n.clone()
    x = _randn(N, Hkv, D, seed=bits, dtype=torch.bfloat16).to(DEV)
    slots = torch.tensor([0, 29, -1, 6, 13, -7, 7, 15, 1, 22, n_slots + 5], device=DEV)  # last: out of range
    cb, bd = (t.to(DEV) for t in ta.aura_codebook(bits, D))
    mask = ta.aura_sign_mask(D, device=DEV)
    torch.ops.aura.aura_write_cache(x, codes, norms, slots, cb, bd, bits, mask, paged)
    enc_c, enc_n = ta.aura_encode(x, cb, bd, bits, mask)
    want_c, want_n = before_c.clone(), before_n.clone()
    for n, slot in enumerate(slots.tolist()):
        if 0 <= slot < n_slots:
            if paged:
                want_c[1, slot // 5, slot % 5] = enc_c[n]
                want_n[1, slot // 5, slot % 5] = enc_n[n]
            else:
                want_c[1, slot // 10, :, slot % 10] = enc_c[n]
                want_n[1, slot // 10, :, slot % 10] = enc_n[n]
    assert torch.equal(base_c, want_c) and torch.equal(base_n, want_n)  # the other half and slots untouched


# ============================================================================== dequantize
@pytest.mark.parametrize("bits", BITS, ids=[f"b{b}" for b in BITS])
@pytest.mark.parametrize("D", HEAD_DIMS, ids=[f"D{d}" for d in HEAD_DIMS])
def test_dequantize_matches_reference(D, bits):
    mask = ta.aura_sign_mask(D, kind="v")
    cb, bd = ta.aura_codebook(bits, D)
    codes, norms = R.aura_encode(_randn(2, 9, D, seed=D * bits), cb, bd, bits, mask)
    gc, gn, gcb, gm = codes.to(DEV), norms.to(DEV), cb.to(DEV), mask.to(DEV)
    assert_max_rel("rotated", ta.aura_dequantize(gc, gn, gcb, bits).cpu(), R.aura_dequantize(codes, norms, cb, bits), 1e-6)
    got = ta.aura_dequantize(gc[:, 2:7], gn[:, 2:7], gcb, bits, gm)  # sliced views
    assert_max_rel("original", got.cpu(), R.aura_dequantize(codes[:, 2:7], norms[:, 2:7], cb, bits, mask), 1e-6)
    bf = ta.aura_dequantize(gc, gn, gcb, bits, gm, torch.bfloat16)
    assert bf.dtype == torch.bfloat16
    assert max_rel(bf.cpu().float(), R.aura_dequantize(codes, norms, cb, bits, mask)) <= 1e-2


# =============================================================== attention: p1, p2, decode
class Cache(EncodedCache):
    """A reference-encoded K/V cache (tests/_aura_cache.py), kept on the CPU and on the GPU."""

    def __init__(self, B, Hkv, cap, D, kb, vb, seq_lens, page_size=None, seed=0):
        super().__init__(B, Hkv, cap, D, kb, vb, seq_lens, page_size, seed, randn=_randn)
        self.cpu = (self.kc, self.kn, self.vc, self.vn)
        self.gpu = tuple(t.to(DEV) for t in self.cpu)

    def args(self, dev):
        kc, kn, vc, vn = self.gpu if dev == DEV else self.cpu
        seq = self.seq_lens.to(dev)
        return kc, kn, vc, vn, seq, self.k_cb.to(dev), self.v_cb.to(dev)

    def table(self, dev):
        return None if self.block_table is None else self.block_table.to(dev)

    def p1(self, q_rot, block_size, dev):
        kc, kn, vc, vn, seq, kcb, vcb = self.args(dev)
        return ta.aura_flash_p1(q_rot.to(dev), kc, kn, vc, vn, seq, kcb, vcb, self.kb, self.vb, self.table(dev),
                                block_size)

    def decode(self, q, dev, scale=None, num_splits=0):
        kc, kn, vc, vn, seq, kcb, vcb = self.args(dev)
        return ta.aura_decode(q.to(dev), kc, kn, vc, vn, seq, kcb, vcb, self.k_mask.to(dev), self.v_mask.to(dev),
                              self.kb, self.vb, self.table(dev), scale, num_splits)


# Max relative error vs the reference per query dtype: fp32 queries take the exact pass-1 kernel
# (targets.md: 1e-4); fp16 / bf16 queries the warp-split tensor-core kernel, whose products round
# q_rot, the codebook values and p * norm_V to fp16 (11-bit significands), so ~1e-3 is its honest
# error. Decode outputs in the query's dtype add that dtype's rounding (bf16: 2^-9).
PARTIAL_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 5e-3}
OUT_TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
QUERY_DTYPES = (torch.float32, torch.bfloat16)  # the two pass-1 kernels; fp16 shares bf16's kernel


def _check_partials(got, want, tol=1e-4):
    o, m, l = (t.cpu() for t in got)
    wo, wm, wl = want
    assert o.shape == wo.shape and m.shape == wm.shape and l.shape == wl.shape
    assert torch.equal(torch.isinf(m), torch.isinf(wm)) and torch.equal(l == 0, wl == 0), "empty-block pattern"
    empty = wl == 0
    assert bool((o[empty] == 0).all()) and bool((m[empty] == -math.inf).all()), "empty block: o = 0, m = -inf"
    fin = torch.isfinite(wm)
    if fin.any():
        assert (m[fin].double() - wm[fin].double()).abs().max().item() <= tol * max(1.0, wm[fin].abs().max().item())
        assert_max_rel("l", l[fin], wl[fin], tol)
    # o per (row, block): relative to that partial's own scale, so small blocks are checked too
    scale = wo.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    err = ((o.double() - wo.double()).abs() / scale).max().item() if o.numel() else 0.0
    assert err <= tol, f"o: max relative error {err:.3e} > {tol:.0e}"


def _check_attention(cache: Cache, Hq, L, block_size, seed=0, num_splits=None, dtype=torch.float32):
    """GPU p1 / p2 / decode against the reference on the same inputs (queries of `dtype`)."""
    B, D = cache.B, cache.D
    q = _randn(B, L or 1, Hq, D, seed=seed + 100)
    qq = (q if L else q[:, 0]).to(dtype)
    q_rot = R.hadamard_rotate(qq.float(), cache.k_mask, scale=D ** -0.5).to(dtype)
    tol, out_tol = PARTIAL_TOL[dtype], OUT_TOL[dtype]
    want = cache.p1(q_rot, block_size, "cpu")
    got = cache.p1(q_rot, block_size, DEV)
    _check_partials(got, want, tol)
    for mask in (None, cache.v_mask):
        out, lse = ta.aura_flash_p2(*got, None if mask is None else mask.to(DEV))
        w_out, w_lse = R.aura_flash_p2(*want, mask)
        assert out.dtype == torch.float32
        assert_max_rel("p2 out", out.cpu(), w_out, tol)
        assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(w_lse))
        assert_max_rel("p2 lse", lse.cpu(), w_lse, tol)
    for ns in ([num_splits] if num_splits is not None else [0, 3]):
        out, lse = cache.decode(qq, DEV, num_splits=ns)
        w_out, w_lse = cache.decode(qq, "cpu", num_splits=ns)
        assert out.dtype == qq.dtype and out.shape == qq.shape and lse.shape == qq.shape[:-1]
        assert_max_rel(f"decode out (num_splits={ns})", out.cpu().float(), w_out.float(), out_tol)
        assert_max_rel(f"decode lse (num_splits={ns})", lse.cpu(), w_lse, tol)
    return got


@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("D", HEAD_DIMS, ids=[f"D{d}" for d in HEAD_DIMS])
@pytest.mark.parametrize("kb,vb", PAIRS, ids=[f"k{k}v{v}" for k, v in PAIRS])
def test_every_bit_pair_and_head_dim(kb, vb, D, dtype):
    cache = Cache(B=2, Hkv=2, cap=77, D=D, kb=kb, vb=vb, seq_lens=[77, 20], seed=kb * 10 + vb)
    _check_attention(cache, Hq=6, L=None, block_size=33, dtype=dtype)


@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("Hkv", [1, 2, 8], ids=lambda h: f"Hkv{h}")
@pytest.mark.parametrize("G", range(1, 9), ids=lambda g: f"G{g}")
def test_every_gqa_ratio(G, Hkv, dtype):
    cache = Cache(B=2, Hkv=Hkv, cap=70, D=64, kb=4, vb=2, seq_lens=[70, 11], seed=G)
    _check_attention(cache, Hq=G * Hkv, L=None, block_size=16, num_splits=0, dtype=dtype)


@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=dtype_id)
def test_large_group_uses_row_groups(dtype):
    cache = Cache(B=1, Hkv=2, cap=100, D=128, kb=4, vb=2, seq_lens=[99], seed=40)
    _check_attention(cache, Hq=40, L=None, block_size=64, num_splits=0, dtype=dtype)  # G = 20: three row groups


@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("T", [0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 4096], ids=lambda t: f"T{t}")
def test_sequence_lengths_around_blocks(T, dtype):
    """Around the 16-token steps of the warp-split kernel and the 64-token blocks of this test."""
    cache = Cache(B=2, Hkv=2, cap=max(T, 130), D=128, kb=4, vb=4, seq_lens=[T, 70], seed=T)
    got = _check_attention(cache, Hq=8, L=None, block_size=64, dtype=dtype)
    o, m, l = got
    live = -(-T // 64)
    assert bool((l[0, :, :live] > 0).all()) and bool((l[0, :, live:] == 0).all())


@pytest.mark.parametrize("page_size,block_size", [(1, 4), (16, 16), (16, 24), (5, 10), (5, 7), (7, 64)],
                         ids=["p1-bs4", "p16-bs16", "p16-bs24", "p5-bs10", "p5-bs7", "p7-bs64"])
@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=dtype_id)
def test_paged(page_size, block_size, dtype):
    cap = 80 if page_size != 1 else 12
    lens = [cap, cap // 2 + 1, 0]
    paged = Cache(B=3, Hkv=2, cap=cap, D=128, kb=3, vb=4, seq_lens=lens, page_size=page_size, seed=page_size)
    contig = Cache(B=3, Hkv=2, cap=cap, D=128, kb=3, vb=4, seq_lens=lens, seed=page_size)
    a = _check_attention(paged, Hq=4, L=None, block_size=block_size, dtype=dtype)
    b = _check_attention(contig, Hq=4, L=None, block_size=block_size, dtype=dtype)
    # same logical data, other layout: the kernel stages both identically -> bitwise equal partials
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", ["contig", "paged5"])
@pytest.mark.parametrize("G", [1, 4, 6])
def test_causal_including_negative_positions(layout, G, dtype):
    cache = Cache(B=3, Hkv=2, cap=40, D=64, kb=8, vb=3, seq_lens=[33, 2, 0],
                  page_size=5 if layout == "paged5" else None, seed=21)
    o, m, l = _check_attention(cache, Hq=2 * G, L=4, block_size=5, dtype=dtype)
    out, lse = ta.aura_flash_p2(o, m, l, cache.v_mask.to(DEV))
    assert bool((out[1, :2] == 0).all()) and bool((lse[1, :2] == -math.inf).all())
    assert bool((out[2] == 0).all()) and bool((lse[2] == -math.inf).all())


@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("D", HEAD_DIMS, ids=[f"D{d}" for d in HEAD_DIMS])
@pytest.mark.parametrize("kb,vb", PAIRS, ids=[f"k{k}v{v}" for k, v in PAIRS])
def test_single_token_decode_path(kb, vb, D, dtype):
    """B = 1, L = 1, through aura_decode and through p1 + p2: every output dim of every head."""
    cache = Cache(B=1, Hkv=2, cap=300, D=D, kb=kb, vb=vb, seq_lens=[300], seed=kb + vb + D)
    q = _randn(1, 8, D, seed=D).to(dtype)
    tol = OUT_TOL[dtype]
    want, want_lse = cache.decode(q, "cpu", num_splits=4)
    q_rot = ta.hadamard_rotate(q.to(DEV), cache.k_mask.to(DEV), scale=D ** -0.5)
    via_p = ta.aura_flash_p2(*cache.p1(q_rot, 75, DEV), cache.v_mask.to(DEV))
    for name, (out, lse) in (("aura_decode", cache.decode(q, DEV)), ("p1+p2", via_p)):
        out = out.cpu().float()
        assert_max_rel(name, out, want.float(), tol)
        assert_max_rel(name + " lse", lse.cpu(), want_lse, PARTIAL_TOL[dtype])
        err = (out.double() - want.double()).abs()
        assert bool((err <= tol * want.double().abs().amax(-1, keepdim=True)).all()), f"{name}: some output dim is off"


def test_p2_skips_empty_partials_and_propagates_nan_data():
    cache = Cache(B=3, Hkv=2, cap=40, D=128, kb=4, vb=2, seq_lens=[40, 7, 0], seed=6)
    q_rot = _randn(3, 2, 4, 128, seed=2)
    o, m, l = cache.p1(q_rot, 8, DEV)
    dead = l == 0
    assert int(dead.sum()) > 0
    nan = float("nan")
    # empty = l == 0, whatever its o and m hold
    for ob, mb in ((torch.where(dead[..., None], nan, o), m),
                   (torch.where(dead[..., None], nan, o), torch.where(dead, nan, m))):
        for mask in (None, cache.v_mask.to(DEV)):
            got, lse = ta.aura_flash_p2(ob, mb, l, mask)
            want, want_lse = ta.aura_flash_p2(o, m, l, mask)
            assert torch.equal(got, want) and torch.equal(lse, want_lse) and bool(torch.isfinite(got).all())
    # a NaN l in a block pass 1 filled comes from NaN/Inf data: that row is NaN, the rest not
    l_nan = l.clone()
    l_nan[0, 0, 1, 0] = nan
    got, lse = ta.aura_flash_p2(o, m, l_nan, cache.v_mask.to(DEV))
    row_nan = got.isnan().any(-1)
    assert bool(row_nan[0, 0, 1]) and bool(lse[0, 0, 1].isnan()) and int(row_nan.sum()) == 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_decode_low_precision_query_and_p2_out_dtype(dtype):
    cache = Cache(B=2, Hkv=2, cap=300, D=128, kb=4, vb=2, seq_lens=[300, 3], seed=1)
    q = _randn(2, 8, 128, seed=3, dtype=dtype)
    out, lse = cache.decode(q, DEV, scale=0.1)
    want, want_lse = cache.decode(q, "cpu", scale=0.1)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert max_rel(out.cpu().float(), want.float()) <= OUT_TOL[dtype]
    assert_max_rel("lse", lse.cpu(), want_lse, PARTIAL_TOL[dtype])


@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=dtype_id)
def test_quality_against_exact_attention_on_gpu(dtype):
    """targets.md: synthetic attention with outlier channels, cosine >= 0.99 aura4v4, >= 0.93 aura4v2."""
    D, T = 128, 2048
    cos = {"aura4v4": [], "aura4v2": []}
    for trial in range(10):
        q, K, V = synthetic_attention(trial, T, D)
        exact = torch.softmax(q @ K.T, -1) @ V
        for scheme in cos:
            cache = ta.AuraCache(scheme, batch=1, kv_heads=1, head_dim=D, capacity=T, device=DEV)
            cache.append(K.float()[None, :, None].to(DEV), V.float()[None, :, None].to(DEV))
            out, _ = cache.decode(q.to(dtype)[None].to(DEV), scale=1.0)
            cos[scheme].append(torch.nn.functional.cosine_similarity(out[0].double().cpu(), exact, dim=-1).mean().item())
    c44, c42 = (sum(v) / len(v) for v in cos.values())
    assert c44 >= 0.99, c44
    assert c42 >= 0.93, c42


# ----------------------------------------------------------- graphs, compile, errors, sanitizer
@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=dtype_id)
def test_cuda_graph_replay_with_new_lengths_tables_and_values_is_bitwise_eager(dtype):
    B, Hq, Hkv, D, page, cap = 3, 16, 4, 128, 16, 2048
    cache = Cache(B=B, Hkv=Hkv, cap=cap, D=D, kb=4, vb=2, seq_lens=[cap, 1, 0], page_size=page, seed=8)
    kc, kn, vc, vn, seq, kcb, vcb = cache.args(DEV)
    table = cache.table(DEV)
    table.copy_(torch.randperm(kc.shape[0], device=DEV)[: table.numel()].reshape(table.shape).to(torch.int32))
    kn.copy_(torch.rand_like(kn))  # every slot finite so any table is valid: NaN != NaN under equal
    vn.copy_(torch.rand_like(vn))
    km, vm = cache.k_mask.to(DEV), cache.v_mask.to(DEV)
    q = torch.randn(B, Hq, D, device=DEV).to(dtype)
    args = lambda: (q, kc, kn, vc, vn, seq, kcb, vcb, km, vm, 4, 2, table, None, 0)  # noqa: E731
    torch.ops.aura.aura_decode(*args())  # warm-up outside capture (tables, attributes)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = torch.ops.aura.aura_decode(*args())
    for trial in range(3):
        g = torch.Generator(device="cpu").manual_seed(100 + trial)
        seq.copy_(torch.randint(0, cap + 1, (B,), generator=g, dtype=torch.int32))
        table.copy_(torch.randperm(kc.shape[0], generator=g)[: table.numel()].reshape(table.shape).to(torch.int32))
        q.copy_(torch.randn(q.shape, generator=g).to(dtype))
        kc.copy_(torch.randint(-2**31, 2**31 - 1, kc.shape, generator=g, dtype=torch.int64).to(torch.int32))
        vn.copy_(torch.rand(vn.shape, generator=g))
        graph.replay()
        want_out, want_lse = torch.ops.aura.aura_decode(*args())
        torch.cuda.synchronize()
        assert not out.isnan().any()
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse), f"replay {trial} differs from eager"


def test_write_cache_and_decode_capture_together():
    """AuraCache.append + decode captured in one graph (a serving loop's decode step) == the same eagerly."""
    def fresh():
        c = ta.AuraCache("aura4v2", batch=4, kv_heads=2, head_dim=128, capacity=64, device=DEV)
        g = torch.Generator(device=DEV).manual_seed(0)
        c.append(torch.randn(4, 20, 2, 128, device=DEV, generator=g), torch.randn(4, 20, 2, 128, device=DEV, generator=g))
        return c

    k1, v1 = torch.randn(4, 2, 128, device=DEV), torch.randn(4, 2, 128, device=DEV)
    q = torch.randn(4, 8, 128, device=DEV)
    eager = fresh()
    eager.append(k1, v1)
    want = eager.decode(q)
    cache = fresh()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # recorded, not run: the cache still holds 20 tokens
        cache.append(k1, v1)  # slots from the device-side seq_lens, which the graph advances
        out, lse = cache.decode(q)
    graph.replay()
    torch.cuda.synchronize()
    assert cache.seq_lens.tolist() == [21] * 4
    assert torch.equal(cache.k_codes, eager.k_codes) and torch.equal(cache.v_norms, eager.v_norms)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])


@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=dtype_id)
def test_compile_fullgraph(dtype):
    cache = Cache(B=2, Hkv=2, cap=300, D=128, kb=4, vb=4, seq_lens=[300, 7], seed=4)
    kc, kn, vc, vn, seq, kcb, vcb = cache.args(DEV)
    km, vm = cache.k_mask.to(DEV), cache.v_mask.to(DEV)
    _, kbd = ta.aura_codebook(4, 128)
    kbd = kbd.to(DEV)

    def step(q, x):
        q_rot = ta.hadamard_rotate(q, km, 0.1)
        o, m, l = ta.aura_flash_p1(q_rot, kc, kn, vc, vn, seq, kcb, vcb, 4, 4, None, 64)
        out, lse = ta.aura_flash_p2(o, m, l, vm)
        dec, _ = ta.aura_decode(q, kc, kn, vc, vn, seq, kcb, vcb, km, vm, 4, 4, scale=0.1)
        codes, norms = ta.aura_encode(x, kcb, kbd, 4, km)
        return out * 2, lse, dec, ta.aura_dequantize(codes, norms, kcb, 4, km)

    q, x = torch.randn(2, 8, 128, device=DEV).to(dtype), torch.randn(5, 128, device=DEV)
    want = step(q, x)
    for mode in (None, "reduce-overhead"):
        torch._dynamo.reset()
        fn = torch.compile(step, fullgraph=True, mode=mode)
        for _ in range(3):
            got = fn(q, x)
        for a, b in zip(got, want):
            assert torch.equal(a, b), mode


def test_direct_op_calls_reject_bad_input_in_cpp():
    cache = Cache(B=1, Hkv=2, cap=16, D=64, kb=4, vb=2, seq_lens=[16])
    kc, kn, vc, vn, seq, kcb, vcb = cache.args(DEV)
    q = torch.randn(1, 4, 64, device=DEV)
    with pytest.raises(RuntimeError, match="seq_lens: expected dtype int32"):
        torch.ops.aura.aura_flash_p1(q, kc, kn, vc, vn, seq.long(), kcb, vcb, 4, 2, None, 16)
    with pytest.raises(RuntimeError, match="v_codes: expected 4 words"):
        torch.ops.aura.aura_flash_p1(q, kc, kn, kc, vn, seq, kcb, vcb, 4, 2, None, 16)
    with pytest.raises(RuntimeError, match="head_dim"):
        torch.ops.aura.hadamard_rotate(torch.randn(3, 48, device=DEV), None, 1.0, False)
    with pytest.raises(RuntimeError, match="k_codebook: expected 16 entries"):
        torch.ops.aura.aura_flash_p1(q, kc, kn, vc, vn, seq, vcb, vcb, 4, 2, None, 16)
    with pytest.raises(RuntimeError, match="sign_mask"):
        torch.ops.aura.aura_encode(q, kcb, kcb[:15], 4, torch.zeros(3, dtype=torch.int32, device=DEV))


def test_row_stride_past_int32_bytes_is_rejected_in_cpp():
    """Pass 1 steps through rows by 32-bit byte strides (aura.cu): a k_codes view whose row stride is
    2^29 int32 words (2 GiB) must be refused, not wrap around. Needs one 2 GiB allocation."""
    cache = Cache(B=1, Hkv=1, cap=2, D=64, kb=4, vb=2, seq_lens=[2])
    kc, kn, vc, vn, seq, kcb, vcb = cache.args(DEV)
    pw = kc.shape[-1]
    big = torch.zeros(2**29 + pw, dtype=torch.int32, device=DEV)
    wide = big.as_strided((1, 1, 2, pw), (2**29 + pw, 2**29 + pw, 2**29, 1))
    wide.copy_(kc)
    q = torch.randn(1, 2, 64, device=DEV, dtype=torch.bfloat16)
    args = (kcb, vcb, cache.k_mask.to(DEV), cache.v_mask.to(DEV), 4, 2, None, None, 0)
    torch.ops.aura.aura_decode(q, kc, kn, vc, vn, seq, *args)  # the same cache, compact: accepted
    with pytest.raises(RuntimeError, match="past the 2\\^29 supported"):
        torch.ops.aura.aura_decode(q, wide, kn, vc, vn, seq, *args)
    del big, wide
    torch.cuda.empty_cache()


@pytest.mark.parametrize("dtype", QUERY_DTYPES, ids=dtype_id)
def test_out_of_range_lengths_and_pages_never_fault(dtype):
    cache = Cache(B=2, Hkv=2, cap=40, D=64, kb=4, vb=4, seq_lens=[40, 40], page_size=16, seed=2)
    kc, kn, vc, vn, seq, kcb, vcb = cache.args(DEV)
    table = cache.table(DEV)
    seq.fill_(10**6)
    table[0, 0] = 10**6
    table[1, 1] = -5
    out, lse = torch.ops.aura.aura_decode(torch.randn(2, 4, 64, device=DEV, dtype=dtype), kc, kn, vc, vn, seq, kcb, vcb,
                                          cache.k_mask.to(DEV), cache.v_mask.to(DEV), 4, 4, table, None, 0)
    torch.cuda.synchronize()
    assert out.shape == (2, 4, 64)


@pytest.mark.sanitize
def test_small_cases_for_compute_sanitizer():
    """Every kernel once on small shapes (empty blocks, causal, paged, 3-bit 8-byte rows) for memcheck/racecheck."""
    for page, (kb, vb), D in ((None, (4, 2), 128), (5, (3, 8), 64), (None, (8, 3), 64)):
        cache = Cache(B=3, Hkv=2, cap=70, D=D, kb=kb, vb=vb, seq_lens=[70, 1, 0], page_size=page, seed=1)
        for dtype in QUERY_DTYPES:  # both pass-1 kernels
            _check_attention(cache, Hq=6, L=None, block_size=32, num_splits=0, dtype=dtype)
            _check_attention(cache, Hq=4, L=3, block_size=16, num_splits=2, dtype=dtype)
    x = torch.randn(6, 2, 64, device=DEV)
    cb, bd = (t.to(DEV) for t in ta.aura_codebook(3, 64))
    mask = ta.aura_sign_mask(64, device=DEV)
    codes = torch.zeros(2, 2, 5, 6, dtype=torch.int32, device=DEV)
    norms = torch.zeros(2, 2, 5, device=DEV)
    ta.aura_write_cache(x, codes, norms, torch.tensor([0, 9, -1, 3, 5, 2], device=DEV), cb, bd, 3, mask)
    ta.aura_dequantize(codes, norms, cb, 3, mask)
    ta.hadamard_rotate(x, mask, 0.5, True)
    torch.cuda.synchronize()


@pytest.mark.sanitize
@pytest.mark.parametrize("scheme,D", [("aura4v2", 128), ("aura8", 64), ("aura3v2", 256)])
def test_aura_cache_ragged_rows_crop_grow_match_the_cpu_cache(scheme, D):
    """AuraCache's generation-loop paths on the device (left-padded ragged prefill, one-token appends,
    select_rows, crop, grow, a right-padded chunk, single and causal decode) equal the same calls on
    a CPU cache; seq_lens exactly."""
    torch.manual_seed(0)
    B, Hkv, Hq = 3, 2, 6
    gpu = ta.AuraCache(scheme, batch=B, kv_heads=Hkv, head_dim=D, capacity=40, device=DEV)
    cpu = ta.AuraCache(scheme, batch=B, kv_heads=Hkv, head_dim=D, capacity=40)

    def both(method, *args, **kwargs):
        on = lambda x: x.to(DEV) if isinstance(x, torch.Tensor) else x  # noqa: E731
        out = getattr(gpu, method)(*map(on, args), **{n: on(x) for n, x in kwargs.items()})
        ref = getattr(cpu, method)(*args, **kwargs)
        return out, ref

    k, v = torch.randn(B, 9, Hkv, D, dtype=torch.bfloat16), torch.randn(B, 9, Hkv, D, dtype=torch.bfloat16)
    both("append", k, v, lengths=torch.tensor([9, 4, 0]), left_padded=True)
    for _ in range(5):
        both("append", torch.randn(B, Hkv, D), torch.randn(B, Hkv, D))
    both("select_rows", torch.tensor([2, 0, 0, 1]))
    both("crop", 2)
    both("grow", 80)
    k, v = torch.randn(4, 3, Hkv, D), torch.randn(4, 3, Hkv, D)
    both("append", k, v, lengths=torch.tensor([3, 1, 2, 0]))
    # 1e-3, not 1e-4: a coordinate within rounding of a codebook boundary may encode one index apart
    out, ref = both("decode", torch.randn(4, Hq, D))
    assert_max_rel("decode", out[0].cpu(), ref[0], 1e-3)
    both("append", k[:, :2], v[:, :2])
    out, ref = both("decode", torch.randn(4, 2, Hq, D))
    assert_max_rel("causal decode", out[0].cpu(), ref[0], 1e-3)
    assert gpu.seq_lens.tolist() == cpu.seq_lens.tolist() == [8, 15, 16, 9]


def test_non_finite_keys_and_values_propagate_as_in_dense_attention():
    check_non_finite_propagation(DEV)


# ===================================================================== aura_append (fused append)
# One launch per cache write: the kernel against the unfused path on the device (slots, the
# aura_write_cache kernel for K and V, seq_lens += L), bitwise, over tests/_samples/aura.py's grid.
# AuraCache's default on CUDA since this section passed on the H200 (docs/aura-format.md §7).
APPEND_CASES = append_cases()


def _append_same(got, want):
    for name, g, w in zip(("k_codes", "k_norms", "v_codes", "v_norms", "seq_lens"), got, want):
        assert torch.equal(g, w), f"{name} differs"


@pytest.mark.parametrize("case", [c for _, c in APPEND_CASES], ids=[i for i, _ in APPEND_CASES])
def test_append_fused_equals_unfused_bitwise(case):
    a, b = append_cache(**case, device=DEV), append_cache(**case, device=DEV)
    for dtype in (torch.float32, (torch.float16, torch.bfloat16)[case["seed"] % 2]):
        k, v = append_tokens(a, case["L"], case["seed"], dtype)
        unfused_append(a, k, v)
        torch.ops.aura.aura_append(*fused_args(b, k, v))
        torch.cuda.synchronize()
        _append_same(cache_state(b), cache_state(a))


def test_append_strided_views_and_cache_views():
    """k, v as views of one [B, L, 2, Hkv, D] buffer (no 16-byte vector loads for odd offsets), caches as
    views of one (2, B, Hkv, T, PW) buffer: the kernel walks strides as the write kernel does."""
    case = dict(kb=3, vb=4, layout="contig", L=5, B=3, Hkv=3, D=128, full=True, seed=9)
    a, b = append_cache(**case, device=DEV), append_cache(**case, device=DEV)
    kv = torch.randn(3, 5, 2, 3, 128, device=DEV, dtype=torch.bfloat16)
    k, v = kv[:, :, 0], kv[:, :, 1]
    unfused_append(a, k, v)
    torch.ops.aura.aura_append(*fused_args(b, k, v))
    _append_same(cache_state(b), cache_state(a))


@pytest.mark.parametrize("layout", ["contig", "paged"])
def test_append_cuda_graph_append_then_decode_equals_eager(layout, monkeypatch):
    """AuraCache.append (fused: the default; unfused with TORCH_AURA_FUSED_APPEND=0) + decode captured in
    one graph, replayed three times (seq_lens advanced by the graph itself) == the same steps eagerly, fused
    and unfused."""
    def fresh(fused):
        monkeypatch.setenv("TORCH_AURA_FUSED_APPEND", "1" if fused else "0")
        case = dict(kb=4, vb=2, layout=layout, L=1, B=4, Hkv=2, D=128, full=False, seed=21)
        c = append_cache(**case, device=DEV)
        c.seq_lens.fill_(1)  # room for the three steps (capacity >= 6)
        c._appended = 1
        assert c._fused_append is fused
        return c

    g = torch.Generator(device=DEV).manual_seed(0)
    steps = [(torch.randn(4, 2, 128, device=DEV, generator=g), torch.randn(4, 2, 128, device=DEV, generator=g))
             for _ in range(3)]
    q = torch.randn(4, 8, 128, device=DEV, generator=g)
    eager, unfused = fresh(True), fresh(False)
    want = []
    for k1, v1 in steps:
        eager.append(k1, v1)
        unfused.append(k1, v1)
        want.append(eager.decode(q))
        _append_same(cache_state(eager), cache_state(unfused))
    cache = fresh(True)
    k_in, v_in = steps[0][0].clone(), steps[0][1].clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # recorded, not run
        cache.append(k_in, v_in)
        out, lse = cache.decode(q)
    for (k1, v1), (want_out, want_lse) in zip(steps, want):
        k_in.copy_(k1)
        v_in.copy_(v1)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    _append_same(cache_state(cache), cache_state(eager))


def test_append_rejects_bad_input_in_cpp():
    case = dict(kb=4, vb=2, layout="contig", L=2, B=3, Hkv=2, D=64, full=False, seed=1)
    a = append_cache(**case, device=DEV)
    k, v = append_tokens(a, 2, 1)
    args = list(fused_args(a, k, v))
    with pytest.raises(RuntimeError, match="seq_lens"):
        torch.ops.aura.aura_append(*args[:6], a.seq_lens.long(), *args[7:])
    with pytest.raises(RuntimeError, match="v_codes"):
        torch.ops.aura.aura_append(*args[:4], a.k_codes, *args[5:])
    with pytest.raises(RuntimeError, match="v:"):
        torch.ops.aura.aura_append(k, v[:, :1], *args[2:])


@pytest.mark.sanitize
def test_append_small_cases_for_compute_sanitizer():
    """The fused append on small shapes for memcheck/racecheck: rows at and past the capacity, a paged
    table with unallocated (-1) and out-of-range pages (skipped, never dereferenced), 3-bit 8-byte rows,
    L = 17 (several CTA iterations), the seq_lens read-then-advance of every CTA."""
    for case in (dict(kb=3, vb=8, layout="contig", L=17, B=3, Hkv=3, D=64, full=True, seed=3),
                 dict(kb=2, vb=4, layout="paged", L=2, B=3, Hkv=2, D=128, full=True, seed=2),
                 dict(kb=4, vb=4, layout="paged", L=1, B=1, Hkv=8, D=256, full=False, seed=5)):
        a = append_cache(**case, device=DEV)
        k, v = append_tokens(a, case["L"], case["seed"], torch.float16)
        if a.paged:
            a.block_table[0, -1] = -1
            a.block_table[-1, 0] = a.k_codes.shape[0] + 5
        torch.ops.aura.aura_append(*fused_args(a, k, v))
    torch.cuda.synchronize()
