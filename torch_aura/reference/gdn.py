"""Pure-PyTorch reference of the gdn family."""

from __future__ import annotations

import torch


def gdn_chunk(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, chunk_indices=None, use_qk_l2norm=False, state_v_first=False):
    raise NotImplementedError("gdn_chunk: reference not written yet")


def gdn_chunk_cumsum(g, cu_seqlens=None, chunk_indices=None):
    raise NotImplementedError("gdn_chunk_cumsum: reference not written yet")


def gdn_kkt_solve(k, g_cum, beta, cu_seqlens=None, chunk_indices=None):
    raise NotImplementedError("gdn_kkt_solve: reference not written yet")


def gdn_recompute_w_u(k, v, beta, Ai, g_cum, cu_seqlens=None, chunk_indices=None):
    raise NotImplementedError("gdn_recompute_w_u: reference not written yet")


def gdn_fwd_h(k, w, u, g_cum, initial_state=None, cu_seqlens=None, chunk_indices=None, state_v_first=False):
    raise NotImplementedError("gdn_fwd_h: reference not written yet")


def gdn_fwd_o(q, k, v_new, h, g_cum, scale=None, cu_seqlens=None, chunk_indices=None, state_v_first=False):
    raise NotImplementedError("gdn_fwd_o: reference not written yet")


def gdn_recurrent(q, k, v, g, beta, state, state_indices=None, cu_seqlens=None, scale=None, use_qk_l2norm=False, state_v_first=False):
    raise NotImplementedError("gdn_recurrent: reference not written yet")
