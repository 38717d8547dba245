"""Sample inputs for the aura family ops (see __init__.py).

Tiny, odd-sized where the format allows (D is fixed to {64, ..., 512}, so the odd sizes are batch,
heads, T_cap, page size, block size, L), with non-contiguous views of unit last stride, both cache
layouts, causal queries with p_i < 0, empty sequences and the optional arguments.
"""

from __future__ import annotations

import torch

from torch_aura.reference import aura as R

from . import Sample

_G = torch.Generator().manual_seed(1234)


def _randn(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, generator=_G).to(dtype=dtype, device=device)


def _mask(D, kind="k", device="cpu", layer=0):
    return R.to_int32_bits(R.sign_mask_words(D, 0, layer, kind)).to(device)


def _cb(bits, D, device):
    return R.codebook(bits, D, device)


def _encoded_contiguous(B, Hkv, T_cap, D, bits, kind, device):
    cb, bd = _cb(bits, D, device)
    codes, norms = R.aura_encode(_randn(B, Hkv, T_cap, D, device=device), cb, bd, bits, _mask(D, kind, device))
    return codes, norms, cb


def _encoded_paged(num_blocks, page_size, Hkv, D, bits, kind, device):
    cb, bd = _cb(bits, D, device)
    codes, norms = R.aura_encode(_randn(num_blocks, page_size, Hkv, D, device=device), cb, bd, bits,
                                 _mask(D, kind, device))
    return codes, norms, cb


def hadamard_rotate(device):
    x_view = _randn(5, 3, 128, device=device).transpose(0, 1)  # [3, 5, 128], strides (128, 384, 1)
    return [
        Sample("x3x5-D64-fp32-mask", (_randn(3, 5, 64, device=device), _mask(64, device=device))),
        Sample("x3x5-D128-bf16-view-inverse-scale",
               (x_view.to(torch.bfloat16), _mask(128, "v", device), 0.5, True)),
        Sample("x2-D256-fp16-nomask", (_randn(2, 256, dtype=torch.float16, device=device),)),
    ]


def aura_encode(device):
    x = _randn(3, 5, 64, device=device)
    x[1, 2] = 0.0  # a zero row: codes 2^(b-1), norm 0
    x_view = _randn(2, 4, 128, device=device).transpose(0, 1)  # [4, 2, 128] non-contiguous
    cb4, bd4 = _cb(4, 64, device)
    cb3, bd3 = _cb(3, 128, device)
    cb8, bd8 = _cb(8, 64, device)
    return [
        Sample("x3x5-D64-b4-mask-zero-row", (x, cb4, bd4, 4, _mask(64, device=device))),
        Sample("x4x2-D128-b3-view", (x_view, cb3, bd3, 3, _mask(128, device=device))),
        Sample("x7-D64-b8-bf16-nomask", (_randn(7, 64, dtype=torch.bfloat16, device=device), cb8, bd8, 8)),
    ]


def aura_write_cache(device):
    out = []
    # Contiguous [B=2, Hkv=3, T_cap=9, PW], slots b*9 + t, one skipped row.
    cb, bd = _cb(4, 64, device)
    codes = torch.zeros(2, 3, 9, 8, dtype=torch.int32, device=device)
    norms = torch.zeros(2, 3, 9, device=device)
    slots = torch.tensor([0 * 9 + 4, -1, 1 * 9 + 8, 1 * 9 + 0, 0 * 9 + 7], device=device)
    out.append(Sample("N5-Hkv3-D64-b4-contig", (_randn(5, 3, 64, device=device), codes, norms, slots,
                                                   cb, bd, 4, _mask(64, device=device))))
    # Contiguous caches as views of one vLLM-style (2, B, Hkv, T, PW) buffer: non-contiguous.
    cb3, bd3 = _cb(3, 128, device)
    kv_codes = torch.zeros(2, 1, 2, 11, 12, dtype=torch.int32, device=device)
    kv_norms = torch.zeros(2, 1, 2, 11, device=device)
    x = _randn(3, 3, 128, device=device)[:, :2]  # [3, 2, 128] sliced view
    out.append(Sample("N3-Hkv2-D128-b3-cacheview", (x, kv_codes[1], kv_norms[1],
                                                       torch.tensor([10, 3, -5], device=device),
                                                       cb3, bd3, 3, _mask(128, "v", device))))
    # Paged [num_blocks=5, page_size=3, Hkv=2, PW], slots page*3 + offset.
    cb2, bd2 = _cb(2, 64, device)
    pcodes = torch.zeros(5, 3, 2, 4, dtype=torch.int32, device=device)
    pnorms = torch.zeros(5, 3, 2, device=device)
    out.append(Sample("N4-Hkv2-D64-b2-paged-p3", (_randn(4, 2, 64, dtype=torch.float16, device=device),
                                                     pcodes, pnorms,
                                                     torch.tensor([4 * 3 + 2, 0, -1, 2 * 3 + 1], device=device),
                                                     cb2, bd2, 2, _mask(64, device=device), True)))
    return out


