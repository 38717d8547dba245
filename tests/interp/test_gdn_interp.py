"""GDN Triton kernels under the Triton interpreter on CPU (CI): every stage, the fused gdn_chunk
and gdn_recurrent against the reference, on tiny odd shapes (gdn.md §8 scaled down: partial
chunks, T in {0, 1, 63, 64, 65}, K != V and not powers of two, GVA ratios 1-3, varlen with
zero-length sequences, strong decay and g == 0, both state layouts)."""

import pytest
import torch
from _gdn_check import (check_chunk, check_decay_domain, check_pass_ignores_rows_outside_sequences, check_recurrent,
                        check_split, check_stages, force_split,
                        check_w_u_copies_match_pointer_loads)
from _util import dtype_id

F32, F16 = torch.float32, torch.float16


def _ids(cases):
    return [f"B{c[0]}-T{c[1]}-H{c[2]}-HV{c[3]}-K{c[4]}-V{c[5]}-{dtype_id(c[6])}-"
            + "-".join(f"{a}{b}" for a, b in c[7].items()) for c in cases]

STAGE_CASES = [
    # (B, T, H, HV, K, V, dtype, extra)
    (2, 70, 1, 2, 12, 20, F32, {}),
    (1, 130, 2, 4, 32, 16, F16, {"h0": True}),
    (1, 100, 1, 2, 20, 24, F32, {"offsets": [0, 15, 15, 100], "h0": True, "state_v_first": True}),
    (1, 65, 1, 1, 16, 16, F16, {"mask_p": 1.0}),  # g == 0 everywhere: the worst-conditioned solve
    (1, 64, 1, 1, 16, 16, F32, {"gate_norm": 0.01}),  # g in -69..-31 per token: overflow guards
]


@pytest.mark.parametrize("B,T,H,HV,K,V,dtype,extra", STAGE_CASES,
                         ids=_ids(STAGE_CASES))
def test_stages_match_reference(gdn_kernels, B, T, H, HV, K, V, dtype, extra):
    check_stages(gdn_kernels, "cpu", B, T, H, HV, K, V, dtype, **extra)


CHUNK_CASES = [
    (1, 0, 1, 1, 16, 16, F32, {}),
    (2, 1, 1, 1, 16, 16, F32, {"h0": True}),
    (1, 63, 1, 3, 20, 12, F16, {}),
    (1, 64, 2, 2, 16, 32, F32, {"scale": 0.3}),
    (2, 65, 1, 2, 12, 20, F32, {"h0": True, "state_v_first": True}),
    (1, 90, 2, 2, 24, 16, F16, {"l2norm": True, "h0": True}),
    (1, 100, 1, 3, 20, 16, F32, {"l2norm": True, "offsets": [0, 30, 30, 100]}),  # in-op L2 norm with GVA, varlen
    (1, 70, 1, 2, 16, 16, F32, {"offsets": [0, 0, 5, 5, 70], "h0": True}),
    (1, 70, 1, 2, 16, 16, F16, {"offsets": [0, 0, 5, 5, 70], "state_v_first": True}),
    (1, 40, 1, 1, 16, 16, F32, {"offsets": [0, 1, 3, 40], "pass_ci": False}),
    (1, 130, 1, 1, 16, 16, F32, {"mask_p": 0.5, "gate_norm": 0.1}),
]


@pytest.mark.parametrize("B,T,H,HV,K,V,dtype,extra", CHUNK_CASES,
                         ids=_ids(CHUNK_CASES))
def test_chunk_matches_reference_and_recurrence(gdn_kernels, B, T, H, HV, K, V, dtype, extra):
    check_chunk(gdn_kernels, "cpu", B, T, H, HV, K, V, dtype, **extra)


