"""AURA kernels (csrc/mps/shaders/aura.metal) under the emulator vs the reference (aura-format.md
§11.6): rotation, encode and cache writes, the fused append, dequantize, pass 1 (plain and causal),
pass 2 with the fused inverse rotation, and the whole aura_decode, for every bit width and head dim."""

import math

import pytest
import torch

import torch_aura
from _compare import check_op, emulated_results, reference_results
from _samples.aura import SAMPLES, append_cache, append_cases, append_tokens, fused_args
from _util import dtype_id
from torch_aura.reference import aura as ref

BITS = (2, 3, 4, 8)
DIMS = (64, 128, 256, 512)


def _tables(bits, D):
    cb, bd = torch_aura.aura_codebook(bits, D)
    return cb, bd


def _encode_close(got, want, x, bits, sign_mask, label):
    """aura-format.md §11.6: codes may differ only where |y_j - boundary| <= 1e-5 / sqrt(D), and
    then by exactly one index; norms within 1e-5 relative."""
    codes, norms = got
    codes_ref, norms_ref = want
    D = x.shape[-1]
    idx, idx_ref = ref.unpack_codes(codes, bits, D), ref.unpack_codes(codes_ref, bits, D)
    diff = idx != idx_ref
    xf = x.float()
    r = xf.norm(dim=-1, keepdim=True)
    y = ref.hadamard_rotate(torch.where(r > 0, xf / r, 0.0), sign_mask)
    # exact zeros of the rotation (sums of +-1 that cancel) are exact in every order: a tie with
    # the middle boundary 0 must take the lower index, as the reference's strict >
    ties = (y == 0) & torch.isfinite(r)
    assert not bool((diff & ties).any()), f"{label}: a tie with boundary 0 took the wrong index"
    if diff.any():
        _, bd = _tables(bits, D)
        near = (y[..., None] - bd).abs().min(-1).values <= 1e-5 / math.sqrt(D)
        assert bool((diff <= near).all()), f"{label}: codes differ away from a boundary"
        assert int((idx - idx_ref)[diff].abs().max()) == 1, f"{label}: codes differ by more than one index"
    torch.testing.assert_close(norms, norms_ref, rtol=1e-5, atol=1e-7, equal_nan=True, msg=label)


def test_samples_of_the_exact_ops(emu):
    # Everything but encode / write_cache (those are checked with the boundary rule below).
    for name in ("hadamard_rotate", "aura_dequantize", "aura_flash_p1", "aura_flash_p2", "aura_decode"):
        for sample in SAMPLES[name]("cpu"):
            check_op(emu, name, sample.args, orders=("forward", "shuffled"))


@pytest.mark.parametrize("name", ["aura_encode", "aura_write_cache"])
def test_samples_of_encode_ops(emu, name):
    for sample in SAMPLES[name]("cpu"):
        got, want = emulated_results(emu, name, sample.args), reference_results(name, sample.args)
        x = sample.args[0]
        bits = sample.args[3] if name == "aura_encode" else sample.args[6]
        mask = (sample.args[4] if len(sample.args) > 4 else None) if name == "aura_encode" else (
            sample.args[7] if len(sample.args) > 7 else None)
        if name == "aura_encode":
            _encode_close(got, want, x, bits, mask, sample.id)
        else:  # caches: equal outside the written slots, encode rule inside
            codes, norms = got
            assert codes.shape == want[0].shape
            torch.testing.assert_close(norms, want[1], rtol=1e-5, atol=1e-7)
            assert (ref.unpack_codes(codes, bits, x.shape[-1]) - ref.unpack_codes(want[0], bits, x.shape[-1])).abs().max() <= 1


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_rotate_every_dim(emu, D, dtype):
    g = torch.Generator().manual_seed(D)
    x = (torch.randn(3, 2, D + 8, generator=g)[..., 4 : 4 + D]).to(dtype)  # strided rows
    mask = torch_aura.aura_sign_mask(D, seed=1)
    for inverse in (False, True):
        check_op(emu, "hadamard_rotate", (x, mask, 0.7, inverse), orders=("forward",))
    check_op(emu, "hadamard_rotate", (x, None, 1.0, False), orders=("forward",))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("D", DIMS)
