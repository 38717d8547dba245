"""TORCH_AURA_DEBUG=1 (torch_aura/_debug.py): without it the wrappers are the plain functions (no
cost); with it, inputs on a non-CPU device go through the reference's data checks first. The GPU
twin (tests/cuda/test_debug_mode_cuda.py) raises the CPU's errors from CUDA tensors."""

import subprocess
import sys

import torch

import torch_aura
from torch_aura import _debug
from torch_aura._schema import OPS


def test_off_by_default_and_free():
    assert not _debug.ENABLED
    for name in OPS:
        fn = getattr(torch_aura, name, None)
        if fn is not None:
            assert not hasattr(fn, "__wrapped__"), f"{name} is wrapped although TORCH_AURA_DEBUG is off"


def test_on_every_public_op_is_validated():
    code = ("import torch_aura\nfrom torch_aura._schema import OPS\n"
            "missing = [n for n in OPS if not hasattr(getattr(torch_aura, n), '__wrapped__')]\n"
            "assert not missing, missing\nprint('ok')")
    r = subprocess.run([sys.executable, "-c", code], env={**__import__("os").environ, "TORCH_AURA_DEBUG": "1"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]


def test_the_check_runs_the_reference_on_cpu_copies(monkeypatch):
    # a device other than the CPU, stood in by 'meta': the decorator must run the reference's
    # data check on CPU copies (here: seq_lens past the cache) before the op is called
    calls = []
    monkeypatch.setattr(_debug, "ENABLED", True)

    def flash_decode(q, k_cache, v_cache, seq_lens, block_table=None, scale=None, num_splits=0):
        calls.append("kernel")

    wrapped = _debug.validated(flash_decode)
    q, k = torch.randn(2, 4, 64), torch.randn(2, 2, 16, 64)
    seq = torch.tensor([3, 17], dtype=torch.int32)

    class Moved(torch.Tensor):  # CPU data that reports another device
        @property
        def device(self):
            return torch.device("meta")

    import pytest

    def moved(*ts):
        return [t.as_subclass(Moved) for t in ts]

    with pytest.raises(ValueError, match=r"seq_lens: expected values in \[0, 16\]"):
        wrapped(*moved(q, k, k.clone(), seq))
    assert calls == []
    wrapped(*moved(q, k, k.clone(), torch.tensor([3, 16], dtype=torch.int32)))
    assert calls == ["kernel"]
