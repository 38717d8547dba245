"""AuraCache for a generation loop: per-row lengths in ``append``, ``select_rows``, ``crop``,
``grow``, and the named errors of its input checks (CPU reference).

Every equivalence is checked against caches built from the already-selected inputs, one row at a
time where rows differ in length, so the oracle never uses the feature under test.
"""

from __future__ import annotations

import math

import pytest
import torch

import torch_aura as ta

B, HKV, D, HQ = 4, 2, 64, 4
SCHEME, SEED, LAYER = "aura4v2", 3, 1
PAGE, MAX_BLOCKS = 4, 5  # paged: 20 tokens per sequence


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed))


def _cache(batch: int, capacity: int = 20, layout: str = "contig") -> ta.AuraCache:
    if layout == "paged":
        assert capacity == PAGE * MAX_BLOCKS
        n_blocks = batch * MAX_BLOCKS + 3  # a few spare pages, tables in scrambled order
        table = torch.randperm(n_blocks, generator=_gen(batch))[: batch * MAX_BLOCKS]
        return ta.AuraCache(SCHEME, batch=batch, kv_heads=HKV, head_dim=D, num_blocks=n_blocks,
                            page_size=PAGE, block_table=table.reshape(batch, MAX_BLOCKS).to(torch.int32),
                            seed=SEED, layer=LAYER)
    return ta.AuraCache(SCHEME, batch=batch, kv_heads=HKV, head_dim=D, capacity=capacity, seed=SEED,
                        layer=LAYER)


def _assert_same(name: str, got: tuple, want: tuple, tol: float = 1e-6) -> None:
    for what, g, w in zip(("out", "lse"), got, want):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol, msg=lambda m: f"{name} {what}: {m}")


