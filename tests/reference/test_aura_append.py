"""aura_append (one launch per cache write) against the path AuraCache.append takes today, bit for
bit: codes, norms and seq_lens, on the CPU. The op's CPU kernel is its reference (the write path
composed), so the oracle runs today's path with the reference kernels too (the C++ fast path of
aura_encode may move a code by one at a boundary tie: tests/reference/test_cpu_fast_aura.py).

The grid (tests/_samples/aura.py ``append_cases``): every (key_bits, value_bits) pair in {2, 3, 4, 8}^2,
contiguous and paged (a shuffled block table), L in (1, 2, 17), B in (1, 3), Hkv in 1..8, D in
(64, 128, 256), and rows at capacity - 1 and capacity, where tokens past the capacity are skipped and
seq_lens still advances by L. The caches start with random words, so a stray write shows.
"""

from __future__ import annotations

import pytest
import torch

import torch_aura as ta
from torch_aura.reference import aura as R

from _samples.aura import (append_cache, append_cases, append_tokens, cache_state, fused_args,
                           unfused_append)

CASES = append_cases()


def _assert_same(got, expected):
    for name, g, e in zip(("k_codes", "k_norms", "v_codes", "v_norms", "seq_lens"), got, expected):
        assert torch.equal(g, e), f"{name} differs"


def _reference_kernels(cache):
    """Today's AuraCache.append with the reference encode and write (the ops it holds as attributes)."""
    cache._write_op, cache._encode_op = R.aura_write_cache, R.aura_encode
    return cache


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_op_equals_unfused_path(case):
    """The op as dispatched on the CPU against the same composition of today's write op."""
    a, b = append_cache(**case), append_cache(**case)
    k, v = append_tokens(a, case["L"], case["seed"])
    unfused_append(a, k, v, write=R.aura_write_cache)
    torch.ops.aura.aura_append(*fused_args(b, k, v))
    _assert_same(cache_state(b), cache_state(a))
    assert torch.equal(b.seq_lens, append_cache(**case).seq_lens + case["L"])  # advanced by L, never clamped


@pytest.mark.parametrize("case", [c for _, c in CASES[::5]], ids=[i for i, _ in CASES[::5]])
def test_reference_function_equals_unfused_path(case):
    a, b = append_cache(**case), append_cache(**case)
    k, v = append_tokens(a, case["L"], case["seed"])
    unfused_append(a, k, v, write=R.aura_write_cache)
    R.aura_append(*fused_args(b, k, v))
    _assert_same(cache_state(b), cache_state(a))


@pytest.mark.parametrize("case", [c for _, c in CASES if not c["full"]][::2],
                         ids=[i for i, c in CASES if not c["full"]][::2])
def test_op_equals_aura_cache_append(case):
    """Where every token fits, the oracle is AuraCache.append itself (its one-token CPU path included)."""
    a, b = _reference_kernels(append_cache(**case)), append_cache(**case)
    k, v = append_tokens(a, case["L"], case["seed"])
    three_d = case["L"] == 1 and case["seed"] % 2  # half the one-token cases as [B, Hkv, D]
    a.append(k[:, 0] if three_d else k, v[:, 0] if three_d else v)
    ta.aura_append(*fused_args(b, k, v))
    _assert_same(cache_state(b), cache_state(a))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_and_strided_views(dtype):
    case = dict(kb=3, vb=4, layout="contig", L=2, B=3, Hkv=2, D=128, full=True, seed=7)
    a, b = append_cache(**case), append_cache(**case)
    g = torch.Generator().manual_seed(5)
    kv = torch.randn(3, 2, 2, 2, 128, generator=g).to(dtype)  # [B, L, k|v, Hkv, D]: views of one buffer
    k, v = kv[:, :, 0], kv[:, :, 1]
    assert not k.is_contiguous()
    unfused_append(a, k, v, write=R.aura_write_cache)
    ta.aura_append(*fused_args(b, k, v))
    _assert_same(cache_state(b), cache_state(a))


