"""The CUDA split-K decode kernels against the fp64 oracle and the reference (docs/decode.md §12).

Runs only where a CUDA device exists; there, a missing kernel is a failure, not a skip.
"""

import contextlib
import math
import os

import pytest
import torch

import torch_aura
from torch_aura import backends
from torch_aura.reference import decode as ref

from torch_aura.testing import exact_decode_attention as oracle

from _util import RATIO, assert_close, assert_max_rel, dtype_id

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

DEV = "cuda"
DIMS = (64, 80, 96, 128, 192, 256, 512)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INF = math.inf


def test_cuda_kernels_are_registered():
    for op in ("flash_decode", "flash_decode_out", "merge_attn_states"):
        assert backends.has_kernel(op, "cuda"), backends.status()[op]["cuda"]


@contextlib.contextmanager
def env(name, value):
    """name=value for the calls inside (the kernels read their switches per call)."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved


# ------------------------------------------------------------------------------------ inputs
def make_cache(lens, Hq, Hkv, D, dtype, *, page=None, T_cap=None, seed=0, poison_tail=True):
    """q, k, v, seq_lens, block_table (None when contiguous). Tokens past seq_len are NaN, so a
    kernel that reads them fails; paged tables are random permutations with garbage tails."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    B = len(lens)
    T_cap = T_cap or max(max(lens), 1)
    q = torch.randn(B, Hq, D, generator=g).to(DEV, dtype)
    k = torch.randn(B, Hkv, T_cap, D, generator=g)
    v = torch.randn(B, Hkv, T_cap, D, generator=g)
    if poison_tail:
        for b, n in enumerate(lens):
            k[b, :, n:] = math.nan
            v[b, :, n:] = math.nan
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    if page is None:
        return q, k.to(DEV, dtype), v.to(DEV, dtype), seq_lens, None
    max_blocks = math.ceil(T_cap / page)
    num_blocks = B * max_blocks + 3
    perm = torch.randperm(num_blocks, generator=g)
    table = perm[: B * max_blocks].reshape(B, max_blocks).to(torch.int32)
    kp = torch.full((num_blocks, page, Hkv, D), math.nan)
    vp = torch.full((num_blocks, page, Hkv, D), math.nan)
    for b in range(B):
        for j in range(max_blocks):
            rows = slice(j * page, min((j + 1) * page, T_cap))
            n = rows.stop - rows.start
            kp[table[b, j], :n] = k[b, :, rows].transpose(0, 1)
            vp[table[b, j], :n] = v[b, :, rows].transpose(0, 1)
        used = math.ceil(lens[b] / page)
        table[b, used:] = -7  # never read
    return q, kp.to(DEV, dtype), vp.to(DEV, dtype), seq_lens, table.to(DEV)


def check(name, out, lse, want_out, want_lse, dtype):
    assert out.dtype == dtype and lse.dtype == torch.float32
    if dtype == torch.float32:
        assert_max_rel(f"{name} out", out, want_out)
    else:
        assert_close(f"{name} out", out.float(), want_out, RATIO[dtype])
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse)), f"{name}: lse -inf pattern differs"
    fin = torch.isfinite(want_lse)
    if fin.any():
        err = (lse[fin].double() - want_lse[fin]).abs().max().item()
        assert err <= 1e-4, f"{name}: lse off by {err:.2e}"


# ------------------------------------------------------------------------------ numerics grid
EDGE = [0, 1, 15, 16, 17, 255, 256, 257, 511, 1000]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("D", DIMS, ids=lambda d: f"D{d}")
def test_every_head_dim_and_dtype(D, dtype):
    q, k, v, sl, table = make_cache(EDGE, 8, 2, D, dtype, T_cap=1024, seed=D)
    out, lse = torch_aura.flash_decode(q, k, v, sl)
    check(f"D{D}", out, lse, *oracle(q, k, v, sl, None), dtype)


@pytest.mark.parametrize("G", (1, 2, 3, 4, 5, 6, 7, 8, 16), ids=lambda g: f"G{g}")
@pytest.mark.parametrize("layout", ("contig", "page16", "page7", "page1"))
def test_every_gqa_ratio_and_layout(G, layout):
    page = None if layout == "contig" else int(layout[4:])
    lens = [0, 1, 6, 7, 8, 16, 17, 300, 700]
    q, k, v, sl, table = make_cache(lens, 2 * G, 2, 128, torch.bfloat16, page=page, T_cap=713, seed=G)
    out, lse = torch_aura.flash_decode(q, k, v, sl, table)
    check(f"G{G}-{layout}", out, lse, *oracle(q, k, v, sl, table), torch.bfloat16)


