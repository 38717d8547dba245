"""Comparison helpers and the one table of tolerances, shared by every test tree.

The metric is FLA's (``fla/utils/_testing.py``): an exact-match shortcut (max abs diff <= 1e-6),
else the relative RMS ``rms(out - ref) / rms(ref)`` against a ratio; NaN/Inf in the output is
always a failure unless the reference has it at the same place.
"""

from __future__ import annotations

import torch

from torch_aura.testing import max_rel, rel_rms  # noqa: F401  (re-exported for the tests)

# Relative-RMS gates, kernel vs reference, per input dtype (tests may tighten per family).
RATIO = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 5e-3}

# Family gates from targets.md / gdn.md.
GDN_CHUNK_RATIO = 5e-3
GDN_RECURRENT_RATIO = 2e-3
FP32_MAX_REL = 1e-4  # decode and AURA kernels vs reference in fp32


def assert_finite_like(name: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    bad_out, bad_ref = ~torch.isfinite(out), ~torch.isfinite(ref)
    assert torch.equal(bad_out, bad_ref), (
        f"{name}: non-finite values differ: {int(bad_out.sum())} in output, {int(bad_ref.sum())} in reference")


def assert_close(name: str, out: torch.Tensor, ref: torch.Tensor, ratio: float) -> None:
    """FLA-style check: exact shortcut, else relative RMS < ratio; NaN never passes silently."""
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert_finite_like(name, out, ref)
    fin = torch.isfinite(ref)
    o, r = out[fin].double(), ref[fin].double()
    if o.numel() == 0 or (o - r).abs().max().item() <= 1e-6:
        return
    err = rel_rms(o, r)
    assert err < ratio, f"{name}: relative RMS {err:.3e} >= {ratio:.1e} (max abs diff {(o - r).abs().max().item():.3e})"


def assert_max_rel(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float = FP32_MAX_REL) -> None:
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert_finite_like(name, out, ref)
    fin = torch.isfinite(ref)
    err = max_rel(out[fin], ref[fin])
    assert err <= tol, f"{name}: max relative error {err:.3e} > {tol:.1e}"


def dtype_id(dt: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dt, str(dt))
