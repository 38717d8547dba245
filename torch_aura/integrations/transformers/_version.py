"""The transformers versions this adapter supports, checked once at import of the adapter."""

from __future__ import annotations

from .._versions import require

# [low, high): the 5.x releases whose hooks the adapter relies on (module-level gated delta rule
# functions, ``cache.update(..., kwargs=...)`` sharing its dict with the attention function,
# ``LinearAttentionLayer``). TESTED is what CI pins and the GPU benchmark ran; 5.20, 5.22 and 5.23
# fail the integration tests (padded-batch masks, GDN call path), so they are refused.
SUPPORTED = ((5, 24), (5, 25))
TESTED = ("5.24.0",)


def require_transformers():
    """Import transformers and check its version (:data:`SUPPORTED`); returns the module."""
    return require("transformers", "torch_aura.integrations.transformers", SUPPORTED, TESTED,
                   "pip install 'torch_aura[transformers]'")
