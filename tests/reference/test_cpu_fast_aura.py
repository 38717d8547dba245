"""The CPU fast path of the AURA ops (torch_aura.cpu.aura, C++ in csrc/cpu) against the reference.

``torch.ops.aura.*`` on CPU tensors runs the fast path (tests/registration/test_backends.py checks
the registration); every case here compares it with the ``torch_aura.reference.aura`` function of
the same name on the same inputs.
"""

from __future__ import annotations

import pytest
import torch

import torch_aura as ta
from torch_aura import backends
from torch_aura.cpu import FAST_PATHS, native
from torch_aura.reference import aura as R

from _aura_cache import check_codes_near_boundaries, check_non_finite_propagation
from _samples import all_samples
from _util import max_rel

pytestmark = pytest.mark.skipif(native.LIB is None, reason=f"no CPU extension: {native.REASON}")

AURA_FAST = [op for op, module in FAST_PATHS.items() if module == ".aura"]
SAMPLES = all_samples()
CASES = [(op, s) for op in AURA_FAST for s in SAMPLES[op]("cpu")]


def _close(ours, ref, tol=2e-6):
    """Equal up to fp32 rounding, with NaN / -inf exactly where the reference has them."""
    ours, ref = torch.as_tensor(ours).double(), torch.as_tensor(ref).double()
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    assert torch.equal(ours.isnan(), ref.isnan())
    assert torch.equal(ours.isneginf(), ref.isneginf())
    finite = torch.isfinite(ref)
    assert bool(torch.isfinite(ours[finite]).all())
    if finite.any():
        assert max_rel(ours[finite], ref[finite]) <= tol


def test_fast_paths_serve_the_cpu():
    for op in AURA_FAST:
        assert backends.has_kernel(op, "cpu"), op