def test_encode_dequantize_round_trip(emu, bits, D):
    g = torch.Generator().manual_seed(bits * D)
    x = torch.randn(5, D, generator=g)
    x[1] = 0.0  # zero row: codes 2^(b-1), norm 0
    x[2, 3] = math.nan  # non-finite row: codes 2^(b-1), norm NaN (propagates)
    x[3, :2] = 0.25  # two equal entries
    mask = torch_aura.aura_sign_mask(D, seed=2, kind="v")
    # s * x = e_0 - e_1: every even rotated coordinate is exactly 0, a tie with the middle boundary
    signs = ref.signs_from_mask(mask, D)
    x[4] = 0.0
    x[4, 0], x[4, 1] = signs[0], -signs[1]
    cb, bd = _tables(bits, D)
    got = emulated_results(emu, "aura_encode", (x, cb, bd, bits, mask))
    want = reference_results("aura_encode", (x, cb, bd, bits, mask))
    _encode_close(got, want, x, bits, mask, f"encode b{bits} D{D}")
    codes, norms = want
    for out_dtype in (None, torch.float16):
        check_op(emu, "aura_dequantize", (codes, norms, cb, bits, mask, out_dtype), orders=("forward",))
        check_op(emu, "aura_dequantize", (codes, norms, cb, bits, None, out_dtype), orders=("forward",))


