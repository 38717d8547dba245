"""transformers end to end: prefill and decode of real-shaped model stacks, transformers' paths vs torch_aura.

Two stacks with real layer shapes and random bf16 weights (the embedding and LM head are the real ones):

- ``llama3-8b``: Llama-3-8B layers (hidden 4096, 32 / 8 heads, D = 128, MLP 14336), full depth (32
  layers) by default: it fits one H200.
- ``qwen3-next``: Qwen3-Next-80B-A3B layers (three GDN layers with 16 / 32 heads of 128 to one attention
  layer with 16 / 2 heads of 256; 512 experts, 10 active, ``grouped_mm`` experts), 4 layers by default.
  Its full depth is ``--layers 48``, which fits one H200 with ``--experts 64`` (weights ~23 GB instead
  of 159 GB; each token still runs 10 experts, so a layer's work is the real one's).

Variants (each checked before its row counts: against an fp32 copy of the stack on transformers'
pure-PyTorch paths where ``--truth-tokens`` allows, else against the default path's logits; ``*-compiled``:
``torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)`` on CUDA, ``aot_eager`` on the
CPU, whose rows are a smoke test only):

- baselines: ``default`` (SDPA + ``DynamicCache``; for Qwen3-Next the GDN functions transformers
  picked at import: FLA when installed, else its torch loops, timed at the shortest context only),
  ``default-no-cudnn`` (SDPA's cuDNN backend off, GPU only: a slow backend choice is not the cost of
  the path) and ``static-compiled`` (transformers' ``StaticCache`` + SDPA, compiled);
- ours: ``aura-attn`` (``enable(model)``: our GDN kernels, ``"aura"`` attention, ``DynamicCache``),
  ``aura-attn-cudnn`` (the same with ``TORCH_AURA_SDPA_CUDNN=1``: SDPA's cuDNN at every prefill length),
  ``aura-attn-static`` and ``aura-attn-static-compiled`` (``"aura"`` over a ``StaticCache``:
  ``flash_decode`` over each row's live keys), ``aura8`` / ``aura4v2`` (``AuraKVCache``) and
  ``aura8-compiled`` / ``aura4v2-compiled`` (``AuraKVCache(max_cache_len=...)``, compiled).

With ``--stream L1,L2,...`` (Qwen3-Next; ``STREAM_VARIANTS``): a warm-up prompt, then one prompt per
length in order, each a length the process has not seen (each variant's one token longer than the one
before, so none finds a shape-keyed plan another built): its time to first token, compiles and tuning included,
against the same prompt's steady-state time once every length has run (target <= 1.2x), and the Triton
kernels the first prompt compiled or loaded from Triton's disk cache (``_harness.TritonCompiles``), so a
stall is attributed by count.

Per context T and batch B: prefill time (one forward over B x T tokens, last-token logits only;
B > 1 reuses a one-row prefill, rows repeated with ``reorder_cache``, when a variant's B-row prefill
does not fit; its logits then compare on row 0), then DECODE_STEPS teacher-forced steps: median step time
beside the GPU's busy time in one step (torch.profiler kernel times: a step far longer than its kernels is
bound by the host), tokens/s = B / step and its ratio to the fastest baseline of the row (with ``--rounds N``
each variant's prefill and decode run N times, the variants taking turns, and the row reports the median step and the
fastest prefill: an eager step is host-bound and this host's step time drifts between runs, so variants
timed one after the other once compare the drift), cache bytes, compile time
(the first compiled step, capture included), logit cosine and teacher-forced argmax agreement with
``default``. Then the longest context per row at B = 8 that the K/V budget holds at full depth, and
with ``--agreement-depths`` the agreement of each compressed scheme per model depth (random weights:
agreement falls with depth). Host cost per eager call of the decode path's ops is timed separately.

    python benchmarks/bench_e2e_transformers.py [--out DIR] [--models llama3-8b,qwen3-next]
        [--contexts 8192,32768,131072] [--batches 1,8,32] [--layers N] [--variants a,b]
        [--agreement-depths 1,8,32] [--experts N] [--stream 1000,1500,...] [--rounds N] [--tiny]

``--tiny`` runs tiny shapes on whatever device there is (a CPU smoke test of every code path, e.g.
``--tiny --contexts 64 --batches 1,2 --layers 2 --agreement-depths 1,2``).
Writes ``e2e_transformers_<model>_<gpu>.md`` per model (committed under benchmarks/results/) and raw JSONL rows.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import inspect
import os
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_aura

import _harness as H

DTYPE = torch.bfloat16
GB = 1e9
DECODE_STEPS = 16


def gpu_only(variant: str) -> bool:
    """A variant that differs from another only in a CUDA backend choice: the same path off the GPU."""
    spec = VARIANTS[variant]
    return not spec.cudnn or spec.sdpa_cudnn != "auto"


class Variant(NamedTuple):
    cache: str  # "dynamic", "static" (transformers' StaticCache) or an AURA scheme (AuraKVCache)
    aura: bool  # enable(model): our GDN kernels and the "aura" attention
    compiled: bool  # torch.compile(model.forward) over a static cache (AuraKVCache gets max_cache_len)
    cudnn: bool = True  # SDPA's cuDNN backend (GPU)
    sdpa_cudnn: str = "auto"  # TORCH_AURA_SDPA_CUDNN: when the "aura" attention's SDPA fallback may use cuDNN
    # bf16 stacks of random weights: the logits of two exact paths differ by rounding order only
    cosine_min: float = 0.995


# With an fp32 truth (--truth-tokens): a variant's logit error (1 - cosine to the truth) may be this many
# times the default path's plus its own 1 - cosine_min. Deep random stacks amplify every rounding
# difference (48 Qwen3-Next layers: two exact bf16 paths end at cosine ~0.96 to each other), so the
# question "is it wrong" is asked of the truth, not of the other bf16 path.
TRUTH_RATIO = 2.0


VARIANTS = {
    "default": Variant("dynamic", False, False),
    "default-no-cudnn": Variant("dynamic", False, False, cudnn=False),
    "static-compiled": Variant("static", False, True),
    "aura-attn": Variant("dynamic", True, False),
    "aura-attn-cudnn": Variant("dynamic", True, False, sdpa_cudnn="1"),
    "aura-attn-static": Variant("static", True, False),
    "aura-attn-static-compiled": Variant("static", True, True),
    "aura8": Variant("aura8", True, False, cosine_min=0.99),
    "aura8-compiled": Variant("aura8", True, True, cosine_min=0.99),
    "aura4v2": Variant("aura4v2", True, False, cosine_min=0.95),
    "aura4v2-compiled": Variant("aura4v2", True, True, cosine_min=0.95),
}
BASELINES = ("default", "default-no-cudnn", "static-compiled")
REFERENCES = ("default", "default-no-cudnn")


def reference_of(variants: list[str]) -> str | None:
    """The dense eager path every other row's logits are compared with: the first of REFERENCES that
    ``variants`` names (None: no comparison; each row is then only checked for finite logits)."""
    return next((v for v in REFERENCES if v in variants), None)
SCHEMES = ("aura8", "aura4v2")
FULL_DEPTH = {"llama3-8b": 32, "qwen3-next": 4}  # default --layers: Qwen3-Next-80B does not fit one GPU


def build(name: str, layers: int, tiny: bool, device, experts: int | None = None):
    import transformers

    if name == "llama3-8b":
        dims = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=128, rope_theta=500000.0)
        if tiny:
            dims = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=64)
        cfg = transformers.LlamaConfig(num_hidden_layers=layers, max_position_embeddings=1 << 18, **dims)
        cls = transformers.LlamaForCausalLM
    elif name == "qwen3-next":
        dims = {}
        if tiny:
            dims = dict(vocab_size=256, hidden_size=128, intermediate_size=128, moe_intermediate_size=64,
                        shared_expert_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
                        linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32)
        if experts:
            dims["num_experts"] = experts
        # the released model's pattern: every fourth layer is full attention
        types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
        if "full_attention" not in types:
            types[-1] = "full_attention"
        cfg = transformers.Qwen3NextConfig(num_hidden_layers=layers, layer_types=types,
                                           max_position_embeddings=1 << 18, **dims)
        cfg._experts_implementation = "grouped_mm" if device.type == "cuda" else None
        cls = transformers.Qwen3NextForCausalLM
    else:
        raise ValueError(f"--models: unknown model {name!r}; known: llama3-8b, qwen3-next")
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(cfg).to(DTYPE).eval()
    for p in model.parameters():  # random init at small scale keeps bf16 activations finite
        p.data.normal_(0, 0.02)
    return model


def new_cache(model, variant: str, capacity: int | None = None):
    """A fresh cache for ``variant``; static ones hold ``capacity`` tokens per row (needed for them)."""
    import transformers

    from torch_aura.integrations import transformers as tat

    spec = VARIANTS[variant]
    if spec.cache == "static":
        return transformers.StaticCache(config=model.config, max_cache_len=capacity)
    if spec.cache != "dynamic":
        return tat.AuraKVCache(model.config, scheme=spec.cache, max_cache_len=capacity if spec.compiled else None)
    return transformers.DynamicCache(config=model.config)


def set_variant(model, variant: str):
    from torch_aura.integrations import transformers as tat

    spec = VARIANTS[variant]
    if spec.aura:
        tat.enable(model)
    else:
        tat.disable(model)
    if torch.cuda.is_available():
        torch.backends.cuda.enable_cudnn_sdp(spec.cudnn)
    os.environ["TORCH_AURA_SDPA_CUDNN"] = spec.sdpa_cudnn  # read per call: no recompile in eager variants


def compile_step(model, device):
    """The decode step a user compiles: CUDA graphs on the GPU; the CPU smoke test traces with aot_eager."""
    torch._dynamo.reset()
    if device.type == "cuda":
        return torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    return torch.compile(model.forward, backend="aot_eager", fullgraph=True)


def mark_static(cache):
    """Mark a static cache's tensors as fixed addresses again after ``reorder_cache`` made new ones
    (transformers' layers do not; AuraKVCache's do it themselves)."""
    for layer in cache.layers:
        for value in vars(layer).values():
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor):
                    torch._dynamo.mark_static_address(t)


def gpu_busy_ms(step) -> float:
    """Sum of the GPU kernel times of one call of ``step`` (torch.profiler): the step's GPU work,
    to hold beside its wall time (a step much longer than its kernels is bound by the host)."""
    return sum(ms for _, ms in H.kernel_times(step, "cuda").values())


def cache_bytes(cache) -> tuple[int, float]:
    """(bytes the cache holds, bytes per token per attention layer) of a DynamicCache or AuraKVCache."""
    held, per_token = 0, []
    for layer in cache.layers:
        aura = getattr(layer, "aura", None)
        if aura is not None:
            held += aura.memory_bytes()
            per_token.append(aura.memory_bytes() / (aura.batch * aura.capacity))
        elif isinstance(getattr(layer, "keys", None), torch.Tensor) and layer.keys.numel():
            b = sum(t.numel() * t.element_size() for t in (layer.keys, layer.values))
            held += b
            per_token.append(b / (layer.keys.shape[0] * layer.keys.shape[-2]))
    return held, (sum(per_token) / len(per_token) if per_token else float("nan"))


def prompts(model, B, T, device, prefill_rows=None):
    """The prefill ids (``prefill_rows or B`` rows of T) and the DECODE_STEPS teacher-forced tokens of a row;
    row 0's prompt and steps are the same for every B and ``prefill_rows``."""
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(1, vocab, (prefill_rows or B, T), generator=torch.Generator().manual_seed(1)).to(device)
    # a generator of their own: drawn after the ids, the steps would change with the rows prefilled
    steps = torch.randint(1, vocab, (B, DECODE_STEPS), generator=torch.Generator().manual_seed(2))
    return ids, steps.T[..., None].to(device)