def aura_append(device):
    out = []
    # Contiguous, B=3, L=2, Hkv=2, T_cap=5, D=64, K 4 bits V 2: row 1 fills its last slot (one token
    # skipped), row 2 is full (both skipped, seq_lens still advances).
    kcb, kbd = _cb(4, 64, device)
    vcb, vbd = _cb(2, 64, device)
    kc, kn = torch.zeros(3, 2, 5, 8, dtype=torch.int32, device=device), torch.zeros(3, 2, 5, device=device)
    vc, vn = torch.zeros(3, 2, 5, 4, dtype=torch.int32, device=device), torch.zeros(3, 2, 5, device=device)
    seq = torch.tensor([0, 4, 5], dtype=torch.int32, device=device)
    out.append(Sample("B3-L2-Hkv2-T5-D64-k4v2-contig-overflow",
                      (_randn(3, 2, 2, 64, device=device), _randn(3, 2, 2, 64, device=device), kc, kn, vc, vn, seq,
                       kcb, kbd, vcb, vbd, 4, 2, _mask(64, "k", device), _mask(64, "v", device))))
    # k, v as token-major views of one fused qkv-style buffer (non-contiguous, unit last stride),
    # caches as views of one (2, B, Hkv, T, PW) buffer; bf16; no sign masks.
    cb3, bd3 = _cb(3, 128, device)
    cb8, bd8 = _cb(8, 128, device)
    kv = _randn(2, 1, 3, 2, 128, dtype=torch.bfloat16, device=device)  # [B, 1, 3, Hkv, D]: k, v = token slices 0, 1
    kcodes = torch.zeros(2, 2, 2, 7, 12, dtype=torch.int32, device=device)  # [B, 2, Hkv, T, PW]
    out.append(Sample("B2-L1-Hkv2-T7-D128-k3v8-bf16-views",
                      (kv[:, 0, :1], kv[:, 0, 1:2], kcodes[:, 1], torch.zeros(2, 2, 7, device=device),
                       torch.zeros(2, 2, 7, 32, dtype=torch.int32, device=device), torch.zeros(2, 2, 7, device=device),
                       torch.tensor([3, 6], dtype=torch.int32, device=device), cb3, bd3, cb8, bd8, 3, 8)))
    # Paged [num_blocks=6, page_size=3, Hkv=1, PW], shuffled table; row 1 crosses a page boundary,
    # row 0 runs past its two pages (capacity 6).
    pk = torch.zeros(6, 3, 1, 8, dtype=torch.int32, device=device)
    pv = torch.zeros(6, 3, 1, 8, dtype=torch.int32, device=device)
    table = torch.tensor([[4, 1], [0, 5]], dtype=torch.int32, device=device)
    out.append(Sample("B2-L3-Hkv1-D64-k4v4-fp16-paged-p3",
                      (_randn(2, 3, 1, 64, dtype=torch.float16, device=device),
                       _randn(2, 3, 1, 64, dtype=torch.float16, device=device), pk, torch.zeros(6, 3, 1, device=device),
                       pv, torch.zeros(6, 3, 1, device=device), torch.tensor([4, 2], dtype=torch.int32, device=device),
                       kcb, kbd, kcb, kbd, 4, 4, _mask(64, "k", device), _mask(64, "v", device), table)))
    return out


def aura_dequantize(device):
    cb4, _ = _cb(4, 64, device)
    codes, norms, _ = _encoded_contiguous(2, 3, 7, 64, 4, "k", device)
    cb8, _ = _cb(8, 128, device)
    codes8, norms8, _ = _encoded_contiguous(1, 2, 9, 128, 8, "v", device)
    return [
        Sample("B2-Hkv3-T7-D64-b4-rotated", (codes, norms, cb4, 4)),
        Sample("B1-Hkv2-T5of9-D128-b8-view-mask-bf16",
               (codes8[:, :, 2:7], norms8[:, :, 2:7], cb8, 8, _mask(128, "v", device), torch.bfloat16)),
    ]


def _p1_contig(device, causal):
    B, Hq, Hkv, T_cap, D, kb, vb = 2, 6, 2, 13, 64, 4, 2
    kc, kn, kcb = _encoded_contiguous(B, Hkv, T_cap, D, kb, "k", device)
    vc, vn, vcb = _encoded_contiguous(B, Hkv, T_cap, D, vb, "v", device)
    if causal:  # seq 1 has 2 tokens for L = 3 queries: p_0 = -1 sees nothing
        q = _randn(B, 3, Hq, D, device=device)
        seq = torch.tensor([11, 2], dtype=torch.int32, device=device)
    else:  # q as a transposed view with unit last stride
        q = _randn(Hq, B, D, device=device).transpose(0, 1)
        seq = torch.tensor([13, 5], dtype=torch.int32, device=device)
    return q, kc, kn, vc, vn, seq, kcb, vcb, kb, vb


