"""The CPU path against what a CPU user already has, on this machine (issues 25 and 37).

    python benchmarks/bench_cpu.py [--out DIR] [--repeats N]

Rows (fp32, one process, ``torch.get_num_threads()`` threads), each checked before it is timed;
"never the slow choice" means ours / peer <= 1.0:

* ``flash_decode`` (B=2, 32/8 heads, D=128, T=2048) vs SDPA on the same cache, target <= 1x; and a
  paged B=8 batch of ragged lengths vs SDPA row by row on contiguous copies, target <= 1.2x;
* ``AuraCache.decode`` (aura4v2) at T = 1k, 2k, 4k vs SDPA on the dense cache; target <= 2x;
* ``gdn_chunk`` (1 x 2048 tokens, 4/8 heads, K = V = 128) vs transformers' torch fallback
  ``torch_chunk_gated_delta_rule`` (when importable); target <= 1x;
* ``AuraCache.append`` of one token (B=2, 8 KV heads, D=128); target <= 0.15 ms;
* a transformers decode step (a 4-layer Llama-shaped model, hidden 512, 8/2 heads of 64, random
  weights, B = 1 and 4, 2000 cached tokens): ``enable()`` (``"aura"`` attention over
  ``DynamicCache``; target <= 1x) and ``AuraKVCache`` aura4v2 (target <= 2x, as the AURA decode
  above) vs transformers' default (SDPA + ``DynamicCache``), when transformers is importable.

Times are medians of wall-clock calls after a warm-up; the transformers rows alternate ours and the
default step by step so that a busy machine slows both alike. The table goes to stdout and to
``benchmarks/results/cpu_<cores>core.md`` (committed).
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import torch_aura
from torch_aura import reference
from torch_aura.testing import exact_decode_attention, max_rel, rel_rms

import _harness as harness

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


def paged_decode_row(repeats: int) -> str:
    """flash_decode over vLLM-shaped pages (32 tokens) of a ragged batch vs SDPA row by row over
    contiguous copies of the same tokens (SDPA has no paged form; a ragged batch needs one call per
    length or a mask)."""
    B, Hq, Hkv, D, page = 8, 32, 8, 128, 32
    lens = [2048 - 97 * b for b in range(B)]
    W = -(-max(lens) // page)
    k_rows = [torch.randn(Hkv, n, D) for n in lens]
    v_rows = [torch.randn(Hkv, n, D) for n in lens]
    table = torch.randperm(B * W).reshape(B, W).to(torch.int32)
    k_pages, v_pages = torch.zeros(B * W, page, Hkv, D), torch.zeros(B * W, page, Hkv, D)
    for b, n in enumerate(lens):
        for j in range(-(-n // page)):
            t = slice(j * page, min((j + 1) * page, n))
            k_pages[table[b, j], : t.stop - t.start] = k_rows[b][:, t].transpose(0, 1)
            v_pages[table[b, j], : t.stop - t.start] = v_rows[b][:, t].transpose(0, 1)
    q, seq = torch.randn(B, Hq, D), torch.tensor(lens, dtype=torch.int32)

    def sdpa_rows():
        return torch.cat([sdpa_decode(q[b:b + 1], k_rows[b][None], v_rows[b][None]) for b in range(B)])

    ours = torch_aura.flash_decode(q, k_pages, v_pages, seq, table)[0]
    assert max_rel(ours, sdpa_rows()) < 1e-4
    # 1.2x: the pages are read in table order (a random permutation here), the peer's rows contiguously
    return row(f"flash_decode paged (page {page}) B{B} {Hq}/{Hkv} D{D} T{min(lens)}-{max(lens)}",
               harness.median_s(lambda: torch_aura.flash_decode(q, k_pages, v_pages, seq, table), repeats),
               "SDPA per row, contiguous", harness.median_s(sdpa_rows, repeats), 1.2)


def transformers_decode_rows(repeats: int) -> list[str]:
    """One decode step of a Llama-shaped model: enable() and AuraKVCache vs transformers' default."""
    try:
        import transformers

        from torch_aura.integrations import transformers as tat
    except ImportError as e:
        return [f"| transformers decode step | not compared: {e} | | | | |"]
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=2, head_dim=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    enabled = copy.deepcopy(model)  # the same weights on our path, enabled once (enable() is not free)
    tat.enable(enabled)
    steps = max(repeats, 24)
    lines = []
    try:
        for B, T in ((1, 2000), (4, 2000)):
            lines += _decode_step_rows(model, enabled, tat, transformers, B, T, steps)
    finally:
        tat.disable(enabled)
    return lines


