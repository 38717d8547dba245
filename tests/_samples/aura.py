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
    "aura_dequantize": aura_dequantize,
    "aura_flash_p1": aura_flash_p1,
    "aura_flash_p2": aura_flash_p2,
    "aura_decode": aura_decode,
}
