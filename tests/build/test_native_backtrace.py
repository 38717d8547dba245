"""tests/_native_backtrace.py: the crash tests' native-stack printer (the GPU hosts have no gdb) prints the C frames
of a crashing subprocess, each as object + offset that addr2line resolves, and the process still dies of
its signal."""

import os
import re
import shutil
import subprocess
import sys

import pytest

import _native_backtrace as nb

# a static (no dynamic symbol, as most of libtorch's frames) recursion without end: a stack overflow
RECURSE_C = """
static int recurse(volatile char *up, int n) { volatile char pad[512]; pad[0] = (char)n; return recurse(pad, n + 1) + up[0]; }
int aura_overflow(void) { volatile char top[1] = {0}; return recurse(top, 0); }
"""
CRASHES = {
    "null read": ("ctypes.string_at(0)", -11, "SIGSEGV"),
    "abort": ("import os; os.abort()", -6, "SIGABRT"),
    "stack overflow": ("ctypes.CDLL({overflow!r}).aura_overflow()", -11, "SIGSEGV"),
}
FRAME = re.compile(r"^#\d+ 0x[0-9a-f]+ (\S+\.so[.\d]*) \+(0x[0-9a-f]+)", re.M)


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = tmp_path_factory.mktemp("native_backtrace")
    lib = nb.build_or_skip(d)
    src = d / "overflow.c"
    src.write_text(RECURSE_C)
    overflow = d / "liboverflow.so"
    subprocess.run([*nb.compiler(), "-shared", "-fPIC", "-O0", "-g", "-o", str(overflow), str(src)], check=True)
    return lib, overflow


def _crash(tmp_path, libs, body, how):
    lib, overflow = libs
    script = tmp_path / "crash.py"
    install = nb.install_line(lib) if how == "ctypes" else ""
    script.write_text("import ctypes, sys\n" + install + "print('installed', flush=True)\n"
                      + body.format(overflow=str(overflow)) + "\nprint('survived')\n")
    env = nb.preload_env(lib) if how == "LD_PRELOAD" else {}
    return subprocess.run([sys.executable, "-u", "-X", "faulthandler", str(script)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **env})


@pytest.mark.parametrize("how", ["ctypes", "LD_PRELOAD"])
@pytest.mark.parametrize("crash", list(CRASHES))
def test_crash_prints_native_frames_and_still_dies(tmp_path, libs, crash, how):
    body, code, name = CRASHES[crash]
    r = _crash(tmp_path, libs, body, how)
    report = nb.section(r.stderr)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr[-3000:])
    assert r.stdout == "installed\n"
    assert report.startswith(f"native backtrace: {name}") and report.endswith(nb.END), r.stderr[-3000:]
    frames = FRAME.findall(report)
    assert frames, report  # at least one frame names its shared object (libc, libpython, _ctypes, ...)
    assert "backtrace_symbols:" in report
    # it chains to the handler it replaced, or is chained to: faulthandler's Python stack is there too
    assert "Fatal Python error" in r.stderr, r.stderr[-3000:]
    if crash == "stack overflow":  # printed from the alternate stack, down in the overflowing frames
        assert any(obj.endswith("liboverflow.so") for obj, _ in frames), report


@pytest.mark.skipif(not shutil.which("addr2line"), reason="no addr2line")
def test_offsets_resolve_frames_without_a_dynamic_symbol(tmp_path, libs):
    r = _crash(tmp_path, libs, CRASHES["stack overflow"][0], "ctypes")
    offsets = [off for obj, off in FRAME.findall(nb.section(r.stderr)) if obj.endswith("liboverflow.so")]
    assert offsets, r.stderr[-3000:]
    # a return address: the call is the byte before it
    out = subprocess.run(["addr2line", "-f", "-e", str(libs[1]), hex(int(offsets[-1], 16) - 1)],
                         capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0] == "recurse", out