RECURRENT_CASES = [
    (3, 1, 1, 2, 12, 20, F32, {}),
    (2, 5, 2, 4, 9, 7, F16, {"l2norm": True, "scale": 0.5}),
    (1, 7, 1, 3, 6, 10, F32, {"offsets": [0, 2, 2, 7], "state_v_first": True}),
    (2, 3, 1, 1, 16, 16, F32, {"pool_dtype": torch.bfloat16, "gate_norm": 0.01}),
]


@pytest.mark.parametrize("B,T,H,HV,K,V,dtype,extra", RECURRENT_CASES,
                         ids=_ids(RECURRENT_CASES))
def test_recurrent_matches_reference(gdn_kernels, B, T, H, HV, K, V, dtype, extra):
    check_recurrent(gdn_kernels, "cpu", B, T, H, HV, K, V, dtype, **extra)


def test_recurrent_writes_a_callers_out(gdn_kernels):
    """The launcher's ``out=`` (vLLM's packed decode buffer): the same o, written there, the pool updated alike;
    a buffer of another shape or dtype is refused before anything runs."""
    from _gdn_check import make_inputs

    q, k, v, g, beta = make_inputs("cpu", 3, 1, 2, 4, 16, 16, torch.float32)
    pool = torch.randn(5, 4, 16, 16)
    rows = torch.tensor([4, -1, 1], dtype=torch.int32)
    pool_a, pool_b = pool.clone(), pool.clone()
    want = gdn_kernels.gdn_recurrent(q, k, v, g, beta, pool_a, rows, None, None, True, True)
    out = torch.full_like(want, float("nan"))
    assert gdn_kernels.gdn_recurrent(q, k, v, g, beta, pool_b, rows, None, None, True, True, out=out) is out
    assert torch.equal(out, want) and torch.equal(pool_a, pool_b)
    for bad in (torch.empty(3, 1, 4, 8), torch.empty_like(want, dtype=torch.float16), torch.empty(3, 1, 4, 32)[..., :16]):
        with pytest.raises(ValueError, match="out must be"):
            gdn_kernels.gdn_recurrent(q, k, v, g, beta, pool.clone(), rows, None, None, True, True, out=bad)


@pytest.mark.parametrize("N,H,HV,K,V,dtype", [(4, 2, 4, 16, 16, F32), (1, 1, 2, 32, 24, F16), (5, 1, 3, 16, 40, F16)],
                         ids=["N4-fp32", "N1-fp16", "N5-HV3-V40-fp16"])
def test_recurrent_computes_vllm_gates_and_skips_its_null_slot(gdn_kernels, N, H, HV, K, V, dtype):
    """vLLM's packed decode as one launch: the launcher's ``gates=`` and ``null=`` (``_gdn_check``)."""
    from _gdn_check import check_recurrent_raw_gates

    from torch_aura.triton_kernels.gdn import gates, recurrent

    check_recurrent_raw_gates(recurrent, gates, "cpu", N, H, HV, K, V, dtype)


@pytest.mark.parametrize("N,H,HV,K,V,dtype", [(4, 2, 4, 16, 16, F32), (3, 1, 3, 16, 40, F16)],
                         ids=["N4-fp32", "N3-HV3-V40-fp16"])
def test_recurrent_one_token_body_equals_the_loop(gdn_kernels, N, H, HV, K, V, dtype):
    """``recurrent.ONE_TOKEN``: vLLM's packed decode without the token loop (``_gdn_check``)."""
    from _gdn_check import check_one_token_body

    from torch_aura.triton_kernels.gdn import recurrent

    check_one_token_body(recurrent, "cpu", N, H, HV, K, V, dtype)


def test_bad_input_raises_the_named_error(gdn_kernels):
    q = torch.zeros(1, 4, 1, 257)
    with pytest.raises(ValueError, match="k"):
        gdn_kernels.gdn_kkt_solve(q, torch.zeros(1, 4, 1), torch.zeros(1, 4, 1))


