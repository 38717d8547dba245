"""Shared input validation: one function per op (in the family modules) runs in the fake, in the
reference and in the public wrapper, so bad input raises the same named error eagerly, on every
backend, and at ``torch.compile`` trace time (ops.md, last paragraph).

Rules: every error is a ``ValueError`` whose message names the argument, what was expected and
what was given. Checks read only metadata (shapes, dtypes, devices, strides), never data, so they
run on FakeTensors; data-dependent checks (e.g. ``seq_lens`` against the cache length) live in the
references, which are allowed to read values.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

import torch

FLOATS = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)


class TensorSpec(NamedTuple):
    """What an op returns, computed from metadata only: the fake allocates exactly this."""

    shape: tuple
    dtype: torch.dtype
    device: torch.device


def fail(arg: str, expected: str, got) -> None:
    message = f"{arg}: expected {expected}, got {got}"
    if _tracing():
        raise compiled_input_error()(message)
    raise ValueError(message)


def _tracing() -> bool:
    """Inside torch.compile / torch.export, or a fake run (the fake of an op being traced): torch
    2.13 reports is_compiling() there, torch 2.11 only has the fake mode active."""
    return torch.compiler.is_compiling() or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


_COMPILED_INPUT_ERROR = None


def compiled_input_error() -> type:
    """The ``ValueError`` the checks raise while ``torch.compile`` / ``torch.export`` trace an op's
    fake: also a ``torch._dynamo.exc.Unsupported``, the one exception dynamo lets out of fake
    propagation unwrapped (others become ``TorchRuntimeError``), so ``except ValueError`` works
    compiled, ``fullgraph=True`` included, as it does eagerly. (The public wrappers leave the check
    to the fake while compiling: a ``raise`` in traced Python would be dynamo's own Unsupported.)"""
    global _COMPILED_INPUT_ERROR
    if _COMPILED_INPUT_ERROR is None:
        from torch._dynamo.exc import Unsupported

        class CompiledInputError(ValueError, Unsupported):
            def __init__(self, message: str):
                Unsupported.__init__(self, message)

        _COMPILED_INPUT_ERROR = CompiledInputError
    return _COMPILED_INPUT_ERROR


def _dtype_name(dtypes: Iterable[torch.dtype]) -> str:
    return " / ".join(str(d).replace("torch.", "") for d in dtypes)


def tensor(arg: str, t, *, ndim: int | Sequence[int] | None = None, dtypes=None,
           unit_last_stride: bool = False, contiguous: bool = False, distinct: bool = False) -> torch.Tensor:
    """Check that ``t`` is a tensor of the given rank(s) and dtype(s) (and layout); returns it. ``contiguous``:
    index tensors the kernels address from their shape alone (``cu_seqlens + n``), not their strides.
    ``distinct``: a tensor an op writes through any strides, so no two of its elements may share memory."""
    # Runs on every eager call of every op (host time of small decode calls): plain branches, and
    # the messages are built only on failure.
    if not isinstance(t, torch.Tensor):
        fail(arg, "a Tensor", type(t).__name__)
    if ndim is not None:
        d = t.dim()
        if (d != ndim) if isinstance(ndim, int) else (d not in ndim):
            ranks = (ndim,) if isinstance(ndim, int) else tuple(ndim)
            fail(arg, f"a {' or '.join(f'{r}-D' for r in ranks)} tensor", f"shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        fail(arg, f"dtype {_dtype_name(dtypes)}", str(t.dtype).replace("torch.", ""))
    if unit_last_stride and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(arg, "a unit stride in the last dim", f"strides {tuple(t.stride())}")
    if contiguous and not t.is_contiguous():
        fail(arg, "a contiguous tensor (.contiguous() makes one)", f"strides {tuple(t.stride())}")
    if distinct and any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride())):
        fail(arg, "a tensor whose elements do not alias (no zero stride; .clone() makes one)",
             f"strides {tuple(t.stride())}")
    return t


def optional(arg: str, t, **kw) -> torch.Tensor | None:
    return None if t is None else tensor(arg, t, **kw)


def dim(arg: str, t: torch.Tensor, i: int, expected, what: str = "") -> None:
    """Check ``t.shape[i] == expected``; ``what`` explains where ``expected`` comes from."""
    if t.shape[i] != expected:
        fail(f"{arg}.shape[{i}]", f"{expected}{' (' + what + ')' if what else ''}",
             f"{t.shape[i]} (shape {tuple(t.shape)})")


