"""pytest plugin for tools/cpu_sanitize.sh: serve the CPU fast paths from the sanitizer build of the
C++ library named by AURA_CPU_SANITIZE_LIB (same entry points as torch_aura._C_cpu)."""

import ctypes
import os

from torch_aura.cpu import native


def pytest_configure(config):
    lib = ctypes.CDLL(os.environ["AURA_CPU_SANITIZE_LIB"])
    for name in ("aura_cpu_flash_p1", "aura_cpu_rotate", "aura_cpu_flash_p2", "aura_cpu_encode", "aura_cpu_flash_decode"):
        entry, original = getattr(lib, name), getattr(native.LIB, name)
        entry.argtypes, entry.restype = original.argtypes, original.restype
    native.LIB = lib


def pytest_report_header(config):
    return f"CPU kernels: sanitizer build {native.LIB._name}"
