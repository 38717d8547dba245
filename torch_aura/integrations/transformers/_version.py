"""The transformers versions this adapter supports, checked once at import of the adapter."""

from __future__ import annotations

# [low, high): the 5.x releases whose hooks the adapter relies on (module-level gated delta rule
# functions, ``cache.update(..., kwargs=...)`` sharing its dict with the attention function,
# ``LinearAttentionLayer``). TESTED is what CI pins and the GPU benchmark ran; 5.20, 5.22 and 5.23
# fail the integration tests (padded-batch masks, GDN call path), so they are refused.
SUPPORTED = ((5, 24), (5, 25))
TESTED = ("5.24.0",)


def _parse(version: str) -> tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def require_transformers():
    """Import transformers and check its version; returns the module.

    Raises:
        ImportError: transformers is not installed, or its version is outside :data:`SUPPORTED`;
            the message names the installed and the supported versions.
    """
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - exercised only without transformers
        raise ImportError("torch_aura.integrations.transformers needs transformers: "
                          "pip install 'torch_aura[transformers]'") from e
    low, high = SUPPORTED
    have = _parse(transformers.__version__)
    if not low <= have < high:
        raise ImportError(
            f"torch_aura.integrations.transformers supports transformers >= {low[0]}.{low[1]}, "
            f"< {high[0]}.{high[1]} (tested: {', '.join(TESTED)}), found {transformers.__version__}")
    return transformers
