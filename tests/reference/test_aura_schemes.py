"""Per-KV-head schemes of ``AuraCache`` (issue 43, deliverable 2), on the CPU: explicit lists against
dequantize-then-attend per head, each group equal bit for bit to a plain cache of its heads, one
scheme everywhere equal to the plain path, ``scheme="auto"`` picking the peaked heads of a
constructed case within its budget, the window's rollback under ``crop``, and a fullgraph compile.
"""

from __future__ import annotations

import pytest
import torch

import torch_aura as ta
from torch_aura.aura_cache import parse_scheme, plan_schemes, scheme_bits

from _aura_cache import assert_compiled_steps_match_eager

D = 64


def rand(g, *shape):
    return torch.randn(*shape, generator=g)


def dequantized(x, scheme, kind):
    """``x [B, T, D]`` encoded and decoded with ``scheme``'s K or V bits (layer 0, seed 0), fp64."""
    kb, vb = parse_scheme(scheme)
    bits = kb if kind == "k" else vb
    cb, bd = ta.aura_codebook(bits, D)
    mask = ta.aura_sign_mask(D, 0, 0, kind)
    codes, norms = ta.aura_encode(x.float().contiguous(), cb, bd, bits, mask)
    return ta.aura_dequantize(codes, norms, cb, bits, mask).double()


def oracle(q, K, V, schemes):
    """fp64 attention of ``q [B, Hq, D]`` over ``K, V [B, T, Hkv, D]``, head h dequantized with schemes[h]."""
    B, Hq, _ = q.shape
    Hkv = K.shape[2]
    G = Hq // Hkv
    out = torch.empty(B, Hq, D, dtype=torch.float64)
    for h, scheme in enumerate(schemes):
        k, v = dequantized(K[:, :, h], scheme, "k"), dequantized(V[:, :, h], scheme, "v")
        qh = q[:, h * G:(h + 1) * G].double()
        p = torch.softmax(qh @ k.transpose(1, 2) * D ** -0.5, -1)
        out[:, h * G:(h + 1) * G] = p @ v
    return out


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("Hkv,G", [(1, 1), (1, 8), (2, 3), (4, 1), (4, 2), (3, 5), (2, 8)])
def test_explicit_per_head_schemes_equal_dequantize_then_attend(Hkv, G):
    g = torch.Generator().manual_seed(Hkv * 10 + G)
    pool = ["aura8v4", "aura4v2", "aura2", "aura3v8"]
    schemes = [pool[h % len(pool)] for h in range(Hkv)]
    cache = ta.AuraCache(schemes, batch=2, kv_heads=Hkv, head_dim=D, capacity=40)
    K, V = rand(g, 2, 23, Hkv, D), rand(g, 2, 23, Hkv, D)
    cache.append(K[:, :20], V[:, :20])
    for t in range(20, 23):  # decode steps append one token each
        cache.append(K[:, t], V[:, t])
    q = rand(g, 2, Hkv * G, D)
    out, lse = cache.decode(q)
    assert out.shape == (2, Hkv * G, D) and lse.shape == (2, Hkv * G)
    assert cache.schemes == (schemes if Hkv > 1 else [schemes[0]])
    assert rel(out, oracle(q, K, V, schemes)) < 2e-5


def test_each_group_is_a_plain_cache_of_its_heads_bit_for_bit():
    """Mixed decode = the plain caches of each head subset, outputs scattered back (causal L > 1 too)."""
    g = torch.Generator().manual_seed(1)
    schemes = ["aura4", "aura8v4", "aura4", "aura2v3"]
    mixed = ta.AuraCache(schemes, batch=2, kv_heads=4, head_dim=D, capacity=32)
    plain = {s: ta.AuraCache(s, batch=2, kv_heads=len(h), head_dim=D, capacity=32)
             for s, h in (("aura4", [0, 2]), ("aura8v4", [1]), ("aura2v3", [3]))}
    heads = {"aura4": [0, 2], "aura8v4": [1], "aura2v3": [3]}
    K, V = rand(g, 2, 12, 4, D), rand(g, 2, 12, 4, D)
    mixed.append(K, V)
    for s, c in plain.items():
        c.append(K[:, :, heads[s]], V[:, :, heads[s]])
    for q in (rand(g, 2, 8, D), rand(g, 2, 3, 8, D)):  # one query; a causal chunk of 3
        out, lse = mixed.decode(q)
        for s, c in plain.items():
            cols = [h * 2 + j for h in heads[s] for j in range(2)]
            o, m = c.decode(q[..., cols, :].contiguous())
            assert torch.equal(out[..., cols, :], o) and torch.equal(lse[..., cols], m)
    assert mixed.bytes_per_token() == sum(c.bytes_per_token() for c in plain.values())
    assert mixed.memory_bytes() == sum(c.memory_bytes() for c in plain.values())