@pytest.mark.parametrize("K,V,dtype", [(16, 16, F32), (32, 24, F16)], ids=["K16-V16-fp32", "K32-V24-fp16"])
def test_state_pass_ignores_rows_outside_sequences(gdn_kernels, K, V, dtype):
    from torch_aura.triton_kernels.gdn import chunk

    assert check_pass_ignores_rows_outside_sequences(chunk, "cpu", K, V, dtype), "the TMA path did not run"


@pytest.mark.parametrize("B,T,K,V,dtype", [(2, 100, 16, 24, F32), (1, 64, 32, 16, F16)], ids=["T100-fp32", "T64-fp16"])
def test_w_u_copies_match_pointer_loads(gdn_kernels, B, T, K, V, dtype):
    from torch_aura.triton_kernels.gdn import chunk

    assert check_w_u_copies_match_pointer_loads(chunk, "cpu", B, T, 1, 2, K, V, dtype), "the TMA path did not run"


@pytest.mark.parametrize("dtype", [F32, F16], ids=dtype_id)
def test_g_outside_the_usual_range(gdn_kernels, dtype):
    # -inf (full forget) and g > 0 (read as 0): finite, and equal to the fp64 recurrence
    check_decay_domain(gdn_kernels, "cpu", dtype)


# ------------------------------------------------------------------ the sequence-parallel pass
# Forced onto tiny shapes (segments._segment_plan picks it only on a GPU with few heads and sequences):
# (B, T, H, HV, K, V, dtype, chunks per segment, extra). Weak decay (gate_norm 20, 30% of g at 0) so a
# segment's start state still matters at its end. T = 0, 1, 63, 64, 65; 3 / 4 / 5 chunks at 2 per
# segment (segment boundary -1, 0, +1 chunk); varlen with empty sequences first, inside and last.
# The scan's register path runs at 16 bits (10 segments in the last case), its column-block path at fp32.
SPLIT_CASES = [
    (1, 0, 1, 1, 16, 16, F32, 1, {"h0": True}),
    (2, 1, 1, 1, 16, 16, F32, 1, {"h0": True}),
    (1, 63, 1, 2, 16, 16, F16, 1, {}),
    (1, 64, 1, 1, 16, 32, F32, 1, {"h0": True}),
    (2, 65, 1, 2, 20, 12, F32, 1, {"h0": True, "state_v_first": True}),
    (1, 191, 1, 2, 32, 16, F32, 2, {"h0": True}),
    (1, 256, 1, 2, 16, 24, F16, 2, {"h0": True}),
    (1, 257, 2, 2, 16, 16, F32, 2, {"state_v_first": True, "l2norm": True}),
    (1, 400, 1, 2, 20, 12, F32, 2, {"offsets": [0, 0, 150, 150, 279, 400, 400], "h0": True}),
    (1, 300, 1, 2, 16, 16, F16, 1, {"offsets": [0, 64, 65, 300], "h0": True, "state_v_first": True}),
    (1, 200, 1, 1, 16, 16, F32, 3, {"offsets": [0, 200], "pass_ci": False}),
    (1, 0, 1, 1, 16, 16, F32, 1, {"offsets": [0, 0, 0], "h0": True}),
    (1, 640, 1, 2, 16, 16, F16, 1, {"h0": True}),
]
def _split_ids(cases):
    return [f"B{c[0]}-T{c[1]}-H{c[2]}-HV{c[3]}-K{c[4]}-V{c[5]}-{dtype_id(c[6])}-cps{c[7]}-"
            + "-".join(f"{a}{b}" for a, b in c[8].items()) for c in cases]


@pytest.mark.parametrize("B,T,H,HV,K,V,dtype,cps,extra", SPLIT_CASES, ids=_split_ids(SPLIT_CASES))
def test_split_pass_matches_serial_and_reference(gdn_kernels, monkeypatch, B, T, H, HV, K, V, dtype, cps, extra):
    """gdn_chunk's sequence-parallel pass against the reference, the fp64 recurrence and the serial pass
    on the same inputs; gdn_fwd_h likewise (``check_split``)."""
    from torch_aura.triton_kernels.gdn import chunk

    check_split(gdn_kernels, "cpu", monkeypatch, chunk, B, T, H, HV, K, V, dtype, cps, extra)


