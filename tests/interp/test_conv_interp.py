"""The causal conv kernels (triton_kernels/gdn/conv.py) under the Triton interpreter against the reference:
every sample of both ops, each prefill case through both prefill kernels (taps and window); lengths around the
left context and the token tiles (T = 0, 1, W - 1, W, BT - 1, BT, BT + 1, for both kernels' BT) for W in
{1, 2, 4, 8}; varlen with empty, one-token and block-spanning sequences; strided views; two channel blocks;
the decode step at three channel blocks; mixed dtypes; states wider than the context and in vLLM's transposed
pool layout; pools with skipped rows. fp32 and fp16: bf16 samples run upcast (the interpreter's bf16 math is
wrong)."""

import _samples
import pytest
import torch
from _conv_check import case_id, check_case, check_op, check_pool_prefill, conv_args, update_args

from torch_aura.triton_kernels.gdn import conv

F32, F16 = torch.float32, torch.float16
BT = conv.CONV_BT


@pytest.fixture(autouse=True, params=["taps", "window"])
def prefill_kernel(request, monkeypatch):
    """Every case through both prefill kernels (the window one takes W <= 4, the taps one the rest)."""
    monkeypatch.setattr(conv, "PREFILL_KERNEL", request.param)
    return request.param


def _upcast(a):
    return a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a


@pytest.mark.parametrize("name", ["causal_conv1d", "causal_conv1d_update"])
def test_samples_match_reference(name):
    for sample in _samples.all_samples()[name]("cpu"):
        check_op(conv, name, tuple(map(_upcast, sample.args)))


# B = 2, C = 9 (a partial channel block), a state one entry wider than the context plus one
LENGTH_CASES = [dict(W=W, T=T) for W in (1, 2, 4, 8)
                for T in sorted({0, 1, W - 1, W} | {n + d for n in (BT, conv.WINDOW_BT) for d in (-1, 0, 1)})]


@pytest.mark.parametrize("case", LENGTH_CASES, ids=map(case_id, LENGTH_CASES))
def test_lengths_around_context_and_tile(case):
    W, T = case["W"], case["T"]
    check_op(conv, "causal_conv1d", conv_args("cpu", 2, T, 9, W, F32, S=max(W - 1, 1) + 1, seed=W * 100 + T))


def _offsets(lengths):
    return [0, *torch.tensor(lengths).cumsum(0).tolist()]


CONV_CASES = [
    # several token blocks without a state: zeros before the first token
    dict(B=2, T=2 * BT + 5, C=9, W=4, dtype=F16, activation=None),
    # varlen: empty sequences first, inside and last; shorter than the context, exactly it, across blocks
    dict(B=1, T=51, C=10, W=4, dtype=F16, offsets=[0, 0, 3, 3, 43, 44, 51, 51], S=5),
    dict(B=1, T=2 * BT + 4, C=6, W=4, dtype=F32, offsets=[0, BT - 1, BT + 1, 2 * BT + 4], S=3, state_dtype=F16),
    # 40 sequences of 0-3 tokens (a deep search, many in one block), the widest filter, no bias, int64 offsets
    dict(B=1, T=60, C=5, W=8, dtype=F32, offsets=_offsets([0, 1, 3, 2] * 10), S=7, bias=False, activation=None,
         cu_dtype=torch.int64),
    dict(B=1, T=45, C=7, W=2, dtype=F16, offsets=[0, 1, 1, 2, 5, 45]),
    # two channel blocks (BC = 128), the second partial
    dict(B=1, T=40, C=136, W=4, dtype=F16, S=4),
    # arbitrary strides: every other token of a time-major buffer
    dict(B=3, T=37, C=12, W=3, dtype=F32, S=4, activation="swish", layout="strided"),
    # everything 16-bit: weight, bias and state in x's dtype
    dict(B=2, T=20, C=16, W=4, dtype=F16, S=4, state_dtype=F16, weight_dtype=F16, layout="contiguous"),
    dict(B=0, T=5, C=8, W=4, dtype=F32, S=3),
    # vLLM's conv pool layout: the state a transposed view of [N, S, C]; varlen across blocks, and fixed length
    dict(B=1, T=2 * BT + 4, C=10, W=4, dtype=F16, offsets=[0, 2, BT + 1, 2 * BT + 4], S=3, state_layout="transposed"),
    dict(B=2, T=BT + 3, C=136, W=4, dtype=F32, S=5, state_layout="transposed"),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=map(case_id, CONV_CASES))
