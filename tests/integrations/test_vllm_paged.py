"""The attention torch_aura's vLLM backend runs (``integrations/vllm/_paged.py``, no vLLM needed):
decode rows, speculative rows and prefill rows of one batch against fp64 attention over the pages;
padding slots; the AURA page format's capacity. The end-to-end tests through vLLM are tests/vllm_plugin."""

import pytest
import torch

from _vllm_paged import BLOCK, HKV, run_batch
from torch_aura.integrations.vllm import _paged as paged
from torch_aura.integrations.vllm._paged import aura_slot_bytes

# (query_lens, context_lens, num_decodes): one-token decodes; speculative verification rows
# (query length 3 over a cache) then a chunked prefill over history and a fresh prefill whose
# length crosses block boundaries (BLOCK +- 1).
BATCHES = {
    "decode": ([1, 1, 1], [0, BLOCK - 1, 2 * BLOCK + 4], 3),
    "spec+prefill": ([3, 3, 13, BLOCK + 1], [5, BLOCK, 20, 0], 2),
    "prefill": ([BLOCK - 1, 1, 2 * BLOCK], [0, 40, BLOCK + 1], 0),
}
FORMATS = {"dense": "dense", "aura8": (8, 8), "aura4v2": (4, 2)}


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("D", [64, 128])
def test_batch_matches_attention_over_the_pages(batch, fmt, D):
    query_lens, context_lens, nd = BATCHES[batch]
    out, ref, before, after, slots, *_ = run_batch(FORMATS[fmt], D, torch.float32, "cpu",
                                                    query_lens, context_lens, nd)
    n = ref.shape[0]
    torch.testing.assert_close(out[:n].double(), ref, atol=1e-5, rtol=1e-5)
    assert (out[n:] == 7.0).all(), "padding rows of the output must be left alone"


def test_prefill_offsets_count_the_prefill_tokens_from_zero():
    """``PrefillBatch.query_start_loc`` (FlashAttention's ``cu_seqlens_q`` on a GPU) starts each prefill
    request at its first token among the prefill tokens, past the decode rows."""
    query_lens, context_lens, nd = BATCHES["spec+prefill"]
    plan = run_batch("dense", 64, torch.float32, "cpu", query_lens, context_lens, nd)[6]
    prefill_lens = query_lens[nd:]
    want = [sum(prefill_lens[:i]) for i in range(len(prefill_lens) + 1)]
    assert plan.prefill.query_start_loc.dtype == torch.int32
    assert plan.prefill.query_start_loc.tolist() == want


