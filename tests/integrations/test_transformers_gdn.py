"""The transformers GDN adapter (torch_aura/integrations/transformers/gdn.py), on CPU in fp32.

Tiny random-weight models built from config (no hub access), one per GDN family transformers ships:
greedy generation through the patched kernels matches transformers' own path token for token, and the
patched run provably goes through ``gdn_chunk`` / ``gdn_recurrent`` (calls counted, decode pools are the
cache's tensors).
"""

import importlib
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.usefixtures("hf_transformers")

QWEN3_NEXT = "transformers.models.qwen3_next.modeling_qwen3_next"
QWEN3_5 = "transformers.models.qwen3_5.modeling_qwen3_5"
QWEN3_5_MOE = "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe"
OLMO_HYBRID = "transformers.models.olmo_hybrid.modeling_olmo_hybrid"

ATOL = 1e-4
NEW_TOKENS = 20
LINEAR_LAYERS = 3
# initializer_range 0.1 (not 0.02): a 1% error in the decay then moves logits by ~3e-2, not ~3e-4
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=32,
            layer_types=["linear_attention"] * LINEAR_LAYERS + ["full_attention"],
            initializer_range=0.1, pad_token_id=0, bos_token_id=None, eos_token_id=None)


@pytest.fixture(scope="module")
def gdn(hf_transformers):
    from torch_aura.integrations.transformers import gdn

    return gdn


@pytest.fixture(autouse=True)
def _unpatched(gdn):
    gdn.unpatch()
    yield
    gdn.unpatch()


def _globals(module_name, gdn):
    module = importlib.import_module(module_name)
    names = gdn.discover()[module_name]
    return {kind: getattr(module, names[kind]) for kind in ("chunk", "recurrent", "conv", "conv_update")}


def _torch_reference(module_name, gdn):
    # transformers' pure-PyTorch kernels, bypassing the FLA / hub dispatch of the decorator
    return {kind: getattr(fn, "__wrapped__", fn) for kind, fn in _globals(module_name, gdn).items()}


def _conv_views(B, T, H, HV, K, V):
    """q, k, v as the models hand them over: views of the transposed ``[B, C, T]`` conv output."""
    mixed = torch.randn(B, 2 * H * K + HV * V, T).transpose(1, 2)
    q, k, v = mixed.split([H * K, H * K, HV * V], dim=-1)
    return q.reshape(B, T, H, K), k.reshape(B, T, H, K), v.reshape(B, T, HV, V)


def _inputs(B, T, H=2, HV=4, K=16, V=32, beta_max=1.0):
    q, k, v = _conv_views(B, T, H, HV, K, V)
    g = -0.5 * torch.rand(B, T, HV)
    beta = beta_max * torch.rand(B, T, HV)
    return q, k, v, g, beta


def test_import_torch_aura_does_not_import_transformers():
    code = "import sys, torch_aura; assert 'transformers' not in sys.modules; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_discover_finds_the_gdn_models(gdn):
    found = gdn.discover()
    for name in (QWEN3_NEXT, QWEN3_5, QWEN3_5_MOE, OLMO_HYBRID):
        assert found[name] == {"chunk": "torch_chunk_gated_delta_rule",
                               "recurrent": "torch_recurrent_gated_delta_rule",
                               "conv": "causal_conv1d_fn", "conv_update": "causal_conv1d_update"}, name
    assert not any("modular_" in name for name in found)
    # every family the scan routes has a generate test below: a family transformers adds fails here first
    assert set(found) == {f"transformers.models.{family}.modeling_{family}" for family in FAMILIES}
    # the conv is routed only where it feeds a gated delta rule: Mamba-style models call theirs otherwise
    assert "transformers.models.mamba2.modeling_mamba2" not in found