@torch.inference_mode()
def run_one(model, variant, B, T, device, reps, prefill_rows=None):
    """Prefill B x T tokens then DECODE_STEPS single-token steps; returns timings and the logits."""
    set_variant(model, variant)
    spec = VARIANTS[variant]
    ids, steps = prompts(model, B, T, device, prefill_rows)
    capacity = T + DECODE_STEPS + 1  # the last one: the profiled step
    prefill_ms = []
    for _ in range(reps):
        cache = new_cache(model, variant, capacity)
        seconds, out = H.timed(lambda: model(ids, cache=cache, use_cache=True, logits_to_keep=1), device)
        prefill_ms.append(seconds * 1e3)
    if prefill_rows is not None and prefill_rows != B:
        cache.reorder_cache(torch.arange(prefill_rows, device=device).repeat_interleave(B // prefill_rows))
        if spec.cache == "static":
            mark_static(cache)
    first_logits = out.logits[:, -1].float()
    forward = compile_step(model, device) if spec.compiled else model.forward
    step_ms, logits = [], []
    for s in range(DECODE_STEPS):
        # a copy of the logits: a CUDA-graph output is overwritten by the next replay
        seconds, last = H.timed(lambda: forward(steps[s], cache=cache, use_cache=True).logits[:, -1].float(), device)
        logits.append(last)
        step_ms.append(seconds * 1e3)
    step = statistics.median(step_ms[3:] or step_ms)  # compiled: the first steps compile and capture
    gpu = (gpu_busy_ms(lambda: forward(steps[-1], cache=cache, use_cache=True)) if device.type == "cuda"
           else float("nan"))
    held, per_token = cache_bytes(cache)
    return {"prefill_ms": min(prefill_ms), "step_ms": step, "step_gpu_ms": gpu, "tok_s": B / step * 1e3,
            "compile_s": (step_ms[0] + step_ms[1]) / 1e3 if spec.compiled else float("nan"),
            "cache_bytes": held, "bytes_per_token_layer": per_token, "prefill_logits": first_logits,
            "decode_logits": torch.stack(logits)}


def take_turns(model, row_group, device, rounds: int) -> None:
    """Rounds 2..``rounds`` of one (model, B, T) row group, the variants in turn: each row's ``step_ms``
    becomes the median of its rounds' steps and ``prefill_ms`` the fastest; the rounds stay in the row."""
    for row in row_group:
        row["step_ms_rounds"], row["prefill_ms_rounds"] = [row["step_ms"]], [row["prefill_ms"]]
    for _ in range(rounds - 1):
        for row in row_group:
            if device.type == "cuda":
                torch.cuda.empty_cache()
            try:
                res = run_one(model, row["variant"], row["B"], row["T"], device, reps=1,
                              prefill_rows=row["prefill_rows"])
            except torch.OutOfMemoryError:
                continue  # the row keeps the rounds it has
            row["step_ms_rounds"].append(res["step_ms"])
            row["prefill_ms_rounds"].append(res["prefill_ms"])
    for row in row_group:
        row["step_ms"] = statistics.median(row["step_ms_rounds"])
        row["prefill_ms"] = min(row["prefill_ms_rounds"])
        row["tok_s"] = row["B"] / row["step_ms"] * 1e3
        print(f"{row['model']} {row['variant']:25s} B={row['B']} T={row['T']:6d}: decode step per round "
              + " / ".join(f"{ms:.2f}" for ms in row["step_ms_rounds"]) + f" ms -> median {row['step_ms']:.2f}")


def fp32_reference(model):
    """An fp32 copy of ``model`` for the truth: transformers' eager experts (``grouped_mm`` is a bf16 path)."""
    ref = copy.deepcopy(model).float()
    for m in ref.modules():
        config = getattr(m, "config", None)
        if getattr(config, "_experts_implementation", None) not in (None, "eager"):
            config._experts_implementation = "eager"
    return ref


def fp32_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention signature: SDPA over K/V heads repeated to the query heads."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, is_causal=attention_mask is None and query.shape[2] > 1,
        scale=scaling)
    return out.transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def torch_only(model):
    """transformers' own pure-PyTorch GDN and conv functions (not FLA, not ours) and fp32 matmuls
    without TF32: the path a truth is computed on."""
    import transformers

    from torch_aura.integrations import transformers as tat
    from torch_aura.integrations.transformers import gdn

    tat.disable(model)
    saved = []
    for name in gdn.modules_of(model):
        module = importlib.import_module(name)
        for global_name in gdn.discover()[name].values():
            saved.append((module, global_name, getattr(module, global_name)))
            setattr(module, global_name, inspect.unwrap(saved[-1][2]))  # the hub/FLA wrappers set __wrapped__
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    # fp32 SDPA may pick the math path, which holds the T x T scores (64 GB at 32k): only the
    # memory-efficient kernel, which takes fp32 but not GQA, hence fp32_attention's repeated heads
    backends = [SDPBackend.EFFICIENT_ATTENTION] if next(model.parameters()).is_cuda else [SDPBackend.MATH]
    configs = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}.values()
    attn = [c._attn_implementation for c in configs]
    transformers.AttentionInterface.register("fp32_truth", fp32_attention)
    for c in configs:
        c._attn_implementation = "fp32_truth"
    try:
        with sdpa_kernel(backends):
            yield
    finally:
        for c, a in zip(configs, attn):
            c._attn_implementation = a
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        for module, global_name, fn in saved:
            setattr(module, global_name, fn)


