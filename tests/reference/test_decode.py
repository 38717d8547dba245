"""Dense decode family (decode.md): the split-K reference against independent oracles.

Oracles: fp64 ``scaled_dot_product_attention`` per sequence (sliced to its length, KV heads
expanded for GQA, paged caches rebuilt page by page), ``torch.logsumexp`` for lse, a direct fp64
log-sum-exp combination for the merge, and the documented planning rules re-derived here.
Every cache is built with NaN in its padding (tokens past ``seq_lens``, unused pages, unused
block-table entries out of range), so any read of memory the op must not touch fails.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

import torch_aura
from torch_aura.reference import decode as ref
from torch_aura.testing import dense_kv
from torch_aura.testing import exact_decode_attention as oracle

from _util import FP32_MAX_REL, RATIO, assert_close, assert_max_rel, dtype_id

HEAD_DIMS = (64, 80, 96, 128, 192, 256, 512)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INF = math.inf


# --------------------------------------------------------------------------------------- inputs


def _lens(values):
    return torch.tensor(values, dtype=torch.int32)


def make_contiguous(lens, Hq, Hkv, D, dtype, T_cap=None, seed=0, stored_bthd=False):
    """q [B,Hq,D] and caches [B,Hkv,T_cap,D] with NaN past each sequence's length.

    ``stored_bthd``: the caches are stored [B,T,Hkv,D] and returned as transposed views.
    """
    g = torch.Generator().manual_seed(seed)
    B = len(lens)
    T_cap = max(max(lens), 1) if T_cap is None else T_cap
    q = torch.randn(B, Hq, D, generator=g).to(dtype)
    shape = (B, T_cap, Hkv, D) if stored_bthd else (B, Hkv, T_cap, D)
    k = torch.randn(shape, generator=g).to(dtype)
    v = torch.randn(shape, generator=g).to(dtype)
    if stored_bthd:
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    for b, T in enumerate(lens):
        k[b, :, T:] = math.nan
        v[b, :, T:] = math.nan
    return q, k, v, _lens(lens)


def make_paged(lens, Hq, Hkv, D, dtype, page, seed=0, spare_pages=3):
    """q, paged caches [num_blocks, page, Hkv, D] and a permuted, non-contiguous block table.

    Every slot not holding a live token is NaN (unused pages, the tail of each last page);
    block-table entries past a sequence's last used page are out of range on purpose.
    """
    g = torch.Generator().manual_seed(seed)
    B = len(lens)
    pages_of = [-(-T // page) for T in lens]
    max_blocks = max(max(pages_of), 1) + 1  # one extra column: never read
    num_blocks = sum(pages_of) + spare_pages
    q = torch.randn(B, Hq, D, generator=g).to(dtype)
    k = torch.full((num_blocks, page, Hkv, D), math.nan, dtype=dtype)
    v = torch.full((num_blocks, page, Hkv, D), math.nan, dtype=dtype)
    perm = torch.randperm(num_blocks, generator=g)
    wide = torch.full((B, max_blocks + 3), num_blocks + 7, dtype=torch.int32)  # garbage indices
    table = wide[:, 2 : 2 + max_blocks]  # non-contiguous rows, unit last stride
    used = 0
    for b, T in enumerate(lens):
        for j in range(pages_of[b]):
            p = int(perm[used])
            used += 1
            table[b, j] = p
            n = min(page, T - j * page)
            k[p, :n] = torch.randn(n, Hkv, D, generator=g).to(dtype)
            v[p, :n] = torch.randn(n, Hkv, D, generator=g).to(dtype)
    assert not table.is_contiguous()
    return q, k, v, _lens(lens), table


def check_vs_oracle(name, out, lse, q, k, v, lens, table=None, scale=None):
    ref_out, ref_lse = oracle(q, k, v, lens, table, scale)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert out.shape == q.shape and lse.shape == q.shape[:2]
    assert out.is_contiguous() and lse.is_contiguous()
    if q.dtype == torch.float32:
        assert_max_rel(f"{name} out", out, ref_out, FP32_MAX_REL)
    else:
        assert_close(f"{name} out", out, ref_out, RATIO[q.dtype])
    assert_max_rel(f"{name} lse", lse, ref_lse, FP32_MAX_REL)
    empty = lens == 0
    assert torch.all(out[empty] == 0) and torch.all(lse[empty] == -INF)


# ------------------------------------------------------------------ flash_decode vs the oracle


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("D", HEAD_DIMS, ids=lambda d: f"D{d}")
def test_contiguous_matches_sdpa(D, dtype):
    T_cap = 300 if D <= 128 else 45
    lens = [T_cap, 37, 1] if D <= 128 else [T_cap, 17, 1]
    q, k, v, sl = make_contiguous(lens, 6, 2, D, dtype, T_cap=T_cap, seed=D)
    out, lse = torch_aura.flash_decode(q, k, v, sl)
    check_vs_oracle(f"B3-Hq6-Hkv2-D{D}-{dtype_id(dtype)}", out, lse, q, k, v, sl)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("page", (1, 16, 7), ids=lambda p: f"page{p}")
def test_paged_matches_sdpa(page, dtype):
    lens = [301, 0, 16, 45]
    q, k, v, sl, table = make_paged(lens, 8, 2, 128, dtype, page, seed=page)
    out, lse = torch_aura.flash_decode(q, k, v, sl, table)
    check_vs_oracle(f"B4-Hq8-Hkv2-D128-page{page}-{dtype_id(dtype)}", out, lse, q, k, v, sl, table)


@pytest.mark.parametrize("layout", ("contig", "page16"))
@pytest.mark.parametrize("G", (1, 2, 3, 4, 5, 6, 7, 8, 16), ids=lambda g: f"G{g}")
def test_every_gqa_ratio(G, layout):
    Hkv = 1 if G == 16 else 2
    lens = [53, 20]
    if layout == "contig":
        q, k, v, sl = make_contiguous(lens, G * Hkv, Hkv, 64, torch.float32, seed=G)
        table = None
    else:
        q, k, v, sl, table = make_paged(lens, G * Hkv, Hkv, 64, torch.float32, 16, seed=G)
    out, lse = torch_aura.flash_decode(q, k, v, sl, table)
    check_vs_oracle(f"G{G}-{layout}", out, lse, q, k, v, sl, table)


def test_gqa_head_mapping_is_h_over_group():
    """Query head h reads KV head h // G: make KV heads distinguishable and check which is read."""
    G, Hkv, T, D = 3, 4, 5, 64
    q = torch.zeros(1, G * Hkv, D)  # uniform attention: out = mean of V over tokens
    k = torch.randn(1, Hkv, T, D)
    v = torch.arange(Hkv, dtype=torch.float32).view(1, Hkv, 1, 1).expand(1, Hkv, T, D).contiguous()
    out, _ = torch_aura.flash_decode(q, k, v, _lens([T]))
    expected = torch.arange(G * Hkv) // G
    assert torch.allclose(out[0, :, 0], expected.float(), atol=1e-6)


