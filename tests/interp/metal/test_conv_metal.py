"""The GDN front end's causal conv (csrc/mps/shaders/gdn_conv.metal) under the emulator vs the
reference: widths 1..8, states longer than the context, sequences a thread holds whole (its state
row rolled in place) or split over token tiles (rolled by a second dispatch, after every context
read), varlen batches with empty and short sequences, strided views, the update op's pool with
skipped rows, state pools of any strides (vLLM's [P, S, C] pool handed over transposed), NaN and
inf, and data the reference rejects, which must never fault."""

import math
import re

import pytest
import torch

import _metal
from _compare import check_op, reference_results
from _util import dtype_id

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# a sequence of up to this many tokens is one thread's (one dispatch), a longer one spans tiles (two)
TILE = int(re.search(r"kConvTokenTile = (\d+)", (_metal.MPS_SRC / "shaders" / "aura_params.h").read_text())[1])


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _weights(C, W, seed, dtype=torch.float32):
    g = _gen(seed)
    return torch.randn(C, W, generator=g).to(dtype), torch.randn(C, generator=g).to(dtype)


def _transposed_pool(rows, C, S, seed, dtype=torch.float32):
    """conv_state as vLLM stores it: a [rows, S, C] buffer handed over as [rows, C, S], strides
    (S * C, 1, C): the entries of a state row are C apart, the channels adjacent."""
    return torch.randn(rows, S, C, generator=_gen(seed)).to(dtype).transpose(1, 2)


def _check_pool(emu, name, args, untouched=(), **kw):
    """check_op, then the pool written through its strides equals the reference's bit for bit (the
    state takes copies of inputs) and the `untouched` rows kept their values. Returns (y, pool)."""
    pool = args[1 if name == "causal_conv1d_update" else 3]
    y, after = check_op(emu, name, args, **kw)
    assert after.stride() == pool.stride()  # the emulator wrote the view, not a contiguous copy
    _, ref_after = reference_results(name, args)
    assert torch.equal(after, ref_after)
    assert torch.equal(after[list(untouched)], pool[list(untouched)])
    return y, after


def _strided_x(B, T, C, dtype, seed):
    """x as a channel slice of a wider token-major tensor, every other token: strides over B and
    T are not those of a contiguous [B, T, C], the channel stride is 1."""
    return torch.randn(B, 2 * T, C + 5, generator=_gen(seed))[:, ::2, 3:3 + C].to(dtype)


@pytest.mark.parametrize("T", [5, 40], ids=lambda T: f"T{T}-{'whole' if T <= TILE else 'tiles'}")
@pytest.mark.parametrize("W", [1, 2, 3, 4, 8])
def test_prefill_every_width_with_a_longer_state(emu, W, T):
    C, S = 9, max(W - 1, 1) + 2
    x = _strided_x(2, T, C, torch.float32, seed=W)
    w, b = _weights(C, W, seed=10 + W)
    state = torch.randn(2, C, S, generator=_gen(W))
    check_op(emu, "causal_conv1d", (x, w, b, state, None, "silu"))
    assert emu.last_launches == (1 if T <= TILE else 2)
    check_op(emu, "causal_conv1d", (x, w, None, None, None, None), orders=("shuffled",))  # zero context
    assert emu.last_launches == 1
    exact = torch.randn(2, C, max(W - 1, 1), generator=_gen(W + 1))  # S = W - 1: the context is the whole row
    check_op(emu, "causal_conv1d", (x, w, b, exact, None, "swish"), orders=("reverse",))


@pytest.mark.parametrize("state_dtype", FLOATS, ids=dtype_id)
@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_id)
def test_dtypes_of_x_state_and_weights(emu, dtype, state_dtype):
    # weight and bias are read in their own dtypes (a runtime switch): each combination once
    w_dtype = FLOATS[(FLOATS.index(dtype) + FLOATS.index(state_dtype)) % 3]
    C, W = 20, 4
    x = _strided_x(1, 30, C, dtype, seed=3)
    w, b = _weights(C, W, seed=4, dtype=w_dtype)
    state = torch.randn(3, C, 6, generator=_gen(5)).to(state_dtype)
    cu = torch.tensor([0, 7, 7, 30], dtype=torch.int32)
    check_op(emu, "causal_conv1d", (x, w, b.to(FLOATS[FLOATS.index(w_dtype) - 1]), state, cu, "silu"),
             orders=("forward", "shuffled"))
    assert emu.last_launches == 2


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64], ids=dtype_id)
def test_varlen_empty_short_and_tile_straddling_sequences(emu, cu_dtype):
    # empty first, middle and last sequences, ones shorter than the context and than the state,
    # starts in the middle of a token tile, one sequence over several tiles
    lengths = [0, 1, 2, 0, 19, 3, 2 * TILE + 8, 0]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=cu_dtype)
    C, W, S = 13, 4, 5
    x = _strided_x(1, sum(lengths), C, torch.float32, seed=6)
    w, b = _weights(C, W, seed=7)
    state = torch.randn(len(lengths), C, S, generator=_gen(8))
    before = state.clone()
    _, after = check_op(emu, "causal_conv1d", (x, w, b, state, cu, "silu"))
    assert emu.last_launches == 2
    empty = [n for n, L in enumerate(lengths) if L == 0]
    assert torch.equal(after[empty], before[empty])  # an empty sequence leaves its row untouched
    check_op(emu, "causal_conv1d", (x, w, b, None, cu, None), orders=("shuffled",))
    assert emu.last_launches == 1