def _decode_rows(rows: list[ta.AuraCache], q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode row b of ``q`` on the batch-1 cache ``rows[b]``, stacked back into a batch."""
    outs = [c.decode(q[b:b + 1]) for b, c in enumerate(rows)]
    return torch.cat([o for o, _ in outs]), torch.cat([l for _, l in outs])


def _valid(t: torch.Tensor, n: int, left_padded: bool) -> torch.Tensor:
    """The n real tokens of one row's padded chunk ``t [L, Hkv, D]``."""
    return t[t.shape[0] - n:] if left_padded else t[:n]


def _row_caches(K, V, lengths, left_padded, capacity=20):
    """One batch-1 cache per row, holding only that row's real tokens."""
    rows = []
    for b in range(K.shape[0]):
        c = _cache(1, capacity)
        n = int(lengths[b])
        if n:
            c.append(_valid(K[b], n, left_padded)[None], _valid(V[b], n, left_padded)[None])
        rows.append(c)
    return rows


# ===================================================================== per-row lengths in append
@pytest.mark.parametrize("layout", ["contig", "paged"])
@pytest.mark.parametrize("left_padded", [False, True], ids=["right", "left"])
@pytest.mark.parametrize("len_dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_lengths_equal_rows_built_one_by_one(layout, left_padded, len_dtype):
    L = 6
    g = _gen(11)
    lengths = torch.tensor([0, L, *torch.randint(1, L, (B - 2,), generator=g).tolist()], dtype=len_dtype)
    K, V = _randn(B, L, HKV, D, seed=1), _randn(B, L, HKV, D, seed=2)
    cache = _cache(B, layout=layout)
    cache.append(K, V, lengths=lengths, left_padded=left_padded)
    rows = _row_caches(K, V, lengths, left_padded)
    assert cache.seq_lens.dtype == torch.int32 and cache.seq_lens.tolist() == lengths.tolist()
    q = _randn(B, HQ, D, seed=3)
    got = cache.decode(q)
    _assert_same("prefill", got, _decode_rows(rows, q))
    assert bool((got[1][0] == -math.inf).all()) and bool((got[0][0] == 0).all())  # the empty row

    # Decode steps (lengths=None, one token per row) after the ragged prefill.
    for step in range(3):
        k1, v1 = _randn(B, HKV, D, seed=20 + step), _randn(B, HKV, D, seed=30 + step)
        cache.append(k1, v1)
        for b, c in enumerate(rows):
            c.append(k1[b:b + 1], v1[b:b + 1])
    assert cache.seq_lens.tolist() == [n + 3 for n in lengths.tolist()]
    for q in (_randn(B, HQ, D, seed=4), _randn(B, 2, HQ, D, seed=5)):  # plain and causal 2-token
        _assert_same(f"decode q{tuple(q.shape)}", cache.decode(q), _decode_rows(rows, q))
    if layout == "contig":  # the very same bytes, and nothing written past each row's length
        for b, c in enumerate(rows):
            t = int(cache.seq_lens[b])
            assert torch.equal(cache.k_codes[b, :, :t], c.k_codes[0, :, :t])
            assert torch.equal(cache.v_norms[b, :, :t], c.v_norms[0, :, :t])
            assert bool((cache.k_norms[b, :, t:] == 0).all())


@pytest.mark.parametrize("layout", ["contig", "paged"])
def test_lengths_chunks_accumulate_and_single_token_rows(layout):
    # Two ragged chunks back to back (right- then left-padded), then a one-token step that only
    # some rows take (lengths of 0 or 1 on a [B, Hkv, D] token).
    K, V = _randn(B, 9, HKV, D, seed=6), _randn(B, 9, HKV, D, seed=7)
    n1 = torch.tensor([4, 0, 2, 4])
    n2 = torch.tensor([1, 3, 0, 3])
    n3 = torch.tensor([1, 0, 1, 0])
    cache = _cache(B, layout=layout)
    cache.append(K[:, :4], V[:, :4], lengths=n1)
    cache.append(K[:, 4:7], V[:, 4:7], lengths=n2, left_padded=True)
    cache.append(K[:, 7], V[:, 7], lengths=n3)
    rows = []
    for b in range(B):
        c = _cache(1)
        toks = [K[b, :int(n1[b])], K[b, 7 - int(n2[b]):7], K[b, 7:7 + int(n3[b])]]
        vals = [V[b, :int(n1[b])], V[b, 7 - int(n2[b]):7], V[b, 7:7 + int(n3[b])]]
        kk, vv = torch.cat(toks), torch.cat(vals)
        if kk.shape[0]:
            c.append(kk[None], vv[None])
        rows.append(c)
    assert cache.seq_lens.tolist() == (n1 + n2 + n3).tolist()
    q = _randn(B, HQ, D, seed=8)
    _assert_same("chunks", cache.decode(q), _decode_rows(rows, q))


def test_single_token_fast_path_equals_general_path():
    # A [B, Hkv, D] token (slots from row_base + seq_lens) and the same token as a [B, 1, Hkv, D]
    # chunk with all-ones lengths (the general slot computation) write identical bytes.
    # On the CPU both one-token forms skip the write op (AuraCache._append_token_cpu).
    fast, fast_4d, general = _cache(B, capacity=8), _cache(B, capacity=8), _cache(B, capacity=8)
    ones = torch.ones(B, dtype=torch.int64)
    for step in range(8):
        k, v = _randn(B, HKV, D, seed=40 + step), _randn(B, HKV, D, seed=50 + step)
        fast.append(k, v)
        fast_4d.append(k[:, None], v[:, None])
        general.append(k[:, None], v[:, None], lengths=ones)
    for name in ("k_codes", "v_codes", "k_norms", "v_norms", "seq_lens"):
        assert torch.equal(getattr(fast, name), getattr(general, name)), name
        assert torch.equal(getattr(fast_4d, name), getattr(general, name)), name


def test_lengths_are_clamped_and_capacity_is_an_upper_bound():
    cache = _cache(2, capacity=8)
    K, V = _randn(2, 6, HKV, D, seed=9), _randn(2, 6, HKV, D, seed=10)
    cache.append(K, V, lengths=torch.tensor([9, -2]))  # out of [0, L]: clamped, no host sync
    assert cache.seq_lens.tolist() == [6, 0]
    # The host-side bound counts L per call: row 1 holds 0 tokens, but 6 + 3 > 8 is refused.
    with pytest.raises(ValueError, match=r"k: expected at most 2 more tokens"):
        cache.append(K[:, :3], V[:, :3], lengths=torch.tensor([0, 3]))
    assert cache.seq_lens.tolist() == [6, 0]
    cache.append(K[:, :2], V[:, :2], lengths=torch.tensor([2, 2]))
    assert cache.seq_lens.tolist() == [8, 2]


# =========================================================================== select_rows
@pytest.mark.parametrize("index", [[2, 0, 0, 3, 1], [1], [3, 2, 1, 0]], ids=["repeat", "select", "reverse"])
def test_select_rows_equals_cache_of_selected_inputs(index):
    L = 5
    lengths = torch.tensor([5, 2, 0, 4])
    K, V = _randn(B, L, HKV, D, seed=12), _randn(B, L, HKV, D, seed=13)
    cache = _cache(B)
    cache.append(K, V, lengths=lengths)
    idx = torch.tensor(index)
    cache.select_rows(idx)
    want = _cache(len(index))
    want.append(K[idx], V[idx], lengths=lengths[idx])
    assert cache.batch == len(index) and cache.k_codes.shape[0] == len(index)
    assert cache.seq_lens.tolist() == lengths[idx].tolist()
    q = _randn(len(index), HQ, D, seed=14)
    _assert_same("selected", cache.decode(q), want.decode(q))
    # Appends after the selection use the new rows (slots from the rebuilt row bases).
    k1, v1 = _randn(len(index), HKV, D, seed=15), _randn(len(index), HKV, D, seed=16)
    cache.append(k1, v1)
    want.append(k1, v1)
    for name in ("k_codes", "v_codes", "k_norms", "v_norms", "seq_lens"):
        assert torch.equal(getattr(cache, name), getattr(want, name)), name
    q = _randn(len(index), 2, HQ, D, seed=17)
    _assert_same("selected + step", cache.decode(q), want.decode(q))


def test_select_rows_beam_reorder_each_step():
    # Beam search: every step appends one token per beam, then reorders by the chosen parents.
    beams = 3
    cache, rows = _cache(beams), []
    prompt_k, prompt_v = _randn(1, 4, HKV, D, seed=18), _randn(1, 4, HKV, D, seed=19)
    cache.append(prompt_k.expand(beams, -1, -1, -1), prompt_v.expand(beams, -1, -1, -1))
    hist_k = [prompt_k[0]] * beams  # each beam's full token history, for the oracle
    hist_v = [prompt_v[0]] * beams
    for step, parents in enumerate(([0, 0, 0], [2, 0, 1], [1, 1, 2])):
        k1, v1 = _randn(beams, HKV, D, seed=60 + step), _randn(beams, HKV, D, seed=70 + step)
        cache.append(k1, v1)
        hist_k = [torch.cat([hist_k[b], k1[b:b + 1]]) for b in range(beams)]
        hist_v = [torch.cat([hist_v[b], v1[b:b + 1]]) for b in range(beams)]
        cache.select_rows(torch.tensor(parents))
        hist_k, hist_v = [hist_k[p] for p in parents], [hist_v[p] for p in parents]
    for b in range(beams):
        c = _cache(1)
        c.append(hist_k[b][None], hist_v[b][None])
        rows.append(c)
    q = _randn(beams, HQ, D, seed=20)
    _assert_same("beams", cache.decode(q), _decode_rows(rows, q))


# ================================================================================== crop
def test_crop_then_append_equals_cache_without_the_cropped_tokens():
    K, V = _randn(B, 10, HKV, D, seed=21), _randn(B, 10, HKV, D, seed=22)
    lengths = torch.tensor([6, 3, 1, 0])
    cache = _cache(B, capacity=12)
    cache.append(K[:, :6], V[:, :6], lengths=lengths)
    cache.crop(2)  # e.g. two rejected speculative tokens; rows shorter than 2 become empty
    assert cache.seq_lens.tolist() == [4, 1, 0, 0]
    cache.append(K[:, 6:10], V[:, 6:10])  # overwrites the dropped slots
    rows = []
    for b, kept in enumerate([4, 1, 0, 0]):
        c = _cache(1, capacity=12)
        c.append(torch.cat([K[b, :kept], K[b, 6:10]])[None], torch.cat([V[b, :kept], V[b, 6:10]])[None])
        rows.append(c)
    assert cache.seq_lens.tolist() == [8, 5, 4, 4]
    q = _randn(B, HQ, D, seed=23)
    _assert_same("crop", cache.decode(q), _decode_rows(rows, q))
    cache.crop(0)
    assert cache.seq_lens.tolist() == [8, 5, 4, 4]


def test_crop_returns_capacity_to_the_host_bound():
    cache = _cache(1, capacity=8)
    cache.append(_randn(1, 8, HKV, D, seed=24), _randn(1, 8, HKV, D, seed=25))
    cache.crop(3)
    cache.append(_randn(1, 3, HKV, D, seed=26), _randn(1, 3, HKV, D, seed=27))
    with pytest.raises(ValueError, match=r"k: expected at most 0 more tokens"):
        cache.append(_randn(1, HKV, D, seed=28), _randn(1, HKV, D, seed=29))
    cache.crop(100)  # more than held: every row empties, the bound goes to 0
    assert cache.seq_lens.tolist() == [0]
    cache.append(_randn(1, 8, HKV, D, seed=30), _randn(1, 8, HKV, D, seed=31))


# ================================================================================== grow
def test_grow_keeps_decode_and_allows_more_appends():
    K, V = _randn(B, 13, HKV, D, seed=32), _randn(B, 13, HKV, D, seed=33)
    lengths = torch.tensor([8, 5, 0, 8])
    cache = _cache(B, capacity=8)
    cache.append(K[:, :8], V[:, :8], lengths=lengths)
    q = _randn(B, HQ, D, seed=34)
    before = cache.decode(q)
    k_codes = cache.k_codes.clone()
    cache.grow(20)
    assert cache.capacity == 20 and cache.k_codes.shape[2] == 20 and cache.v_norms.shape[2] == 20
    assert torch.equal(cache.k_codes[:, :, :8], k_codes) and bool((cache.k_norms[:, :, 8:] == 0).all())
    _assert_same("grown", cache.decode(q), before, tol=0.0)
    cache.append(K[:, 8:13], V[:, 8:13])  # past the old capacity
    want = _cache(B, capacity=20)
    want.append(K[:, :8], V[:, :8], lengths=lengths)
    want.append(K[:, 8:13], V[:, 8:13])
    for name in ("k_codes", "v_codes", "k_norms", "v_norms", "seq_lens"):
        assert torch.equal(getattr(cache, name), getattr(want, name)), name
    _assert_same("grown + appended", cache.decode(q), want.decode(q))
    held = cache.k_codes
    cache.grow(20)
    cache.grow(4)  # not larger: a no-op
    assert cache.k_codes is held and cache.capacity == 20


def test_paged_cache_refuses_row_management():
    cache = _cache(B, layout="paged")
    for call in (lambda: cache.select_rows(torch.tensor([0, 1])), lambda: cache.crop(1),
                 lambda: cache.grow(40)):
        with pytest.raises(ValueError, match="only the contiguous layout"):
            call()


# ============================================================================= bad input
def test_bad_lengths_raise_named_errors():
    cache = _cache(B, capacity=8)
    k, v = _randn(B, 3, HKV, D, seed=35), _randn(B, 3, HKV, D, seed=36)
    for bad in (torch.ones(B + 1, dtype=torch.int64),        # wrong batch
                torch.ones(B, 1, dtype=torch.int64),         # wrong rank
                torch.ones(B, dtype=torch.float32),          # wrong dtype
                torch.ones(B, dtype=torch.bool),
                [1] * B):                                    # not a tensor
        with pytest.raises(ValueError, match=r"^lengths: expected"):
            cache.append(k, v, lengths=bad)
    with pytest.raises(ValueError, match=r"^lengths: expected a tensor on the cache's device"):
        cache.append(k, v, lengths=torch.ones(B, dtype=torch.int64, device="meta"))
    assert cache.seq_lens.tolist() == [0] * B and cache._appended == 0  # nothing happened


def test_bad_k_v_raise_named_errors():
    cache = _cache(B, capacity=8)
    good = _randn(B, 2, HKV, D, seed=37)
    cases = [
        ("k", _randn(B, 2, HKV + 1, D, seed=0), good),                   # wrong heads
        ("k", _randn(B, HKV + 1, D, seed=0), _randn(B, HKV + 1, D, seed=0)),
        ("k", _randn(B + 1, 2, HKV, D, seed=0), good),                   # wrong batch
        ("k", _randn(B, 2, HKV, 128, seed=0), good),                     # wrong head dim
        ("k", good.to(torch.int32), good),                               # wrong dtype
        ("k", good[0], good),                                            # wrong rank
        ("k", good.to("meta"), good),                                    # wrong device
        ("k", _randn(B, 2, HKV, 2 * D, seed=0)[..., ::2], good),         # strided last dim
        ("v", good, _randn(B, 2, HKV + 1, D, seed=0)),                   # v's heads
        ("v", good, _randn(B, 3, HKV, D, seed=0)),                       # v's length differs
    ]
    for name, k, v in cases:
        with pytest.raises(ValueError, match=rf"^{name}: expected"):
            cache.append(k, v)
    assert cache.seq_lens.tolist() == [0] * B


def test_bad_q_raises_named_errors():
    cache = _cache(B, capacity=8)
    cache.append(_randn(B, 2, HKV, D, seed=38), _randn(B, 2, HKV, D, seed=39))
    for q in (_randn(B, HKV + 1, D, seed=0),       # Hq not a multiple of Hkv
              _randn(B, 2, 3, D, seed=0),
              _randn(B + 1, HQ, D, seed=0),        # wrong batch
              _randn(B, HQ, 128, seed=0),          # wrong head dim
              _randn(B, HQ, D, seed=0).to(torch.int32),
              _randn(B, 0, D, seed=0),             # no query heads
              _randn(HQ, D, seed=0),               # wrong rank
              _randn(B, HQ, D, seed=0).to("meta"),
              _randn(B, HQ, 2 * D, seed=0)[..., ::2],
              "q"):
        with pytest.raises(ValueError, match=r"^q: expected"):
            cache.decode(q)
    out, _ = cache.decode(_randn(B, HQ, D, seed=0).to(torch.bfloat16))
    assert out.dtype == torch.bfloat16


def test_bad_row_management_arguments_raise_named_errors():
    cache = _cache(B, capacity=8)
    for index in (torch.tensor([0.0, 1.0]), torch.zeros(2, 2, dtype=torch.int64),
                  torch.zeros(0, dtype=torch.int64), [0, 1], torch.zeros(2, dtype=torch.int64, device="meta")):
        with pytest.raises(ValueError, match=r"^index: expected"):
            cache.select_rows(index)
    for n in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match=r"^n: expected"):
            cache.crop(n)
    for cap in (0, -3, 10.0, None):
        with pytest.raises(ValueError, match=r"^capacity: expected"):
            cache.grow(cap)
    assert cache.batch == B and cache.capacity == 8


@pytest.mark.parametrize("path", ["one_token", "chunk", "lengths"])
def test_row_past_capacity_never_writes_into_the_next_row(path):
    # seq_lens pushed to the capacity behind the cache's back (the host bound cannot see it):
    # row 0's next slot would be row 1's first one; it must be refused, not written there.
    cache = _cache(2, capacity=4)
    cache.seq_lens.copy_(torch.tensor([4, 0], dtype=torch.int32))
    before = (cache.k_norms.clone(), cache.v_norms.clone())
    k, v = _randn(2, 2, HKV, D, seed=41), _randn(2, 2, HKV, D, seed=42)
    kw = {"lengths": torch.tensor([1, 1])} if path == "lengths" else {}
    if path == "one_token":
        k, v = k[:, 0], v[:, 0]
    # the CPU's one-token path checks seq_lens itself; the others let the write refuse the slot
    with pytest.raises(ValueError, match="seq_lens: expected every row below the capacity 4" if path == "one_token"
                       else "slot_mapping"):
        cache.append(k, v, **kw)
    assert torch.equal(cache.k_norms, before[0]) and torch.equal(cache.v_norms, before[1])
