"""Input checks and output specs of the decode family (see common.py for the rules)."""

from __future__ import annotations

from . import common as c


def flash_decode(q, k_cache, v_cache, seq_lens, block_table=None, scale=None, num_splits=0) -> list[c.TensorSpec]:
    raise NotImplementedError("flash_decode: checks not written yet")


def flash_decode_out(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits, out, lse) -> list[c.TensorSpec]:
    raise NotImplementedError("flash_decode_out: checks not written yet")


def merge_attn_states(partial_out, partial_lse) -> list[c.TensorSpec]:
    raise NotImplementedError("merge_attn_states: checks not written yet")
