"""torch.compile(fullgraph=True) of every public API (no graph break), compared with eager;
and torch.export of every op inside a module."""

import copy

import pytest
import torch

import torch_aura

import _samples


def _cases():
    for name, make in _samples.all_samples().items():
        for s in make("cpu")[:1]:  # one sample per op keeps compile time in budget
            yield pytest.param(name, s, id=f"{name}-{s.id}")


def _clone(x):
    return x.clone() if isinstance(x, torch.Tensor) else copy.copy(x)


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.nan_to_num(), b.nan_to_num())
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name,sample", list(_cases()))
def test_compile_fullgraph_matches_eager(name, sample):
    torch._dynamo.reset()
    fn = getattr(torch_aura, name)
    eager_args = [_clone(a) for a in sample.args]
    compiled_args = [_clone(a) for a in sample.args]
    expected = fn(*eager_args, **sample.kwargs)
    got = torch.compile(fn, fullgraph=True, dynamic=False)(*compiled_args, **sample.kwargs)
    assert _equal(got, expected)
    # in-place ops: the mutated arguments must match too
    assert all(_equal(g, e) for g, e in zip(compiled_args, eager_args))


@pytest.mark.parametrize("name,sample", list(_cases()))
def test_export(name, sample):
    op = getattr(torch.ops.aura, name)

    class M(torch.nn.Module):
        def forward(self, *args):
            return op(*args, **sample.kwargs)

    args = tuple(_clone(a) for a in sample.args)
    ep = torch.export.export(M(), args)
    assert any(n.op == "call_function" and "aura" in str(n.target) for n in ep.graph.nodes)
