"""The ops are forward-only: an output of inputs that require grad carries a grad_fn whose backward
raises an error naming the op (not PyTorch's "autograd kernel was not registered" warning), and
nothing changes under no_grad. Mutating ops (out variants, cache writes) return nothing to
differentiate. The kernel is C++ (torch_aura._C_autograd_t<major>_<minor>, PyTorch's not-implemented
fallback) where built for this torch, else a Python one with its own message; CI builds the C++ one."""

import warnings

import pytest
import torch

from _samples import all_samples
from torch_aura import _registry
from torch_aura._schema import OPS

DIFFERENTIABLE = [name for name, op in OPS.items() if "!" not in op.schema]


def _with_grad(args):
    """The sample's floating-point tensors as leaves that require grad."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            a = a.detach().clone().requires_grad_(True)
        out.append(a)
    return out


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_backward_raises_a_named_error(name):
    sample = all_samples()[name]("cpu")[0]
    args = _with_grad(sample.args)
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        pytest.skip(f"{name}: no floating-point input in its sample")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "autograd kernel was not registered" would fail here
        result = getattr(torch.ops.aura, name)(*args, **sample.kwargs)
    outs = [r for r in (result if isinstance(result, (tuple, list)) else (result,))
            if isinstance(r, torch.Tensor) and r.is_floating_point()]
    assert outs and all(o.grad_fn is not None for o in outs)
    with pytest.raises((NotImplementedError, RuntimeError), match=BACKWARD_ERROR.format(name=name)):
        sum(o.float().sum() for o in outs).backward()


# each kernel's error on backward: PyTorch's fallback (C++), or the Python kernel's own
BACKWARD_ERROR = (r"derivative for aura::{name} is not implemented" if _registry.AUTOGRAD_KERNEL.startswith("C++")
                  else r"aura\.{name} is forward-only")


def test_the_autograd_kernel_is_cpp_where_built():
    """A build with the C++ CPU extensions (CI's) serves the Autograd key in C++: the Python kernel's
    round trip cost 10-20 us of every eager call (docs/decode.md §4)."""
    import importlib.util

    if importlib.util.find_spec(_registry.CPP_AUTOGRAD_MODULE) is None:
        pytest.skip(f"{_registry.CPP_AUTOGRAD_MODULE} not built (AURA_BUILD_CPU=0 or no compiler)")
    assert _registry.AUTOGRAD_KERNEL.startswith("C++"), _registry.AUTOGRAD_KERNEL


def test_no_grad_outputs_have_no_graph():
    sample = all_samples()["flash_decode"]("cpu")[0]
    with torch.no_grad():
        out, lse = torch.ops.aura.flash_decode(*_with_grad(sample.args))
    assert out.grad_fn is None and lse.grad_fn is None
