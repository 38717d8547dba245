"""Every causal-LM family transformers ships, built tiny from its config class with random weights,
and the walk that serves each through torch_aura or checks that it is refused by name.

``tiny_config`` shrinks a family's default config generically (sizes by attribute name, the layer
pattern cut to the shortest prefix that keeps every layer kind, sub-configs recursively); what
cannot be built tiny is reported as ``not built: reason``, never skipped. ``walk`` runs one family:

- ``enable()``: served when greedy tokens equal the model's own path and logits agree to 1e-4
  (relative), refused when ``enable`` raises the ``ValueError`` that ``_support`` predicts, with the
  model untouched; ``disable()`` must then restore every config's attention implementation.
- ``AuraKVCache(model, "aura8")``: served when every compressed decode step equals SDPA over the
  dequantized cache (1e-4, relative) and teacher-forced argmax agrees with ``DynamicCache`` on at
  least 95% of the positions (a model whose every layer slides: with ``max_cache_len`` = its
  window), refused when construction raises by name, or when the model's first step raises by name
  (what only running it shows: it calls ``cache.update`` without its kwargs, changes K/V before
  attention, builds its own additive mask).

Run ``python tests/_hf_zoo.py`` to print the README table (``render``); the test compares them.
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from typing import NamedTuple

import torch

from _hf_models import greedy, teacher_forced

WINDOW = 16  # sliding windows and attention chunks: the prompt and decode below cross them
PROMPT, NEW, STEPS = 14, 8, 24  # STEPS: 4 rows x 25 positions make agreement a stable statistic
PARAM_CAP = 8e6  # above this after shrinking, a family is "not built" (CI runs on 2 cores)

# Sizes by attribute name (a list value becomes a list of this size per layer).
SIZES = {
    "vocab_size": 128, "hidden_size": 128, "d_model": 128, "n_embd": 128, "embed_dim": 128, "dim": 128,
    "emb_dim": 128, "word_embed_proj_dim": 128, "embedding_size": 128, "attention_hidden_size": 128,
    "lru_width": 128,
    "num_attention_heads": 2, "n_head": 2, "n_heads": 2, "num_heads": 2, "decoder_attention_heads": 2,
    "encoder_attention_heads": 2, "num_key_value_heads": 1, "num_kv_heads": 1,
    "head_dim": 64, "qk_head_dim": 64, "attention_head_dim": 64, "kv_channels": 64,
    "intermediate_size": 64, "ffn_dim": 64, "decoder_ffn_dim": 64, "encoder_ffn_dim": 64, "n_inner": 64,
    "ffn_hidden_size": 64, "dense_intermediate_size": 64, "intermediate_size_mlp": 64,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "expert_ffn_hidden_size": 32,
    "shared_intermediate_size": 32, "moe_shared_expert_intermediate_size": 32,
    "num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "num_experts_per_token": 2, "moe_topk": 2, "moe_k": 2,
    "n_group": 1, "topk_group": 1, "num_expert_group": 1, "first_k_dense_replace": 1,
    "max_position_embeddings": 256, "n_positions": 256, "n_ctx": 256,
    "kv_lora_rank": 32, "q_lora_rank": 32, "qk_rope_head_dim": 16, "qk_nope_head_dim": 48, "v_head_dim": 64,
    "linear_key_head_dim": 16, "linear_value_head_dim": 32, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_num_heads": 2, "linear_head_dim": 32,
    "index_head_dim": 32, "index_n_heads": 2, "index_topk": 8,
    "vocab_size_per_layer_input": 128, "hidden_size_per_layer_input": 16,
    "mamba_d_state": 16, "mamba_n_heads": 4, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_chunk_size": 16,
    "mamba_expand": 2, "mamba_num_heads": 4, "mamba_head_dim": 64, "ssm_state_size": 16, "n_mamba_heads": 4,
    "mamba_headdim": 64, "mamba_ngroups": 1, "state_size": 16, "time_step_rank": 8, "mamba_dt_rank": 8,
}
KEEP_NONE = {"q_lora_rank", "kv_lora_rank"}  # None is a variant (no LoRA), not a missing size
WINDOWS = ("sliding_window", "attention_chunk_size", "attention_window_size", "local_attention_window_len")
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")
LAYER_KINDS = ("layer_types", "attention_layers", "layers_block_type", "block_types")
# Families whose default structure the generic shrink cannot express.
OVERRIDES = {
    "diffllama": {"num_key_value_heads": 2},
    "zaya": {"num_experts_per_tok": 1},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "bamba": {"attn_layer_indices": [1]},
    "recurrent_gemma": {"num_hidden_layers": 3},  # block_types is a repeating pattern of 3
    "granitemoehybrid": {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]},
    "nemotron_h": {"n_groups": 1},
    "mamba2": {"num_heads": 4, "n_groups": 1},
    "falcon_h1": {"mamba_d_ssm": 256, "mamba_n_heads": 4, "mamba_d_head": 64},
}


class Row(NamedTuple):
    """One family's outcome: ``enable`` and ``cache`` are ``"served"``, ``"refused: ..."``, or
    (``enable``) ``"not built: ..."``; ``failures`` lists what went wrong (empty when it passed)."""

    family: str
    enable: str
    cache: str
    failures: tuple[str, ...] = ()


# -------------------------------------------------------------------------------- shrinking
def _prefix(kinds: list) -> int:
    """The shortest prefix (at least 2) that holds every kind of layer the pattern has."""
    want, n = {str(k) for k in kinds}, 2
    while n < len(kinds) and {str(k) for k in kinds[:n]} != want:
        n += 1
    return min(n, len(kinds))


def shrink(config) -> dict:
    """Constructor overrides that make ``config``'s family tiny (see the module docstring)."""
    d = config.to_dict()
    kw = {}
    for key, value in d.items():
        if isinstance(value, bool):
            continue
        if key in SIZES and not (value is None and key in KEEP_NONE):
            if isinstance(value, list):
                kw[key] = [SIZES[key]] * len(value)
            elif value is None or isinstance(value, (int, float)):
                kw[key] = SIZES[key]
        elif key.endswith("_token_id") and isinstance(value, int):
            kw[key] = min(value, 3)
        elif key in WINDOWS and (isinstance(value, int) or key == "sliding_window"):
            kw[key] = WINDOW  # also where the default is None (Mixtral, Phi3): windows are what is tested
        elif key == "is_decoder":
            kw[key] = True
        elif isinstance(value, dict) and "model_type" in value:
            sub = getattr(config, key)
            kw[key] = {**sub.to_dict(), **shrink(sub)}
    if isinstance(d.get("qk_rope_head_dim"), int):
        kw["head_dim"] = SIZES["qk_rope_head_dim"]  # an MLA config's head_dim is its rope dim
    count = next((k for k in LAYER_COUNTS if isinstance(d.get(k), int)), None)
    if count:
        layers = d[count]
        kinds = next((d[k] for k in LAYER_KINDS if isinstance(d.get(k), list) and len(d[k]) == layers), None)
        n = _prefix(kinds) if kinds else 2
        if d.get("num_kv_shared_layers"):  # producers first, then as many consumers
            kw["num_kv_shared_layers"], n = n, 2 * n
        kw[count] = n
        for key, value in d.items():
            if isinstance(value, list) and len(value) == layers and layers != n:
                kw[key] = (kw.get(key) or value)[:n]
        if isinstance(d.get("per_layer_config"), dict):
            kw["per_layer_config"] = {i: v for i, v in d["per_layer_config"].items() if int(i) < n}
    return kw