def test_conv_matches_reference(case):
    check_case(conv, "cpu", "causal_conv1d", case)


@pytest.mark.parametrize("geometry", [(8, 128, 2), (16, 256, 1), (64, 512, 4)], ids=lambda g: "x".join(map(str, g)))
def test_window_kernel_at_other_program_shapes(geometry, monkeypatch, prefill_kernel):
    """The window kernel at the (tokens, channels, warps) per program bench_vllm_gdn_ops.py --conv-kernels may
    time: packed sequences across token blocks, a state, two channel blocks."""
    if prefill_kernel != "window":
        pytest.skip("the window kernel's own geometry")
    monkeypatch.setattr(conv, "WINDOW_BT", geometry[0])
    monkeypatch.setattr(conv, "WINDOW_BC", geometry[1])
    monkeypatch.setattr(conv, "WINDOW_WARPS", geometry[2])
    for case in (dict(B=1, T=75, C=136, W=4, dtype=F32, offsets=[0, 3, 40, 75], S=3, state_layout="transposed"),
                 dict(B=2, T=33, C=600, W=3, dtype=F16, S=4)):
        check_case(conv, "cpu", "causal_conv1d", case)


UPDATE_CASES = [
    dict(N=3, L=1, C=10, W=4, S=4, P=5, dtype=F32, rows=[3, -1, 0], one_token=True),
    dict(N=2, L=3, C=10, W=4, S=3, P=2, dtype=F16),  # no indices: row n; S = W - 1
    dict(N=2, L=5, C=12, W=2, S=1, P=4, dtype=F32, rows=[1, 3]),  # more tokens than the state holds
    dict(N=4, L=1, C=9, W=1, S=1, P=4, dtype=F16, rows=[-1, 2, 0, 1], one_token=True, activation="swish"),
    dict(N=3, L=2, C=20, W=8, S=10, P=12, dtype=F32, rows=[-1, 11, 4]),
    dict(N=2, L=1, C=136, W=4, S=4, P=3, dtype=F16, rows=[2, 0], pool_dtype=F16),  # three channel blocks
    dict(N=2, L=2, C=10, W=4, S=6, P=2, dtype=F16, bias=False, activation=None),
    dict(N=0, L=1, C=10, W=4, S=4, P=2, dtype=F32),
    # vLLM's conv pool layout ([P, S, C] seen as [P, C, S]): one token with skipped rows, several tokens
    dict(N=3, L=1, C=136, W=4, S=3, P=5, dtype=F16, rows=[4, -1, 1], one_token=True, pool_layout="transposed"),
    dict(N=2, L=5, C=10, W=4, S=3, P=3, dtype=F32, rows=[2, 0], pool_dtype=F16, pool_layout="transposed"),
]


@pytest.mark.parametrize("block", [(16, 1), (64, 2), (conv.UPDATE_BC, conv.UPDATE_WARPS), (512, 4)],
                         ids=lambda b: "BC{}x{}".format(*b))
@pytest.mark.parametrize("case", UPDATE_CASES, ids=map(case_id, UPDATE_CASES))
def test_update_matches_reference(case, block, monkeypatch):
    """At the decode conv's channels and warps per program and at those bench_vllm_gdn_ops.py
    --conv-update-blocks may time."""
    monkeypatch.setattr(conv, "UPDATE_BC", block[0])
    monkeypatch.setattr(conv, "UPDATE_WARPS", block[1])
    check_case(conv, "cpu", "causal_conv1d_update", case)


POOL_CASES = [  # (offsets, C, W, S, dtype, rows, has): vLLM's prefill step over its state pool
    # the null slot and padding (each with has_state set: neither may be read nor written), a request without
    # a state (zero context, its row written), an empty sequence
    ([0, 5, 9, 40, 41, 41], 10, 4, 3, F32, [3, 0, 5, -1, 1], [True, True, False, True, True]),
    ([0, 2 * BT + 3], 136, 4, 3, F16, [2], [False]),  # a new request: zero context, its row written
    ([0, 1, BT + 1, BT + 7], 20, 3, 4, F32, [4, 1, 6], [True, True, False]),  # S wider than the context
    ([0, 9, 18], 12, 8, 7, F16, [-1, 2], [True, True]),  # W = 8 (the taps kernel for either setting)
    # new requests shorter than the state: the rolled row keeps zeros, not the pool row's old entries
    ([0, 1, 3, 10], 16, 4, 3, F32, [2, 4, 1], [False, False, True]),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=[f"seqs{len(c[0]) - 1}-C{c[1]}-W{c[2]}" for c in POOL_CASES])