@pytest.mark.parametrize("L", [None, 3, TILE + 4], ids=lambda L: "x2d" if L is None else f"L{L}")
@pytest.mark.parametrize("W", [1, 4])
def test_update_pool_rows_skips_and_tokens(emu, W, L):
    C, S, N = 10, 5, 4
    shape = (N, C) if L is None else (N, L, C)
    x = torch.randn(*shape[:-1], C + 2, generator=_gen(W))[..., 1:1 + C]  # unit channel stride only
    w, b = _weights(C, W, seed=20 + W)
    pool = torch.randn(6, C, S, generator=_gen(21))
    idx = torch.tensor([5, -1, 0, 2], dtype=torch.int32)
    y, after = check_op(emu, "causal_conv1d_update", (x, pool, w, b, "silu", idx))
    assert emu.last_launches == (1 if (L or 1) <= TILE else 2)
    assert torch.equal(y[1], torch.zeros_like(y[1]))  # skipped: y rows 0
    untouched = [1, 3, 4]  # never indexed, or only by the skip
    assert torch.equal(after[untouched], pool[untouched])
    check_op(emu, "causal_conv1d_update", (x.bfloat16(), pool[:N].clone(), w, None, None, None),
             orders=("shuffled",))  # row n without indices


@pytest.mark.parametrize("L", [None, 3, TILE + 4], ids=lambda L: "x2d" if L is None else f"L{L}")
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_update_transposed_pool(emu, state_dtype, L):
    C, S, N, W = 10, 5, 4, 4
    shape = (N, C) if L is None else (N, L, C)
    x = torch.randn(*shape, generator=_gen(70))
    w, b = _weights(C, W, seed=71)
    pool = _transposed_pool(6, C, S, seed=72, dtype=state_dtype)
    idx = torch.tensor([5, -1, 0, 2], dtype=torch.int32)
    y, _ = _check_pool(emu, "causal_conv1d_update", (x, pool, w, b, "silu", idx), untouched=[1, 3, 4])
    assert emu.last_launches == (1 if (L or 1) <= TILE else 2)
    assert torch.equal(y[1], torch.zeros_like(y[1]))  # skipped: y rows 0
    _check_pool(emu, "causal_conv1d_update", (x, _transposed_pool(N, C, S, seed=73), w, None, None, None),
                orders=("shuffled",))  # row n without indices


@pytest.mark.parametrize("T", [5, 40], ids=lambda T: f"T{T}-{'whole' if T <= TILE else 'tiles'}")
@pytest.mark.parametrize("W", [2, 4, 8])
def test_prefill_transposed_state(emu, W, T):
    # the whole-sequence thread rolls the row itself, the tiled path in a second dispatch
    C, S = 9, W + 1
    x = _strided_x(2, T, C, torch.float32, seed=80 + W)
    w, b = _weights(C, W, seed=81)
    _check_pool(emu, "causal_conv1d", (x, w, b, _transposed_pool(2, C, S, seed=82), None, "silu"))
    assert emu.last_launches == (1 if T <= TILE else 2)


def test_prefill_varlen_transposed_state(emu):
    lengths = [0, 1, 2, 19, 0, 2 * TILE + 8, 3]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    C, W, S = 13, 4, 5
    x = _strided_x(1, sum(lengths), C, torch.float32, seed=90)
    w, b = _weights(C, W, seed=91)
    state = _transposed_pool(len(lengths), C, S, seed=92, dtype=torch.float16)
    empty = [n for n, L in enumerate(lengths) if L == 0]  # an empty sequence leaves its row untouched
    _check_pool(emu, "causal_conv1d", (x, w, b, state, cu, "silu"), untouched=empty)
    assert emu.last_launches == 2