def tiny_config(family: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[family]
    return cls(**{**shrink(cls()), **OVERRIDES.get(family, {})})


class NotBuilt(Exception):
    """A family that cannot be built tiny; the message is the reason."""


def build(family: str):
    """The family's causal LM, tiny, fp32, eval, seeded; raises :class:`NotBuilt` with the reason."""
    from transformers import AutoModelForCausalLM

    try:
        with _quiet():
            config = tiny_config(family)
            with torch.device("meta"):
                n = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
            if n > PARAM_CAP:
                raise NotBuilt(f"{n / 1e6:.0f}M parameters after shrinking")
            torch.manual_seed(0)
            return AutoModelForCausalLM.from_config(config).float().eval()
    except NotBuilt:
        raise
    except Exception as e:  # what the family's own config or model refuses for a tiny size
        raise NotBuilt(_reason(e)) from e


def _reason(e: Exception) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()] or [""]
    # a config validator's own error is on its last line ("ValueError: ..."), others on the first
    text = lines[-1] if "validation error" in lines[0] else f"{type(e).__name__}: {lines[0]}"
    return text[:80]


@contextlib.contextmanager
def _quiet():
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)


# ------------------------------------------------------------------------------------ the walk
def implementations(model) -> list:
    """The attention implementation of each config of ``model`` (its own and its sub-configs')."""
    from torch_aura.integrations import transformers as tat

    return [value for _, value in tat._attention_of(model)]


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-4) -> bool:
    return (a - b).abs().max().item() <= rel * max(1.0, b.abs().max().item())