@pytest.mark.parametrize("window", [(0, 0), (2, 5)])
def test_one_scheme_for_every_head_is_the_plain_path_bit_for_bit(window):
    g = torch.Generator().manual_seed(2)
    S, W = window
    kw = dict(batch=2, kv_heads=3, head_dim=D, capacity=40, sink_tokens=S, recent_tokens=W)
    plain = ta.AuraCache("aura4v2", **kw)
    listed = ta.AuraCache(["aura4v2"] * 3, **kw)
    auto = ta.AuraCache("auto", bits_per_coordinate=4.0, candidates=["aura4v2"], **kw)
    K, V, Q = rand(g, 2, 20, 3, D), rand(g, 2, 20, 3, D), rand(g, 2, 4, 6, D)
    for c in (plain, listed, auto):
        c.append(K[:, :16], V[:, :16], queries=Q if c is auto else None)
        c.append(K[:, 16], V[:, 16])
    assert listed.schemes == auto.schemes == ["aura4v2"] * 3 and not listed._mixed
    q = rand(g, 2, 6, D)
    want = plain.decode(q)
    for c in (listed, auto):
        got = c.decode(q)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def peaked_case(g, T=384, Hkv=4, G=2, peaked=(1, 3)):
    """Keys, values and queries where the heads in ``peaked`` have sharp, nearly tied logits
    (queries x 12 over keys whose top logits cluster) and the others flat ones (queries x 0.2)."""
    K, V = rand(g, 1, T, Hkv, D), rand(g, 1, T, Hkv, D)
    q = rand(g, 1, 8, Hkv * G, D)
    for h in range(Hkv):
        sharp = h in peaked
        q[:, :, h * G:(h + 1) * G] *= 12.0 if sharp else 0.2
        if sharp:  # 16 keys near the queries' mean direction: large logits within a few units of each other
            mean = q[0, :, h * G:(h + 1) * G].reshape(-1, D).mean(0)
            idx = torch.randperm(T - 8, generator=g)[:16]
            K[0, idx, h] = 2.5 * mean / mean.norm() + 0.3 * rand(g, 16, D)
    return K, V, q


def test_auto_gives_the_peaked_heads_8_bit_keys_within_the_budget():
    g = torch.Generator().manual_seed(3)
    K, V, q = peaked_case(g)
    budget = (2 * scheme_bits("aura4", D) + 2 * scheme_bits("aura8v4", D)) / 4  # room for two upgrades
    cache = ta.AuraCache("auto", batch=1, kv_heads=4, head_dim=D, capacity=400, bits_per_coordinate=budget,
                         candidates=["aura4", "aura8v4"])
    assert cache.schemes is None
    with pytest.raises(ValueError, match="queries"):
        cache.append(K, V)
    cache.append(K, V, queries=q)
    assert cache.schemes == ["aura4", "aura8v4", "aura4", "aura8v4"]
    errors = cache.head_errors  # [Hkv, candidates]: the peaked heads' 4-bit error dominates
    assert errors[[1, 3], 0].min() > 4 * errors[[0, 2], 0].max()
    assert cache.bits_per_token_coordinate() <= budget
    assert cache.bytes_per_token() * 8 == round(cache.bits_per_token_coordinate() * 2 * 4 * D)
    out, _ = cache.decode(q[:, -1].contiguous())
    assert rel(out, oracle(q[:, -1], K, V, cache.schemes)) < 2e-5


