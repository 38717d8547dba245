"""Defines every op of ``_schema.OPS`` and registers its fake and its reference.

One mechanism serves all ops, so no op can have a fake that disagrees with its checks:

* fake (``register_fake``): ``check(*args)`` -> list of ``TensorSpec`` -> ``torch.empty`` each;
* reference (``CompositeExplicitAutograd``, so it serves CPU and is the fallback on any device
  whose key has no kernel): ``check(*args)``, the fallback policy of ``backends``, then the pure
  PyTorch function of the same name in ``torch_aura.reference``.

Kernels (CUDA C++, Triton, Metal) register for their own dispatch key, which wins over
CompositeExplicitAutograd.
"""

from __future__ import annotations

import torch

from . import _checks, reference
from ._schema import OPS, TAGS

# A namespace has exactly one DEF library; every backend adds IMPLs to "aura".
LIB = torch.library.Library("aura", "DEF")


def _n_returns(name: str) -> int | None:
    """``None`` for a single-Tensor return, else the tuple length (0 for ``-> ()``)."""
    ret = OPS[name].schema.rsplit("->", 1)[1].strip()
    if ret.startswith("("):
        inner = ret[1:-1].strip()
        return 0 if not inner else inner.count(",") + 1
    return None


def _make_fake(name: str):
    check = _checks.for_op(name)
    n = _n_returns(name)

    def fake(*args, **kwargs):
        outs = [torch.empty(s.shape, dtype=s.dtype, device=s.device) for s in check(*args, **kwargs)]
        if n is None:
            return outs[0]
        return tuple(outs) if n else None

    fake.__name__ = f"{name}_fake"
    return fake


def _first_device(args) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    return torch.device("cpu")


def make_checked(name: str, math=None, label: str = "reference"):
    """``check(*args)`` then ``math`` (default: the reference function of the same name). Serves
    the reference registration and the CPU fast paths (torch_aura.cpu), so both raise alike."""
    from . import backends

    check = _checks.for_op(name)
    math = math or getattr(reference.FAMILIES[OPS[name].family], name)

    def impl(*args, **kwargs):
        check(*args, **kwargs)
        device = _first_device(args)
        if device.type != "cpu":
            backends.note_reference_fallback(name, device)
        return math(*args, **kwargs)

    impl.__name__ = f"{name}_{label}"
    return impl


def _make_no_backward(name: str):
    """The ops are forward-only (inference kernels): outputs of inputs that require grad get a
    grad_fn whose backward raises this, instead of PyTorch's "autograd kernel was not registered"
    warning on CPU and a silent missing graph elsewhere."""

    def backward(ctx, *grads):
        raise NotImplementedError(
            f"torch.ops.aura.{name} is forward-only (an inference kernel): it has no backward. Run it "
            "under torch.no_grad() / torch.inference_mode(), or detach its inputs")

    return backward


def define_and_register() -> None:
    for name, op in OPS.items():
        LIB.define(op.schema, tags=TAGS)
        torch.library.register_fake(f"aura::{name}", _make_fake(name), lib=LIB)
        LIB.impl(name, make_checked(name), "CompositeExplicitAutograd")
        if "!" not in op.schema:  # mutating ops write caller buffers and return nothing to differentiate
            torch.library.register_autograd(f"aura::{name}", _make_no_backward(name), lib=LIB)