@pytest.mark.parametrize("D", DIMS, ids=lambda d: f"D{d}")
@pytest.mark.parametrize("layout", ("contig", "contig-rows", "page16", "page16-rows", "page7"))
def test_both_copy_engines(D, layout, monkeypatch):
    """16-bit caches pick the copy engine from static values: swizzled 2-D tiles through tensor maps
    where D is a multiple of 64 (contiguous, or pages of 16k tokens); else, or under
    TORCH_AURA_DECODE_COPY=rows, row copies: 1-D bulk copies for a contiguous cache when a
    full-capacity split gives every warp >= 16 steps (one split over 1100 tokens), cp.async otherwise.
    Each must agree with the oracle on ragged lengths, tails past the end (NaN in the cache) and
    empty sequences."""
    if layout.endswith("-rows"):
        monkeypatch.setenv("TORCH_AURA_DECODE_COPY", "rows")
        layout = layout[: -len("-rows")]
    page = None if layout == "contig" else int(layout[4:])
    dtype = torch.float16 if D == 96 else torch.bfloat16
    q, k, v, sl, table = make_cache([1100, 1, 17, 1024, 0, 333], 8, 2, D, dtype, page=page, T_cap=1100, seed=D)
    for S in (1, 0):
        out, lse = torch_aura.flash_decode(q, k, v, sl, table, num_splits=S)
        check(f"D{D}-{layout}-S{S}", out, lse, *oracle(q, k, v, sl, table), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_matches_reference_split_for_split(dtype):
    """Same host plan as the reference (real SM count, plan_ctas_per_sm): the fp32 results agree to
    rounding, which pins the device-side split rule to reference.decode.split_chunk."""
    q, k, v, sl, table = make_cache([3000, 1, 0, 513], 16, 4, 128, dtype, page=16, seed=5)
    out, lse = torch_aura.flash_decode(q, k, v, sl, table)
    want_out, want_lse = ref.flash_decode(q, k, v, sl, table)
    if dtype == torch.float32:
        assert_max_rel("out", out, want_out, 1e-5)
    else:
        assert_close("out", out.float(), want_out.float(), RATIO[dtype])
    assert torch.equal(lse.isinf(), want_lse.isinf())
    fin = torch.isfinite(want_lse)
    assert torch.allclose(lse[fin], want_lse[fin], atol=1e-5)


def test_the_kernels_split_count_is_the_reference_plan(tmp_path):
    """The split kernel's grid (S, Hkv * head_tiles, B) has the S of ref.plan_num_splits (the
    documented plan: torch_aura.decode_num_splits) on shapes that exercise each of its rules: one
    wave, the capacity bound, one merge round trip, 32 splits for medium reads, no empty split of a
    full cache, D = 512 (the dim-split CTA's 32-token floor; one-warp CTAs on pages of 8), paged caches
    with and without tile copies, and a batch that fills the GPU."""
    import json

    from torch.profiler import ProfilerActivity, profile

    cases = [(1, 32, 8, 128, 1024, None), (1, 32, 8, 128, 4096, None), (1, 32, 8, 128, 8192, None),
             (1, 32, 8, 128, 32768, None), (1, 8, 2, 128, 4096, None), (1, 8, 2, 128, 32768, None),
             (1, 4, 1, 128, 8192, None), (2, 16, 8, 128, 8192, None), (1, 16, 2, 512, 8192, None),
             (1, 16, 2, 512, 4096, None), (1, 16, 2, 512, 4096, 16), (1, 16, 2, 512, 4096, 8),
             (1, 32, 8, 128, 4096, 16), (1, 32, 8, 96, 4096, 16), (1, 8, 2, 128, 4096, 7), (64, 8, 8, 64, 256, None)]
    for i, (B, Hq, Hkv, D, T_cap, page) in enumerate(cases):
        q, k, v, sl, table = make_cache([T_cap] * B, Hq, Hkv, D, torch.bfloat16, page=page, T_cap=T_cap,
                                        poison_tail=False)
        torch_aura.flash_decode(q, k, v, sl, table)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            torch_aura.flash_decode(q, k, v, sl, table)
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(tmp_path / f"{i}.json"))
        grids = [ev["args"]["grid"] for ev in json.load(open(tmp_path / f"{i}.json"))["traceEvents"]
                 if ev.get("cat") == "kernel" and "flash_decode_split" in ev["name"]]
        capacity = T_cap if page is None else table.shape[1] * page
        want = ref.plan_num_splits(B, Hkv, q.device, head_dim=D, paged=page is not None, capacity=capacity,
                                   tile=page or ref.CONTIGUOUS_TILE)
        assert len(grids) == 1 and grids[0][0] == want and grids[0][2] == B, (cases[i], grids, want)


@pytest.mark.parametrize("num_splits", (1, 2, 3, 7, 64, 200))
def test_forced_split_counts_agree(num_splits):
    q, k, v, sl, table = make_cache([0, 1, 257, 2049, 4000], 8, 8, 128, torch.float32, seed=num_splits)
    out, lse = torch_aura.flash_decode(q, k, v, sl, num_splits=num_splits)
    check(f"S{num_splits}", out, lse, *oracle(q, k, v, sl, None), torch.float32)


def test_large_group_uses_head_tiles():
    # G = 40 at D = 512 does not fit one CTA's shared memory: the group is split into tiles.
    q, k, v, sl, _ = make_cache([100, 0, 1500], 80, 2, 512, torch.bfloat16, seed=11)
    out, lse = torch_aura.flash_decode(q, k, v, sl)
    check("G40-D512", out, lse, *oracle(q, k, v, sl, None), torch.bfloat16)


def test_permuted_strides_and_custom_scale():
    B, Hkv, T, D = 3, 2, 300, 96
    base_k = torch.randn(B, T, Hkv, D, device=DEV, dtype=torch.float16)  # stored [B, T, Hkv, D]
    base_v = torch.randn(B, T, Hkv, D, device=DEV, dtype=torch.float16)
    k, v = base_k.transpose(1, 2), base_v.transpose(1, 2)  # viewed [B, Hkv, T, D]
    q = torch.randn(12, B, D, device=DEV, dtype=torch.float16).transpose(0, 1)  # non-contiguous q
    sl = torch.tensor([300, 17, 256], dtype=torch.int32, device=DEV)
    out, lse = torch_aura.flash_decode(q, k, v, sl, scale=0.05)
    check("strided", out, lse, *oracle(q, k, v, sl, None, scale=0.05), torch.float16)


def test_out_variant_writes_caller_buffers():
    q, k, v, sl, table = make_cache([5, 0, 600], 8, 4, 64, torch.bfloat16, page=16, seed=3)
    out = torch.full((3, 2 * 8, 64), math.nan, device=DEV, dtype=torch.bfloat16)[:, ::2]  # strided view
    lse = torch.full((8, 3), math.nan, device=DEV).t()
    torch_aura.flash_decode_out(q, k, v, sl, table, None, 0, out, lse)
    want_out, want_lse = torch_aura.flash_decode(q, k, v, sl, table)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_stale_nan_partials_are_skipped():
    # Fill the caching allocator's free blocks with NaN so the split workspace starts poisoned;
    # sequences shorter than the split plan leave slots the merge must skip, never multiply.
    junk = torch.full((64 << 20,), math.nan, device=DEV)
    del junk
    q, k, v, sl, _ = make_cache([1, 0, 3, 5000], 32, 8, 128, torch.float32, seed=9)
    out, lse = torch_aura.flash_decode(q, k, v, sl, num_splits=16)
    assert not out.isnan().any()
    check("stale", out, lse, *oracle(q, k, v, sl, None), torch.float32)


