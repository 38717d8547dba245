"""Shared setup of the integration tests (adapters to transformers and other frameworks)."""

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
