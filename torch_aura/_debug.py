"""``TORCH_AURA_DEBUG`` (any value but ``0``; ``_env.py``): the reference's data checks on every device.

The metadata checks (dtype, rank, shapes, devices) run on every call everywhere. The data checks
(``seq_lens`` within the cache, page indices within the pool, slots, pool rows, sequence offsets)
need the values; the CPU reference always makes them, while the CUDA and Metal kernels clamp or
skip out-of-range values instead (memory-safe, wrong answer; README "Out-of-range data"), since a
check would cost a host sync per call. With the variable set (read at import), every public
wrapper first runs the op's reference on CPU copies of its inputs, so the same ``ValueError`` the
CPU raises is raised on any device, before the kernel runs. Slow: for debugging only.
"""

from __future__ import annotations

import functools
import inspect

import torch

from . import _env

ENABLED = _env.get("TORCH_AURA_DEBUG")  # read once: the wrappers are decorated at import


def validated(fn):
    """Decorate a public op wrapper named like its op. Without ``TORCH_AURA_DEBUG`` it returns
    ``fn`` itself: no cost per call."""
    if not ENABLED:
        return fn
    from . import _checks, reference
    from ._schema import OPS

    name = fn.__name__
    check = _checks.for_op(name)
    ref = getattr(reference.FAMILIES[OPS[name].family], name)
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = list(bound.arguments.values())
        on_device = any(isinstance(a, torch.Tensor) and a.device.type != "cpu" for a in values)
        if on_device and not torch.compiler.is_compiling():
            check(*values)  # metadata first: the reference assumes it holds
            with torch.no_grad():  # copies: a mutating op's reference must not touch the caller's tensors
                ref(*[a.detach().cpu().clone() if isinstance(a, torch.Tensor) else a for a in values])
        return fn(*args, **kwargs)

    return wrapper
