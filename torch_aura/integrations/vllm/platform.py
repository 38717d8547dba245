"""Make ``--attention-backend CUSTOM`` selectable on vLLM's CPU platform.

vLLM 0.32's ``CpuPlatform.get_attn_backend_cls`` logs "Cannot use CUSTOM backend on CPU" and returns
``CPU_ATTN`` whatever was asked. :func:`honour_custom_on_cpu` wraps it so that exactly one request
changes meaning: ``CUSTOM`` while the slot holds this plugin's backend, validated the way the CUDA
platform validates a selected backend. Every other selection reaches the original method.
"""

from __future__ import annotations

import logging

from . import BACKEND_PATH

_log = logging.getLogger("vllm.torch_aura")


def honour_custom_on_cpu() -> None:
    """Idempotent: wraps ``CpuPlatform.get_attn_backend_cls`` once per process."""
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    original = CpuPlatform.__dict__["get_attn_backend_cls"]
    if getattr(original, "_torch_aura", False):
        return
    original_func = original.__func__

    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        custom = AttentionBackendEnum.CUSTOM
        if selected_backend != custom or not custom.is_overridden() or custom.get_path() != BACKEND_PATH:
            return original_func(cls, selected_backend, attn_selector_config, num_heads)
        backend = custom.get_class()
        reasons = backend.validate_configuration(device_capability=None, **attn_selector_config._asdict())
        if reasons:
            raise ValueError(f"Selected backend CUSTOM (torch_aura) is not valid for this configuration. "
                             f"Reason: {reasons}")
        _log.info("torch_aura: using the CUSTOM attention backend on CPU")
        return BACKEND_PATH

    wrapped = classmethod(get_attn_backend_cls)
    wrapped._torch_aura = True  # type: ignore[attr-defined]
    CpuPlatform.get_attn_backend_cls = wrapped
