"""AuraCache(sink_tokens=S, recent_tokens=W) (issue 43, deliverable 1) against exact fp64 attention
over [first S tokens exact | the middle dequantized | last W tokens exact], on the CPU: one-token and
causal decode, ragged and left-padded chunks, crop, select_rows, grow, reset, the edge cases
(T = 0 / 1, T < S, T < S + W, S = 0, W = 0), and a fullgraph compile of a decode step.

The oracle keeps each row's tokens as a plain list and its own window start (the first position
of the exact recent tokens: max(S, n - W) as tokens arrive, cut back to the row's end by crop).
"""

from __future__ import annotations

import math

import pytest
import torch

import torch_aura as ta

from _aura_cache import assert_compiled_steps_match_eager

D = 64


class Oracle:
    """Rows of raw tokens and their window starts; attention in fp64 over the mixed cache."""

    def __init__(self, cache: ta.AuraCache):
        self.c, self.S, self.W = cache, cache.sink_tokens, cache.recent_tokens
        self.k = [[] for _ in range(cache.batch)]
        self.v = [[] for _ in range(cache.batch)]
        self.rs = [self.S] * cache.batch

    def append(self, k, v, lengths=None, left_padded=False):
        self.c.append(k, v, lengths, left_padded)
        if k.dim() == 3:
            k, v = k[:, None], v[:, None]
        L = k.shape[1]
        for b in range(k.shape[0]):
            n = L if lengths is None else max(0, min(L, int(lengths[b])))
            rows = range(L - n, L) if left_padded else range(n)
            self.k[b] += [k[b, i] for i in rows]
            self.v[b] += [v[b, i] for i in rows]
            self.rs[b] = max(self.rs[b], len(self.k[b]) - self.W)

    def crop(self, n):
        self.c.crop(n)
        for b in range(len(self.k)):
            keep = max(len(self.k[b]) - n, 0)
            self.k[b], self.v[b] = self.k[b][:keep], self.v[b][:keep]
            self.rs[b] = max(self.S, min(self.rs[b], keep))

    def select(self, index):
        self.c.select_rows(index)
        idx = index.tolist()
        # copies: a repeated row must not share its list with its twin
        self.k, self.v, self.rs = [list(self.k[i]) for i in idx], [list(self.v[i]) for i in idx], [self.rs[i] for i in idx]

    def _mixed(self, b, tokens, kind):
        """The row's tokens as the cache holds them: exact (in its dtype) or encoded and decoded."""
        if not tokens:
            return torch.zeros(0, self.c.kv_heads, D, dtype=torch.float64)
        x = torch.stack(tokens).to(self.c._exact_dtype or tokens[0].dtype)
        c = self.c
        bits, cb, bd, mask = ((c.key_bits, c.k_codebook, c.k_boundaries, c.k_sign_mask) if kind == "k" else
                              (c.value_bits, c.v_codebook, c.v_boundaries, c.v_sign_mask))
        deq = ta.aura_dequantize(*ta.aura_encode(x, cb, bd, bits, mask), cb, bits, mask).double()
        exact = x.double()
        pos = torch.arange(len(tokens))
        middle = (pos >= self.S) & (pos < self.rs[b])
        return torch.where(middle[:, None, None], deq, exact)

    def attend(self, q, scale=None):
        """fp64 ``(out, lse)`` of ``q [B, Hq, D]`` or causal ``[B, L, Hq, D]``."""
        causal = q.dim() == 4
        q4 = q if causal else q[:, None]
        B, L, Hq, _ = q4.shape
        G = Hq // self.c.kv_heads
        scale = D ** -0.5 if scale is None else scale
        out = torch.zeros(B, L, Hq, D, dtype=torch.float64)
        lse = torch.full((B, L, Hq), -math.inf, dtype=torch.float64)
        for b in range(B):
            K = self._mixed(b, self.k[b], "k").repeat_interleave(G, 1)  # [n, Hq, D]
            V = self._mixed(b, self.v[b], "v").repeat_interleave(G, 1)
            n = K.shape[0]
            for i in range(L):
                see = n - L + i + 1 if causal else n
                if see <= 0:
                    continue
                s = scale * torch.einsum("hd,thd->ht", q4[b, i].double(), K[:see])
                lse[b, i] = torch.logsumexp(s, -1)
                out[b, i] = torch.einsum("ht,thd->hd", torch.softmax(s, -1), V[:see])
        return (out, lse) if causal else (out[:, 0], lse[:, 0])


