"""Shared pytest setup for every test tree.

* ``tests/`` goes on ``sys.path`` so tests can ``import _util`` and ``import _samples`` (the repo
  root is deliberately *not* on the path: ``triton_kernels`` must never import top-level, and
  pytest runs with ``--import-mode=importlib``).
* NaN poisoning (FLA's trick): ``torch.empty`` / ``torch.empty_like`` called from ``torch_aura``
  code return NaN-filled floats and all-ones-bits integers, so an op that reads or returns memory
  it never wrote fails loudly instead of passing on lucky zeros.
"""

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_real_empty, _real_empty_like = torch.empty, torch.empty_like


def _called_from_torch_aura() -> bool:
    # frame 0: this function, 1: the patched allocator, 2: its caller
    return sys._getframe(2).f_globals.get("__name__", "").startswith("torch_aura")


def _poison(t: torch.Tensor) -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(t, FakeTensor) or t.device.type == "meta" or torch.compiler.is_compiling():
        return t
    if t.is_floating_point() or t.is_complex():
        t.fill_(math.nan)
    elif t.dtype == torch.bool:
        t.fill_(True)
    elif t.dtype == torch.uint8:
        t.fill_(0xFF)
    else:
        t.fill_(-1)  # every bit set, as uninitialised 0xFF bytes
    return t


def _poisoned_empty(*args, **kwargs):
    t = _real_empty(*args, **kwargs)
    return _poison(t) if _called_from_torch_aura() else t


def _poisoned_empty_like(*args, **kwargs):
    t = _real_empty_like(*args, **kwargs)
    return _poison(t) if _called_from_torch_aura() else t


@pytest.fixture(autouse=True, scope="session")
def nan_poisoned_allocations():
    # `with torch.device(d):` gives d to the constructors of a set built at its first use: built after the
    # patch it holds the wrappers, not torch.empty, and vLLM's models made under `with torch.device("cuda")`
    # landed on the CPU (the H200 serving tests); build it first, from the real functions
    from torch.utils import _device

    getattr(_device, "_device_constructors", lambda: None)()
    torch.empty, torch.empty_like = _poisoned_empty, _poisoned_empty_like
    yield
    torch.empty, torch.empty_like = _real_empty, _real_empty_like


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running test (deselect with -m 'not slow')")
    config.addinivalue_line("markers", "sanitize: small GPU cases run under compute-sanitizer")


# The compile checks (nvcc, Triton's sm_90 compiler, clang for the Metal host units) are what make
# the CPU suite long where the toolchains exist; the developer loop `bash tests/run.sh -m "not slow"`
# leaves them to CI, which runs everything.
_SLOW_FILES = ("test_cuda_compile.py", "test_triton_compile.py", "test_mps_host.py", "test_metal_lint.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in _SLOW_FILES:
            item.add_marker(pytest.mark.slow)