@pytest.mark.parametrize("num_splits", (0, 4), ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("layout", ("contig", "page16", "page7"))
def test_seq_len_edges(layout, num_splits):
    """seq_len 0, 1, page-1, page, page+1, chunk-1, chunk, chunk+1, 2 chunks +-1 in one batch."""
    P = 16 if layout == "contig" else int(layout[4:])
    lens = [0, 1, P - 1, P, P + 1, 255, 256, 257, 511, 512, 513]
    if layout == "contig":
        q, k, v, sl = make_contiguous(lens, 2, 1, 64, torch.float32, T_cap=520)
        table = None
    else:
        q, k, v, sl, table = make_paged(lens, 2, 1, 64, torch.float32, P)
    out, lse = torch_aura.flash_decode(q, k, v, sl, table, None, num_splits)
    check_vs_oracle(f"edges-{layout}", out, lse, q, k, v, sl, table)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.all(lse[0] == -INF)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_seq_len_zero_gives_zero_and_minus_inf(dtype):
    q, k, v, sl = make_contiguous([0, 0], 4, 2, 96, dtype, T_cap=3)
    out, lse = torch_aura.flash_decode(q, k, v, sl)
    assert torch.equal(out, torch.zeros_like(out)) and out.dtype == dtype
    assert torch.all(lse == -INF)


def test_permuted_strides_match_contiguous_copy():
    lens = [90, 33, 7]
    q, k, v, sl = make_contiguous(lens, 6, 3, 80, torch.float32, stored_bthd=True, seed=3)
    assert k.stride(-1) == 1 and not k.is_contiguous()
    q_wide = torch.randn(3, 6, 2 * 80)
    q_wide[..., :80] = q
    q_view = q_wide[..., :80]  # a sliced query: unit last stride, row stride 160
    out, lse = torch_aura.flash_decode(q_view, k, v, sl, None, 0.07)
    out_c, lse_c = torch_aura.flash_decode(q.contiguous(), k.contiguous(), v.contiguous(), sl, None, 0.07)
    torch.testing.assert_close(out, out_c, rtol=0, atol=1e-6)
    torch.testing.assert_close(lse, lse_c, rtol=0, atol=1e-6)
    check_vs_oracle("permuted", out, lse, q, k, v, sl, None, 0.07)


def test_vllm_style_kv_views_of_one_tensor():
    """A vLLM cache (2, num_blocks, page, Hkv, D) used as kv[0], kv[1]: strides pass through."""
    lens = [40, 9]
    q, k, v, sl, table = make_paged(lens, 4, 2, 64, torch.float32, 8, seed=5)
    kv = torch.stack([k, v])
    out, lse = torch_aura.flash_decode(q, kv[0], kv[1], sl, table)
    check_vs_oracle("kv-views", out, lse, q, k, v, sl, table)


@pytest.mark.parametrize("layout", ("contig", "page16"))
def test_forced_split_counts_agree(layout):
    """num_splits 1, 3, more splits than tokens (1000) and auto agree with each other and SDPA."""
    lens = [700, 300, 1000, 0]
    if layout == "contig":
        q, k, v, sl = make_contiguous(lens, 4, 2, 64, torch.float32, seed=11)
        table = None
    else:
        q, k, v, sl, table = make_paged(lens, 4, 2, 64, torch.float32, 16, seed=11)
    results = {s: torch_aura.flash_decode(q, k, v, sl, table, None, s) for s in (1, 3, 1000, 0)}
    base_out, base_lse = results[1]
    for s, (out, lse) in results.items():
        check_vs_oracle(f"splits{s}", out, lse, q, k, v, sl, table)
        assert_max_rel(f"splits{s} vs 1", out, base_out, 2e-6)
        assert_max_rel(f"splits{s} lse vs 1", lse, base_lse, 2e-6)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=dtype_id)