def test_prefill_serves_a_state_pool_in_place(case):
    """The launcher's pool form (state_indices=, has_state=, null=) equals the plain form around a gather and
    a scatter (``_conv_check.check_pool_prefill``), through both prefill kernels."""
    check_pool_prefill(conv, "cpu", *case)


def test_prefill_pool_form_refuses_bad_rows_by_name():
    """The pool form's own arguments are checked before anything runs: the flags' dtype and length, the rows'."""
    x, weight, bias, _, cu, act = conv_args("cpu", 1, 10, 8, 4, F32, offsets=[0, 4, 10])
    pool = torch.zeros(5, 8, 3)
    idx = torch.tensor([1, 3], dtype=torch.int32)
    for bad, name in ((dict(state_indices=idx, has_state=torch.tensor([1, 0])), "has_state"),
                      (dict(state_indices=idx, has_state=torch.tensor([True])), "has_state"),
                      (dict(state_indices=idx.long()), "state_indices"),
                      (dict(state_indices=torch.tensor([1, 2, 3], dtype=torch.int32)), "state_indices")):
        before = pool.clone()
        with pytest.raises(ValueError, match=name):
            conv.causal_conv1d(x, weight, bias, pool, cu, act, **bad)
        assert torch.equal(pool, before)


@pytest.mark.parametrize("null", [0, 3])
def test_update_null_slot_skips_like_minus_one(null):
    """The launcher's ``null=`` (a serving engine's null slot, passed untranslated): that slot is neither read nor
    written and its outputs are zeros, exactly as if it were -1."""
    x, pool, weight, bias, act, idx = update_args("cpu", 4, 1, 20, 4, 3, 6, F32, rows=[2, null, 5, -1], one_token=True)
    as_minus_one = torch.where(idx == null, -1, idx).to(torch.int32)
    pool_a, pool_b = pool.clone(), pool.clone()
    want = conv.causal_conv1d_update(x, pool_a, weight, bias, act, as_minus_one)
    got = conv.causal_conv1d_update(x, pool_b, weight, bias, act, idx, null=null)
    assert torch.equal(got, want) and torch.equal(pool_a, pool_b) and torch.equal(pool_b[null], pool[null])
    assert not got[1].any()


def test_update_without_tokens_leaves_the_pool():
    x, pool, weight, bias, act, idx = update_args("cpu", 2, 0, 10, 4, 4, 3, F32, rows=[2, 0])
    before = pool.clone()
    assert conv.causal_conv1d_update(x, pool, weight, bias, act, idx).shape == (2, 0, 10)
    assert torch.equal(pool, before)
    check_case(conv, "cpu", "causal_conv1d_update", dict(N=2, L=0, C=10, W=4, S=4, P=3, dtype=F32))


def test_prefill_then_decode_continues_the_sequence():
    """A prefill that leaves a state and decode steps from it: the same outputs and state as one pass."""
    x, weight, bias, state, _, act = conv_args("cpu", 2, 40, 9, 4, F32, S=5, seed=7)
    whole_state = state.clone()
    whole = conv.causal_conv1d(x, weight, bias, whole_state, None, act)
    parts = [conv.causal_conv1d(x[:, :BT + 3], weight, bias, state, None, act),
             conv.causal_conv1d_update(x[:, BT + 3], state, weight, bias, act)[:, None],
             conv.causal_conv1d_update(x[:, BT + 4:], state, weight, bias, act)]
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=1e-6, atol=1e-6)
    assert torch.equal(state, whole_state)


def test_duplicate_pool_rows_rejected_in_debug_mode(monkeypatch):
    monkeypatch.setenv("TORCH_AURA_DEBUG", "1")
    x, pool, weight, bias, act, _ = update_args("cpu", 2, 1, 10, 4, 4, 4, F32)
    with pytest.raises(ValueError, match="distinct"):
        conv.causal_conv1d_update(x, pool, weight, bias, act, torch.tensor([1, 1], dtype=torch.int32))
