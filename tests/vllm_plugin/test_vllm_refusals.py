"""What the CUSTOM backend refuses, as a user meets it: vLLM builds its engine configuration (``LLM(...)``,
the API server's start-up), the plugin's check refuses with its own sentence (the value, the supported
set, the alternative) before any engine process starts, and that sentence ends the user's traceback
and the server's log. Also: the plugin's variables set without CUSTOM warn, once per process.

Refusals need no weights: the models here are configs with a tokenizer (vLLM reads no weights before
it refuses)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest

import _vllm_serve as s

pytestmark = pytest.mark.usefixtures("vllm")

OWN = r"drop --attention-backend CUSTOM to serve it with vLLM's own attention backend"


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """name -> a model directory holding only a config and the tokenizer."""
    import transformers as T

    root = tmp_path_factory.mktemp("configs")
    llama = dict(vocab_size=s.VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    made = {
        **{f"llama_d{D}": T.LlamaConfig(**llama, head_dim=D) for D in (64, 72, 80, 128)},
        "mistral_window256": T.MistralConfig(**llama, head_dim=64, sliding_window=256),
        "gemma2_softcap": T.Gemma2Config(**llama, head_dim=64, attn_logit_softcapping=50.0, sliding_window=None),
        "deepseek_v2_mla": T.DeepseekV2Config(
            vocab_size=s.VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=32, qk_nope_head_dim=64,
            v_head_dim=64, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
            first_k_dense_replace=2),
        "whisper": T.WhisperConfig(vocab_size=s.VOCAB, d_model=128, encoder_layers=1, decoder_layers=1,
                                   encoder_attention_heads=2, decoder_attention_heads=2),
    }
    return {name: s.save_config(root / name, cfg) for name, cfg in made.items()}


def engine_config(model, backend="CUSTOM", **kwargs):
    """vLLM's engine configuration as ``LLM(...)`` and the API server build it (no engine started)."""
    os.environ.update(s.OFFLINE_ENV)
    from vllm.engine.arg_utils import EngineArgs

    args = dict(model=str(model), dtype="float32", max_model_len=256, kv_cache_memory_bytes=64 << 20,
                enforce_eager=True, block_size=32, attention_backend=backend)
    return EngineArgs(**{**args, **kwargs}).create_engine_config()


