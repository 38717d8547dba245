"""One decode step of torch_aura's vLLM backend (write the new token's K/V, then attend) over vLLM-
shaped pages, dense and AURA-compressed, beside SDPA over a contiguous cache of the same tokens.

vLLM cannot be installed on the lent GPU machine, so this drives the backend's own attention code
(``torch_aura/integrations/vllm/_paged.py``) with the batch plan vLLM's metadata would build:
block 16 (vLLM's GPU default), pages in shuffled order, bf16. Every provider is checked before it
is timed: dense pages against SDPA, AURA pages against dense decode over their dequantized pages.
Times: eager with a cold L2 and as CUDA-graph replays, plus the host time of an eager call.

    python benchmarks/bench_vllm_paged.py [--out DIR]
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from torch_aura.integrations.vllm._paged import AuraPages, DensePages, aura_slot_bytes, plan_batch

import _harness as h


BLOCK, D = 16, 128
# (B, T, Hq, Hkv): a 32/8-head model (Llama-3-8B) and its TP4 shard (8/2 heads per GPU)
SHAPES = [(1, 32768, 32, 8), (8, 8192, 32, 8), (32, 4096, 32, 8), (8, 32768, 8, 2)]
FORMATS = {"dense pages": None, "aura4v2 pages": (4, 2), "aura8 pages": (8, 8)}


def case(B, T, Hq, Hkv, fmt):
    """(step function, its output, the check's reference, bytes per token per layer)."""
    torch.manual_seed(0)
    dev, dtype, scale = "cuda", torch.bfloat16, D ** -0.5
    nb = B * T // BLOCK + 1
    C = 2 * D if fmt is None else aura_slot_bytes(D, *fmt)
    pages = torch.zeros(nb, BLOCK, Hkv, C, dtype=dtype if fmt is None else torch.uint8, device=dev)
    pages = pages.transpose(1, 2)  # vLLM's logical [B, H, N, C] view of an LBNHC page
    attn = DensePages(Hq, D, scale) if fmt is None else AuraPages(Hq, D, scale, *fmt, layer=0)
    table = (torch.randperm(nb - 1, device=dev) + 1).view(B, -1).to(torch.int32)
    k = torch.randn(B, T, Hkv, D, dtype=dtype, device=dev)
    v = torch.randn(B, T, Hkv, D, dtype=dtype, device=dev)
    pos = torch.arange(T, device=dev)
    all_slots = (table.long()[:, pos // BLOCK] * BLOCK + pos % BLOCK).flatten()
    attn.write(k.flatten(0, 1), v.flatten(0, 1), pages, all_slots)
    seq_lens = torch.full((B,), T, dtype=torch.int32, device=dev)
    plan = plan_batch(seq_lens=seq_lens, block_table=table,
                      query_start_loc=torch.arange(B + 1, dtype=torch.int32, device=dev), num_decodes=B,
                      num_decode_tokens=B, num_prefills=0, num_prefill_tokens=0, num_actual_tokens=B,
                      max_query_len=1, max_seq_len=T, block_size=BLOCK)
    q = torch.randn(B, Hq, D, dtype=dtype, device=dev)
    out = torch.empty_like(q)
    last = all_slots.view(B, T)[:, -1].contiguous()  # the step rewrites each row's newest token
    new_k, new_v = k[:, -1].contiguous(), v[:, -1].contiguous()

    def step():
        attn.write(new_k, new_v, pages, last)
        attn.forward(q, pages, plan, out)

    step()
    if fmt is None:
        ref = F.scaled_dot_product_attention(q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), scale=scale,
                                             enable_gqa=True)[:, :, 0]
    else:
        ref = attn.dense_decode(q, pages, seq_lens, table)
    return step, out, ref, Hkv * C


def main(argv=None):
    doc = __doc__
    started = h.start("bench_vllm_paged.py", "flash_decode", doc, argv)
    if started is None:
        return 0
    args, facts, copy_tbs = started
    rows, lines = [], []
    for B, T, Hq, Hkv in SHAPES:
        torch.manual_seed(0)
        q = torch.randn(B, Hq, 1, D, dtype=torch.bfloat16, device="cuda")
        kc = torch.randn(B, Hkv, T, D, dtype=torch.bfloat16, device="cuda")
        vc = torch.randn_like(kc)
        sdpa = lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)  # noqa: E731
        base = {"eager": h.time_us(sdpa), "graph": h.time_us(sdpa, graph=True), "host": h.host_us(sdpa, calls=50)}
        del kc, vc
        shape = f"B{B} T{T} {Hq}/{Hkv}"
        rows.append({"shape": shape, "provider": "sdpa (contiguous)", **base, "bytes_per_token": Hkv * 2 * D * 2})
        lines.append(f"| {shape} | sdpa (contiguous bf16) | {base['eager']:.1f} | {base['graph']:.1f} | "
                     f"{base['host']:.0f} | 1.00x / 1.00x | {Hkv * 2 * D * 2} |")
        for name, fmt in FORMATS.items():
            step, out, ref, nbytes = case(B, T, Hq, Hkv, fmt)
            err = float((out.float() - ref.float()).abs().max())
            tol = 3e-2 if fmt is None else 1e-2
            if not err <= tol:
                lines.append(f"| {shape} | {name} | wrong: max err {err:.3g} > {tol} | | | | |")
                continue
            t = {"eager": h.time_us(step), "graph": h.time_us(step, graph=True), "host": h.host_us(step, calls=50)}
            rows.append({"shape": shape, "provider": name, **t, "bytes_per_token": nbytes, "max_err": err})
            lines.append(f"| {shape} | {name} (step: write + attend) | {t['eager']:.1f} | {t['graph']:.1f} | "
                         f"{t['host']:.0f} | {base['eager'] / t['eager']:.2f}x / {base['graph'] / t['graph']:.2f}x "
                         f"| {nbytes} |")
            del step, out, ref
            torch.cuda.empty_cache()
        print("\n".join(lines[-4:]), flush=True)
    md = (f"# vLLM backend decode step on {facts['gpu']} (bf16, D={D}, block {BLOCK})\n\n"
          f"commit {facts['commit']}, torch {facts['torch']}, CUDA {facts['cuda']}; copy ceiling "
          f"{copy_tbs:.2f} TB/s. Driven through `torch_aura/integrations/vllm/_paged.py` with vLLM's "
          "batch plan (vLLM itself does not install on this machine). Ratio = SDPA time / ours "
          "(SDPA reads a contiguous cache and writes nothing; ours writes the token into the pages, "
          "then attends). Host = Python time per eager call.\n\n"
          "| shape | provider | eager us | graph us | host us | vs SDPA eager / graph | KV bytes per token per layer |\n"
          "|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")
    print(h.write("vllm_paged", facts, rows, md, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
