"""Per-KV-head schemes of ``AuraCache`` on the GPU: each head group runs the CUDA kernels on its own
store, and the whole must equal the CPU cache (whose groups tests/reference/test_aura_schemes.py checks
against dequantize-then-attend). ``scheme="auto"`` chooses on the device without leaving the budget.
"""

from __future__ import annotations

import pytest
import torch

import torch_aura as ta
from torch_aura.aura_cache import scheme_bits

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _pair(schemes, Hkv, D, capacity, **kw):
    return (ta.AuraCache(schemes, batch=2, kv_heads=Hkv, head_dim=D, capacity=capacity, **kw),
            ta.AuraCache(schemes, batch=2, kv_heads=Hkv, head_dim=D, capacity=capacity, device="cuda", **kw))


@pytest.mark.parametrize("Hkv,G,D", [(1, 8, 128), (2, 3, 64), (4, 2, 128), (3, 5, 256)])
def test_per_head_schemes_on_cuda_equal_the_cpu_cache(Hkv, G, D):
    g = torch.Generator().manual_seed(Hkv * 100 + G + D)
    pool = ["aura8v4", "aura4v2", "aura4", "aura3v8"]
    schemes = [pool[h % len(pool)] for h in range(Hkv)]
    cpu, gpu = _pair(schemes, Hkv, D, 300)
    K, V = torch.randn(2, 261, Hkv, D, generator=g), torch.randn(2, 261, Hkv, D, generator=g)
    for c in (cpu, gpu):
        dev = "cpu" if c is cpu else "cuda"
        c.append(K[:, :257].to(dev), V[:, :257].to(dev))  # block + 1 tokens, then single-token steps
        for t in range(257, 261):
            c.append(K[:, t].to(dev), V[:, t].to(dev))
    q = torch.randn(2, Hkv * G, D, generator=g)
    want, want_lse = cpu.decode(q)
    got, got_lse = gpu.decode(q.cuda())
    torch.testing.assert_close(got.cpu(), want, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(got_lse.cpu(), want_lse, atol=2e-4, rtol=2e-4)


def test_auto_schemes_on_cuda_keep_the_budget_and_decode_like_their_choice():
    g = torch.Generator().manual_seed(7)
    Hkv, G, D, budget = 4, 2, 128, 4.5
    K, V = torch.randn(1, 200, Hkv, D, generator=g), torch.randn(1, 200, Hkv, D, generator=g)
    K[:, :, 1, :4] *= 30  # outlier channels: the head that needs more key bits
    auto = ta.AuraCache("auto", batch=1, kv_heads=Hkv, head_dim=D, capacity=256, device="cuda",
                        bits_per_coordinate=budget)
    last = torch.randn(1, 8, Hkv * G, D, generator=g)  # the prefill's last queries, which the choice reads
    auto.append(K.cuda(), V.cuda(), queries=last.cuda())
    chosen = list(auto.schemes)
    assert len(chosen) == Hkv
    assert sum(scheme_bits(s, D) for s in chosen) / Hkv <= budget + 1e-9, chosen
    fixed = ta.AuraCache(chosen, batch=1, kv_heads=Hkv, head_dim=D, capacity=256, device="cuda")
    fixed.append(K.cuda(), V.cuda())
    q = torch.randn(1, Hkv * G, D, generator=g).cuda()
    torch.testing.assert_close(auto.decode(q)[0], fixed.decode(q)[0], atol=0, rtol=0)
