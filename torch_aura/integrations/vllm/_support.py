"""What the CUSTOM backend serves, as one list of rules, and the refusal of everything else.

:func:`refusals` takes the fields of vLLM's ``AttentionSelectorConfig`` (per layer, when vLLM selects
the backend) or the same facts read from the engine configuration (``platform.py``, before any
engine process starts) and returns one full sentence per unsupported feature: the value, what is
supported, and the alternative. Does not import vLLM.
"""

from __future__ import annotations

import logging

import torch

from ..._checks.aura import HEAD_DIMS as AURA_HEAD_DIMS
from ..._checks.decode import SUPPORTED_HEAD_DIMS as DENSE_HEAD_DIMS
from ._env import KV_CACHE_ENV, Settings

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_MULTIPLE = 16  # the kernels take any page size; 16 keeps vLLM's hybrid pages whole
SPECULATIVE_METHODS = ("ngram",)  # draft-free proposers: the verification rows are plain decode rows
OWN_BACKEND = "drop --attention-backend CUSTOM to serve it with vLLM's own attention backend"


def head_dims(s: Settings) -> tuple[int, ...]:
    return AURA_HEAD_DIMS if s.is_aura else DENSE_HEAD_DIMS


def _head_size(s: Settings, head_size: int) -> str | None:
    if head_size in head_dims(s):
        return None
    other = (f"set {KV_CACHE_ENV}=dense (head sizes {list(DENSE_HEAD_DIMS)}), or "
             if s.is_aura and head_size in DENSE_HEAD_DIMS else "")
    return (f"head size {head_size}: the {s.kv_cache} KV cache supports head sizes {list(head_dims(s))}; "
            f"{other}{OWN_BACKEND}")


def refusals(s: Settings, *, head_size: int, dtype: torch.dtype | None = None, kv_cache_dtype: str | None = None,
             block_size: int | None = None, use_mla: bool = False, has_sink: bool = False,
             use_sparse: bool = False, use_mm_prefix: bool = False, use_per_head_quant_scales: bool = False,
             attn_type: str = "decoder", has_sliding_window: bool = False, use_non_causal: bool = False,
             use_batch_invariant: bool = False, use_kv_connector: bool = False, use_pcp: bool = False,
             use_adaptive_verification: bool = False, use_dcp: bool = False, use_rswa: bool = False,
             logits_soft_cap: float | None = None, alibi: bool = False, sliding_window: int | None = None,
             speculative_method: str | None = None, **unknown) -> list[str]:
    """One sentence per feature the CUSTOM backend cannot serve (empty: it can). ``unknown``: a
    selector field of a newer vLLM, refused when set because nothing here was tested with it."""
    out = [m for m in [_head_size(s, head_size)] if m]
    if dtype is not None and dtype not in DTYPES:
        out.append(f"dtype {dtype}: supported float16, bfloat16, float32; pass --dtype float32 or bfloat16, "
                   f"or {OWN_BACKEND}")
    if kv_cache_dtype not in (None, "auto"):
        out.append(f"--kv-cache-dtype {kv_cache_dtype}: the CUSTOM backend keeps --kv-cache-dtype auto and takes "
                   f"its format from {KV_CACHE_ENV} ('dense', or an AURA scheme such as 'aura8' or "
                   f"'aura4v2'); drop --kv-cache-dtype, or {OWN_BACKEND}")
    if block_size is not None and block_size % BLOCK_MULTIPLE:
        out.append(f"--block-size {block_size}: supported multiples of {BLOCK_MULTIPLE}; pass --block-size "
                   f"{max(BLOCK_MULTIPLE, block_size // BLOCK_MULTIPLE * BLOCK_MULTIPLE)}")
    named = {"use_mla": ("multi-head latent attention (MLA)", use_mla),
             "has_sink": ("attention sinks", has_sink),
             "use_sparse": ("sparse attention", use_sparse),
             "use_mm_prefix": ("bidirectional attention over multimodal prefix tokens", use_mm_prefix),
             "use_per_head_quant_scales": ("per-head KV quantization scales", use_per_head_quant_scales),
             "use_non_causal": ("non-causal attention", use_non_causal),
             "use_rswa": ("R-SWA attention", use_rswa),
             "use_batch_invariant": ("batch-invariant mode (VLLM_BATCH_INVARIANT=1)", use_batch_invariant),
             "use_kv_connector": ("a KV transfer connector (--kv-transfer-config)", use_kv_connector),
             "use_pcp": ("prefill context parallelism", use_pcp),
             "use_dcp": ("decode context parallelism", use_dcp),
             "use_adaptive_verification": ("adaptive speculative verification", use_adaptive_verification),
             "logits_soft_cap": (f"attention logit soft-capping ({logits_soft_cap})", bool(logits_soft_cap)),
             "alibi": ("ALiBi position biases", alibi)}
    for name, (what, asked) in named.items():
        if asked:
            out.append(f"{what}: not supported by the CUSTOM backend (it serves causal decoder self-attention, "
                       f"softmax over the full context); {OWN_BACKEND}")
    if has_sliding_window or sliding_window:
        window = f" (window {sliding_window})" if sliding_window else ""
        out.append(f"sliding-window attention{window}: not supported by the CUSTOM backend (it attends the whole "
                   "context); pass --disable-sliding-window (vLLM then caps --max-model-len at the window, "
                   f"where full attention equals the window's), or {OWN_BACKEND}")
    if getattr(attn_type, "value", attn_type) != "decoder":  # vLLM's AttentionType is a str enum
        out.append(f"attention type {attn_type!r}: the CUSTOM backend serves decoder self-attention only; "
                   f"{OWN_BACKEND}")
    if speculative_method is not None and speculative_method not in SPECULATIVE_METHODS:
        out.append(f"speculative decoding method {speculative_method!r}: the CUSTOM backend is tested with "
                   f"{list(SPECULATIVE_METHODS)}; use --speculative-config '{{\"method\": \"ngram\", "
                   f"\"num_speculative_tokens\": 3, \"prompt_lookup_max\": 3}}', or {OWN_BACKEND}")
    for name, value in sorted(unknown.items()):
        if value:
            out.append(f"{name}={value!r}: a vLLM feature this plugin was not tested with; {OWN_BACKEND}")
    return out


def refusal(reasons: list[str]) -> ValueError:
    """The error for ``reasons``, also logged at ERROR through vLLM's logger: where vLLM runs the
    check in an engine process, the user's own traceback only says that the engine failed."""
    text = ("torch_aura's vLLM backend (--attention-backend CUSTOM) cannot serve this configuration:\n"
            + "\n".join(f"  - {r}" for r in reasons))
    logging.getLogger("vllm.torch_aura").error("%s", text)
    return ValueError(text)
