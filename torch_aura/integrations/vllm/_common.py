"""What every module of the plugin shares: its backend's import path, the INFO line's prefix, and the
per-process counters :data:`STATS` (:func:`worker_stats` copies them for ``collective_rpc``). A leaf:
imports neither vLLM nor the rest of the plugin, so the package's ``register()``, ``platform.py``,
``backend.py`` and ``_paged.py`` all import it and none of them imports the package back.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

BACKEND_PATH = "torch_aura.integrations.vllm.backend.AuraAttentionBackend"
SERVING_LOG_PREFIX = "torch_aura: serving"  # starts the INFO line that shows the plugin serving (README)


@dataclass
class Stats:
    """Batches each path served in this process (one per layer per engine step)."""

    dense_decode: int = 0
    dense_prefill: int = 0
    dense_fused_write: int = 0  # dense K/V writes by vLLM's one-launch reshape_and_cache_flash (CUDA)
    aura_decode: int = 0
    aura_prefill: int = 0
    flash_prefill: int = 0  # prefill batches (either format) run by vLLM's FlashAttention (CUDA)
    speculative_decode: int = 0  # decode batches holding speculative verification rows (either format)
    verify_steps: int = 0  # AURA decode batches checked in verify mode
    verify_max_abs: float = 0.0  # the largest |AURA - dense over the dequantized pages| seen

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, f.default)

    def served(self) -> int:
        """Batches served by either format."""
        return self.dense_decode + self.dense_prefill + self.aura_decode + self.aura_prefill


STATS = Stats()


def worker_stats(worker=None) -> Stats:
    """A copy of this process's :data:`STATS`. Pass it to ``LLM.collective_rpc`` to read every worker's
    (one per tensor-parallel rank; they run in processes of their own when ``tensor_parallel_size > 1``).
    ``worker``: vLLM's worker, which ``collective_rpc`` passes first; unused."""
    return replace(STATS)
