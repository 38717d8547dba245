"""Adapters that put torch_aura's ops inside the tools users already run.

Each adapter is a subpackage with an optional dependency, imported only when asked for:
``import torch_aura`` never imports transformers or vLLM.

- :mod:`torch_aura.integrations.transformers`: Hugging Face transformers (GDN kernels, the
  ``"aura"`` attention implementation, :class:`~torch_aura.integrations.transformers.AuraKVCache`).
- :mod:`torch_aura.integrations.vllm`: a vLLM attention-backend plugin (``--attention-backend
  CUSTOM``), dense or AURA-compressed paged KV cache.
"""
