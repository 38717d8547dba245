"""ctypes bridge to ``torch_aura._C_cpu`` (``csrc/cpu``): plain C entry points taking raw pointers.

The library has no torch headers, so it is independent of the torch version. Every tensor passed
here was made contiguous (or its strides passed) by the caller, sign masks by this module, and stays
alive for the call; ctypes releases the GIL while the C++ threads run.
"""

from __future__ import annotations

import ctypes
import importlib.util

import torch

from .. import _env

_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


class _P1Args(ctypes.Structure):
    """Field for field the ``P1Args`` struct of csrc/cpu/pass1_args.h (tests/build/test_pass1_struct.py)."""
    _fields_ = [
        ("q", _ptr), ("k_codes", _ptr), ("v_codes", _ptr), ("k_norms", _ptr), ("v_norms", _ptr),
        ("k_code_stride", _i64 * 3), ("v_code_stride", _i64 * 3),
        ("k_norm_stride", _i64 * 3), ("v_norm_stride", _i64 * 3),
        ("seq_lens", _ptr), ("block_table", _ptr), ("bt_stride", _i64 * 2),
        ("k_codebook", _ptr), ("v_codebook", _ptr), ("key_bits", _i64), ("value_bits", _i64),
        ("B", _i64), ("L", _i64), ("Hq", _i64), ("Hkv", _i64), ("D", _i64), ("capacity", _i64),
        ("page_size", _i64), ("block_size", _i64), ("num_blocks", _i64),
        ("o", _ptr), ("m", _ptr), ("l", _ptr), ("threads", _i64),
    ]


class _DecodeArgs(ctypes.Structure):
    """Field for field the ``DecodeArgs`` struct of csrc/cpu/decode.cpp (tests/build/test_pass1_struct.py)."""
    _fields_ = [
        ("q", _ptr), ("q_kind", _i64), ("q_stride", _i64 * 2), ("scale", ctypes.c_double),
        ("k", _ptr), ("v", _ptr), ("kind", _i64), ("k_stride", _i64 * 3), ("v_stride", _i64 * 3),
        ("seq_lens", _ptr), ("block_table", _ptr), ("bt_stride", _i64 * 2),
        ("B", _i64), ("Hq", _i64), ("Hkv", _i64), ("D", _i64), ("capacity", _i64), ("page_size", _i64),
        ("num_pages", _i64), ("out", _ptr), ("out_kind", _i64), ("out_stride", _i64 * 2),
        ("lse", _ptr), ("lse_stride", _i64 * 2), ("threads", _i64), ("portable", _i64), ("bad", _i64 * 2),
    ]


# False: dense decode runs pass1.h's portable item even where decode.cpp's AVX2 one could (the tests
# compare the two; TORCH_AURA_CPU_SIMD=0 sets it for a process).
SIMD = _env.get("TORCH_AURA_CPU_SIMD")

# pass1.h's RowKind of a dense cache's dtype
_ROW_KIND = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}


def _load():
    spec = importlib.util.find_spec("torch_aura._C_cpu")
    if spec is None or not spec.origin:
        return None, ("cpu extension not built (torch_aura._C_cpu missing: the install found no C++ "
                      "compiler or the build failed; see pip's log)")
    try:
        lib = ctypes.CDLL(spec.origin)
        lib.aura_cpu_flash_p1.argtypes = [ctypes.POINTER(_P1Args)]
        lib.aura_cpu_flash_p1.restype = ctypes.c_int
        lib.aura_cpu_rotate.argtypes = [_ptr, _i64, _i64, _ptr, ctypes.c_double, ctypes.c_int32]
        lib.aura_cpu_rotate.restype = ctypes.c_int
        lib.aura_cpu_flash_p2.argtypes = [_ptr, _ptr, _ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr, _i64]
        lib.aura_cpu_flash_p2.restype = ctypes.c_int
        lib.aura_cpu_encode.argtypes = [_ptr, _i64, _i64, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, _i64]
        lib.aura_cpu_encode.restype = ctypes.c_int
        lib.aura_cpu_flash_decode.argtypes = [ctypes.POINTER(_DecodeArgs)]
        lib.aura_cpu_flash_decode.restype = ctypes.c_int
    except (OSError, AttributeError) as e:
        return None, f"cpu extension failed to load: {type(e).__name__}: {e}"
    return lib, None


LIB, REASON = _load()


def flash_p1(q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook, key_bits,
             value_bits, block_table, geometry, block_size, o, m, l) -> None:
    """Fill ``o [B, L, Hq, NB, D]``, ``m``, ``l [B, L, Hq, NB]`` (fp32, contiguous) in place.

    ``q`` is fp32 contiguous ``[B, L, Hq, D]``, ``seq_lens`` int32 contiguous; codes int32 and
    norms fp32 (any strides, unit last stride for codes) in the contiguous ``[B, Hkv, T, .]`` or
    paged ``[pages, page_size, Hkv, .]`` layout, whose ``reference.aura.cache_geometry`` is
    ``geometry``; codebooks fp32 contiguous.
    """
    B, L, Hq, D = q.shape
    paged = block_table is not None
    a = _P1Args()
    a.q, a.k_codes, a.v_codes = q.data_ptr(), k_codes.data_ptr(), v_codes.data_ptr()
    a.k_norms, a.v_norms = k_norms.data_ptr(), v_norms.data_ptr()
    a.k_code_stride[:] = [s * 4 for s in k_codes.stride()[:3]]  # int32 words -> bytes
    a.v_code_stride[:] = [s * 4 for s in v_codes.stride()[:3]]
    a.k_norm_stride[:], a.v_norm_stride[:] = list(k_norms.stride()), list(v_norms.stride())
    a.seq_lens = seq_lens.data_ptr()
    a.block_table = block_table.data_ptr() if paged else None
    a.bt_stride[:] = list(block_table.stride()) if paged else [0, 0]
    a.k_codebook, a.v_codebook = k_codebook.data_ptr(), v_codebook.data_ptr()
    a.key_bits, a.value_bits = key_bits, value_bits
    a.B, a.L, a.Hq, a.Hkv, a.D, a.capacity = B, L, Hq, geometry.Hkv, D, geometry.capacity
    a.page_size, a.block_size, a.num_blocks = geometry.page_size, block_size, o.shape[3]
    a.o, a.m, a.l = o.data_ptr(), m.data_ptr(), l.data_ptr()
    a.threads = torch.get_num_threads()
    if LIB.aura_cpu_flash_p1(ctypes.byref(a)) != 0:
        raise RuntimeError("aura_flash_p1 (cpu): the native kernel could not start its threads")


