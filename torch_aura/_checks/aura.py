"""Input checks and output specs of the aura family (see common.py for the rules).

Metadata only: these run on FakeTensors with symbolic sizes under ``torch.compile``, so sizes are
compared with ``==`` / membership tests, never bit tricks. Data-dependent errors (slot indices,
``seq_lens`` against the cache length, page indices) are raised by the reference.
"""

from __future__ import annotations

import torch

from .._limits import AURA_BITS as BITS, AURA_HEAD_DIMS as HEAD_DIMS  # noqa: F401 (re-exported)
from . import common as c

CODES = (torch.int32,)  # uint32 bit patterns in int32 (torch's uint32 lacks shifts on some backends)
NORMS = (torch.float32,)  # bf16 norms would put ~0.4% error on every logit (§7)


def packed_words(D, bits):
    """PW = D * bits / 32 int32 words per vector (exact: D is a multiple of 64)."""
    return D * bits // 32


def _head_dim(D, where: str) -> None:
    if D not in HEAD_DIMS:
        c.fail("head_dim", f"one of {list(HEAD_DIMS)}", f"{D} ({where})")


def _is_int(v) -> bool:
    # SymInt too: under dynamic-shape tracing int arguments may arrive symbolic.
    return isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool)


def _bits(arg: str, bits) -> None:
    if not _is_int(bits):
        c.fail(arg, f"an int in {list(BITS)}", type(bits).__name__)
    c.one_of(arg, bits, BITS)


def _vectors(arg: str, t, dtypes, **kw) -> torch.Tensor:
    """A tensor of rank >= 1 (any leading dims before the vector dim)."""
    c.tensor(arg, t, dtypes=dtypes, **kw)
    if t.dim() < 1:
        c.fail(arg, "a tensor of rank >= 1 ([..., D])", f"shape {tuple(t.shape)}")
    return t


