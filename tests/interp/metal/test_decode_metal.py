"""Decode family kernels (csrc/mps/shaders/decode.metal) under the emulator vs the reference."""

import math

import pytest
import torch

import _metal
from _compare import check_op
from _samples.decode import SAMPLES
from _util import dtype_id

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_samples(emu, name):
    for sample in SAMPLES[name]("cpu"):
        check_op(emu, name, sample.args)


def _cache(B, Hq, Hkv, D, T_cap, dtype, page, lens, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, D, generator=g).to(dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    if page is None:
        k, v = (torch.randn(B, Hkv, T_cap, D, generator=g).to(dtype) for _ in range(2))
        for b, n in enumerate(lens):  # padding past seq_len is never read
            k[b, :, n:], v[b, :, n:] = math.nan, math.nan
        return q, k, v, seq_lens, None
    max_blocks = -(-T_cap // page)
    num_blocks = B * max_blocks + 2
    k, v = (torch.randn(num_blocks, page, Hkv, D, generator=g).to(dtype) for _ in range(2))
    table = torch.randperm(num_blocks, generator=g)[: B * max_blocks].to(torch.int32).view(B, max_blocks)
    return q, k, v, seq_lens, table


# T in {0, 1, tile - 1, tile, tile + 1, > 256 (several chunks)}, GQA 1..8, both layouts.
CASES = [
    # B, Hq, Hkv, D, lens, page, num_splits
    (2, 4, 4, 64, [0, 1], None, 0),
    (3, 6, 2, 128, [63, 64, 65], None, 0),
    (2, 8, 1, 96, [300, 5], None, 2),
    (1, 7, 1, 80, [700], None, 3),
    (2, 10, 2, 64, [257, 0], 16, 0),
    (2, 3, 3, 192, [9, 15], 1, 0),
    (2, 16, 2, 256, [40, 33], 7, 5),
    (1, 2, 1, 512, [70], 32, 0),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-Hq{c[1]}-Hkv{c[2]}-D{c[3]}-T{max(c[4])}-"
                         f"{'contig' if c[5] is None else f'page{c[5]}'}-S{c[6]}")
def test_flash_decode(emu, case, dtype):
    B, Hq, Hkv, D, lens, page, splits = case
    T_cap = max(lens) + 3
    q, k, v, seq_lens, table = _cache(B, Hq, Hkv, D, T_cap, dtype, page, lens, seed=B * D + Hq)
    check_op(emu, "flash_decode", (q, k, v, seq_lens, table, 0.3 if splits else None, splits),
             orders=("forward", "shuffled"))


def test_flash_decode_out_into_strided_views(emu):
    q, k, v, seq_lens, table = _cache(2, 6, 2, 64, 300, torch.float16, 8, [300, 17], seed=4)
    out = torch.zeros(2, 6, 64 + 16, dtype=torch.float16)[:, :, 8:72]
    lse = torch.zeros(6, 2).t()
    check_op(emu, "flash_decode_out", (q, k, v, seq_lens, table, None, 4, out, lse), orders=("forward",))


def test_merge_of_one_split_is_identity_and_nan_partials_are_skipped(emu):
    g = torch.Generator().manual_seed(9)
    po = torch.randn(4, 2, 3, 96, generator=g)
    pl = torch.randn(4, 2, 3, generator=g)
    po[2], pl[2] = math.nan, -math.inf  # an empty split: never read
    pl[:, 1, 1] = -math.inf  # a head with no live split: out 0, lse -inf
    out, lse = check_op(emu, "merge_attn_states", (po, pl))
    assert torch.equal(out[1, 1], torch.zeros(96)) and lse[1, 1] == -math.inf


def test_plan_rejects_bad_input_by_name(emu):
    q = torch.randn(1, 2, 100)
    k = torch.randn(1, 1, 4, 100)
    with pytest.raises(_metal.EmulatorError, match=r"head_dim \(q.shape\[-1\]\): expected one of"):
        emu.run_op("flash_decode", q, k, k, torch.tensor([4], dtype=torch.int32), None, None, 0)
    q = torch.randn(1, 3, 64)
    k = torch.randn(1, 2, 4, 64)
    with pytest.raises(_metal.EmulatorError, match="multiple of KV heads"):
        emu.run_op("flash_decode", q, k, k, torch.tensor([4], dtype=torch.int32), None, None, 0)


def test_split_count_matches_the_reference_plan(emu):
    from torch_aura.reference.decode import plan_num_splits

    for B, Hkv in [(1, 1), (1, 8), (4, 8), (32, 8), (200, 2)]:
        q, k, v, seq_lens, _ = _cache(B, Hkv, Hkv, 64, 4, torch.float32, None, [1] * B, seed=0)
        emu.run_op("flash_decode", q, k, v, seq_lens, None, None, 0)
        S = plan_num_splits(B, Hkv, torch.device("mps"))
        assert emu.last_launches == (2 if S > 1 else 1), (B, Hkv, S)


@pytest.mark.parametrize("layout", [None, 16, 7, 1], ids=lambda p: "contig" if p is None else f"page{p}")
def test_every_gqa_ratio_and_layout(emu, layout):
    # head tiles of 4: G = 1..8 and 16 cover full, partial and several tiles per threadgroup
    for G in (1, 2, 3, 4, 5, 6, 7, 8, 16):
        q, k, v, seq_lens, table = _cache(2, 2 * G, 2, 64, 40, torch.float32, layout, [37, 3], seed=G)
        check_op(emu, "flash_decode", (q, k, v, seq_lens, table, None, 0), orders=("forward",))


def test_forced_split_counts_agree(emu):
    # more splits than 256-token chunks: the surplus splits are empty and must be skipped
    q, k, v, seq_lens, _ = _cache(1, 4, 2, 64, 700, torch.float32, None, [700], seed=3)
    outs = [check_op(emu, "flash_decode", (q, k, v, seq_lens, None, None, S), orders=("forward",))
            for S in (1, 2, 3, 7, 64, 200)]
    for out, lse in outs[1:]:
        torch.testing.assert_close(out, outs[0][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse, outs[0][1], rtol=1e-5, atol=1e-6)


def test_out_of_range_lengths_and_pages_never_fault(emu):
    # The wrapper and the reference reject these; a direct call must still stay inside the
    # tensors: lengths clamp to the capacity, page indices to the pool. Unclamped, the emulator
    # would dereference an address a million pages away and crash.
    q, k, v, seq_lens, table = _cache(2, 4, 2, 64, 40, torch.float16, 16, [40, 40], seed=5)
    seq_lens.fill_(10**6)
    table[0, 0], table[1, 1] = 10**6, -5
    out, lse = emu.run_op("flash_decode", q, k, v, seq_lens, table, None, 0)
    assert out.shape == (2, 4, 64) and lse.shape == (2, 4)