@pytest.mark.parametrize("D", (80, 128, 512), ids=lambda d: f"D{d}")
@pytest.mark.parametrize("layout", ("contig", "page16"))
def test_16bit_split_counts_around_the_chunk_floor(D, layout):
    """16-bit caches (tensor-core kernel) with forced split counts on lengths around the 64-token
    split floor (one step per warp), so clusters of live and dead splits meet in the merge."""
    page = None if layout == "contig" else 16
    Hq = 4 if D == 512 else 12  # G = 6 at D <= 128: one head tile; G = 2 at D = 512
    q, k, v, sl, table = make_cache([0, 1, 63, 64, 65, 3000], Hq, 2, D, torch.bfloat16, page=page, seed=D)
    for S in (2, 5, 16, 17, 47):
        out, lse = torch_aura.flash_decode(q, k, v, sl, table, num_splits=S)
        check(f"D{D}-{layout}-S{S}", out, lse, *oracle(q, k, v, sl, table), torch.bfloat16)


# ------------------------------------------------------------------------------------- merge
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_merge_kernel_matches_reference(dtype):
    S, B, Hq, D = 5, 3, 4, 80
    po = torch.randn(S, B, Hq, D, device=DEV).to(dtype)
    pl = torch.randn(S, B, Hq, device=DEV) * 3
    pl[1] = -INF
    po[1] = math.nan  # a skipped split's stale partial
    pl[:, 2, 3] = -INF  # a fully empty row
    po_view = torch.randn(B, S, Hq, D, device=DEV).to(dtype).transpose(0, 1)
    po_view.copy_(po)
    out, lse = torch_aura.merge_attn_states(po_view, pl)
    want_out, want_lse = ref.merge_attn_states(po.cpu(), pl.cpu())
    assert out.dtype == dtype and not out.isnan().any()
    assert torch.equal(out[2, 3].float().cpu(), torch.zeros(D)) and lse[2, 3].item() == -INF
    assert_close("merge out", out.float().cpu(), want_out.float(), RATIO[dtype])
    fin = torch.isfinite(want_lse)
    assert torch.allclose(lse.cpu()[fin], want_lse[fin], atol=1e-5)


# ------------------------------------------------------------------------------- split merge (S > 1)
# With S > 1 the split kernel's partials are merged by the merge kernel (decode.md §5): the result
# must be the bits of merge_attn_states over the same partials, in split order, call after call,
# in graphs and on concurrent streams.
MERGE_LENS = [0, 1, 63, 64, 65, 127, 128, 129, 700, 1023, 1024, 1025]  # empty, 1 token, chunk edges +-1


def partials_by_slices(q, k, v, sl, table, S):
    """The fp32 partials of the kernel's own split plan for S splits, split s of sequence b computed as
    an S = 1 call on that split's tokens (a slice of the cache, or of the block table: chunks are whole
    pages): the same stages and arithmetic as that split's CTA. Empty splits: NaN partial, lse -inf."""
    B, Hq, D = q.shape
    tile = k.shape[1] if table is not None else ref.CONTIGUOUS_TILE
    po = torch.full((S, B, Hq, D), math.nan, device=DEV)
    pl = torch.full((S, B, Hq), -INF, device=DEV)
    for b, T in enumerate(sl.tolist()):
        chunk, live = ref.split_chunk(T, S, tile)
        for s in range(live):
            start, end = s * chunk, min((s + 1) * chunk, T)
            n = torch.tensor([end - start], dtype=torch.int32, device=DEV)
            if table is None:
                o, l = torch_aura.flash_decode(q[b:b + 1], k[b:b + 1, :, start:end], v[b:b + 1, :, start:end], n,
                                               num_splits=1)
            else:
                page = k.shape[1]
                rows = table[b:b + 1, start // page:-(-end // page)]
                o, l = torch_aura.flash_decode(q[b:b + 1], k, v, n, rows, num_splits=1)
            po[s, b], pl[s, b] = o[0], l[0]
    return po, pl


@pytest.mark.parametrize("S", (2, 3, 7, 29, 64, 200), ids=lambda s: f"S{s}")
@pytest.mark.parametrize("layout", ("contig", "page16", "page7"))
@pytest.mark.parametrize("G,D", ((1, 64), (4, 128), (5, 80), (2, 512)), ids=("G1-D64", "G4-D128", "G5-D80", "G2-D512"))
def test_split_merge_is_bitwise_merge_attn_states_of_its_partials(G, D, layout, S):
    """fp32 (whose S = 1 output is the exact split partial): flash_decode with S splits equals
    merge_attn_states over the partials bit for bit (up to 200 splits). NaN partials of empty splits
    are skipped."""
    page = None if layout == "contig" else int(layout[4:])
    q, k, v, sl, table = make_cache(MERGE_LENS, 2 * G, 2, D, torch.float32, page=page, seed=S + D)
    out, lse = torch_aura.flash_decode(q, k, v, sl, table, num_splits=S)
    want_out, want_lse = torch_aura.merge_attn_states(*partials_by_slices(q, k, v, sl, table, S))
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    check(f"G{G}-D{D}-{layout}-S{S}", out, lse, *oracle(q, k, v, sl, table), torch.float32)


@pytest.mark.parametrize("S", (1, 2, 29, 200), ids=lambda s: f"S{s}")
@pytest.mark.parametrize("layout", ("contig", "page16"))
@pytest.mark.parametrize("G", (1, 2, 3, 4, 5, 6, 7, 8), ids=lambda g: f"G{g}")
def test_split_merge_16bit_edges(G, layout, S):
    """bf16 (tensor-core kernel) at every GQA ratio up to 8, one, two and many splits, on lengths 0, 1
    and around the split boundaries: equal to the fp64 oracle, and bitwise repeatable."""
    page = None if layout == "contig" else 16
    q, k, v, sl, table = make_cache(MERGE_LENS, 2 * G, 2, 128, torch.bfloat16, page=page, seed=G + S)
    out, lse = torch_aura.flash_decode(q, k, v, sl, table, num_splits=S)
    check(f"G{G}-{layout}-S{S}", out, lse, *oracle(q, k, v, sl, table), torch.bfloat16)
    again = torch_aura.flash_decode(q, k, v, sl, table, num_splits=S)
    assert torch.equal(again[0], out) and torch.equal(again[1], lse)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=dtype_id)