def _cache(B, Hkv, D, T_cap, kb, vb, page, seed):
    g = torch.Generator().manual_seed(seed)
    (kcb, kbd), (vcb, vbd) = _tables(kb, D), _tables(vb, D)
    km, vm = torch_aura.aura_sign_mask(D, kind="k"), torch_aura.aura_sign_mask(D, kind="v")
    k = torch.randn(B, Hkv, T_cap, D, generator=g)
    v = torch.randn(B, Hkv, T_cap, D, generator=g)
    kc, kn = ref.aura_encode(k, kcb, kbd, kb, km)
    vc, vn = ref.aura_encode(v, vcb, vbd, vb, vm)
    if page is None:
        return kc, kn, vc, vn, None, (kcb, vcb, km, vm)
    # paged: scatter the same tokens to shuffled pages of `page` slots
    max_blocks = -(-T_cap // page)
    nb = B * max_blocks + 1
    table = torch.randperm(nb, generator=g)[: B * max_blocks].to(torch.int32).view(B, max_blocks)
    pages = [torch.zeros(nb, page, Hkv, t.shape[-1], dtype=t.dtype) for t in (kc, vc)]
    norms = [torch.full((nb, page, Hkv), math.nan) for _ in range(2)]
    for b in range(B):
        for t in range(T_cap):
            blk, off = int(table[b, t // page]), t % page
            pages[0][blk, off], pages[1][blk, off] = kc[b, :, t], vc[b, :, t]
            norms[0][blk, off], norms[1][blk, off] = kn[b, :, t], vn[b, :, t]
    return pages[0], norms[0], pages[1], norms[1], table, (kcb, vcb, km, vm)


# (B, Hq, Hkv, D, kb, vb, lens, T_cap, page, L): every bit pair, G 1..8, T = 0, 1, bs +- 1, paged
CASES = [
    (2, 4, 2, 64, 4, 2, [0, 1], 8, None, None),
    (1, 8, 1, 128, 3, 3, [63], 65, None, None),
    (2, 6, 2, 64, 8, 4, [65, 20], 70, 16, None),
    (1, 3, 3, 256, 2, 8, [33], 40, 1, None),
    (1, 2, 1, 512, 4, 4, [17], 17, None, None),
    (2, 4, 2, 64, 4, 2, [9, 2], 12, 5, 3),  # causal, L = 3; the second sequence has p_0 < 0
    (1, 7, 1, 128, 2, 4, [70], 72, None, 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-Hq{}-Hkv{}-D{}-k{}v{}-T{}-{}-L{}".format(
    c[0], c[1], c[2], c[3], c[4], c[5], max(c[6]), "contig" if c[8] is None else f"page{c[8]}", c[9] or 1))
def test_attention(emu, case):
    B, Hq, Hkv, D, kb, vb, lens, T_cap, page, L = case
    kc, kn, vc, vn, table, (kcb, vcb, km, vm) = _cache(B, Hkv, D, T_cap, kb, vb, page, seed=D + kb)
    g = torch.Generator().manual_seed(1)
    q = torch.randn((B, Hq, D) if L is None else (B, L, Hq, D), generator=g)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    for dtype in (torch.float32, torch.float16):
        qd = q.to(dtype)
        check_op(emu, "aura_decode", (qd, kc, kn, vc, vn, seq_lens, kcb, vcb, km, vm, kb, vb, table, None, 0),
                 orders=("forward",))
    check_op(emu, "aura_decode", (q, kc, kn, vc, vn, seq_lens, kcb, vcb, km, vm, kb, vb, table, 0.2, 3),
             orders=("forward", "reverse"))
    q_rot = ref.hadamard_rotate(q, km, scale=D ** -0.5)
    o, m, l = check_op(emu, "aura_flash_p1", (q_rot, kc, kn, vc, vn, seq_lens, kcb, vcb, kb, vb, table, 16),
                       orders=("forward",))
    if o.shape[-2] > 1:  # poisoned partials of a block marked empty must be skipped
        o[..., -1, :] = math.nan
        l[..., -1] = 0.0
    check_op(emu, "aura_flash_p2", (o, m, l, vm, torch.bfloat16), orders=("forward",))
    check_op(emu, "aura_flash_p2", (o, m, l, None, None), orders=("forward",))


def test_every_gqa_ratio(emu):
    # all query heads of a KV head in one threadgroup, 4 simdgroups: G = 1..8 cover rows < 4,
    # = 4 and several rows per simdgroup; both layouts
    for G in range(1, 9):
        for page in (None, 3):
            kc, kn, vc, vn, table, (kcb, vcb, km, vm) = _cache(1, 2, 64, 11, 4, 2, page, seed=G)
            q = torch.randn(1, 2 * G, 64, generator=torch.Generator().manual_seed(G))
            seq_lens = torch.tensor([11], dtype=torch.int32)
            check_op(emu, "aura_decode", (q, kc, kn, vc, vn, seq_lens, kcb, vcb, km, vm, 4, 2, table, None, 2),
                     orders=("forward",))


def test_out_of_range_lengths_and_pages_never_fault(emu):
    kc, kn, vc, vn, table, (kcb, vcb, km, vm) = _cache(2, 1, 64, 20, 4, 4, 8, seed=1)
    q = torch.randn(2, 2, 64)
    seq_lens = torch.tensor([10**6, 5], dtype=torch.int32)
    table[0, 0], table[1, 0] = 10**6, -7
    out, lse = emu.run_op("aura_decode", q, kc, kn, vc, vn, seq_lens, kcb, vcb, km, vm, 4, 4, table, None, 0)
    assert out.shape == (2, 2, 64) and lse.shape == (2, 2)


def test_write_cache_skips_negative_and_out_of_range_slots(emu):
    cb, bd = _tables(4, 64)
    x = torch.randn(4, 2, 64)
    codes = torch.zeros(2, 2, 5, 8, dtype=torch.int32)  # PW = 64 * 4 / 32
    norms = torch.zeros(2, 2, 5)
    slots = torch.tensor([3, -1, 10**9, 7], dtype=torch.int64)
    emu.run_op("aura_write_cache", x, codes, norms, slots, cb, bd, 4, None, False)
    want_c, want_n = codes.clone().zero_(), norms.clone().zero_()
    ref.aura_write_cache(x[[0, 3]], want_c, want_n, slots[[0, 3]], cb, bd, 4)
    assert torch.equal(codes, want_c)
    torch.testing.assert_close(norms, want_n, rtol=1e-6, atol=0)


# ------------------------------------------------------------------------------- aura_append
# Its plan (csrc/mps/plan/aura.cpp plan_aura_append): aura_append_slots (the slots from seq_lens, then
# seq_lens += L), then aura_encode's write mode for K and for V over those slots.
APPEND_CASES = append_cases()


def _append_close(got, want, args, label):
    """k_codes, k_norms, v_codes, v_norms, seq_lens: seq_lens equal; codes equal but for an index moved
    by one at a boundary tie (the encode rule, aura-format.md §11.6; the untouched words are equal);
    norms within 1e-5, or 1e-4 in a vector whose codes moved (its corrected norm r / |c| moves with them:
    1.7e-5 for one 8-bit index seen)."""
    k, key_bits, value_bits = args[0], args[11], args[12]
    D = k.shape[-1]
    assert torch.equal(got[4], want[4]), f"{label}: seq_lens differ"
    for i, bits in ((0, key_bits), (2, value_bits)):
        assert got[i].shape == want[i].shape, label
        diff = (ref.unpack_codes(got[i], bits, D) - ref.unpack_codes(want[i], bits, D)).abs()
        assert diff.numel() == 0 or int(diff.max()) <= 1, f"{label}[{i}]: codes differ by more than one index"
        assert float((diff > 0).float().mean()) <= 0.01, f"{label}[{i}]: codes differ away from boundary ties"
        moved = (diff > 0).any(-1)
        torch.testing.assert_close(got[i + 1][~moved], want[i + 1][~moved], rtol=1e-5, atol=1e-7, equal_nan=True,
                                   msg=label)
        torch.testing.assert_close(got[i + 1][moved], want[i + 1][moved], rtol=1e-4, atol=1e-7, msg=label)


def _unfused_emulated(emu, args, slots):
    """The write path on the emulator: aura_write_cache of K and of V at `slots`, then seq_lens += L."""
    (k, v, kc, kn, vc, vn, seq, kcb, kbd, vcb, vbd, kb, vb, km, vm, table) = [
        a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    B, L, Hkv, D = k.shape
    paged = table is not None
    emu.run_op("aura_write_cache", k.reshape(B * L, Hkv, D), kc, kn, slots, kcb, kbd, kb, km, paged)
    emu.run_op("aura_write_cache", v.reshape(B * L, Hkv, D), vc, vn, slots, vcb, vbd, vb, vm, paged)
    return [kc, kn, vc, vn, seq + L]


def test_append_samples(emu):
    for sample in SAMPLES["aura_append"]("cpu"):
        _append_close(emulated_results(emu, "aura_append", sample.args, "shuffled"),
                      reference_results("aura_append", sample.args), sample.args, sample.id)
        assert emu.last_launches == 3, sample.id  # slots + advance, K, V


@pytest.mark.parametrize("case", [c for _, c in APPEND_CASES], ids=[i for i, _ in APPEND_CASES])
def test_append_grid(emu, case):
    """The grid of tests/reference/test_aura_append.py (every bit pair, contiguous and shuffled paged,
    L 1 / 2 / 17, odd B, Hkv, capacities and page sizes, rows at capacity - 1 and capacity): the
    reference within the encode rule, and every third case the emulator's own unfused write path bit
    for bit (the same encode kernel, so no tie may move)."""
    cache = append_cache(**case)
    args = fused_args(cache, *append_tokens(cache, case["L"], case["seed"]))
    order = ("forward", "reverse", "shuffled")[case["seed"] % 3]
    got = emulated_results(emu, "aura_append", args, order, seed=case["seed"])
    _append_close(got, reference_results("aura_append", args), args, order)
    if case["seed"] % 3 == 0:
        slots = ref.append_slots(cache.seq_lens, case["L"], cache.k_codes, args[-1])
        for g, w, name in zip(got, _unfused_emulated(emu, args, slots), ("k_codes", "k_norms", "v_codes", "v_norms",
                                                                         "seq_lens")):
            assert torch.equal(g, w), f"{name} differs from the unfused write path"


@pytest.mark.parametrize("layout", ["contig", "paged"])
def test_append_bad_data_skips_tokens_and_never_faults(emu, layout):
    # The reference raises on these (tests/reference/test_aura_append.py); the kernels, which read no
    # data on the host, skip the tokens concerned and still advance seq_lens by L (int32 wrap-around).
    case = dict(kb=3, vb=4, layout=layout, L=3, B=3, Hkv=2, D=64, full=False, seed=5)
    cache = append_cache(**case)
    k, v = append_tokens(cache, 3, 5)
    # row 0: positions -2, -1 skipped, 0 written; row 1: past the capacity, then the advance wraps
    cache.seq_lens.copy_(torch.tensor([-2, 2**31 - 2, 2], dtype=torch.int32))
    if layout == "paged":  # page size 4: row 2's positions 2, 3 have no page (skipped), 4 is written
        cache.block_table[2, 0] = -1
        cache.block_table[0, 1] = cache.k_codes.shape[0]  # past the pool: never read by this append
    args = fused_args(cache, k, v)
    got = emulated_results(emu, "aura_append", args, "shuffled")
    slots = ref.append_slots(cache.seq_lens, 3, cache.k_codes, args[-1], strict=False)
    assert int((slots >= 0).sum()) > 0 and int((slots < 0).sum()) > 0
    want = [t.clone() for t in args[2:7]]
    paged = layout == "paged"
    ref.aura_write_cache(k.reshape(9, 2, 64), want[0], want[1], slots, *args[7:9], 3, args[13], paged)
    ref.aura_write_cache(v.reshape(9, 2, 64), want[2], want[3], slots, *args[9:11], 4, args[14], paged)
    want[4] += 3
    assert want[4].tolist()[:2] == [1, -2**31 + 1]
    _append_close(got, want, args, layout)


def test_append_nothing_to_do(emu):
    # L = 0 or B = 0: no dispatch, seq_lens unmoved; a zero capacity: seq_lens advances, nothing written
    cache = append_cache(kb=4, vb=4, layout="contig", L=1, B=3, Hkv=2, D=64, full=False, seed=3)
    k = torch.zeros(3, 0, 2, 64)
    args = fused_args(cache, k, k)
    got = emulated_results(emu, "aura_append", args)
    assert emu.last_launches == 0 and all(torch.equal(g, w) for g, w in zip(got, args[2:7]))
    cb, bd = _tables(4, 64)
    codes, norms = torch.zeros(2, 1, 0, 8, dtype=torch.int32), torch.zeros(2, 1, 0)
    seq = torch.tensor([0, 5], dtype=torch.int32)
    x = torch.randn(2, 2, 1, 64)
    emu.run_op("aura_append", x, x, codes, norms, codes.clone(), norms.clone(), seq, cb, bd, cb, bd, 4, 4)
    assert seq.tolist() == [2, 7] and emu.last_launches == 1
