"""The CPU fast path of the dense decode ops (torch_aura.cpu.decode: C++ in csrc/cpu/decode.cpp, or
ATen's fused CPU attention where the C++ library is not built) against the reference
(torch_aura.reference.decode) on the same inputs.

``torch.ops.aura.flash_decode*`` on CPU tensors runs the fast path; the reference runs the CUDA
kernel's split plan token by token and is the oracle. Cases: the shared samples, every GQA ratio
1..8 on both layouts, lengths 0 / 1 / page - 1 / page + 1, NaN padding past a row's length (never
read), NaN in a live token's K or V (propagates to its row only), non-contiguous views and outputs,
16-bit dtypes, out-of-range lengths and page indices; each through every implementation (the native
one with its AVX2 and its portable pass 1), and the native one equal bit for bit at any thread count.
"""

from __future__ import annotations

import math

import pytest
import torch

import torch_aura as ta
from torch_aura import backends
from torch_aura.cpu import FAST_PATHS, native
from torch_aura.reference import decode as R

from _samples import all_samples
from _util import RATIO, assert_close, dtype_id

DECODE_FAST = [op for op, module in FAST_PATHS.items() if module == ".decode"]
SAMPLES = all_samples()
CASES = [(op, s) for op in DECODE_FAST for s in SAMPLES[op]("cpu")]


def _same(name, ours, ref):
    """out by relative RMS at the dtype's gate, lse (fp32) tightly; -inf exactly where the reference has it."""
    (out, lse), (r_out, r_lse) = ours, ref
    assert out.dtype == r_out.dtype and lse.dtype == r_lse.dtype == torch.float32
    assert_close(f"{name} out", out.float(), r_out.float(), RATIO[out.dtype])
    assert_close(f"{name} lse", lse, r_lse, RATIO[torch.float32])


@pytest.fixture(params=["native", "portable", "aten"])
def impl(request, monkeypatch):
    """Which implementation serves: the C++ library where built (ATen still takes contiguous caches of
    one length) with its AVX2 item where the CPU has one, the same with pass1.h's portable item, or
    ATen's attention for everything without the library."""
    if request.param != "aten" and native.LIB is None:
        pytest.skip(f"no CPU extension: {native.REASON}")
    if request.param == "portable":
        monkeypatch.setattr(native, "SIMD", False)
    if request.param == "aten":
        monkeypatch.setattr(native, "LIB", None)
    return request.param


def test_fast_paths_serve_the_cpu():
    assert DECODE_FAST == ["flash_decode", "flash_decode_out"]
    for op in DECODE_FAST:
        assert backends.has_kernel(op, "cpu"), op


@pytest.mark.parametrize("op,sample", CASES, ids=[f"{op}-{s.id}" for op, s in CASES])
def test_op_samples_match_reference(op, sample, impl):
    if op == "flash_decode_out":  # in place: each side writes its own copy of out and lse
        a, b = list(sample.args), list(sample.args)
        b[7], b[8] = a[7].clone(), a[8].clone()
        torch.ops.aura.flash_decode_out(*a)
        R.flash_decode_out(*b)
        _same(sample.id, (a[7], a[8]), (b[7], b[8]))
        return
    out, lse = torch.ops.aura.flash_decode(*sample.args)
    assert out.is_contiguous() and lse.is_contiguous()  # what the fake promises
    _same(sample.id, (out, lse), R.flash_decode(*sample.args))


