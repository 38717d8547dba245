"""The vLLM GDN adapters (torch_aura/integrations/vllm/gdn.py) on the Triton kernels a GPU runs, here under the
interpreter: the scenarios of tests/vllm_plugin/test_vllm_gdn.py (vLLM's pools, shuffled slots, the null
block and padding, varlen prefill with gathered states and vLLM's chunk_indices, packed decode views of
mixed_qkv, prefill then decode) with ``torch.ops.aura`` answered by the launchers instead of the CPU
reference, the gates by ``gdn/gates.py`` and the launcher-only paths (``null=``, ``out=``, ``gates=``) taken,
against the same fp64 per-sequence loops. No vLLM needed: the adapters are plain functions."""

import importlib.util
import types
from pathlib import Path

import pytest
import torch

from torch_aura.integrations.vllm import gdn
from torch_aura.triton_kernels.gdn import chunk, conv, gates, recurrent

_path = Path(__file__).resolve().parents[1] / "vllm_plugin" / "test_vllm_gdn.py"
_spec = importlib.util.spec_from_file_location("_vllm_gdn_scenarios", _path)
scenarios = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scenarios)


class _TorchWithTritonOps:
    """``torch`` as the adapters see it, but ``torch.ops.aura`` is the Triton launchers: on CPU tensors
    the registered ops would run the reference, which the vllm_plugin tests already cover."""

    ops = types.SimpleNamespace(aura=types.SimpleNamespace(
        gdn_chunk=chunk.gdn_chunk, gdn_recurrent=recurrent.gdn_recurrent,
        causal_conv1d=conv.causal_conv1d, causal_conv1d_update=conv.causal_conv1d_update))

    def __getattr__(self, name):
        return getattr(torch, name)


@pytest.fixture(autouse=True)
def triton_ops(monkeypatch):
    monkeypatch.setattr(gdn, "torch", _TorchWithTritonOps())
    # the gates and pool rows through triton_kernels/gdn/gates.py, as on a GPU (CPU tensors take torch's formula)
    monkeypatch.setattr(gdn, "_fused_gates", lambda a, b: a.stride(-1) == 1 and b.stride(-1) == 1)
    # and the launchers called directly where a GPU would (vLLM's null slot skipped in the kernels, the decode
    # rule computing vLLM's gates and writing the packed decode into vLLM's out)
    monkeypatch.setattr(gdn, "_launchers_here", lambda t: True)


@pytest.mark.parametrize("direct", [True, False], ids=["pool-in-place", "gathered"])
@pytest.mark.parametrize("layout", ["DS", "SD"])
def test_prefill_conv_on_vllm_pool(layout, direct, monkeypatch):
    """Both ways the prefill adapter runs: the launcher serving vLLM's pool in place (its slots, has_initial_state
    and null slot passed through), and the op on rows gathered out of the pool and scattered back."""
    seen = []
    launcher = conv.causal_conv1d
    monkeypatch.setattr(conv, "causal_conv1d", lambda *a, **k: seen.append(k) or launcher(*a, **k))
    monkeypatch.setattr(gdn, "_launchers_here", lambda t: direct)
    scenarios.test_causal_conv1d_fn_on_vllm_pool(layout)
    in_place = [k for k in seen if "state_indices" in k]
    assert (in_place == seen and seen[0]["null"] == 0) if direct else not in_place, seen


@pytest.mark.parametrize("layout", ["DS", "SD"])
def test_decode_conv_on_vllm_pool(layout):
    scenarios.test_causal_conv1d_update_on_vllm_pool(layout)


@pytest.mark.parametrize("vllm_chunk_indices", [False, True], ids=["own-chunk-indices", "vllm-chunk-indices"])
def test_chunked_prefill_from_gathered_pool(vllm_chunk_indices):
    scenarios.test_chunk_gated_delta_rule_varlen_from_gathered_pool(vllm_chunk_indices)


def test_sigmoid_gating_decode_on_shuffled_pool():
    scenarios.test_sigmoid_gating_decode_on_shuffled_pool()


def test_post_conv_prep_in_one_launch(monkeypatch):
    """vLLM's post-conv step takes gates.gdn_post_conv (one launch on a GPU), with the CPU path's results."""
    calls = []
    kernel = gates.gdn_post_conv
    monkeypatch.setattr(gates, "gdn_post_conv", lambda *a: calls.append(1) or kernel(*a))
    scenarios.test_fused_post_conv_prep_splits_normalises_and_gates()
    assert calls == [1]


def test_decode_launchers_take_vllm_slots_and_out(monkeypatch):
    """Where the launchers are called directly, the conv update gets vLLM's slots untranslated with its null slot
    (0), and the packed decode is one launch: vLLM's slots and null slot, its a and b made into gates in the
    kernel, its ``out`` written there (no copy after)."""
    seen = []
    update, rule = conv.causal_conv1d_update, recurrent.gdn_recurrent
    monkeypatch.setattr(conv, "causal_conv1d_update", lambda *a, **k: seen.append(("conv", k)) or update(*a, **k))
    monkeypatch.setattr(recurrent, "gdn_recurrent", lambda *a, **k: seen.append(("rule", k)) or rule(*a, **k))
    scenarios.test_causal_conv1d_update_on_vllm_pool("SD")
    scenarios.test_packed_decode_on_shuffled_pool()
    assert ("conv", {"null": 0}) in seen
    assert any(name == "rule" and {"out", "gates"} <= set(kw) and kw["null"] == 0 for name, kw in seen), seen
    seen.clear()
    scenarios.test_sigmoid_gating_decode_on_shuffled_pool()
    assert seen and all(name == "rule" and "gates" in kw and kw["null"] == 0 for name, kw in seen), seen


@pytest.mark.parametrize("scenario", ["test_packed_decode_on_shuffled_pool",
                                      "test_sigmoid_gating_decode_on_shuffled_pool"])
def test_decode_through_the_gates_kernel_where_the_rule_is_not_launched_directly(monkeypatch, scenario):
    """The decode adapters' other path (a compiled graph, or slots that are not int32): the gates kernel with
    our pool rows, then the op."""
    monkeypatch.setattr(gdn, "_launchers_here", lambda t: False)
    made = []
    kernel = gates.gdn_gates
    monkeypatch.setattr(gates, "gdn_gates", lambda *a: made.append(1) or kernel(*a))
    getattr(scenarios, scenario)()
    assert made


def test_packed_decode_on_shuffled_pool():
    scenarios.test_packed_decode_on_shuffled_pool()


def test_prefill_then_decode_continues_one_recurrence():
    scenarios.test_prefill_then_decode_continues_one_recurrence()