def _sign_mask(arg: str, mask, D) -> None:
    if mask is None:
        return
    c.tensor(arg, mask, ndim=1, dtypes=(torch.int32,))
    c.dim(arg, mask, 0, D // 32, "head_dim // 32 words")


def _codebook(arg: str, cb, bits) -> None:
    c.tensor(arg, cb, ndim=1, dtypes=(torch.float32,))
    c.dim(arg, cb, 0, 2 ** bits, f"2**{bits} entries for {bits}-bit codes")


def _boundaries(arg: str, bd, bits) -> None:
    c.tensor(arg, bd, ndim=1, dtypes=(torch.float32,))
    c.dim(arg, bd, 0, 2 ** bits - 1, f"2**{bits} - 1 entries for {bits}-bit codes")


def _out_dtype(out_dtype) -> None:
    if out_dtype is not None and out_dtype not in c.FLOATS:
        c.fail("out_dtype", "None or float32 / float16 / bfloat16", out_dtype)


def _head_dim_of_codes(codes, bits) -> int:
    """D from PW words of ``bits``-bit codes; PW must be one of the §6 table's entries."""
    PW = codes.shape[-1]
    allowed = [packed_words(D, bits) for D in HEAD_DIMS]
    if PW not in allowed:
        c.fail("codes.shape[-1]", f"one of {allowed} words ({bits}-bit codes for head_dim in "
               f"{list(HEAD_DIMS)})", PW)
    return PW * 32 // bits


# ------------------------------------------------------------------------------------------ ops
def hadamard_rotate(x, sign_mask=None, scale=1.0, inverse=False) -> list[c.TensorSpec]:
    _vectors("x", x, c.FLOATS, unit_last_stride=True)
    D = x.shape[-1]
    _head_dim(D, "x.shape[-1]")
    _sign_mask("sign_mask", sign_mask, D)
    c.same_device(x=x, sign_mask=sign_mask)
    return [c.TensorSpec(tuple(x.shape), x.dtype, x.device)]


def aura_encode(x, codebook, boundaries, bits, sign_mask=None) -> list[c.TensorSpec]:
    _vectors("x", x, c.FLOATS, unit_last_stride=True)
    D = x.shape[-1]
    _head_dim(D, "x.shape[-1]")
    _bits("bits", bits)
    _codebook("codebook", codebook, bits)
    _boundaries("boundaries", boundaries, bits)
    _sign_mask("sign_mask", sign_mask, D)
    dev = c.same_device(x=x, codebook=codebook, boundaries=boundaries, sign_mask=sign_mask)
    lead = tuple(x.shape[:-1])
    return [c.TensorSpec(lead + (packed_words(D, bits),), torch.int32, dev),
            c.TensorSpec(lead, torch.float32, dev)]


def aura_write_cache(x, codes_cache, norms_cache, slot_mapping, codebook, boundaries, bits,
                     sign_mask=None, paged=False) -> list[c.TensorSpec]:
    c.tensor("x", x, ndim=3, dtypes=c.FLOATS, unit_last_stride=True)
    N, Hkv, D = x.shape
    _head_dim(D, "x.shape[-1]")
    _bits("bits", bits)
    PW = packed_words(D, bits)
    c.tensor("codes_cache", codes_cache, ndim=4, dtypes=CODES, unit_last_stride=True)
    c.tensor("norms_cache", norms_cache, ndim=3, dtypes=NORMS, unit_last_stride=True)
    if paged:  # [num_blocks, page_size, Hkv, PW], norms [num_blocks, page_size, Hkv]
        c.shape("codes_cache", codes_cache, [None, None, Hkv, PW], "paged [num_blocks, page_size, Hkv, PW]")
        c.shape("norms_cache", norms_cache, list(codes_cache.shape[:3]), "paged [num_blocks, page_size, Hkv]")
    else:  # [B, Hkv, T_cap, PW], norms [B, Hkv, T_cap]
        c.shape("codes_cache", codes_cache, [None, Hkv, None, PW], "contiguous [B, Hkv, T_cap, PW]")
        c.shape("norms_cache", norms_cache, list(codes_cache.shape[:3]), "contiguous [B, Hkv, T_cap]")
    c.tensor("slot_mapping", slot_mapping, ndim=1, dtypes=(torch.int64,))
    c.dim("slot_mapping", slot_mapping, 0, N, "one slot per row of x")
    _codebook("codebook", codebook, bits)
    _boundaries("boundaries", boundaries, bits)
    _sign_mask("sign_mask", sign_mask, D)
    c.same_device(x=x, codes_cache=codes_cache, norms_cache=norms_cache, slot_mapping=slot_mapping,
                  codebook=codebook, boundaries=boundaries, sign_mask=sign_mask)
    return []


def aura_append(k, v, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, k_boundaries, v_codebook,
                v_boundaries, key_bits, value_bits, k_sign_mask=None, v_sign_mask=None,
                block_table=None) -> list[c.TensorSpec]:
    c.tensor("k", k, ndim=4, dtypes=c.FLOATS, unit_last_stride=True)
    B, L, Hkv, D = k.shape
    c.tensor("v", v, ndim=4, dtypes=c.FLOATS, unit_last_stride=True)
    c.shape("v", v, [B, L, Hkv, D], "the shape of k [B, L, Hkv, D]")
    c.same_dtype(k=k, v=v)
    _head_dim(D, "k.shape[-1]")
    PWk, PWv = _cache_tensors(k_codes, k_norms, v_codes, v_norms, D, key_bits, value_bits)
    if block_table is None:  # contiguous [B, Hkv, T_cap, PW], norms [B, Hkv, T_cap]
        c.shape("k_codes", k_codes, [B, Hkv, None, PWk], "contiguous [B, Hkv, T_cap, PW = head_dim * key_bits / 32]")
        c.shape("v_codes", v_codes, [B, Hkv, k_codes.shape[2], PWv],
                "contiguous [B, Hkv, T_cap, PW = head_dim * value_bits / 32]")
    else:  # paged [num_blocks, page_size, Hkv, PW], block_table int32 [B, max_blocks]
        c.tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,))
        c.dim("block_table", block_table, 0, B, "batch of k")
        c.shape("k_codes", k_codes, [None, None, Hkv, PWk],
                "paged [num_blocks, page_size, Hkv, PW = head_dim * key_bits / 32]")
        c.shape("v_codes", v_codes, [k_codes.shape[0], k_codes.shape[1], Hkv, PWv],
                "paged [num_blocks, page_size, Hkv, PW = head_dim * value_bits / 32]")
    c.shape("k_norms", k_norms, list(k_codes.shape[:3]), "k_codes.shape[:3]")
    c.shape("v_norms", v_norms, list(k_codes.shape[:3]), "k_codes.shape[:3]")
    c.tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,))
    c.dim("seq_lens", seq_lens, 0, B, "batch of k")
    _codebook("k_codebook", k_codebook, key_bits)
    _boundaries("k_boundaries", k_boundaries, key_bits)
    _codebook("v_codebook", v_codebook, value_bits)
    _boundaries("v_boundaries", v_boundaries, value_bits)
    _sign_mask("k_sign_mask", k_sign_mask, D)
    _sign_mask("v_sign_mask", v_sign_mask, D)
    c.same_device(k=k, v=v, k_codes=k_codes, k_norms=k_norms, v_codes=v_codes, v_norms=v_norms,
                  seq_lens=seq_lens, k_codebook=k_codebook, k_boundaries=k_boundaries, v_codebook=v_codebook,
                  v_boundaries=v_boundaries, k_sign_mask=k_sign_mask, v_sign_mask=v_sign_mask,
                  block_table=block_table)
    return []


