"""``_checks.common.remembered``: launcher checks (GDN, the decode wrappers) run once per metadata."""

import pytest
import torch

from torch_aura._checks import gdn as gdn_checks
from torch_aura._checks.common import remembered


def _counting(fail_on=None):
    calls = []

    def check(x, scale):
        calls.append((tuple(x.shape), x.stride(), x.dtype, scale))
        if fail_on is not None and fail_on(x, scale):
            raise ValueError("x: expected something else")
        return ["spec", x.dtype]

    return check, calls


def test_same_metadata_checks_once_and_returns_the_first_spec():
    check, calls = _counting()
    run = remembered(check)
    a, b = torch.zeros(3, 4), torch.ones(3, 4)  # other data, same metadata
    assert run(a, 1.0) == ["spec", torch.float32]
    assert run(b, 1.0) == ["spec", torch.float32]
    assert len(calls) == 1


@pytest.mark.parametrize("other", [
    lambda: (torch.zeros(3, 5), 1.0),                # shape
    lambda: (torch.zeros(4, 3).t(), 1.0),            # strides
    lambda: (torch.zeros(3, 4, dtype=torch.float16), 1.0),  # dtype
    lambda: (torch.zeros(3, 4), 0.5),                # a non-tensor argument
])
def test_any_metadata_change_checks_again(other):
    check, calls = _counting()
    run = remembered(check)
    run(torch.zeros(3, 4), 1.0)
    run(*other())
    assert len(calls) == 2


def test_failures_are_never_remembered():
    check, calls = _counting(fail_on=lambda x, s: s < 0)
    run = remembered(check)
    for _ in range(2):
        with pytest.raises(ValueError, match="x: expected"):
            run(torch.zeros(2), -1.0)
    assert len(calls) == 2


def test_unhashable_arguments_are_checked_every_time():
    check, calls = _counting()
    run = remembered(check)
    run(torch.zeros(2), [1.0])
    run(torch.zeros(2), [1.0])
    assert len(calls) == 2


def test_gdn_chunk_check_keeps_its_errors():
    """The remembered gdn_chunk check raises the op's named error on every bad call, also after good ones."""
    run = remembered(gdn_checks.gdn_chunk)
    q = k = torch.zeros(1, 8, 2, 16)
    v = torch.zeros(1, 8, 4, 16)
    g = beta = torch.zeros(1, 8, 4)
    good = (q, k, v, g, beta, None, None, None, None, False, False)
    assert run(*good) == run(*good)
    bad_v = torch.zeros(1, 8, 3, 16)  # 3 value heads: not a multiple of 2 q/k heads
    for _ in range(2):
        with pytest.raises(ValueError, match="v"):
            run(q, k, bad_v, torch.zeros(1, 8, 3), torch.zeros(1, 8, 3), None, None, None, None, False, False)


def test_flash_decode_wrappers_keep_their_errors():
    """The public decode wrappers check once per metadata: a bad call after good ones still raises the
    op's named error, every time."""
    import torch_aura

    q = torch.randn(2, 4, 64)
    k = v = torch.randn(2, 2, 8, 64)
    sl = torch.tensor([8, 3], dtype=torch.int32)
    good = torch_aura.flash_decode(q, k, v, sl)
    assert torch.equal(torch_aura.flash_decode(q, k, v, sl)[0], good[0])
    out, lse = torch.empty(2, 4, 64), torch.empty(2, 4)
    torch_aura.flash_decode_out(q, k, v, sl, None, None, 0, out, lse)
    for _ in range(2):
        with pytest.raises(ValueError, match="num_splits"):
            torch_aura.flash_decode(q, k, v, sl, num_splits=-1)
        with pytest.raises(ValueError, match="lse"):
            torch_aura.flash_decode_out(q, k, v, sl, None, None, 0, out, torch.empty(2, 5))


def _variants():
    """(a tensor, tensors that differ from it in exactly one fact a memo key must hold)."""
    base = torch.zeros(4, 8)[:, :6]  # a view: strides (8, 1)
    wider = torch.zeros(4, 10)[:, :6]
    return base, {
        "shape": torch.zeros(4, 8)[:, :5], "strides": wider, "dtype": torch.zeros(4, 8, dtype=torch.float64)[:, :6],
        "device": torch.zeros(4, 8, device="meta")[:, :6], "alignment": torch.zeros(33)[1:].view(4, 8)[:, :6],
    }


@pytest.mark.parametrize("alignment", [False, True])
def test_compiled_and_python_facts_tell_apart_the_same_calls(alignment, monkeypatch):
    """``tensor_facts`` in C++ (torch_aura's LibTorch module) and in Python: equal keys for calls whose tensors
    share every fact, different keys where one fact differs (alignment only when asked for), None and other
    arguments kept as values."""
    from torch_aura._checks import common

    compiled = common._compiled_facts
    if compiled is None:
        pytest.skip("torch_aura's LibTorch module is not built for this torch")
    base, variants = _variants()
    for name, read in (("C++", compiled), ("Python", None)):
        monkeypatch.setattr(common, "_compiled_facts", read)
        key = common.tensor_facts((base, None, 0.5, True), alignment)
        assert common.tensor_facts((torch.ones(4, 8)[:, :6], None, 0.5, True), alignment) == key, name
        assert common.tensor_facts((base, None, 0.25, True), alignment) != key, name
        assert common.tensor_facts((base, base, 0.5, True), alignment) != key, name  # a tensor where None was
        for fact, other in variants.items():
            same = fact == "alignment" and not alignment
            assert (common.tensor_facts((other, None, 0.5, True), alignment) == key) == same, (name, fact)
        hash(key)