@pytest.mark.parametrize("budget", [4.0, 4.5, 5.0, 6.0, 8.5])
def test_auto_respects_the_budget(budget):
    g = torch.Generator().manual_seed(4)
    K, V, q = peaked_case(g, Hkv=8, peaked=(0, 2, 5))
    schemes, errors = plan_schemes(K, V, q, budget, ["aura3v4", "aura4", "aura8v4", "aura8"])
    assert errors.shape == (8, 4) and len(schemes) == 8
    spent = sum(scheme_bits(s, D) for s in schemes) / 8
    assert spent <= budget + 1e-9
    assert budget - spent < scheme_bits("aura8", D) - scheme_bits("aura3v4", D)  # the budget was used
    if budget >= scheme_bits("aura8", D):  # room for everything: every head gets its lowest error
        assert all(errors[h, ["aura3v4", "aura4", "aura8v4", "aura8"].index(s)] == errors[h].min()
                   for h, s in enumerate(schemes))


def tied_case(sharpness, T=64, Lq=4, Dh=128, seed=0):
    """One query head per KV head; head h's queries all point (x ``sharpness[h]``) along a direction u_h
    on which two keys tie with large logits, over flat small keys: how far the key quantization moves
    the tie (the output between the two values) grows with the sharpness until it saturates."""
    g = torch.Generator().manual_seed(seed)
    H = len(sharpness)
    K, V = 0.3 * rand(g, 1, T, H, Dh), rand(g, 1, T, H, Dh)
    q = torch.zeros(1, Lq, H, Dh)
    for h, c in enumerate(sharpness):
        u = rand(g, Dh)
        u /= u.norm()
        for t in (10, 11):
            w = rand(g, Dh)
            w -= (w @ u) * u
            K[0, t, h] = 4 * u + 2 * w / w.norm()
        q[0, :, h] = c * u
    return K, V, q


def test_auto_spends_the_budget_on_the_worst_head_first():
    """The knapsack minimises the summed *squared* worst-query error: head 1's tie is so sharp that
    8-bit keys only take its error from ~0.30 to ~0.20, head 0's drops further (~0.22 to ~0.08); a
    plain sum would upgrade head 0 and leave the worst head at ~0.30, the squares upgrade head 1
    (worst head ~0.22 either way below the other choice's)."""
    K, V, q = tied_case((5000.0, 24000.0))
    cands = ["aura3v4", "aura8v4"]
    budget = (scheme_bits("aura3v4", 128) + scheme_bits("aura8v4", 128)) / 2  # one head's upgrade
    schemes, errors = plan_schemes(K, V, q, budget, cands)
    drop = errors[:, 0] - errors[:, 1]
    drop_sq = errors[:, 0] ** 2 - errors[:, 1] ** 2
    assert drop[0] > 1.2 * drop[1] and drop_sq[1] > 1.1 * drop_sq[0]  # the case: the sum and the squares disagree
    assert errors[1, 1] > 0.1  # head 1 stays the most hurt head at 8 bits: a partial fix
    assert schemes == ["aura3v4", "aura8v4"]
    assert max(errors[0, 0], errors[1, 1]) < errors[1, 0]  # the chosen worst head beats the sum's choice


def test_auto_budget_below_the_cheapest_candidate_raises():
    g = torch.Generator().manual_seed(5)
    K, V, q = peaked_case(g)
    cache = ta.AuraCache("auto", batch=1, kv_heads=4, head_dim=D, capacity=400, bits_per_coordinate=3.0)
    with pytest.raises(ValueError, match="bits_per_coordinate"):
        cache.append(K, V, queries=q)


@pytest.mark.parametrize("kwargs,match", [
    (dict(scheme=["aura4", "aura8"]), "one scheme per KV head"),
    (dict(scheme=["aura4", "aura9", "aura4"]), "scheme"),
    (dict(scheme="auto"), "bits_per_coordinate"),
    (dict(scheme="aura4", bits_per_coordinate=4.5), "bits_per_coordinate"),
    (dict(scheme="auto", bits_per_coordinate=4.5, candidates=[]), "candidates"),
    (dict(scheme="auto", bits_per_coordinate=4.5, rollback_tokens=-1), "rollback_tokens"),
])
def test_bad_scheme_arguments_raise_named_errors(kwargs, match):
    scheme = kwargs.pop("scheme")
    with pytest.raises(ValueError, match=match):
        ta.AuraCache(scheme, batch=1, kv_heads=3, head_dim=D, capacity=8, **kwargs)


