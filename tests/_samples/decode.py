"""Sample inputs for the decode family ops (see __init__.py).

Tiny, odd-sized and awkward on purpose: GQA ratios 3 and 5, head dims 64/80/96, odd page sizes,
non-contiguous caches / block tables / outputs with unit last stride, a zero-length sequence, a
forced split count that actually splits (T > 512), NaN in the padding that must never be read.
Deterministic (fixed seeds): opcheck builds the same sample twice and compares.
"""

from __future__ import annotations

import math

import torch

from . import Sample


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(shape, dtype, device, g):
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype=dtype, device=device)


def _lens(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def _contiguous(device):
    """B3 Hq6 Hkv2 D64 fp32, T_cap 37, lengths 37 / 0 / 20, NaN in the padding."""
    g = _gen(0)
    q = _randn((3, 6, 64), torch.float32, device, g)
    k = _randn((3, 2, 37, 64), torch.float32, device, g)
    v = _randn((3, 2, 37, 64), torch.float32, device, g)
    k[2, :, 20:] = math.nan  # padding past seq_lens is never read
    v[2, :, 20:] = math.nan
    return q, k, v, _lens([37, 0, 20], device)


def _transposed(device):
    """B2 Hq5 Hkv1 D80 fp16; caches stored [B, T, Hkv, D] and viewed [B, Hkv, T, D]; q sliced."""
    g = _gen(1)
    q = _randn((2, 7, 80), torch.float16, device, g)[:, 1:6]  # non-contiguous rows
    k = _randn((2, 600, 1, 80), torch.float16, device, g).transpose(1, 2)
    v = _randn((2, 600, 1, 80), torch.float16, device, g).transpose(1, 2)
    return q, k, v, _lens([600, 519], device)


def _paged(device):
    """B3 Hq9 Hkv3 D96 bf16, page 5, permuted pages, block table a column slice of a wider one."""
    g = _gen(2)
    num_blocks, page, max_blocks = 11, 5, 3
    q = _randn((3, 9, 96), torch.bfloat16, device, g)
    k = _randn((num_blocks, page, 3, 96), torch.bfloat16, device, g)
    v = _randn((num_blocks, page, 3, 96), torch.bfloat16, device, g)
    perm = torch.randperm(num_blocks, generator=g)[: 3 * max_blocks].to(torch.int32).reshape(3, max_blocks)
    wide = torch.full((3, max_blocks + 2), -1, dtype=torch.int32)
    wide[:, 1 : 1 + max_blocks] = perm
    table = wide.to(device)[:, 1 : 1 + max_blocks]  # row stride 5, unit last stride
    lens = [13, 1, 5]
    table[1, 1:] = -1  # entries past the last used page are padding, never read
    return q, k, v, _lens(lens, device), table


def flash_decode_samples(device):
    q, k, v, lens = _contiguous(device)
    qt, kt, vt, lens_t = _transposed(device)
    qp, kp, vp, lens_p, table = _paged(device)
    return [
        Sample("B3-Hq6-Hkv2-D64-T37-fp32-contig", (q, k, v, lens, None, None, 0)),
        Sample("B2-Hq5-Hkv1-D80-T600-fp16-transposed-splits3", (qt, kt, vt, lens_t, None, 0.1, 3)),
        Sample("B3-Hq9-Hkv3-D96-page5-bf16-paged", (qp, kp, vp, lens_p, table, None, 0)),
    ]


def flash_decode_out_samples(device):
    q, k, v, lens = _contiguous(device)
    qp, kp, vp, lens_p, table = _paged(device)
    # out as a slice of a larger buffer (a serving engine's output rows): unit last stride only.
    out_buf = torch.zeros((3, 9, 96 + 32), dtype=torch.bfloat16, device=device)
    lse_buf = torch.zeros((9, 3), dtype=torch.float32, device=device)
    return [
        Sample("B3-Hq6-Hkv2-D64-T37-fp32-contig", (q, k, v, lens, None, None, 0,
                                                   torch.zeros((3, 6, 64), device=device),
                                                   torch.zeros((3, 6), device=device))),
        Sample("B3-Hq9-Hkv3-D96-page5-bf16-paged-strided-out",
               (qp, kp, vp, lens_p, table, 0.125, 2, out_buf[:, :, 16 : 16 + 96], lse_buf.t())),
    ]


def merge_attn_states_samples(device):
    g = _gen(3)
    inf = math.inf
    # S3 B2 Hq3 D64 fp32: split 1 of (0, 1) is empty and its partial holds NaN (must be skipped);
    # head (1, 2) has every split empty (out 0, lse -inf).
    po = _randn((3, 2, 3, 64), torch.float32, device, g)
    pl = _randn((3, 2, 3), torch.float32, device, g)
    po[1, 0, 1] = math.nan
    pl[1, 0, 1] = -inf
    pl[:, 1, 2] = -inf
    po[:, 1, 2] = math.nan
    # S5 B1 Hq7 D128 bf16, partials stored [B, Hq, S, D] and permuted to [S, B, Hq, D].
    po_t = _randn((1, 7, 5, 128), torch.bfloat16, device, g).permute(2, 0, 1, 3)
    pl_t = _randn((1, 7, 5), torch.float32, device, g).permute(2, 0, 1)
    # A single split (S = 1): the merge is the identity.
    po_1 = _randn((1, 3, 2, 80), torch.float32, device, g)
    pl_1 = _randn((1, 3, 2), torch.float32, device, g)
    return [
        Sample("S3-B2-Hq3-D64-fp32-nan-in-empty", (po, pl)),
        Sample("S5-B1-Hq7-D128-bf16-permuted", (po_t, pl_t)),
        Sample("S1-B3-Hq2-D80-fp32", (po_1, pl_1)),
    ]


SAMPLES = {
    "flash_decode": flash_decode_samples,
    "flash_decode_out": flash_decode_out_samples,
    "merge_attn_states": merge_attn_states_samples,
}
