"""AURA on the CPU in C++ (``csrc/cpu/aura.cpp`` through ``native``): the encode, rotation, pass 1
and pass 2 of ``torch_aura.reference.aura`` with the same signatures, data checks and results up to
fp32 rounding (pass 1 sums over tokens tile by tile with an online softmax; the rotation and the
merge follow the reference's order of operations; a code may differ by one where y sits within
rounding of a boundary). ``aura_decode`` and ``aura_write_cache`` are the reference's own plans
(``decode_with``, ``write_cache_with``) over these kernels.

Why native: the reference unpacks every code into int64 tensors and runs ~90 small tensor ops per
decode; here codes are expanded a tile at a time through a byte table and stay in cache.
"""

from __future__ import annotations

import torch

from ..reference import aura as ref
from . import native


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32).contiguous()


def aura_encode(x, codebook, boundaries, bits, sign_mask=None):
    return native.encode(_f32(x), sign_mask, _f32(codebook), _f32(boundaries), bits)


def aura_write_cache(x, codes_cache, norms_cache, slot_mapping, codebook, boundaries, bits,
                     sign_mask=None, paged=False):
    return ref.write_cache_with(NATIVE, x, codes_cache, norms_cache, slot_mapping, codebook,
                                boundaries, bits, sign_mask, paged)


def hadamard_rotate(x, sign_mask=None, scale=1.0, inverse=False):
    # the kernel works in place on its own contiguous copy (one copy whatever x's strides)
    y = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    native.rotate_(y, sign_mask, float(scale) / x.shape[-1] ** 0.5, inverse)
    return y.to(x.dtype)


def aura_flash_p1(q_rot, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook,
                  key_bits, value_bits, block_table=None, block_size=64):
    causal = q_rot.dim() == 4
    q = _f32(q_rot if causal else q_rot[:, None])
    B, L, Hq, D = q.shape
    geo = ref.cache_geometry(k_codes, block_table)
    ref._check_seq_lens(seq_lens, block_table, geo.capacity, geo.num_blocks, geo.page_size)
    NB = -(-geo.capacity // block_size)
    o = torch.empty(B, L, Hq, NB, D)
    m, l = torch.empty(B, L, Hq, NB), torch.empty(B, L, Hq, NB)
    if o.numel():
        native.flash_p1(q, k_codes, k_norms, v_codes, v_norms, seq_lens.contiguous(), _f32(k_codebook),
                        _f32(v_codebook), key_bits, value_bits, block_table, geo, block_size, o, m, l)
    if not causal:
        o, m, l = o[:, 0], m[:, 0], l[:, 0]
    return o, m, l


def aura_flash_p2(o, m, l, v_sign_mask=None, out_dtype=None):
    out, lse = native.flash_p2(_f32(o), _f32(m), _f32(l), v_sign_mask)
    return out.to(out_dtype or torch.float32), lse


def aura_decode(q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook,
                k_sign_mask, v_sign_mask, key_bits, value_bits, block_table=None, scale=None,
                num_splits=0):
    return ref.decode_with(NATIVE, q, k_codes, k_norms, v_codes, v_norms, seq_lens,
                           k_codebook, v_codebook, k_sign_mask, v_sign_mask, key_bits, value_bits,
                           block_table, scale, num_splits)


# this module's native kernels, handed to the reference's plans (aura_decode, aura_write_cache above)
NATIVE = ref.Kernels(aura_encode=aura_encode, hadamard_rotate=hadamard_rotate, aura_flash_p1=aura_flash_p1,
                     aura_flash_p2=aura_flash_p2)