@pytest.mark.parametrize("S", (3, 29, 200), ids=lambda s: f"S{s}")
def test_split_merge_propagates_nan_and_keeps_empty_rows(S, dtype):
    """A NaN partial is not an empty split: a NaN key (lse NaN in its split) makes its group's rows NaN
    with lse NaN, a NaN value row makes them NaN with a finite lse; an empty sequence still gives 0 and
    -inf, and the untouched rows stay exact."""
    q, k, v, sl, _ = make_cache([700, 700, 0, 300], 8, 2, 128, dtype, seed=S)
    k[0, 0, 200] = math.nan  # sequence 0, KV head 0: query heads 0-3
    v[1, 1, 650] = math.nan  # sequence 1, KV head 1: query heads 4-7
    out, lse = torch_aura.flash_decode(q, k, v, sl, num_splits=S)
    want_out, want_lse = oracle(q, k, v, sl, None)
    assert out[0, :4].isnan().all() and lse[0, :4].isnan().all()
    assert out[1, 4:].isnan().all() and torch.isfinite(lse[1, 4:]).all()
    assert torch.equal(out.isnan(), want_out.isnan()) and torch.equal(lse.isnan(), want_lse.isnan())
    assert not out[2].any() and (lse[2] == -INF).all()
    check(f"nan-S{S}", out, lse, want_out, want_lse, dtype)


def _merge_cases():
    """Calls of different shapes, dtypes, layouts and split counts (the last one with 320 KB of
    partials per KV head)."""
    cases = []
    for lens, Hq, Hkv, D, dtype, page, S in (([2048, 1, 0, 900], 16, 4, 128, torch.bfloat16, 16, 0),
                                             ([300, 77, 1500], 6, 2, 64, torch.float16, None, 5),
                                             ([1000, 0], 8, 8, 96, torch.float32, 7, 29),
                                             ([4000], 16, 2, 256, torch.bfloat16, None, 11),
                                             ([600, 3], 8, 2, 512, torch.bfloat16, None, 40)):
        q, k, v, sl, table = make_cache(lens, Hq, Hkv, D, dtype, page=page, seed=len(cases), poison_tail=False)
        out = torch.full((len(lens), Hq, D), math.nan, device=DEV, dtype=dtype)
        lse = torch.full((len(lens), Hq), math.nan, device=DEV)
        cases.append(((q, k, v, sl, table, None, S), out, lse))
    return cases


def test_split_merge_counters_reset_across_calls_shapes_and_graph_replays():
    """The same call repeated, calls of other shapes in between, and CUDA-graph replays of all of them
    (two graphs of the same calls, replayed in turn with eager calls between) give the eager bits: no
    state survives a call."""
    cases = _merge_cases()
    want = []
    for args, out, lse in cases:
        torch.ops.aura.flash_decode_out(*args, out, lse)
        check("first", out, lse, *oracle(*args[:5]), args[0].dtype)
        want.append((out.clone(), lse.clone()))
    for _ in range(3):  # repeated, and interleaved with the other shapes
        for (args, out, lse), (w_out, w_lse) in zip(cases, want):
            out.fill_(math.nan)
            torch.ops.aura.flash_decode_out(*args, out, lse)
            assert torch.equal(out, w_out) and torch.equal(lse, w_lse)
    torch.cuda.synchronize()
    graphs = [torch.cuda.CUDAGraph() for _ in range(2)]
    for graph in graphs:
        with torch.cuda.graph(graph):
            for args, out, lse in cases:
                torch.ops.aura.flash_decode_out(*args, out, lse)
    for trial in range(6):
        if trial == 3:  # new data: the replays must follow it
            g = torch.Generator(device="cpu").manual_seed(7)
            for i, ((q, k, v, sl, table, *_), _, _) in enumerate(cases):
                for t in (q, k, v):
                    t.copy_(torch.randn(t.shape, generator=g))
                if table is not None:  # every entry a valid page now: any new length is readable
                    table.copy_(torch.randperm(k.shape[0], generator=g)[: table.numel()].reshape(table.shape))
                cap = k.shape[2] if table is None else table.shape[1] * k.shape[1]
                sl.copy_(torch.randint(0, cap + 1, sl.shape, generator=g, dtype=torch.int32))
                eager = torch.ops.aura.flash_decode(*cases[i][0])
                want[i] = (eager[0].clone(), eager[1].clone())
        for _, out, lse in cases:
            out.fill_(math.nan)
        graphs[trial % 2].replay()
        torch.cuda.synchronize()
        for i, ((args, out, lse), (w_out, w_lse)) in enumerate(zip(cases, want)):
            assert torch.equal(out, w_out) and torch.equal(lse, w_lse), f"replay {trial}, case {i} differs from eager"