def test_half_output_is_rounded_once_after_the_merge(dtype):
    """Partials stay fp32 through the merge: the output is the exact result rounded once, so it
    matches the fp64 oracle rounded to q's dtype almost everywhere (ties aside); rounding the
    partials too would miss on a large fraction of elements."""
    lens = [900, 700]
    q, k, v, sl = make_contiguous(lens, 4, 2, 128, dtype, seed=13)
    out, _ = torch_aura.flash_decode(q, k, v, sl, None, None, 3)
    ref_out, _ = oracle(q, k, v, sl)
    same = (out == ref_out.to(dtype)).double().mean().item()
    assert same >= 0.99, f"only {same:.1%} of outputs equal the once-rounded exact result"


def test_scale_default_and_explicit():
    q, k, v, sl = make_contiguous([20], 2, 1, 128, torch.float32)
    a, la = torch_aura.flash_decode(q, k, v, sl)
    b, lb = torch_aura.flash_decode(q, k, v, sl, None, 128 ** -0.5)
    assert torch.equal(a, b) and torch.equal(la, lb)
    c, lc = torch_aura.flash_decode(q, k, v, sl, None, 0.3)
    check_vs_oracle("scale0.3", c, lc, q, k, v, sl, None, 0.3)
    assert not torch.allclose(a, c)


def test_nan_stays_in_its_row():
    q, k, v, sl = make_contiguous([30, 30], 4, 2, 64, torch.float32)
    q[0, 1, 5] = math.nan
    out, lse = torch_aura.flash_decode(q, k, v, sl)
    assert torch.isnan(out[0, 1]).all() and torch.isnan(lse[0, 1])
    mask = torch.ones(2, 4, dtype=torch.bool)
    mask[0, 1] = False
    assert torch.isfinite(out[mask]).all() and torch.isfinite(lse[mask]).all()


def test_empty_batch():
    q, k, v = torch.randn(0, 4, 64), torch.randn(0, 2, 5, 64), torch.randn(0, 2, 5, 64)
    out, lse = torch_aura.flash_decode(q, k, v, _lens([]))
    assert out.shape == (0, 4, 64) and lse.shape == (0, 4)


# --------------------------------------------------------------- split structure (stage diffs)


def _doc_chunk(T, S, tile):
    """decode.md §4 with §6's whole pages, written out again:
    chunk_b = round_up(max(64, ceil(T/S)), tile)."""
    per_split = max(64, math.ceil(T / S))
    return math.ceil(per_split / tile) * tile


@pytest.mark.parametrize("layout", ("contig", "page7"))
@pytest.mark.parametrize("S", (0, 3), ids=lambda s: f"splits{s}")
def test_split_partials_follow_the_documented_rule(layout, S):
    lens = [0, 200, 600, 1001]
    if layout == "contig":
        q, k, v, sl = make_contiguous(lens, 4, 2, 64, torch.float32, seed=2)
        table, tile = None, ref.CONTIGUOUS_TILE
    else:
        q, k, v, sl, table = make_paged(lens, 4, 2, 64, torch.float32, 7, seed=2)
        tile = 7
    po, pl = ref.split_partials(q, k, v, sl, table, None, S)
    capacity = k.shape[2] if table is None else table.shape[1] * tile
    S_host = S if S > 0 else ref.plan_num_splits(4, 2, q.device, head_dim=64, paged=table is not None,
                                                  capacity=capacity, tile=tile)
    assert po.shape == (S_host, 4, 4, 64) and pl.shape == (S_host, 4, 4)
    assert po.dtype == pl.dtype == torch.float32
    scale = 64 ** -0.5
    for b, T in enumerate(lens):
        chunk = _doc_chunk(T, S_host, tile)
        S_b = math.ceil(T / chunk)
        assert torch.all(pl[S_b:, b] == -INF), f"splits >= S_b={S_b} of sequence {b} must be -inf"
        for s in range(S_b):
            lo, hi = s * chunk, min((s + 1) * chunk, T)
            assert hi > lo, "a live split is never empty"
            assert lo % tile == 0, "a split starts on a page boundary (decode.md §6)"
            K = dense_kv(k, b, T, table)[:, lo:hi].double().repeat_interleave(2, dim=0)
            V = dense_kv(v, b, T, table)[:, lo:hi].double().repeat_interleave(2, dim=0)
            qb = q[b].double()[:, None]
            ref_o = F.scaled_dot_product_attention(qb, K, V, scale=scale)[:, 0]
            ref_l = torch.logsumexp((qb @ K.transpose(1, 2))[:, 0] * scale, -1)
            assert_max_rel(f"partial s{s} b{b}", po[s, b], ref_o)
            assert_max_rel(f"lse s{s} b{b}", pl[s, b], ref_l)


def test_auto_split_count_never_reads_seq_lens():
    """The host plan depends on (B, Hkv, device) only: same S for any lengths, and the planning
    functions take no seq_lens at all."""
    shapes = []
    for lens in ([0, 0, 0], [5, 700, 3], [1000, 1000, 1000]):
        q, k, v, sl = make_contiguous(lens, 4, 2, 64, torch.float32, T_cap=1000)
        po, pl = ref.split_partials(q, k, v, sl)
        shapes.append(po.shape[0])
    assert shapes[0] == shapes[1] == shapes[2] == torch_aura.decode_num_splits(3, 2, 132, 1, capacity=1000)
    for fn in (ref.plan_num_splits, ref.auto_splits, torch_aura.decode_num_splits):
        assert "seq_lens" not in inspect.signature(fn).parameters