def test_patch_unpatch_restore_and_are_idempotent(gdn):
    before = {name: _globals(name, gdn) for name in (QWEN3_NEXT, QWEN3_5)}
    assert gdn.patch([QWEN3_NEXT]) == [QWEN3_NEXT]
    assert gdn.patch([QWEN3_NEXT]) == [QWEN3_NEXT]
    assert _globals(QWEN3_NEXT, gdn) == {"chunk": gdn.chunk_gated_delta_rule,
                                         "recurrent": gdn.recurrent_gated_delta_rule,
                                         "conv": gdn.causal_conv1d_fn, "conv_update": gdn.causal_conv1d_update}
    assert _globals(QWEN3_5, gdn) == before[QWEN3_5]
    assert gdn.patched() == [QWEN3_NEXT]
    assert gdn.unpatch() == [QWEN3_NEXT]
    assert {name: _globals(name, gdn) for name in before} == before
    assert gdn.patched() == [] and gdn.unpatch() == []

    everything = gdn.patch()
    assert set(everything) == set(gdn.discover())
    gdn.unpatch()
    assert {name: _globals(name, gdn) for name in before} == before



def test_the_gated_norm_of_every_family_is_found_and_patched(gdn):
    """Each family's ``*RMSNormGated`` (the same code in all four) gets the one-launch forward, which on the CPU
    runs transformers' own code to the bit; unpatch puts the original forward back."""
    classes = {name: gdn.gated_norm_classes(importlib.import_module(name))
               for name in (QWEN3_NEXT, QWEN3_5, QWEN3_5_MOE, OLMO_HYBRID)}
    assert all(len(found) == 1 and found[0].endswith("RMSNormGated") for found in classes.values()), classes
    norm_cls = getattr(importlib.import_module(QWEN3_NEXT), classes[QWEN3_NEXT][0])
    original = norm_cls.forward
    norm = norm_cls(32)
    torch.nn.init.normal_(norm.weight)
    x, z = torch.randn(5, 32, dtype=torch.bfloat16), torch.randn(5, 32, dtype=torch.bfloat16)
    want = norm(x, z)
    gdn.patch([QWEN3_NEXT])
    gdn.patch([QWEN3_NEXT])  # idempotent: the original stays the one to restore
    assert norm_cls.forward is not original and norm_cls.forward._torch_aura
    assert torch.equal(norm(x, z), want)  # CPU: transformers' code
    gdn.unpatch()
    assert norm_cls.forward is original