def test_split_merge_on_concurrent_streams():
    """Calls on two streams at once (shared workspaces would race): both stay exact."""
    args = _merge_cases()[0][0]
    want = torch.ops.aura.flash_decode(*args)
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs = [[] for _ in streams]
    torch.cuda.synchronize()
    for st in streams:  # both queues fill behind a busy kernel, then drain side by side
        with torch.cuda.stream(st):
            torch.cuda._sleep(1 << 20)
    for _ in range(20):
        for st, got in zip(streams, outs):
            with torch.cuda.stream(st):
                got.append(torch.ops.aura.flash_decode(*args))
    torch.cuda.synchronize()
    for got in outs:
        for out, lse in got:
            assert torch.equal(out, want[0]) and torch.equal(lse, want[1])


# --------------------------------------------------------------- graphs, compile, errors
@pytest.mark.parametrize("schedule", ("static", "balanced", "streamk"))
def test_cuda_graph_replay_with_new_lengths_tables_and_values_is_bitwise_eager(schedule, monkeypatch):
    """Balanced: the plan kernel zeroes the claim counter inside the graph, so every replay claims from
    0 and follows the new lengths (its item count changes from replay to replay). Stream-K: every replay
    cuts the new lengths' steps afresh, in the split kernel and in the merge."""
    monkeypatch.setenv("TORCH_AURA_DECODE_SCHEDULE", schedule)
    B, Hq, Hkv, D, page, T_cap = 4, 16, 4, 128, 16, 2048
    q, k, v, sl, table = make_cache([2048, 1, 0, 900], Hq, Hkv, D, torch.bfloat16, page=page, T_cap=T_cap,
                                    poison_tail=False)
    out = torch.empty(B, Hq, D, device=DEV, dtype=torch.bfloat16)
    lse = torch.empty(B, Hq, device=DEV)
    torch_aura.flash_decode_out(q, k, v, sl, table, None, 0, out, lse)  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.aura.flash_decode_out(q, k, v, sl, table, None, 0, out, lse)
    for trial in range(3):
        g = torch.Generator(device="cpu").manual_seed(100 + trial)
        sl.copy_(torch.randint(0, T_cap + 1, (B,), generator=g, dtype=torch.int32))
        table.copy_(torch.randperm(k.shape[0], generator=g)[: table.numel()].reshape(table.shape).to(torch.int32))
        q.copy_(torch.randn(q.shape, generator=g))
        k.copy_(torch.randn(k.shape, generator=g))
        v.copy_(torch.randn(v.shape, generator=g))  # every page finite: NaN != NaN under equal
        graph.replay()
        want_out, want_lse = torch_aura.flash_decode(q, k, v, sl, table)
        torch.cuda.synchronize()
        assert not out.isnan().any()
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse), f"replay {trial} differs from eager"


def test_compile_fullgraph_and_reduce_overhead():
    q, k, v, sl, table = make_cache([100, 3000, 0], 8, 2, 128, torch.bfloat16, page=16, seed=4)

    def step(q, k, v, sl, table):
        out, lse = torch_aura.flash_decode(q, k, v, sl, table)
        return out.float() * 2, lse

    want = step(q, k, v, sl, table)
    for mode in (None, "reduce-overhead"):
        torch._dynamo.reset()
        fn = torch.compile(step, fullgraph=True, mode=mode)
        for _ in range(3):  # reduce-overhead records a graph on the warm calls
            got = fn(q, k, v, sl, table)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), mode


def test_direct_op_call_rejects_bad_input_in_cpp():
    q, k, v, sl, _ = make_cache([10], 4, 2, 128, torch.bfloat16)
    with pytest.raises(RuntimeError, match="seq_lens: expected dtype int32"):
        torch.ops.aura.flash_decode(q, k, v, sl.long())
    misaligned = torch.empty(1, 2, 11 * 128 + 1, device=DEV, dtype=torch.bfloat16)[:, :, 1:].view(1, 2, 11, 128)
    with pytest.raises(RuntimeError, match="k_cache: expected a 16-byte aligned"):
        torch.ops.aura.flash_decode(q, misaligned, misaligned, torch.tensor([5], dtype=torch.int32, device=DEV))
    with pytest.raises(RuntimeError, match="head_dim"):
        q48 = torch.randn(1, 4, 48, device=DEV, dtype=torch.bfloat16)
        k48 = torch.randn(1, 2, 8, 48, device=DEV, dtype=torch.bfloat16)
        torch.ops.aura.flash_decode(q48, k48, k48, torch.tensor([8], dtype=torch.int32, device=DEV))
    # the merge kernel's 128-dim chunks take any head_dim that is a multiple of 4, up to 512
    for D in (516, 130):
        with pytest.raises(RuntimeError, match="partial_out: expected a head_dim that is a multiple of 4 and at most 512"):
            torch.ops.aura.merge_attn_states(torch.zeros(2, 1, 1, D, device=DEV), torch.zeros(2, 1, 1, device=DEV))


def test_out_of_range_lengths_and_pages_never_fault():
    # The wrapper rejects these eagerly; the kernel must still be memory safe when called directly.
    q, k, v, sl, table = make_cache([40, 40], 4, 2, 64, torch.float16, page=16, poison_tail=False)
    sl.fill_(10**6)
    table[0, 0] = 10**6
    table[1, 1] = -5
    out, lse = torch.ops.aura.flash_decode(q, k, v, sl, table)
    torch.cuda.synchronize()
    assert out.shape == (2, 4, 64)


# ------------------------------------------------------------ the balanced and stream-K schedules
# decode.md §4. Balanced: a plan kernel cuts the batch into equal items, persistent CTAs claim them from a
# counter, and the merge finds each row's items in the plan. Stream-K: one wave of CTAs, each running an
# equal share of the batch's 16-token steps across unit and sequence boundaries, one partial per piece;
# the merge finds a unit's pieces from seq_lens. Both opt-in (auto stays static), forced here.
DYNAMIC = ("balanced", "streamk", "streamk2")  # streamk2: two stream-K CTAs per SM


