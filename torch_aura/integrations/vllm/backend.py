"""vLLM's ``CUSTOM`` attention backend: torch_aura's kernels over vLLM's paged KV cache.

One backend class, two page formats chosen by ``TORCH_AURA_VLLM_KV_CACHE`` (package docstring):
dense (the model dtype; decode via ``flash_decode_out``, prefill via SDPA over the pages) and AURA
(compressed pages declared through ``customize_spec``, so vLLM fits 3.8-10x more tokens in the same
memory; decode and prefill via ``aura_decode``). The attention itself lives in ``_paged.py``,
which does not import vLLM; this module adapts it to vLLM's backend API: the metadata builder,
the impl (``do_kv_cache_update`` then ``forward``) and the backend class.

What it serves and refuses is one list of rules, ``_support.refusals``: vLLM's selector runs it per
layer through :meth:`AuraAttentionBackend.validate_configuration`, the impl for the per-layer
features the selector does not carry (ALiBi, soft-capping), and ``platform.py`` on the whole engine
configuration before any engine process starts.
"""

from __future__ import annotations

import logging
from typing import ClassVar, NamedTuple

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
from vllm.v1.kv_cache_interface import AttentionSpec  # noqa: E402

from . import _compat  # noqa: E402
from ._common import SERVING_LOG_PREFIX  # noqa: E402
from ._env import Settings, settings  # noqa: E402
from ._paged import AuraPages, BatchPlan, DensePages, aura_slot_bytes, plan_batch  # noqa: E402
from ._support import BLOCK_MULTIPLE, DTYPES, head_dims, refusal, refusals  # noqa: E402

_log = logging.getLogger("vllm.torch_aura")


class PageFormat(NamedTuple):
    """What a KV page holds, resolved in one place (:func:`page_format`) for every hook below."""

    settings: Settings
    slot_bytes: int | None  # bytes of one token's K|V slot per KV head in an AURA page; None: dense pages


def page_format(head_size: int) -> PageFormat:
    """The page format of ``head_size`` under the plugin's settings (``TORCH_AURA_VLLM_KV_CACHE``)."""
    s = settings()
    if s.scheme is None:
        return PageFormat(s, None)
    return PageFormat(s, aura_slot_bytes(head_size, key_bits=s.scheme.key_bits, value_bits=s.scheme.value_bits))


class AuraMetadataBuilder(AttentionMetadataBuilder[BatchPlan]):
    # Uniform one-token decode passes vLLM's persistent seq_lens / block table straight through.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # Speculative verification (query length 1 + k over a cache) runs as decode rows.
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        self.block_size = kv_cache_spec.block_size
        _announce(layer_names, kv_cache_spec, vllm_config, page_format(kv_cache_spec.head_size))

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


