"""backends.status(), the warn-once / strict fallback policy and the TORCH_AURA_BACKENDS switch."""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import torch_aura
from torch_aura import backends
from torch_aura._schema import OPS
from torch_aura.cpu import FAST_PATHS


def test_status_covers_every_op_and_device():
    table = backends.status()
    assert set(table) == set(OPS)
    for op, row in table.items():
        assert set(row) == {"cpu", "cuda", "mps"}
        # CPU: a fast path of torch_aura.cpu where one exists (_C_cpu builds wherever a C++ compiler
        # does, CI included), else the reference
        assert row["cpu"] == ("kernel (cpu)" if op in FAST_PATHS else "reference"), (op, row["cpu"])
        for dev in ("cuda", "mps"):
            # either a kernel, or the reference with a reason in parentheses
            assert row[dev].startswith("kernel (") or (row[dev].startswith("reference (") and len(row[dev]) > 15)


@pytest.mark.skipif(sys.platform == "darwin", reason="Linux-only reason string")
def test_status_says_why_mps_is_not_served_on_linux():
    assert backends.status()["flash_decode"]["mps"] == "reference (mps extension not built: not macOS)"


@pytest.mark.skipif(torch.version.cuda is not None, reason="CPU-only torch expected")
def test_status_says_why_cuda_is_not_served_on_cpu_torch():
    row = backends.status()
    assert "no CUDA" in row["flash_decode"]["cuda"]
    assert "no GPU support" in row["gdn_chunk"]["cuda"]


def test_fallback_warns_once_per_op_and_device(monkeypatch):
    monkeypatch.delenv("TORCH_AURA_STRICT", raising=False)
    monkeypatch.setattr(backends, "_WARNED", set())
    monkeypatch.setattr(backends, "_FORCED_REF", False)
    dev = torch.device("cuda")  # a device object only: no CUDA needed
    with pytest.warns(UserWarning, match="aura::flash_decode on cuda runs the pure-PyTorch reference"):
        backends.note_reference_fallback("flash_decode", dev)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backends.note_reference_fallback("flash_decode", dev)  # second time: silent


def test_strict_turns_fallback_into_error(monkeypatch):
    monkeypatch.setenv("TORCH_AURA_STRICT", "1")
    monkeypatch.setattr(backends, "_FORCED_REF", False)
    with pytest.raises(RuntimeError, match="aura::gdn_chunk on cuda: no kernel .*TORCH_AURA_STRICT=1"):
        backends.note_reference_fallback("gdn_chunk", torch.device("cuda"))


def test_forced_reference_never_warns_or_raises(monkeypatch):
    monkeypatch.setenv("TORCH_AURA_STRICT", "1")
    monkeypatch.setattr(backends, "_FORCED_REF", True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backends.note_reference_fallback("gdn_chunk", torch.device("cuda"))


def _status_in_subprocess(env):
    code = "import json, torch_aura; print(json.dumps(torch_aura.backends.status()))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def test_backends_ref_kill_switch():
    table, _ = _status_in_subprocess({"TORCH_AURA_BACKENDS": "ref"})
    for op, row in table.items():
        assert row["cpu"] == ("reference (disabled by TORCH_AURA_BACKENDS=ref)" if op in FAST_PATHS else "reference")
        assert row["cuda"] == "reference (disabled by TORCH_AURA_BACKENDS=ref)"
        assert row["mps"] == "reference (disabled by TORCH_AURA_BACKENDS=ref)"


def test_backends_subset_and_unknown_name_warns_without_failing_import():
    table, stderr = _status_in_subprocess({"TORCH_AURA_BACKENDS": "triton,bogus"})
    assert "ignoring unknown backend(s) ['bogus']" in stderr
    assert "excluded by TORCH_AURA_BACKENDS=triton,bogus" in table["flash_decode"]["cuda"]


def test_reference_serves_cpu_without_warning():
    q = torch.randn(1, 2, 64)
    k = torch.randn(1, 1, 5, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, lse = torch_aura.flash_decode(q, k, k, torch.tensor([5], dtype=torch.int32))
    assert out.shape == (1, 2, 64) and lse.shape == (1, 2)
