"""TORCH_AURA_DEBUG=1 on CUDA: data errors raise the CPU's ValueError (same message) before the
kernel runs; without it the kernels clamp or skip (README "Out-of-range data")."""

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

SCRIPT = r'''
import torch, torch_aura as ta
dev = "{dev}"
g = torch.Generator().manual_seed(0)
q, k = torch.randn(2, 4, 64, generator=g).to(dev), torch.randn(2, 2, 16, 64, generator=g).to(dev)
cb, bd = ta.aura_codebook(4, 64, dev)
cases = {{
    "flash_decode": lambda: ta.flash_decode(q, k, k, torch.tensor([3, 17], dtype=torch.int32, device=dev)),
    "aura_write_cache": lambda: ta.aura_write_cache(torch.randn(2, 2, 64, device=dev),
        torch.zeros(1, 2, 8, 8, dtype=torch.int32, device=dev), torch.zeros(1, 2, 8, device=dev),
        torch.tensor([3, 9], device=dev), cb, bd, 4),
    "gdn_recurrent": lambda: ta.gdn_recurrent(torch.randn(1, 1, 1, 16, device=dev), torch.randn(1, 1, 1, 16, device=dev),
        torch.randn(1, 1, 1, 16, device=dev), -torch.rand(1, 1, 1, device=dev), torch.rand(1, 1, 1, device=dev),
        torch.zeros(2, 1, 16, 16, device=dev), torch.tensor([5], dtype=torch.int32, device=dev)),
}}
for name, call in cases.items():
    try:
        call()
        torch.cuda.synchronize() if dev == "cuda" else None
        print(name, "NO ERROR")
    except ValueError as e:
        print(name, "ValueError:", e)
'''


def _run(dev, debug):
    env = {**os.environ, "TORCH_AURA_DEBUG": "1" if debug else "0"}
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(dev=dev)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())


def test_debug_mode_raises_the_cpu_errors_on_cuda():
    cpu = _run("cpu", debug=False)
    cuda = _run("cuda", debug=True)
    for name, msg in cpu.items():
        assert msg.startswith("ValueError"), (name, msg)
        assert cuda[name] == msg, (name, cuda[name], msg)
    # without it the kernels clamp / skip: no error, as documented
    assert set(_run("cuda", debug=False).values()) == {"NO ERROR"}
