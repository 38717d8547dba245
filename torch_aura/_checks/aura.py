"""Input checks and output specs of the aura family (see common.py for the rules)."""

from __future__ import annotations

from . import common as c


def hadamard_rotate(x, sign_mask=None, scale=1.0, inverse=False) -> list[c.TensorSpec]:
    raise NotImplementedError("hadamard_rotate: checks not written yet")


def aura_encode(x, codebook, boundaries, bits, sign_mask=None) -> list[c.TensorSpec]:
    raise NotImplementedError("aura_encode: checks not written yet")


def aura_write_cache(x, codes_cache, norms_cache, slot_mapping, codebook, boundaries, bits, sign_mask=None, paged=False) -> list[c.TensorSpec]:
    raise NotImplementedError("aura_write_cache: checks not written yet")


def aura_dequantize(codes, norms, codebook, bits, sign_mask=None, out_dtype=None) -> list[c.TensorSpec]:
    raise NotImplementedError("aura_dequantize: checks not written yet")


def aura_flash_p1(q_rot, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook, key_bits, value_bits, block_table=None, block_size=64) -> list[c.TensorSpec]:
    raise NotImplementedError("aura_flash_p1: checks not written yet")


def aura_flash_p2(o, m, l, v_sign_mask=None, out_dtype=None) -> list[c.TensorSpec]:
    raise NotImplementedError("aura_flash_p2: checks not written yet")


def aura_decode(q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook, k_sign_mask, v_sign_mask, key_bits, value_bits, block_table=None, scale=None, num_splits=0) -> list[c.TensorSpec]:
    raise NotImplementedError("aura_decode: checks not written yet")
