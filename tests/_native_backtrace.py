"""The native stack of a crashing subprocess, where there is no gdb (the GPU hosts): compiles
``_native_backtrace.c`` into a small shared library whose signal handler prints the C/C++ frames of a
SIGSEGV/SIGBUS/SIGABRT/SIGILL/SIGFPE to stderr (each as object + offset, for ``addr2line``), then lets the
process die of the signal as before. A crash test reruns its script with :func:`install_line` after the
imports and puts :func:`section` of its stderr into the failure message."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("_native_backtrace.c")
INSTALL = "aura_native_backtrace_install"
BEGIN, END = "native backtrace:", "native backtrace end"


class Unavailable(RuntimeError):
    """No C compiler here, or it failed on the source."""


def compiler() -> list[str] | None:
    cc = os.environ.get("CC")
    if cc:
        return shlex.split(cc)
    for name in ("gcc", "cc", "clang"):
        if shutil.which(name):
            return [name]
    return None


def build(directory) -> Path:
    """The compiled library in ``directory`` (raises :class:`Unavailable`)."""
    cc = compiler()
    if cc is None:
        raise Unavailable("no C compiler (gcc, cc, clang or $CC)")
    out = Path(directory) / "libaura_native_backtrace.so"
    # -g and frame pointers: the library's own frames unwind and resolve like the rest
    cmd = [*cc, "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", "-o", str(out), str(SOURCE), "-ldl"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"{' '.join(cmd)}: {e}") from e
    if r.returncode != 0:
        raise Unavailable(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr[-2000:]}")
    return out


def build_or_skip(directory) -> Path:
    import pytest

    try:
        return build(directory)
    except Unavailable as e:
        pytest.skip(str(e))


def install_line(lib) -> str:
    """One line of Python that installs the handler (from ctypes: after ``import torch``, so that no
    handler installed at import sits above it; a failure to install is an error, not a quiet no-op)."""
    return f"import ctypes; assert ctypes.CDLL({str(lib)!r}).{INSTALL}() == 0, 'native backtrace not installed'\n"


def preload_env(lib) -> dict[str, str]:
    """Environment additions that load the handler into a process from its start (its constructor installs
    it; a handler that Python or a library installs later runs first, then chains to it)."""
    return {"LD_PRELOAD": " ".join(p for p in (str(lib), os.environ.get("LD_PRELOAD", "")) if p)}


def section(stderr: str) -> str:
    """The handler's report(s) in ``stderr``, from its ``native backtrace:`` line to its end marker."""
    parts, rest = [], stderr
    while BEGIN in rest:
        start = rest.index(BEGIN)
        stop = rest.find(END, start)
        parts.append(rest[start:] if stop < 0 else rest[start:stop + len(END)])
        if stop < 0:
            break
        rest = rest[stop + len(END):]
    return "\n".join(parts)
