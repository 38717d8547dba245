"""The two points where the transformers integration relies on transformers' internals, each tested
against the installed transformers with tiny random-weight models (docs/architecture.md, "Integrations
and their contracts"). A failure names the contract it breaks: the fix belongs in the integration or in
its supported version range (``integrations/transformers/_version.py``), not in this test.

* T1, the cache hand-over: an attention module calls ``cache.update(k, v, layer_idx, kwargs=kwargs)``
  with the very dict it then unpacks into the attention function, and ``Cache.update`` passes
  ``kwargs=`` on to the layer; so whatever a cache layer puts into that dict reaches the attention
  function of the same layer and step (``AuraKVCache`` hands itself to ``"aura"`` that way).
* T2, the GDN globals: each gated-delta-rule model module defines its kernels as module-level
  functions decorated ``@use_kernel_func_from_hub_with_fallback("<kernel>", ...)`` (found by a regex
  over transformers' sources, without importing them), and its layers look those globals up at every
  call; so replacing the globals (the originals kept in a module-level dict) routes the layers, and
  putting them back restores them.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.usefixtures("hf_transformers")

T1 = ("contract T1 (the cache hand-over, docs/architecture.md): transformers passes cache.update the kwargs dict "
      "it then unpacks into the attention function")
T2 = ("contract T2 (the GDN globals, docs/architecture.md): gated-delta-rule kernels are module globals decorated "
      "@use_kernel_func_from_hub_with_fallback and looked up at every call")
PROBE = "aura_contract_probe"
KEY = "aura_contract_token"


def _models(transformers):
    from _hf_models import tiny_llama, tiny_qwen2_sliding, tiny_qwen3_next

    return {"llama": tiny_llama(transformers), "qwen2 (sliding layer)": tiny_qwen2_sliding(transformers),
            "qwen3-next (hybrid)": tiny_qwen3_next(transformers)}


@pytest.fixture(scope="module")
def probe_attention(hf_transformers):
    """A registered attention function that records, per call, the token its kwargs carried."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    arrived = []

    def attention(module, query, key, value, attention_mask, **kwargs):
        arrived.append((getattr(module, "layer_idx", None), kwargs.pop(KEY, None)))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register(PROBE, attention)
    AttentionMaskInterface.register(PROBE, sdpa_mask)
    return arrived


@pytest.mark.parametrize("name", ["llama", "qwen2 (sliding layer)", "qwen3-next (hybrid)"])
@torch.no_grad()
def test_t1_cache_update_kwargs_reach_the_attention_function(hf_transformers, probe_attention, name):
    model = _models(hf_transformers)[name]
    model.set_attn_implementation(PROBE)
    cache = hf_transformers.DynamicCache(config=model.config)
    updates = []

    def probing(layer, idx):
        update = layer.update

        def probe_update(key_states, value_states, *args, kwargs=None, **rest):
            updates.append((idx, kwargs))
            if isinstance(kwargs, dict):
                kwargs[KEY] = ("token of layer", idx)
            return update(key_states, value_states, *args, **rest)

        return probe_update

    for idx, layer in enumerate(cache.layers):
        if hasattr(layer, "update"):  # attention layers (a linear-attention layer holds conv and state only)
            layer.update = probing(layer, idx)
    probe_attention.clear()
    ids = torch.randint(1, 128, (2, 6))
    model(ids, cache=cache, use_cache=True)
    model(ids[:, -1:], cache=cache, use_cache=True)

    assert updates, f"{T1}: {name} never called cache.update"
    missing = sorted({idx for idx, kwargs in updates if not isinstance(kwargs, dict)})
    assert not missing, (f"{T1}: {name} called cache.update without kwargs=<dict> (layers {missing}); AuraKVCache "
                         "has no way to reach the attention function")
    attended = [(idx, token) for idx, token in probe_attention]
    wrong = [(idx, token) for idx, token in attended if token != ("token of layer", idx)]
    assert len(attended) == len(updates) and not wrong, (
        f"{T1}: in {name}, the attention function did not receive what the cache layer put into the kwargs dict "
        f"cache.update got (expected each layer's own token, got {wrong[:4]} over {len(attended)} calls for "
        f"{len(updates)} updates): transformers now passes the cache a copy or another dict")