def _p1_paged(device):
    B, Hq, Hkv, D, kb, vb, nblk, ps = 2, 3, 1, 128, 3, 8, 7, 3
    kc, kn, kcb = _encoded_paged(nblk, ps, Hkv, D, kb, "k", device)
    vc, vn, vcb = _encoded_paged(nblk, ps, Hkv, D, vb, "v", device)
    # Sequence 0 uses pages 5, 0, 3, 6; sequence 1 pages 2, 4 then garbage (-1: never read).
    table = torch.tensor([[5, 0, 3, 6], [2, 4, -1, -1]], dtype=torch.int32, device=device)
    seq = torch.tensor([11, 4], dtype=torch.int32, device=device)
    q = _randn(B, Hq, D, device=device)
    return q, kc, kn, vc, vn, seq, kcb, vcb, kb, vb, table


def aura_flash_p1(device):
    return [
        Sample("B2-Hq6-Hkv2-T13-D64-k4v2-bs4-view", (*_p1_contig(device, False), None, 4)),
        Sample("B2-L3-Hq6-Hkv2-T13-D64-k4v2-causal-bs5", (*_p1_contig(device, True), None, 5)),
        Sample("B2-Hq3-Hkv1-D128-k3v8-paged-p3-bs6", (*_p1_paged(device), 6)),
    ]


def aura_flash_p2(device):
    o, m, l = R.aura_flash_p1(*_p1_contig(device, False), None, 4)
    oc, mc, lc = R.aura_flash_p1(*_p1_contig(device, True), None, 5)
    # Poison the empty blocks' partials: pass 2 must skip them, not multiply them by 0.
    oc = torch.where((lc == 0)[..., None], torch.full_like(oc, float("nan")), oc)
    mc = torch.where(lc == 0, torch.full_like(mc, float("nan")), mc)
    return [
        Sample("B2-Hq6-NB4-D64-rotated", (o, m, l)),
        Sample("B2-Hq6-NB4-D64-unrotate-fp16", (o, m, l, _mask(64, "v", device), torch.float16)),
        Sample("B2-L3-Hq6-NB3-D64-causal-poisoned", (oc, mc, lc, _mask(64, "v", device))),
    ]


def aura_decode(device):
    q, kc, kn, vc, vn, seq, kcb, vcb, kb, vb = _p1_contig(device, False)
    qc, *rest = _p1_contig(device, True)
    qp, pkc, pkn, pvc, pvn, pseq, pkcb, pvcb, pkb, pvb, table = _p1_paged(device)
    km, vm = _mask(64, "k", device), _mask(64, "v", device)
    km128, vm128 = _mask(128, "k", device), _mask(128, "v", device)
    return [
        Sample("B2-Hq6-Hkv2-T13-D64-aura4v2-view",
               (q, kc, kn, vc, vn, seq, kcb, vcb, km, vm, kb, vb)),
        Sample("B2-L3-Hq6-Hkv2-T13-D64-aura4v2-causal-bf16-splits3",
               (qc.to(torch.bfloat16), *rest[:7], km, vm, *rest[7:], None, 0.2, 3)),
        Sample("B2-Hq3-Hkv1-D128-aura3v8-paged-p3",
               (qp, pkc, pkn, pvc, pvn, pseq, pkcb, pvcb, km128, vm128, pkb, pvb, table)),
    ]


SAMPLES = {
    "hadamard_rotate": hadamard_rotate,
    "aura_encode": aura_encode,
    "aura_write_cache": aura_write_cache,
    "aura_append": aura_append,
    "aura_dequantize": aura_dequantize,
    "aura_flash_p1": aura_flash_p1,
    "aura_flash_p2": aura_flash_p2,
    "aura_decode": aura_decode,
}


# ------------------------------------------------------------------ aura_append: the equivalence grid
# Shared by tests/reference/test_aura_append.py (CPU) and tests/cuda/test_aura_cuda.py (the kernel):
# plain AuraCaches (one scheme, no window) and the path AuraCache.append takes without the fused op.
APPEND_BITS = (2, 3, 4, 8)


