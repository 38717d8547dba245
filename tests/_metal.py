"""Builds and drives the Metal emulator (docs/metal.md §2-3) and the lint build (§4) from tests.

* :func:`find_clang` locates a clang++ that can compile MSL as C++ (ext_vector_type, ``__bf16``
  arithmetic, the excess-precision switches); ``None`` makes the Metal tests skip with a reason.
* :func:`build_emulator` compiles every ``.metal`` file (``csrc/mps/shaders`` plus test-only
  kernels) as C++ against ``csrc/mps/emu/metal_emu.h``, one translation unit each, with the fiber
  runtime, the launch plans (``csrc/mps/plan``) and the harness into one shared library, cached by
  a hash of its sources so a session builds it once.
* :class:`Emulator` calls it through ctypes: :meth:`Emulator.run_op` executes an op's launch plan
  (the very ``plan_op`` the Objective-C++ host encodes) on CPU tensors, :meth:`Emulator.run_kernel`
  one dispatch of any registered kernel.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
MPS_SRC = REPO / "csrc" / "mps"
SHADERS = sorted((MPS_SRC / "shaders").glob("*.metal"))
TEST_SHADERS = sorted((REPO / "tests" / "interp" / "metal" / "kernels").glob("*.metal")) + sorted(
    (REPO / "tests" / "mps" / "probes").glob("*.metal"))
HOST_SOURCES = [MPS_SRC / "emu" / "emu_runtime.cpp", MPS_SRC / "emu" / "harness.cpp",
                *sorted((MPS_SRC / "plan").glob("*.cpp"))]
EMU_HEADER = MPS_SRC / "emu" / "metal_emu.h"

# Per-op rounding as on the GPU: no excess precision for _Float16 / __bf16 (docs/metal.md §3).
FP_FLAGS = ["-Xclang", "-ffloat16-excess-precision=none", "-Xclang", "-fbfloat16-excess-precision=none"]
LANE_ORDERS = {"forward": 0, "reverse": 1, "shuffled": 2}

DTYPE_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.int32: 3, torch.int64: 4}
CODE_DTYPE = {v: k for k, v in DTYPE_CODE.items()}
MAX_DIMS = 8


def find_clang() -> str | None:
    """A clang++ able to build the emulator (``AURA_CLANG`` first, then clang++-19 .. 17, clang++)."""
    candidates = [os.environ.get("AURA_CLANG")] + [f"clang++-{v}" for v in (19, 20, 21, 18, 17)] + ["clang++"]
    for name in filter(None, candidates):
        path = shutil.which(name)
        if path is None:
            continue
        probe = subprocess.run([path, "-x", "c++", "-std=c++20", "-fsyntax-only", *FP_FLAGS, "-"],
                               input="typedef float f4 __attribute__((ext_vector_type(4)));\n"
                                     "__bf16 f(__bf16 a) { return a * a; }\n",
                               capture_output=True, text=True)
        if probe.returncode == 0 and _builtins(path):
            return path
    return None


def _builtins(clang: str) -> str | None:
    """compiler-rt's builtins archive: GCC 12's libgcc lacks the float -> bfloat conversion
    (``__truncsfbf2``) that ``__bf16`` stores call (Debian: libclang-rt-19-dev)."""
    r = subprocess.run([clang, "-print-libgcc-file-name", "-rtlib=compiler-rt"], capture_output=True, text=True)
    path = r.stdout.strip()
    return path if r.returncode == 0 and path and Path(path).exists() else None


SKIP_REASON = ("no clang++ (>= 17) with compiler-rt found: the Metal emulator compiles .metal files as C++ "
               "with clang (apt-get install clang-19 libclang-rt-19-dev, or set AURA_CLANG); g++ cannot "
               "(docs/metal.md §6)")


def clang_or_skip() -> str:
    """The clang to use; skips the calling test without one, unless ``AURA_REQUIRE_CLANG=1`` (CI),
    where a missing clang must fail rather than silently skip every Metal test."""
    import pytest

    clang = find_clang()
    if clang is None:
        if os.environ.get("AURA_REQUIRE_CLANG", "0") not in ("", "0"):
            pytest.fail(SKIP_REASON + "; AURA_REQUIRE_CLANG=1 makes this an error")
        pytest.skip(SKIP_REASON)
    return clang


def _digest(clang: str, flags: list[str]) -> str:
    h = hashlib.sha256((clang + " ".join(flags)).encode())
    files = SHADERS + TEST_SHADERS + HOST_SOURCES + sorted(MPS_SRC.rglob("*.h")) + sorted((REPO / "csrc" / "generated").glob("*.h"))
    for f in files:
        h.update(str(f).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def build_emulator(clang: str, opt: str = "-O1") -> Path:
    """Compile (once per source hash) and return the path of ``libaura_metal_emu.so``."""
    common = ["-std=c++20", opt, "-fPIC", "-g0", "-w", *FP_FLAGS]
    out_dir = Path(os.environ.get("AURA_EMU_CACHE", Path(tempfile.gettempdir()) / "torch_aura_metal_emu"))
    out_dir = out_dir / _digest(clang, common)
    lib = out_dir / "libaura_metal_emu.so"
    if lib.exists():
        return lib
    work = Path(tempfile.mkdtemp(prefix="build-", dir=out_dir.parent if out_dir.parent.exists() else None))
    jobs = []
    for src in SHADERS + TEST_SHADERS:
        jobs.append([clang, *common, "-x", "c++", "-include", str(EMU_HEADER), f"-I{MPS_SRC / 'shaders'}",
                     "-c", str(src), "-o", str(work / (src.stem + ".metal.o"))])
    for src in HOST_SOURCES:
        jobs.append([clang, *common, "-c", str(src), "-o", str(work / (src.parent.name + "_" + src.stem + ".o"))])

    def run(cmd):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"emulator build failed: {' '.join(cmd)}\n{r.stderr[-6000:]}")

    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        list(pool.map(run, jobs))
    run([clang, "-shared", "-o", str(work / lib.name), *sorted(str(p) for p in work.glob("*.o")), _builtins(clang)])
    out_dir.mkdir(parents=True, exist_ok=True)
    os.replace(work / lib.name, lib)  # atomic: a concurrent session sees a whole library or none
    shutil.rmtree(work, ignore_errors=True)
    return lib


class TensorMeta(ctypes.Structure):
    """Mirror of ``aura::mps::TensorMeta`` (csrc/mps/plan/launch_plan.h)."""

    _fields_ = [("defined", ctypes.c_int32), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("reserved", ctypes.c_int32), ("sizes", ctypes.c_int64 * MAX_DIMS),
                ("strides", ctypes.c_int64 * MAX_DIMS)]


def tensor_meta(t: torch.Tensor | None) -> TensorMeta:
    m = TensorMeta()
    if t is None:
        return m
    m.defined, m.dtype, m.ndim = 1, DTYPE_CODE[t.dtype], t.dim()
    for i, (s, st) in enumerate(zip(t.shape, t.stride())):
        m.sizes[i], m.strides[i] = s, st
    return m


def _extent_bytes(t: torch.Tensor | None) -> int:
    if t is None or t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))) * t.element_size()


class EmulatorError(RuntimeError):
    pass


class Emulator:
    """ctypes front end of the harness (csrc/mps/emu/harness.cpp)."""

    def __init__(self, lib_path: Path):
        self.lib = ctypes.CDLL(str(lib_path))
        self._keep = torch.zeros(16, dtype=torch.float64)  # stands in for the data of 0-size tensors

    @staticmethod
    def _err():
        return ctypes.create_string_buffer(4096)

    def kernel_names(self) -> list[str]:
        buf = ctypes.create_string_buffer(1 << 20)
        self.lib.aura_emu_kernel_names(buf, len(buf))
        return buf.value.decode().split()

    def launched_kernels(self) -> set[str]:
        """Host names dispatched so far by this process (run_op and run_kernel)."""
        buf = ctypes.create_string_buffer(1 << 20)
        self.lib.aura_emu_launched_kernels(buf, len(buf))
        return set(buf.value.decode().split())

    def planned_ops(self) -> list[str]:
        buf = ctypes.create_string_buffer(1 << 16)
        self.lib.aura_emu_planned_ops(buf, len(buf))
        return buf.value.decode().split()

    def _ptr(self, t: torch.Tensor | None) -> int:
        if t is None:
            return 0
        assert t.device.type == "cpu"
        return t.data_ptr() if t.numel() else self._keep.data_ptr()

    @staticmethod
    def split_args(name: str, args: tuple) -> tuple[list, list[float], list[str | None]]:
        """Schema-ordered tensor arguments, scalars (None = NaN, dtype = DType code) and strings
        (OpCall in csrc/mps/plan/launch_plan.h); arguments not passed take their schema defaults."""
        schema = getattr(torch.ops.aura, name).default._schema
        tensors, scalars, strings = [], [], []
        for i, arg in enumerate(schema.arguments):
            value = args[i] if i < len(args) else arg.default_value
            kind = str(arg.type)
            if kind in ("Tensor", "Optional[Tensor]"):
                tensors.append(value)
            elif kind in ("str", "Optional[str]"):
                strings.append(value)
            elif value is None:
                scalars.append(math.nan)
            elif isinstance(value, torch.dtype):
                scalars.append(float(DTYPE_CODE[value]))
            else:
                scalars.append(float(value))
        return tensors, scalars, strings

    @staticmethod
    def _c_args(scalars: list[float], strings: list[str | None]):
        sc = (ctypes.c_double * max(1, len(scalars)))(*scalars)
        st = (ctypes.c_char_p * max(1, len(strings)))(*[None if s is None else s.encode() for s in strings])
        return sc, len(scalars), st, len(strings)

    def output_specs(self, name: str, args: tuple) -> list[tuple[tuple, torch.dtype]]:
        """The plan's output (shape, dtype) list for aura::<name>(*args)."""
        return self._output_specs(name, *self.split_args(name, args))

    def _output_specs(self, name: str, tensors: list, scalars: list[float],
                      strings: list) -> list[tuple[tuple, torch.dtype]]:
        metas = (TensorMeta * max(1, len(tensors)))(*[tensor_meta(t) for t in tensors])
        n = ctypes.c_int(0)
        dt, nd = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
        sizes = (ctypes.c_int64 * (8 * MAX_DIMS))()
        err = self._err()
        if self.lib.aura_emu_output_specs(name.encode(), metas, len(tensors), *self._c_args(scalars, strings), 8,
                                          ctypes.byref(n), dt, nd, sizes, err, len(err)):
            raise EmulatorError(err.value.decode())
        return [(tuple(sizes[k * MAX_DIMS + i] for i in range(nd[k])), CODE_DTYPE[dt[k]]) for k in range(n.value)]

    def run_op(self, name: str, *args, lane_order: str = "forward", seed: int = 0):
        """Run aura::<name> through its Metal launch plan; returns what the op returns."""
        from torch_aura._registry import _n_returns

        tensors, scalars, strings = self.split_args(name, args)
        specs = self._output_specs(name, tensors, scalars, strings)
        outs = [torch.full(shape, math.nan, dtype=dt) if dt.is_floating_point else torch.full(shape, -1, dtype=dt)
                for shape, dt in specs]  # NaN-poisoned: every element must be written
        every = tensors + outs
        metas = (TensorMeta * max(1, len(every)))(*[tensor_meta(t) for t in every])
        ptrs = (ctypes.c_void_p * max(1, len(every)))(*[self._ptr(t) for t in every])
        err, n_launch = self._err(), ctypes.c_int(0)
        if self.lib.aura_emu_run_op(name.encode(), metas, ptrs, len(every), *self._c_args(scalars, strings),
                                    LANE_ORDERS[lane_order], ctypes.c_uint64(seed), ctypes.byref(n_launch), err,
                                    len(err)):
            raise EmulatorError(err.value.decode())
        self.last_launches = n_launch.value
        n = _n_returns(name)
        if n is None:
            return outs[0]
        return tuple(outs) if n else None

    def run_kernel(self, kernel: str, groups, group_size, buffers: list, lane_order: str = "forward", seed: int = 0):
        """One dispatch of a registered kernel; ``buffers`` are CPU tensors (or None) by slot."""
        g = (ctypes.c_uint * 3)(*(list(groups) + [1] * (3 - len(groups))))
        s = (ctypes.c_uint * 3)(*(list(group_size) + [1] * (3 - len(group_size))))
        ptrs = (ctypes.c_void_p * max(1, len(buffers)))(*[self._ptr(b) for b in buffers])
        # each buffer in a guarded copy of its extent: a read or write past the end is an error
        extents = (ctypes.c_uint64 * max(1, len(buffers)))(*[_extent_bytes(b) for b in buffers])
        err = self._err()
        if self.lib.aura_emu_run_kernel(kernel.encode(), g, s, ptrs, extents, len(buffers), LANE_ORDERS[lane_order],
                                        ctypes.c_uint64(seed), err, len(err)):
            raise EmulatorError(err.value.decode())


def lint_command(clang: str, source: Path) -> list[str]:
    """The syntax-only build with real address spaces (docs/metal.md §4)."""
    return [clang, "-x", "c++", "-std=c++20", "-fsyntax-only", "-DAURA_METAL_LINT", *FP_FLAGS,
            "-Wno-unknown-attributes", "-include", str(EMU_HEADER), f"-I{MPS_SRC / 'shaders'}", str(source)]