def compare(res, other, prefix="") -> dict:
    """Logit cosines and teacher-forced argmax agreement of ``res`` with ``other``, keys prefixed by
    ``prefix``. Row 0's prompt and steps are the same whether B or one row was prefilled (the other rows
    then repeat it), so prefill compares row 0, and decode every row or, where the two prefilled
    different row counts, row 0."""
    rows = slice(None) if res.get("prefill_rows") == other.get("prefill_rows") else slice(0, 1)
    mine, theirs = res["decode_logits"][:, rows], other["decode_logits"][:, rows]
    return {f"{prefix}prefill_cos": cosine(res["prefill_logits"][:1], other["prefill_logits"][:1]),
            f"{prefix}decode_cos": cosine(mine, theirs), f"{prefix}agreement": agreement(mine, theirs)}


def judge(row, cosine_min, default_row) -> bool:
    """With an fp32 truth: the row's logit error to it is within TRUTH_RATIO x the default path's plus
    1 - cosine_min (prefill and decode); without one: its cosine to the default path is >= cosine_min."""
    if "truth_prefill_cos" in row and default_row is not None and "truth_prefill_cos" in default_row:
        return all(1 - row[f"truth_{k}"] <= TRUTH_RATIO * (1 - default_row[f"truth_{k}"]) + 1 - cosine_min
                   for k in ("prefill_cos", "decode_cos"))
    return min(row["prefill_cos"], row["decode_cos"]) >= cosine_min


