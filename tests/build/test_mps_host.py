"""Static checks of the Objective-C++ host (csrc/mps/*.mm), which no Linux machine can compile:
it reaches the kernels only through the portable plans the emulator tests run, follows the MPS
stream rules of docs/metal.md §7, and the shaders it embeds are self-contained."""

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import _metal

REPO = Path(__file__).resolve().parents[2]
MPS = REPO / "csrc" / "mps"
HOST = {p.name: p.read_text() for p in MPS.glob("*.mm")}
HARNESS = (MPS / "emu" / "harness.cpp").read_text()


def _code(text: str) -> str:
    """Source without // comments (the rules below are about code, not about why)."""
    return re.sub(r"//[^\n]*", "", text)


def test_host_and_emulator_run_the_same_plan_entry_points():
    host = _code(HOST["register.mm"])
    for fn in ("output_specs(", "plan_op("):
        assert fn in host, f"register.mm does not call {fn}"
        assert fn in _code(HARNESS), f"the emulator harness does not call {fn}"
    assert '#include "plan/launch_plan.h"' in (MPS / "mps_host.h").read_text()
    assert '#include "../plan/launch_plan.h"' in HARNESS
    # nothing in the host computes grids itself: every launch comes out of a plan
    assert "dispatchThreadgroups" in HOST["encode.mm"] and "l.groups" in HOST["encode.mm"]


def test_registration_is_impl_only():
    host = _code(HOST["register.mm"])
    assert "TORCH_LIBRARY_IMPL(aura, MPS, m)" in host
    assert "TORCH_LIBRARY(" not in host and "m.def(" not in host


def test_stream_rules():
    code = _code("\n".join(HOST.values()))
    # the stream's own encoder, inside its queue; never a new encoder, never commit or wait
    assert "stream->commandEncoder()" in code and "dispatch_sync(stream->queue()" in code
    for banned in ("computeCommandEncoder", "endEncoding", "commit]", "waitUntilCompleted", "commandBuffer]"):
        assert banned not in code, banned
    # views: the byte offset of every binding is the storage offset
    assert "setBuffer:mtl_buffer(t) offset:byte_offset(t)" in code
    assert "storage_offset() * t.element_size()" in code
    # ARC: headers with inline retain/release are not included anywhere under csrc/mps
    banned_include = re.compile(r'#\s*include\s*[<"][^>"]*(OperationUtils|MPSAllocator)\.h')
    for path in MPS.rglob("*"):
        if path.suffix in (".mm", ".h", ".cpp"):
            assert not banned_include.search(path.read_text()), path


def test_setup_builds_the_host_with_the_plans_on_macos_only():
    setup = (REPO / "setup.py").read_text()
    assert 'sys.platform != "darwin"' in setup and "csrc/mps/plan/*.cpp" in setup and "-fobjc-arc" in setup


def _embed():
    spec = importlib.util.spec_from_file_location("embed_metal", REPO / "csrc" / "mps" / "embed_metal.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_embedded_sources_are_self_contained_and_pass_the_lint(tmp_path):
    clang = _metal.clang_or_skip()
    embed = _embed()
    sources = embed.shader_sources()
    assert set(sources) == {p.name for p in _metal.SHADERS}
    for name, src in sources.items():
        assert not re.search(r'^\s*#\s*include\s+"', src, re.M), f"{name}: a local include survived"
        path = tmp_path / name  # no include path: only what was inlined
        path.write_text(src)
        cmd = [c for c in _metal.lint_command(clang, path) if not c.startswith("-I")]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
    header = embed.header_text()
    assert header.count("R\"AURA_MSL(") == len(sources)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_plans_are_portable_cxx():
    # The plans compile with Apple clang on a Mac; g++ -Wall -Werror here catches what is not
    # plain C++20 (the emulator build uses clang and would hide g++-only diagnostics).
    for src in sorted((MPS / "plan").glob("*.cpp")):
        r = subprocess.run(["g++", "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", str(src)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{src.name}: {r.stderr[-3000:]}"


def test_registration_unit_compiles_as_cxx():
    # register.mm holds no Objective-C: it compiles as C++ against this torch's headers, so the
    # boxed kernel (stack layout, schema types, dispatcher API) is checked on every machine.
    import sysconfig

    import torch

    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    inc = Path(torch.__file__).parent / "include"
    cmd = [cxx, "-x", "c++", "-std=c++20", "-fsyntax-only", f"-I{inc}", f"-I{inc / 'torch/csrc/api/include'}",
           f"-I{sysconfig.get_paths()['include']}", f"-I{REPO / 'csrc'}", f"-I{MPS}", str(MPS / "register.mm")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-5000:]


def test_encode_unit_compiles_as_objective_cxx_against_stub_frameworks(tmp_path):
    # Without a macOS SDK, encode.mm is checked against minimal stubs of the Apple declarations
    # it uses (tests/build/objc_stubs) plus the real ATen/mps headers, with ARC and blocks on and
    # the shader header generated as setup.py generates it. This catches C++/ObjC mistakes (the
    # first run found a raw-string delimiter over the 16-character limit), not SDK drift.
    import torch

    clang = _metal.clang_or_skip()
    _embed().write_header(tmp_path / "aura_shader_sources.h")
    inc = Path(torch.__file__).parent / "include"
    cmd = [clang, "-x", "objective-c++", "-fobjc-arc", "-fblocks", "-fobjc-runtime=gnustep-2.0", "-std=c++20",
           "-fsyntax-only", f"-I{Path(__file__).with_name('objc_stubs')}", f"-I{inc}",
           f"-I{inc / 'torch/csrc/api/include'}", f"-I{REPO / 'csrc'}", f"-I{MPS}", f"-I{tmp_path}",
           str(MPS / "encode.mm")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-5000:]
