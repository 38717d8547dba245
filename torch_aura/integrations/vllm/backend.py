"""vLLM's ``CUSTOM`` attention backend: torch_aura's kernels over vLLM's paged KV cache.

One backend class, two page formats chosen by ``TORCH_AURA_VLLM_KV_CACHE`` (package docstring):
dense (the model dtype; decode via ``flash_decode_out``, prefill via SDPA over the pages) and AURA
(compressed pages declared through ``customize_spec``, so vLLM fits 3.8-10x more tokens in the same
memory; decode and prefill via ``aura_decode``). The attention itself lives in ``_paged.py``,
which does not import vLLM; this module adapts it to vLLM's backend API: the metadata builder,
the impl (``do_kv_cache_update`` then ``forward``) and the backend class.

Refused with a named error: sliding windows, ALiBi, logit soft-capping, attention sinks,
encoder / cross attention, ``--kv-cache-dtype`` other than ``auto``, K and V of different head dims.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import ClassVar

import torch

from ._version import require_vllm

require_vllm()

from vllm.config import get_current_vllm_config_or_none  # noqa: E402
from vllm.v1.attention.backend import (  # noqa: E402
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills  # noqa: E402
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheLayout  # noqa: E402

from ..._checks.aura import HEAD_DIMS as AURA_HEAD_DIMS  # noqa: E402
from ..._checks.decode import SUPPORTED_HEAD_DIMS as DENSE_HEAD_DIMS  # noqa: E402
from . import kv_cache_scheme, verify_enabled  # noqa: E402
from ._paged import AuraPages, BatchPlan, DensePages, aura_slot_bytes, plan_batch  # noqa: E402

_log = logging.getLogger("vllm.torch_aura")


class AuraMetadataBuilder(AttentionMetadataBuilder[BatchPlan]):
    # Uniform one-token decode passes vLLM's persistent seq_lens / block table straight through.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # Speculative verification (query length 1 + k over a cache) runs as decode rows.
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        self.block_size = kv_cache_spec.block_size

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> BatchPlan:
        cm = common_attn_metadata
        num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens = split_decodes_and_prefills(
            cm, decode_threshold=self.reorder_batch_threshold)
        return plan_batch(seq_lens=cm.seq_lens, block_table=cm.block_table_tensor,
                          query_start_loc=cm.query_start_loc, num_decodes=num_decodes,
                          num_decode_tokens=num_decode_tokens, num_prefills=num_prefills,
                          num_prefill_tokens=num_prefill_tokens, num_actual_tokens=cm.num_actual_tokens,
                          max_query_len=cm.max_query_len, max_seq_len=cm.max_seq_len,
                          block_size=self.block_size)


def _asked(value) -> bool:
    """A feature argument asks for the feature unless it is None, False or 0 (vLLM passes other
    backends' flags, e.g. for iRoPE, as False, and no soft-cap as 0)."""
    return value is not None and value is not False and not (isinstance(value, (int, float)) and value == 0)


class AuraAttentionImpl(AttentionImpl):
    """One layer: checks what vLLM asks for, then hands the pages to ``DensePages`` / ``AuraPages``."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes=None, sliding_window=None, kv_cache_dtype: str = "auto",
                 logits_soft_cap=None, attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, sinks=None, **unsupported) -> None:
        features = {"alibi_slopes": alibi_slopes, "sliding_window": sliding_window,
                    "logits_soft_cap": logits_soft_cap, "sinks": sinks, **unsupported}
        refused = sorted(k for k, v in features.items() if _asked(v))
        if refused:
            raise NotImplementedError(f"torch_aura's vLLM backend does not support {refused} "
                                      "(sliding windows, ALiBi, soft-capping and sinks are not implemented)")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"torch_aura's vLLM backend serves decoder self-attention only, "
                                      f"got attn_type={attn_type!r}")
        if kv_cache_dtype != "auto":
            raise NotImplementedError(f"torch_aura's vLLM backend keeps --kv-cache-dtype auto and takes "
                                      f"its format from TORCH_AURA_VLLM_KV_CACHE; got {kv_cache_dtype!r}")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype, self.attn_type = kv_cache_dtype, attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.scheme = kv_cache_scheme()
        self._logged = False
        if self.scheme is None:
            config = get_current_vllm_config_or_none()
            rows = config.scheduler_config.max_num_batched_tokens if config else 8192
            self.pages = DensePages(num_heads, head_size, self.scale, max_rows=rows)
        else:
            self.pages = None  # AURA: the sign masks need the layer index, known at the first call

    def _paged(self, layer):
        if self.pages is None:
            from vllm.model_executor.models.utils import extract_layer_index

            self.pages = AuraPages(self.num_heads, self.head_size, self.scale, *self.scheme,
                                   layer=extract_layer_index(layer.layer_name), verify=verify_enabled())
        return self.pages

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        self._paged(layer).write(key, value, kv_cache, slot_mapping)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("torch_aura's vLLM backend has no fused output quantization")
        if attn_metadata is None:  # vLLM's profiling run
            return output
        paged = self._paged(layer)
        if not self._logged:  # once per layer: the server log then shows our backend served steps
            self._logged = True
            _log.info("torch_aura: %s served its first batch (%s pages)", layer.layer_name,
                      "dense" if self.scheme is None else "aura%dv%d" % self.scheme)
        return paged.forward(query, kv_cache, attn_metadata, output)


# --------------------------------------------------------------------------------- backend
class AuraAttentionBackend(AttentionBackend):
    """vLLM's ``CUSTOM`` slot; the format (dense or AURA) comes from ``TORCH_AURA_VLLM_KV_CACHE``."""

    forward_includes_kv_cache_update: bool = False  # vLLM calls do_kv_cache_update first
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto"]

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"  # must name an AttentionBackendEnum member: the slot this plugin fills

    @staticmethod
    def get_impl_cls():
        return AuraAttentionImpl

    @staticmethod
    def get_builder_cls():
        return AuraMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [MultipleOf(16)]  # the kernels take any page size; 16 keeps vLLM's pages whole

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(AURA_HEAD_DIMS if kv_cache_scheme() else DENSE_HEAD_DIMS)

    @classmethod
    def supported_kv_cache_layouts(cls):
        # [block, token, head, K|V]: each page's bytes contiguous, K and V rows [block, N, H, D]
        return (KVCacheLayout.LBNHC,)

    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        scheme = kv_cache_scheme()
        if scheme is None or spec.state_content_bytes is not None:
            return spec
        if spec.head_size_v != spec.head_size:
            raise ValueError(f"TORCH_AURA_VLLM_KV_CACHE: AURA needs equal K and V head dims, got "
                             f"{spec.head_size} and {spec.head_size_v}")
        return replace(spec, dtype=torch.uint8,
                       state_content_bytes=aura_slot_bytes(spec.head_size, *scheme))