@torch.no_grad()
def test_t1_aura_kv_cache_attends_every_layer_and_step(hf_transformers, tat, monkeypatch):
    """The real hand-over: AuraKVCache's layers serve every attention call of an enabled model."""
    from _hf_models import tiny_llama

    from torch_aura.integrations.transformers import cache as cache_module

    model = tiny_llama(hf_transformers)
    attended = []
    attend = cache_module.AuraKVLayer.attend

    def counting(self, *args, **kwargs):
        attended.append(self.layer_idx)
        return attend(self, *args, **kwargs)

    monkeypatch.setattr(cache_module.AuraKVLayer, "attend", counting)
    tat.enable(model)
    try:
        cache = tat.AuraKVCache(model, scheme="aura8")
        ids = torch.randint(1, 128, (2, 6))
        try:
            model(ids, cache=cache, use_cache=True)
            for _ in range(2):
                model(ids[:, -1:], cache=cache, use_cache=True)
        except ValueError as e:
            pytest.fail(f"{T1}: AuraKVCache refused a Llama step ({e})")
    finally:
        tat.disable(model)
    layers = model.config.num_hidden_layers
    assert attended == list(range(layers)) * 3, (
        f"{T1}: the 'aura' attention reached AuraKVCache's layers {attended}, expected layers 0..{layers - 1} "
        "on each of 3 steps")


# ------------------------------------------------------------------------------------------- T2
def _models_dir(transformers) -> Path:
    return Path(transformers.__file__).resolve().parent / "models"


def test_t2_discovery_finds_every_gated_delta_rule_module(hf_transformers):
    from torch_aura.integrations.transformers import gdn

    found = gdn.discover()
    assert "transformers.models.qwen3_next.modeling_qwen3_next" in found, (
        f"{T2}: the source scan found no Qwen3-Next kernels (found {sorted(found)}); transformers no longer "
        "marks them with the decorator gdn._DECORATED_DEF matches")
    # a looser reading than the integration's: any modeling file naming the chunk kernel as a string
    naming = {f"transformers.models.{p.parent.name}.{p.stem}"
              for p in sorted(_models_dir(hf_transformers).glob("*/modeling_*.py"))
              if re.search(r"[\"']chunk_gated_delta_rule[\"']", p.read_text(encoding="utf-8"))}
    assert naming <= found.keys(), (
        f"{T2}: {sorted(naming - found.keys())} name the 'chunk_gated_delta_rule' kernel but the source scan "
        "does not find their decorated functions: the decorator or its layout changed")
    for module, kinds in found.items():
        assert {"chunk", "recurrent"} <= kinds.keys(), (
            f"{T2}: {module} decorates {sorted(kinds)}; a gated-delta-rule module defines both the chunk and the "
            "recurrent kernel")
        m = importlib.import_module(module)
        absent = [name for name in kinds.values() if not callable(getattr(m, name, None))]
        assert not absent, f"{T2}: {module} has no module-level function {absent} where the scan read its decorator"


@torch.no_grad()
def test_t2_layers_call_the_patched_globals_and_unpatch_restores_them(hf_transformers, monkeypatch):
    from _hf_models import tiny_qwen3_next

    from torch_aura.integrations.transformers import gdn

    module_name = "transformers.models.qwen3_next.modeling_qwen3_next"
    module = importlib.import_module(module_name)
    names = gdn.discover()[module_name]
    originals = {kind: getattr(module, name) for kind, name in names.items()}
    calls = {kind: 0 for kind in names}

    def counting(kind, fn):
        def call(*args, **kwargs):
            calls[kind] += 1
            return fn(*args, **kwargs)
        return call

    for kind in names:
        monkeypatch.setitem(gdn._OURS, kind, counting(kind, gdn._OURS[kind]))
    model = tiny_qwen3_next(hf_transformers)
    gdn.unpatch()
    try:
        assert gdn.patch([module_name]) == [module_name]
        cache = hf_transformers.DynamicCache(config=model.config)
        ids = torch.randint(1, 128, (1, 8))
        model(ids, cache=cache, use_cache=True)
        model(ids[:, -1:], cache=cache, use_cache=True)
    finally:
        gdn.unpatch()
    uncalled = sorted(f"{names[kind]} ({kind})" for kind, n in calls.items() if n == 0)
    assert not uncalled, (f"{T2}: {module_name}'s layers never called the patched globals {uncalled} over a "
                          "prefill and a decode step: they no longer look their kernels up as module globals at "
                          "call time, so patch() cannot route them")
    restored = {kind: getattr(module, name) for kind, name in names.items()}
    assert restored == originals and gdn.patched() == [], (
        f"{T2}: unpatch() left {module_name}'s globals {sorted(k for k in names if restored[k] is not originals[k])} "
        "changed, or its record of originals not empty")