# (model, engine arguments, plugin variables, the sentence expected)
REFUSED = {
    "head size (dense)": ("llama_d72", {}, {},
                          r"head size 72: the dense KV cache supports head sizes \[64, 80, 96, 128, 192, 256, 512\]; "
                          + OWN),
    "head size (AURA)": ("llama_d80", {}, {"TORCH_AURA_VLLM_KV_CACHE": "aura4v2"},
                         r"head size 80: the aura4v2 KV cache supports head sizes \[64, 128, 256, 512\]; set "
                         r"TORCH_AURA_VLLM_KV_CACHE=dense \(head sizes \[64, 80, .*\]\), or " + OWN),
    "kv-cache-dtype": ("llama_d64", {"kv_cache_dtype": "fp8"}, {},
                       r"--kv-cache-dtype fp8: the CUSTOM backend keeps --kv-cache-dtype auto and takes its format "
                       r"from TORCH_AURA_VLLM_KV_CACHE .*'aura8'.*; drop --kv-cache-dtype, or " + OWN),
    "block size": ("llama_d64", {"block_size": 40}, {},
                   r"--block-size 40: supported multiples of 16; pass --block-size 32"),
    "sliding window": ("mistral_window256", {}, {},
                       r"sliding-window attention \(window 256\): not supported .*pass --disable-sliding-window "
                       r"\(vLLM then caps --max-model-len at the window.*\), or " + OWN),
    "soft-capping": ("gemma2_softcap", {}, {}, r"attention logit soft-capping \(50.0\): not supported.*" + OWN),
    "MLA": ("deepseek_v2_mla", {}, {}, r"multi-head latent attention \(MLA\): not supported.*" + OWN),
    "encoder-decoder": ("whisper", {}, {}, r"attention type 'encoder_decoder': the CUSTOM backend serves decoder "
                                           r"self-attention only; " + OWN),
    "speculative draft model": ("llama_d64", {"speculative_config": "draft"}, {},
                                r"speculative decoding method 'draft_model': the CUSTOM backend is tested with "
                                r"\['ngram'\]; use --speculative-config .*\"ngram\".*, or " + OWN),
    "invalid format variable": ("llama_d64", {}, {"TORCH_AURA_VLLM_KV_CACHE": "aura5"},
                                r"TORCH_AURA_VLLM_KV_CACHE='aura5' is not a KV cache format: expected 'dense' or an "
                                r"AURA scheme .*bits in \[2, 3, 4, 8\].*unset it for the dense cache"),
    "invalid verify variable": ("llama_d64", {}, {"TORCH_AURA_VLLM_VERIFY": "yes"},
                                r"TORCH_AURA_VLLM_VERIFY='yes': expected '1' .* or '0'"),
    # CUSTOM chosen for one kind of layer only (vLLM's backend_per_kind) still resolves the variables
    "invalid variable, CUSTOM per kind": ("llama_d64", {"backend": None, "attention_config": {
        "backend_per_kind": {"full_attention": "CUSTOM"}}}, {"TORCH_AURA_VLLM_KV_CACHE": "aura5"},
        r"TORCH_AURA_VLLM_KV_CACHE='aura5' is not a KV cache format"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_at_engine_configuration_with_our_sentence(configs, monkeypatch, case):
    model, kwargs, env, expected = REFUSED[case]
    if "backend_per_kind" in kwargs.get("attention_config", {}) and s.vllm_version() < (0, 32):
        pytest.skip("vLLM 0.24 has no per-kind backend routing (AttentionConfig.backend_per_kind)")
    kwargs = dict(kwargs)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if kwargs.get("speculative_config") == "draft":  # a draft model: the target itself
        kwargs = {**kwargs, "speculative_config": {"method": "draft_model", "model": str(configs[model]),
                                                   "num_speculative_tokens": 2}}
    backend = kwargs.pop("backend", "CUSTOM")
    with pytest.raises(ValueError, match=expected) as error:
        engine_config(configs[model], backend=backend, **kwargs)
    assert "head_size not supported" not in str(error.value)  # vLLM's generic reason list is not what shows


# What the same checks accept (so the refusals above are not a blanket "no").
ACCEPTED = {
    "dense D=64": ("llama_d64", {}, {}),
    "dense D=80": ("llama_d80", {}, {}),
    "aura4v2 D=128": ("llama_d128", {}, {"TORCH_AURA_VLLM_KV_CACHE": "aura4v2"}),
    "block 16": ("llama_d64", {"block_size": 16}, {}),
    "window disabled": ("mistral_window256", {"disable_sliding_window": True}, {}),
    "ngram speculative": ("llama_d64", {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                                              "prompt_lookup_max": 3}}, {}),
    "prefix caching + chunked prefill": ("llama_d64", {"enable_prefix_caching": True, "enable_chunked_prefill": True,
                                                       "max_num_batched_tokens": 64}, {}),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_accepted_at_engine_configuration(configs, monkeypatch, case):
    model, kwargs, env = ACCEPTED[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = engine_config(configs[model], **kwargs)
    assert config.attention_config.backend.name == "CUSTOM"


def test_several_refusals_are_listed_together(configs):
    with pytest.raises(ValueError) as error:
        engine_config(configs["llama_d72"], kv_cache_dtype="fp8", block_size=40)
    lines = [line for line in str(error.value).splitlines() if line.startswith("  - ")]
    assert [line.split(":")[0] for line in lines] == ["  - head size 72", "  - --kv-cache-dtype fp8",
                                                      "  - --block-size 40"]


def test_llm_raises_our_sentence(configs):
    # in-process LLM(...): the exception the user catches carries the sentence
    with pytest.raises(ValueError, match=r"--kv-cache-dtype fp8: the CUSTOM backend keeps --kv-cache-dtype auto"):
        s.engine(configs["llama_d64"], "CUSTOM", kv_cache_dtype="fp8")


def test_server_log_ends_with_our_sentence(configs, tmp_path):
    # the API server refuses in its own process, before any engine process: the log's last lines
    # are the refusal, not "Engine core initialization failed"
    env = {**os.environ, **s.OFFLINE_ENV}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the server as users start it
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(configs["llama_d72"]),
           "--attention-backend", "CUSTOM", "--kv-cache-memory-bytes", "64M", "--port", "0"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-6:])
    assert "head size 72: the dense KV cache supports head sizes [64, 80, 96, 128, 192, 256, 512]" in tail, tail
    assert "Engine core initialization failed" not in done.stdout + done.stderr


# ----------------------------------------------------------------- variables set without CUSTOM
@pytest.mark.parametrize("value,invalid", [("aura4v2", False), ("aura5", True)])
def test_variable_without_custom_warns_once(configs, monkeypatch, plugin_log, value, invalid):
    from torch_aura.integrations.vllm import platform

    monkeypatch.setattr(platform, "_warned_unused", False)  # a fresh process
    monkeypatch.setenv("TORCH_AURA_VLLM_KV_CACHE", value)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine_config(configs["llama_d64"], backend=None)  # vLLM's own backend: starts as before
        engine_config(configs["llama_d64"], backend="CPU_ATTN")
    ours = [str(w.message) for w in caught if "torch_aura" in str(w.message)]
    logged = [r.getMessage() for r in plugin_log if r.levelno == logging.WARNING]
    assert len(ours) == 1 and logged == ours, (ours, logged)
    assert f"TORCH_AURA_VLLM_KV_CACHE='{value}' has no effect: vLLM's CUSTOM attention backend is not selected" \
        in ours[0] and "--attention-backend CUSTOM" in ours[0]
    assert ("is not a KV cache format" in ours[0]) == invalid


def test_no_variable_no_warning(configs, monkeypatch, plugin_log):
    from torch_aura.integrations.vllm import platform

    monkeypatch.setattr(platform, "_warned_unused", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine_config(configs["llama_d64"], backend=None)
    assert not [w for w in caught if "torch_aura" in str(w.message)] and not plugin_log