def _contiguous(mask):
    """The int32 sign mask as the kernels read it (bound to a local by the caller, so the copy, if
    one was made, outlives the call that reads its pointer), or None."""
    return None if mask is None else mask.contiguous()


def _ptr_or_null(mask):
    return None if mask is None else mask.data_ptr()


def rotate_(x, sign_mask, factor: float, inverse: bool) -> None:
    """In place on fp32 contiguous ``x [..., D]``: the reference's hadamard_rotate arithmetic."""
    mask = _contiguous(sign_mask)
    if x.numel():
        LIB.aura_cpu_rotate(x.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], _ptr_or_null(mask),
                            factor, int(inverse))


def flash_p2(o, m, l, v_sign_mask):
    """``o [..., NB, D]``, ``m``, ``l [..., NB]`` fp32 contiguous -> (out fp32 [..., D], lse [...])."""
    lead, NB, D = o.shape[:-2], o.shape[-2], o.shape[-1]
    out = torch.empty(*lead, D)
    lse = torch.empty(lead)
    rows = lse.numel()
    if rows:
        mask = _contiguous(v_sign_mask)
        if LIB.aura_cpu_flash_p2(o.data_ptr(), m.data_ptr(), l.data_ptr(), rows, NB, D, _ptr_or_null(mask),
                                 out.data_ptr(), lse.data_ptr(), torch.get_num_threads()) != 0:
            raise RuntimeError("aura_flash_p2 (cpu): the native kernel could not start its threads")
    return out, lse


def encode(x, sign_mask, codebook, boundaries, bits: int):
    """fp32 contiguous ``x [..., D]`` -> (codes int32 [..., D * bits / 32], norms fp32 [...])."""
    D = x.shape[-1]
    codes = torch.empty(*x.shape[:-1], D * bits // 32, dtype=torch.int32)
    norms = torch.empty(x.shape[:-1])
    mask = _contiguous(sign_mask)
    if norms.numel():
        if LIB.aura_cpu_encode(x.data_ptr(), norms.numel(), D, _ptr_or_null(mask), codebook.data_ptr(),
                               boundaries.data_ptr(), bits, codes.data_ptr(), norms.data_ptr(),
                               torch.get_num_threads()) != 0:
            raise RuntimeError("aura_encode (cpu): the native kernel could not start its threads")
    return codes, norms


def flash_decode(q, k_cache, v_cache, seq_lens, block_table, scale: float, out, lse) -> bool:
    """Fill ``out [B, Hq, D]`` (q's dtype) and ``lse [B, Hq]`` (fp32) in place; False, with nothing
    written, where a length or a used page index is out of range (the caller raises the reference's
    error).

    ``q``, ``out``: fp32, bf16 or fp16 with a unit last stride; ``k_cache`` / ``v_cache`` likewise,
    contiguous ``[B, Hkv, T, D]`` or paged ``[pages, page_size, Hkv, D]`` (``block_table`` int32
    ``[B, max_pages]``, any strides); ``seq_lens`` int32 contiguous.
    """
    B, Hq, D = q.shape
    paged = block_table is not None
    a = _DecodeArgs()
    a.q, a.q_kind, a.scale = q.data_ptr(), _ROW_KIND[q.dtype], scale
    a.q_stride[:] = [s * q.element_size() for s in q.stride()[:2]]
    a.k, a.v, a.kind = k_cache.data_ptr(), v_cache.data_ptr(), _ROW_KIND[k_cache.dtype]
    a.k_stride[:] = [s * k_cache.element_size() for s in k_cache.stride()[:3]]  # elements -> bytes
    a.v_stride[:] = [s * v_cache.element_size() for s in v_cache.stride()[:3]]
    a.seq_lens = seq_lens.data_ptr()
    if paged:
        a.block_table = block_table.data_ptr()
        a.bt_stride[:] = block_table.stride()
        a.capacity, a.page_size = block_table.shape[1] * k_cache.shape[1], k_cache.shape[1]
        a.Hkv, a.num_pages = k_cache.shape[2], k_cache.shape[0]
    else:
        a.capacity, a.Hkv = k_cache.shape[2], k_cache.shape[1]
    a.B, a.Hq, a.D = B, Hq, D
    a.out, a.out_kind = out.data_ptr(), _ROW_KIND[out.dtype]
    a.out_stride[:] = [s * out.element_size() for s in out.stride()[:2]]
    a.lse, a.lse_stride[:] = lse.data_ptr(), lse.stride()
    a.threads, a.portable = torch.get_num_threads(), not SIMD
    status = LIB.aura_cpu_flash_decode(ctypes.byref(a))
    if status == 1:
        raise RuntimeError("flash_decode (cpu): the native kernel could not start its threads or allocate")
    return status == 0