@pytest.fixture(params=DYNAMIC)
def dynamic(request, monkeypatch):
    schedule = request.param
    monkeypatch.setenv("TORCH_AURA_DECODE_SCHEDULE", schedule.rstrip("2"))
    monkeypatch.setenv("TORCH_AURA_DECODE_STREAMK_CTAS_PER_SM", "2" if schedule.endswith("2") else "1")
    return schedule


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=dtype_id)
@pytest.mark.parametrize("D", DIMS, ids=lambda d: f"D{d}")
@pytest.mark.parametrize("layout", ("contig", "page16", "page7"))
def test_dynamic_schedule_every_head_dim_and_layout(D, dtype, layout, dynamic):
    """(Stream-K leaves D = 512 to the static splits: the row is then the static schedule's.)"""
    page = None if layout == "contig" else int(layout[4:])
    lens = [0, 1, 255, 256, 257, 1000, 2500]  # item boundaries at 256-token multiples, and an empty row
    q, k, v, sl, table = make_cache(lens, 8, 2, D, dtype, page=page, seed=D)
    out, lse = torch_aura.flash_decode(q, k, v, sl, table)
    check(f"{dynamic}-D{D}-{layout}", out, lse, *oracle(q, k, v, sl, table), dtype)


@pytest.mark.parametrize("G", (1, 2, 3, 5, 8, 12, 17), ids=lambda g: f"G{g}")
@pytest.mark.parametrize("D", (128, 256), ids=lambda d: f"D{d}")
def test_dynamic_schedule_gqa_ratios_and_head_tiles(G, D, dynamic):
    """Groups past one CTA's heads (16 at D <= 128, 8 above) are units of several head tiles."""
    q, k, v, sl, table = make_cache([700, 0, 1300], 2 * G, 2, D, torch.bfloat16, seed=G)
    out, lse = torch_aura.flash_decode(q, k, v, sl, table)
    check(f"{dynamic}-G{G}-D{D}", out, lse, *oracle(q, k, v, sl, table), torch.bfloat16)


