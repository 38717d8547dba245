"""torch_aura inside vLLM (``pip install 'torch_aura[vllm]'``): an attention-backend plugin.

vLLM calls :func:`register` (entry point ``vllm.general_plugins``) in every one of its processes.
It fills vLLM's ``CUSTOM`` attention-backend slot with
:class:`~torch_aura.integrations.vllm.backend.AuraAttentionBackend` and, on vLLM's CPU platform
(which otherwise ignores ``CUSTOM``), lets that one choice through. Nothing else changes: a run
that does not pass ``--attention-backend CUSTOM`` (``attention_config={"backend": "CUSTOM"}``)
never imports the backend.

The KV cache format is this plugin's setting (vLLM's ``--kv-cache-dtype`` is a closed list), read
from the environment of the process that starts vLLM (its workers inherit it):

==============================  ===============================================================
``TORCH_AURA_VLLM_KV_CACHE``    ``dense`` (default): the model dtype, decode via ``flash_decode``;
                                ``aura{kb}v{vb}`` / ``aura{b}`` (e.g. ``aura4v2``, ``aura8``):
                                AURA-compressed pages, attention via ``aura_decode``
``TORCH_AURA_VLLM_VERIFY``      ``1``: the AURA backend also runs dense attention over the
                                dequantized cache on every decode step and records the largest
                                difference in :data:`STATS` (a debugging aid; slow)
==============================  ===============================================================

:data:`STATS` counts, per process, the eager batches each path served (``dense_decode``,
``dense_prefill``, ``aura_decode``, ``aura_prefill``; a CUDA-graph replay is not counted) and, in
verify mode, ``verify_steps`` and ``verify_max_abs``. Tests read it to prove that the plugin, not a
fallback, ran the decode steps.

Example (CPU; the tests build a tiny random-weight model and tokenizer in ``model_dir``)::

    TORCH_AURA_VLLM_KV_CACHE=aura4v2 python -m vllm.entrypoints.openai.api_server \\
        --model model_dir --attention-backend CUSTOM --dtype float32 --block-size 32
"""

from __future__ import annotations

import collections
import os

__all__ = ["register", "kv_cache_scheme", "STATS", "BACKEND_PATH", "KV_CACHE_ENV", "VERIFY_ENV"]

BACKEND_PATH = "torch_aura.integrations.vllm.backend.AuraAttentionBackend"
KV_CACHE_ENV = "TORCH_AURA_VLLM_KV_CACHE"
VERIFY_ENV = "TORCH_AURA_VLLM_VERIFY"

# path name -> batches served in this process; "verify_max_abs" holds the largest difference seen.
STATS: collections.Counter = collections.Counter()


def kv_cache_scheme() -> tuple[int, int] | None:
    """``None`` for the dense cache, else ``(key_bits, value_bits)`` of ``TORCH_AURA_VLLM_KV_CACHE``.

    Raises:
        ValueError: the variable holds neither ``dense`` nor an AURA scheme name.
    """
    value = os.environ.get(KV_CACHE_ENV, "dense").strip().lower()
    if value in ("", "dense", "auto"):
        return None
    from ...aura_cache import parse_scheme

    try:
        return parse_scheme(value)
    except ValueError as e:
        raise ValueError(f"{KV_CACHE_ENV}: expected 'dense' or an AURA scheme such as 'aura4v2' or "
                         f"'aura8', got {value!r}") from e


def verify_enabled() -> bool:
    return os.environ.get(VERIFY_ENV, "0") not in ("", "0")


def register() -> None:
    """vLLM's general-plugin hook: idempotent, called once per vLLM process.

    Fills the ``CUSTOM`` slot unless another plugin already holds it (then it logs and leaves it).
    """
    import logging

    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    log = logging.getLogger("vllm.torch_aura")
    custom = AttentionBackendEnum.CUSTOM
    if custom.is_overridden() and custom.get_path() != BACKEND_PATH:
        log.warning("torch_aura: the CUSTOM attention backend slot already holds %s; leaving it",
                    custom.get_path())
        return
    register_backend(custom, BACKEND_PATH)
    from .platform import honour_custom_on_cpu

    honour_custom_on_cpu()