def walk(family: str) -> Row:
    """Serve ``family`` through ``enable()`` and ``AuraKVCache``, or check that each refuses it."""
    from torch_aura.integrations import transformers as tat
    from torch_aura.integrations.transformers import gdn

    try:
        model = build(family)
        vocab = model.config.get_text_config(decoder=True).vocab_size
        g = torch.Generator().manual_seed(0)
        ids, steps = torch.randint(4, vocab, (4, PROMPT), generator=g), torch.randint(4, vocab, (4, STEPS), generator=g)
        with _quiet():
            own = greedy(model, ids, steps=NEW, min_new_tokens=NEW)
    except NotBuilt as e:
        return Row(family, f"not built: {e}", "")
    except Exception as e:  # the family's own tiny model does not generate: nothing to compare with
        return Row(family, f"not built: its own generate fails ({_reason(e)})", "")
    failures = []
    before = implementations(model)
    try:
        with _quiet():
            enable, enabled = _walk_enable(model, ids, own, before, failures)
            cache = _walk_cache(model, ids, steps, enabled, failures)
    except Exception as e:  # a crash is a failure of the walk, reported with the family
        failures.append(f"crashed: {type(e).__name__}: {e}")
        enable, cache = "crashed", "crashed"
    finally:
        tat.disable(model)
    if implementations(model) != before:
        failures.append(f"disable() left {implementations(model)}, the model had {before}")
    if gdn.patched():
        failures.append(f"GDN modules still patched after disable(): {gdn.patched()}")
    return Row(family, enable, cache, tuple(failures))


def _walk_enable(model, ids, own, before, failures) -> tuple[str, bool]:
    from torch_aura.integrations import transformers as tat
    from torch_aura.integrations.transformers import _support, gdn

    predicted = _support.enable_refusals(model, bool(gdn.modules_of(model)))
    try:
        tat.enable(model)
    except ValueError as e:
        if not predicted or any(sentence not in str(e) for sentence in predicted.values()):
            failures.append(f"enable() raised {e!s:.200} but _support predicted {list(predicted)}")
        if implementations(model) != before or gdn.patched():
            failures.append("enable() refused but changed the model")
        return "refused: " + ", ".join(predicted), False
    if predicted:
        failures.append(f"enable() accepted the model, _support predicted refusals {list(predicted)}")
    ours = greedy(model, ids, steps=NEW, min_new_tokens=NEW)
    if not torch.equal(ours.sequences, own.sequences):
        failures.append("enable(): greedy tokens differ from the model's own path")
    elif not all(_close(a, b) for a, b in zip(ours.logits, own.logits)):
        failures.append("enable(): logits differ from the model's own path by more than 1e-4 (relative)")
    return "served", True


# What an AuraKVCache refusal at run time says (its message) -> the README's words for it.
RUNTIME_REFUSALS = {
    "never attended": 'the model is not on "aura"',
    "without its kwargs dict": "cache.update without its kwargs",
    "changes K/V between": "K/V changed between cache.update and attention",
    "additive attention mask": "an additive mask the model builds",
    "uses cache of its own": "the model takes only its own cache class",
}