def _decode_step_rows(model, enabled, tat, transformers, B: int, T: int, steps: int) -> list[str]:
    cfg = model.config
    ids = torch.randint(1, cfg.vocab_size, (B, T))
    feed = torch.randint(1, cfg.vocab_size, (B, steps + 1))
    default = DecodeLoop(model, ids, transformers.DynamicCache(config=cfg))
    ours = {"enable() (\"aura\" attention, DynamicCache)": DecodeLoop(enabled, ids, transformers.DynamicCache(config=cfg)),
            "AuraKVCache aura4v2": DecodeLoop(enabled, ids, tat.AuraKVCache(cfg, scheme="aura4v2"))}
    # correctness first: the first decode step's logits against the default path's
    reference_logits = default.step(feed[:, 0])
    for name, loop in ours.items():
        logits = loop.step(feed[:, 0])
        tol = 1e-4 if "enable" in name else 0.5  # aura4v2 is lossy: cosine checked instead
        err = (logits - reference_logits).abs().max().item()
        assert err <= tol or ("Aura" in name and F.cosine_similarity(
            logits.flatten(), reference_logits.flatten(), dim=0) > 0.99), (name, err)
    # alternate the paths step by step so that a busy machine slows both alike
    times = {name: [] for name in ("default", *ours)}
    for s in range(1, steps + 1):
        times["default"].append(default.timed_step(feed[:, s]))
        for name, loop in ours.items():
            times[name].append(loop.timed_step(feed[:, s]))
    base = statistics.median(times["default"])
    lines = []
    for name in ours:
        # the ratio is the median of paired steps' ratios (each step beside the default's of the same
        # round), so a load change mid-run moves both sides; enable() must never be the slow choice,
        # the compressed cache trades some speed for 4-8x less KV memory, within the 2x the CPU AURA
        # decode allows (issue 25)
        ratio = statistics.median(o / d for o, d in zip(times[name], times["default"]))
        lines.append(row(f"transformers decode step, Llama-shaped 4 layers 8/2 D64, B{B} T{T}: {name}",
                         ratio * base, "default (SDPA, DynamicCache)", base, 1.0 if "enable" in name else 2.0))
    return lines


class DecodeLoop:
    """A model's cache after a prefill of ``ids``, fed one token per row per step (inference mode)."""

    def __init__(self, model, ids, cache):
        self.model, self.cache = model, cache
        with torch.inference_mode():
            model(ids, cache=cache, use_cache=True)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(tokens[:, None], cache=self.cache, use_cache=True).logits[:, -1].float()

    def timed_step(self, tokens: torch.Tensor) -> float:
        return harness.timed(lambda: self.step(tokens))[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=harness.RESULTS)
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
    lines.append(row(f"flash_decode B{B} {Hq}/{Hkv} D{D} T{T}", harness.median_s(lambda: torch_aura.flash_decode(q, k, v, seq), args.repeats),
                     "SDPA", harness.median_s(lambda: sdpa_decode(q, k, v), args.repeats), 1.0))
    lines.append(paged_decode_row(args.repeats))

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
                         harness.median_s(lambda: cache.decode(q), args.repeats), "SDPA (dense fp32)",
                         harness.median_s(lambda: sdpa_decode(q, kd, vd), args.repeats), 2.0))

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
        lines.append(row(f"gdn_chunk 1x{T} {H}/{HV} K{K} V{V}", harness.median_s(lambda: torch_aura.gdn_chunk(qg, kg, vg, g, beta), 3),
                         "transformers torch_chunk_gated_delta_rule", harness.median_s(peer, 3), 1.0))
    except ImportError:
        lines.append(f"| gdn_chunk 1x{T} | not compared: transformers is not installed | | | | |")

    # one-token append
    cache = torch_aura.AuraCache("aura4v2", batch=B, kv_heads=Hkv, head_dim=D, capacity=100_000)
    kt, vt = torch.randn(B, Hkv, D), torch.randn(B, Hkv, D)
    lines.append(row(f"AuraCache.append one token B{B} Hkv{Hkv} D{D}", harness.median_s(lambda: cache.append(kt, vt), 50),
                     "-", None, 0.15, unit_target="ms"))
    lines.extend(transformers_decode_rows(args.repeats))

    cores = os.cpu_count()
    md = (f"# CPU path vs what a CPU user has ({platform.processor() or platform.machine()}, {cores} cores, "
          f"{torch.get_num_threads()} threads)\n\n"
          f"torch {torch.__version__}, fp32, median of {args.repeats} calls after a warm-up (gdn: 3; append: 50; "
          f"decode steps: {max(args.repeats, 24)}, ours as the default's median times the median paired ratio). "
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
