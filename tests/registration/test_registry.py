"""Every op of the schema table is complete: schema, fake, reference, public wrapper, samples."""

import inspect

import pytest
import torch

import torch_aura
from torch_aura._schema import OPS

import _samples

NAMES = list(OPS)


def test_schema_table_matches_ops_md_catalogue():
    # ops.md fixes the names; a renamed or dropped op must fail here, not in a user's model.
    expected = {
        "flash_decode", "flash_decode_out", "merge_attn_states",
        "hadamard_rotate", "aura_encode", "aura_write_cache", "aura_append", "aura_dequantize", "aura_flash_p1",
        "aura_flash_p2", "aura_decode",
        "gdn_chunk", "gdn_chunk_cumsum", "gdn_kkt_solve", "gdn_recompute_w_u", "gdn_fwd_h",
        "gdn_fwd_o", "gdn_recurrent", "causal_conv1d", "causal_conv1d_update",
    }
    assert set(OPS) == expected


@pytest.mark.parametrize("name", NAMES)
def test_defined_with_schema_from_table(name):
    op = getattr(torch.ops.aura, name).default
    assert str(op._schema) == f"aura::{OPS[name].schema}"
    assert torch.Tag.pt2_compliant_tag in op.tags


@pytest.mark.parametrize("name", NAMES)
def test_has_fake_and_reference(name):
    from torch._library.simple_registry import singleton

    assert singleton.find(f"aura::{name}").fake_impl.kernel is not None, "no fake registered"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"aura::{name}", "CompositeExplicitAutograd")


@pytest.mark.parametrize("name", NAMES)
def test_mutation_is_declared_and_mutating_ops_return_nothing_else(name):
    schema = getattr(torch.ops.aura, name).default._schema
    mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert bool(mutated) == OPS[name].mutates
    # outputs never alias inputs
    assert all(r.alias_info is None for r in schema.returns)


@pytest.mark.parametrize("name", NAMES)
def test_public_wrapper_mirrors_schema(name):
    fn = getattr(torch_aura, name)
    assert name in torch_aura.__all__
    params = list(inspect.signature(fn).parameters.values())
    schema_args = getattr(torch.ops.aura, name).default._schema.arguments
    assert [p.name for p in params] == [a.name for a in schema_args]
    for p, a in zip(params, schema_args):
        if a.has_default_value():
            assert p.default == a.default_value, f"{a.name}: wrapper default {p.default!r} != schema {a.default_value!r}"
        else:
            assert p.default is inspect.Parameter.empty, f"{a.name} has a default only in the wrapper"
    doc = inspect.getdoc(fn) or ""
    for section in ("Args:", "Returns:", "Example:"):
        assert section in doc, f"{name} docstring lacks {section}"


@pytest.mark.parametrize("name", NAMES)
def test_every_op_has_samples(name):
    samples = _samples.all_samples()
    assert name in samples, f"tests/_samples has no samples for {name}"
    cases = samples[name]("cpu")
    assert len(cases) >= 2
    assert len({c.id for c in cases}) == len(cases), "sample ids must be unique"