def check(oracle, q, scale=None, rtol=2e-5):
    out, lse = oracle.c.decode(q, scale=scale)
    ref_out, ref_lse = oracle.attend(q, scale)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), (lse, ref_lse)
    live = torch.isfinite(ref_lse)
    assert torch.allclose(lse[live].double(), ref_lse[live], atol=1e-4, rtol=0)
    err = (out.double() - ref_out).norm() / ref_out.norm().clamp_min(1e-30)
    assert err < rtol, f"relative error {err:.2e}"
    assert (out[~live] == 0).all()


def make(scheme="aura4v2", B=2, Hkv=2, cap=96, S=4, W=8, **kw):
    return Oracle(ta.AuraCache(scheme, batch=B, kv_heads=Hkv, head_dim=D, capacity=cap,
                               sink_tokens=S, recent_tokens=W, **kw))


def rand(g, *shape):
    return torch.randn(*shape, generator=g)


@pytest.mark.parametrize("S,W", [(4, 8), (0, 8), (4, 0), (1, 1), (3, 5), (16, 32)])
@pytest.mark.parametrize("T", [0, 1, 3, 11, 37])
def test_decode_matches_exact_sinks_window_and_dequantized_middle(S, W, T):
    g = torch.Generator().manual_seed(S * 100 + W * 10 + T)
    o = make("aura3v2", B=2, Hkv=3, cap=T + 12, S=S, W=W)
    if T:
        o.append(rand(g, 2, T, 3, D), rand(g, 2, T, 3, D))
    check(o, rand(g, 2, 6, D))  # Hq = 6: two query heads per KV head
    for step in range(10):  # through the window's wrap-around
        o.append(rand(g, 2, 3, D), rand(g, 2, 3, D))
        if step % 3 == 0:
            check(o, rand(g, 2, 6, D), scale=0.3)
    check(o, rand(g, 2, 6, D))
    check(o, rand(g, 2, 2, 6, D))  # causal L = 2


@pytest.mark.parametrize("L", [1, 3, 8, 13])
def test_causal_chunk_longer_and_shorter_than_the_window(L):
    g = torch.Generator().manual_seed(L)
    o = make("aura4", B=2, Hkv=1, cap=80, S=2, W=6)
    o.append(rand(g, 2, 20, 1, D), rand(g, 2, 20, 1, D))
    o.append(rand(g, 2, L, 1, D), rand(g, 2, L, 1, D))
    check(o, rand(g, 2, L, 4, D))


def test_causal_chunk_at_the_start_sees_nothing_before_itself():
    g = torch.Generator().manual_seed(5)
    o = make(B=1, Hkv=1, cap=32, S=3, W=4)
    o.append(rand(g, 1, 9, 1, D), rand(g, 1, 9, 1, D))
    check(o, rand(g, 1, 9, 2, D))  # every query of the prefill, causal over sinks, middle, window


@pytest.mark.parametrize("left_padded", [False, True])
def test_ragged_chunks(left_padded):
    g = torch.Generator().manual_seed(7)
    o = make("aura4v2", B=3, Hkv=2, cap=64, S=3, W=5)
    o.append(rand(g, 3, 9, 2, D), rand(g, 3, 9, 2, D), torch.tensor([9, 0, 4]), left_padded)
    check(o, rand(g, 3, 4, D))
    o.append(rand(g, 3, 7, 2, D), rand(g, 3, 7, 2, D), torch.tensor([2, 7, 1]), left_padded)
    for _ in range(4):
        o.append(rand(g, 3, 2, D), rand(g, 3, 2, D))
    check(o, rand(g, 3, 4, D))


def test_crop_keeps_exactness_and_next_appends_refill_the_window():
    g = torch.Generator().manual_seed(8)
    o = make(B=2, Hkv=2, cap=64, S=2, W=6)
    o.append(rand(g, 2, 20, 2, D), rand(g, 2, 20, 2, D))
    for n in (3, 10, 1):  # within the window, past it (middle tokens become the window), one
        o.crop(n)
        check(o, rand(g, 2, 4, D))
        o.append(rand(g, 2, 2, 2, D), rand(g, 2, 2, 2, D))
        check(o, rand(g, 2, 4, D))
    o.crop(100)  # to empty: nothing left, then start again
    check(o, rand(g, 2, 4, D))
    o.append(rand(g, 2, 9, 2, D), rand(g, 2, 9, 2, D))
    check(o, rand(g, 2, 4, D))


