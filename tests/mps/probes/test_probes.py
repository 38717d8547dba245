"""Probes that close what the Linux emulator can only assume (docs/metal.md §8), on any Mac:
Apple's compiler accepts every shipped shader without warnings; the simdgroup_matrix lane layout
is the documented one; fast-math errors are measured; pipeline limits are printed."""

import importlib.util
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("embed_metal", REPO / "csrc" / "mps" / "embed_metal.py")
embed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(embed)

pytestmark = pytest.mark.skipif(not torch.backends.mps.is_available(), reason="no MPS device")

PROBES = embed.inline_includes(Path(__file__).with_name("probes.metal"))


@pytest.mark.parametrize("name", sorted(embed.shader_sources()))
def test_compile_probe(name, recwarn):
    torch.mps.compile_shader(embed.shader_sources()[name])
    assert not [w for w in recwarn.list if "metal" in str(w.message).lower()], [str(w.message) for w in recwarn.list]


def test_layout_probe_matches_the_documented_table():
    lib = torch.mps.compile_shader(PROBES)
    cells = torch.arange(64, dtype=torch.float32, device="mps")
    out = torch.zeros(64 * 3, device="mps")
    lib.probe_simdgroup_layout(cells, out, threads=32, group_size=32)
    for lane, e, value in out.view(64, 3).cpu().tolist():
        lane, e = int(lane), int(e)
        row, col = 4 * (lane // 16) + (lane // 2) % 4, 4 * ((lane // 8) % 2) + 2 * (lane % 2) + e
        assert value == 8 * row + col, (lane, e, value)


def _ulp(got: torch.Tensor, want: torch.Tensor) -> float:
    spacing = torch.nextafter(want.float(), torch.tensor(float("inf"))) - want.float()
    return float(((got.double() - want) / spacing.double()).abs().nan_to_num(0.0).max())


def test_numerics_probe_reports_ulp_errors():
    lib = torch.mps.compile_shader(PROBES)
    x = torch.linspace(-10, 10, 1 << 16)
    n = torch.tensor([x.numel()], dtype=torch.int32, device="mps")
    out = torch.zeros(13 * x.numel(), device="mps")
    lib.probe_numerics(x.to("mps"), out, n, threads=x.numel(), group_size=256)
    got = out.cpu().view(13, -1)
    xd = x.double()
    la = (xd.abs() + 1e-3)
    refs = [xd.exp()] * 3 + [torch.exp2(xd)] * 3 + [la.log()] * 3 + [xd.tanh(), la.rsqrt()]
    names = ["exp", "fast::exp", "precise::exp", "exp2", "fast::exp2", "precise::exp2", "log", "fast::log",
             "precise::log", "tanh", "rsqrt"]
    report = {name: _ulp(got[i], refs[i]) for i, name in enumerate(names)}
    print("max ULP error:", report)
    assert report["precise::exp"] <= 4 and report["precise::log"] <= 4, report
    bf_add = (x.bfloat16() + (0.3 * x).bfloat16()).float()
    bf_mul = (x.bfloat16() * torch.tensor(1.7).bfloat16()).float()
    print("bfloat add/mul mismatches:", int((got[11] != bf_add).sum()), int((got[12] != bf_mul).sum()))


def test_limits_probe():
    lib = torch.mps.compile_shader(embed.shader_sources()["decode.metal"])
    fn = getattr(lib, "flash_decode_split_f16_128")
    for attr in ("max_threads_per_threadgroup", "thread_execution_width", "static_thread_group_memory_length"):
        print(attr, getattr(fn, attr, "n/a"))
    assert getattr(fn, "thread_execution_width", 32) == 32
    assert getattr(fn, "max_threads_per_threadgroup", 1024) >= 128
