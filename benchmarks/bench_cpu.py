"""The CPU path against what a CPU user already has, on this machine (issue 25's targets).

    python benchmarks/bench_cpu.py [--out DIR]

Rows (fp32, one process, ``torch.get_num_threads()`` threads), each checked before it is timed:

* ``flash_decode`` (B=2, 32/8 heads, D=128, T=2048) vs SDPA on the same cache; target <= 1.5x;
* ``AuraCache.decode`` (aura4v2) at T = 1k, 2k, 4k vs SDPA on the dense cache of the same length;
  target <= 2x;
* ``gdn_chunk`` (1 x 2048 tokens, 4/8 heads, K = V = 128) vs transformers' torch fallback
  ``torch_chunk_gated_delta_rule`` (when importable); target <= 1x;
* ``AuraCache.append`` of one token (B=2, 8 KV heads, D=128); target <= 1 ms.

Times are medians of wall-clock calls after a warm-up. The table goes to stdout and to
``benchmarks/results/cpu_<cores>core.md`` (committed).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import torch_aura
from torch_aura import reference
from torch_aura.testing import exact_decode_attention, max_rel, rel_rms

RESULTS = Path(__file__).resolve().parent / "results"


def median_s(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sdpa_decode(q, k, v):
    return F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]


def row(what, ours, peer_name, peer, target, unit_target="x"):
    ratio = ours / peer if peer else None
    if unit_target == "ms":
        verdict = "met" if ours * 1e3 <= target else "missed"
        return f"| {what} | {ours * 1e3:.3f} ms | {peer_name} | - | <= {target} ms | {verdict} |"
    verdict = "met" if ratio <= target else "missed"
    return (f"| {what} | {ours * 1e3:.2f} ms | {peer_name} {peer * 1e3:.2f} ms | {ratio:.2f}x | <= {target}x | "
            f"{verdict} |")


def served_by() -> str:
    """Which ops of the table run a fast path of torch_aura.cpu here, which the reference."""
    table = torch_aura.backends.status()
    ops = ("flash_decode", "aura_write_cache", "aura_decode", "gdn_chunk")
    return "; ".join(f"`{op}` {table[op]['cpu']}" for op in ops)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    lines = []

    # flash_decode vs SDPA
    B, Hq, Hkv, D, T = 2, 32, 8, 128, 2048
    q = torch.randn(B, Hq, D)
    k, v = torch.randn(B, Hkv, T, D), torch.randn(B, Hkv, T, D)
    seq = torch.full((B,), T, dtype=torch.int32)
    exact = exact_decode_attention(q, k, v, seq)[0]
    assert max_rel(torch_aura.flash_decode(q, k, v, seq)[0], exact) < 1e-4
    assert max_rel(sdpa_decode(q, k, v), exact) < 1e-4
    lines.append(row(f"flash_decode B{B} {Hq}/{Hkv} D{D} T{T}", median_s(lambda: torch_aura.flash_decode(q, k, v, seq), args.repeats),
                     "SDPA", median_s(lambda: sdpa_decode(q, k, v), args.repeats), 1.5))

    # AuraCache.decode vs SDPA on the dense cache
    for T in (1024, 2048, 4096):
        kk, vv = torch.randn(B, T, Hkv, D), torch.randn(B, T, Hkv, D)
        cache = torch_aura.AuraCache("aura4v2", batch=B, kv_heads=Hkv, head_dim=D, capacity=T)
        cache.append(kk, vv)
        kd, vd = kk.transpose(1, 2).contiguous(), vv.transpose(1, 2).contiguous()
        ours = cache.decode(q)[0]
        oracle = reference.aura.aura_decode(q, cache.k_codes, cache.k_norms, cache.v_codes, cache.v_norms,
                                            cache.seq_lens, cache.k_codebook, cache.v_codebook, cache.k_sign_mask,
                                            cache.v_sign_mask, cache.key_bits, cache.value_bits)[0]
        assert max_rel(ours, oracle) < 1e-5  # the fast path is the reference's answer
        assert F.cosine_similarity(ours.flatten(1), sdpa_decode(q, kd, vd).flatten(1)).mean() > 0.8
        lines.append(row(f"AuraCache.decode aura4v2 B{B} {Hq}/{Hkv} D{D} T{T}",
                         median_s(lambda: cache.decode(q), args.repeats), "SDPA (dense fp32)",
                         median_s(lambda: sdpa_decode(q, kd, vd), args.repeats), 2.0))

    # gdn_chunk vs transformers' torch fallback
    T, H, HV, K, V = 2048, 4, 8, 128, 128
    qg = F.normalize(torch.randn(1, T, H, K), dim=-1)
    kg = F.normalize(torch.randn(1, T, H, K), dim=-1)
    vg = torch.randn(1, T, HV, V)
    g = F.logsigmoid(torch.rand(1, T, HV))
    beta = torch.rand(1, T, HV).sigmoid()
    ours_o = torch_aura.gdn_chunk(qg, kg, vg, g, beta)[0]
    assert rel_rms(ours_o, reference.gdn.gdn_chunk(qg, kg, vg, g, beta)[0]) < 1e-5  # the reference's answer
    try:
        import transformers
        from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

        transformers.logging.set_verbosity_error()
        qr, kr = qg.repeat_interleave(HV // H, 2), kg.repeat_interleave(HV // H, 2)
        peer = lambda: torch_chunk_gated_delta_rule(qr, kr, vg, g, beta)[0]  # noqa: E731
        assert rel_rms(ours_o, peer()) < 1e-4
        lines.append(row(f"gdn_chunk 1x{T} {H}/{HV} K{K} V{V}", median_s(lambda: torch_aura.gdn_chunk(qg, kg, vg, g, beta), 3),
                         "transformers torch_chunk_gated_delta_rule", median_s(peer, 3), 1.0))
    except ImportError:
        lines.append(f"| gdn_chunk 1x{T} | not compared: transformers is not installed | | | | |")

    # one-token append
    cache = torch_aura.AuraCache("aura4v2", batch=B, kv_heads=Hkv, head_dim=D, capacity=100_000)
    kt, vt = torch.randn(B, Hkv, D), torch.randn(B, Hkv, D)
    lines.append(row(f"AuraCache.append one token B{B} Hkv{Hkv} D{D}", median_s(lambda: cache.append(kt, vt), 50),
                     "-", None, 1, unit_target="ms"))

    cores = os.cpu_count()
    md = (f"# CPU path vs what a CPU user has ({platform.processor() or platform.machine()}, {cores} cores, "
          f"{torch.get_num_threads()} threads)\n\n"
          f"torch {torch.__version__}, fp32, median of {args.repeats} calls after a warm-up (gdn: 3; append: 50). "
          f"Ours is what `torch.ops.aura` runs on this CPU: {served_by()}.\n\n"
          "| case | ours | peer | ours / peer | target | |\n|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"cpu_{cores}core.md"
    path.write_text(md)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