def test_a_gated_norm_with_other_code_keeps_its_own(gdn, tmp_path, monkeypatch):
    """Only a forward whose code is the shared one is served (comments and layout aside): one that, say,
    skips the cast back before the weight keeps transformers' code."""
    source = gdn._GATED_NORM_FORWARD
    same = source.replace("    variance", "    # a comment\n    variance").replace(" * torch", " *  torch")
    other = source.replace("self.weight * hidden_states.to(input_dtype)", "self.weight * hidden_states")
    body = "\n".join(f"class {name}RMSNormGated(nn.Module):\n" + "\n".join("    " + line for line in code.splitlines())
                     for name, code in (("Same", same), ("Other", other)))
    (tmp_path / "gated_norm_variants.py").write_text("import torch\nfrom torch import nn\n\n" + body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert gdn.gated_norm_classes(importlib.import_module("gated_norm_variants")) == ["SameRMSNormGated"]

def test_bad_module_name_patches_nothing(gdn):
    before = _globals(QWEN3_NEXT, gdn)
    with pytest.raises(ValueError, match="transformers.models.nope.modeling_nope"):
        gdn.patch([QWEN3_NEXT, "transformers.models.nope.modeling_nope"])
    assert _globals(QWEN3_NEXT, gdn) == before and gdn.patched() == []


def test_missing_kernel_global_patches_nothing(gdn, monkeypatch):
    before = _globals(QWEN3_5, gdn)
    monkeypatch.delattr(importlib.import_module(QWEN3_NEXT), "torch_recurrent_gated_delta_rule")
    # QWEN3_5 sorts first: it would be patched already if validation and patching were interleaved
    with pytest.raises(ValueError, match=f"{QWEN3_NEXT}.*torch_recurrent_gated_delta_rule"):
        gdn.patch([QWEN3_NEXT, QWEN3_5])
    assert _globals(QWEN3_5, gdn) == before and gdn.patched() == []


def test_patch_rejects_head_dims_over_256(gdn):
    from transformers import Qwen3NextConfig

    holder = torch.nn.Module()
    holder.config = Qwen3NextConfig(linear_value_head_dim=512)
    before = _globals(QWEN3_NEXT, gdn)
    with pytest.raises(ValueError, match=r"linear_value_head_dim = 512.*1\.\.256"):
        gdn.patch([QWEN3_NEXT], model=holder)
    assert _globals(QWEN3_NEXT, gdn) == before and gdn.patched() == []


@pytest.mark.parametrize("beta_max", [1.0, 2.0], ids=["beta01", "beta02_olmo"])
def test_kernels_match_transformers_reference(gdn, beta_max):
    torch.manual_seed(0)
    ref = _torch_reference(QWEN3_NEXT, gdn)
    q, k, v, g, beta = _inputs(2, 70, beta_max=beta_max)
    state0 = 0.1 * torch.randn(2, 4, 16, 32)
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_ref, s_ref = ref["chunk"](q, k, v, g=g, beta=beta, initial_state=state0.clone(), **kw)
    # unknown keywords (position_ids, chunk_size) are ignored
    o, s = gdn.chunk_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state0,
                                      cu_seqlens=None, position_ids=torch.arange(70)[None],
                                      chunk_size=64, **kw)
    assert s.dtype == torch.float32 and o.dtype == q.dtype
    torch.testing.assert_close(o, o_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(s, s_ref, atol=ATOL, rtol=0)

    # one decode token from that state; the pool is updated in place and returned
    q1, k1, v1, g1, b1 = _inputs(2, 1, beta_max=beta_max)
    o1_ref, s1_ref = ref["recurrent"](q1, k1, v1, g=g1, beta=b1, initial_state=s.clone(), **kw)
    pool = s.clone()
    o1, s1 = gdn.recurrent_gated_delta_rule(q1, k1, v1, g=g1, beta=b1, initial_state=pool,
                                            cu_seqlens=None, position_ids=None, **kw)
    assert s1 is pool
    torch.testing.assert_close(o1, o1_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(s1, s1_ref, atol=ATOL, rtol=0)


def test_recurrent_state_handling(gdn):
    torch.manual_seed(0)
    q, k, v, g, beta = _inputs(2, 3)
    kw = dict(use_qk_l2norm_in_kernel=True)
    # no initial state: zeros, a new fp32 state
    o0, s0 = gdn.recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, output_final_state=True, **kw)
    o, s = gdn.recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, output_final_state=True,
                                          initial_state=torch.zeros(2, 4, 16, 32), **kw)
    assert s0.dtype == torch.float32
    torch.testing.assert_close((o0, s0), (o, s), atol=0, rtol=0)
    # no final state asked for: the caller's state is left alone
    state = s.clone()
    o2, none = gdn.recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state, **kw)
    assert none is None and torch.equal(state, s)
    # a pool dtype the op does not take is converted to fp32, not rejected
    o3, s3 = gdn.recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, output_final_state=True,
                                            initial_state=s.double(), **kw)
    assert s3.dtype == torch.float32
    torch.testing.assert_close(o3, o2, atol=1e-6, rtol=0)


def test_strided_inputs_equal_contiguous(gdn):
    torch.manual_seed(0)
    q, k, v, g, beta = _inputs(2, 70)
    assert all(t.stride(-1) != 1 for t in (q, k, v))
    with pytest.raises(ValueError, match="unit stride"):
        gdn.gdn_chunk(q, k, v, g, beta)  # what the adapter's copy is for
    contiguous = [t.contiguous() for t in (q, k, v)]
    kw = dict(g=g, beta=beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    for fn in (gdn.chunk_gated_delta_rule, gdn.recurrent_gated_delta_rule):
        o, s = fn(q, k, v, **kw)
        o_c, s_c = fn(*contiguous, **kw)
        torch.testing.assert_close((o, s), (o_c, s_c), atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["chunk", "recurrent"])
def test_varlen_equals_per_sequence(gdn, kind):
    torch.manual_seed(0)
    lengths = [70, 5, 33] if kind == "chunk" else [4, 1, 3]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v, g, beta = _inputs(1, sum(lengths))
    state0 = 0.1 * torch.randn(len(lengths), 4, 16, 32)
    fn = gdn.chunk_gated_delta_rule if kind == "chunk" else gdn.recurrent_gated_delta_rule
    kw = dict(output_final_state=True, use_qk_l2norm_in_kernel=True)
    o, s = fn(q, k, v, g=g, beta=beta, initial_state=state0.clone(), cu_seqlens=cu, **kw)
    for n, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        part = [t[:, a:b] for t in (q, k, v, g, beta)]
        o_n, s_n = fn(*part[:3], g=part[3], beta=part[4], initial_state=state0[n:n + 1].clone(),
                      **kw)
        torch.testing.assert_close(o[:, a:b], o_n, atol=1e-5, rtol=0)
        torch.testing.assert_close(s[n:n + 1], s_n, atol=1e-5, rtol=0)


def _qwen3_next():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    return Qwen3NextForCausalLM(Qwen3NextConfig(
        **TINY, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32))


def _qwen3_5():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**TINY))


MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)


def _qwen3_5_moe():
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    return Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**TINY, **MOE))


def _olmo_hybrid():
    """OLMo's hybrid: beta = 2 sigmoid(b) (``linear_allow_neg_eigval``), its own a_log / dt ranges."""
    from transformers import OlmoHybridConfig, OlmoHybridForCausalLM

    tiny = {k: v for k, v in TINY.items() if k != "head_dim"}  # OLMo derives it from the hidden size
    return OlmoHybridForCausalLM(OlmoHybridConfig(**tiny, linear_allow_neg_eigval=True))


def _lara_mini():
    from transformers import LaraMiniConfig, LaraMiniForCausalLM

    return LaraMiniForCausalLM(LaraMiniConfig(**TINY, **MOE))


def _qwen4_exp():
    """Its full-attention layers are indexed (a sparse-attention indexer); n-gram embeddings and hyper
    connections cut to tiny sizes."""
    from transformers import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    tiny = TINY | dict(layer_types=["linear_attention"] * LINEAR_LAYERS + ["indexed_attention"])
    return Qwen4ExpForCausalLM(Qwen4ExpTextConfig(
        **tiny, **MOE, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=64,
        indexer_compress_ratio=4, ngram_vocab_size_base=256, heads_per_ngram=2, hc_lowrank=8, ple_embed_dim=32))


def _count_op_calls(gdn, monkeypatch):
    """Wrap the adapter's ops: counts per kind, the storage of every decode pool, and whether the
    prefill's q, k and v arrived unit-stride (our conv's token-major output: no copy)."""
    seen = {"chunk": 0, "recurrent": 0, "conv": 0, "conv_update": 0, "pools": set(), "unit_stride": set()}

    def chunk(q, k, v, *args, **kwargs):
        seen["chunk"] += 1
        seen["unit_stride"].add(all(t.stride(-1) == 1 for t in (q, k, v)))
        return op_chunk(q, k, v, *args, **kwargs)

    for kind, name in (("conv", "causal_conv1d"), ("conv_update", "_conv_update_op")):
        def counting(*args, _kind=kind, _real=getattr(gdn, name), **kwargs):
            seen[_kind] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(gdn, name, counting)

    def recurrent(q, k, v, g, beta, state, *args, **kwargs):
        seen["recurrent"] += 1
        seen["pools"].add(state.data_ptr())
        return op_recurrent(q, k, v, g, beta, state, *args, **kwargs)

    op_chunk, op_recurrent = gdn.gdn_chunk, gdn._recurrent_op
    monkeypatch.setattr(gdn, "gdn_chunk", chunk)
    monkeypatch.setattr(gdn, "_recurrent_op", recurrent)
    return seen


def _step_floor(model, ids, mask, scale=1e-7):
    """Per decode step, how far the model's own path moves its logits when the embeddings move by ``scale``
    (random): where a step sits near a tie (a routing or a norm of a tiny vector), fp32 roundings of two
    correct paths move it that far too, so the comparison below allows it (at least ATOL)."""
    _, ref = _run(model, ids, mask)
    g = torch.Generator().manual_seed(1)
    handle = model.get_input_embeddings().register_forward_hook(
        lambda m, i, o: o + scale * torch.randn(o.shape, generator=g))
    try:
        _, moved = _run(model, ids, mask)
    finally:
        handle.remove()
    return [max(ATOL, (a - b).abs().max().item()) for a, b in zip(moved.logits, ref.logits)]


def _run(model, ids, mask):
    with torch.no_grad():
        prefill = model(input_ids=ids, attention_mask=mask, use_cache=True).logits
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    return prefill, out