def aura_dequantize(codes, norms, codebook, bits, sign_mask=None, out_dtype=None) -> list[c.TensorSpec]:
    _vectors("codes", codes, CODES, unit_last_stride=True)
    _bits("bits", bits)
    D = _head_dim_of_codes(codes, bits)
    c.tensor("norms", norms, dtypes=NORMS)
    c.shape("norms", norms, list(codes.shape[:-1]), "codes.shape[:-1]")
    _codebook("codebook", codebook, bits)
    _sign_mask("sign_mask", sign_mask, D)
    _out_dtype(out_dtype)
    dev = c.same_device(codes=codes, norms=norms, codebook=codebook, sign_mask=sign_mask)
    return [c.TensorSpec(tuple(codes.shape[:-1]) + (D,), out_dtype or torch.float32, dev)]


def _cache_tensors(k_codes, k_norms, v_codes, v_norms, D, key_bits, value_bits) -> tuple[int, int]:
    """The bit widths and the four code / norm tensors' rank, dtype and unit last stride (their shapes
    depend on the layout: the callers check them); returns the packed words per K and V vector."""
    _bits("key_bits", key_bits)
    _bits("value_bits", value_bits)
    c.tensor("k_codes", k_codes, ndim=4, dtypes=CODES, unit_last_stride=True)
    c.tensor("v_codes", v_codes, ndim=4, dtypes=CODES, unit_last_stride=True)
    c.tensor("k_norms", k_norms, ndim=3, dtypes=NORMS, unit_last_stride=True)
    c.tensor("v_norms", v_norms, ndim=3, dtypes=NORMS, unit_last_stride=True)
    return packed_words(D, key_bits), packed_words(D, value_bits)


def _attention_inputs(q_name, q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook,
                      v_codebook, key_bits, value_bits, block_table):
    """Checks shared by pass 1 and aura_decode; returns (B, L or None, Hq, D, capacity, page_size)."""
    c.tensor(q_name, q, ndim=(3, 4), dtypes=c.FLOATS, unit_last_stride=True)
    B, Hq, D = q.shape[0], q.shape[-2], q.shape[-1]
    L = q.shape[1] if q.dim() == 4 else None
    _head_dim(D, f"{q_name}.shape[-1]")
    PWk, PWv = _cache_tensors(k_codes, k_norms, v_codes, v_norms, D, key_bits, value_bits)
    if block_table is None:  # contiguous [B, Hkv, T_cap, PW]
        c.dim("k_codes", k_codes, 0, B, f"batch of {q_name}")
        Hkv, capacity, page_size = k_codes.shape[1], k_codes.shape[2], None
        c.shape("k_codes", k_codes, [B, Hkv, capacity, PWk], "[B, Hkv, T_cap, PW = head_dim * key_bits / 32]")
        c.shape("v_codes", v_codes, [B, Hkv, capacity, PWv], "[B, Hkv, T_cap, PW = head_dim * value_bits / 32]")
    else:  # paged [num_blocks, page_size, Hkv, PW]
        c.tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,))
        c.dim("block_table", block_table, 0, B, f"batch of {q_name}")
        nb, page_size, Hkv = k_codes.shape[0], k_codes.shape[1], k_codes.shape[2]
        capacity = block_table.shape[1] * page_size
        c.shape("k_codes", k_codes, [nb, page_size, Hkv, PWk],
                "paged [num_blocks, page_size, Hkv, PW = head_dim * key_bits / 32]")
        c.shape("v_codes", v_codes, [nb, page_size, Hkv, PWv],
                "paged [num_blocks, page_size, Hkv, PW = head_dim * value_bits / 32]")
    c.shape("k_norms", k_norms, list(k_codes.shape[:3]), "k_codes.shape[:3]")
    c.shape("v_norms", v_norms, list(k_codes.shape[:3]), "k_codes.shape[:3]")
    c.divides(q_name, Hq, Hkv, "query heads", "KV heads")
    c.tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,))
    c.dim("seq_lens", seq_lens, 0, B, f"batch of {q_name}")
    _codebook("k_codebook", k_codebook, key_bits)
    _codebook("v_codebook", v_codebook, value_bits)
    return B, L, Hq, D, capacity, page_size