def test_decode_before_auto_chose_raises():
    cache = ta.AuraCache("auto", batch=1, kv_heads=2, head_dim=D, capacity=8, bits_per_coordinate=4.5)
    with pytest.raises(ValueError, match="auto"):
        cache.decode(torch.randn(1, 2, D))


@pytest.mark.parametrize("schemes", [["aura4v2", "aura4v2"], ["aura8v4", "aura4v2"]])
def test_crop_within_the_rollback_slots_equals_never_appending(schemes):
    """Drafts appended then cropped leave the cache as if only the accepted tokens had arrived,
    exact window included; without rollback slots the window comes back shorter (not vacuous)."""
    g = torch.Generator().manual_seed(6)
    S, W = 2, 6
    kw = dict(batch=2, kv_heads=2, head_dim=D, capacity=64, sink_tokens=S, recent_tokens=W)
    K, V = rand(g, 2, 40, 2, D), rand(g, 2, 40, 2, D)
    straight, rolled, short = (ta.AuraCache(schemes, rollback_tokens=r, **kw) for r in (5, 5, 0))
    late = ta.AuraCache(schemes, **kw)  # gets its rollback slots mid-stream
    for c in (straight, rolled, short, late):
        c.append(K[:, :20], V[:, :20])
    late.reserve_rollback(5)
    for c in (rolled, short, late):
        c.append(K[:, 20:25], V[:, 20:25])  # five drafts ...
        c.crop(3)                           # ... two accepted
    straight.append(K[:, 20:22], V[:, 20:22])
    q = rand(g, 2, 4, D)
    want = straight.decode(q)
    for c in (rolled, late):
        got = c.decode(q)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert c.seq_lens.tolist() == [22, 22]
    assert not torch.equal(short.decode(q)[0], want[0])
    for c in (straight, rolled):  # the next tokens continue identically
        c.append(K[:, 22:30], V[:, 22:30])
    a, b = straight.decode(q), rolled.decode(q)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_rows_grow_and_reset_follow_every_group():
    g = torch.Generator().manual_seed(7)
    schemes = ["aura8v4", "aura4v2", "aura4v2"]
    mixed = ta.AuraCache(schemes, batch=2, kv_heads=3, head_dim=D, capacity=16, sink_tokens=1, recent_tokens=3)
    K, V = rand(g, 2, 10, 3, D), rand(g, 2, 10, 3, D)
    mixed.append(K, V)
    mixed.select_rows(torch.tensor([1, 1, 0]))
    mixed.grow(48)
    mixed.append(rand(g, 1, 3, D).repeat(3, 1, 1), rand(g, 1, 3, D).repeat(3, 1, 1))  # the same token for every row
    assert mixed.batch == 3 and mixed.capacity == 48 and mixed.seq_lens.tolist() == [11, 11, 11]
    out, _ = mixed.decode(rand(g, 1, 6, D).repeat(3, 1, 1))
    assert torch.equal(out[0], out[1]) and not torch.equal(out[0], out[2])
    mixed.reset()
    assert mixed.seq_lens.tolist() == [0, 0, 0] and mixed.schemes == schemes
    assert all(int(c.seq_lens.sum()) == 0 for c in mixed._groups)


def test_compiled_mixed_decode_step_fullgraph_matches_eager():
    g = torch.Generator().manual_seed(8)
    kw = dict(batch=2, kv_heads=2, head_dim=D, capacity=48, sink_tokens=2, recent_tokens=4)
    eager, compiled = (ta.AuraCache(["aura4v2", "aura8v4"], **kw) for _ in range(2))
    k, v = rand(g, 2, 9, 2, D), rand(g, 2, 9, 2, D)
    eager.append(k, v)
    compiled.append(k, v)
    assert_compiled_steps_match_eager(compiled, eager.append, eager.decode, g, 6, B=2, Hkv=2, Hq=6, D=D)
