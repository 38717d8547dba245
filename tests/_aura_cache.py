"""An AURA-encoded K/V cache and the synthetic attention inputs of aura-format.md §11.7, for tests,
shared by tests/reference and tests/cuda.

The codes are encoded on the CPU by the reference; every token at or past its sequence's length is
poisoned (random codes, NaN norms) so a kernel that reads it fails; with ``page_size`` the codes
are scattered into a random permutation of pages (a few spare pages of garbage, the last page may
be partial) and table entries of pages with no live token point far out of range, since they must
never be dereferenced.
"""

from __future__ import annotations

import math

import torch

import torch_aura as ta
from torch_aura.reference import aura as R

from _util import assert_max_rel


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def synthetic_attention(seed: int, T: int, D: int = 128, n_q: int = 16):
    """fp64 ``(q [n_q, D], K [T, D], V [T, D])`` of aura-format.md §11.7: K_t = sigma * g_t + 0.5 with
    outlier channels (4 of them x 8), V ~ N(0, I), q = sigma * h rescaled so its logits q . K_t have
    std 2 over t."""
    g = generator(seed)
    z = torch.randn(D, generator=g, dtype=torch.float64)
    sigma = torch.exp(0.5 * z)
    sigma[torch.randperm(D, generator=g)[:4]] *= 8
    K = sigma * torch.randn(T, D, generator=g, dtype=torch.float64) + 0.5
    V = torch.randn(T, D, generator=g, dtype=torch.float64)
    q = sigma * torch.randn(n_q, D, generator=g, dtype=torch.float64)
    q = q * (2.0 / (q @ K.T).std(dim=-1, keepdim=True))
    return q, K, V