def test_dynamic_schedule_many_pieces_per_cta_deterministically(dynamic, monkeypatch):
    """Balanced: more items than CTAs (each CTA claims several, in a run-dependent order); stream-K: CTA
    ranges that span several units and sequences. Empty sequences between long ones: equal to the oracle,
    to the static schedule within the dtype's tolerance, and the same bits on every call (each item or
    piece writes its own partial; the merge order is fixed)."""
    lens = [0, 20000, 1, 0, 17000, 7]  # 2 KV heads: ~300 items of 256 tokens, > 2 CTAs per SM
    q, k, v, sl, table = make_cache(lens, 8, 2, 64, torch.bfloat16, seed=11)
    out, lse = torch_aura.flash_decode(q, k, v, sl, table)
    check(f"{dynamic}-many", out, lse, *oracle(q, k, v, sl, table), torch.bfloat16)
    for _ in range(3):
        again = torch_aura.flash_decode(q, k, v, sl, table)
        assert torch.equal(again[0], out) and torch.equal(again[1], lse), f"{dynamic} schedule is not deterministic"
    monkeypatch.setenv("TORCH_AURA_DECODE_SCHEDULE", "static")
    s_out, s_lse = torch_aura.flash_decode(q, k, v, sl, table)
    assert_close(f"{dynamic} vs static", out.float(), s_out.float(), RATIO[torch.bfloat16])
    fin = torch.isfinite(s_lse)
    assert torch.equal(fin, torch.isfinite(lse)) and (lse[fin] - s_lse[fin]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("lens", ([1, 0, 3], [17, 0, 0, 16], [0, 0]), ids=("3-steps", "2-steps", "none"))
@pytest.mark.parametrize("layout", ("contig", "page16"))
def test_streamk_more_ctas_than_steps(lens, layout, monkeypatch):
    """A few steps over a wave of CTAs: most ranges are empty, and each empty one still writes the -inf
    row its unit's merge counts; no steps at all gives zeros and -inf."""
    monkeypatch.setenv("TORCH_AURA_DECODE_SCHEDULE", "streamk")
    q, k, v, sl, table = make_cache(lens, 6, 3, 128, torch.bfloat16, page=None if layout == "contig" else 16)
    out, lse = torch_aura.flash_decode(q, k, v, sl, table)
    check(f"streamk-{lens}", out, lse, *oracle(q, k, v, sl, table), torch.bfloat16)


def test_streamk_past_its_batch_limit_runs_the_static_splits(monkeypatch):
    """Stream-K keeps the batch's step prefix in shared memory (kStreamKMaxBatch = 128 sequences): a larger
    batch runs the static schedule, bit for bit."""
    q, k, v, sl, table = make_cache([(37 * i) % 300 for i in range(129)], 8, 2, 128, torch.bfloat16, seed=3)
    monkeypatch.setenv("TORCH_AURA_DECODE_SCHEDULE", "static")
    want = torch_aura.flash_decode(q, k, v, sl, table)
    monkeypatch.setenv("TORCH_AURA_DECODE_SCHEDULE", "streamk")
    got = torch_aura.flash_decode(q, k, v, sl, table)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    q, k, v, sl, table = make_cache([(37 * i) % 300 for i in range(128)], 8, 2, 128, torch.bfloat16, seed=3)
    out, lse = torch_aura.flash_decode(q, k, v, sl, table)  # at the limit: stream-K
    check("streamk-B128", out, lse, *oracle(q, k, v, sl, table), torch.bfloat16)


@pytest.mark.parametrize("paged", (False, True), ids=("contig", "page16"))
def test_adaptive_schedule_runs_streamk_only_where_its_rule_holds(paged, monkeypatch):
    """`adaptive` (the candidate rule for auto, decode.md §4): stream-K where the static plan splits and each
    SM's share of a full cache is >= 6144 tokens, two CTAs per SM contiguous, one paged; bit for bit that
    forced schedule there, and the static splits' bits below the share."""
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    B, Hq, Hkv, D, page = 8, 32, 8, 128, 16
    long_cap = -(-6144 * sms // (B * Hkv) // 256) * 256 + 256  # just past the share
    g = torch.Generator(device=DEV).manual_seed(0)
    for cap, want_schedule in ((long_cap, "streamk"), (long_cap // 4, "static")):
        q = torch.randn(B, Hq, D, device=DEV, dtype=torch.bfloat16, generator=g)
        shape = (B * cap // page, page, Hkv, D) if paged else (B, Hkv, cap, D)
        k = torch.randn(shape, device=DEV, dtype=torch.bfloat16, generator=g)
        v = torch.randn(shape, device=DEV, dtype=torch.bfloat16, generator=g)
        sl = torch.randint(1, cap + 1, (B,), device=DEV, dtype=torch.int32, generator=g)
        table = torch.randperm(B * cap // page, device=DEV, generator=g).reshape(B, -1).int() if paged else None
        monkeypatch.setenv("TORCH_AURA_DECODE_SCHEDULE", want_schedule)
        monkeypatch.setenv("TORCH_AURA_DECODE_STREAMK_CTAS_PER_SM", "1" if paged else "2")
        want = torch_aura.flash_decode(q, k, v, sl, table)
        monkeypatch.setenv("TORCH_AURA_DECODE_STREAMK_CTAS_PER_SM", "2" if paged else "1")  # adaptive ignores it
        monkeypatch.setenv("TORCH_AURA_DECODE_SCHEDULE", "adaptive")
        got = torch_aura.flash_decode(q, k, v, sl, table)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (cap, want_schedule)
        check(f"adaptive-{cap}", *got, *oracle(q, k, v, sl, table), torch.bfloat16)


def test_dynamic_schedule_permuted_q_and_out_of_range_lengths(dynamic):
    q, k, v, sl, table = make_cache([300, 900], 8, 2, 128, torch.float16, page=16, poison_tail=False)
    q_view = q.transpose(0, 1).contiguous().transpose(0, 1)  # [B, Hq, D] with the head stride first
    out, lse = torch_aura.flash_decode(q_view, k, v, sl, table)
    check(f"{dynamic}-permuted-q", out, lse, *oracle(q, k, v, sl, table), torch.float16)
    sl.copy_(torch.tensor([10**6, -3], dtype=torch.int32))  # the kernel clamps: memory safe, no fault
    table[0, 0] = 10**6
    out, lse = torch.ops.aura.flash_decode(q, k, v, sl, table)
    torch.cuda.synchronize()
    assert out.shape == (2, 8, 128) and lse[1].isinf().all() and (out[1] == 0).all()


@pytest.mark.parametrize("layout", ("contig", "page16", "page7"))
@pytest.mark.parametrize("G", (1, 2, 5, 8), ids=lambda g: f"G{g}")
def test_d512_dim_split_kernel_and_the_one_warp_kernel(G, layout, monkeypatch):
    """D = 512 with tile copies runs four warps that split the dims (TORCH_AURA_DECODE_D512=auto/dims),
    or the one-warp CTA (warp); page 7 has no tile copies, so both names run the one-warp CTA. Each
    agrees with the oracle on ragged lengths around the 16-token steps, with 1, 3, 64 and the
    automatic split counts, and a permuted q (element-wise staging)."""
    page = None if layout == "contig" else int(layout[4:])
    lens = [0, 1, 15, 16, 17, 300, 1025]
    q, k, v, sl, table = make_cache(lens, 2 * G, 2, 512, torch.bfloat16, page=page, seed=G)
    q_perm = q.transpose(0, 1).contiguous().transpose(0, 1)  # same values, strides (D, B * D, 1)
    got = {}
    for kernel in ("dims", "warp"):
        monkeypatch.setenv("TORCH_AURA_DECODE_D512", kernel)
        for S in (1, 3, 64, 0):
            out, lse = torch_aura.flash_decode(q, k, v, sl, table, num_splits=S)
            check(f"D512-{kernel}-{layout}-S{S}", out, lse, *oracle(q, k, v, sl, table), torch.bfloat16)
            got[kernel, S] = out
        out, lse = torch_aura.flash_decode(q_perm, k, v, sl, table)
        check(f"D512-{kernel}-{layout}-q-permuted", out, lse, *oracle(q, k, v, sl, table), torch.bfloat16)
    for S in (1, 3, 64, 0):  # two kernels, one answer up to the order of the fp32 sums
        assert_close(f"D512-dims-vs-warp-S{S}", got["dims", S].float(), got["warp", S].float(), RATIO[torch.bfloat16])


@pytest.mark.parametrize("layout", ("contig", "page16"))
def test_d512_dim_split_kernel_fp16(layout):
    """The dim-split kernel's fp16 instantiation (MMA operands and output conversion per dtype)."""
    page = None if layout == "contig" else 16
    q, k, v, sl, table = make_cache([1, 16, 17, 2049], 8, 1, 512, torch.float16, page=page, seed=9)
    for S in (1, 5, 0):
        out, lse = torch_aura.flash_decode(q, k, v, sl, table, num_splits=S)
        check(f"D512-fp16-{layout}-S{S}", out, lse, *oracle(q, k, v, sl, table), torch.float16)


# (D, num_splits, capacity, lengths: the captured call's, then each replay's)
TILE_GRAPH_CASES = {
    "tiles-D128-S1": (128, 1, 1100, ([1100, 1, 517], [0, 1100, 33], [1099, 16, 17], [1, 2, 1024])),  # >= 16 steps/warp
    "dims-D512-auto": (512, 0, 700, ([700, 33], [0, 700], [699, 17], [16, 1])),  # split + merge
}


@pytest.mark.parametrize("case", list(TILE_GRAPH_CASES))
def test_tile_kernels_graph_replay_is_bitwise_eager(case):
    """The tile engine's tensor maps hold shapes and base pointers only: a captured call (the D = 128
    tile kernel with one split, D = 512's dim-split CTA with the automatic plan) follows new lengths
    and values in place, and each replay equals an eager call bit for bit."""
    D, S, T_cap, lens_seq = TILE_GRAPH_CASES[case]
    B, Hq, Hkv = len(lens_seq[0]), 8, 2
    q, k, v, sl, _ = make_cache(lens_seq[0], Hq, Hkv, D, torch.bfloat16, T_cap=T_cap, poison_tail=False)
    out = torch.empty(B, Hq, D, device=DEV, dtype=torch.bfloat16)
    lse = torch.empty(B, Hq, device=DEV)
    torch_aura.flash_decode_out(q, k, v, sl, None, None, S, out, lse)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.aura.flash_decode_out(q, k, v, sl, None, None, S, out, lse)
    g = torch.Generator(device="cpu").manual_seed(7)
    for lens in lens_seq[1:]:
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, generator=g))
        graph.replay()
        torch.cuda.synchronize()
        want_out, want_lse = torch_aura.flash_decode(q, k, v, sl, None, num_splits=S)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse), lens
        check(f"{case}-graph-{lens}", out, lse, *oracle(q, k, v, sl, None), torch.bfloat16)


@pytest.mark.parametrize("name, D, T_cap, num_splits", (("TORCH_AURA_DECODE_D512", 512, None, 1),
                                                        ("TORCH_AURA_DECODE_COPY", 64, 2048, 1),
                                                        ("TORCH_AURA_DECODE_SCHEDULE", 64, None, 0)))
def test_switch_variables_are_checked(name, D, T_cap, num_splits, monkeypatch):
    """A misspelt switch raises, naming the variable, on the path that reads it."""
    q, k, v, sl, table = make_cache([10], 4, 2, D, torch.bfloat16, T_cap=T_cap)
    monkeypatch.setenv(name, "fast")
    with pytest.raises(RuntimeError, match=name):
        torch.ops.aura.flash_decode(q, k, v, sl, table, None, num_splits)


def test_streamk_ctas_per_sm_is_checked(monkeypatch):
    """The stream-K grid's CTAs per SM: 1 or 2; anything else raises, naming the variable, when stream-K runs."""
    q, k, v, sl, table = make_cache([10], 4, 2, 128, torch.bfloat16)
    monkeypatch.setenv("TORCH_AURA_DECODE_SCHEDULE", "streamk")
    monkeypatch.setenv("TORCH_AURA_DECODE_STREAMK_CTAS_PER_SM", "3")
    with pytest.raises(RuntimeError, match="TORCH_AURA_DECODE_STREAMK_CTAS_PER_SM: expected one of 1, 2, got 3"):
        torch.ops.aura.flash_decode(q, k, v, sl, table, None, 0)


@pytest.mark.sanitize
def test_small_cases_for_compute_sanitizer():
    """A few small launches (every path: empty splits, S = 1, paged, the merge in the split kernel and
    the merge kernel, both copy engines) for memcheck/racecheck."""
    for layout in (None, 7, 16):  # contiguous and page 16: tile copies at D = 64 / 512; page 7: cp.async
        q, k, v, sl, table = make_cache([0, 1, 300, 77], 6, 2, 64, torch.bfloat16, page=layout, seed=1)
        for S in (0, 1, 3):
            out, lse = torch_aura.flash_decode(q, k, v, sl, table, num_splits=S)
            check(f"san-S{S}", out, lse, *oracle(q, k, v, sl, table), torch.bfloat16)
        # one split over 1040 tokens: >= 16 steps per warp, the bulk-copy engine (contiguous): 2-D
        # tiles, then rows
        q, k, v, sl, table = make_cache([1040, 5, 0], 4, 2, 64, torch.bfloat16, page=layout, T_cap=1040, seed=2)
        for copy in ("tiles", "rows"):
            with env("TORCH_AURA_DECODE_COPY", copy):
                out, lse = torch_aura.flash_decode(q, k, v, sl, table, num_splits=1)
            check(f"san-bulk-{copy}", out, lse, *oracle(q, k, v, sl, table), torch.bfloat16)
        # D = 512: the dim-split CTA (tile layouts) and the one-warp CTA, each staging its partials in
        # shared memory; 3 and 64 splits (512 KB of partials for 4 heads) merged by the merge kernel's
        # dim chunks; S = 1 stores the output directly
        q, k, v, sl, table = make_cache([300, 0, 17], 8, 2, 512, torch.bfloat16, page=layout, seed=3)
        for kernel, S in (("dims", 1), ("dims", 3), ("dims", 64), ("warp", 3), ("warp", 64)):
            with env("TORCH_AURA_DECODE_D512", kernel):
                out, lse = torch_aura.flash_decode(q, k, v, sl, table, num_splits=S)
            check(f"san-D512-{kernel}-S{S}", out, lse, *oracle(q, k, v, sl, table), torch.bfloat16)
        # the balanced schedule: plan kernel, persistent claims (more items than CTAs at D = 64), merge;
        # stream-K: pieces across units and sequences, and (3 steps) CTAs with nothing but a -inf row
        for lens, Hkv, D in (([0, 9000, 1, 9500], 4, 64), ([300, 0, 17], 2, 512), ([1, 0, 33], 2, 128)):
            q, k, v, sl, table = make_cache(lens, 2 * Hkv, Hkv, D, torch.bfloat16, page=layout, seed=5)
            for schedule in ("balanced", "streamk"):
                with env("TORCH_AURA_DECODE_SCHEDULE", schedule):
                    out, lse = torch_aura.flash_decode(q, k, v, sl, table)
                check(f"san-{schedule}-D{D}", out, lse, *oracle(q, k, v, sl, table), torch.bfloat16)
        # the CUDA-core kernel (fp32) with 5 splits, twice: nothing survives a call
        q, k, v, sl, table = make_cache([0, 1, 300, 77], 6, 2, 64, torch.float32, page=layout, seed=4)
        for _ in range(2):
            out, lse = torch_aura.flash_decode(q, k, v, sl, table, num_splits=5)
            check("san-fp32-S5", out, lse, *oracle(q, k, v, sl, table), torch.float32)
    torch.cuda.synchronize()