def test_decode_num_splits_is_one_when_work_fills_the_gpu():
    assert torch_aura.decode_num_splits(64, 8, 132, 1) == 1
    assert torch_aura.decode_num_splits(132, 1, 132, 1) == 1
    assert torch_aura.decode_num_splits(131, 1, 132, 1) == 1  # 99% of the SMs
    assert torch_aura.decode_num_splits(100, 1, 132, 1) == 2  # 76%: a second CTA on some SMs instead
    assert torch_aura.decode_num_splits(0, 8, 132, 1) == 1  # nothing to do: one (empty) split
    for work in range(132 * 2, 3 * 132 * 2, 7):
        assert torch_aura.decode_num_splits(work, 1, 132, 2) == 1


@pytest.mark.parametrize("sms,ctas", ((132, 1), (132, 2), (78, 3), (16, 1)), ids=lambda x: str(x))
def test_decode_num_splits_fills_one_wave(sms, ctas):
    """One wave of sms * ctas CTAs: at most one split past it, and a fifth of the slots idle at most
    unless the cap binds."""
    slots = sms * ctas
    for batch in (1, 2, 3, 5, 8, 13):
        for kv in (1, 2, 4, 8):
            for cap in (128, 32, 1):
                work = batch * kv
                got = torch_aura.decode_num_splits(batch, kv, sms, ctas, cap)
                assert 1 <= got <= cap
                if work >= slots:
                    assert got == 1
                    continue
                assert work * (got - 1) < slots, "never a whole split past the wave"
                assert got == cap or work * got >= 0.8 * slots, "the wave leaves a fifth idle"
                if work * got > slots:  # one split past the wave only when the wave itself was thin
                    assert work * (got - 1) < 0.8 * slots


def test_decode_num_splits_known_values():
    assert torch_aura.decode_num_splits(1, 8, 132, 1) == 16  # 128 of 132 SMs
    assert torch_aura.decode_num_splits(8, 8, 132, 1) == 2
    assert torch_aura.decode_num_splits(1, 2, 132, 1) == 66  # a TP4 shard of a 32/8-head model
    assert torch_aura.decode_num_splits(1, 1, 132, 1) == 128  # the cap
    assert torch_aura.decode_num_splits(1, 1, 132, 1, cap=32) == 32
    assert torch_aura.decode_num_splits(50, 1, 132, 1) == 3  # 2 x 50 = 100 CTAs would idle 32 SMs
    assert torch_aura.decode_num_splits(1, 2, 132, 2) == 128  # two one-warp CTAs per SM (D = 512)


def test_decode_num_splits_capacity_bounds_the_splits():
    """A split that no sequence of the cache's capacity can reach is never planned."""
    assert torch_aura.decode_num_splits(1, 2, 132, 1, capacity=64) == 1
    assert torch_aura.decode_num_splits(1, 2, 132, 1, capacity=65) == 2
    assert torch_aura.decode_num_splits(1, 2, 132, 1, capacity=1 << 20) == 66
    assert torch_aura.decode_num_splits(1, 2, 132, 1, capacity=1000) == 16  # 16 splits of 64 tokens (TP4, 1k)
    assert ref.plan_num_splits(1, 2, torch.device("cpu"), 5, capacity=64) == 5  # forced counts pass through
    # two CTAs per SM where the CTA feeds from cp.async (paged caches the tile copies cannot serve:
    # pages not a multiple of 16 tokens, head dims not a multiple of 64; at D = 512 one-warp CTAs)
    cpu = torch.device("cpu")
    assert ref.plan_num_splits(1, 8, cpu, head_dim=128) == 16
    assert ref.plan_num_splits(1, 8, cpu, head_dim=512) == 16  # the dim-split CTA: four warps
    assert ref.plan_num_splits(1, 8, cpu, head_dim=512, paged=True, tile=16) == 16
    assert ref.plan_num_splits(1, 8, cpu, head_dim=512, paged=True, tile=8) == 33  # one-warp CTAs
    assert ref.plan_num_splits(1, 8, cpu, head_dim=128, paged=True, tile=16) == 16  # tile copies
    assert ref.plan_num_splits(1, 8, cpu, head_dim=128, paged=True, tile=8) == 33
    assert ref.plan_num_splits(1, 8, cpu, head_dim=96, paged=True, tile=16) == 33


def test_decode_num_splits_keeps_one_merge_round_trip_for_short_splits():
    """Past 32 splits (one round trip of a merge CTA), no split shorter than 128 tokens: a 32/8 model's
    TP4 shard (2 KV heads) and TP8 shard (1) at a 4k cache take 32 splits of 128 tokens, not 64 of 64;
    a TP8 shard at 32k keeps 128 splits of 256 tokens."""
    assert torch_aura.decode_num_splits(1, 2, 132, 1, capacity=4096) == 32
    assert torch_aura.decode_num_splits(1, 1, 132, 1, capacity=4096) == 32
    assert torch_aura.decode_num_splits(1, 1, 132, 1, capacity=8192) == 64  # 128 -> 64: 128-token splits
    assert torch_aura.decode_num_splits(1, 1, 132, 1, capacity=32768) == 128
    assert ref.plan_num_splits(1, 2, torch.device("cpu"), head_dim=128, capacity=4096, tile=7) == 31  # 133-token splits


