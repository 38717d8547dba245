"""AuraCache(sink_tokens, recent_tokens) on CUDA (issue 43, deliverable 1): the same appends on the
GPU and on the CPU give the same decode (the GPU's aura_decode + flash_decode on one-token pages +
merge_attn_states against the CPU reference), and a decode step captured in a CUDA graph replays
through the ring's wrap-around. Written without a GPU; runs where tests/cuda runs."""

from __future__ import annotations

import pytest
import torch

import torch_aura as ta

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _pair(S, W, dtype, B=2, Hkv=2, D=128, cap=300):
    return [ta.AuraCache("aura4v2", batch=B, kv_heads=Hkv, head_dim=D, capacity=cap, sink_tokens=S,
                         recent_tokens=W, dtype=dtype, device=dev) for dev in ("cpu", "cuda")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("S,W,T", [(4, 128, 200), (4, 0, 50), (0, 64, 3), (16, 32, 40)])
def test_window_decode_matches_cpu(dtype, S, W, T):
    g = torch.Generator().manual_seed(S + W + T)
    cpu, gpu = _pair(S, W, dtype)
    k, v = (torch.randn(2, T, 2, 128, generator=g).to(dtype) for _ in range(2))
    for c in (cpu, gpu):
        c.append(k.to(c.device), v.to(c.device))
    for _ in range(20):
        k1, v1, q = (torch.randn(2, *s, generator=g).to(dtype) for s in ((2, 128), (2, 128), (8, 128)))
        for c in (cpu, gpu):
            c.append(k1.to(c.device), v1.to(c.device))
        (o_c, l_c), (o_g, l_g) = cpu.decode(q), gpu.decode(q.cuda())
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        assert (o_g.cpu().float() - o_c.float()).norm() <= tol * o_c.float().norm()
        assert torch.allclose(l_g.cpu(), l_c, atol=1e-3)


def test_window_decode_step_replays_in_a_cuda_graph():
    g = torch.Generator().manual_seed(1)
    cpu, gpu = _pair(4, 16, torch.bfloat16)
    k, v = (torch.randn(2, 30, 2, 128, generator=g).bfloat16() for _ in range(2))
    for c in (cpu, gpu):
        c.append(k.to(c.device), v.to(c.device))
    k1, v1, q = (torch.zeros(2, *s, dtype=torch.bfloat16, device="cuda") for s in ((2, 128), (2, 128), (8, 128)))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm-up off the capture, as CUDA graphs require
        gpu.append(k1, v1)
        gpu.decode(q)
    torch.cuda.current_stream().wait_stream(stream)
    gpu.crop(1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gpu.append(k1, v1)
        out, _ = gpu.decode(q)  # capture records, does not run: seq_lens still 30 here
    for _ in range(40):  # past the ring's wrap-around
        step = [torch.randn(2, *s, generator=g).bfloat16() for s in ((2, 128), (2, 128), (8, 128))]
        for dst, src in zip((k1, v1, q), step):
            dst.copy_(src)
        graph.replay()
        cpu.append(step[0], step[1])
        ref, _ = cpu.decode(step[2])
        assert (out.cpu().float() - ref.float()).norm() <= 2e-2 * ref.float().norm()
