"""What differs between the vLLM releases the plugin supports (``_version.SUPPORTED``), in one place.

The plugin has one code path; the two backend APIs it meets are told apart by what vLLM provides,
never by version numbers:

* **vLLM >= 0.32** (``vllm.v1.kv_cache_layout`` exists): the KV cache layout comes from the spec
  and the backend's ``supported_kv_cache_layouts``; a backend shrinks its pages through
  ``AttentionBackend.customize_spec`` returning ``replace(spec, dtype=uint8,
  state_content_bytes=N)``.
* **vLLM 0.24** (no such module): the model runner asks the backend for
  ``get_kv_cache_shape`` / ``get_kv_cache_stride_order``, and nothing asks it to adjust the spec.
  :func:`install` wraps ``Attention.get_kv_cache_spec`` so that, for layers served by this plugin's
  backend only, it applies the backend's ``customize_spec`` as vLLM 0.32 does; compressed pages
  are expressed with vLLM's own ``TQFullAttentionSpec`` (a full-attention spec whose page is
  ``block_size x num_kv_heads x slot`` bytes; vLLM's block managers and page sizing already know
  it).

Either way each layer receives the same tensor: ``[num_blocks, Hkv, block_size, C]`` with strides
of the physical ``[num_blocks, block_size, Hkv, C]`` (C = 2 x head size elements of the model dtype
for dense pages, the AURA slot's bytes of uint8 for compressed ones), which ``_paged.py`` reads.

Engine-start warm-up (:func:`install_warmup`, GDN routing): both releases' GPU worker calls the module
global ``kernel_warmup(worker)`` (``vllm.v1.worker.gpu_worker``) in ``compile_or_warm_up_model``, before
CUDA graph capture; vLLM's CPU worker overrides ``compile_or_warm_up_model`` and never calls it, so
there the method itself is wrapped.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import fields, replace

import torch

# vLLM 0.32 moved the cache layout from get_kv_cache_shape to the spec (KVCacheLayout).
HAS_SPEC_LAYOUTS = importlib.util.find_spec("vllm.v1.kv_cache_layout") is not None

# [num_blocks, Hkv, N, C] read in the order [num_blocks, N, Hkv, C]: vLLM 0.32's LBNHC without the layer dim.
STRIDE_ORDER = (0, 2, 1, 3)


def compressed_spec(spec, slot_bytes: int):
    """``spec`` with pages of ``slot_bytes`` uint8 per (token, KV head), holding K and V."""
    if HAS_SPEC_LAYOUTS:
        return replace(spec, dtype=torch.uint8, state_content_bytes=slot_bytes)
    from vllm.v1.kv_cache_interface import TQFullAttentionSpec

    values = {f.name: getattr(spec, f.name) for f in fields(spec) if f.init}
    return TQFullAttentionSpec(**{**values, "dtype": torch.uint8, "tq_slot_size": slot_bytes})


def is_compressed(spec) -> bool:
    """Whether ``customize_spec`` already ran on ``spec`` (it must be idempotent)."""
    if HAS_SPEC_LAYOUTS:
        return spec.state_content_bytes is not None
    return getattr(spec, "tq_slot_size", 0) > 0


def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, slot_bytes: int | None):
    """vLLM 0.24's ``get_kv_cache_shape``: the logical shape read with :data:`STRIDE_ORDER`."""
    return (num_blocks, num_kv_heads, block_size, 2 * head_size if slot_bytes is None else slot_bytes)


def install() -> None:
    """Idempotent. On vLLM without ``customize_spec`` (0.24), apply our backend's ``customize_spec``
    to the KV cache spec of the layers it serves; other layers' specs are untouched."""
    from vllm.v1.attention.backend import AttentionBackend

    if hasattr(AttentionBackend, "customize_spec"):
        return
    from vllm.model_executor.layers.attention.attention import Attention

    original = Attention.get_kv_cache_spec
    if getattr(original, "_torch_aura", False):
        return

    def get_kv_cache_spec(self, vllm_config):
        spec = original(self, vllm_config)
        backend = getattr(self, "attn_backend", None)
        if spec is not None and getattr(backend, "torch_aura_backend", False):
            spec = backend.customize_spec(spec)
        return spec
    get_kv_cache_spec._torch_aura = True  # type: ignore[attr-defined]
    Attention.get_kv_cache_spec = get_kv_cache_spec


def _then(original, warm):
    """``original``, then ``warm`` on its first argument (the worker)."""
    @functools.wraps(original)
    def wrapper(worker, *args, **kwargs):
        out = original(worker, *args, **kwargs)
        warm(worker)
        return out
    wrapper._torch_aura = True  # type: ignore[attr-defined]
    return wrapper


def _warmup_hooks():
    """``(owner, name)`` of each callable :func:`install_warmup` wraps in this vLLM."""
    from vllm.platforms import current_platform
    from vllm.v1.worker import gpu_worker

    # a vLLM without the module global (outside the supported range): after the GPU worker's whole warm-up step
    hooks = [(gpu_worker, "kernel_warmup") if hasattr(gpu_worker, "kernel_warmup")
             else (gpu_worker.Worker, "compile_or_warm_up_model")]
    if current_platform.is_cpu():  # the CPU worker's own step (it never calls kernel_warmup); imported on CPU only
        from vllm.v1.worker.cpu_worker import CPUWorker

        hooks.append((CPUWorker, "compile_or_warm_up_model"))
    return hooks


def install_warmup(warm) -> None:
    """Idempotent: at engine start, after vLLM's own kernel warm-up, call ``warm(worker)`` in each worker."""
    for owner, name in _warmup_hooks():
        current = getattr(owner, name)
        if not getattr(current, "_torch_aura", False):
            setattr(owner, name, _then(current, warm))


def uninstall_warmup() -> None:
    """Undo :func:`install_warmup`."""
    for owner, name in _warmup_hooks():
        current = getattr(owner, name)
        if getattr(current, "_torch_aura", False):
            setattr(owner, name, current.__wrapped__)