def test_decode_num_splits_floor_is_64_kb_of_k_and_v():
    """The D = 512 dim-split CTA keeps splits of 32 tokens past 32 splits (64 KB of K and V, as 128
    tokens at D = 128): a TP-like 2-KV-head shard at a 4k cache takes 64 splits of 64 tokens, not 32
    of 128; the one-warp CTA of page 8 keeps 128 tokens (and fills two CTAs per SM)."""
    cpu = torch.device("cpu")
    assert torch_aura.decode_num_splits(1, 2, 132, 1, capacity=4096, split_floor=32) == 64
    assert ref.plan_num_splits(1, 2, cpu, head_dim=512, capacity=4096) == 64
    assert ref.plan_num_splits(1, 2, cpu, head_dim=512, paged=True, capacity=4096, tile=16) == 64
    assert ref.plan_num_splits(1, 2, cpu, head_dim=512, paged=True, capacity=4096, tile=8) == 32
    assert ref.plan_num_splits(1, 2, cpu, head_dim=256, capacity=4096) == 32  # 128 tokens until measured
    assert ref.plan_num_splits(1, 2, cpu, head_dim=512, capacity=32768) == 64  # 512-token splits
    assert ref.plan_split_floor(512) == 32 and ref.plan_split_floor(512, True, 7) == 128


def test_decode_num_splits_doubles_medium_reads_of_few_units():
    """At most a sixteenth of the slots busy (batch 1, 8 KV heads on 132 SMs) and splits of 128-256
    tokens at 32: 32 splits, two CTAs on most SMs; shorter and longer caches keep one wave."""
    for capacity, want in ((1024, 16), (4096, 32), (8192, 32), (9000, 16), (32768, 16), (131072, 16)):
        assert torch_aura.decode_num_splits(1, 8, 132, 1, capacity=capacity) == want, capacity
    assert torch_aura.decode_num_splits(2, 8, 132, 1, capacity=8192) == 8  # 16 units: a wave of 8
    assert torch_aura.decode_num_splits(1, 8, 132, 1, cap=20, capacity=8192) == 16  # never past the cap


@pytest.mark.parametrize("sms", (132, 78, 16))
def test_decode_num_splits_leaves_no_split_of_a_full_cache_empty(sms):
    """Every planned split of a full-capacity sequence is live (a 32k cache over 2 KV heads: 64 splits
    of 512 tokens, not 66 whose last two are empty), and the plan stays within [1, cap]."""
    assert torch_aura.decode_num_splits(1, 2, 132, 1, capacity=32768) == 64
    for batch in (1, 2, 3, 8):
        for kv in (1, 2, 4, 8):
            for capacity in (1, 63, 64, 65, 1000, 4096, 5000, 8192, 32768, 100_000):
                for tile, cap, floor in ((64, 128, 128), (16, 128, 128), (7, 128, 128), (64, 20, 128),
                                         (64, 128, 32), (16, 128, 32)):
                    S = ref.auto_splits(batch, kv, sms, 1, cap, capacity=capacity, tile=tile, split_floor=floor)
                    assert 1 <= S <= cap
                    assert ref.split_chunk(capacity, S, tile)[1] == S, (batch, kv, capacity, tile, S)


@pytest.mark.parametrize("arg", ("batch", "kv_heads", "sms", "ctas_per_sm", "cap", "capacity", "split_floor"))
def test_decode_num_splits_refuses_data_and_bad_values(arg):
    good = dict(batch=2, kv_heads=2, sms=132, ctas_per_sm=2, cap=128, capacity=4096)
    with pytest.raises(ValueError, match=f"^{arg}: expected a Python int"):
        torch_aura.decode_num_splits(**{**good, arg: torch.tensor(2)})
    with pytest.raises(ValueError, match=f"^{arg}: expected a Python int"):
        torch_aura.decode_num_splits(**{**good, arg: 2.0})
    with pytest.raises(ValueError, match=f"^{arg}: expected >= "):
        torch_aura.decode_num_splits(**{**good, arg: -1})


# --------------------------------------------------------------------------- flash_decode_out


@pytest.mark.parametrize("layout", ("contig", "page5"))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=dtype_id)
def test_out_variant_writes_identically(layout, dtype):
    lens = [300, 0, 41]
    if layout == "contig":
        q, k, v, sl = make_contiguous(lens, 6, 3, 64, dtype, seed=4)
        table = None
    else:
        q, k, v, sl, table = make_paged(lens, 6, 3, 64, dtype, 5, seed=4)
    exp_out, exp_lse = torch_aura.flash_decode(q, k, v, sl, table, 0.2, 2)
    out_buf = torch.full((3, 6, 100), 7.0, dtype=dtype)
    lse_buf = torch.full((6, 3), 7.0)
    out, lse = out_buf[:, :, 10:74], lse_buf.t()  # strided views of caller buffers
    ret = torch_aura.flash_decode_out(q, k, v, sl, table, 0.2, 2, out, lse)
    assert ret is None
    assert torch.equal(out, exp_out) and torch.equal(lse, exp_lse)
    assert torch.all(out_buf[:, :, :10] == 7) and torch.all(out_buf[:, :, 74:] == 7)
    # the op itself, without the wrapper
    out2, lse2 = torch.zeros_like(exp_out), torch.zeros_like(exp_lse)
    torch.ops.aura.flash_decode_out(q, k, v, sl, table, 0.2, 2, out2, lse2)
    assert torch.equal(out2, exp_out) and torch.equal(lse2, exp_lse)