def _page_table(B, T, page_size, g):
    """An int32 ``[B, ceil(T / page_size)]`` table of permuted pages, two spare pages."""
    W = -(-T // page_size)
    return torch.randperm(B * W + 2, generator=g)[: B * W].reshape(B, W).to(torch.int32)


def _paged_copy(x, table, page_size):
    """``[B, Hkv, T, D]`` -> pages ``[num_blocks, page_size, Hkv, D]`` laid out by ``table``;
    unused page slots and spare pages hold NaN (never to be read)."""
    B, Hkv, T, D = x.shape
    pages = torch.full((table.numel() + 2, page_size, Hkv, D), math.nan, dtype=x.dtype)
    for b in range(B):
        for t in range(T):
            pages[table[b, t // page_size], t % page_size] = x[b, :, t]
    return pages


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("page_size", [None, 16, 7], ids=lambda p: "contiguous" if p is None else f"page{p}")
@pytest.mark.parametrize("G", [1, 2, 3, 4, 5, 6, 7, 8])
def test_gqa_layouts_and_edge_lengths(G, page_size, dtype, impl):
    g = torch.Generator().manual_seed(G)
    Hkv, D, T = 2, 64, 33
    lens = [0, 1, 15, 17, 33]  # empty, one token, page - 1 and page + 1 (page 16), full
    B = len(lens)
    q = torch.randn(B, Hkv * G, D, generator=g).to(dtype)
    k, v = (torch.randn(B, Hkv, T, D, generator=g).to(dtype) for _ in range(2))
    for b, n in enumerate(lens):  # padding past each row's length is never read
        k[b, :, n:], v[b, :, n:] = math.nan, math.nan
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    table = None
    if page_size is not None:
        table = _page_table(B, T, page_size, g)
        k, v = _paged_copy(k, table, page_size), _paged_copy(v, table, page_size)
    out, lse = ta.flash_decode(q, k, v, seq_lens, table)
    _same(f"G{G}", (out, lse), R.flash_decode(q, k, v, seq_lens, table))
    assert bool((out[0] == 0).all()) and bool(lse[0].isneginf().all())  # an empty row, as defined
    assert bool(torch.isfinite(out).all())


def test_one_length_batch_and_a_nan_token_stays_in_its_row(impl):
    g = torch.Generator().manual_seed(11)
    q, k, v = torch.randn(3, 8, 128, generator=g), torch.randn(3, 4, 50, 128, generator=g), torch.randn(3, 4, 50, 128, generator=g)
    seq_lens = torch.full((3,), 40, dtype=torch.int32)
    _same("equal", ta.flash_decode(q, k, v, seq_lens), R.flash_decode(q, k, v, seq_lens))
    v[1, 2, 7] = math.nan  # a live token of row 1, KV head 2: query heads 4 and 5 read it
    out, lse = ta.flash_decode(q, k, v, seq_lens)
    bad = out.isnan().any(-1)
    assert bad[1, 4:6].all() and int(bad.sum()) == 2
    assert_close("nan", out, R.flash_decode(q, k, v, seq_lens)[0], RATIO[torch.float32])


def test_non_contiguous_views_scale_and_data_errors(impl):
    g = torch.Generator().manual_seed(12)
    q = torch.randn(2, 12, 96, generator=g)[:, ::2]  # strided heads
    k = torch.randn(2, 70, 3, 96, generator=g).transpose(1, 2)  # [B, T, Hkv, D] storage
    v = torch.randn(2, 3, 90, 96, generator=g)[:, :, 10:80]  # a token window
    seq_lens = torch.tensor([70, 9], dtype=torch.int32)
    _same("views", ta.flash_decode(q, k, v, seq_lens, scale=0.3), R.flash_decode(q, k, v, seq_lens, scale=0.3))
    with pytest.raises(ValueError, match=r"seq_lens: expected values in \[0, 70\]"):
        ta.flash_decode(q, k, v, torch.tensor([71, 0], dtype=torch.int32))


@pytest.mark.skipif(native.LIB is None, reason=f"no CPU extension: {native.REASON}")
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_native_answer_does_not_depend_on_threads_and_long_rows_split(paged):
    """Blocks come from the shapes alone: 1 and 2 threads give the same bits; a long row (several
    pass-1 blocks, merged) and a batch of short ones both match the reference."""
    g = torch.Generator().manual_seed(13)
    B, Hq, Hkv, D, T = 3, 8, 2, 128, 3000  # ragged: the native path on both layouts
    q, k, v = torch.randn(B, Hq, D, generator=g), torch.randn(B, Hkv, T, D, generator=g), torch.randn(B, Hkv, T, D, generator=g)
    lens = torch.tensor([3000, 700, 1], dtype=torch.int32)
    table = None
    if paged:
        table = _page_table(B, T, 32, g)
        k, v = _paged_copy(k, table, 32), _paged_copy(v, table, 32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ta.flash_decode(q, k, v, lens, table)
        torch.set_num_threads(2)
        two = ta.flash_decode(q, k, v, lens, table)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    _same("long", one, R.flash_decode(q, k, v, lens, table))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
def test_paged_nan_key_strided_out_and_page_errors(dtype, impl):
    """A NaN in a live key poisons its KV head's query rows only; flash_decode_out fills strided outputs
    in place; a length past the table's capacity or a used page index outside the cache raises the
    reference's error, while unused table entries (-1) are never read."""
    g = torch.Generator().manual_seed(14)
    B, Hq, Hkv, D, T, page = 3, 6, 2, 80, 70, 32
    q = torch.randn(B, Hq, D, generator=g).to(dtype)
    k, v = (torch.randn(B, Hkv, T, D, generator=g).to(dtype) for _ in range(2))
    lens = torch.tensor([70, 33, 5], dtype=torch.int32)
    table = _page_table(B, T, page, g)
    k, v = _paged_copy(k, table, page), _paged_copy(v, table, page)
    table[2, 1:] = -1  # row 2 uses one page
    k[table[1, 1], 0, 1] = math.nan  # token 32 of row 1, KV head 1: query heads 3..5
    out = torch.full((B, 2 * Hq, D), 7.0, dtype=dtype)[:, ::2]  # a strided view: written in place
    lse = torch.full((Hq, B), 7.0).t()
    torch.ops.aura.flash_decode_out(q, k, v, lens, table, None, 0, out, lse)
    r_out, r_lse = R.flash_decode(q, k, v, lens, table)
    bad = out.isnan().any(-1)
    assert bad[1, 3:].all() and int(bad.sum()) == 3
    keep = ~bad
    assert_close("out", out[keep].float(), r_out[keep].float(), RATIO[dtype])
    assert_close("lse", lse[keep], r_lse[keep], RATIO[torch.float32])
    with pytest.raises(ValueError, match=r"seq_lens: expected values in \[0, 96\]"):
        ta.flash_decode(q, k, v, torch.tensor([97, 1, 1], dtype=torch.int32), table)
    table[1, 1] = k.shape[0]
    with pytest.raises(ValueError, match=r"block_table: expected page indices in \[0, 11\)"):
        ta.flash_decode(q, k, v, lens, table)
