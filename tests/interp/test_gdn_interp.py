"""GDN Triton kernels under the Triton interpreter on CPU (CI): every stage, the fused gdn_chunk
and gdn_recurrent against the reference, on tiny odd shapes (gdn.md §8 scaled down: partial
chunks, T in {0, 1, 63, 64, 65}, K != V and not powers of two, GVA ratios 1-3, varlen with
zero-length sequences, strong decay and g == 0, both state layouts)."""

import pytest
import torch
from _gdn_check import (check_chunk, check_decay_domain, check_pass_ignores_rows_outside_sequences, check_recurrent, check_stages,
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
# Forced onto tiny shapes (chunk._segment_plan picks it only on a GPU with few heads and sequences):
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
SPLIT_RATIO = {F32: 1e-5, F16: 5e-3}


def _split_ids(cases):
    return [f"B{c[0]}-T{c[1]}-H{c[2]}-HV{c[3]}-K{c[4]}-V{c[5]}-{dtype_id(c[6])}-cps{c[7]}-"
            + "-".join(f"{a}{b}" for a, b in c[8].items()) for c in cases]


def _force_split(monkeypatch, chunk, cps):
    """Make every launcher call take the sequence-parallel pass with ``cps`` chunks per segment (0: the
    serial pass); returns the list that records each run of the segment summary + scan."""
    ran = []
    real = chunk._segment_starts
    monkeypatch.setattr(chunk, "_segment_plan", lambda *a: cps)
    monkeypatch.setattr(chunk, "_segment_starts", lambda *a, **kw: ran.append(a[-1]) or real(*a, **kw))
    return ran


def _fwd_h_inputs(B, T, H, HV, K, V, dtype, offsets=None, h0=False, state_v_first=False, **_):
    from _gdn_check import make_inputs

    from torch_aura.reference import gdn as ref

    q, k, v, g, beta = make_inputs("cpu", B, T, H, HV, K, V, dtype, gate_norm=20.0, mask_p=0.3, seed=7)
    cu = None if offsets is None else torch.tensor(offsets, dtype=torch.int32)
    ci = None if cu is None else ref.chunk_indices_from_cu_seqlens(cu)
    N = B if cu is None else cu.shape[0] - 1
    sd = (V, K) if state_v_first else (K, V)
    init = torch.randn(N, HV, *sd, generator=torch.Generator().manual_seed(8)) if h0 else None
    g_cum = ref.gdn_chunk_cumsum(g, cu, ci)
    w, u = ref.gdn_recompute_w_u(k, v, beta, ref.gdn_kkt_solve(k, g_cum, beta, cu, ci), g_cum, cu, ci)
    return k, w, u, g_cum, init, cu, ci, state_v_first


@pytest.mark.parametrize("B,T,H,HV,K,V,dtype,cps,extra", SPLIT_CASES, ids=_split_ids(SPLIT_CASES))
def test_split_pass_matches_serial_and_reference(gdn_kernels, monkeypatch, B, T, H, HV, K, V, dtype, cps, extra):
    """gdn_chunk's sequence-parallel pass against the reference and the fp64 recurrence (check_chunk),
    and against the serial pass on the same inputs; gdn_fwd_h's h (every chunk's entering state, so the
    scanned segment start states themselves), v_new and final state likewise."""
    from _util import assert_close

    from torch_aura.triton_kernels.gdn import chunk

    kw = {"gate_norm": 20.0, "mask_p": 0.3, **extra}
    _force_split(monkeypatch, chunk, 0)
    serial = check_chunk(gdn_kernels, "cpu", B, T, H, HV, K, V, dtype, **kw)
    h_serial = gdn_kernels.gdn_fwd_h(*_fwd_h_inputs(B, T, H, HV, K, V, dtype, **extra))
    ran = _force_split(monkeypatch, chunk, cps)
    split = check_chunk(gdn_kernels, "cpu", B, T, H, HV, K, V, dtype, **kw)
    h_split = gdn_kernels.gdn_fwd_h(*_fwd_h_inputs(B, T, H, HV, K, V, dtype, **extra))
    assert ran == [cps, cps], "the sequence-parallel pass did not run"
    r = SPLIT_RATIO[dtype]
    for name, a, b in (("gdn_chunk.o", split[0], serial[0]), ("gdn_chunk.final_state", split[1], serial[1]),
                       ("gdn_fwd_h.h", h_split[0], h_serial[0]), ("gdn_fwd_h.v_new", h_split[1], h_serial[1]),
                       ("gdn_fwd_h.final_state", h_split[2], h_serial[2])):
        assert_close(f"{name}: sequence-parallel vs serial", a.float(), b.float(), r)


@pytest.mark.parametrize("dtype", [F32, F16], ids=dtype_id)
def test_split_pass_stages_match_reference(gdn_kernels, monkeypatch, dtype):
    """The stage ops with the forced split: gdn_fwd_h (and the fwd_o fed from it) against the reference."""
    from torch_aura.triton_kernels.gdn import chunk

    ran = _force_split(monkeypatch, chunk, 1)
    check_stages(gdn_kernels, "cpu", 1, 330, 1, 2, 24, 16, dtype, offsets=[0, 0, 200, 330], h0=True, gate_norm=20.0)
    assert ran, "the sequence-parallel pass did not run"


def test_segment_plan_rule(monkeypatch):
    """The split is chosen from static facts only: few heads and sequences split, shapes that fill the
    GPU keep the serial pass, short sequences do not split; the varlen segment count stays in one wave."""
    from torch_aura.triton_kernels.gdn import chunk

    monkeypatch.setattr(chunk, "sm_count", lambda device: 132)
    cuda = torch.device("cuda")

    def plan(N, HV, T):
        return chunk._segment_plan(cuda, N, HV, 128, -(-T // 64), N * -(-T // 64), False)

    assert chunk._segment_plan(torch.device("cpu"), 1, 4, 128, 512, 512, False) == 0
    assert plan(1, 32, 32768) == 0  # 16/32 heads: 64 pass programs, two segments would not pay
    assert plan(1, 4, 32768) == 32  # 2/4 heads: 16 segments of 32 chunks, 128 programs
    assert plan(1, 8, 8192) == 16  # 4/8 heads: 8 segments of 16 chunks
    assert plan(4, 4, 8192) == 32  # 4 sequences x 4 segments
    assert plan(64, 4, 8192) == 0  # 512 programs already
    assert plan(1, 4, 1024) == 0  # 16 chunks: segments would be shorter than _SEG_MIN_CHUNKS
    for N, NT_total in ((1, 512), (3, 400), (9, 384)):
        cps = chunk._segment_plan(cuda, N, 4, 128, 0, NT_total, True)
        if cps:
            assert (-(-NT_total // cps) + N) * 4 * 2 <= 132
