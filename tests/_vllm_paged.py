"""A vLLM-shaped batch driven through ``torch_aura.integrations.vllm._paged`` (the attention the
vLLM backend runs), checked against attention over the gathered pages. Shared by the CPU tests
(tests/integrations) and the GPU tests (tests/cuda), where vLLM itself cannot be installed."""

from __future__ import annotations

import torch

from torch_aura.integrations.vllm._paged import (AuraPages, DensePages, aura_slot_bytes, plan_batch)

HQ, HKV, BLOCK, NUM_BLOCKS, WIDTH = 4, 2, 16, 40, 8  # WIDTH: block-table columns (128 tokens)


def make_pages(fmt: str, D: int, dtype, device, pad: int | None = None):
    """vLLM's per-layer LBNHC view ``[num_blocks, Hkv, block_size, C]`` over a page stride padded by
    ``pad`` elements (default: 64 bytes / 2D elements, not a whole token row, as hybrid models get)."""
    C = 2 * D if fmt == "dense" else aura_slot_bytes(D, *fmt)
    cell = dtype if fmt == "dense" else torch.uint8
    page = BLOCK * HKV * C + ((64 if fmt != "dense" else 2 * D) if pad is None else pad)
    raw = torch.zeros(NUM_BLOCKS * page, dtype=cell, device=device)
    return raw.as_strided((NUM_BLOCKS, HKV, BLOCK, C), (page, C, HKV * C, 1))


def make_attention(fmt, D, scale, layer=3):
    if fmt == "dense":
        return DensePages(HQ, D, scale)
    return AuraPages(HQ, D, scale, *fmt, layer=layer)


def batch(query_lens, context_lens, device, seed=0):
    """A batch of requests (decodes first) with the given new-token and cached-prefix lengths."""
    g = torch.Generator().manual_seed(seed)
    R = len(query_lens)
    # every request its own blocks (never block 0: vLLM's null block), in shuffled order
    perm = (torch.randperm(NUM_BLOCKS - 1, generator=g) + 1)[:R * WIDTH].view(R, WIDTH)
    seq = [q + c for q, c in zip(query_lens, context_lens)]
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    return dict(block_table=perm.to(torch.int32).to(device),
                seq_lens=torch.tensor(seq, dtype=torch.int32, device=device),
                query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
                query_lens=list(query_lens), context_lens=list(context_lens))


def slots_of(b, r, positions):
    table = b["block_table"][r].long().cpu()
    pos = torch.as_tensor(positions, dtype=torch.int64)
    return table[pos // BLOCK] * BLOCK + pos % BLOCK


def run_batch(fmt, D, dtype, device, query_lens, context_lens, num_decodes, seed=0, pad=3, page_pad=None):
    """Write each request's prefix, then run one step (write the new K/V, attend); returns
    ``(out, reference, pages_before_step, pages_after, step_slots)``. ``pad`` extra padded tokens
    (slot -1, garbage K/V) ride along as vLLM pads CUDA-graph batches."""
    torch.manual_seed(seed)
    b = batch(query_lens, context_lens, device, seed)
    scale = D ** -0.5
    pages = make_pages(fmt, D, dtype, device, page_pad)
    attn = make_attention(fmt, D, scale)
    R = len(query_lens)
    keys = [torch.randn(s, HKV, D, dtype=dtype, device=device) for s in b["seq_lens"].tolist()]
    vals = [torch.randn(s, HKV, D, dtype=dtype, device=device) for s in b["seq_lens"].tolist()]
    for r in range(R):  # the prefix, written by earlier steps
        c = context_lens[r]
        if c:
            attn.write(keys[r][:c], vals[r][:c], pages, slots_of(b, r, range(c)).to(device))
    step_k = torch.cat([keys[r][context_lens[r]:] for r in range(R)])
    step_v = torch.cat([vals[r][context_lens[r]:] for r in range(R)])
    slots = torch.cat([slots_of(b, r, range(context_lens[r], context_lens[r] + query_lens[r]))
                       for r in range(R)]).to(device)
    n = step_k.shape[0]
    garbage = torch.full((pad, HKV, D), 1e4, dtype=dtype, device=device)
    before = pages.clone()
    attn.write(torch.cat([step_k, garbage]), torch.cat([step_v, garbage]), pages,
               torch.cat([slots, torch.full((pad,), -1, dtype=torch.int64, device=device)]))
    ndt = sum(query_lens[:num_decodes])
    plan = plan_batch(seq_lens=b["seq_lens"], block_table=b["block_table"],
                      query_start_loc=b["query_start_loc"], num_decodes=num_decodes,
                      num_decode_tokens=ndt, num_prefills=R - num_decodes, num_prefill_tokens=n - ndt,
                      num_actual_tokens=n, max_query_len=max(query_lens),
                      max_seq_len=int(b["seq_lens"].max()), block_size=BLOCK)
    q = torch.randn(n + pad, HQ, D, dtype=dtype, device=device)
    out = torch.full((n + pad, HQ, D), 7.0, dtype=dtype, device=device)
    attn.forward(q, pages, plan, out)
    ref = reference(attn, fmt, pages, b, q[:n], scale)
    return out, ref, before, pages, slots, attn, plan, q


def reference(attn, fmt, pages, b, q, scale):
    """fp64 causal attention of each query over its request's pages (dequantized for AURA)."""
    if fmt == "dense":
        k_pages, v_pages = attn.kv(pages)
    else:
        kc, kn, vc, vn = attn.kv(pages)
        cbk, _, cbv, _, ks, vs = attn.tables(pages.device)
        k_pages = torch.ops.aura.aura_dequantize(kc, kn, cbk, attn.key_bits, ks, None)
        v_pages = torch.ops.aura.aura_dequantize(vc, vn, cbv, attn.value_bits, vs, None)
    outs, t0 = [], 0
    for r, (ql, cl) in enumerate(zip(b["query_lens"], b["context_lens"])):
        table = b["block_table"][r].long()
        k = k_pages[table].reshape(-1, HKV, k_pages.shape[-1]).double()
        v = v_pages[table].reshape(-1, HKV, v_pages.shape[-1]).double()
        for i in range(ql):
            pos = cl + i
            qi = q[t0 + i].double().view(HKV, HQ // HKV, -1)
            logits = torch.einsum("hgd,thd->hgt", qi, k[:pos + 1]) * scale
            outs.append(torch.einsum("hgt,thd->hgd", logits.softmax(-1), v[:pos + 1]).reshape(HQ, -1))
        t0 += ql
    return torch.stack(outs)
