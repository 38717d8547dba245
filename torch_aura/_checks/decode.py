"""Input checks and output specs of the decode family (see common.py for the rules).

Metadata only: these run inside the fakes (on FakeTensors with symbolic sizes) as well as before
every real call. The data-dependent checks (``seq_lens`` within the cache capacity, the used page
indices within ``num_blocks``) live in ``torch_aura/reference/decode.py``.
"""

from __future__ import annotations

import torch

from .._limits import DECODE_HEAD_DIMS as SUPPORTED_HEAD_DIMS
from . import common as c


def _head_dim(D, arg: str = "q") -> None:
    if D not in SUPPORTED_HEAD_DIMS:
        c.fail(f"head_dim ({arg}.shape[-1])", f"one of {list(SUPPORTED_HEAD_DIMS)}", D)


def _decode_inputs(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits):
    """Shared by flash_decode and flash_decode_out; returns ``(B, Hq, D)``."""
    c.tensor("q", q, ndim=3, dtypes=c.FLOATS, unit_last_stride=True)
    c.tensor("k_cache", k_cache, ndim=4, unit_last_stride=True)
    c.tensor("v_cache", v_cache, ndim=4, unit_last_stride=True)
    c.tensor("seq_lens", seq_lens, ndim=1, dtypes=(torch.int32,))
    # The kernel reads a row of page indices with vector loads: unit last stride, like the caches.
    c.optional("block_table", block_table, ndim=2, dtypes=(torch.int32,), unit_last_stride=True)
    c.same_device(q=q, k_cache=k_cache, v_cache=v_cache, seq_lens=seq_lens, block_table=block_table)
    c.same_dtype(q=q, k_cache=k_cache, v_cache=v_cache)

    B, Hq, D = q.shape
    _head_dim(D)
    c.dim("seq_lens", seq_lens, 0, B, "the batch size B = q.shape[0]")
    if block_table is None:
        # Contiguous layout [B, Hkv, T_cap, D] (any strides with unit last stride).
        layout = "contiguous [B, Hkv, T_cap, D]"
        c.dim("k_cache", k_cache, 0, B, f"B = q.shape[0], {layout} layout")
        hkv_dim = 1
    else:
        # Paged layout [num_blocks, page_size, Hkv, D]; block_table [B, max_blocks].
        layout = "paged [num_blocks, page_size, Hkv, D]"
        c.dim("block_table", block_table, 0, B, "B = q.shape[0]")
        if k_cache.shape[1] < 1:
            c.fail("k_cache.shape[1]", f"a page size >= 1 ({layout} layout)", k_cache.shape[1])
        hkv_dim = 2
    c.dim("k_cache", k_cache, 3, D, f"head_dim = q.shape[-1], {layout} layout")
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        c.fail("v_cache", f"the shape of k_cache {tuple(k_cache.shape)}", f"shape {tuple(v_cache.shape)}")
    Hkv = k_cache.shape[hkv_dim]
    if Hkv < 1:
        c.fail(f"k_cache.shape[{hkv_dim}]", f">= 1 KV head ({layout} layout)", Hkv)
    c.divides("q", Hq, Hkv, "query heads Hq", f"KV heads Hkv = k_cache.shape[{hkv_dim}]")

    # Sym* types: under torch.compile scalars may arrive symbolic.
    # a 0-D tensor too: the dispatcher turns one into the schema's float, so torch.ops accepts it
    if scale is not None and not isinstance(scale, (int, float, torch.SymInt, torch.SymFloat)) \
            and not (isinstance(scale, torch.Tensor) and scale.dim() == 0):
        c.fail("scale", "a float, a 0-D tensor or None", type(scale).__name__ if not isinstance(scale, torch.Tensor)
               else f"a tensor of shape {tuple(scale.shape)}")
    if not isinstance(num_splits, (int, torch.SymInt)) or isinstance(num_splits, bool):
        c.fail("num_splits", "an int", type(num_splits).__name__)
    if num_splits < 0:
        c.fail("num_splits", ">= 0 (0 = choose automatically)", num_splits)
    return B, Hq, D


def flash_decode(q, k_cache, v_cache, seq_lens, block_table=None, scale=None, num_splits=0) -> list[c.TensorSpec]:
    B, Hq, D = _decode_inputs(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits)
    return [c.TensorSpec((B, Hq, D), q.dtype, q.device),
            c.TensorSpec((B, Hq), torch.float32, q.device)]


def flash_decode_out(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits, out, lse) -> list[c.TensorSpec]:
    B, Hq, D = _decode_inputs(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits)
    # out may be a strided slice of a bigger buffer (a serving engine's output), but the kernel
    # stores rows with vector writes, so its last dim must be unit-stride.
    c.tensor("out", out, ndim=3, dtypes=(q.dtype,), unit_last_stride=True)
    c.tensor("lse", lse, ndim=2, dtypes=(torch.float32,))
    c.same_device(q=q, out=out, lse=lse)
    c.shape("out", out, (B, Hq, D), "[B, Hq, D] of q")
    c.shape("lse", lse, (B, Hq), "[B, Hq] of q")
    return []


def merge_attn_states(partial_out, partial_lse) -> list[c.TensorSpec]:
    c.tensor("partial_out", partial_out, ndim=4, dtypes=c.FLOATS, unit_last_stride=True)
    c.tensor("partial_lse", partial_lse, ndim=3, dtypes=(torch.float32,))
    c.same_device(partial_out=partial_out, partial_lse=partial_lse)
    S, B, Hq, D = partial_out.shape
    if S < 1:
        c.fail("partial_out.shape[0]", "at least 1 split S", S)
    _head_dim(D, "partial_out")
    c.shape("partial_lse", partial_lse, (S, B, Hq), "[S, B, Hq] of partial_out")
    return [c.TensorSpec((B, Hq, D), partial_out.dtype, partial_out.device),
            c.TensorSpec((B, Hq), torch.float32, partial_out.device)]