def test_wired_into_aura_cache_append(monkeypatch):
    """AuraCache.append with the fused op switched on (the default on CUDA only;
    forced here to run the wiring on the CPU) equals the unfused append, contiguous and paged, one
    token ([B, Hkv, D]) and a chunk."""
    for layout in ("contig", "paged"):
        for L in (1, 5):
            case = dict(kb=4, vb=2, layout=layout, L=L, B=3, Hkv=2, D=64, full=False, seed=11 + L)
            a, b = _reference_kernels(append_cache(**case)), append_cache(**case)
            k, v = append_tokens(a, L, case["seed"])
            b._fused_append = True
            calls = []
            monkeypatch.setattr(b, "_append_op", lambda *args: calls.append(1) or torch.ops.aura.aura_append(*args))
            for cache in (a, b):
                cache.append(k[:, 0] if L == 1 else k, v[:, 0] if L == 1 else v)
            assert calls == [1]
            _assert_same(cache_state(b), cache_state(a))
            assert a._appended == b._appended


def test_prefill_chunks_take_the_unfused_path(monkeypatch):
    """aura_append's grid is one CTA per sequence: chunks of up to FUSED_APPEND_MAX_TOKENS tokens per row (decode
    steps, drafts) are one launch; a longer chunk (a prefill) takes the unfused encode and writes, whose grid
    spreads its rows, and ends in the same state."""
    from torch_aura.aura_cache import FUSED_APPEND_MAX_TOKENS

    for L in (1, FUSED_APPEND_MAX_TOKENS, FUSED_APPEND_MAX_TOKENS + 1, 3 * FUSED_APPEND_MAX_TOKENS):
        case = dict(kb=4, vb=3, layout="contig", L=L, B=2, Hkv=2, D=64, full=False, seed=L)
        fused = L <= FUSED_APPEND_MAX_TOKENS  # aura_append equals the reference writes; the unfused path, its own
        a = _reference_kernels(append_cache(**case)) if fused else append_cache(**case)
        b = append_cache(**case)
        k, v = append_tokens(a, L, case["seed"])
        b._fused_append = True
        calls = []
        monkeypatch.setattr(b, "_append_op", lambda *args: calls.append(1) or torch.ops.aura.aura_append(*args))
        for cache in (a, b):
            cache.append(k, v)
        assert calls == ([1] if fused else []), L
        _assert_same(cache_state(b), cache_state(a))
        assert a._appended == b._appended


def test_fused_append_is_off_by_default_and_on_cpu():
    cache = append_cache(kb=4, vb=4, layout="contig", L=1, B=1, Hkv=1, D=64, full=False, seed=0)
    assert cache._fused_append is False


def test_zero_tokens_and_empty_batch():
    case = dict(kb=4, vb=4, layout="paged", L=1, B=3, Hkv=2, D=64, full=False, seed=3)
    a = append_cache(**case)
    before = [t.clone() for t in cache_state(a)]
    k = torch.zeros(3, 0, 2, 64)
    ta.aura_append(*fused_args(a, k, k))
    _assert_same(cache_state(a), before)


def test_data_errors_raise_before_writing():
    def raises_untouched(a, k, v, match):
        before = [t.clone() for t in cache_state(a)]
        with pytest.raises(ValueError, match=match):
            ta.aura_append(*fused_args(a, k, v))
        _assert_same(cache_state(a), before)

    case = dict(kb=4, vb=2, layout="contig", L=2, B=3, Hkv=2, D=64, full=False, seed=1)
    a = append_cache(**case)
    k, v = append_tokens(a, 2, 1)
    a.seq_lens[1] = -1
    raises_untouched(a, k, v, "seq_lens: expected values >= 0")
    a = append_cache(**{**case, "layout": "paged"})
    a.seq_lens.zero_()
    a.block_table[2, 0] = -1  # row 2's first page is not allocated
    raises_untouched(a, k, v, r"block_table: rows \[2\] have no valid page")


def test_metadata_errors_name_the_argument():
    case = dict(kb=4, vb=2, layout="contig", L=2, B=3, Hkv=2, D=64, full=False, seed=1)
    a = append_cache(**case)
    k, v = append_tokens(a, 2, 1)
    args = list(fused_args(a, k, v))
    with pytest.raises(ValueError, match="v"):
        ta.aura_append(*[k, v[:, :1], *args[2:]])
    with pytest.raises(ValueError, match="seq_lens"):
        ta.aura_append(*[*args[:6], a.seq_lens.long(), *args[7:]])
    with pytest.raises(ValueError, match="v_codes"):
        ta.aura_append(*[*args[:4], a.k_codes, *args[5:]])