def test_zero_stride_state_is_refused(emu):
    # an expanded state: every row and entry the same memory, written concurrently
    C, S = 4, 3
    x = torch.randn(1, 6, C)
    w, b = _weights(C, 4, seed=95)
    aliased = torch.zeros(1, C, 1).expand(4, C, S)
    message = r"conv_state: expected a tensor whose elements do not alias \(no zero stride"
    with pytest.raises(_metal.EmulatorError, match=message):
        emu.run_op("causal_conv1d_update", x[0, :4], aliased, w, b)
    with pytest.raises(_metal.EmulatorError, match=message):
        emu.run_op("causal_conv1d", x, w, b, aliased[:1])
    # a zero stride on a dim of size 1 aliases nothing (run on the view itself: check_op clones)
    one = torch.randn(C, S).as_strided((1, C, S), (0, S, 1))
    y_ref, state_ref = reference_results("causal_conv1d", (x, w, b, one, None, None))
    torch.testing.assert_close(emu.run_op("causal_conv1d", x, w, b, one, None, None), y_ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(one, state_ref)


def test_prefill_then_decode_equals_one_pass(emu):
    # split a 12-token prefill 4 + 3, then 1 and 4 tokens of decode: every y and the final state
    # equal one pass (the kernels chained through their own state rows)
    C, W, S = 9, 4, 5
    x = torch.randn(2, 12, C, generator=_gen(30))
    w, b = _weights(C, W, seed=31)
    state0 = torch.randn(2, C, S, generator=_gen(32))
    whole_state = state0.clone()
    whole = emu.run_op("causal_conv1d", x, w, b, whole_state, None, "silu")
    state = state0.clone()
    parts = [emu.run_op("causal_conv1d", x[:, :4], w, b, state, None, "silu"),
             emu.run_op("causal_conv1d", x[:, 4:7], w, b, state, None, "silu"),
             emu.run_op("causal_conv1d_update", x[:, 7], state, w, b, "silu")[:, None],
             emu.run_op("causal_conv1d_update", x[:, 8:], state, w, b, "silu")]
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=1e-6, atol=1e-6)
    assert torch.equal(state, whole_state)


def test_nan_and_inf_reach_only_their_window(emu):
    # an inf older than the window meets a zero tap only in a padded formulation: it must not
    # turn into NaN; y and the state rows are non-finite exactly where the reference's are
    C, W = 6, 3
    x = torch.randn(1, 20, C, generator=_gen(40))
    x[0, 2, 1], x[0, 9, 4], x[0, 18, 0] = math.inf, math.nan, -math.inf
    w, b = _weights(C, W, seed=41)
    state = torch.randn(1, C, 7, generator=_gen(42))
    state[0, 3, -1] = math.inf  # context of the first token only
    y, _ = check_op(emu, "causal_conv1d", (x, w, b, state, None, None), orders=("forward",))
    reach = torch.zeros(20, C, dtype=torch.bool)
    reach[2:2 + W, 1] = reach[9:9 + W, 4] = reach[18:, 0] = reach[:W - 1, 3] = True
    assert torch.equal(~torch.isfinite(y[0]), reach)


def test_bad_offsets_and_pool_rows_never_fault(emu):
    # direct calls with data the reference rejects: offsets past T or going backwards, rows past
    # the pool; every tensor sits before a guard page, so any access out of bounds is an error
    C, W = 5, 4
    x = torch.randn(1, 9, C, generator=_gen(50))
    w, b = _weights(C, W, seed=51)
    for cu in ([0, 7, 3, 10**6], [5, 2, 9, 9], [0, -4, 9, 9]):
        emu.run_op("causal_conv1d", x, w, b, torch.randn(3, C, 3), torch.tensor(cu, dtype=torch.int32), "silu")
    pool = torch.randn(2, C, 3)
    before = pool.clone()
    y = emu.run_op("causal_conv1d_update", x[0, :3], pool, w, b, None, torch.tensor([10**6, -7, 1], dtype=torch.int32))
    assert torch.equal(y[:2], torch.zeros(2, C)) and torch.equal(pool[0], before[0])
    assert not torch.equal(pool[1], before[1])


def test_plan_rejects_bad_input_by_name(emu):
    x = torch.randn(1, 6, 4)
    w, b = _weights(4, 4, seed=60)
    state = torch.randn(1, 4, 3)
    bad = [(("causal_conv1d", x, torch.randn(4, 9), b), r"weight: expected W \(taps, weight.shape\[1\]\) in 1..8"),
           (("causal_conv1d", x, w, b, torch.randn(1, 4, 2)), r"conv_state: expected S = shape\[2\] >= max"),
           (("causal_conv1d", x, w, b, state, None, "relu"), r"activation: expected None, \"silu\" or \"swish\""),
           (("causal_conv1d", x, w, b, torch.randn(2, 4, 3)), r"conv_state.shape\[0\]: expected 1"),
           (("causal_conv1d", x.expand(2, 6, 4), w, b, None, torch.tensor([0, 6], dtype=torch.int32)),
            r"x: expected batch size B == 1"),
           (("causal_conv1d_update", x[0], state, w, b, None, torch.zeros(12, dtype=torch.int32)[::2]),
            r"state_indices: expected a unit stride"),
           (("causal_conv1d_update", x[0], state, w), r"conv_state: expected at least N = 6 pool rows")]
    for args, message in bad:
        with pytest.raises(_metal.EmulatorError, match=message):
            emu.run_op(*args)
