"""What the transformers integration serves, read once from a model or its config, and the refusal
of everything else.

:func:`enable_refusals` (for ``enable()``) and :func:`cache_layout` (for ``AuraKVCache``) return
``{feature: sentence}``, one sentence per unsupported feature: the feature and its value, what is
supported, and the alternative. Their callers raise the sentences as one ``ValueError`` before
they change anything; the feature names label the README's model table. Support is a list: an
argument of a model's attention call that is not known here is refused, not ignored.

What "served" means. The ``"aura"`` attention is transformers' own ``sdpa_attention_forward``
except for one query token per row, which :func:`torch_aura.flash_decode` attends over the same
keys (those the boolean mask lets each row see, when there is one). So a model is served exactly
when its own path is SDPA's: it routes attention through ``ALL_ATTENTION_FUNCTIONS``, declares
SDPA support, passes no argument SDPA would ignore (sinks, sparse indices) or refuse (soft-capping),
keeps one head dim for K and V (no MLA latents), and is a decoder without cross attention.
``AuraKVCache`` also needs to know which layers slide: it reads that from transformers' own
``get_layer_types_and_kwargs`` (``layer_types``, ``sliding_window``, ``use_sliding_window`` /
``max_window_layers``, ``attention_chunk_size``, per-layer configs).
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import textwrap
from typing import NamedTuple

import torch
from transformers.cache_utils import get_layer_types_and_kwargs
from transformers.configuration_utils import get_head_shapes

from ..._checks.aura import HEAD_DIMS as AURA_HEAD_DIMS
from ..._checks.decode import SUPPORTED_HEAD_DIMS as DECODE_HEAD_DIMS

# the alternatives each refusal names
KEEP_OWN = "keep the model's own attention implementation (do not call enable(), or call disable(model))"
USE_DYNAMIC = "use transformers' DynamicCache instead (with enable(model) where enable() accepts the model)"

# Arguments of a model's attention call that "aura" serves exactly as SDPA does: the mask and
# sizes, and keywords SDPA reads or drops without changing the result (a window is in the mask).
SERVED_ARGUMENTS = frozenset({
    "dropout", "scaling", "attention_mask", "is_causal", "sliding_window", "position_ids",
    "position_bias", "output_attentions", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"})
# Arguments that change attention in a way SDPA does not compute -> the feature a refusal names.
REFUSED_ARGUMENTS = {
    "softcap": "soft-capping",
    "s_aux": "attention sinks",
    "sinks": "attention sinks",
    "indices": "sparse attention",
    "block_indices": "block-sparse attention",
}
# Layer types of get_layer_types_and_kwargs that AuraKVCache holds; anything else is refused.
FULL, DUMMY = "full_attention", "dummy"
SLIDING, LINEAR = ("sliding_attention", "chunked_attention"), ("linear_attention", "conv")
CACHE_LAYER_TYPES = (FULL, *SLIDING, *LINEAR, DUMMY)

_INTERFACE = "ALL_ATTENTION_FUNCTIONS"
_CROSS_NAME = re.compile(r"cross|encoder_attn")
_UNKNOWN = object()  # an argument computed at call time: counts as set


class LayerSpec(NamedTuple):
    """How ``AuraKVCache`` holds one layer: ``kind`` in ``"aura"`` (compressed), ``"window"``
    (transformers' dense ``DynamicSlidingWindowLayer``), ``"linear"`` (``LinearAttentionLayer``) or
    ``"dummy"`` (no cache: an MLP or MoE layer); ``layer_type`` and ``kwargs`` are transformers' own
    (``kwargs`` builds the layer transformers' ``DynamicCache`` would use)."""

    kind: str
    layer_type: str
    kwargs: dict

    @property
    def window(self) -> int | None:
        """The sliding window (or attention chunk) in tokens, None for other layers."""
        return self.kwargs.get("sliding_window")


# ------------------------------------------------------------------------------ config facts
def text_config(config):
    """The decoder's text config (a composite model's language part; the config itself otherwise)."""
    return config.get_text_config(decoder=True)


def head_dims(text) -> list[int]:
    """The attention head dims of every layer, from transformers' own per-layer reading."""
    if not getattr(text, "num_attention_heads", None):
        return []
    dims = get_head_shapes(text)[1]
    return sorted(set(dims if isinstance(dims, list) else [dims]))


def _config_refusals(config) -> dict[str, str]:
    """What neither enable() nor AuraKVCache serves, read from the config alone."""
    text, found = text_config(config), {}
    cross = [f"{name}={value!r}" for name in ("is_encoder_decoder", "add_cross_attention", "cross_attention_layers")
             if (value := getattr(config, name, None))]
    if cross:
        found["cross attention"] = (f"encoder-decoder / cross attention ({', '.join(cross)}): torch_aura serves "
                                    "decoder self-attention only")
    if (cap := getattr(text, "attn_logit_softcapping", None)) is not None:
        found["soft-capping"] = (f"attention soft-capping (attn_logit_softcapping={cap}): SDPA, which 'aura' and "
                                 "AuraKVCache build on, attends without it")
    # DeepSeek-V2/V3 style: the config's head_dim is then the rope dim, not the attention's
    qk = getattr(text, "qk_head_dim", None) or (
        (getattr(text, "qk_nope_head_dim", None) or 0) + (getattr(text, "qk_rope_head_dim", None) or 0)) or None
    v = getattr(text, "v_head_dim", None)
    if (rank := getattr(text, "kv_lora_rank", None)) is not None:
        found["MLA"] = (f"multi-head latent attention (kv_lora_rank={rank}, K head dim {qk}, V head dim {v}): "
                        "torch_aura attends per-head K and V of one shared head dim")
    elif qk is not None and v is not None and qk != v:
        found["K/V head dims differ"] = (f"K and V head dims that differ (K {qk}, V {v}): torch_aura attends K and "
                                         "V of one shared head dim")
    return found


def _head_dims_refusal(text, found: dict, supported: tuple[int, ...], who: str) -> dict[str, str]:
    if "MLA" in found or "K/V head dims differ" in found:
        return {}  # the config's head_dim is not the attention's: already refused by name
    bad = [d for d in head_dims(text) if d not in supported]
    if not bad:
        return {}
    return {f"head dim {bad}": f"attention head_dim {bad[0] if len(bad) == 1 else bad}: {who} supports "
                               f"{list(supported)}"}


# ---------------------------------------------------------------------- attention call scan
def _chain(node: ast.expr) -> list[str] | None:
    """``self.a.b`` -> ``["a", "b"]``; None for any other expression."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return names[::-1] if isinstance(node, ast.Name) and node.id == "self" else None


@functools.cache
def _call_arguments(forward) -> dict[str, ast.expr] | None:
    """Keyword arguments of the attention-function call in ``forward``'s source, or None when
    ``forward`` does not call ``ALL_ATTENTION_FUNCTIONS``.

    Relies on transformers' convention (every 5.x attention module): the function is bound from
    ``ALL_ATTENTION_FUNCTIONS`` (``get_interface(...)`` or ``[...]``) to a local name, then called.
    """
    try:
        source = textwrap.dedent(inspect.getsource(forward))
    except (OSError, TypeError):
        return None
    if _INTERFACE not in source:
        return None
    tree = ast.parse(source)
    bound = set()
    for node in ast.walk(tree):
        bound_value = isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
        if bound_value and _INTERFACE in ast.unparse(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {kw.arg: kw.value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in bound
            for kw in node.keywords if kw.arg}


def _value(module: torch.nn.Module, expr: ast.expr):
    """The value of a call argument read off ``module`` (``self.x.y``, constants), else _UNKNOWN."""
    if isinstance(expr, ast.Constant):
        return expr.value
    names = _chain(expr)
    if not names:
        return _UNKNOWN
    value = module
    for name in names:
        value = getattr(value, name, _UNKNOWN)
        if value is _UNKNOWN:
            break
    return value


def attention_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, dict]]:
    """``(name, module, {argument: value})`` for each module of ``model`` whose forward calls
    ``ALL_ATTENTION_FUNCTIONS``; a value is ``_UNKNOWN`` when computed at call time."""
    found = []
    for name, module in model.named_modules():
        arguments = _call_arguments(type(module).forward)
        if arguments is not None:
            found.append((name, module, {k: _value(module, v) for k, v in arguments.items()}))
    return found


def _shown(value) -> str:
    if value is _UNKNOWN:
        return "computed per call"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return repr(value)


def _argument_refusals(model) -> dict[str, str]:
    """The attention-call arguments and the cross attention of ``model`` that "aura" cannot serve."""
    found = {}
    for name, module, arguments in attention_modules(model):
        cls = type(module).__name__
        for arg, value in arguments.items():
            if arg in SERVED_ARGUMENTS or value is None:
                continue
            if arg in REFUSED_ARGUMENTS:
                found.setdefault(REFUSED_ARGUMENTS[arg], f"{REFUSED_ARGUMENTS[arg]} ({cls} passes {arg}="
                                 f"{_shown(value)}): SDPA, which 'aura' builds on, attends without it")
            else:
                found.setdefault(f"argument {arg}", f"attention argument {arg}={_shown(value)} ({cls}): not among the "
                                 f"arguments torch_aura serves ({sorted(SERVED_ARGUMENTS)})")
        if _CROSS_NAME.search(name.rsplit(".", 1)[-1]):
            found.setdefault("cross attention", f"cross attention ({cls} at {name}): torch_aura serves decoder "
                             "self-attention only")
    return found


# ---------------------------------------------------------------------------- enable()
_NOTHING_TO_SERVE = ("no AttentionInterface", "no attention layer")


def _model_refusals(model: torch.nn.Module) -> dict[str, str]:
    """What the "aura" attention cannot compute exactly in ``model`` (sentences without alternative)."""
    name = type(model).__name__
    if not type(model)._can_set_attn_implementation():
        return {"no AttentionInterface": f"{name} does not route attention through transformers' "
                "AttentionInterface, so 'aura' cannot serve it; supported: models whose attention calls "
                "ALL_ATTENTION_FUNCTIONS (Llama, Qwen2/3, Mistral, Gemma3, Qwen3-Next, ...)"}
    if not attention_modules(model):
        return {"no attention layer": f"{name} has no attention layer that calls ALL_ATTENTION_FUNCTIONS: 'aura' "
                "would serve nothing"}
    found = {**_argument_refusals(model), **_config_refusals(model.config)}  # the config's wording wins
    if not getattr(model, "_supports_sdpa", False):
        found["no SDPA"] = (f"{name} does not support SDPA (_supports_sdpa is False; it runs "
                            f"{model.config._attn_implementation!r}): 'aura' serves prefill and "
                            "what flash_decode cannot through transformers' SDPA function")
    return found


def enable_refusals(model: torch.nn.Module, has_gdn: bool) -> dict[str, str]:
    """Why ``enable(model, attention=True)`` cannot serve ``model``: ``{feature: sentence}`` (empty: it can).

    Args:
        model: a transformers ``PreTrainedModel``.
        has_gdn: the model has gated-delta-rule layers enable() patches (then a model without
            attention layers is still worth enabling with ``attention=False``).
    """
    found = _model_refusals(model)
    if set(found) & set(_NOTHING_TO_SERVE):
        alternative = "pass attention=False to enable the GDN kernels alone" if has_gdn else KEEP_OWN
    else:
        alternative = KEEP_OWN
        found.update(_head_dims_refusal(text_config(model.config), found, DECODE_HEAD_DIMS, "flash_decode"))
    return {feature: f"{sentence}; {alternative}." for feature, sentence in found.items()}


# ------------------------------------------------------------------------------ AuraKVCache
def cache_layout(config, max_cache_len: int | None, model: torch.nn.Module | None = None
                 ) -> tuple[list[LayerSpec], dict[str, str]]:
    """How ``AuraKVCache`` holds each layer of ``config``, and why it cannot: ``{feature: sentence}``;
    given ``model`` (whose config this is), also what its attention cannot serve (as ``enable()``).

    Full-attention layers are compressed. A sliding-window or chunked layer is compressed only when
    no row can outgrow its window (``max_cache_len <= window``, so it attends like a full layer);
    otherwise it keeps transformers' dense ``DynamicSlidingWindowLayer``, which holds only the
    window, exactly as ``DynamicCache`` does. A layout with no layer to compress is refused: the
    cache would be a ``DynamicCache`` under another name.
    """
    text = text_config(config)
    found = {**(_model_refusals(model) if model is not None else {}), **_config_refusals(config)}
    try:
        types, kwargs = get_layer_types_and_kwargs(text)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        found["layer layout"] = f"transformers cannot read this config's layer layout ({type(e).__name__}: {e})"
        types, kwargs = [], []
    if getattr(text, "num_kv_shared_layers", None) or "reuse" in (getattr(text, "kv_sharing_modes", None) or ()):
        found["KV sharing"] = ("KV sharing across layers (num_kv_shared_layers / kv_sharing_modes): a consumer "
                               "layer reads its producer's dense K/V, which AuraKVCache does not keep")
    if bad := sorted({t for t in types if t not in CACHE_LAYER_TYPES}):
        found[f"layer types {bad}"] = f"layer types {bad}: AuraKVCache holds {list(CACHE_LAYER_TYPES)}"
    specs = []
    for layer_type, kw in zip(types, kwargs):
        window = kw.get("sliding_window")
        if layer_type == FULL or (layer_type in SLIDING and max_cache_len is not None and max_cache_len <= window):
            kind = "aura"
        else:
            kind = "window" if layer_type in SLIDING else "linear" if layer_type in LINEAR else "dummy"
        specs.append(LayerSpec(kind, layer_type, kw))
    found.update(_head_dims_refusal(text, found, AURA_HEAD_DIMS, "AURA (its Hadamard rotation needs a power of two)"))
    if not found and not any(s.kind == "aura" for s in specs):
        return specs, dict([_nothing_to_compress(specs)])
    return specs, {feature: f"{sentence}; {USE_DYNAMIC}." for feature, sentence in found.items()}


def _nothing_to_compress(specs: list[LayerSpec]) -> tuple[str, str]:
    sliding = [i for i, s in enumerate(specs) if s.kind == "window"]
    if not sliding:
        return "no attention layer", (f"no attention layer to compress (layer types "
                                      f"{sorted({s.layer_type for s in specs})}); {USE_DYNAMIC}.")
    windows = sorted({specs[i].window for i in sliding})
    return "every layer slides", (
        f"every attention layer slides (layers {sliding}, window {windows[0] if len(windows) == 1 else windows}) "
        "and max_cache_len is unset or longer, so rows could leave the window and no layer would be compressed; "
        f"pass max_cache_len <= {windows[0]} (no row then leaves the window: every layer is compressed), or "
        f"{USE_DYNAMIC}: it keeps the window exactly.")