@pytest.mark.parametrize("dtype", [F32, F16], ids=dtype_id)
def test_split_pass_stages_match_reference(gdn_kernels, monkeypatch, dtype):
    """The stage ops with the forced split: gdn_fwd_h (and the fwd_o fed from it) against the reference."""
    from torch_aura.triton_kernels.gdn import chunk

    ran = force_split(monkeypatch, chunk, 1)
    check_stages(gdn_kernels, "cpu", 1, 330, 1, 2, 24, 16, dtype, offsets=[0, 0, 200, 330], h0=True, gate_norm=20.0)
    assert ran, "the sequence-parallel pass did not run"


def test_segment_plan_rule(monkeypatch):
    """The split is chosen from static facts only: few heads and sequences split, shapes that fill the
    GPU keep the serial pass, short sequences do not split; the varlen segment count stays in one wave."""
    from torch_aura.triton_kernels.gdn import _common, segments

    monkeypatch.setattr(_common, "sm_count", lambda device: 132)
    cuda = torch.device("cuda")

    def plan(N, HV, T):
        return segments._segment_plan(cuda, N, HV, 128, -(-T // 64), N * -(-T // 64), False)

    assert segments._segment_plan(torch.device("cpu"), 1, 4, 128, 512, 512, False) == 0
    assert plan(1, 32, 32768) == 0  # 16/32 heads: 64 pass programs, two segments would not pay
    assert plan(1, 4, 32768) == 32  # 2/4 heads: 16 segments of 32 chunks, 128 programs
    assert plan(1, 8, 8192) == 16  # 4/8 heads: 8 segments of 16 chunks
    assert plan(4, 4, 8192) == 32  # 4 sequences x 4 segments
    assert plan(64, 4, 8192) == 0  # 512 programs already
    assert plan(1, 4, 1024) == 0  # 16 chunks: segments would be shorter than _SEG_MIN_CHUNKS
    for N, NT_total in ((1, 512), (3, 400), (9, 384)):
        cps = segments._segment_plan(cuda, N, 4, 128, 0, NT_total, True)
        if cps:
            assert (-(-NT_total // cps) + N) * 4 * 2 <= 132
    assert segments._segment_plan(cuda, 3, 4, 128, 0, 400, True) > 0  # 13 spare slots for 3 sequences
    assert segments._segment_plan(cuda, 9, 4, 128, 0, 390, True) == 0  # bench's varlen mix: 7 for 9


@pytest.mark.parametrize("offsets,T,cps,n_seg", [
    ([0, 0, 150, 150, 279, 400, 400], 400, 2, 7),   # empty sequences first, inside and last
    ([0, 64, 65, 300], 300, 1, 9),                   # one chunk, then a one-token sequence, spare rows
    ([0, 200], 200, 3, 2),
    ([0, 0, 0], 0, 1, 0),                            # no chunks at all: only seg_first
    ([0, 500, 700], 650, 4, 4),                      # the last sequence's end past T: clamped, as the pass reads it
])
def test_segment_table_kernel(gdn_kernels, offsets, T, cps, n_seg):
    """The varlen plan (one program) against a plain Python construction: rows (sequence, first chunk) in
    sequence order, -1 up to the static bound, and each sequence's first row."""
    from torch_aura.triton_kernels.gdn import segments

    rows, first = [], []
    for n in range(len(offsets) - 1):
        first.append(len(rows))
        chunks = -(-max(min(offsets[n + 1], T) - offsets[n], 0) // 64)
        rows += [[n, c] for c in range(0, chunks, cps)]
    rows = (rows + [[-1, -1]] * n_seg)[:n_seg]
    table, seg_first = segments._segment_table(torch.tensor(offsets, dtype=torch.int32), T, cps, n_seg)
    assert table.tolist() == rows
    assert seg_first.tolist() == first