def append_cases():
    """``(id, dict)`` of the grid: every (key_bits, value_bits) pair x layout x L in (1, 2, 17), with
    B in (1, 3), Hkv in 1..8 and D in (64, 128, 256) cycling through it, so each value of each axis
    appears; ``"full"`` picks rows at capacity - 1 and capacity (some tokens skipped)."""
    out, n = [], 0
    for kb in APPEND_BITS:
        for vb in APPEND_BITS:
            for layout in ("contig", "paged"):
                for L in (1, 2, 17):
                    B, Hkv, D = (1, 3)[n % 2], 1 + n % 8, (64, 128, 256)[n % 3]
                    full = n % 4 == 3
                    out.append((f"k{kb}v{vb}-{layout}-L{L}-B{B}-Hkv{Hkv}-D{D}{'-full' if full else ''}",
                                dict(kb=kb, vb=vb, layout=layout, L=L, B=B, Hkv=Hkv, D=D, full=full, seed=n)))
                    n += 1
    return out


def append_cache(kb, vb, layout, L, B, Hkv, D, full, seed, device="cpu", **_):
    """A plain AuraCache with random tokens already in it and ``seq_lens`` set: random lengths that
    leave room for L more tokens, or (``full``) rows at capacity - 1 and capacity."""
    import torch_aura as ta

    g = torch.Generator().manual_seed(1000 + seed)
    page = 3 + seed % 4
    if layout == "paged":
        max_blocks = -(-(2 * L + 3) // page)
        n_blocks = B * max_blocks + 2  # spare pages; the table is a shuffled subset
        table = torch.randperm(n_blocks, generator=g)[: B * max_blocks].reshape(B, max_blocks).to(torch.int32)
        cache = ta.AuraCache(f"aura{kb}v{vb}", batch=B, kv_heads=Hkv, head_dim=D, num_blocks=n_blocks,
                             page_size=page, block_table=table.to(device), seed=seed, layer=seed % 3)
    else:
        cache = ta.AuraCache(f"aura{kb}v{vb}", batch=B, kv_heads=Hkv, head_dim=D, capacity=2 * L + 3 + seed % 5,
                             seed=seed, layer=seed % 3, device=device)
    cap = cache.capacity
    for t in (cache.k_codes, cache.v_codes):  # old contents: random words, must survive where not written
        t.copy_(torch.randint(-2**31, 2**31 - 1, t.shape, generator=g, dtype=torch.int64).to(torch.int32))
    for t in (cache.k_norms, cache.v_norms):
        t.copy_(torch.rand(t.shape, generator=g))
    if full:
        lens = torch.tensor([cap - 1, cap, max(cap - L - 1, 0)][:B] if B > 1 else [cap - 1])
    else:
        lens = torch.randint(0, cap - L + 1, (B,), generator=g)
    cache.seq_lens.copy_(lens.to(torch.int32))
    cache._appended = int(lens.max())  # the host bound append keeps
    return cache


def append_tokens(cache, L, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(2000 + seed)
    shape = (cache.batch, L, cache.kv_heads, cache.head_dim)
    return tuple(torch.randn(*shape, generator=g).to(dtype=dtype, device=cache.k_codes.device) for _ in range(2))


def unfused_append(cache, k, v, write=None) -> None:
    """AuraCache.append's plain-cache path without the fused op (aura_cache.py: slots from seq_lens,
    aura_write_cache of K and of V, ``seq_lens += L``), for any seq_lens. The slot append rejects
    (``n_slots``, a position past the capacity) is handed to the write as -1: the CUDA write kernel
    skips a slot >= n_slots, and -1 is the same skip where the CPU reference would raise on it.
    ``write``: the aura_write_cache to use (default: the op, whatever serves it on the device)."""
    write = write or torch.ops.aura.aura_write_cache.default
    B, L = k.shape[:2]
    slots = cache._slots(L, None, False)
    slots = torch.where(slots >= cache._n_slots, -1, slots)
    flat = (B * L, cache.kv_heads, cache.head_dim)
    write(k.reshape(flat), cache.k_codes, cache.k_norms, slots, cache.k_codebook, cache.k_boundaries, cache.key_bits,
          cache.k_sign_mask, cache.paged)
    write(v.reshape(flat), cache.v_codes, cache.v_norms, slots, cache.v_codebook, cache.v_boundaries,
          cache.value_bits, cache.v_sign_mask, cache.paged)
    cache.seq_lens += L


def fused_args(cache, k, v):
    """The arguments of aura_append for ``cache``."""
    return (k, v, cache.k_codes, cache.k_norms, cache.v_codes, cache.v_norms, cache.seq_lens, cache.k_codebook,
            cache.k_boundaries, cache.v_codebook, cache.v_boundaries, cache.key_bits, cache.value_bits,
            cache.k_sign_mask, cache.v_sign_mask, cache.block_table if cache.paged else None)


def cache_state(cache):
    return (cache.k_codes, cache.k_norms, cache.v_codes, cache.v_norms, cache.seq_lens)
