"""Defines every op of ``_schema.OPS`` and registers its fake and its reference.

One mechanism serves all ops, so no op can have a fake that disagrees with its checks:

* fake (``register_fake``): ``check(*args)`` -> list of ``TensorSpec`` -> ``torch.empty`` each;
* reference (``CompositeExplicitAutograd``, so it serves CPU and is the fallback on any device
  whose key has no kernel): ``check(*args)``, the fallback policy of ``backends``, then the pure
  PyTorch function of the same name in ``torch_aura.reference``;
* forward-only autograd (``Autograd``, every op that returns something): outputs of inputs that
  require grad raise on backward. In C++ (``torch_aura._C_autograd_t<major>_<minor>``) where built for
  this torch, else in Python.

Kernels (CUDA C++, Triton, Metal, the CPU fast paths) register for their own dispatch key, which
wins over CompositeExplicitAutograd; ``backends.autoload(LIB)`` adds them. Imports point one way:
this module uses ``backends`` (the fallback policy), never the reverse.
"""

from __future__ import annotations

import torch

from . import _checks, backends, reference
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


def _make_reference(name: str):
    """The op's ``CompositeExplicitAutograd`` kernel: the check, the fallback policy of ``backends``
    on a non-CPU device (warn once, or raise under TORCH_AURA_STRICT), then the reference."""
    math = getattr(reference.FAMILIES[OPS[name].family], name)

    def run_reference(*args, **kwargs):
        device = _first_device(args)
        if device.type != "cpu":
            backends.note_reference_fallback(name, device)
        return math(*args, **kwargs)

    return _checks.checked(name, run_reference, "reference")


def _make_forward_only_autograd(name: str):
    """The op's Autograd-key kernel where ``torch_aura._C_autograd_t<major>_<minor>`` cannot serve (not
    built for this torch). The ops are forward-only (inference kernels): outputs of inputs that require
    grad get a grad_fn whose backward raises a NotImplementedError naming the op, instead of PyTorch's
    "autograd kernel was not registered" warning. Without such inputs (the inference path) it
    redispatches at once; still, the round trip through Python costs 10-20 us a call (docs/decode.md
    §4), which the C++ kernel (the same contract, PyTorch's own error) does not pay."""
    overload = getattr(torch.ops.aura, name).default
    below_autograd = torch._C._after_autograd_keyset

    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, kwargs, *args):
            return overload(*args, **kwargs)  # grad mode is off in here: the fast path below

        @staticmethod
        def backward(ctx, *grads):
            raise NotImplementedError(
                f"torch.ops.aura.{name} is forward-only (an inference kernel): it has no backward. Run it "
                "under torch.no_grad() / torch.inference_mode(), or detach its inputs")

    def kernel(keyset, *args, **kwargs):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return NoBackward.apply(kwargs, *args)
        return overload.redispatch(keyset & below_autograd, *args, **kwargs)

    kernel.__name__ = f"{name}_forward_only"
    return kernel


# The C++ Autograd kernel's module for this torch: setup.py puts the torch minor version in its name (it is
# ordinary LibTorch C++, tied to that version)
CPP_AUTOGRAD_MODULE = "torch_aura._C_autograd_t" + backends.torch_minor().replace(".", "_")
# Which Autograd-key kernel serves the ops, and why (set by define_and_register; python -m torch_aura shows it).
AUTOGRAD_KERNEL = "not registered yet"


def _cpp_autograd() -> tuple[object | None, str]:
    """:data:`CPP_AUTOGRAD_MODULE` where built, else None; with what serves the key and why."""
    import importlib
    import importlib.util

    name = CPP_AUTOGRAD_MODULE
    if importlib.util.find_spec(name) is None:
        return None, f"Python ({name} not built)"
    try:
        return importlib.import_module(name), f"C++ ({name}: PyTorch's autogradNotImplementedFallback)"
    except Exception as e:
        return None, f"Python ({name} failed to load: {type(e).__name__}: {e})"


def define_and_register() -> None:
    global AUTOGRAD_KERNEL
    for name, op in OPS.items():
        LIB.define(op.schema, tags=TAGS)
        torch.library.register_fake(f"aura::{name}", _make_fake(name), lib=LIB)
        LIB.impl(name, _make_reference(name), "CompositeExplicitAutograd")
    # mutating ops write caller buffers and return nothing to differentiate: no Autograd kernel
    differentiable = tuple(name for name, op in OPS.items() if "!" not in op.schema)
    cpp, AUTOGRAD_KERNEL = _cpp_autograd()
    if cpp is not None:
        cpp.register_ops("aura", differentiable)
        if hasattr(cpp, "tensor_facts"):  # a module built before it had them keeps the Python reads
            _checks.common.use_compiled_facts(cpp.tensor_facts)
        return
    for name in differentiable:
        LIB.impl(name, _make_forward_only_autograd(name), "Autograd", with_keyset=True)
