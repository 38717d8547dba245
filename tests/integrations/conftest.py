"""Shared setup of the integration tests (adapters to transformers and other frameworks)."""

import importlib.util
import os

import pytest


def require_transformers():
    """transformers, or a skip; with ``AURA_REQUIRE_TRANSFORMERS=1`` (CI) a missing one fails."""
    if os.environ.get("AURA_REQUIRE_TRANSFORMERS") == "1":
        import transformers

        return transformers
    return pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def hf_transformers():
    """The transformers module (see :func:`require_transformers`)."""
    return require_transformers()


@pytest.fixture
def transformers_torch_gdn():
    """Skip where FLA is installed: transformers then picked FLA's GDN kernels at import, whose
    Triton code cannot run the CPU models these tests compare ours against (tests/cuda covers that
    pairing on the GPU)."""
    if importlib.util.find_spec("fla") is not None:
        pytest.skip("FLA installed: transformers' default GDN path is FLA's, which needs CUDA tensors")


@pytest.fixture(scope="session")
def tat(hf_transformers):
    """``torch_aura.integrations.transformers``."""
    from torch_aura.integrations import transformers as tat

    return tat


@pytest.fixture
def llama(hf_transformers, tat):
    """A tiny random-weight Llama (2 layers, 6/2 heads of 64) on the "aura" attention."""
    from _hf_models import tiny_llama

    model = tiny_llama(hf_transformers)
    tat.enable(model)
    yield model
    tat.disable(model)