@pytest.mark.parametrize("op,sample", CASES, ids=[f"{op}-{s.id}" for op, s in CASES])
def test_op_samples_match_reference(op, sample):
    if op == "aura_write_cache":  # in place: each side writes its own copy of the caches
        a = list(sample.args)
        b = list(sample.args)
        b[1], b[2] = a[1].clone(), a[2].clone()
        torch.ops.aura.aura_write_cache(*a, **sample.kwargs)
        R.aura_write_cache(*b, **sample.kwargs)
        _check_written(a, b, sample.kwargs)
        return
    ours = getattr(torch.ops.aura, op)(*sample.args, **sample.kwargs)
    ref = getattr(R, op)(*sample.args, **sample.kwargs)
    if op == "aura_encode":
        x, cb, bd, bits = sample.args[:4]
        mask = sample.args[4] if len(sample.args) > 4 else sample.kwargs.get("sign_mask")
        check_codes_near_boundaries(x, *ours, *ref, bits, mask)
        return
    ours, ref = (ours, ref) if isinstance(ours, tuple) else ((ours,), (ref,))
    for a, b in zip(ours, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        if op == "hadamard_rotate":  # same butterflies in the same order: bit for bit
            assert torch.equal(a, b)
        else:
            _close(a.float(), b.float(), tol=1e-5 if a.dtype == torch.float32 else 1e-2)


def _check_written(ours, ref, kwargs):
    """Same caches after the write: the samples' rows sit away from boundary ties (ties are the
    encode test's business), so codes match bit for bit and norms to fp32 rounding."""
    codes, norms, ref_codes, ref_norms = ours[1], ours[2], ref[1], ref[2]
    assert torch.equal(codes, ref_codes)
    assert torch.equal(norms.isnan(), ref_norms.isnan())
    finite = ~ref_norms.isnan()
    assert max_rel(norms[finite], ref_norms[finite]) <= 1e-5


def _cache(kb, vb, B, Hkv, D, cap, lengths, page_size=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    if page_size is None:
        c = ta.AuraCache(f"aura{kb}v{vb}", batch=B, kv_heads=Hkv, head_dim=D, capacity=cap)
    else:
        pages = -(-cap // page_size)
        table = torch.randperm(B * pages + 3, generator=g)[: B * pages].reshape(B, pages).int()
        c = ta.AuraCache(f"aura{kb}v{vb}", batch=B, kv_heads=Hkv, head_dim=D, num_blocks=B * pages + 3,
                         page_size=page_size, block_table=table)
    n = max(lengths)
    c.append(torch.randn(B, n, Hkv, D, generator=g), torch.randn(B, n, Hkv, D, generator=g),
             lengths=torch.tensor(lengths))
    return c


def _decode_both(c, q, num_splits=0):
    args = (q, c.k_codes, c.k_norms, c.v_codes, c.v_norms, c.seq_lens, c.k_codebook, c.v_codebook,
            c.k_sign_mask, c.v_sign_mask, c.key_bits, c.value_bits, c.block_table, None, num_splits)
    return torch.ops.aura.aura_decode(*args), R.aura_decode(*args)


@pytest.mark.parametrize("kb,vb", [(kb, vb) for kb in (2, 3, 4, 8) for vb in (2, 3, 4, 8)])
@pytest.mark.parametrize("D", [64, 128, 256, 512])
def test_decode_every_format_and_head_dim(kb, vb, D):
    # lengths 0, 1, and around the 64-token block: empty, single, block - 1, block + 1
    c = _cache(kb, vb, B=4, Hkv=2, D=D, cap=130, lengths=[0, 1, 63, 65])
    q = torch.randn(4, 6, D)  # GQA 3
    (out, lse), (r_out, r_lse) = _decode_both(c, q, num_splits=3)
    _close(out, r_out)
    _close(lse, r_lse)
    assert bool((out[0] == 0).all()) and bool(lse[0].isneginf().all())  # empty sequence


@pytest.mark.parametrize("G", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("L", [1, 3, 17], ids=lambda L: f"L{L}")
def test_decode_gqa_layouts_and_causal_queries(G, paged, L):
    Hkv, D = 2, 64
    c = _cache(4, 2, B=3, Hkv=Hkv, D=D, cap=300, lengths=[300, 5, 129], page_size=16 if paged else None, seed=G)
    q = torch.randn(3, Hkv * G, D) if L == 1 else torch.randn(3, L, Hkv * G, D)  # seq 5 < L = 17: p_i < 0
    for num_splits in (0, 1, 7):
        (out, lse), (r_out, r_lse) = _decode_both(c, q, num_splits)
        _close(out, r_out)
        _close(lse, r_lse)


def test_non_contiguous_cache_views_and_16bit_queries():
    # Caches that are views (every other KV head, a token window, K and V strided differently) of
    # larger buffers, and bf16 / fp16 queries.
    big = _cache(3, 4, B=2, Hkv=4, D=128, cap=200, lengths=[200, 200])
    kc, vc = big.k_codes[:, ::2, 50:], big.v_codes[:, 1::2, :150]
    kn, vn = big.k_norms[:, ::2, 50:], big.v_norms[:, 1::2, :150]
    assert not kc.is_contiguous() and not vn.is_contiguous()
    seq = torch.tensor([100, 37], dtype=torch.int32)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q = torch.randn(2, 4, 128).to(dtype)
        args = (q, kc, kn, vc, vn, seq, big.k_codebook, big.v_codebook, big.k_sign_mask, big.v_sign_mask, 3, 4)
        out, lse = torch.ops.aura.aura_decode(*args)
        r_out, r_lse = R.aura_decode(*args)
        assert out.dtype == dtype
        _close(out.float(), r_out.float(), tol=1e-5 if dtype == torch.float32 else 1e-2)
        _close(lse, r_lse)


def test_thread_count_does_not_change_the_answer():
    # Each (sequence, KV head, block) item is summed by one thread in a fixed order: bit for bit.
    c = _cache(4, 4, B=2, Hkv=4, D=128, cap=1000, lengths=[1000, 999])
    q = torch.randn(2, 16, 128)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.aura.aura_decode(q, c.k_codes, c.k_norms, c.v_codes, c.v_norms, c.seq_lens, c.k_codebook,
                                         c.v_codebook, c.k_sign_mask, c.v_sign_mask, 4, 4)
        torch.set_num_threads(3)
        three = torch.ops.aura.aura_decode(q, c.k_codes, c.k_norms, c.v_codes, c.v_norms, c.seq_lens,
                                           c.k_codebook, c.v_codebook, c.k_sign_mask, c.v_sign_mask, 4, 4)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one[0], three[0]) and torch.equal(one[1], three[1])


def test_nan_and_inf_propagate_like_the_reference():
    check_non_finite_propagation("cpu")
    o = torch.zeros(1, 2, 3, 64)
    m = torch.tensor([[[0.0, 1.0, -float("inf")], [float("nan"), 0.0, 0.0]]])
    l = torch.tensor([[[1.0, 2.0, 0.0], [1.0, 1.0, 0.0]]])
    ours, ref = torch.ops.aura.aura_flash_p2(o, m, l), R.aura_flash_p2(o, m, l)
    _close(ours[0], ref[0])
    _close(ours[1], ref[1])
    assert bool(ours[0][0, 1].isnan().all()) and bool(ours[0][0, 0].isfinite().all())


def test_data_errors_are_the_references():
    c = _cache(4, 2, B=2, Hkv=1, D=64, cap=10, lengths=[3, 4])
    bad = torch.tensor([3, 11], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"seq_lens: expected values in \[0, T_cap = 10\]"):
        torch.ops.aura.aura_decode(torch.randn(2, 2, 64), c.k_codes, c.k_norms, c.v_codes, c.v_norms, bad,
                                   c.k_codebook, c.v_codebook, c.k_sign_mask, c.v_sign_mask, 4, 2)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("D", [64, 128, 256, 512])
def test_encode_every_width_with_zero_nan_inf_rows(D, bits):
    g = torch.Generator().manual_seed(D + bits)
    x = torch.randn(5, 67, D, generator=g) * 3
    x[0, 3] = 0.0
    x[1, 4, 2] = float("nan")
    x[2, 5, 9] = float("inf")
    mask = ta.aura_sign_mask(D, layer=1)
    cb, bd = ta.aura_codebook(bits, D)
    codes, norms = torch.ops.aura.aura_encode(x, cb, bd, bits, mask)
    check_codes_near_boundaries(x, codes, norms, *R.aura_encode(x, cb, bd, bits, mask), bits, mask)
    assert norms[0, 3].item() == 0.0 and bool(norms[1, 4].isnan()) and bool(norms[2, 5].isnan())
    x16 = x[3:].to(torch.bfloat16).transpose(0, 1)  # a 16-bit, non-contiguous input
    check_codes_near_boundaries(x16, *torch.ops.aura.aura_encode(x16, cb, bd, bits, None),
                                *R.aura_encode(x16, cb, bd, bits, None), bits, None)
