"""Input checks and output specs of the gdn family (see common.py for the rules)."""

from __future__ import annotations

from . import common as c


def gdn_chunk(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, chunk_indices=None, use_qk_l2norm=False, state_v_first=False) -> list[c.TensorSpec]:
    raise NotImplementedError("gdn_chunk: checks not written yet")


def gdn_chunk_cumsum(g, cu_seqlens=None, chunk_indices=None) -> list[c.TensorSpec]:
    raise NotImplementedError("gdn_chunk_cumsum: checks not written yet")


def gdn_kkt_solve(k, g_cum, beta, cu_seqlens=None, chunk_indices=None) -> list[c.TensorSpec]:
    raise NotImplementedError("gdn_kkt_solve: checks not written yet")


def gdn_recompute_w_u(k, v, beta, Ai, g_cum, cu_seqlens=None, chunk_indices=None) -> list[c.TensorSpec]:
    raise NotImplementedError("gdn_recompute_w_u: checks not written yet")


def gdn_fwd_h(k, w, u, g_cum, initial_state=None, cu_seqlens=None, chunk_indices=None, state_v_first=False) -> list[c.TensorSpec]:
    raise NotImplementedError("gdn_fwd_h: checks not written yet")


def gdn_fwd_o(q, k, v_new, h, g_cum, scale=None, cu_seqlens=None, chunk_indices=None, state_v_first=False) -> list[c.TensorSpec]:
    raise NotImplementedError("gdn_fwd_o: checks not written yet")


def gdn_recurrent(q, k, v, g, beta, state, state_indices=None, cu_seqlens=None, scale=None, use_qk_l2norm=False, state_v_first=False) -> list[c.TensorSpec]:
    raise NotImplementedError("gdn_recurrent: checks not written yet")