def test_flash_decode_does_not_mutate_inputs():
    q, k, v, sl, table = make_paged([20, 3], 4, 2, 64, torch.float32, 4)
    before = [t.clone() for t in (q, k, v, sl, table)]
    torch_aura.flash_decode(q, k, v, sl, table)
    for a, b in zip(before, (q, k, v, sl, table)):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())


# -------------------------------------------------------------------------- merge_attn_states


def merge_oracle(po, pl):
    """fp64 direct combination: lse = logsumexp_s(lse_s); out = sum_s softmax_s(lse) * O_s."""
    po, pl = po.double(), pl.double()
    lse = torch.logsumexp(pl, dim=0)
    w = torch.softmax(pl, dim=0).nan_to_num(0.0)  # all -inf rows -> NaN weights -> 0
    w = torch.where(pl == -INF, torch.zeros_like(w), w)
    out = (w[..., None] * po.nan_to_num(0.0)).sum(0)
    return out, lse


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_merge_matches_direct_logsumexp(dtype):
    g = torch.Generator().manual_seed(7)
    S, B, Hq, D = 5, 3, 7, 128
    po = torch.randn(S, B, Hq, D, generator=g).to(dtype)
    pl = torch.randn(S, B, Hq, generator=g) * 4
    pl[1, 0] = -INF
    out, lse = torch_aura.merge_attn_states(po, pl)
    ref_out, ref_lse = merge_oracle(po, pl)
    assert out.dtype == dtype and lse.dtype == torch.float32
    if dtype == torch.float32:
        assert_max_rel("merge out", out, ref_out)
    else:
        assert_close("merge out", out, ref_out, RATIO[dtype])
    assert_max_rel("merge lse", lse, ref_lse)


def test_merge_skips_nan_partials_in_empty_splits():
    g = torch.Generator().manual_seed(8)
    po = torch.randn(4, 2, 3, 64, generator=g)
    pl = torch.randn(4, 2, 3, generator=g)
    pl[[0, 2]] = -INF
    po[[0, 2]] = math.nan  # stale / poisoned workspace of empty splits
    out, lse = torch_aura.merge_attn_states(po, pl)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    ref_out, ref_lse = merge_oracle(po[[1, 3]], pl[[1, 3]])
    assert_max_rel("merge out", out, ref_out)
    assert_max_rel("merge lse", lse, ref_lse)


def test_merge_all_empty_gives_zero_and_minus_inf():
    po = torch.full((3, 2, 2, 80), math.nan)
    pl = torch.full((3, 2, 2), -INF)
    pl[1, 1, 1], po[1, 1, 1] = 0.5, 1.0  # one live (b, head) among empty ones
    out, lse = torch_aura.merge_attn_states(po, pl)
    live = torch.zeros(2, 2, dtype=torch.bool)
    live[1, 1] = True
    assert torch.equal(out[~live], torch.zeros_like(out[~live]))
    assert torch.all(lse[~live] == -INF)
    assert torch.equal(out[1, 1], torch.ones(80)) and lse[1, 1].item() == 0.5


def test_merge_single_split_is_identity():
    g = torch.Generator().manual_seed(9)
    po = torch.randn(1, 3, 5, 96, generator=g)
    pl = torch.randn(1, 3, 5, generator=g)
    out, lse = torch_aura.merge_attn_states(po, pl)
    assert torch.equal(out, po[0]) and torch.equal(lse, pl[0])
    assert out.data_ptr() != po.data_ptr() and lse.data_ptr() != pl.data_ptr()


def test_merge_of_disjoint_key_halves_equals_whole():
    """Cascade use: decode two key ranges separately, merge, get the whole-sequence result."""
    lens, cut = [200, 90], 64
    q, k, v, sl = make_contiguous(lens, 4, 2, 64, torch.float32, seed=12)
    whole, whole_lse = torch_aura.flash_decode(q, k, v, sl)
    a = torch_aura.flash_decode(q, k[:, :, :cut], v[:, :, :cut], _lens([cut, cut]))
    b = torch_aura.flash_decode(q, k[:, :, cut:], v[:, :, cut:], _lens([T - cut for T in lens]))
    out, lse = torch_aura.merge_attn_states(torch.stack([a[0], b[0]]), torch.stack([a[1], b[1]]))
    assert_max_rel("halves out", out, whole, 2e-6)
    assert_max_rel("halves lse", lse, whole_lse, 2e-6)


