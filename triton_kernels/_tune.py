"""Launch-config selection for the Triton kernels: tuned once per key in warm-up, then cached.

Why not ``@triton.autotune``: it re-tunes inside CUDA-graph capture (benchmark launches there
break the capture) and fails under ``TRITON_INTERPRET=1`` with more than one config. ``Tuner``
keeps the decision in our hands:

* the key is chosen by the launcher from static facts (head dims, dtype, layout, varlen, a
  parallelism bucket), never from T, so one warm-up call tunes every later shape of a model;
* under the interpreter, with ``TORCH_AURA_TUNE=0``, or while a CUDA graph is being captured, the
  first config that fits the device runs untuned (a capture never benchmarks; the untuned pick is
  not cached, so the next eager call still tunes);
* a config that fails to compile or launch (e.g. too much shared memory) is skipped.

Launches must be repeatable: outputs are fresh buffers and inputs are read-only (the in-place
``gdn_recurrent`` is not tuned).
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Config:
    """One launch configuration: constexpr kwargs plus Triton's ``num_warps`` / ``num_stages``."""

    kwargs: dict = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2

    def launch_kwargs(self) -> dict:
        return {**self.kwargs, "num_warps": self.num_warps, "num_stages": self.num_stages}


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1). Plain Python on purpose: ``triton.next_power_of_2``
    and ``triton.cdiv`` are constexpr-function wrappers that cost microseconds of host time per call
    (a cProfile of eager ``gdn_recurrent`` on the H100's host: their four calls, 9% of the launch)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints (host side; see ``next_pow2``)."""
    return -(-a // b)


@functools.lru_cache(maxsize=None)
def _properties_of(index: int):
    return torch.cuda.get_device_properties(index)


def _cuda_properties(device: torch.device):
    """Cached properties of a CUDA device (launchers ask on every call)."""
    return _properties_of(torch.cuda.current_device() if device.index is None else device.index)


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device; 1 elsewhere."""
    return _cuda_properties(device).multi_processor_count if device.type == "cuda" else 1


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """``(major, minor)`` compute capability of a CUDA device."""
    props = _cuda_properties(device)
    return props.major, props.minor


def has_tma(device: torch.device) -> bool:
    """Whether a CUDA device has the tensor memory accelerator (Hopper, compute capability 9, and later)."""
    return device.type == "cuda" and _cuda_properties(device).major >= 9


@contextlib.contextmanager
def descriptor_workspace(device: torch.device):
    """Lend Triton an allocator for in-kernel TMA descriptors (``tl.make_tensor_descriptor``) while
    our launches run.

    Each such descriptor lives in a small global workspace (128 B per descriptor and program) that
    Triton requests, at every launch, from the allocator a process sets with ``triton.set_allocator``;
    without one the launch fails. A caller's allocator (FLA and vLLM set theirs) is left in charge;
    otherwise torch's caching allocator serves for the duration and the previous state is restored,
    so importing torch_aura changes nothing for other Triton users. Stream-ordered and safe inside
    CUDA-graph capture (the workspace then comes from the graph's pool).
    """
    def alloc(size: int, alignment: int, stream):
        return torch.empty(size, dtype=torch.int8, device=device)

    try:
        from triton.runtime import _allocation

        var = _allocation._allocator
        unset = isinstance(var.get(), _allocation.NullAllocator)
    except (ImportError, AttributeError):  # another Triton layout, no way to read the current one: set ours
        import triton

        triton.set_allocator(alloc)
        yield
        return
    if not unset:
        yield
        return
    token = var.set(alloc)
    try:
        yield
    finally:
        var.reset(token)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


class Tuner:
    """Chooses among ``configs`` per key by timing each once; ``configs[0]`` is the safe default."""

    def __init__(self, name: str, configs: list[Config]):
        self.name = name
        self.configs = configs
        self.cache: dict[tuple, Config] = {}
        self._warned_capture = False

    def __call__(self, key: tuple, launch) -> None:
        """Run ``launch(config)`` with the cached or freshly tuned config for ``key``."""
        cfg = self.cache.get(key)
        if cfg is not None:
            launch(cfg)
        elif len(self.configs) == 1 or interpreting() or os.environ.get("TORCH_AURA_TUNE", "1") == "0":
            self._first_that_fits(launch)
        elif torch.cuda.is_current_stream_capturing():
            if not self._warned_capture:
                self._warned_capture = True
                warnings.warn(f"torch_aura: {self.name} met key {key} first inside CUDA-graph capture; "
                              "running its default config untuned (call it once eagerly to tune)",
                              stacklevel=2)
            self._first_that_fits(launch)
        else:
            launch(self._tune(key, launch))

    def _first_that_fits(self, launch) -> None:
        """Untuned: the first config in order whose kernel fits the device (shared memory, registers).
        Triton raises OutOfResources when loading the kernel, before anything is launched (or
        captured), so trying the next one is safe."""
        from triton.runtime.errors import OutOfResources

        for cfg in self.configs[:-1]:
            try:
                return launch(cfg)
            except OutOfResources:
                continue
        return launch(self.configs[-1])

    def _tune(self, key, launch) -> Config:
        from triton.testing import do_bench

        best, best_ms = self.configs[0], float("inf")
        for cfg in self.configs:
            try:
                ms = do_bench(lambda: launch(cfg), warmup=3, rep=15)
            except Exception:  # noqa: BLE001 - e.g. OutOfResources: this config cannot run here
                continue
            if ms < best_ms:
                best, best_ms = cfg, ms
        self.cache[key] = best
        return best