def shape(arg: str, t: torch.Tensor, expected: Sequence, what: str = "") -> None:
    """Check a whole shape; ``None`` entries match anything."""
    got = t.shape
    if len(got) == len(expected):
        for s, e in zip(got, expected):
            if e is not None and s != e:
                break
        else:
            return
    exp = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
    fail(arg, f"shape {exp}{' (' + what + ')' if what else ''}", f"{tuple(got)}")


def one_of(arg: str, value, allowed: Sequence) -> None:
    if value not in allowed:
        fail(arg, f"one of {list(allowed)}", value)


def _disagreeing(tensors: dict, attr: str):
    """``(first_name, first, name, t)``: the first given (non-None) tensor and the first later one
    whose ``attr`` differs from it (``name, t = None, None`` when all agree)."""
    first_name = first = None
    for k, v in tensors.items():
        if v is None:
            continue
        if first is None:
            first_name, first = k, v
        elif getattr(v, attr) != getattr(first, attr):
            return first_name, first, k, v
    return first_name, first, None, None


def same_device(**tensors) -> torch.device:
    """All given (non-None) tensors on one device; returns it."""
    first_name, first, k, v = _disagreeing(tensors, "device")
    if k is not None:
        fail(k, f"device {first.device} (the device of {first_name})", v.device)
    return first.device


def same_dtype(**tensors) -> torch.dtype:
    first_name, first, k, v = _disagreeing(tensors, "dtype")
    if k is not None:
        fail(k, f"dtype {str(first.dtype).replace('torch.', '')} (the dtype of {first_name})",
             str(v.dtype).replace("torch.", ""))
    return first.dtype


def divides(arg: str, num, den, num_name: str, den_name: str) -> None:
    """``num % den == 0``, e.g. a GQA ratio that must be whole."""
    if den == 0 or num % den != 0:
        fail(arg, f"{num_name} ({num}) to be a multiple of {den_name} ({den})",
             f"{num_name} % {den_name} = {num % den if den else 'undefined'}")


# tensor_facts of torch_aura's LibTorch module (csrc/autograd/tensor_facts.cpp), set by _registry where it is built
# for this torch; the Python reads below serve otherwise
_compiled_facts = None


def use_compiled_facts(fn) -> None:
    global _compiled_facts
    _compiled_facts = fn


def tensor_facts(args: tuple, alignment: bool = False) -> tuple:
    """A memo key of ``args``: each tensor's shape, strides, dtype and device (and with ``alignment`` its data
    pointer's remainder mod 16, which Triton specialises on), None, and every other argument's value. Read
    in C++ where torch_aura's LibTorch module is built (~1 us for eight tensors against ~7 in Python); the two
    forms never compare equal, and one process uses one."""
    if _compiled_facts is not None:
        return _compiled_facts(args, alignment)
    if alignment:
        return tuple((a.shape, a.stride(), a.dtype, a.device, a.data_ptr() & 15) if isinstance(a, torch.Tensor)
                     else a for a in args)
    return tuple((a.shape, a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args)


def remembered(check, facts=tensor_facts):
    """``check`` for a launcher's eager calls, which repeat one argument metadata call after call (every
    layer of a model, every step): a call whose ``facts(args)`` (default :func:`tensor_facts`: each tensor's
    shape, strides, dtype and device, every other argument's value) already passed returns what ``check``
    returned then, without running the Python checks again (host time per eager call). Failures are never
    remembered; arguments whose facts cannot be read or hashed are checked every call. Real tensors only:
    the fakes, which see symbolic sizes under torch.compile, call ``check`` itself. ``run.forget()`` drops
    what was remembered."""
    passed: dict = {}

    def run(*args):
        try:
            key = facts(args)
            return passed[key]
        except KeyError:
            spec = check(*args)
            if len(passed) >= 256:  # bounded: a long-running server sees many shapes
                passed.clear()
            passed[key] = spec
            return spec
        except (TypeError, AttributeError):  # unhashable, or not a tensor where facts reads one
            return check(*args)

    run.__wrapped__ = check
    run.forget = passed.clear
    return run


_REMEMBERED: dict = {}  # check -> its one remembered form (remembered_check)


def remembered_check(check):
    """The process's one :func:`remembered` form of ``check`` (default facts): a public wrapper and the
    launcher behind it share what passed, so a call's metadata is checked once, not once per layer."""
    run = _REMEMBERED.get(check)
    if run is None:
        run = _REMEMBERED[check] = remembered(check)
    return run