def _announce(layer_names, spec: AttentionSpec, vllm_config, fmt: PageFormat) -> None:
    """The INFO line that says the plugin serves: one per group of layers (vLLM builds a group's
    metadata builder once, when the engine binds its KV cache, before the first request)."""
    key = tuple(layer_names)
    model_dtype = vllm_config.model_config.dtype if vllm_config is not None else spec.dtype
    dense_bytes = 2 * spec.head_size * torch.empty((), dtype=model_dtype).element_size()
    slot = fmt.slot_bytes
    if slot is None:
        what = f"dense, {dense_bytes} bytes per token and KV head ({str(model_dtype).removeprefix('torch.')})"
    else:
        what = (f"{fmt.settings.kv_cache}, {slot} bytes per token and KV head, {dense_bytes / slot:.2f}x the "
                f"tokens of {str(model_dtype).removeprefix('torch.')}")
    _log.info("%s %d attention layers with the CUSTOM backend (KV cache %s; layers %s)", SERVING_LOG_PREFIX,
              len(key), what, ", ".join(key) if len(key) <= 4 else f"{key[0]} .. {key[-1]}")


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
        self.format = page_format(head_size)  # the same resolution as the spec vLLM sized the pages by
        self.settings = self.format.settings
        reasons = refusals(self.settings, head_size=head_size, kv_cache_dtype=kv_cache_dtype,
                           attn_type=attn_type, alibi=_asked(alibi_slopes), has_sink=_asked(sinks),
                           sliding_window=sliding_window if _asked(sliding_window) else None,
                           logits_soft_cap=logits_soft_cap if _asked(logits_soft_cap) else None,
                           **{k: v for k, v in unsupported.items() if _asked(v)})
        if reasons:
            raise refusal(reasons)
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.kv_cache_dtype, self.attn_type = kv_cache_dtype, attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        if self.settings.scheme is None:
            config = get_current_vllm_config_or_none()
            rows = config.scheduler_config.max_num_batched_tokens if config else 8192
            self.pages = DensePages(num_heads=num_heads, head_dim=head_size, scale=self.scale, max_rows=rows)
        else:
            self.pages = None  # AURA: the sign masks need the layer index, known at the first call

    def _paged(self, layer):
        if self.pages is None:
            from vllm.model_executor.models.utils import extract_layer_index

            bits = self.settings.scheme
            self.pages = AuraPages(num_heads=self.num_heads, head_dim=self.head_size, scale=self.scale,
                                   key_bits=bits.key_bits, value_bits=bits.value_bits,
                                   layer=extract_layer_index(layer.layer_name), verify=self.settings.verify)
        return self.pages

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        self._paged(layer).write(key, value, kv_cache, slot_mapping)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise refusal(["fused output quantization (a quantized o_proj input): not supported by the CUSTOM "
                           "backend; serve an unquantized model, or drop --attention-backend CUSTOM"])
        if attn_metadata is None:  # vLLM's profiling run
            return output
        return self._paged(layer).forward(query, kv_cache, attn_metadata, output)


# --------------------------------------------------------------------------------- backend
class AuraAttentionBackend(AttentionBackend):
    """vLLM's ``CUSTOM`` slot; the format (dense or AURA) comes from ``TORCH_AURA_VLLM_KV_CACHE``."""

    forward_includes_kv_cache_update: bool = False  # vLLM calls do_kv_cache_update first
    torch_aura_backend: ClassVar[bool] = True  # marks the layers _compat.install may customise
    supported_dtypes: ClassVar[list[torch.dtype]] = list(DTYPES)
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
        return [MultipleOf(BLOCK_MULTIPLE)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(head_dims(settings()))

    @classmethod
    def validate_configuration(cls, device_capability=None, **selector) -> list[str]:
        """Our own sentences (value, supported set, alternative) instead of vLLM's generic reasons:
        vLLM shows this list as the reason a selected backend was refused."""
        return refusals(settings(), **selector)

    @classmethod
    def supported_kv_cache_layouts(cls):
        """vLLM >= 0.32: [block, token, head, K|V], each page's bytes contiguous."""
        from vllm.v1.kv_cache_layout import KVCacheLayout

        return (KVCacheLayout.LBNHC,)

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        """vLLM 0.24: the same per-layer view as ``LBNHC`` above (read through the stride order)."""
        return _compat.kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size,
                                      slot_bytes=page_format(head_size).slot_bytes)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension: bool = False):
        """vLLM 0.24; a layers dimension (cross-layer KV connectors) is not offered."""
        if include_num_layers_dimension:
            raise NotImplementedError("torch_aura's CUSTOM backend keeps one KV cache tensor per layer")
        return _compat.STRIDE_ORDER

    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        if spec.head_size_v != spec.head_size:  # the pages hold K and V rows of one head dim
            raise refusal([f"K head size {spec.head_size} and V head size {spec.head_size_v}: the CUSTOM "
                           "backend needs equal K and V head sizes; drop --attention-backend CUSTOM to serve "
                           "it with vLLM's own attention backend"])
        slot = page_format(spec.head_size).slot_bytes
        if slot is None or _compat.is_compressed(spec):
            return spec
        return _compat.compressed_spec(spec, slot_bytes=slot)