def test_merge_permuted_partials():
    g = torch.Generator().manual_seed(10)
    po = torch.randn(2, 4, 3, 64, generator=g).permute(2, 0, 1, 3)  # [S=3, B=2, Hq=4, D]
    pl = torch.randn(2, 4, 3, generator=g).permute(2, 0, 1)
    out, lse = torch_aura.merge_attn_states(po, pl)
    o2, l2 = torch_aura.merge_attn_states(po.contiguous(), pl.contiguous())
    torch.testing.assert_close(out, o2, rtol=0, atol=1e-6)
    torch.testing.assert_close(lse, l2, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- bad input: errors


def _fd(**over):
    """A valid flash_decode call (contiguous unless block_table is given), with overrides."""
    q, k, v, sl = make_contiguous([9, 4], 4, 2, 64, torch.float32, T_cap=9)
    args = dict(q=q, k_cache=k, v_cache=v, seq_lens=sl, block_table=None, scale=None, num_splits=0)
    args.update(over)
    return "flash_decode", args


def _fdp(**over):
    q, k, v, sl, table = make_paged([9, 4], 4, 2, 64, torch.float32, 4)
    args = dict(q=q, k_cache=k, v_cache=v, seq_lens=sl, block_table=table, scale=None, num_splits=0)
    args.update(over)
    return "flash_decode", args


def _fdo(**over):
    _, args = _fd()
    args.update(out=torch.zeros(2, 4, 64), lse=torch.zeros(2, 4))
    args.update(over)
    return "flash_decode_out", args


def _mg(**over):
    args = dict(partial_out=torch.randn(3, 2, 4, 64), partial_lse=torch.randn(3, 2, 4))
    args.update(over)
    return "merge_attn_states", args


# (id, builder of (op, kwargs), message regex). Every message names the argument.
BAD = [
    ("q-dtype-fp64", lambda: _fd(q=torch.randn(2, 4, 64, dtype=torch.float64)), r"^q: expected dtype float16"),
    ("q-dtype-int", lambda: _fd(q=torch.zeros(2, 4, 64, dtype=torch.int32)), r"^q: expected dtype"),
    ("k-dtype-mismatch", lambda: _fd(k_cache=torch.randn(2, 2, 9, 64, dtype=torch.bfloat16)),
     r"^k_cache: expected dtype float32 \(the dtype of q\), got bfloat16"),
    ("q-rank", lambda: _fd(q=torch.randn(2, 1, 4, 64)), r"^q: expected a 3-D tensor"),
    ("k-rank", lambda: _fd(k_cache=torch.randn(2, 18, 64)), r"^k_cache: expected a 4-D tensor"),
    ("seq_lens-dtype", lambda: _fd(seq_lens=torch.tensor([9, 4])), r"^seq_lens: expected dtype int32, got int64"),
    ("seq_lens-rank", lambda: _fd(seq_lens=_lens([[9, 4]])), r"^seq_lens: expected a 1-D tensor"),
    ("seq_lens-length", lambda: _fd(seq_lens=_lens([9, 4, 1])), r"^seq_lens.shape\[0\]: expected 2"),
    ("block_table-dtype", lambda: _fdp(block_table=torch.zeros(2, 4, dtype=torch.int64)),
     r"^block_table: expected dtype int32"),
    ("block_table-rank", lambda: _fdp(block_table=torch.zeros(8, dtype=torch.int32)), r"^block_table: expected a 2-D"),
    ("block_table-rows", lambda: _fdp(block_table=torch.zeros(3, 4, dtype=torch.int32)),
     r"^block_table.shape\[0\]: expected 2"),
    ("block_table-stride", lambda: _fdp(block_table=torch.zeros(4, 2, dtype=torch.int32).t()),
     r"^block_table: expected a unit stride"),
    ("q-last-stride", lambda: _fd(q=torch.randn(2, 4, 128)[..., ::2]), r"^q: expected a unit stride in the last dim"),
    ("k-last-stride", lambda: _fd(k_cache=torch.randn(2, 2, 9, 128)[..., ::2]), r"^k_cache: expected a unit stride"),
    ("v-last-stride", lambda: _fd(v_cache=torch.randn(2, 2, 9, 128)[..., 1::2]), r"^v_cache: expected a unit stride"),
    ("head_dim-48", lambda: _fd(q=torch.randn(2, 4, 48), k_cache=torch.randn(2, 2, 9, 48),
                                v_cache=torch.randn(2, 2, 9, 48)),
     r"^head_dim \(q.shape\[-1\]\): expected one of \[64, 80, 96, 128, 192, 256, 512\], got 48"),
    ("head_dim-1024", lambda: _fd(q=torch.randn(1, 1, 1024), k_cache=torch.randn(1, 1, 2, 1024),
                                  v_cache=torch.randn(1, 1, 2, 1024), seq_lens=_lens([2])), r"^head_dim"),
    ("gqa-not-dividing", lambda: _fd(q=torch.randn(2, 6, 64), k_cache=torch.randn(2, 4, 9, 64),
                                     v_cache=torch.randn(2, 4, 9, 64)),
     r"^q: expected query heads Hq \(6\) to be a multiple of KV heads"),
    ("v-shape", lambda: _fd(v_cache=torch.randn(2, 2, 8, 64)), r"^v_cache: expected the shape of k_cache"),
    ("k-head_dim", lambda: _fd(k_cache=torch.randn(2, 2, 9, 80), v_cache=torch.randn(2, 2, 9, 80)),
     r"^k_cache.shape\[3\]: expected 64"),
    ("k-batch", lambda: _fd(k_cache=torch.randn(3, 2, 9, 64), v_cache=torch.randn(3, 2, 9, 64)),
     r"^k_cache.shape\[0\]: expected 2"),
    ("paged-gqa", lambda: _fdp(k_cache=torch.randn(12, 4, 3, 64), v_cache=torch.randn(12, 4, 3, 64)),
     r"^q: expected query heads Hq \(4\) to be a multiple of KV heads Hkv = k_cache.shape\[2\] \(3\)"),
    ("num_splits-negative", lambda: _fd(num_splits=-1), r"^num_splits: expected >= 0"),
    ("out-shape", lambda: _fdo(out=torch.zeros(2, 4, 80)), r"^out: expected shape \[2, 4, 64\]"),
    ("out-dtype", lambda: _fdo(out=torch.zeros(2, 4, 64, dtype=torch.float16)), r"^out: expected dtype float32"),
    ("out-last-stride", lambda: _fdo(out=torch.zeros(2, 4, 128)[..., ::2]), r"^out: expected a unit stride"),
    ("lse-dtype", lambda: _fdo(lse=torch.zeros(2, 4, dtype=torch.float16)), r"^lse: expected dtype float32"),
    ("lse-shape", lambda: _fdo(lse=torch.zeros(4, 2)), r"^lse: expected shape \[2, 4\]"),
    ("merge-lse-dtype", lambda: _mg(partial_lse=torch.zeros(3, 2, 4, dtype=torch.float16)),
     r"^partial_lse: expected dtype float32"),
    ("merge-out-dtype", lambda: _mg(partial_out=torch.zeros(3, 2, 4, 64, dtype=torch.int32)),
     r"^partial_out: expected dtype"),
    ("merge-rank", lambda: _mg(partial_out=torch.zeros(2, 4, 64)), r"^partial_out: expected a 4-D"),
    ("merge-lse-shape", lambda: _mg(partial_lse=torch.zeros(3, 2, 5)), r"^partial_lse: expected shape \[3, 2, 4\]"),
    ("merge-no-splits", lambda: _mg(partial_out=torch.zeros(0, 2, 4, 64), partial_lse=torch.zeros(0, 2, 4)),
     r"^partial_out.shape\[0\]: expected at least 1 split"),
    ("merge-head_dim", lambda: _mg(partial_out=torch.zeros(3, 2, 4, 33)), r"^head_dim \(partial_out.shape\[-1\]\)"),
    ("merge-last-stride", lambda: _mg(partial_out=torch.zeros(3, 2, 4, 128)[..., ::2]),
     r"^partial_out: expected a unit stride"),
]


def _to_meta(x):
    if isinstance(x, torch.Tensor):  # keep the strides: stride errors must survive the move
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_raises_named_error(case):
    _, build, match = case
    name, kwargs = build()
    args = list(kwargs.values())
    with pytest.raises(ValueError, match=match):  # the public wrapper
        getattr(torch_aura, name)(*args)
    with pytest.raises(ValueError, match=match):  # the op itself (check inside the reference)
        getattr(torch.ops.aura, name)(*args)


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_raises_at_trace_time(case):
    """On meta tensors the op runs only its fake: the same check, the same error."""
    _, build, match = case
    name, kwargs = build()
    with pytest.raises(ValueError, match=match):
        getattr(torch.ops.aura, name)(*[_to_meta(a) for a in kwargs.values()])


def test_device_mismatch_names_the_argument():
    # Two real devices are not available here: a meta tensor among CPU ones stands in.
    for arg in ("k_cache", "v_cache", "seq_lens"):
        name, kwargs = _fd()
        kwargs[arg] = _to_meta(kwargs[arg])
        with pytest.raises(ValueError, match=rf"^{arg}: expected device cpu \(the device of q\), got meta"):
            torch_aura.flash_decode(*kwargs.values())
        with pytest.raises(ValueError, match=rf"^{arg}: expected device cpu"):
            torch.ops.aura.flash_decode(*kwargs.values())
    _, kwargs = _fdp()
    kwargs["block_table"] = _to_meta(kwargs["block_table"])
    with pytest.raises(ValueError, match=r"^block_table: expected device cpu"):
        torch_aura.flash_decode(*kwargs.values())
    _, kwargs = _fdo(lse=torch.zeros(2, 4, device="meta"))
    with pytest.raises(ValueError, match=r"^lse: expected device cpu"):
        torch_aura.flash_decode_out(*kwargs.values())
    _, kwargs = _mg(partial_lse=torch.zeros(3, 2, 4, device="meta"))
    with pytest.raises(ValueError, match=r"^partial_lse: expected device cpu"):
        torch_aura.merge_attn_states(*kwargs.values())


@pytest.mark.parametrize("layout", ("contig", "paged"))
@pytest.mark.parametrize("bad", (-1, "over"))
def test_seq_lens_outside_capacity(layout, bad):
    """Data-dependent: only the reference (which may read values) can see it."""
    name, kwargs = _fd() if layout == "contig" else _fdp()
    cap = 9 if layout == "contig" else kwargs["block_table"].shape[1] * 4
    kwargs["seq_lens"] = _lens([9, cap + 1 if bad == "over" else -1])
    with pytest.raises(ValueError, match=rf"^seq_lens: expected values in \[0, {cap}\].*seq_lens\[1\]"):
        torch_aura.flash_decode(*kwargs.values())


@pytest.mark.parametrize("page_index", (-1, "num_blocks"))
def test_used_page_index_out_of_range(page_index):
    _, kwargs = _fdp()
    k = kwargs["k_cache"]
    table = kwargs["block_table"]
    table[1, 0] = k.shape[0] if page_index == "num_blocks" else -1  # page 0 of sequence 1 is used
    with pytest.raises(ValueError, match=rf"^block_table: expected page indices in \[0, {k.shape[0]}\).*"
                                         r"block_table\[1, 0\]"):
        torch_aura.flash_decode(*kwargs.values())


def test_bad_input_inside_torch_compile():
    def f(q, k, v, sl):
        return torch_aura.flash_decode(q, k, v, sl)

    torch._dynamo.reset()
    q, k, v = torch.randn(1, 2, 40), torch.randn(1, 1, 3, 40), torch.randn(1, 1, 3, 40)
    with pytest.raises(Exception, match=r"head_dim \(q.shape\[-1\]\): expected one of"):
        torch.compile(f, fullgraph=True, backend="eager")(q, k, v, _lens([3]))