class EncodedCache:
    """Codes ``kc, kn, vc, vn`` (contiguous ``[B, Hkv, cap, *]`` or paged ``[num_blocks, page_size,
    Hkv, *]``), ``block_table`` (None when contiguous), ``seq_lens`` int32, the codebooks and sign
    masks, and ``clean``: the contiguous codes before poisoning, for oracles.

    ``randn(*shape, seed=...)`` draws the fp32 vectors that are encoded (each test tree keeps its
    own sampler, so its inputs do not change).
    """

    def __init__(self, B, Hkv, cap, D, kb, vb, seq_lens, page_size=None, seed=0, *, randn):
        self.B, self.Hkv, self.cap, self.D, self.kb, self.vb = B, Hkv, cap, D, kb, vb
        self.page_size = page_size
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
        self.k_mask, self.v_mask = ta.aura_sign_mask(D, seed, 0, "k"), ta.aura_sign_mask(D, seed, 0, "v")
        self.k_cb, k_bd = ta.aura_codebook(kb, D)
        self.v_cb, v_bd = ta.aura_codebook(vb, D)
        kc, kn = R.aura_encode(randn(B, Hkv, cap, D, seed=seed + 1), self.k_cb, k_bd, kb, self.k_mask)
        vc, vn = R.aura_encode(randn(B, Hkv, cap, D, seed=seed + 2), self.v_cb, v_bd, vb, self.v_mask)
        self.clean = tuple(t.clone() for t in (kc, kn, vc, vn))
        dead = (torch.arange(cap)[None, :] >= self.seq_lens[:, None].long())[:, None, :].expand(B, Hkv, cap)
        g = generator(seed + 3)
        for c, n in ((kc, kn), (vc, vn)):
            c[dead] = torch.randint(-2**31, 2**31 - 1, (int(dead.sum()), c.shape[-1]), generator=g).to(torch.int32)
            n[dead] = float("nan")
        self.block_table = None
        if page_size is not None:
            (kc, kn), (vc, vn) = self._paged(((kc, kn), (vc, vn)), page_size, g)
        self.kc, self.kn, self.vc, self.vn = kc, kn, vc, vn

    def _paged(self, pairs, page_size, g):
        B, Hkv, cap = self.B, self.Hkv, self.cap
        max_blocks = -(-cap // page_size)
        num_blocks = B * max_blocks + 3  # a few spare pages full of garbage
        table = torch.randperm(num_blocks, generator=g)[: B * max_blocks].reshape(B, max_blocks).to(torch.int32)
        pages = []
        for c, n in pairs:
            pc = torch.randint(-2**31, 2**31 - 1, (num_blocks, page_size, Hkv, c.shape[-1]), generator=g).to(torch.int32)
            pn = torch.full((num_blocks, page_size, Hkv), float("nan"))
            for b in range(B):
                for j in range(max_blocks):
                    rows = slice(j * page_size, min((j + 1) * page_size, cap))
                    pc[table[b, j], : rows.stop - rows.start] = c[b, :, rows].transpose(0, 1)
                    pn[table[b, j], : rows.stop - rows.start] = n[b, :, rows].transpose(0, 1)
            pages.append((pc, pn))
        live = torch.arange(max_blocks)[None, :] * page_size < self.seq_lens[:, None].long()
        table[~live] = 10**6  # pages with no live token are never dereferenced
        self.block_table = table
        return pages


def check_non_finite_propagation(device):
    """A NaN in one token's K (an Inf in V) makes the rows that read it NaN, in aura_decode as in
    flash_decode; other sequences, and the same one before the token arrives, stay finite."""
    B, Hkv, Hq, D, T = 2, 2, 4, 64, 12
    g = torch.Generator().manual_seed(0)
    k = torch.randn(B, Hkv, T, D, generator=g)
    v = torch.randn(B, Hkv, T, D, generator=g)
    k[0, 1, 5, 3] = float("nan")
    v[0, 0, 7, 0] = float("inf")
    q = torch.randn(B, Hq, D, generator=g)
    k, v, q = k.to(device), v.to(device), q.to(device)
    cache = ta.AuraCache("aura8", batch=B, kv_heads=Hkv, head_dim=D, capacity=T, device=device)
    cache.append(k.transpose(1, 2), v.transpose(1, 2))
    for seq, expect_nan in ((5, False), (T, True)):  # token 5 (NaN K) is the 6th: unseen at seq 5
        seq_lens = torch.tensor([seq, T], dtype=torch.int32, device=device)
        cache.seq_lens.copy_(seq_lens)
        dense, _ = ta.flash_decode(q, k, v, seq_lens)
        out, _ = cache.decode(q)
        for name, o in (("flash_decode", dense), ("aura_decode", out)):
            assert bool(o[0].isnan().any()) == expect_nan, name
            assert bool(torch.isfinite(o[1]).all()), name


def check_codes_near_boundaries(x, codes, norms, ref_codes, ref_norms, bits, mask):
    """Equal codes except where y_j is within 1e-5/sqrt(D) of a boundary, and there by one index;
    norms equal to the reference's, or (rows with a flipped code) to |x| / |c_hat| of their codes."""
    D = x.shape[-1]
    idx, ref_idx = R.unpack_codes(codes, bits, D), R.unpack_codes(ref_codes, bits, D)
    xf = x.float()
    r = xf.norm(dim=-1, keepdim=True)
    y = R.hadamard_rotate(torch.where(r > 0, xf / r.clamp_min(1e-30), 0.0), mask)
    cb, bd = ta.aura_codebook(bits, D)
    gap = (y[..., None] - bd).abs().amin(-1)
    diff = idx != ref_idx
    assert bool((gap[diff] <= 1e-5 / math.sqrt(D)).all()), "a code differs away from a boundary"
    assert bool(((idx - ref_idx).abs() <= 1).all())
    finite = torch.isfinite(ref_norms)  # NaN/Inf rows: NaN norm on both sides (propagation)
    assert torch.equal(norms.isnan(), ~finite), "non-finite rows must get NaN norms, finite rows finite ones"
    same = ~diff.any(-1) & finite
    assert_max_rel("norms (equal codes)", norms[same], ref_norms[same], 1e-5)
    # A row with a flipped code keeps |x| through its own codes: norm = |x| / |c_hat(own codes)|.
    flipped = diff.any(-1) & finite
    own = r[..., 0] / cb[idx].norm(dim=-1)
    assert_max_rel("norms (flipped codes)", norms[flipped], own[flipped], 1e-5)


def assert_compiled_steps_match_eager(compiled_cache, eager_append, eager_decode, g, steps, B, Hkv, Hq, D):
    """``steps`` append-one-token-then-decode steps of ``compiled_cache`` through one
    ``torch.compile(fullgraph=True)`` trace equal the same steps run eagerly through ``eager_append`` /
    ``eager_decode`` (a second cache fed the same tokens)."""

    def step(cache, k1, v1, q):
        cache.append(k1, v1)
        return cache.decode(q)

    fn = torch.compile(step, fullgraph=True, backend="eager")
    for _ in range(steps):
        k1, v1, q = (torch.randn(B, Hkv, D, generator=g), torch.randn(B, Hkv, D, generator=g),
                     torch.randn(B, Hq, D, generator=g))
        eager_append(k1, v1)
        want = eager_decode(q)
        got = fn(compiled_cache, k1, v1, q)
        assert torch.allclose(got[0], want[0], atol=1e-6) and torch.allclose(got[1], want[1], atol=1e-6)
