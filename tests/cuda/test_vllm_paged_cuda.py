"""The vLLM backend's attention (``integrations/vllm/_paged.py``) on CUDA tensors, driven with the
batch plan vLLM's metadata builds (vLLM itself cannot be installed on the GPU machine): decode,
speculative and prefill rows against fp64 attention over the pages, and the uniform one-token decode
step captured in a CUDA graph and replayed with new lengths, as vLLM replays it."""

from __future__ import annotations

import pytest
import torch

from _vllm_paged import BLOCK, HKV, HQ, make_attention, make_pages, run_batch
from torch_aura.integrations.vllm._paged import plan_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
DEV = "cuda"
FORMATS = {"dense": "dense", "aura8": (8, 8), "aura4v2": (4, 2)}
BATCHES = {
    "decode": ([1, 1, 1], [0, BLOCK - 1, 2 * BLOCK + 4], 3),
    "spec+prefill": ([3, 3, 13, BLOCK + 1], [5, BLOCK, 20, 0], 2),
    "prefill": ([BLOCK - 1, 1, 2 * BLOCK], [0, 40, BLOCK + 1], 0),
}


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128])
def test_batch_matches_attention_over_the_pages(batch, fmt, dtype, D):
    query_lens, context_lens, nd = BATCHES[batch]
    out, ref, *_ = run_batch(FORMATS[fmt], D, dtype, DEV, query_lens, context_lens, nd)
    n = ref.shape[0]
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out[:n].double(), ref, atol=tol, rtol=tol)
    assert (out[n:] == 7.0).all()


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_uniform_decode_step_in_a_cuda_graph(fmt):
    """write + decode of one token per request, captured once and replayed with the lengths and
    slots of later steps written into the same tensors (vLLM's persistent buffers)."""
    D, R, dtype = 128, 4, torch.bfloat16
    scale = D ** -0.5
    pages = make_pages(FORMATS[fmt], D, dtype, DEV)
    attn = make_attention(FORMATS[fmt], D, scale)
    g = torch.Generator().manual_seed(0)
    table = (torch.randperm(pages.shape[0] - 1, generator=g) + 1)[:R * 8].view(R, 8).to(torch.int32).to(DEV)
    seq_lens = torch.zeros(R, dtype=torch.int32, device=DEV)
    starts = torch.arange(R + 1, dtype=torch.int32, device=DEV)
    slots = torch.zeros(R, dtype=torch.int64, device=DEV)
    q = torch.zeros(R, HQ, D, dtype=dtype, device=DEV)
    k = torch.zeros(R, HKV, D, dtype=dtype, device=DEV)
    v = torch.zeros_like(k)
    out = torch.zeros(R, HQ, D, dtype=dtype, device=DEV)
    plan = plan_batch(seq_lens=seq_lens, block_table=table, query_start_loc=starts, num_decodes=R,
                      num_decode_tokens=R, num_prefills=0, num_prefill_tokens=0, num_actual_tokens=R,
                      max_query_len=1, max_seq_len=8 * BLOCK, block_size=BLOCK)

    def step():
        attn.write(k, v, pages, slots)
        attn.forward(q, pages, plan, out)

    def set_step(t):  # token t of every request: its slot, its length, fresh q / k / v
        seq_lens.fill_(t + 1)
        slots.copy_(table[:, t // BLOCK].long() * BLOCK + t % BLOCK)
        for x in (q, k, v):
            x.normal_()

    # warm up (and allocate the dense path's lse buffer) outside the capture, as vLLM does
    set_step(0)
    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    eager_pages = pages.clone()
    for t in range(1, 3 * BLOCK + 2):  # across three page boundaries
        set_step(t)
        graph.replay()
        got = out.clone()
        replayed = pages.clone()
        pages.copy_(eager_pages)
        step()  # the same step eagerly from the same pages
        assert torch.equal(pages, replayed)
        torch.testing.assert_close(got, out, atol=0, rtol=0)
        eager_pages = pages.clone()


@pytest.mark.sanitize
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_small_batch_for_compute_sanitizer(fmt):
    out, ref, *_ = run_batch(FORMATS[fmt], 64, torch.float32, DEV, [3, 1, 13, BLOCK + 1], [5, 0, 20, 0], 2)
    torch.testing.assert_close(out[:ref.shape[0]].double(), ref, atol=1e-4, rtol=1e-4)
