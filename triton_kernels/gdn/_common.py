"""Host helpers shared by the chunk pipeline's launchers (``prep``, ``state_pass``, ``segments``, ``chunk``).

The hardware facts every plan reads (``sm_count``, ``interpreting``, ``descriptor_workspace``, ``_tma_ready``)
are looked up through this module (``_common.sm_count(...)``), so a test patches each in one place.
"""

from __future__ import annotations

import torch

# sm_count, interpreting and descriptor_workspace are seams: callers write _common.sm_count(...)
from .._tune import cdiv, descriptor_workspace, has_tma, interpreting, next_pow2, sm_count  # noqa: F401
from ._jit import CHUNK


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, next_pow2(n))


def _s3(x: torch.Tensor) -> tuple[int, int, int]:
    """(batch, token, head) strides of a head-last ``[B, T, H, ...]`` tensor."""
    return x.stride()[:3]  # one call, not three: launchers take ~30 of these per gdn_chunk


def _dot_prec(dtype: torch.dtype) -> str:
    # fp32 inputs are compared at 0.005 against an fp32 reference: no tf32 anywhere (gdn.md §3.8)
    return "ieee" if dtype == torch.float32 else "tf32"


def _varlen_plan(T: int, B: int, cu_seqlens, chunk_indices):
    """``(chunk_indices or None, NT per sequence (fixed), NT_total)``.

    Eager varlen calls without chunk_indices build it here (one host sync, as the reference);
    CUDA-graph capture and compiled graphs should pass it.
    """
    NT = cdiv(T, CHUNK)
    if cu_seqlens is None:
        return None, NT, B * NT
    if chunk_indices is None:
        from ...reference.gdn import chunk_indices_from_cu_seqlens

        chunk_indices = chunk_indices_from_cu_seqlens(cu_seqlens)
    return chunk_indices.contiguous(), NT, chunk_indices.shape[0]


def _state_strides(s: torch.Tensor | None, state_v_first: bool) -> tuple[int, int, int, int]:
    """(sequence, head, k, v) strides of a state tensor in either layout (zeros for None)."""
    if s is None:
        return 0, 0, 0, 0
    a, b, c, d = s.stride()
    return (a, b, d, c) if state_v_first else (a, b, c, d)


# Shared memory the TMA copies of one pipeline stage may take (w, k, u and, for o, q and A_qk): two
# stages must fit beside the rest (fp32 at K = V = 128 would need 256 KB; 16-bit at K = 256, 230 KB).
_TMA_STAGE_BYTES = 100 * 1024


def _tma_ready(*xs: torch.Tensor) -> bool:
    """Whether ``chunk_rows`` may copy these ``[B, T, H, C]`` tensors with TMA: a Hopper-class GPU (or
    the interpreter, which emulates the copies), 16-byte aligned base and strides, unit last stride."""
    dev = xs[0].device
    if not (has_tma(dev) if dev.type == "cuda" else interpreting()):
        return False
    for x in xs:  # plain loops: this runs several times per eager call
        st, es = x.stride(), x.element_size()
        if st[-1] != 1 or x.data_ptr() % 16 or not x.numel():
            return False
        for s in st[:-1]:
            if s * es % 16:
                return False
    return True


def _pass_copies_tiles(k, w, u, q=None, a_qk=None) -> bool:
    """Whether the state pass takes its TMA path: the tiles are copyable (``_tma_ready``) and two
    pipeline stages of them fit (``_TMA_STAGE_BYTES``); q and A_qk only with the output (gdn_chunk)."""
    K, V = k.shape[3], u.shape[3]
    with_o = q is not None
    tiles = (w, k, u, q, a_qk) if with_o else (w, k, u)
    stage_bytes = CHUNK * (2 * _pow2(K) + min(64, _pow2(V)) + (_pow2(K) + CHUNK if with_o else 0)) * w.element_size()
    return stage_bytes <= _TMA_STAGE_BYTES and _tma_ready(*tiles)