def test_packed_pages_hold_each_prefill_request_s_pages_once_in_order():
    """AURA prefills dequantize ``packed_pages``: each request's first ceil(seq_len / BLOCK) pages, not
    the table's padding to the longest request, and a table that reads the same pages from the copy."""
    query_lens, context_lens, nd = [1, 2 * BLOCK + 3, 5, 1], [9, 0, 3 * BLOCK, BLOCK - 1], 1
    plan = run_batch("dense", 64, torch.float32, "cpu", query_lens, context_lens, nd)[6]
    pf = plan.prefill
    used, table = pf.packed_pages
    seq = [q + c for q, c in zip(query_lens[nd:], context_lens[nd:])]
    want = torch.cat([pf.block_table[r, :-(-n // BLOCK)].long() for r, n in enumerate(seq)])
    assert torch.equal(used, want) and table.dtype == torch.int32 and table.shape == pf.block_table.shape
    for r, n in enumerate(seq):
        pages = -(-n // BLOCK)
        assert torch.equal(used[table[r, :pages].long()], pf.block_table[r, :pages].long())


def test_prefill_groups_bound_the_pages_each_reads():
    """``PrefillBatch.groups``: consecutive requests, each group within the page budget unless a lone
    request reads more, tokens split where the requests are, and one group (the batch) when all fit."""
    query_lens, context_lens, nd = [1, 2 * BLOCK + 3, 5, BLOCK], [9, 0, 3 * BLOCK, 2], 1
    pf = run_batch("dense", 64, torch.float32, "cpu", query_lens, context_lens, nd)[6].prefill
    needed = [-(-(q + c) // BLOCK) for q, c in zip(query_lens[nd:], context_lens[nd:])]
    assert needed == [3, 4, 2]
    assert pf.groups(sum(needed)) == [(0, sum(query_lens[nd:]), pf)]
    starts = [0] + torch.tensor(query_lens[nd:]).cumsum(0).tolist()
    for budget, want in [(6, [[0], [1, 2]]), (3, [[0], [1], [2]])]:  # 4 pages > 3: a group of its own
        groups = pf.groups(budget)
        assert [g.seq_lens.tolist() for *_, g in groups] == [[pf.seq_lens[r].item() for r in rs] for rs in want]
        assert [(t0, t1) for t0, t1, _ in groups] == [(starts[rs[0]], starts[rs[-1] + 1]) for rs in want]
        for (t0, t1, g), rs in zip(groups, want):
            assert g.query_start_loc.tolist() == [starts[r] - t0 for r in rs + [rs[-1] + 1]]
            assert g.max_query_len == max(query_lens[nd + r] for r in rs) and g.token_row.shape[0] == t1 - t0
            assert g.token_row.tolist() == pf.token_row[t0:t1].sub(rs[0]).tolist()
            assert g.packed_pages[0].shape[0] == sum(needed[r] for r in rs)
        assert pf.groups(budget) is groups, "every layer of the step shares the groups"


@pytest.mark.parametrize("budget_pages", [1, 3])
@pytest.mark.parametrize("batch", ["spec+prefill", "prefill"])
def test_aura_prefill_in_groups_matches_attention_over_the_pages(batch, budget_pages, monkeypatch):
    """A step whose prefills read more than ``AURA_DEQUANT_BYTES`` of dense pages attends group by
    group, with the same result (vLLM's warm-up step asks for max_num_seqs x max_model_len tokens)."""
    D = 64
    page_bytes = 2 * BLOCK * HKV * D * 4  # fp32 on the CPU
    monkeypatch.setattr(paged, "AURA_DEQUANT_BYTES", budget_pages * page_bytes)
    query_lens, context_lens, nd = BATCHES[batch]
    out, ref, *_, plan = run_batch((4, 2), D, torch.float32, "cpu", query_lens, context_lens, nd)[:7]
    assert len(plan.prefill.groups(budget_pages)) > 1
    torch.testing.assert_close(out[:ref.shape[0]].double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows_per_group", [1, 2])
def test_verify_dense_decode_in_row_groups(rows_per_group, monkeypatch):
    """Verify mode's dense decode dequantizes at most ``AURA_DEQUANT_BYTES`` of fp32 pages at once, in groups
    of decode rows, with the result of one call (vLLM's warm-up decodes max_num_seqs rows of max_model_len
    tokens: one call asked for 32 GiB at llama3-8b on the H200 and ran out of memory)."""
    query_lens, context_lens, nd = BATCHES["decode"]
    _, ref, _, pages, _, attn, plan, q = run_batch((4, 2), 64, torch.float32, "cpu", query_lens, context_lens, nd)
    args = (q[:nd], pages, plan.decode_seq_lens, plan.decode_block_table)
    whole = attn.dense_decode(*args)
    torch.testing.assert_close(whole.double(), ref[:nd], atol=1e-5, rtol=1e-5)
    W = plan.decode_block_table.shape[1]
    monkeypatch.setattr(paged, "AURA_DEQUANT_BYTES", rows_per_group * W * attn.dense_page_bytes(pages, torch.float32))
    rows_per_call = []

    def counted(q, *rest):
        rows_per_call.append(q.shape[0])
        return torch.ops.aura.flash_decode(q, *rest)

    monkeypatch.setattr(paged, "_flash_decode", counted)
    torch.testing.assert_close(attn.dense_decode(*args), whole, atol=1e-6, rtol=1e-6)
    assert rows_per_call == [min(rows_per_group, nd - r0) for r0 in range(0, nd, rows_per_group)]
    empty = attn.dense_decode(q[:0], pages, plan.decode_seq_lens[:0], plan.decode_block_table[:0])
    assert empty.shape == (0, *q.shape[1:])


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_padding_slots_write_nothing_a_request_reads(fmt):
    # slot -1 rows (vLLM's padding) carry garbage: the dense format parks them in the null block 0,
    # AURA skips them; no other page may change beyond the step's own slots.
    _, _, before, after, slots, *_ = run_batch(FORMATS[fmt], 64, torch.float32, "cpu", [2, 5], [3, 9], 1)
    changed = (before != after).flatten(1).any(1).nonzero().flatten().tolist()
    allowed = set((slots // BLOCK).tolist()) | ({0} if fmt == "dense" else set())
    assert changed and set(changed) <= allowed


@pytest.mark.parametrize("page_pad", [0, 2 * HKV * 64], ids=["unpadded", "whole-row-padding"])
def test_dense_write_on_pages_that_tile_into_rows(page_pad):
    # the dense write's row path (page stride a multiple of a token's K|V row); the default padding
    # above (not a whole row) takes its element path
    out, ref, before, after, slots, *_ = run_batch("dense", 64, torch.float32, "cpu", [1, 3, 20], [10, 4, 7], 2,
                                                    page_pad=page_pad)
    torch.testing.assert_close(out[:ref.shape[0]].double(), ref, atol=1e-5, rtol=1e-5)
    changed = (before != after).flatten(1).any(1).nonzero().flatten().tolist()
    assert set(changed) <= set((slots // BLOCK).tolist()) | {0}


def test_bf16_batch():
    out, ref, *_ = run_batch("dense", 128, torch.bfloat16, "cpu", [1, 3, 20], [10, 4, 7], 2)
    torch.testing.assert_close(out[:ref.shape[0]].double(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("scheme,D,ratio", [((8, 8), 128, 1024 / 264), ((4, 2), 128, 1024 / 104),
                                            ((8, 8), 64, 512 / 136), ((4, 4), 64, 512 / 72)])
def test_aura_page_bytes(scheme, D, ratio):
    # the capacity gain vLLM sees over an fp32 cache (2 * D * 4 bytes per token and head)
    assert 2 * D * 4 / aura_slot_bytes(D, *scheme) == pytest.approx(ratio)
