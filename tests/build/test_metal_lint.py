"""The lint build of every Metal shader (docs/metal.md §4): clang -fsyntax-only with `device`,
`constant` and `threadgroup` as real address spaces, so an address-space mistake that the
emulation build (empty macros) would accept fails here as it would on Apple's compiler."""

import subprocess

import pytest

import _metal



@pytest.fixture(scope="module")
def clang():
    return _metal.clang_or_skip()


@pytest.mark.parametrize("source", _metal.SHADERS + _metal.TEST_SHADERS, ids=lambda p: p.name)
def test_shader_passes_the_address_space_lint(clang, source):
    r = subprocess.run(_metal.lint_command(clang, source), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-5000:]


BAD_SHADER = """
#include "aura_compat.h"
inline float first(thread const float* x) { return x[0]; }
kernel void bad(device const float* x [[buffer(0)]], device float* y [[buffer(1)]]) {
  y[0] = first(x);  // a device pointer where a thread one is expected
}
AURA_REGISTER(bad)
"""


def test_lint_rejects_a_device_pointer_passed_as_thread(clang, tmp_path):
    src = tmp_path / "bad.metal"
    src.write_text(BAD_SHADER)
    lint = subprocess.run(_metal.lint_command(clang, src), capture_output=True, text=True, timeout=300)
    assert lint.returncode != 0 and "address space" in lint.stderr, lint.stderr[-3000:]
    # the emulation build accepts the same source: that is why the lint build exists
    emu = subprocess.run([c for c in _metal.lint_command(clang, src) if c != "-DAURA_METAL_LINT"],
                         capture_output=True, text=True, timeout=300)
    assert emu.returncode == 0, emu.stderr[-3000:]