def _partials_specs(B, L, Hq, NB, D, dev):
    lead = (B, Hq) if L is None else (B, L, Hq)
    return [c.TensorSpec(lead + (NB, D), torch.float32, dev),
            c.TensorSpec(lead + (NB,), torch.float32, dev),
            c.TensorSpec(lead + (NB,), torch.float32, dev)]


def aura_flash_p1(q_rot, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook,
                  key_bits, value_bits, block_table=None, block_size=64) -> list[c.TensorSpec]:
    B, L, Hq, D, capacity, _ = _attention_inputs(
        "q_rot", q_rot, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook,
        key_bits, value_bits, block_table)
    if not _is_int(block_size) or block_size < 1:
        c.fail("block_size", "a positive int", block_size)
    dev = c.same_device(q_rot=q_rot, k_codes=k_codes, k_norms=k_norms, v_codes=v_codes,
                        v_norms=v_norms, seq_lens=seq_lens, k_codebook=k_codebook,
                        v_codebook=v_codebook, block_table=block_table)
    NB = (capacity + block_size - 1) // block_size  # static: never from seq_lens
    return _partials_specs(B, L, Hq, NB, D, dev)


def aura_flash_p2(o, m, l, v_sign_mask=None, out_dtype=None) -> list[c.TensorSpec]:
    c.tensor("o", o, ndim=(4, 5), dtypes=(torch.float32,), unit_last_stride=True)
    D = o.shape[-1]
    _head_dim(D, "o.shape[-1]")
    c.tensor("m", m, dtypes=(torch.float32,))
    c.shape("m", m, list(o.shape[:-1]), "o.shape[:-1]: [B, (L,) Hq, NB]")
    c.tensor("l", l, dtypes=(torch.float32,))
    c.shape("l", l, list(o.shape[:-1]), "o.shape[:-1]: [B, (L,) Hq, NB]")
    _sign_mask("v_sign_mask", v_sign_mask, D)
    _out_dtype(out_dtype)
    dev = c.same_device(o=o, m=m, l=l, v_sign_mask=v_sign_mask)
    lead = tuple(o.shape[:-2])
    return [c.TensorSpec(lead + (D,), out_dtype or torch.float32, dev),
            c.TensorSpec(lead, torch.float32, dev)]


def aura_decode(q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook,
                k_sign_mask, v_sign_mask, key_bits, value_bits, block_table=None, scale=None,
                num_splits=0) -> list[c.TensorSpec]:
    B, L, Hq, D, _, _ = _attention_inputs(
        "q", q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook,
        key_bits, value_bits, block_table)
    if k_sign_mask is None:
        c.fail("k_sign_mask", "an int32 tensor [head_dim // 32]", None)
    if v_sign_mask is None:
        c.fail("v_sign_mask", "an int32 tensor [head_dim // 32]", None)
    _sign_mask("k_sign_mask", k_sign_mask, D)
    _sign_mask("v_sign_mask", v_sign_mask, D)
    if not _is_int(num_splits) or num_splits < 0:
        c.fail("num_splits", "an int >= 0 (0 = choose from static values)", num_splits)
    dev = c.same_device(q=q, k_codes=k_codes, k_norms=k_norms, v_codes=v_codes, v_norms=v_norms,
                        seq_lens=seq_lens, k_codebook=k_codebook, v_codebook=v_codebook,
                        k_sign_mask=k_sign_mask, v_sign_mask=v_sign_mask, block_table=block_table)
    lead = (B, Hq) if L is None else (B, L, Hq)
    return [c.TensorSpec(lead + (D,), q.dtype, dev), c.TensorSpec(lead, torch.float32, dev)]
