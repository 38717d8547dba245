"""The plugin's two hooks into vLLM's platform, installed by ``register()`` in every vLLM process.

* ``CpuPlatform.get_attn_backend_cls``: vLLM 0.32's ``CpuPlatform.get_attn_backend_cls`` logs "Cannot use
  CUSTOM backend on CPU" and returns ``CPU_ATTN`` whatever was asked. The wrapper changes exactly one
  request: ``CUSTOM`` while the slot holds this plugin's backend, validated the way the CUDA platform
  validates a selected backend. Every other selection reaches the original method.
* :func:`check_engine_config`, run after the current platform's ``check_and_update_config``: vLLM
  calls that hook when it builds its engine configuration (``LLM(...)``, the API server's start-up),
  in the user's own process and before any engine process exists, so a refusal raised there is the
  last thing the user sees, not an engine process's traceback followed by "Engine core
  initialization failed". It refuses what ``_support.refusals`` refuses, read from the whole
  configuration, and warns once per process when the plugin's variables are set while ``CUSTOM``
  is not selected (they then have no effect).
"""

from __future__ import annotations

import logging
import warnings

from ... import _env as _table
from ._common import BACKEND_PATH
from ._env import VARIABLES, settings
from ._support import refusal, refusals

_log = logging.getLogger("vllm.torch_aura")
_warned_unused = False


def install() -> None:
    """Idempotent: wraps each platform method once per process."""
    from vllm.platforms import current_platform
    from vllm.platforms.cpu import CpuPlatform

    _wrap(CpuPlatform, "get_attn_backend_cls", _cpu_get_attn_backend_cls)
    _wrap(type(current_platform), "check_and_update_config", _check_and_update_config)


def _wrap(cls, name: str, make) -> None:
    original = cls.__dict__.get(name) or getattr(cls, name)
    func = getattr(original, "__func__", original)
    if getattr(func, "_torch_aura", False):
        return
    wrapped = make(func)
    wrapped._torch_aura = True  # type: ignore[attr-defined]
    setattr(cls, name, classmethod(wrapped))


def _ours(backend) -> bool:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    custom = AttentionBackendEnum.CUSTOM
    return backend == custom and custom.is_overridden() and custom.get_path() == BACKEND_PATH


def _cpu_get_attn_backend_cls(original):
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        if not _ours(selected_backend):
            return original(cls, selected_backend, attn_selector_config, num_heads)
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        reasons = AttentionBackendEnum.CUSTOM.get_class().validate_configuration(
            device_capability=None, **attn_selector_config._asdict())
        if reasons:
            raise refusal(reasons)
        _log.info("torch_aura: using the CUSTOM attention backend on CPU")
        return BACKEND_PATH
    return get_attn_backend_cls


def _check_and_update_config(original):
    def check_and_update_config(cls, vllm_config) -> None:
        original(cls, vllm_config)
        from . import gdn

        if gdn.enabled() and vllm_config.model_config is not None:
            gdn.check_engine_config(vllm_config)
        check_engine_config(vllm_config)
    return check_and_update_config


def _selected(attention_config) -> tuple[bool, bool]:
    """(CUSTOM is the backend of every layer kind not routed elsewhere, CUSTOM serves some kind)."""
    per_kind = dict(getattr(attention_config, "backend_per_kind", None) or {})
    everywhere = _ours(attention_config.backend)
    return everywhere, everywhere or any(_ours(b) for b in per_kind.values())


def check_engine_config(vllm_config) -> None:
    """Refuse, with our own message, an engine configuration the CUSTOM backend cannot serve; warn
    when the plugin's variables are set while it is not selected."""
    model = vllm_config.model_config
    if model is None:  # a default config vLLM builds outside an engine: nothing was asked of anyone
        return
    everywhere, somewhere = _selected(vllm_config.attention_config)
    if not somewhere:
        _warn_unused()
        return
    s = settings()  # an invalid variable is refused here, by name
    if not everywhere:  # per-kind routing: each layer the selector gives us is checked as it is built
        return
    import vllm.envs as envs

    per_kind = dict(getattr(vllm_config.attention_config, "backend_per_kind", None) or {})  # vLLM >= 0.32
    routed_away = {kind for kind, backend in per_kind.items() if not _ours(backend)}
    text = model.hf_text_config
    parallel, spec = vllm_config.parallel_config, vllm_config.speculative_config
    kv = vllm_config.kv_transfer_config
    reasons = refusals(
        s, head_size=model.get_head_size(), dtype=model.dtype, kv_cache_dtype=vllm_config.cache_config.cache_dtype,
        block_size=vllm_config.cache_config.block_size,
        use_mla=model.use_mla and not routed_away & {"mla_attention", "sliding_window_mla"},
        sliding_window=None if "sliding_window" in routed_away else model.get_sliding_window(),
        attn_type="encoder_decoder" if model.is_encoder_decoder else "decoder",
        use_non_causal=getattr(vllm_config.attention_config, "use_non_causal", False),
        use_batch_invariant=envs.VLLM_BATCH_INVARIANT,
        use_kv_connector=kv is not None and kv.is_kv_transfer_instance,
        use_pcp=parallel.prefill_context_parallel_size > 1, use_dcp=parallel.decode_context_parallel_size > 1,
        # fields vLLM 0.24 lacks (so cannot be asked for there)
        use_adaptive_verification=spec is not None and getattr(spec, "enable_adaptive_verification", False),
        use_rswa=getattr(model, "rswa_window", None) is not None,
        logits_soft_cap=getattr(text, "attn_logit_softcapping", None) or None,
        speculative_method=spec.method if spec is not None else None)
    if reasons:
        raise refusal(reasons)


def _warn_unused() -> None:
    """Once per process: the plugin's variables do nothing without ``--attention-backend CUSTOM``."""
    global _warned_unused
    present = [name for name in VARIABLES if _table.is_set(name)]
    if _warned_unused or not present:
        return
    _warned_unused = True
    text = ", ".join(f"{name}={_table.get(name)!r}" for name in present)
    try:
        settings()
        invalid = ""
    except ValueError as e:
        invalid = f" It is also invalid: {e}"
    message = (f"torch_aura: {text} has no effect: vLLM's CUSTOM attention backend is not selected. Pass "
               f"--attention-backend CUSTOM (Python: attention_config={{'backend': 'CUSTOM'}}) to serve with "
               f"torch_aura's backend, or unset the variable.{invalid}")
    _log.warning("%s", message)
    warnings.warn(message, UserWarning, stacklevel=2)