def agreement(logits, base) -> float:
    """Teacher-forced argmax agreement: the share of steps and rows whose top token is the dense path's."""
    return (logits.argmax(-1) == base.argmax(-1)).float().mean().item()


def cosine(a, b) -> float:
    return torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


def host_costs(device) -> list[dict]:
    """Host (Python + dispatch) time of one eager call of each per-token, per-layer decode op."""
    # on CUDA the calls queue behind a GPU sleep (_harness.host_us): 30 calls of a few kernels each stay
    # well inside the launch queue, which would otherwise block the host until the sleep ends
    n = 30 if device.type == "cuda" else 50
    B, Hq, Hkv, D, T = 1, 32, 8, 128, 256
    q = torch.randn(B, Hq, D, device=device, dtype=DTYPE)
    kv = torch.randn(B, Hkv, T, D, device=device, dtype=DTYPE)
    seq = torch.full((B,), T, dtype=torch.int32, device=device)
    cache = torch_aura.AuraCache("aura4v2", batch=B, kv_heads=Hkv, head_dim=D, capacity=4 * n + T, device=device)
    cache.append(*(torch.randn(B, T, Hkv, D, device=device, dtype=DTYPE) for _ in range(2)))
    tok = torch.randn(B, Hkv, D, device=device, dtype=DTYPE)
    Hk, Hv, K = 16, 32, 128
    qg = torch.randn(B, 1, Hk, K, device=device, dtype=DTYPE)
    vg = torch.randn(B, 1, Hv, K, device=device, dtype=DTYPE)
    gg, bg = -torch.rand(B, 1, Hv, device=device), torch.rand(B, 1, Hv, device=device)
    state = torch.zeros(B, Hv, K, K, device=device)
    qs = q[:, :, None]
    ks, vs = kv, kv
    calls = {
        "AuraCache.append (1 token)": lambda: cache.append(tok, tok),
        "AuraCache.decode": lambda: cache.decode(q),
        "flash_decode": lambda: torch_aura.flash_decode(q, kv, kv, seq),
        "gdn_recurrent": lambda: torch_aura.gdn_recurrent(qg, qg, vg, gg, bg, state, use_qk_l2norm=True),
        "SDPA (GQA)": lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True),
    }
    rows = []
    for name, fn in calls.items():
        for _ in range(5):
            fn()
        if name.startswith("AuraCache.append"):
            cache.crop(5)
        host = H.host_us(fn, calls=n, device=device, warmup=False)
        if name.startswith("AuraCache.append"):
            cache.crop(n)
        rows.append({"kind": "host", "op": name, "host_us": host})
        print(f"host  {name:28s} {host:7.1f} us / call")
    return rows


# KV budget for the "longest context at B = 8" column: 80 GB less Llama-3-8B's 16 GB of weights;
# Qwen3-Next-80B's weights (159 GB) need several GPUs, so the same per-GPU KV budget is assumed.
KV_BUDGET_GB = 64
FULL_DEPTH_ATTENTION_LAYERS = {"llama3-8b": 32, "qwen3-next": 12}


