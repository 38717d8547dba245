"""torch_aura inside vLLM (``pip install 'torch_aura[vllm]'``): an attention-backend plugin.

vLLM calls :func:`register` (entry point ``vllm.general_plugins``) in every one of its processes.
It fills vLLM's ``CUSTOM`` attention-backend slot with
:class:`~torch_aura.integrations.vllm.backend.AuraAttentionBackend` and, on vLLM's CPU platform
(which otherwise ignores ``CUSTOM``), lets that one choice through. Nothing else changes: a run
that does not pass ``--attention-backend CUSTOM`` (``attention_config={"backend": "CUSTOM"}``)
never imports the backend.

The KV cache format is this plugin's setting (vLLM's ``--kv-cache-dtype`` is a closed list), read
from the environment of the process that starts vLLM (its workers inherit it) and resolved in one
place, :mod:`._env`:

==============================  ===============================================================
``TORCH_AURA_VLLM_KV_CACHE``    ``dense`` (default): the model dtype, decode via ``flash_decode``;
                                ``aura{kb}v{vb}`` / ``aura{b}`` (e.g. ``aura4v2``, ``aura8``):
                                AURA-compressed pages, attention via ``aura_decode``
``TORCH_AURA_VLLM_VERIFY``      ``1``: the AURA backend also runs dense attention over the
                                dequantized cache on every decode step and records the largest
                                difference in :data:`STATS` (a debugging aid; slow)
==============================  ===============================================================

Either variable set without ``--attention-backend CUSTOM`` has no effect, and vLLM's logger says so
(once per process, also as a Python warning). A configuration the backend cannot serve is refused
when vLLM builds its engine configuration, before any engine process starts, with a ``ValueError``
naming the value, what is supported and the alternative (:mod:`.platform`).

How to see that the plugin serves: vLLM's log at INFO carries one line per KV-cache group it
serves, ``torch_aura: serving <n> attention layers with the CUSTOM backend (KV cache <format>,
...)``, when the engine binds its KV cache.

:data:`STATS` (a :class:`Stats`) counts, per process, the eager batches each path served (a
CUDA-graph replay is not counted) and, in verify mode, the steps verified and the largest
difference. Tests read it to prove that the plugin, not a fallback, ran the steps. With
``tensor_parallel_size > 1`` (or vLLM's engine in a process of its own) the counting happens in vLLM's
workers: ``llm.collective_rpc(worker_stats)`` returns each worker's, by rank.

Example (CPU; the tests build a tiny random-weight model and tokenizer in ``model_dir``)::

    TORCH_AURA_VLLM_KV_CACHE=aura4v2 python -m vllm.entrypoints.openai.api_server \\
        --model model_dir --attention-backend CUSTOM --dtype float32 --block-size 32
"""

from __future__ import annotations

from ._common import BACKEND_PATH, SERVING_LOG_PREFIX, STATS, Stats, worker_stats
from ._env import KV_CACHE_ENV, VERIFY_ENV, Settings, settings

__all__ = ["register", "settings", "Settings", "Stats", "STATS", "worker_stats", "BACKEND_PATH", "SERVING_LOG_PREFIX",
           "KV_CACHE_ENV", "VERIFY_ENV"]


def register() -> None:
    """vLLM's general-plugin hook: idempotent, called once per vLLM process.

    Fills the ``CUSTOM`` slot unless another plugin already holds it (then it logs and leaves it),
    and installs the platform hooks of :mod:`.platform` and, on vLLM 0.24, the spec hook of
    :mod:`._compat`.
    """
    import logging

    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    log = logging.getLogger("vllm.torch_aura")
    from . import gdn

    if gdn.enabled():  # opt-in, independent of the attention backend
        gdn.install()
    custom = AttentionBackendEnum.CUSTOM
    if custom.is_overridden() and custom.get_path() != BACKEND_PATH:
        log.warning("torch_aura: the CUSTOM attention backend slot already holds %s; leaving it",
                    custom.get_path())
        return
    register_backend(custom, BACKEND_PATH)
    from . import _compat
    from .platform import install

    install()
    _compat.install()
