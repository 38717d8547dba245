"""g outside (-inf, 0): every GDN backend reads it as clamp(g, G_MIN, 0) (reference/gdn.py). The
reference here; the Triton kernels in tests/interp, the Metal kernels under the emulator in
tests/interp/metal, the CUDA kernels in tests/cuda run the same check."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from _gdn_check import check_decay_domain
from torch_aura.reference import gdn as ref

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_reference_chunk_and_recurrence_read_g_as_a_clamped_log_decay(dtype):
    check_decay_domain(SimpleNamespace(gdn_chunk=ref.gdn_chunk, gdn_recurrent=ref.gdn_recurrent), "cpu", dtype)


def test_g_min_is_one_value_in_every_backend():
    triton_src = (REPO / "triton_kernels" / "gdn" / "_jit.py").read_text()
    metal_src = (REPO / "csrc" / "mps" / "shaders" / "gdn.metal").read_text()
    assert float(re.search(r"G_MIN = tl\.constexpr\(([-\d.]+)\)", triton_src).group(1)) == ref.G_MIN
    assert float(re.search(r"GDN_G_MIN = ([-\d.]+)f;", metal_src).group(1)) == ref.G_MIN
    assert torch.exp(torch.tensor(ref.G_MIN, dtype=torch.float64)) < 1e-8  # a full forget at fp32
