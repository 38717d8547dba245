"""Pure-PyTorch reference of the decode family."""

from __future__ import annotations

import torch


def flash_decode(q, k_cache, v_cache, seq_lens, block_table=None, scale=None, num_splits=0):
    raise NotImplementedError("flash_decode: reference not written yet")


def flash_decode_out(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits, out, lse):
    raise NotImplementedError("flash_decode_out: reference not written yet")


def merge_attn_states(partial_out, partial_lse):
    raise NotImplementedError("merge_attn_states: reference not written yet")