def test_select_rows_grow_reset():
    g = torch.Generator().manual_seed(9)
    o = make(B=2, Hkv=1, cap=16, S=2, W=3)
    o.append(rand(g, 2, 11, 1, D), rand(g, 2, 11, 1, D), torch.tensor([11, 4]))
    o.select(torch.tensor([1, 0, 0]))
    check(o, rand(g, 3, 2, D))
    o.c.grow(40)
    for _ in range(12):
        o.append(rand(g, 3, 1, D), rand(g, 3, 1, D))
    check(o, rand(g, 3, 2, D))
    o.c.reset()
    o.k, o.v, o.rs = [[] for _ in range(3)], [[] for _ in range(3)], [o.S] * 3
    check(o, rand(g, 3, 2, D))
    o.append(rand(g, 3, 5, 1, D), rand(g, 3, 5, 1, D))
    check(o, rand(g, 3, 2, D))


def test_window_is_exact_where_the_plain_cache_is_not():
    """A query that matches one recent token: with W it is attended exactly, without it is not."""
    g = torch.Generator().manual_seed(10)
    k, v = rand(g, 1, 40, 1, D), rand(g, 1, 40, 1, D)
    q = 8 * k[:, -1, :, :] / k[:, -1].norm()  # peaked on the last token
    outs = []
    for S, W in ((0, 0), (0, 4)):
        c = ta.AuraCache("aura2", batch=1, kv_heads=1, head_dim=D, capacity=40, sink_tokens=S, recent_tokens=W)
        c.append(k, v)
        outs.append(c.decode(q)[0])
    exact = Oracle(make(B=1, Hkv=1, cap=40, S=40, W=0).c)
    exact.append(k, v)
    ref = exact.attend(q)[0].float()
    assert (outs[1] - ref).norm() < 0.05 * (outs[0] - ref).norm()


def test_bf16_exact_tokens_keep_the_model_dtype():
    g = torch.Generator().manual_seed(11)
    o = make(B=1, Hkv=2, cap=32, S=2, W=4)
    k, v = rand(g, 1, 12, 2, D).bfloat16(), rand(g, 1, 12, 2, D).bfloat16()
    o.append(k, v)
    assert o.c.k_exact.dtype == torch.bfloat16
    q = rand(g, 1, 4, D).bfloat16()
    out, _ = o.c.decode(q)
    ref, _ = o.attend(q)
    assert out.dtype == torch.bfloat16 and (out.double() - ref).norm() / ref.norm() < 1e-2
    o.c.reset()
    c = o.c
    held = (c.k_codes, c.k_norms, c.v_codes, c.v_norms, c.k_exact, c.v_exact)
    assert c.memory_bytes() == sum(t.numel() * t.element_size() for t in held)
    assert c.k_exact.shape == (1, 2 + 4 + 1, 2, D) and c.k_codes.shape[2] == 32 - 2


def test_bad_window_arguments_raise_named_errors():
    with pytest.raises(ValueError, match="sink_tokens"):
        ta.AuraCache(batch=1, kv_heads=1, head_dim=D, capacity=8, sink_tokens=-1)
    with pytest.raises(ValueError, match="recent_tokens"):
        ta.AuraCache(batch=1, kv_heads=1, head_dim=D, capacity=8, recent_tokens=1.5)
    with pytest.raises(ValueError, match="sink_tokens.*paged"):
        ta.AuraCache(batch=1, kv_heads=1, head_dim=D, num_blocks=4, page_size=4,
                     block_table=torch.zeros(1, 2, dtype=torch.int32), recent_tokens=4)


def test_compiled_decode_step_fullgraph_matches_eager():
    g = torch.Generator().manual_seed(12)
    eager, compiled = (make(B=2, Hkv=2, cap=48, S=2, W=5, dtype=torch.float32) for _ in range(2))
    k, v = rand(g, 2, 9, 2, D), rand(g, 2, 9, 2, D)
    eager.append(k, v)
    compiled.append(k, v)
    # 8 steps: through the ring's wrap-around, one trace
    assert_compiled_steps_match_eager(compiled.c, eager.append, eager.c.decode, g, 8, B=2, Hkv=2, Hq=4, D=D)
    compiled.k, compiled.v, compiled.rs = eager.k, eager.v, eager.rs
    check(compiled, rand(g, 2, 4, D))
