"""Our native extensions must not hand a static libstdc++ to the rest of the process.

The GPU hosts' toolchain links libstdc++ statically into every extension it builds (their ``_C_cuda.so``
and ``_C_cpu.so`` need no ``libstdc++.so.6``), and by default a static archive's symbols are exported.
Loaded beside torch, which uses ``libstdc++.so.6``, some of the copy's calls then bind to torch's library
and some stay in the copy: the first ``std::ostringstream << long`` of an error path met a null locale
facet and crashed (the OOM test's native backtrace: ``torch::headeronly::detail::throw_exception`` in
``stable::new_empty``). ``setup.py``'s ``HIDE_STATIC_LIBS`` keeps any archive linked in private."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("g++") is None,
                                reason="GNU toolchain on Linux")

SOURCE = r"""
#include <cstring>
#include <sstream>
#include <stdexcept>
extern "C" void raise_formatted(long line) {
  std::ostringstream ss;
  ss << "failed at line " << line;
  throw std::runtime_error(ss.str());
}
extern "C" void describe(long line, char* out, unsigned long n) {
  try {  // what an error path does: format a message with a number, throw it, catch it
    raise_formatted(line);
  } catch (const std::exception& e) {
    std::strncpy(out, e.what(), n - 1);
  }
}
"""
# a libstdc++ symbol that only a static copy defines: its presence in .dynsym means the copy is exported
STATIC_COPY_SYMBOLS = ("_ZNSt6locale7classicEv", "_ZNSt8ios_base4InitC1Ev")


def setup_constant(name: str):
    """A module-level constant of setup.py, read without running the build."""
    for node in ast.parse((ROOT / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return eval(compile(ast.Expression(node.value), "setup.py", "eval"), {"sys": sys})  # noqa: S307
    raise LookupError(name)


def build(tmp_path: Path, name: str, link_args: list[str]) -> Path:
    src = tmp_path / "describe.cpp"
    src.write_text(SOURCE)
    lib = tmp_path / f"lib{name}.so"
    r = subprocess.run(["g++", "-O2", "-fPIC", "-shared", "-static-libstdc++", str(src), "-o", str(lib), *link_args],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"no static libstdc++ to link here: {r.stderr.strip()[-200:]}")
    return lib


def describe_beside_torch(lib: Path) -> str:
    """The library's message in a process that loaded torch (and so libstdc++.so.6) first; a crash is a result."""
    script = ("import ctypes, torch\n"
              f"lib = ctypes.CDLL({str(lib)!r})\n"
              "buf = ctypes.create_string_buffer(64)\n"
              "lib.describe(ctypes.c_long(4242), buf, 64)\n"
              "print(buf.value.decode())\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    return r.stdout.strip() if r.returncode == 0 else f"exit {r.returncode}"


def exported_static_copy(so: Path) -> list[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout
    return [s for s in STATIC_COPY_SYMBOLS if f" {s}" in out]


def test_an_exported_static_libstdcxx_breaks_formatting_beside_torch(tmp_path):
    """The control: without the flag the failure this file guards against happens on this toolchain."""
    lib = build(tmp_path, "exported", [])
    assert exported_static_copy(lib), "the static copy should be exported without the flag"
    assert describe_beside_torch(lib) != "failed at line 4242"


def test_setup_keeps_a_static_libstdcxx_private(tmp_path):
    lib = build(tmp_path, "hidden", setup_constant("HIDE_STATIC_LIBS"))
    assert exported_static_copy(lib) == []
    assert describe_beside_torch(lib) == "failed at line 4242"


CATCHER = r"""
#include <cstring>
#include <exception>
extern "C" void raise_formatted(long line);
extern "C" int catch_it(long line, char* out, unsigned long n) {
  try { raise_formatted(line); } catch (const std::exception& e) { std::strncpy(out, e.what(), n - 1); return 1; }
  catch (...) { return 2; }
  return 0;
}
"""


def test_errors_thrown_by_a_private_copy_are_caught_as_std_exception(tmp_path):
    """What the dispatcher does with an op's error: a library on libstdc++.so.6 catches ``std::exception``
    thrown by the extension's private copy (the type match goes by name, so hiding the copy keeps it)."""
    lib = build(tmp_path, "hidden", setup_constant("HIDE_STATIC_LIBS"))
    catcher_src = tmp_path / "catcher.cpp"
    catcher_src.write_text(CATCHER)
    catcher = tmp_path / "libcatcher.so"
    subprocess.run(["g++", "-O2", "-fPIC", "-shared", str(catcher_src), str(lib), f"-Wl,-rpath,{tmp_path}",
                    "-o", str(catcher)], check=True, capture_output=True)
    script = ("import ctypes, torch\n"
              f"lib = ctypes.CDLL({str(catcher)!r})\n"
              "buf = ctypes.create_string_buffer(64)\n"
              "print(lib.catch_it(ctypes.c_long(7), buf, 64), buf.value.decode())\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout.strip()) == (0, "1 failed at line 7"), r.stderr[-500:]


def test_the_built_extensions_export_no_libstdcxx_copy():
    built = sorted((ROOT / "torch_aura").glob("_C_*.so"))
    if not built:
        pytest.skip("no native extension built in this checkout")
    assert {so.name: exported_static_copy(so) for so in built} == {so.name: [] for so in built}