FAMILIES = {"qwen3_next": _qwen3_next, "qwen3_5": _qwen3_5, "qwen3_5_moe": _qwen3_5_moe,
            "olmo_hybrid": _olmo_hybrid, "lara_mini": _lara_mini, "qwen4_exp": _qwen4_exp}


@pytest.mark.parametrize("build", FAMILIES.values(), ids=FAMILIES.keys())
def test_generate_matches_transformers_path(gdn, build, monkeypatch, transformers_torch_gdn):
    torch.manual_seed(0)
    model = build().eval()
    (module_name,) = gdn.modules_of(model)
    # two prompts, 70 (two chunks) and 41 tokens, left-padded
    ids = torch.randint(1, 128, (2, 70))
    mask = torch.ones_like(ids)
    ids[1, :29], mask[1, :29] = 0, 0
    seen = _count_op_calls(gdn, monkeypatch)

    ref_prefill, ref = _run(model, ids, mask)
    floor = _step_floor(model, ids, mask)
    assert seen["chunk"] == seen["recurrent"] == seen["conv"] == seen["conv_update"] == 0
    default = _globals(module_name, gdn)
    assert gdn.patch(model=model) == [module_name]
    assert _globals(module_name, gdn) != default
    prefill, out = _run(model, ids, mask)

    # prefill: the forward and generate's first step; decode: the other NEW_TOKENS - 1 steps
    assert seen["chunk"] == seen["conv"] == 2 * LINEAR_LAYERS
    assert seen["recurrent"] == seen["conv_update"] == (NEW_TOKENS - 1) * LINEAR_LAYERS
    assert seen["unit_stride"] == {True}  # q, k, v views of our conv's output: the GDN op copies none
    cache_states = [layer.recurrent_states[0] for layer in out.cache.layers
                    if hasattr(layer, "recurrent_states")]
    assert len(cache_states) == LINEAR_LAYERS
    assert all(s.dtype == torch.float32 for s in cache_states)
    assert seen["pools"] == {s.data_ptr() for s in cache_states}  # decode wrote the cache in place

    valid = mask.bool()
    assert (prefill[valid] - ref_prefill[valid]).abs().max().item() <= ATOL
    assert torch.equal(out.sequences, ref.sequences)
    assert len(out.logits) == len(ref.logits) == NEW_TOKENS
    steps = [(a - b).abs().max().item() for a, b in zip(out.logits, ref.logits)]
    assert all(d <= f for d, f in zip(steps, floor)), list(zip(steps, floor))
    assert sorted(steps)[len(steps) // 2] <= ATOL / 10  # the typical step: fp32 rounding, not a near-tie


def test_conv_adapter_layouts_packed_sequences_and_refusal(gdn, hf_transformers):
    """The conv adapter takes transformers' channels-first calls: a transposed token-major view is
    read in place and the output is one again; packed sequences (``cu_seq_lens_q``) do not see each
    other (transformers' torch fallback convolves across them); a non-SiLU model is refused."""
    g = torch.Generator().manual_seed(40)
    C, W = 12, 4
    weight, bias = torch.randn(C, W, generator=g), torch.randn(C, generator=g)
    tokens = torch.randn(1, 11, C, generator=g)
    out = gdn.causal_conv1d_fn(tokens.transpose(1, 2), weight, bias, "silu")
    assert out.shape == (1, C, 11) and out.transpose(1, 2).is_contiguous()
    cu = torch.tensor([0, 4, 11], dtype=torch.int32)
    packed = gdn.causal_conv1d_fn(tokens.transpose(1, 2), weight, bias, "silu", cu_seq_lens_q=cu)
    for a, b in ((0, 4), (4, 11)):
        alone = gdn.causal_conv1d_fn(tokens[:, a:b].transpose(1, 2), weight, bias, "silu")
        assert torch.allclose(packed[..., a:b], alone, atol=1e-6)
    assert not torch.allclose(packed[..., 4:], out[..., 4:])  # without the offsets the context leaks
    model = _qwen3_next()
    model.config.hidden_act = "gelu"
    with pytest.raises(ValueError, match=r"config.hidden_act = 'gelu'.*causal_conv1d fuses \['silu', 'swish'\]"):
        gdn.patch(model=model)
    assert gdn.patched() == []