def prefill_profile(model, name: str, T: int, device, top: int = 12) -> list[dict]:
    """GPU kernel time of one B = 1 prefill, grouped by kernel name: where a model's prefill goes."""
    ids = torch.randint(1, model.config.get_text_config().vocab_size, (1, T), device=device)
    rows = []
    for variant in ("default", "aura-attn"):
        set_variant(model, variant)
        with torch.inference_mode():
            model(ids, cache=new_cache(model, variant), use_cache=True, logits_to_keep=1)  # warm-up
            torch.cuda.synchronize()
            times = H.kernel_times(
                lambda: model(ids, cache=new_cache(model, variant), use_cache=True, logits_to_keep=1), "cuda")
        per = {k: ms for k, (_, ms) in times.items()}
        total, ours = sum(per.values()), H.own_kernel_ms(times)
        print(f"profile {name} {variant} 1x{T}: {total:.1f} ms of kernels, {ours:.1f} of them torch_aura's")
        for k, ms in sorted(per.items(), key=lambda kv: -kv[1])[:top]:
            print(f"   {ms:8.2f} ms  {k[:110]}")
            rows.append({"kind": "profile", "model": name, "variant": variant, "T": T, "kernel": k[:110],
                         "ms": ms, "total_ms": total, "own_ms": ours})
    return rows


def strided_copy_cost(device) -> list[dict]:
    """GPU time the GDN adapter spends making transformers' strided q/k/v views contiguous.

    Qwen3-Next shapes (16 / 32 heads of 128): q, k, v are views of the transposed causal-conv output
    ``[B, C, T]``, as the model hands them over; compared with the same call on contiguous copies.
    """
    from torch_aura.integrations.transformers import gdn

    rows = []
    for T in (4096, 32768):
        H_, HV, K = 16, 32, 128
        conv = torch.randn(1, 2 * H_ * K + HV * K, T, device=device, dtype=DTYPE)
        q, k, v = torch.split(conv.transpose(1, 2), [H_ * K, H_ * K, HV * K], dim=-1)
        q, k, v = q.reshape(1, T, H_, K), k.reshape(1, T, H_, K), v.reshape(1, T, HV, K)
        g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, device=device)) / 16
        beta = torch.rand(1, T, HV, device=device)
        qc, kc, vc = q.contiguous(), k.contiguous(), v.contiguous()
        strided = H.time_us(lambda: gdn.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True))
        contiguous = H.time_us(lambda: gdn.chunk_gated_delta_rule(qc, kc, vc, g, beta, use_qk_l2norm_in_kernel=True))
        copy = H.time_us(lambda: (q.contiguous(), k.contiguous(), v.contiguous()))
        rows.append({"kind": "copy", "T": T, "strided_us": strided, "contiguous_us": contiguous, "copy_us": copy})
        print(f"gdn adapter 1x{T}: strided views {strided:.1f} us, contiguous {contiguous:.1f} us, "
              f"the copies alone {copy:.1f} us")
    return rows


def longest_context_b8(model_name: str, bytes_per_token_layer: float) -> int:
    """Tokens per row whose K/V fit KV_BUDGET_GB at B = 8 for the full-depth model."""
    return int(KV_BUDGET_GB * GB / (8 * FULL_DEPTH_ATTENTION_LAYERS[model_name] * bytes_per_token_layer))


def agreement_by_depth(name: str, depth: int, T: int, tiny: bool, device) -> list[dict]:
    """Teacher-forced argmax agreement and logit cosine of each compressed scheme with the dense
    path (``aura-attn``: the same kernels, an exact cache) for a ``depth``-layer stack, B = 1."""
    model = build(name, depth, tiny, device)
    rows = []
    try:
        base = run_one(model, "aura-attn", 1, T, device, reps=1)
        for scheme in SCHEMES:
            res = run_one(model, scheme, 1, T, device, reps=1)
            rows.append({"kind": "depth", "model": name, "variant": scheme, "layers": depth, "T": T,
                         "agreement": agreement(res["decode_logits"], base["decode_logits"]),
                         "decode_cos": cosine(res["decode_logits"], base["decode_logits"])})
            print(f"{name} {scheme} at {depth} layers, 1x{T}: agreement {rows[-1]['agreement']:.3f}, "
                  f"cos {rows[-1]['decode_cos']:.4f}")
    finally:
        from torch_aura.integrations import transformers as tat

        tat.disable(model)
    return rows


# default-no-cudnn tells SDPA's cuDNN plans (built per exact shape) apart from the rest of the default path's stalls
# aura-attn-cudnn: ours with cuDNN at every length, the stall and the steady time the 16k threshold trades
STREAM_VARIANTS = ("default", "default-no-cudnn", "aura-attn", "aura-attn-cudnn")


def stream_builds(row: dict) -> str:
    """A stream prompt's Triton builds in words ("-" for rows of runs before they were counted)."""
    if "triton_compiled" not in row:
        return "-"
    if not row["triton_compiled"] and not row["triton_loaded"]:
        return "none"
    names = row.get("triton_compiled_names", [])  # which kernels stalled the prompt, where few did
    which = f": {', '.join(names)}" if 0 < len(names) <= 3 else ""
    return (f"{row['triton_compiled']} compiled ({row['triton_compile_s']:.2f} s{which}), {row['triton_loaded']} "
            "from disk")


