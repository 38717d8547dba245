"""Route transformers' gated delta rule kernels, and the causal conv in front of them, to
:func:`torch_aura.gdn_chunk`, :func:`torch_aura.gdn_recurrent`, :func:`torch_aura.causal_conv1d`
and :func:`torch_aura.causal_conv1d_update`.

Every gated-delta-rule model of transformers 5.x (Qwen3-Next, Qwen3.5, Qwen3.5-MoE, OLMo-Hybrid,
...) defines module-level functions decorated with ``use_kernel_func_from_hub_with_fallback(
"chunk_gated_delta_rule" | "fused_recurrent_gated_delta_rule", "fla")`` and
``("causal_conv1d_fn" | "causal_conv1d_update", "causal_conv1d")``, and its linear-attention layer
looks the module globals up on every forward. :func:`patch` replaces them with
:func:`chunk_gated_delta_rule` (prefill, ``T > 1``), :func:`recurrent_gated_delta_rule` (decode),
:func:`causal_conv1d_fn` and :func:`causal_conv1d_update`; :func:`unpatch` puts the originals
back. It also gives the layers' gated RMSNorm (``*RMSNormGated``) a one-launch forward on eager
CUDA calls, where its forward is the one all these families share. The modules are found by
:func:`discover`, which reads the source text of ``transformers/models/*/modeling_*.py`` (no model
list to keep up to date, nothing imported). The conv is routed only in gated-delta-rule modules:
Mamba-style models call theirs with other arguments.

Two things differ from a plain call of the ops:

* Strided views. The models run the conv channels-first (``[B, C, T]``, a transposed view of the
  token-major ``q | k | v`` projection) and hand q, k and v to the GDN kernels as views of its
  transposed output. Our conv reads and writes token-major, so those views arrive with a unit last
  stride and the GDN ops take them as they are; transformers' own conv output gave strided views,
  which the adapter still copies (one copy each) when it meets them.
* In-place state. :func:`recurrent_gated_delta_rule` passes the cache's own state tensor
  (``initial_state``) to :func:`torch_aura.gdn_recurrent` as the pool and returns that same tensor,
  so a decode step copies no state; transformers' following ``cache.update_recurrent_state(s)``
  copies the tensor onto itself, a no-op. The chunk path returns a fresh fp32 final state, which the
  cache copies into its buffer (and allocates as fp32 on first use).

Example:
    >>> from torch_aura.integrations.transformers import gdn
    >>> names = gdn.patch(["transformers.models.qwen3_next.modeling_qwen3_next"])
    >>> import transformers.models.qwen3_next.modeling_qwen3_next as m
    >>> m.torch_chunk_gated_delta_rule is gdn.chunk_gated_delta_rule
    True
    >>> gdn.unpatch()
    ['transformers.models.qwen3_next.modeling_qwen3_next']
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import textwrap
from pathlib import Path
from typing import Iterable

import torch

from ..._checks.common import FLOATS as _STATE_DTYPES
from ..._checks.gdn import ACTIVATIONS as CONV_ACTIVATIONS
from ..._checks.gdn import MAX_HEAD_DIM
from ...ops.gdn import causal_conv1d, gdn_chunk
from ._version import require_transformers

# The decode step's ops, not their public wrappers: every backend's kernel checks its inputs, and the wrapper
# would check them a second time per layer and step (attention.py calls flash_decode so too)
_recurrent_op = torch.ops.aura.gdn_recurrent.default
_conv_update_op = torch.ops.aura.causal_conv1d_update.default

__all__ = [
    "chunk_gated_delta_rule",
    "recurrent_gated_delta_rule",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "discover",
    "modules_of",
    "patch",
    "unpatch",
    "refusals",
    "patched",
]

# the decorator names transformers uses for the kernels -> our kind
_KINDS = {"chunk_gated_delta_rule": "chunk", "fused_recurrent_gated_delta_rule": "recurrent",
          "causal_conv1d_fn": "conv", "causal_conv1d_update": "conv_update"}

# the decorator (any quoting, any further arguments), then possibly more decorators, then the def
_DECORATED_DEF = re.compile(
    r"@use_kernel_func_from_hub_with_fallback\(\s*[\"']"
    r"(?P<kernel>chunk_gated_delta_rule|fused_recurrent_gated_delta_rule|causal_conv1d_fn|causal_conv1d_update)"
    r"[\"'][^)]*\)\s*\n"
    r"(?:[ \t]*@[^\n]*\n)*"
    r"[ \t]*def[ \t]+(?P<name>\w+)[ \t]*\(")

# module name -> {global name: original object}, for unpatch()
_ORIGINALS: dict[str, dict[str, object]] = {}


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    # the ops need only a unit last stride; anything else gets one copy
    return t.contiguous() if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1 else t


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                           output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                           **kwargs):
    """transformers' ``chunk_gated_delta_rule`` on :func:`torch_aura.gdn_chunk` (prefill).

    Args:
        q: ``[B, T, H, K]`` fp16, bf16 or fp32; any strides (copied when the last is not 1).
        k: ``[B, T, H, K]``, dtype of q. Key heads are not expanded: value head hv reads key head
            ``hv // (HV // H)``.
        v: ``[B, T, HV, V]``, dtype of q, ``HV % H == 0``; ``1 <= K, V <= 256``.
        g: ``[B, T, HV]`` float log decay (``<= 0``).
        beta: ``[B, T, HV]`` float write strength (OLMo-Hybrid uses ``[0, 2]``).
        scale: output scale; None (what transformers passes) means ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` float, or None for zeros.
        output_final_state: return the final state (else None).
        use_qk_l2norm_in_kernel: L2-normalise q and k over K first.
        cu_seqlens: ``[N+1]`` int32/int64 offsets of packed sequences (``B == 1``), or None
            (``N = B``).
        **kwargs: ignored (``chunk_size``, ``position_ids`` and the other keywords models forward).

    Returns:
        ``(o, final_state)``: o ``[B, T, HV, V]`` in q's dtype; final_state ``[N, HV, K, V]`` fp32,
        or None unless ``output_final_state``.

    Raises:
        ValueError: from :func:`torch_aura.gdn_chunk`, naming the argument (e.g. K or V outside
            1..256).
    """
    if initial_state is not None and initial_state.dtype not in _STATE_DTYPES:
        initial_state = initial_state.float()
    o, final_state = gdn_chunk(
        _unit_last(q), _unit_last(k), _unit_last(v), _unit_last(g), _unit_last(beta), scale=scale,
        initial_state=None if initial_state is None else _unit_last(initial_state),
        cu_seqlens=cu_seqlens, use_qk_l2norm=bool(use_qk_l2norm_in_kernel))
    return o, (final_state if output_final_state else None)


def recurrent_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None,
                               output_final_state=False, use_qk_l2norm_in_kernel=False,
                               cu_seqlens=None, **kwargs):
    """transformers' ``fused_recurrent_gated_delta_rule`` on :func:`torch_aura.gdn_recurrent`.

    With ``output_final_state`` (the cached decode of every model) the state is updated in place:
    ``initial_state`` itself is the op's pool and is returned. Without it, the caller's tensor is
    left untouched (the op runs on a copy). A pool the op does not take (not fp16/bf16/fp32, or a
    non-unit last stride) is converted to an fp32 copy, which is returned instead.

    Args:
        q: ``[B, T, H, K]`` fp16, bf16 or fp32; any strides (copied when the last is not 1).
        k: ``[B, T, H, K]``, dtype of q; value head hv reads key head ``hv // (HV // H)``.
        v: ``[B, T, HV, V]``, dtype of q, ``HV % H == 0``; ``1 <= K, V <= 256``.
        g: ``[B, T, HV]`` float log decay.
        beta: ``[B, T, HV]`` float.
        scale: output scale; None (what transformers passes) means ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` fp32 (or fp16/bf16), or None for zeros (a new fp32 state).
        output_final_state: return the final state (else None).
        use_qk_l2norm_in_kernel: L2-normalise q and k over K first.
        cu_seqlens: ``[N+1]`` int32/int64 offsets of packed sequences (``B == 1``), or None
            (``N = B``).
        **kwargs: ignored (``position_ids`` and the other keywords models forward).

    Returns:
        ``(o, final_state)``: o ``[B, T, HV, V]`` in q's dtype; final_state ``[N, HV, K, V]`` (the
        updated ``initial_state`` when it could be used in place), or None unless
        ``output_final_state``.

    Raises:
        ValueError: from :func:`torch_aura.gdn_recurrent`, naming the argument.
    """
    if initial_state is None:
        B, _, _, K = k.shape
        HV, V = v.shape[2], v.shape[3]
        N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
        state = torch.zeros(N, HV, K, V, dtype=torch.float32, device=v.device)
    elif initial_state.dtype not in _STATE_DTYPES:
        state = initial_state.to(torch.float32, memory_format=torch.contiguous_format)
    elif not output_final_state:
        state = initial_state.clone()
    else:
        state = _unit_last(initial_state)
    o = _recurrent_op(_unit_last(q), _unit_last(k), _unit_last(v), _unit_last(g), _unit_last(beta), state, None,
                      cu_seqlens, scale, bool(use_qk_l2norm_in_kernel), False)
    return o, (state if output_final_state else None)


def _token_major(hidden_states: torch.Tensor) -> torch.Tensor:
    """transformers' channels-first ``[B, C, T]`` as the ops' ``[B, T, C]``: a view when it is the
    transpose of a token-major tensor (the models' case), else one copy."""
    x = hidden_states.transpose(1, 2)
    return x if x.stride(-1) == 1 else x.contiguous()


def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
    """transformers' ``causal_conv1d_fn`` (prefill) on :func:`torch_aura.causal_conv1d`.

    Args:
        hidden_states: ``[B, C, T]`` fp16, bf16 or fp32, channels-first as the models call it.
        weight: ``[C, W]`` taps (the model's ``conv1d.weight.squeeze(1)``).
        bias: ``[C]`` or None.
        activation: None or ``"silu"`` / ``"swish"`` (the models pass ``config.hidden_act``).
        **kwargs: the layer's forward keywords; ``cu_seq_lens_q`` (packed sequences, ``B == 1``)
            keeps each sequence's conv to itself (transformers' torch fallback ignores it).

    Returns:
        ``[B, C, T]`` in hidden_states' dtype: the transpose of a token-major tensor, so the model's
        ``transpose(1, 2)`` and split give unit-stride q, k and v.

    Raises:
        ValueError: from :func:`torch_aura.causal_conv1d`, naming the argument (e.g. an activation
            other than SiLU).
    """
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    y = causal_conv1d(_token_major(hidden_states), weight, bias, None, cu_seqlens, activation)
    return y.transpose(1, 2)


def causal_conv1d_update(hidden_states, conv_state, weight, bias=None, activation=None):
    """transformers' ``causal_conv1d_update`` (decode) on :func:`torch_aura.causal_conv1d_update`:
    ``hidden_states [B, C, L]`` continues each row's ``conv_state [B, C, S]``, updated in place;
    returns ``[B, C, L]`` (a transposed view of token-major output) in hidden_states' dtype."""
    y = _conv_update_op(_token_major(hidden_states), conv_state, weight, bias, activation, None)
    return y.transpose(1, 2)


_OURS = {"chunk": chunk_gated_delta_rule, "recurrent": recurrent_gated_delta_rule, "conv": causal_conv1d_fn,
         "conv_update": causal_conv1d_update}


# ---------------------------------------------------------------------- the gated RMSNorm after the rule
# What every GDN family's ``*RMSNormGated.forward`` reads in transformers 5.x (comments and layout aside):
# the one-launch kernel serves a class only where its forward is exactly this
_GATED_NORM_FORWARD = """
def forward(self, hidden_states: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    hidden_states = self.weight * hidden_states.to(input_dtype)
    hidden_states = hidden_states * ACT2FN[self.activation](gate.to(torch.float32))
    return hidden_states.to(input_dtype)
"""


def _code_words(source: str) -> tuple[str, ...]:
    """``source`` without comments, as whitespace-separated words (layout-blind comparison)."""
    return tuple(re.sub(r"#[^\n]*", "", source).split())


_GATED_NORM_WORDS = _code_words(_GATED_NORM_FORWARD)


def gated_norm_classes(module) -> list[str]:
    """The classes ``module`` defines whose forward is the gated RMSNorm :func:`patch` serves
    (``*RMSNormGated`` with :data:`_GATED_NORM_FORWARD`'s code), sorted; a class whose forward reads
    otherwise keeps it."""
    found = []
    for name, obj in vars(module).items():
        if not (isinstance(obj, type) and name.endswith("RMSNormGated") and obj.__module__ == module.__name__):
            continue
        try:
            source = inspect.getsource(inspect.unwrap(obj.forward))
        except (OSError, TypeError):
            continue
        if _code_words(textwrap.dedent(source)) == _GATED_NORM_WORDS:
            found.append(name)
    return sorted(found)


def _fused_norm(norm, x: torch.Tensor, gate: torch.Tensor) -> bool:
    """Where the norm takes the one-launch kernel: eager inference on CUDA tensors of one shape with unit last
    strides and a SiLU gate. Compiled graphs keep transformers' forward (inductor fuses it), and so does
    anything autograd must see (the kernel has no backward)."""
    if not (x.is_cuda and gate.is_cuda) or torch.compiler.is_compiling():
        return False
    from ...triton_kernels.gdn.gated_norm import MAX_DIM

    w = norm.weight
    return (x.shape == gate.shape and x.dim() >= 1 and 0 < x.shape[-1] <= MAX_DIM and x.stride(-1) == 1
            and gate.stride(-1) == 1 and getattr(norm, "activation", None) == "silu"
            and all(t.dtype in _STATE_DTYPES for t in (x, gate, w))
            and w.is_cuda and w.shape == x.shape[-1:] and w.stride(0) == 1
            and not (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad or gate.requires_grad)))


