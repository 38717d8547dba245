"""The GDN front end's reference (``causal_conv1d``, ``causal_conv1d_update``; ops.md §3b) against
independent oracles: ``torch.nn.functional.conv1d`` with left zero padding per sequence, and
transformers' own torch fallbacks (``causal_conv1d_fn`` / ``causal_conv1d_update`` of Qwen3-Next)
where transformers is installed. Plus the state contract: a prefill split anywhere and continued by
decode steps equals one pass over the whole sequence, state and outputs alike.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import torch_aura as ta
from torch_aura.reference import gdn as R


def _oracle(x, weight, bias, activation, context=None):
    """One sequence ``x [T, C]`` (fp64) with ``context [C, W-1]`` before it (zeros by default)."""
    C, W = weight.shape
    xs = x.double().transpose(0, 1)
    pad = torch.zeros(C, W - 1, dtype=torch.float64) if context is None else context.double()
    y = F.conv1d(torch.cat([pad, xs], 1)[None], weight.double()[:, None], None if bias is None else bias.double(),
                 groups=C)[0].transpose(0, 1)
    return F.silu(y) if activation else y


@pytest.mark.parametrize("W", [1, 2, 4, 8])
@pytest.mark.parametrize("activation", [None, "silu"])
def test_fixed_and_varlen_match_conv1d_per_sequence(W, activation):
    g = torch.Generator().manual_seed(W)
    C = 11
    weight, bias = torch.randn(C, W, generator=g), torch.randn(C, generator=g)
    x = torch.randn(3, 17, C, generator=g)
    y = ta.causal_conv1d(x, weight, bias, activation=activation)
    for b in range(3):
        assert (y[b].double() - _oracle(x[b], weight, bias, activation)).abs().max() < 1e-5
    lengths = [0, 1, W - 1, W, 9]  # empty, one token, shorter than the context, exactly it, longer
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    xv = torch.randn(1, sum(lengths), C, generator=g)
    yv = ta.causal_conv1d(xv, weight, bias, cu_seqlens=cu, activation=activation)
    for n in range(len(lengths)):
        bos, eos = int(cu[n]), int(cu[n + 1])
        if eos > bos:  # each sequence alone: no context leaks across a boundary
            assert (yv[0, bos:eos].double() - _oracle(xv[0, bos:eos], weight, bias, activation)).abs().max() < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_prefill_split_anywhere_then_decode_equals_one_pass(dtype):
    """Chunked prefill (4 + 3 tokens) with a state of S = 5 > W - 1, then single and multi-token
    updates: every output and the final state equal one pass over all 12 tokens."""
    g = torch.Generator().manual_seed(3)
    C, W, S = 9, 4, 5
    weight, bias = torch.randn(C, W, generator=g), torch.randn(C, generator=g)
    x = torch.randn(2, 12, C, generator=g).to(dtype)
    state0 = torch.randn(2, C, S, generator=g)
    whole_state = state0.clone()
    whole = ta.causal_conv1d(x, weight, bias, whole_state, activation="silu")
    state = state0.clone()
    parts = [ta.causal_conv1d(x[:, :4], weight, bias, state, activation="silu"),
             ta.causal_conv1d(x[:, 4:7], weight, bias, state, activation="silu"),
             ta.causal_conv1d_update(x[:, 7], state, weight, bias, "silu")[:, None],
             ta.causal_conv1d_update(x[:, 8:12], state, weight, bias, "silu")]
    # fp32 sums in another order where the calls split the sequence: a rounding of the output dtype
    rtol = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(torch.cat(parts, 1).float(), whole.float(), rtol=rtol, atol=rtol)
    assert torch.equal(state, whole_state)  # states are copies of inputs: exact
    # the state holds the last S inputs (fp32 pool, exact copies of the inputs)
    assert torch.equal(state[:, :, -S:], x[:, -S:].float().transpose(1, 2))
    # the first W - 1 outputs read the initial state's last W - 1 inputs
    ref0 = _oracle(x[0].float(), weight, bias, "silu", context=state0[0, :, -(W - 1):])
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (whole[0].double() - ref0).abs().max() < tol * max(1.0, ref0.abs().max().item())


def test_short_sequence_shifts_the_old_state_in():
    """A sequence shorter than S keeps the newest of its old state entries before its own inputs."""
    C, W, S = 3, 2, 4
    weight = torch.ones(C, W)
    state = torch.arange(C * S, dtype=torch.float32).reshape(1, C, S)
    x = torch.full((1, 2, C), -1.0)
    ta.causal_conv1d(x, weight, conv_state=state)
    expected = torch.tensor([[2.0, 3.0, -1.0, -1.0], [6.0, 7.0, -1.0, -1.0], [10.0, 11.0, -1.0, -1.0]])
    assert torch.equal(state[0], expected)


def test_update_pool_rows_skip_and_data_errors():
    g = torch.Generator().manual_seed(5)
    C, W = 6, 3
    weight = torch.randn(C, W, generator=g)
    pool = torch.randn(4, C, 2, generator=g)
    before = pool.clone()
    x = torch.randn(3, C, generator=g)
    y = ta.causal_conv1d_update(x, pool, weight, None, None, torch.tensor([2, -1, 0], dtype=torch.int32))
    assert bool((y[1] == 0).all()) and torch.equal(pool[[1, 3]], before[[1, 3]])
    for n, row in ((0, 2), (2, 0)):
        expect = _oracle(x[n][None], weight, None, None, context=before[row])
        assert (y[n].double() - expect[0]).abs().max() < 1e-5
        assert torch.equal(pool[row], torch.cat([before[row], x[n][:, None]], 1)[:, -2:])
    with pytest.raises(ValueError, match="state_indices: expected distinct pool rows"):
        ta.causal_conv1d_update(x, pool, weight, None, None, torch.tensor([1, 1, -1], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"state_indices: expected pool rows in \[0, 4\)"):
        ta.causal_conv1d_update(x, pool, weight, None, None, torch.tensor([4, 0, -1], dtype=torch.int32))


def test_a_transposed_pool_is_written_in_place_like_a_row_major_one():
    """vLLM keeps its conv pool as ``[P, W - 1, C]`` and hands it over transposed: the ops read and roll it
    through its strides, with the outputs and rows of a ``[P, C, S]`` pool of the same values."""
    g = torch.Generator().manual_seed(8)
    C, W, S, P = 6, 4, 3, 5
    weight, bias = torch.randn(C, W, generator=g), torch.randn(C, generator=g)
    storage = torch.randn(P, S, C, generator=g)
    pool, rows_major = storage.transpose(1, 2), storage.transpose(1, 2).contiguous()
    idx = torch.tensor([4, -1, 1], dtype=torch.int32)
    for x in (torch.randn(3, C, generator=g), torch.randn(3, 2, C, generator=g)):
        y = ta.causal_conv1d_update(x, pool, weight, bias, "silu", idx)
        assert torch.equal(y, ta.causal_conv1d_update(x, rows_major, weight, bias, "silu", idx))
        assert torch.equal(pool, rows_major) and pool.data_ptr() == storage.data_ptr()
    state = torch.randn(2, S, C, generator=g).transpose(1, 2)
    state_rows = state.contiguous()
    x = torch.randn(2, 5, C, generator=g)
    assert torch.equal(ta.causal_conv1d(x, weight, bias, state, activation="silu"),
                       ta.causal_conv1d(x, weight, bias, state_rows, activation="silu"))
    assert torch.equal(state, state_rows)


def test_a_pool_whose_rows_alias_is_refused():
    """A zero stride would make two rows (or entries) one memory location that the op writes twice."""
    C, W = 4, 3
    aliased = torch.zeros(1, C, 2).expand(3, C, 2)
    with pytest.raises(ValueError, match=r"conv_state: expected a tensor whose elements do not alias"):
        ta.causal_conv1d_update(torch.randn(3, C), aliased, torch.randn(C, W))
    with pytest.raises(ValueError, match=r"conv_state: expected a tensor whose elements do not alias"):
        ta.causal_conv1d(torch.randn(3, 4, C), torch.randn(C, W), conv_state=aliased)


def test_update_with_no_new_token_changes_nothing():
    pool = torch.randn(2, 4, 3)
    before = pool.clone()
    y = ta.causal_conv1d_update(torch.randn(2, 0, 4), pool, torch.randn(4, 3))
    assert y.shape == (2, 0, 4) and torch.equal(pool, before)


def test_argument_errors_are_named():
    x, w = torch.randn(1, 5, 4), torch.randn(4, 3)
    cases = [
        (dict(weight=torch.randn(4, 9)), r"weight: expected W \(taps, weight.shape\[1\]\) in 1..8"),
        (dict(weight=torch.randn(5, 3)), r"weight: expected shape \[4, \*\]"),
        (dict(conv_state=torch.zeros(1, 4, 1)), r"conv_state: expected S = shape\[2\] >= max\(W - 1, 1\) = 2"),
        (dict(activation="relu"), "activation: expected one of"),
        (dict(cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32)), "cu_seqlens: expected non-decreasing offsets"),
        (dict(bias=torch.randn(3)), r"bias: expected shape \[4\]"),
    ]
    for kw, match in cases:
        args = dict(x=x, weight=w) | kw
        with pytest.raises(ValueError, match=match):
            ta.causal_conv1d(**args)
    with pytest.raises(ValueError, match="x: expected a unit stride"):
        ta.causal_conv1d(torch.randn(1, 4, 5).transpose(1, 2), w)


def test_matches_transformers_torch_fallbacks(hf_transformers_or_skip):
    """What transformers' Qwen3-Next computes without the causal_conv1d package, on its
    channels-first layout: prefill over a sequence, then its in-place state update."""
    m = hf_transformers_or_skip
    fallback_fn = getattr(m.causal_conv1d_fn, "__wrapped__", m.causal_conv1d_fn)
    fallback_update = getattr(m.causal_conv1d_update, "__wrapped__", m.causal_conv1d_update)
    g = torch.Generator().manual_seed(7)
    B, T, C, W = 2, 13, 12, 4
    weight, bias = torch.randn(C, W, generator=g), torch.randn(C, generator=g)
    x = torch.randn(B, T, C, generator=g)
    theirs = fallback_fn(x.transpose(1, 2), weight, bias, activation="silu").transpose(1, 2)
    ours = ta.causal_conv1d(x, weight, bias, activation="silu")
    assert (ours - theirs).abs().max() < 1e-5
    state_theirs, state_ours = torch.randn(B, C, W, generator=g), None
    state_ours = state_theirs.clone()
    new = torch.randn(B, 1, C, generator=g)
    theirs = fallback_update(new.transpose(1, 2), state_theirs, weight, bias, "silu").transpose(1, 2)
    ours = ta.causal_conv1d_update(new, state_ours, weight, bias, "silu")
    assert (ours - theirs).abs().max() < 1e-5 and torch.equal(state_ours, state_theirs)


@pytest.fixture
def hf_transformers_or_skip():
    pytest.importorskip("transformers")
    import transformers.models.qwen3_next.modeling_qwen3_next as m

    return m


def test_nan_input_reaches_only_its_window():
    weight = torch.ones(2, 3)
    x = torch.zeros(1, 8, 2)
    x[0, 3, 1] = math.nan
    y = ta.causal_conv1d(x, weight)
    bad = y.isnan()
    assert bad[0, 3:6, 1].all() and int(bad.sum()) == 3  # tokens 3..5 of channel 1 read it