def _walk_cache(model, ids, steps, enabled, failures) -> str:
    import transformers

    from torch_aura.integrations import transformers as tat
    from torch_aura.integrations.transformers import _support

    specs, predicted = _support.cache_layout(model.config, None, model)
    max_cache_len, served = None, "served"
    if list(predicted) == ["every layer slides"]:  # served when no row can leave the window
        max_cache_len = min(s.window for s in specs if s.kind == "window")
        ids, steps = ids[:, :max_cache_len // 2], steps[:, :max_cache_len - max_cache_len // 2]
        predicted = _support.cache_layout(model.config, max_cache_len, model)[1]
        served = "served with max_cache_len <= window"
    try:
        cache = tat.AuraKVCache(model, scheme="aura8", max_cache_len=max_cache_len)
    except ValueError as e:
        if not predicted or any(sentence not in str(e) for sentence in predicted.values()):
            failures.append(f"AuraKVCache raised {e!s:.200} but _support predicted {list(predicted)}")
        return "refused: " + ", ".join(predicted)
    errors = []
    try:
        with _dequantized_reference(errors):
            aura = teacher_forced(model, ids, None, cache, steps if enabled else steps[:, :2])
    except ValueError as e:
        why = next((words for key, words in RUNTIME_REFUSALS.items() if key in str(e)), None)
        if why is None:
            failures.append(f"AuraKVCache: the model raised {e!s:.200}")
        return f"refused at the first step: {why}"
    if cache.get_seq_length() == 0:
        return "not used: the model keeps no KV cache"
    if not enabled:
        failures.append("AuraKVCache served a model that is not on 'aura'")
        return "served without 'aura' (wrong)"
    if max(errors, default=0.0) > 1e-4:
        failures.append(f"AuraKVCache: compressed decode differs from SDPA over the dequantized cache by "
                        f"{max(errors):.2g} (relative)")
    dense = teacher_forced(model, ids, None, transformers.DynamicCache(config=model.config), steps)
    agree = (dense.argmax(-1) == aura.argmax(-1)).float().mean().item()
    if agree < 0.95:  # not the logits: an MoE router that flips an expert moves them far, rarely the argmax
        failures.append(f"AuraKVCache aura8: teacher-forced argmax agreement {agree:.2f} < 0.95")
    return served


@contextlib.contextmanager
def _dequantized_reference(errors: list):
    """Check every compressed one-token decode step against SDPA over the dequantized cache (rows
    of equal length: the walk's batches are unpadded); relative errors go to ``errors``."""
    import torch_aura
    from torch_aura.integrations.transformers.cache import AuraKVLayer

    attend = AuraKVLayer.attend

    def checked(self, module, query, key, value, mask, scaling, dropout, kwargs):
        out = attend(self, module, query, key, value, mask, scaling, dropout, kwargs)
        if query.shape[2] == 1 and self.cumulative_length > 1:
            a, T = self.aura, self.cumulative_length
            k = torch_aura.aura_dequantize(a.k_codes[:, :, :T], a.k_norms[:, :, :T], a.k_codebook, a.key_bits,
                                           a.k_sign_mask)
            v = torch_aura.aura_dequantize(a.v_codes[:, :, :T], a.v_norms[:, :, :T], a.v_codebook, a.value_bits,
                                           a.v_sign_mask)
            ref = torch.nn.functional.scaled_dot_product_attention(query, k.to(query.dtype), v.to(query.dtype),
                                                                   scale=scaling, enable_gqa=True).transpose(1, 2)
            errors.append((out - ref).abs().max().item() / max(1.0, ref.abs().max().item()))
        return out

    AuraKVLayer.attend = checked
    try:
        yield
    finally:
        AuraKVLayer.attend = attend


def families() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


# ------------------------------------------------------------------------------------ README
def render(rows: list[Row]) -> str:
    """The README's table: families grouped by (enable(), AuraKVCache) outcome, then the unbuilt."""
    groups: dict[tuple[str, str], list[str]] = {}
    unbuilt = []
    for row in rows:
        if row.enable.startswith("not built"):
            unbuilt.append(f"{row.family} ({row.enable[len('not built: '):]})")
        else:
            groups.setdefault((row.enable, row.cache), []).append(row.family)
    order = sorted(groups, key=lambda k: (k[0] != "served", k[1] != "served", -len(groups[k]), k))
    lines = ["| `enable()` | `AuraKVCache` | families |", "|---|---|---|"]
    lines += [f"| {e} | {c} | {', '.join(groups[(e, c)])} |" for e, c in order]
    lines += ["", f"Not built tiny ({len(unbuilt)}): " + "; ".join(unbuilt) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    import time

    rows = []
    for family in sys.argv[1:] or families():
        start = time.perf_counter()
        rows.append(walk(family))
        print(f"{family}: {time.perf_counter() - start:.2f} s", file=sys.stderr)
    for row in rows:
        if row.failures:
            print(f"FAIL {row.family}: {row.failures}", file=sys.stderr)
    print(render(rows))