@torch.inference_mode()
def prompt_stream(model, name: str, lengths: list[int], device) -> list[dict]:
    """Time to first token of prompts of lengths the process has not seen, stalls included, against
    each prompt's steady-state time (the same prompt again once the whole stream has run). The i-th
    variant's prompts are ``lengths`` + i tokens (its warm-up too): every cache keyed by exact shape (cuDNN's
    SDPA plans, cuBLAS's, Triton's) is then cold for each variant, as in a process that serves only it;
    with shared lengths the second variant met the plans the first had built."""
    vocab = model.config.get_text_config().vocab_size
    rows = []
    for shift, variant in enumerate(STREAM_VARIANTS):
        if gpu_only(variant) and device.type != "cuda":
            continue
        set_variant(model, variant)
        g = torch.Generator(device="cpu").manual_seed(2)
        warm = torch.randint(1, vocab, (1, 512 + shift), generator=g).to(device)
        model(warm, cache=new_cache(model, variant), use_cache=True, logits_to_keep=1)  # first-ever compiles
        prompts = [torch.randint(1, vocab, (1, T + shift), generator=g).to(device) for T in lengths]

        def prefill(ids):
            return H.timed(lambda: model(ids, cache=new_cache(model, variant), use_cache=True, logits_to_keep=1),
                           device)[0]

        first, builds = [], []
        for ids in prompts:
            with H.TritonCompiles() as seen:  # a stall's Triton share, counted
                first.append(prefill(ids))
            builds.append(seen.summary())
            for text in seen.variants:  # the log says which variant stalled it
                print(f"  compiled during {name} {variant} 1x{ids.shape[1]}: {text}")
        steady = [min(prefill(ids) for _ in range(2)) for ids in prompts]
        for T, f, st, built in zip(lengths, first, steady, builds):
            rows.append({"kind": "stream", "model": name, "variant": variant, "T": T + shift, "first_ms": f * 1e3,
                         "steady_ms": st * 1e3, "ratio": f / st, **built})
            print(f"stream {name} {variant:9s} 1x{T + shift:6d}: first {f * 1e3:9.1f} ms, steady {st * 1e3:9.1f} ms "
                  f"({f / st:.2f}x); Triton {stream_builds(built)}")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--models", default="llama3-8b,qwen3-next")
    p.add_argument("--contexts", default="8192,32768,131072")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--layers", type=int, default=None, help=f"default: {FULL_DEPTH}")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"a subset of {','.join(VARIANTS)}")
    p.add_argument("--agreement-depths", default="", metavar="N,N",
                   help="also the teacher-forced agreement of each scheme per depth (B=1, the shortest context)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes on any device (smoke test)")
    p.add_argument("--experts", type=int, default=None, help="Qwen3-Next experts per layer (default 512)")
    p.add_argument("--stream", default="", metavar="T,T",
                   help="Qwen3-Next: time to first token of prompts of new lengths, in order (e.g. 1000,...,32000)")
    p.add_argument("--truth-tokens", type=int, default=None, metavar="N",
                   help="judge rows of B x T <= N tokens against an fp32 copy on transformers' torch paths "
                        "(default 131072 on a GPU, 0 on the CPU; 0: judge against the default path)")
    p.add_argument("--rounds", type=int, default=1, metavar="N",
                   help="time each row's variants N times, taking turns (median step, fastest prefill)")
    p.add_argument("--profile", type=int, default=0, metavar="T",
                   help="also print the top GPU kernels of one B=1 prefill of T tokens, default vs ours")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    import transformers

    from torch_aura.integrations import transformers as tat

    facts = (H.device_facts() if device.type == "cuda"
             else {"gpu": "cpu", "commit": H.commit(), "torch": torch.__version__})
    facts["transformers"] = transformers.__version__
    gdn_default = "torch"
    try:
        import fla  # noqa: F401

        gdn_default = f"FLA {getattr(fla, '__version__', '?')}"
    except ImportError:
        pass
    torch_gdn = gdn_default == "torch"
    try:  # transformers' conv then runs the package's CUDA kernels instead of its torch fallback
        import causal_conv1d

        gdn_default += f", causal_conv1d {getattr(causal_conv1d, '__version__', '?')}"
    except ImportError:
        gdn_default += ", torch conv"
    print(f"{facts['gpu']} | torch {facts['torch']} | transformers {facts['transformers']} | default GDN: "
          f"{gdn_default} | commit {facts['commit']}")
    contexts = [int(c) for c in args.contexts.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    variants = args.variants.split(",")
    if unknown := [v for v in variants if v not in VARIANTS]:  # before any model is built or timed
        raise SystemExit(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    reference = reference_of(variants)
    rows = host_costs(device)
    if device.type == "cuda":
        rows += strided_copy_cost(device)
    for name in args.models.split(","):
        layers = args.layers or FULL_DEPTH[name]
        model = build(name, layers, args.tiny, device, args.experts)
        weights_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / GB
        truth_tokens = args.truth_tokens if args.truth_tokens is not None else (131072 if device.type == "cuda" else 0)
        ref = fp32_reference(model) if truth_tokens else None
        for T in contexts:
            for B in batches:
                base = truth = None
                for variant in variants:
                    if gpu_only(variant) and device.type != "cuda":
                        continue
                    if variant == "default" and name == "qwen3-next" and torch_gdn and T > min(contexts):
                        continue  # transformers' torch GDN loops take minutes at long contexts
                    row = {"kind": "e2e", "model": name, "variant": variant, "B": B, "T": T, "layers": layers}
                    res = None
                    # as many rows as the default prefilled, else one (its logits then compare on row 0)
                    first = base["prefill_rows"] if base else B
                    tries = (first, 1) if first > 1 else (1,)
                    for rows_prefilled in tries:
                        held = 0.0
                        try:
                            if device.type == "cuda":
                                torch.cuda.empty_cache()
                                torch.cuda.reset_peak_memory_stats()
                                held = torch.cuda.memory_allocated() / GB
                            res = run_one(model, variant, B, T, device, reps=2 if T * B > 65536 else 3,
                                          prefill_rows=rows_prefilled)
                            row["prefill_rows"] = res["prefill_rows"] = rows_prefilled
                            break
                        except torch.OutOfMemoryError:
                            res = None
                            # what was held before the attempt and its peak: which of them did not fit
                            peak = torch.cuda.max_memory_allocated() / GB if device.type == "cuda" else 0.0
                            row.setdefault("oom", []).append(
                                f"prefill B={rows_prefilled}: {held:.1f} GB held before, peak {peak:.1f} GB")
                            print(f"{name} {variant} B={B} T={T}: out of memory, {row['oom'][-1]}")
                    if res is None:
                        rows.append(row)
                        print(f"{name} {variant:9s} B={B} T={T}: out of memory")
                        continue
                    if device.type == "cuda":
                        row["peak_gb"] = torch.cuda.max_memory_allocated() / GB
                    if base is None and variant == reference:
                        base = res
                        if ref is not None and B * T <= truth_tokens:
                            try:  # the default path's prompt and steps through the fp32 copy on torch paths
                                with torch_only(ref):
                                    truth = run_one(ref, "default", B, T, device, reps=1,
                                                    prefill_rows=row["prefill_rows"])
                                truth["prefill_rows"] = row["prefill_rows"]
                            except torch.OutOfMemoryError:
                                print(f"{name} B={B} T={T}: the fp32 truth is out of memory; judged against default")
                    if truth is not None:
                        row.update(compare(res, truth, "truth_"))
                    if base is not None and variant != reference:
                        row.update(compare(res, base))
                        row["correct"] = judge(row, VARIANTS[variant].cosine_min,
                                               _find(rows, kind="e2e", model=name, B=B, T=T, variant=reference))
                    else:
                        row["correct"] = bool(torch.isfinite(res["decode_logits"]).all())
                    row.update({k: v for k, v in res.items() if not k.endswith("logits")})
                    row["weights_gb"] = weights_gb
                    rows.append(row)
                    print(f"{name} {variant:25s} B={B} T={T:6d}: prefill {row['prefill_ms']:9.1f} ms, step "
                          f"{row['step_ms']:7.2f} ms (GPU {row['step_gpu_ms']:6.2f}; {row['tok_s']:8.1f} tok/s), "
                          f"cache {row['cache_bytes'] / GB:7.3f} GB, peak {row.get('peak_gb', float('nan')):.1f} GB"
                          + (f", compile {row['compile_s']:.1f} s" if VARIANTS[variant].compiled else "")
                          + (f", cos {row.get('prefill_cos', 1):.4f}/{row.get('decode_cos', 1):.4f}, agree "
                             f"{row.get('agreement', 1):.3f}" if base else "")
                          + (f", vs fp32 cos {row['truth_prefill_cos']:.4f}/{row['truth_decode_cos']:.4f}, agree "
                             f"{row['truth_agreement']:.3f}" if truth is not None else "")
                          + ("" if row["correct"] else "  WRONG"))
                if args.rounds > 1:
                    timed = [r for r in rows if r["kind"] == "e2e" and r.get("model") == name and "step_ms" in r
                             and (r["B"], r["T"]) == (B, T)]
                    take_turns(model, timed, device, args.rounds)
        if args.stream and name == "qwen3-next":
            rows += prompt_stream(model, name, [int(t) for t in args.stream.split(",")], device)
        if args.profile and device.type == "cuda":
            rows += prefill_profile(model, name, args.profile, device)
        tat.disable(model)
        del model, ref
        for depth in (int(d) for d in args.agreement_depths.split(",") if d):
            rows += agreement_by_depth(name, depth, min(contexts), args.tiny, device)
    shared = [r for r in rows if "model" not in r]
    for name in args.models.split(","):
        mine = shared + [r for r in rows if r.get("model") == name]
        md = render(facts, gdn_default, mine, args)
        if args.out is not None or device.type == "cuda":
            path = H.write(f"e2e_transformers_{name}", facts, mine, md, args.out)
            print(f"\nwrote {path}\n")
        print(md)
    return 0 if all(r.get("correct", True) for r in rows) else 1


def _find(rows, **kw):
    return next((r for r in rows if all(r.get(k) == v for k, v in kw.items())), None)


def render(facts, gdn_default, rows, args) -> str:
    lines = [f"# transformers end to end on {facts['gpu']}", "",
             f"torch {facts['torch']}, transformers {facts['transformers']}, commit `{facts['commit']}`; "
             "stacks of real layer shapes (depth per row), random bf16 weights; "
             f"default GDN = {gdn_default}. "
             "Generated by `benchmarks/bench_e2e_transformers.py`; do not edit by hand.", "",
             "## Host time per eager call (decode path, one token)", "", "| op | host us / call |", "|---|---|"]
    lines += [f"| {r['op']} | {r['host_us']:.1f} |" for r in rows if r["kind"] == "host"]
    copies = [r for r in rows if r["kind"] == "copy"]
    if copies:
        lines += ["", "## GDN adapter: the copy of transformers' strided q/k/v views (16 / 32 heads, eager)", "",
                  "| tokens | gdn on the views (us) | gdn on contiguous inputs (us) | the three copies alone (us) |",
                  "|---|---|---|---|"]
        lines += [f"| 1x{r['T']} | {r['strided_us']:.1f} | {r['contiguous_us']:.1f} | {r['copy_us']:.1f} |"
                  for r in copies]
    prof = [r for r in rows if r["kind"] == "profile"]
    for variant in dict.fromkeys(r["variant"] for r in prof):
        mine = [r for r in prof if r["variant"] == variant]
        own = f", {mine[0]['own_ms']:.1f} of them torch_aura's" if "own_ms" in mine[0] else ""  # older rows lack it
        lines += ["", f"## Where one B = 1 prefill of {mine[0]['T']} tokens goes ({variant}, "
                  f"{mine[0]['total_ms']:.1f} ms of GPU kernels{own}; top kernels)", "", "| kernel | ms |", "|---|---|"]
        lines += [f"| `{r['kernel']}` | {r['ms']:.2f} |" for r in mine]
    stream = [r for r in rows if r["kind"] == "stream"]
    if stream:
        lines += ["", "## A stream of prompts of new lengths: time to first token, stalls included (B = 1)", "",
                  "First: the first prompt of that length in the process (after one warm-up prompt; each variant's "
                  "lengths are its own, so no variant meets a shape-keyed plan another built); steady: the same "
                  "prompt once every length has run. Target: first <= 1.2x steady. Triton: the kernels the first "
                  "prompt compiled (their seconds) and loaded from Triton's disk cache, GDN's, FLA's and inductor's "
                  "alike.", "",
                  "| variant | T | first ms | steady ms | first / steady | Triton during the first |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['variant']} | {r['T']} | {r['first_ms']:.1f} | {r['steady_ms']:.1f} | {r['ratio']:.2f}x | "
                  f"{stream_builds(r)} |" for r in stream]
    lines += ["", "## Prefill and decode", "",
              "Ratios are against the fastest baseline of the row (default, default-no-cudnn, static-compiled); "
              "agreement: teacher-forced argmax agreement with the row's dense eager path (`default`, else "
              "`default-no-cudnn` where only it ran). vs fp32: the same prompt and steps through "
              "an fp32 copy of the stack on transformers' pure-PyTorch paths (no TF32); where it was run, a row "
              f"is WRONG when its logit error (1 - cosine) to it exceeds {TRUTH_RATIO:g}x the dense path's plus "
              "1 - the variant's cosine floor (0.995 exact, 0.99 aura8, 0.95 aura4v2), otherwise when its cosine "
              "to the dense path is below that floor.", "",
              "| model | layers | B | T | variant | prefill ms | decode step ms (GPU busy) | tok/s | "
              "vs fastest baseline | compile s | cache GB | peak GB | logits cos (prefill / decode) | agreement | "
              "vs fp32: cos (prefill / decode), agreement |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in (r for r in rows if r["kind"] == "e2e"):
        head = f"| {r['model']} | {r['layers']} | {r['B']} | {r['T']} | {r['variant']} |"
        if "prefill_ms" not in r:
            lines.append(head + " OOM | | | | | | | | | |")
            continue
        baselines = [b for b in rows if b["kind"] == "e2e" and b["variant"] in BASELINES and "step_ms" in b
                     and (b["model"], b["B"], b["T"]) == (r["model"], r["B"], r["T"])]
        fastest = min(baselines, key=lambda b: b["step_ms"], default=None)
        ratio = f"{fastest['step_ms'] / r['step_ms']:.2f}x ({fastest['variant']})" if fastest else ""
        prefill = f"{r['prefill_ms']:.1f}" + ("" if r["prefill_rows"] == r["B"] else f" (B={r['prefill_rows']})")
        cos = f"{r['prefill_cos']:.4f} / {r['decode_cos']:.4f}" if "prefill_cos" in r else "-"
        agree = f"{r['agreement']:.3f}" if "agreement" in r else "-"
        truth = (f"{r['truth_prefill_cos']:.4f} / {r['truth_decode_cos']:.4f}, {r['truth_agreement']:.3f}"
                 if "truth_prefill_cos" in r else "-")
        compile_s = f"{r['compile_s']:.1f}" if r["compile_s"] == r["compile_s"] else ""
        lines.append(f"{head} {prefill} | {r['step_ms']:.2f} ({r['step_gpu_ms']:.2f}) | {r['tok_s']:.1f} | {ratio} | "
                     f"{compile_s} | {r['cache_bytes'] / GB:.3f} | {r.get('peak_gb', float('nan')):.1f} | {cos} | "
                     f"{agree}{'' if r['correct'] else ' WRONG'} | {truth} |")
    turns = [r for r in rows if r["kind"] == "e2e" and len(r.get("step_ms_rounds", ())) > 1]
    if turns:
        lines += ["", "## Decode step per round (the row's variants taking turns; the table above has the median)", "",
                  "| model | B | T | variant | step ms per round |", "|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['B']} | {r['T']} | {r['variant']} | "
                  + " / ".join(f"{ms:.2f}" for ms in r["step_ms_rounds"]) + " |" for r in turns]
    lines += ["", f"## Longest context per row at B = 8, full depth, {KV_BUDGET_GB} GB of K/V (from the measured "
              "bytes per token)", "",
              "| model | cache (row measured) | bytes / token / layer | tokens per row | vs dense |",
              "|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in rows if r["kind"] == "e2e"):
        first = {}  # per cache kind, the first measured row: bytes per token depend on neither attention nor compile
        for r in rows:
            if r["kind"] == "e2e" and r["model"] == model and "bytes_per_token_layer" in r:
                first.setdefault(VARIANTS[r["variant"]].cache, r)
        dense = first.get("dynamic") or first.get("static")
        for cache in ("dense", *SCHEMES):
            r = dense if cache == "dense" else first.get(cache)
            if r is None:
                continue
            n = longest_context_b8(model, r["bytes_per_token_layer"])
            ratio = f"{n / longest_context_b8(model, dense['bytes_per_token_layer']):.2f}x" if dense else ""
            lines.append(f"| {model} | {cache} ({r['variant']}) | {r['bytes_per_token_layer']:.0f} | {n:,} | {ratio} |")
    depth = [r for r in rows if r["kind"] == "depth"]
    if depth:
        lines += ["", "## Teacher-forced agreement with the dense path per depth (B = 1, random weights)", "",
                  "| model | scheme | layers | T | argmax agreement | logits cos |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['variant']} | {r['layers']} | {r['T']} | {r['agreement']:.3f} | "
                  f"{r['decode_cos']:.4f} |" for r in depth]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