def _gated_norm(original):
    """``original`` (a ``*RMSNormGated.forward``) that runs :func:`gated_rms_norm` where
    :func:`_fused_norm` allows, one launch instead of ten elementwise kernels, and ``original`` elsewhere."""
    @functools.wraps(original)
    def forward(self, hidden_states, gate):
        if _fused_norm(self, hidden_states, gate):
            from ...triton_kernels.gdn.gated_norm import gated_rms_norm

            return gated_rms_norm(hidden_states, gate, self.weight, self.variance_epsilon)
        return original(self, hidden_states, gate)

    forward._torch_aura = True
    return forward


@functools.cache
def _discover(models_dir: str) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    found = []
    for path in sorted(Path(models_dir).glob("*/modeling_*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if "gated_delta_rule" not in text:
            continue
        kinds = {_KINDS[m["kernel"]]: m["name"] for m in _DECORATED_DEF.finditer(text)}
        if "chunk" in kinds:  # the conv only where it feeds a gated delta rule
            found.append((f"transformers.models.{path.parent.name}.{path.stem}",
                          tuple(sorted(kinds.items()))))
    return tuple(found)


def discover() -> dict[str, dict[str, str]]:
    """Find the transformers modules that define gated delta rule kernels.

    Reads the source text of ``transformers/models/*/modeling_*.py`` (nothing is imported) for the
    ``use_kernel_func_from_hub_with_fallback("chunk_gated_delta_rule" |
    "fused_recurrent_gated_delta_rule", ...)`` decorator and the function it decorates. The scan
    runs once per process.

    Returns:
        ``{module name: {kind: global name}}``, kind ``"chunk"``, ``"recurrent"``, ``"conv"`` or
        ``"conv_update"``, e.g.
        ``{"transformers.models.qwen3_next.modeling_qwen3_next": {"chunk":
        "torch_chunk_gated_delta_rule", "recurrent": "torch_recurrent_gated_delta_rule"}, ...}``.

    Raises:
        ImportError: transformers is missing or outside the supported versions.
    """
    transformers = require_transformers()
    models_dir = str(Path(transformers.__file__).resolve().parent / "models")
    return {module: dict(kinds) for module, kinds in _discover(models_dir)}


def modules_of(model: torch.nn.Module) -> set[str]:
    """The discovered gated-delta-rule modules whose classes ``model`` uses.

    Args:
        model: any ``torch.nn.Module``, typically a transformers ``PreTrainedModel``.

    Returns:
        The names of :func:`discover`'s modules that define the class of ``model`` or of one of its
        submodules (empty for a model without gated delta rule layers).
    """
    known = discover()
    return {type(m).__module__ for m in model.modules()} & known.keys()


def refusals(model: torch.nn.Module) -> list[str]:
    """Why the GDN and conv ops cannot serve ``model``'s linear-attention layers (empty: they can).

    Args:
        model: any ``torch.nn.Module``; its config's ``linear_key_head_dim``,
            ``linear_value_head_dim`` and ``hidden_act`` (the conv's activation) are read when it
            has them.

    Returns:
        One sentence per head dim outside ``1..256`` or unsupported conv activation, naming the
        value, what is supported and the alternative.
    """
    config = getattr(model, "config", None)
    if config is None:
        return []
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    found = [f"{type(model).__name__}: config.{attr} = {size}; torch_aura's GDN ops support head dims K and V in "
             f"1..{MAX_HEAD_DIM}; pass gdn=False to leave GDN layers to transformers."
             for attr in ("linear_key_head_dim", "linear_value_head_dim")
             if (size := getattr(text, attr, None)) is not None and not 1 <= size <= MAX_HEAD_DIM]
    act = getattr(text, "hidden_act", None)
    if getattr(text, "linear_key_head_dim", None) is not None and act not in CONV_ACTIVATIONS:
        found.append(f"{type(model).__name__}: config.hidden_act = {act!r}, the activation its GDN layers' causal "
                     f"conv applies; torch_aura.causal_conv1d fuses {[a for a in CONV_ACTIVATIONS if a]}; pass "
                     "gdn=False to leave GDN layers to transformers.")
    return found


def patch(module_names: Iterable[str] | None = None, *, model: torch.nn.Module | None = None
          ) -> list[str]:
    """Route the gated delta rule kernels of transformers modules to torch_aura's GDN ops.

    The gated RMSNorm after the rule goes too: each module's ``*RMSNormGated`` class whose forward is
    the one every GDN family shares (:func:`gated_norm_classes`) gets a forward that runs one Triton
    launch on eager CUDA inference calls (``triton_kernels/gdn/gated_norm.py``) and transformers' own
    code elsewhere. Everything is validated before any global changes, so a bad name patches nothing.
    Patching a module twice is a no-op (the first originals are kept for :func:`unpatch`).

    Args:
        module_names: modules from :func:`discover` (e.g.
            ``"transformers.models.qwen3_next.modeling_qwen3_next"``); None means those of
            ``model`` when one is given, else every discovered module.
        model: optional; its config's linear-attention head dims are checked against the ops'
            range, and without ``module_names`` only its modules (:func:`modules_of`) are patched.

    Returns:
        The patched module names, sorted.

    Raises:
        ValueError: a name is not a discovered gated-delta-rule module, its import fails or a
            kernel global is missing; or ``model``'s ``linear_key_head_dim`` /
            ``linear_value_head_dim`` is outside 1..256.
        ImportError: transformers is missing or outside the supported versions.
    """
    known = discover()
    problems = refusals(model) if model is not None else []
    if problems:
        raise ValueError(" ".join(problems))
    if module_names is None:
        names = sorted(modules_of(model) if model is not None else known)
    else:
        if isinstance(module_names, str):
            module_names = [module_names]
        names = sorted(set(module_names))
    modules = {}
    for name in names:
        if name not in known:
            raise ValueError(f"{name!r}: expected a transformers module defining gated delta rule "
                             f"kernels, one of {sorted(known)}")
        try:
            modules[name] = importlib.import_module(name)
        except Exception as e:
            raise ValueError(f"{name!r}: import failed ({type(e).__name__}: {e})") from e
        for global_name in known[name].values():
            if not callable(getattr(modules[name], global_name, None)):
                raise ValueError(f"{name!r}: expected a module-level function {global_name!r} "
                                 f"(found by discover()), it is missing")
    for name, module in modules.items():
        originals = _ORIGINALS.setdefault(name, {})
        for kind, global_name in known[name].items():
            current = getattr(module, global_name)
            if current is not _OURS[kind]:
                originals.setdefault(global_name, current)
                setattr(module, global_name, _OURS[kind])
        for cls_name in gated_norm_classes(module):
            cls = getattr(module, cls_name)
            if not getattr(cls.forward, "_torch_aura", False):
                originals.setdefault(f"{cls_name}.forward", cls.forward)
                cls.forward = _gated_norm(cls.forward)
    return names


def unpatch(module_names: Iterable[str] | None = None) -> list[str]:
    """Restore the globals :func:`patch` replaced.

    Args:
        module_names: the modules to restore (names not patched are skipped); None restores all.

    Returns:
        The restored module names, sorted (empty when nothing was patched).
    """
    restored = sorted(_ORIGINALS if module_names is None else set(module_names) & _ORIGINALS.keys())
    for name in restored:
        module = importlib.import_module(name)
        for global_name, original in _ORIGINALS.pop(name).items():
            owner, _, attr = global_name.rpartition(".")  # "Cls.forward": a gated norm class's method
            setattr(getattr(module, owner) if owner else module, attr, original)
    return restored


def patched() -> list[str]:
    """The module names currently patched, sorted."""
    return sorted(_ORIGINALS)
