"""The Triton GDN kernels on the GPU against the reference and the fp64 recurrence (gdn.md §5, §8).

Runs only where a CUDA device exists; there, a missing kernel is a failure, not a skip. Every
allocation made by torch_aura is NaN-poisoned (tests/conftest.py), so an output row the kernel
never writes fails the comparison.
"""

import _samples
import pytest
import torch
from _conv_check import case_id, check_case, check_op, check_pool_prefill, conv_args, update_args
from _gdn_check import (SPLIT_RATIO, check_chunk, check_decay_domain, check_one_token_body,
                        check_pass_ignores_rows_outside_sequences, check_post_conv, check_recurrent,
                        check_recurrent_raw_gates, check_split, check_stages, check_w_u_copies_match_pointer_loads,
                        force_split, make_inputs, recurrence64)
from _util import GDN_CHUNK_RATIO, assert_close, dtype_id

import torch_aura
from torch_aura import backends
from torch_aura.reference.gdn import chunk_indices_from_cu_seqlens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

DEV = "cuda"
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
GDN_OPS = ("gdn_chunk", "gdn_chunk_cumsum", "gdn_kkt_solve", "gdn_recompute_w_u", "gdn_fwd_h", "gdn_fwd_o",
           "gdn_recurrent", "causal_conv1d", "causal_conv1d_update")


@pytest.fixture(autouse=True)
def _launchers_not_plans(monkeypatch):
    """The tests below observe the launchers' Python steps (the pass taken, the split, the tuner), which a
    plan's replay skips: they run the launchers; plans are checked against them in
    test_planned_calls_equal_the_launchers."""
    from torch_aura.triton_kernels.gdn import plan

    monkeypatch.setattr(plan, "ENABLED", False)


def _id(case):
    B, T, H, HV, K, V, dt, extra = case
    tail = "-".join(f"{a}{b}" for a, b in extra.items() if a != "offsets")
    lens = f"-varlen{len(extra['offsets']) - 1}" if "offsets" in extra else ""
    return f"B{B}-T{T}-H{H}-HV{HV}-K{K}-V{V}-{dtype_id(dt)}{lens}" + (f"-{tail}" if tail else "")


def test_gdn_kernels_are_registered():
    for op in GDN_OPS:
        assert backends.has_kernel(op, "cuda"), backends.status()[op]["cuda"]


# --------------------------------------------------------------------------- per-stage (§8)
STAGE_CASES = [
    (2, 128, 2, 2, 64, 64, BF16, {}),
    (2, 128, 2, 4, 64, 64, BF16, {"h0": True}),
    (1, 256, 4, 4, 32, 32, F16, {"h0": True, "state_v_first": True}),
    (2, 128, 2, 2, 64, 64, BF16, {"mask_p": 1.0}),  # use_g = False
    (2, 200, 1, 2, 100, 60, F32, {"h0": True}),
    (1, 300, 2, 2, 256, 256, BF16, {"offsets": [0, 63, 63, 200, 300], "h0": True}),
    (1, 129, 1, 1, 192, 16, F16, {"gate_norm": 0.01}),
]


@pytest.mark.parametrize("case", STAGE_CASES, ids=[_id(c) for c in STAGE_CASES])
def test_stages_match_reference(case):
    B, T, H, HV, K, V, dt, extra = case
    check_stages(torch_aura, DEV, B, T, H, HV, K, V, dt, **extra)


@pytest.mark.sanitize
def test_stages_small_for_sanitizer():
    check_stages(torch_aura, DEV, 1, 70, 1, 2, 20, 24, BF16, offsets=[0, 5, 5, 70], h0=True)


# ------------------------------------------------------------------- gdn_chunk: FLA's matrix
# (B, T, H, HV, D, scale, gate_norm, mask_p, l2norm_in_op) of FLA tests/ops/test_gdn.py, fp16
FLA_CHUNK = [(4, 1024, 4, 4, 128, 0.1, 1, 1.0, False), (2, 75, 4, 4, 64, 1, 0.01, 0, False),
             (2, 500, 3, 3, 60, 1, 1, 0, False), (2, 1000, 3, 3, 64, 0.1, 1, 0.5, False),
             (3, 1024, 4, 4, 100, 1, 0.1, 0, False), (4, 1024, 4, 4, 128, 0.1, 1, 0, True),
             (2, 1500, 4, 4, 128, 0.1, 10, 0, False), (4, 2048, 8, 8, 64, 0.1, 1, 0, False),
             (2, 256, 2, 4, 64, 1, 1, 0, False), (2, 512, 2, 8, 64, 1, 0.1, 0, True),
             (2, 1024, 4, 8, 128, 0.1, 1, 0, False)]


@pytest.mark.parametrize("dtype", (F16, BF16), ids=dtype_id)
@pytest.mark.parametrize("B,T,H,HV,D,scale,gate_norm,mask_p,l2norm", FLA_CHUNK,
                         ids=[f"B{c[0]}-T{c[1]}-H{c[2]}-HV{c[3]}-D{c[4]}-s{c[5]}-gn{c[6]}-m{c[7]}-l2{int(c[8])}"
                              for c in FLA_CHUNK])
def test_chunk_fla_matrix(B, T, H, HV, D, scale, gate_norm, mask_p, l2norm, dtype):
    check_chunk(torch_aura, DEV, B, T, H, HV, D, D, dtype, scale=scale, gate_norm=gate_norm, mask_p=mask_p,
                l2norm=l2norm, h0=True)


CHUNK_EXTRA = [
    (1, 0, 1, 1, 64, 64, BF16, {"h0": True}),
    (2, 1, 1, 1, 64, 64, BF16, {"h0": True}),
    (1, 63, 2, 2, 16, 16, F16, {}),
    (1, 64, 2, 6, 60, 100, BF16, {}),
    (2, 65, 1, 3, 100, 60, F16, {"h0": True}),
    (1, 200, 1, 1, 256, 256, BF16, {"h0": True}),
    (1, 300, 2, 4, 192, 128, F32, {"h0": True}),
    (1, 129, 1, 2, 128, 16, F32, {"mask_p": 1.0}),
    (2, 700, 4, 8, 128, 128, BF16, {"h0": True, "state_v_first": True}),
    # varlen: gdn.md §8 lists and FlashInfer-style lengths, zero-length sequences included
    (1, 15, 4, 4, 60, 60, F16, {"offsets": [0, 15]}),
    (1, 1000, 4, 4, 64, 64, F16, {"offsets": [0, 256, 500, 1000], "mask_p": 0.5}),
    (1, 2000, 4, 4, 100, 100, F16, {"offsets": [0, 15, 100, 300, 1200, 2000]}),
    (1, 1000, 2, 8, 64, 64, BF16, {"offsets": [0, 256, 500, 1000], "h0": True}),
    (1, 8192, 2, 4, 128, 128, BF16, {"offsets": [0, 8192]}),
    (1, 1012, 1, 2, 128, 128, BF16, {"offsets": [0, 511, 1012], "h0": True}),
    (1, 960, 2, 4, 128, 128, BF16, {"offsets": [0, 31, 94, 187, 310, 460, 460, 960], "h0": True}),
    (1, 121, 16, 32, 128, 128, BF16, {"offsets": [0, 0, 121, 121], "h0": True, "pass_ci": False}),
]


@pytest.mark.parametrize("case", CHUNK_EXTRA, ids=[_id(c) for c in CHUNK_EXTRA])
def test_chunk_edge_cases(case):
    B, T, H, HV, K, V, dt, extra = case
    check_chunk(torch_aura, DEV, B, T, H, HV, K, V, dt, **extra)


@pytest.mark.sanitize
def test_chunk_small_for_sanitizer():
    check_chunk(torch_aura, DEV, 1, 150, 2, 4, 60, 40, BF16, offsets=[0, 64, 64, 150], h0=True, l2norm=True)


@pytest.mark.sanitize
def test_chunk_fixed_length_tma_small_for_sanitizer():
    """Fixed length with 16-byte aligned rows (K = 64, V = 48 in bf16) and a partial last chunk: w/u copies
    its tiles through host descriptors, the state pass through in-kernel ones."""
    check_chunk(torch_aura, DEV, 2, 150, 2, 4, 64, 48, BF16, h0=True)


@pytest.mark.sanitize
def test_chunk_tma_small_for_sanitizer():
    """K = 64 bf16 rows are 16-byte aligned: the state pass copies its tiles with TMA (in-kernel descriptors)."""
    check_chunk(torch_aura, DEV, 1, 150, 2, 4, 64, 40, BF16, offsets=[0, 50, 50, 150], h0=True)


# Shapes whose Hopper pass runs beside the w/u kernel (state_pass._overlap_pass): one or few sequences, 16-bit,
# K in {64, 128}; the last one is the bench's head count, where w/u has the most to do per chunk.
OVERLAP_CASES = [
    (1, 1000, 2, 4, 128, 128, BF16, {"h0": True}),
    (1, 700, 4, 8, 64, 64, F16, {}),
    (1, 500, 2, 4, 128, 96, BF16, {"offsets": [0, 190, 190, 500], "h0": True}),  # varlen, an empty sequence
    (2, 300, 2, 2, 128, 128, BF16, {"l2norm": True, "state_v_first": True}),
    (1, 2048, 16, 32, 128, 128, BF16, {"h0": True}),
]


@pytest.mark.parametrize("case", OVERLAP_CASES, ids=[_id(c) for c in OVERLAP_CASES])
def test_chunk_overlapped_pass_matches_reference_and_serial(case, monkeypatch):
    """The pass beside w/u (waiting on per-chunk flags) against the reference, and against the serial
    launch order (TORCH_AURA_GDN_OVERLAP=0). A chunk read before w/u wrote it would be NaN (the test
    allocations are poisoned). The two are not bit-equal: the waiting variant of the Gluon kernel issues
    its copies later in the step, and ptxas then contracts the gate exponent's multiply-subtract
    differently (H100: max |diff| 2e-5 .. 3e-4, the same for the waiting kernel run after w/u on one
    stream, and deterministic run to run)."""
    from torch_aura.triton_kernels.gdn import state_pass

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the overlapped pass is the Hopper (sm_90) pass's")
    B, T, H, HV, K, V, dt, extra = case
    taken, real = [], state_pass._overlap_pass
    monkeypatch.setattr(state_pass, "_overlap_pass", lambda *a: taken.append(real(*a)) or taken[-1])
    o1, f1 = check_chunk(torch_aura, DEV, B, T, H, HV, K, V, dt, **extra)
    assert taken and all(taken), "the overlapped pass did not run"
    monkeypatch.setenv("TORCH_AURA_GDN_OVERLAP", "0")
    taken.clear()
    o0, f0 = check_chunk(torch_aura, DEV, B, T, H, HV, K, V, dt, **extra)
    assert taken and not any(taken)
    assert_close("gdn_chunk.o, overlapped vs serial", o1.float(), o0.float(), 1e-3)
    assert_close("gdn_chunk.final_state, overlapped vs serial", f1, f0, 1e-3)


def test_overlapped_pass_switches_and_bound(monkeypatch):
    """Eligible at one sequence on sm_90; off with TORCH_AURA_GDN_OVERLAP=0, under an MPS SM limit, and
    once the pass programs would take more than half of the SMs (w/u must keep the rest)."""
    from torch_aura.triton_kernels.gdn import state_pass

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the overlapped pass is the Hopper (sm_90) pass's")
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def eligible(N, HV=4, V=128):
        q = torch.empty(N, 64, 2, 128, dtype=BF16, device=DEV)
        u, a = torch.empty(N, 64, HV, V, dtype=BF16, device=DEV), torch.empty(N, 64, HV, 64, dtype=BF16, device=DEV)
        return state_pass._overlap_pass(q, q, torch.empty(N, 64, HV, 128, dtype=BF16, device=DEV), u, a, None)

    assert eligible(1)
    assert eligible(sms // 2 // 8) and not eligible(sms // 2 // 8 + 1)  # 2 V tiles x 4 heads per sequence
    assert not eligible(4, HV=16)  # 8/16 heads at 4x8k: 128 pass programs would starve w/u
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50")
    assert not eligible(1)
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    monkeypatch.setenv("TORCH_AURA_GDN_OVERLAP", "0")
    assert not eligible(1)


@pytest.mark.sanitize
def test_chunk_overlapped_pass_small_for_sanitizer():
    check_chunk(torch_aura, DEV, 1, 200, 1, 2, 64, 64, BF16, offsets=[0, 70, 70, 200], h0=True)


# ------------------------------------------------------------------ the sequence-parallel pass
# Forced (segments._segment_plan chooses it only for few heads and sequences): (B, T, H, HV, K, V, dtype,
# chunks per segment, extra). Weak decay (gate_norm 20, 30% of g at 0) so that a segment's start
# state still matters at its end. T = 0, 1, 63, 64, 65; 7 / 8 / 9 chunks at 4 per segment (a segment
# boundary -1, 0, +1 chunk); varlen with empty sequences first, inside and last; the Hopper (Gluon)
# pass (16-bit, K in {64, 128}) and the Triton one (K = 60, K = 256 pointer loads, fp32). The scan
# (segments._scan_in_regs): the register path at 16 bits with K <= 128 (K = 128, 64, 60; 32 segments in
# one sequence for the pipelined loop's steady state), the column-block path at K = 256 (bf16) and fp32.
SPLIT_CASES = [
    (1, 0, 1, 2, 128, 128, BF16, 1, {"h0": True}),
    (2, 1, 1, 2, 128, 128, BF16, 1, {"h0": True}),
    (1, 63, 2, 4, 128, 128, BF16, 1, {}),
    (1, 64, 2, 4, 128, 128, BF16, 1, {"h0": True}),
    (2, 65, 2, 4, 128, 128, BF16, 1, {"h0": True, "state_v_first": True}),
    (1, 448, 2, 4, 128, 128, BF16, 4, {"h0": True}),
    (1, 512, 2, 4, 128, 128, BF16, 4, {"h0": True, "l2norm": True}),
    (1, 570, 2, 4, 128, 128, BF16, 4, {"h0": True}),
    (1, 1500, 2, 4, 128, 128, BF16, 4, {"offsets": [0, 0, 511, 512, 512, 1100, 1500, 1500], "h0": True}),
    (1, 2000, 4, 8, 64, 64, F16, 3, {"offsets": [0, 700, 700, 2000], "state_v_first": True, "h0": True}),
    (1, 1200, 2, 4, 128, 128, BF16, 2, {"offsets": [0, 1200], "pass_ci": False}),
    (1, 700, 2, 4, 60, 100, BF16, 2, {"h0": True}),
    (1, 900, 1, 2, 256, 64, BF16, 3, {"h0": True}),
    (1, 1000, 2, 4, 128, 128, F32, 4, {"h0": True}),
    (1, 2048, 2, 4, 128, 128, BF16, 1, {"h0": True}),
]
def _force_split(monkeypatch, cps):
    from torch_aura.triton_kernels.gdn import chunk

    return force_split(monkeypatch, chunk, cps)


def _split_id(case):
    return _id(case[:7] + case[8:]) + f"-cps{case[7]}"


@pytest.mark.parametrize("case", SPLIT_CASES, ids=[_split_id(c) for c in SPLIT_CASES])
def test_split_pass_matches_serial_and_reference(case, monkeypatch):
    """The sequence-parallel pass (segment summaries, scan, per-segment pass) against the reference and
    the fp64 recurrence, and against the serial pass on the same inputs (``check_split``)."""
    from torch_aura.triton_kernels.gdn import chunk

    check_split(torch_aura, DEV, monkeypatch, chunk, *case)


# Tensor-parallel shards of Qwen3-Next (16/32 heads over TP2/4/8) at lengths where the plan splits on an
# H100 / H200 (132 SMs); the last keeps the serial pass (64 pass programs: two segments would not pay).
TP_CASES = [
    ("2/4-1x8k", [8192], 2, 4, True),
    ("2/4-4x4k", [4096] * 4, 2, 4, True),
    ("4/8-1x8k", [8192], 4, 8, True),
    ("8/16-1x8k", [8192], 8, 16, True),
    ("2/4-varlen", [3000, 0, 5000, 700, 4000], 2, 4, True),
    ("16/32-1x4k", [4096], 16, 32, False),
]


@pytest.mark.parametrize("name,lens,H,HV,splits", TP_CASES, ids=[c[0] for c in TP_CASES])
def test_tp_shard_shapes_split_as_planned(name, lens, H, HV, splits, monkeypatch):
    """At the bench's TP shapes the plan (static: SM count, sequences, heads, chunk count) splits where
    the GPU would idle, and the result equals the reference and the serial pass."""
    from torch_aura.triton_kernels.gdn import segments

    if torch.cuda.get_device_properties(0).multi_processor_count < 100:
        pytest.skip("the plan's expectations assume an H100-class SM count")
    ran, real = [], segments._segment_starts
    monkeypatch.setattr(segments, "_segment_starts", lambda *a, **kw: ran.append(a[-1]) or real(*a, **kw))
    varlen = len(set(lens)) > 1
    offsets = [0, *torch.tensor(lens).cumsum(0).tolist()] if varlen else None
    B, T = (1, sum(lens)) if varlen else (len(lens), lens[0])
    extra = {"offsets": offsets} if varlen else {}
    o1, f1 = check_chunk(torch_aura, DEV, B, T, H, HV, 128, 128, BF16, h0=True, l2norm=True, gate_norm=16.0, **extra)
    assert bool(ran) == splits, f"{name}: the plan {'did not split' if splits else 'split'}"
    if splits:
        _force_split(monkeypatch, 0)
        o0, f0 = check_chunk(torch_aura, DEV, B, T, H, HV, 128, 128, BF16, h0=True, l2norm=True, gate_norm=16.0,
                             **extra)
        assert_close("o: sequence-parallel vs serial", o1.float(), o0.float(), SPLIT_RATIO[BF16])
        assert_close("final state: sequence-parallel vs serial", f1, f0, SPLIT_RATIO[BF16])


def test_split_pass_cuda_graph_replay_is_bitwise_eager(monkeypatch):
    """The split's segment bookkeeping is device ops on static shapes: capturable, replay == eager."""
    _force_split(monkeypatch, 2)
    offsets = [0, 300, 300, 1000]
    cu = torch.tensor(offsets, dtype=torch.int32, device=DEV)
    ci = torch_aura.gdn_chunk_indices(cu)
    q, k, v, g, beta = make_inputs(DEV, 1, 1000, 2, 4, 128, 128, BF16, seed=1, gate_norm=20.0)
    h0 = torch.randn(3, 4, 128, 128, device=DEV)
    static = [x.clone() for x in (q, k, v, g, beta)]
    torch_aura.gdn_chunk(*static, initial_state=h0, cu_seqlens=cu, chunk_indices=ci)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, s_g = torch_aura.gdn_chunk(*static, initial_state=h0, cu_seqlens=cu, chunk_indices=ci)
    new = make_inputs(DEV, 1, 1000, 2, 4, 128, 128, BF16, seed=2, gate_norm=20.0)
    for dst, src in zip(static, new):
        dst.copy_(src)
    graph.replay()
    o_e, s_e = torch_aura.gdn_chunk(*new, initial_state=h0, cu_seqlens=cu, chunk_indices=ci)
    assert torch.equal(o_g, o_e) and torch.equal(s_g, s_e)


@pytest.mark.sanitize
def test_split_pass_small_for_sanitizer(monkeypatch):
    _force_split(monkeypatch, 1)
    check_chunk(torch_aura, DEV, 1, 330, 1, 2, 64, 64, BF16, offsets=[0, 0, 200, 330], h0=True, gate_norm=20.0)
    check_chunk(torch_aura, DEV, 2, 150, 1, 2, 60, 40, BF16, h0=True, state_v_first=True, gate_norm=20.0)


def test_chunk_thousands_of_short_documents_grid_over_65535():
    """2050 documents of 1-8 tokens x 32 heads: 1-D grids past CUDA's 65535 limit on y/z."""
    gen = torch.Generator().manual_seed(5)
    lens = torch.randint(1, 9, (2050,), generator=gen)
    offsets = [0] + torch.cumsum(lens, 0).tolist()
    check_chunk(torch_aura, DEV, 1, offsets[-1], 16, 32, 64, 64, BF16, offsets=offsets, h0=True)


# K = 256 at 16 bits: two stages of the five tiles would not fit, so the pass takes its pointer path
@pytest.mark.parametrize("K,V,dtype,tma", [(128, 128, BF16, True), (64, 96, F16, True), (256, 64, F16, False),
                                           (60, 100, F16, False)],
                         ids=["K128-V128-bf16", "K64-V96-fp16", "K256-V64-fp16-pointer", "K60-V100-fp16-pointer"])
def test_state_pass_ignores_rows_outside_sequences(K, V, dtype, tma):
    from torch_aura.triton_kernels.gdn import chunk

    copied, hopper = check_pass_ignores_rows_outside_sequences(chunk, DEV, K, V, dtype)
    major = torch.cuda.get_device_capability()[0]
    assert copied == (tma and major >= 9)
    assert hopper == (tma and major == 9 and K in (64, 128)), "the Hopper pass should run exactly where eligible"


@pytest.mark.parametrize("B,T,K,V,dtype", [(2, 300, 128, 128, BF16), (1, 130, 64, 96, F16), (1, 100, 60, 40, F16)],
                         ids=["B2-T300-K128-V128-bf16", "B1-T130-K64-V96-fp16", "K60-fp16-pointer"])
def test_w_u_copies_match_pointer_loads(B, T, K, V, dtype):
    from torch_aura.triton_kernels.gdn import chunk

    used = check_w_u_copies_match_pointer_loads(chunk, DEV, B, T, 2, 4, K, V, dtype)
    assert used == (K != 60 and torch.cuda.get_device_capability()[0] >= 9)


def test_state_v_first_matches_kv_layout_of_the_same_kernels():
    """gdn.md §5: the [V, K] run equals the [K, V] run to 1e-4 (only strides differ)."""
    for B, T, H, D in [(1, 63, 1, 64), (2, 500, 3, 60), (3, 1024, 4, 128), (4, 2048, 8, 64)]:
        q, k, v, g, beta = make_inputs(DEV, B, T, H, H, D, D, BF16)
        h0 = torch.randn(B, H, D, D, device=DEV)
        o1, f1 = torch_aura.gdn_chunk(q, k, v, g, beta, initial_state=h0)
        o2, f2 = torch_aura.gdn_chunk(q, k, v, g, beta, initial_state=h0.transpose(-1, -2).contiguous(),
                                      state_v_first=True)
        assert_close(f"o B{B} T{T}", o2.float(), o1.float(), 1e-4)
        assert_close(f"state B{B} T{T}", f2.transpose(-1, -2), f1, 1e-4)


def test_k_or_v_above_256_is_rejected():
    q, k, v, g, beta = make_inputs(DEV, 1, 4, 1, 1, 257, 16, BF16)
    with pytest.raises(ValueError, match="K"):
        torch_aura.gdn_chunk(q, k, v, g, beta)
    q, k, v, g, beta = make_inputs(DEV, 1, 4, 1, 1, 16, 257, BF16)
    with pytest.raises(ValueError, match="V"):
        torch.ops.aura.gdn_chunk(q, k, v, g, beta)  # the launcher checks too, not only the wrapper


# --------------------------------------------------------------------------- gdn_recurrent
# (B, T, H, HV, D, scale, gate_norm, dtype) of FLA's recurrent tests
FLA_RECURRENT = [(1, 63, 1, 1, 64, 1, 1, F32), (2, 500, 4, 4, 60, 1, 1, F32), (2, 1000, 2, 8, 128, 1, 0.1, F32),
                 (3, 1024, 2, 2, 128, 0.1, 1, F32), (4, 1024, 3, 3, 128, 1, 10, F32),
                 (4, 2048, 4, 4, 64, 0.1, 1, F32), (2, 1024, 4, 4, 128, 1, 0.1, F16),
                 (2, 1024, 4, 8, 128, 1, 10, F16)]


@pytest.mark.parametrize("B,T,H,HV,D,scale,gate_norm,dtype", FLA_RECURRENT,
                         ids=[f"B{c[0]}-T{c[1]}-H{c[2]}-HV{c[3]}-D{c[4]}-s{c[5]}-gn{c[6]}-{dtype_id(c[7])}"
                              for c in FLA_RECURRENT])
def test_recurrent_fla_matrix(B, T, H, HV, D, scale, gate_norm, dtype):
    check_recurrent(torch_aura, DEV, B, T, H, HV, D, D, dtype, scale=scale, gate_norm=gate_norm)


# the first three take 64-wide V tiles on an H100/H200 (>= 8 programs per SM at BV = 64:
# recurrent._tile), the second with a masked V tail
RECURRENT_EXTRA = [
    (40, 1, 16, 32, 128, 128, BF16, {}),
    (17, 2, 4, 64, 64, 96, F16, {"state_v_first": True}),
    (32, 1, 16, 32, 128, 128, BF16, {}),
    (3, 1, 1, 2, 60, 100, F16, {"l2norm": True, "state_v_first": True}),
    (2, 4, 2, 4, 256, 256, BF16, {"pool_dtype": BF16}),
    (1, 50, 2, 6, 64, 64, F32, {"offsets": [0, 0, 7, 7, 50], "state_v_first": True}),
    (1, 9, 1, 1, 16, 16, F32, {"offsets": [0, 1, 9], "skip": False}),
]


@pytest.mark.parametrize("case", RECURRENT_EXTRA, ids=[_id(c) for c in RECURRENT_EXTRA])
def test_recurrent_edge_cases(case):
    B, T, H, HV, K, V, dt, extra = case
    check_recurrent(torch_aura, DEV, B, T, H, HV, K, V, dt, **extra)


@pytest.mark.parametrize("case", RECURRENT_EXTRA, ids=[_id(c) for c in RECURRENT_EXTRA])
def test_recurrent_native_launches_equal_tritons_launcher(case, monkeypatch):
    """After a geometry's first call, its calls are one C call into native_replay.c (``_launch.native_program``):
    they agree with the reference, and bit for bit with the same call through Triton's launcher
    (``_native.ENABLED`` off), eagerly and captured in a CUDA graph."""
    from torch_aura.triton_kernels import _native
    from torch_aura.triton_kernels.gdn import recurrent

    B, T, H, HV, K, V, dt, extra = case
    for seed in range(3):  # the first call keeps the program; the next two launch through it
        check_recurrent(torch_aura, DEV, B, T, H, HV, K, V, dt, seed=seed, **extra)
    offsets, v_first = extra.get("offsets"), extra.get("state_v_first", False)
    cu = None if offsets is None else torch.tensor(offsets, dtype=torch.int32, device=DEV)
    N = B if cu is None else len(offsets) - 1
    pool = torch.randn(N + 3, HV, *((V, K) if v_first else (K, V)), device=DEV).to(extra.get("pool_dtype", F32))
    rows = torch.randperm(N + 3)[:N].to(torch.int32).to(DEV)

    def call(inputs, pool):
        return torch.ops.aura.gdn_recurrent(*inputs, pool, rows, cu, None, extra.get("l2norm", False), v_first)
    inputs = make_inputs(DEV, B, T, H, HV, K, V, dt, seed=7)
    pools = [pool.clone() for _ in range(3)]
    native = call(inputs, pools[0])
    assert recurrent._geometry_of(*inputs, pools[0], rows, cu, None, extra.get("l2norm", False),
                                  v_first)[-1].program is not None, "the call did not launch natively"
    monkeypatch.setattr(_native, "ENABLED", False)
    assert torch.equal(call(inputs, pools[1]), native) and torch.equal(pools[1], pools[0])
    monkeypatch.setattr(_native, "ENABLED", True)
    static = [x.clone() for x in inputs]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(static, pools[2])
    new = make_inputs(DEV, B, T, H, HV, K, V, dt, seed=8)
    for dst, src in zip(static, new):
        dst.copy_(src)
    pools[2].copy_(pool)
    graph.replay()
    want_pool = pool.clone()
    monkeypatch.setattr(_native, "ENABLED", False)
    assert torch.equal(captured, call(new, want_pool)) and torch.equal(pools[2], want_pool)


@pytest.mark.sanitize
def test_recurrent_small_for_sanitizer():
    for seed in range(2):  # the second call is the geometry's native launch (_launch.native_program)
        check_recurrent(torch_aura, DEV, 1, 6, 1, 2, 20, 24, BF16, offsets=[0, 2, 2, 6], seed=seed)


@pytest.mark.sanitize
def test_recurrent_wide_tiles_for_sanitizer():
    # 64-wide V tiles over a 96-wide V (masked tail), many sequences: the large-batch launch shape
    check_recurrent(torch_aura, DEV, 17, 2, 4, 64, 64, 96, F16, state_v_first=True)


def test_chunk_then_recurrent_continues_one_recurrence():
    """Prefill's final state feeds decode: equal to one recurrence over the concatenation."""
    B, T, extra, H, HV, D = 2, 300, 5, 2, 4, 128
    q, k, v, g, beta = make_inputs(DEV, B, T + extra, H, HV, D, D, BF16, seed=3)
    o1, state = torch_aura.gdn_chunk(q[:, :T], k[:, :T], v[:, :T], g[:, :T], beta[:, :T])
    o2 = torch_aura.gdn_recurrent(q[:, T:], k[:, T:], v[:, T:], g[:, T:], beta[:, T:], state)
    o64, s64 = recurrence64(q, k, v, g, beta)
    assert_close("prefill o", o1.double().cpu(), o64[:, :T], GDN_CHUNK_RATIO)
    assert_close("decode o", o2.double().cpu(), o64[:, T:], GDN_CHUNK_RATIO)
    assert_close("state", state.double().cpu(), s64, GDN_CHUNK_RATIO)


def test_duplicate_pool_rows_rejected_in_debug_mode(monkeypatch):
    monkeypatch.setenv("TORCH_AURA_DEBUG", "1")
    q, k, v, g, beta = make_inputs(DEV, 2, 1, 1, 1, 16, 16, F32)
    pool = torch.zeros(4, 1, 16, 16, device=DEV)
    with pytest.raises(ValueError, match="distinct"):
        torch.ops.aura.gdn_recurrent(q, k, v, g, beta, pool, torch.tensor([1, 1], dtype=torch.int32, device=DEV))


# ------------------------------------------------------------------ graphs and compilation
def test_recurrent_cuda_graph_replay_is_bitwise_eager():
    B, H, HV, D = 4, 2, 4, 128
    q, k, v, g, beta = make_inputs(DEV, B, 1, H, HV, D, D, BF16, seed=1)
    pool = torch.randn(8, HV, D, D, device=DEV)
    idx = torch.tensor([5, -1, 0, 2], dtype=torch.int32, device=DEV)
    static = [x.clone() for x in (q, k, v, g, beta)]
    pool_g, pool_e = pool.clone(), pool.clone()
    torch_aura.gdn_recurrent(*static, pool_g.clone(), idx)  # warm-up (compiles) outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g = torch_aura.gdn_recurrent(*static, pool_g, idx)
    q2, k2, v2, g2, b2 = make_inputs(DEV, B, 1, H, HV, D, D, BF16, seed=2)
    for dst, src in zip(static, (q2, k2, v2, g2, b2)):
        dst.copy_(src)
    graph.replay()
    o_e = torch_aura.gdn_recurrent(q2, k2, v2, g2, b2, pool_e, idx)
    assert torch.equal(o_g, o_e) and torch.equal(pool_g, pool_e)


def test_chunk_cuda_graph_replay_is_bitwise_eager():
    offsets = [0, 100, 100, 357]
    cu = torch.tensor(offsets, dtype=torch.int32, device=DEV)
    ci = torch_aura.gdn_chunk_indices(cu)
    q, k, v, g, beta = make_inputs(DEV, 1, 357, 2, 4, 128, 128, BF16, seed=1)
    static = [x.clone() for x in (q, k, v, g, beta)]
    torch_aura.gdn_chunk(*static, cu_seqlens=cu, chunk_indices=ci)  # tunes and compiles eagerly
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_g, s_g = torch_aura.gdn_chunk(*static, cu_seqlens=cu, chunk_indices=ci)
    new = make_inputs(DEV, 1, 357, 2, 4, 128, 128, BF16, seed=2)
    for dst, src in zip(static, new):
        dst.copy_(src)
    graph.replay()
    o_e, s_e = torch_aura.gdn_chunk(*new, cu_seqlens=cu, chunk_indices=ci)
    assert torch.equal(o_g, o_e) and torch.equal(s_g, s_e)


class _GDNBlock(torch.nn.Module):
    """A module in the shape of a Qwen3-Next linear-attention layer's core: prefill then decode."""

    def forward(self, q, k, v, g, beta, qd, kd, vd, gd, bd, pool, idx):
        o, state = torch_aura.gdn_chunk(q, k, v, g, beta, use_qk_l2norm=True)
        pool[idx.long()] = state
        od = torch_aura.gdn_recurrent(qd, kd, vd, gd, bd, pool, idx, use_qk_l2norm=True)
        return o.float().sum() + od.float().sum(), o, od


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compile_fullgraph_module_with_chunk_and_recurrent(mode):
    torch._dynamo.reset()
    B, T, H, HV, D = 2, 130, 2, 4, 64
    args = [*make_inputs(DEV, B, T, H, HV, D, D, BF16, seed=4), *make_inputs(DEV, B, 1, H, HV, D, D, BF16, seed=5)]
    idx = torch.tensor([3, 1], dtype=torch.int32, device=DEV)
    block = _GDNBlock()
    pool_e = torch.zeros(4, HV, D, D, device=DEV)
    _, o_e, od_e = block(*args, pool_e, idx)
    fn = torch.compile(block, fullgraph=True, mode=mode)
    for _ in range(3):
        pool_c = torch.zeros(4, HV, D, D, device=DEV)
        _, o_c, od_c = fn(*args, pool_c, idx)
    assert_close("compiled o", o_c.float(), o_e.float(), 1e-6)
    assert_close("compiled decode o", od_c.float(), od_e.float(), 1e-6)
    assert_close("compiled pool", pool_c, pool_e, 1e-6)


def _tuner_configs():
    if not torch.cuda.is_available():  # skipped anyway; never import triton at collection on CPU
        return [("_SOLVE", 0)]
    return [(name, i) for name in ("_SOLVE", "_W_U", "_STATE_PASS") for i in range(len(_tuner(name).configs))] \
        + [("_STATE_PASS_SM90", i) for i, c in enumerate(_tuner("_STATE_PASS_SM90").configs) if c.kwargs.get("SM90")] \
        + [("_SEG_SUMMARY", i) for i in range(len(_tuner("_SEG_SUMMARY").configs))]


def _tuner(name):
    """A GDN tuner by name, from the module of the kernel it tunes."""
    from torch_aura.triton_kernels.gdn import prep, segments, state_pass

    home = {"_SOLVE": prep, "_W_U": prep, "_STATE_PASS": state_pass, "_STATE_PASS_SM90": state_pass,
            "_SEG_SUMMARY": segments}
    return getattr(home[name], name)


# one test per config, so xdist spreads their compiles over workers
@pytest.mark.parametrize("tuner,index", _tuner_configs(), ids=[f"{n.strip('_').lower()}-{i}" for n, i in _tuner_configs()])
def test_every_tuner_config_is_correct(monkeypatch, tuner, index):
    """Tests run untuned (the first config that fits); warm-up tuning may pick any config that fits,
    so each must be right wherever it fits, and must fit somewhere (else it is dead weight)."""
    from triton.runtime.errors import OutOfResources

    from torch_aura.triton_kernels.gdn import segments, state_pass

    t = _tuner(tuner)
    cfg = t.configs[index]
    monkeypatch.setenv("TORCH_AURA_GDN_OVERLAP", "0")  # the overlapped pass has one fixed config, tested above
    if tuner == "_SEG_SUMMARY":  # runs only in the sequence-parallel pass
        monkeypatch.setattr(segments, "_segment_plan", lambda *a: 2)
    # a Triton pass config serves both pass tuners (the Hopper one lists them after its own)
    for u in (t, state_pass._STATE_PASS_SM90) if tuner == "_STATE_PASS" else (t,):
        monkeypatch.setattr(u, "configs", [cfg])
        monkeypatch.setattr(u, "cache", {})
    ran = 0
    for K, V, dt, extra in [(128, 128, BF16, {"h0": True}), (60, 100, F16, {"offsets": [0, 7, 7, 300]})]:
        try:
            check_chunk(torch_aura, DEV, 2 if "offsets" not in extra else 1, 300, 2, 4, K, V, dt, **extra)
            ran += 1
        except OutOfResources:
            continue
        except AssertionError as e:
            raise AssertionError(f"{tuner} config {cfg}: {e}") from e
    assert ran, f"{tuner} config {cfg} fits none of the test shapes"


@pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=["fp32", "bf16"])
def test_g_outside_the_usual_range(dtype):
    # -inf (full forget) and g > 0 (read as 0): finite, and equal to the fp64 recurrence
    check_decay_domain(torch_aura, DEV, dtype)


# ------------------------------------------------------------------ new lengths (issue 38)
def _compiled_variants() -> dict[str, int]:
    """Compiled variants per GDN kernel on this device (Triton's in-memory kernel cache)."""
    from torch_aura.triton_kernels.gdn import chunk, conv, prep, recurrent, segments, state_pass

    dev = torch.cuda.current_device()
    kernels = {n: k for mod in (chunk, prep, state_pass, segments, recurrent, conv) for n, k in vars(mod).items()
               if n.endswith("_kernel")}
    kernels["gdn_state_pass_sm90_kernel"] = state_pass._hopper_pass()
    return {n: len(k.device_caches[dev][0]) for n, k in kernels.items() if k is not None and dev in k.device_caches}


def test_new_lengths_compile_nothing():
    """One plan (one sequence, 2/4 heads, under 2k tokens: the serial pass, beside w/u on Hopper), 12
    random lengths: after the first two calls no kernel compiles again (tests/build/test_gdn_variants.py
    proves the same for every plan against Triton's binder on the CPU)."""
    import random

    rng = random.Random(38)

    def call(T):
        q, k, v, g, beta = make_inputs(DEV, 1, T, 2, 4, 64, 64, BF16)
        torch_aura.gdn_chunk(q, k, v, g, beta, use_qk_l2norm=True)
        torch_aura.gdn_recurrent(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1],
                                 torch.zeros(rng.randint(1, 40), 4, 64, 64, device=DEV),
                                 torch.zeros(1, dtype=torch.int32, device=DEV))

    call(64)
    call(1000)
    before = _compiled_variants()
    for T in [rng.randint(1, 1900) for _ in range(12)]:
        call(T)
    assert _compiled_variants() == before


# ------------------------------------------------------------------ the front end (ops.md §3b)
@pytest.mark.parametrize("name", ["causal_conv1d", "causal_conv1d_update"])
def test_conv_samples_match_reference(name):
    for sample in _samples.all_samples()[name](DEV):
        check_op(torch_aura, name, sample.args)


CONV_CASES = [
    dict(B=2, T=1000, C=2048, W=4, dtype=BF16, S=4),  # transformers' cache: S = W
    dict(B=1, T=2048, C=8192, W=4, dtype=BF16, offsets=[0, 1000, 2048], S=4),  # Qwen3-Next's q | k | v at TP 1
    dict(B=1, T=1000, C=768, W=4, dtype=BF16, offsets=[0, 0, 1, 3, 300, 301, 1000, 1000], S=4),
    dict(B=1, T=64, C=300, W=8, dtype=F16, offsets=[0, 1, 2, 2, 9, 40, 64], S=9),
    dict(B=3, T=33, C=136, W=2, dtype=F32, S=1, layout="strided", activation=None),
    dict(B=2, T=31, C=64, W=1, dtype=BF16, S=1, bias=False),
    dict(B=2, T=100, C=512, W=4, dtype=BF16, S=4, state_dtype=BF16, weight_dtype=BF16, layout="contiguous"),
    dict(B=2, T=0, C=512, W=4, dtype=BF16, S=4),
    # vLLM's conv pool layout: the state a transposed view of [N, S, C]
    dict(B=1, T=2048, C=8192, W=4, dtype=BF16, offsets=[0, 7, 1000, 2048], S=3, state_dtype=BF16,
         state_layout="transposed"),
]


@pytest.mark.parametrize("prefill", ["taps", "window"])
@pytest.mark.parametrize("case", CONV_CASES, ids=map(case_id, CONV_CASES))
def test_conv_matches_reference(case, prefill, monkeypatch):
    from torch_aura.triton_kernels.gdn import conv

    monkeypatch.setattr(conv, "PREFILL_KERNEL", prefill)  # the window kernel takes W <= 4, the taps one the rest
    check_case(torch_aura, DEV, "causal_conv1d", case)


UPDATE_CASES = [
    dict(N=64, L=1, C=8192, W=4, S=4, P=100, dtype=BF16, rows=[-1 if n % 9 == 4 else (37 * n) % 100 for n in range(64)],
         one_token=True),
    dict(N=4, L=3, C=1024, W=4, S=3, P=4, dtype=F16),
    dict(N=3, L=2, C=200, W=8, S=10, P=12, dtype=F32, rows=[-1, 11, 4], pool_dtype=BF16),
    dict(N=2, L=6, C=136, W=2, S=1, P=2, dtype=BF16, activation=None),
    # vLLM's decode step on its own pool layout ([P, W - 1, C] seen as [P, C, W - 1]), updated in place
    dict(N=64, L=1, C=8192, W=4, S=3, P=100, dtype=BF16, rows=[-1 if n % 9 == 4 else (37 * n) % 100 for n in range(64)],
         one_token=True, pool_dtype=BF16, pool_layout="transposed"),
]


@pytest.mark.parametrize("case", UPDATE_CASES, ids=map(case_id, UPDATE_CASES))
def test_conv_update_matches_reference(case):
    check_case(torch_aura, DEV, "causal_conv1d_update", case)


@pytest.mark.sanitize
def test_conv_small_for_sanitizer(monkeypatch):
    from torch_aura.triton_kernels.gdn import conv

    check_op(torch_aura, "causal_conv1d", conv_args(DEV, 1, 70, 40, 4, BF16, offsets=[0, 2, 2, 70], S=5))
    monkeypatch.setattr(conv, "PREFILL_KERNEL", "window")
    check_op(torch_aura, "causal_conv1d", conv_args(DEV, 1, 70, 40, 4, BF16, offsets=[0, 2, 2, 70], S=5, seed=1))
    check_op(torch_aura, "causal_conv1d_update", update_args(DEV, 3, 2, 40, 4, 5, 4, BF16, rows=[3, -1, 0]))
    check_op(torch_aura, "causal_conv1d_update", update_args(DEV, 3, 1, 40, 4, 3, 4, BF16, rows=[3, -1, 0],
                                                             pool_layout="transposed"))


@pytest.mark.parametrize("prefill", ["taps", "window"])
def test_prefill_serves_a_state_pool_in_place(prefill, monkeypatch):
    """vLLM's prefill step over its bf16 pool (8192 channels): the launcher's pool form bitwise its plain form
    around a gather and a scatter; the null slot, padding and new requests (one shorter than the state) among
    the sequences."""
    from torch_aura.triton_kernels.gdn import conv

    monkeypatch.setattr(conv, "PREFILL_KERNEL", prefill)
    check_pool_prefill(conv, DEV, [0, 1000, 1003, 1004, 3000, 3001, 3003], 8192, 4, 3, BF16, [5, 0, -1, 7, 2, 9],
                       [True, True, True, False, False, True])


@pytest.mark.sanitize
def test_prefill_pool_small_for_sanitizer():
    from torch_aura.triton_kernels.gdn import conv

    check_pool_prefill(conv, DEV, [0, 1, 3, 40], 40, 4, 3, BF16, [2, 0, -1], [False, True, True])


def test_conv_duplicate_pool_rows_rejected_in_debug_mode(monkeypatch):
    monkeypatch.setenv("TORCH_AURA_DEBUG", "1")
    x, pool, weight, bias, act, _ = update_args(DEV, 2, 1, 16, 4, 4, 4, BF16)
    with pytest.raises(ValueError, match="distinct"):
        torch.ops.aura.causal_conv1d_update(x, pool, weight, bias, act, torch.tensor([1, 1], dtype=torch.int32,
                                                                                      device=DEV))


def _conv_step(x, xd, weight, bias, state, pool, cu, idx):
    """A packed prefill that leaves its states, then a decode step over a pool: (y, y_decode)."""
    return (torch_aura.causal_conv1d(x, weight, bias, state, cu, "silu"),
            torch_aura.causal_conv1d_update(xd, pool, weight, bias, "silu", idx))


def test_conv_cuda_graph_replay_is_bitwise_eager():
    x, weight, bias, state0, cu, _ = conv_args(DEV, 1, 300, 1024, 4, BF16, offsets=[0, 100, 100, 300], S=4, seed=1)
    xd, pool0, _, _, _, idx = update_args(DEV, 3, 1, 1024, 4, 4, 5, BF16, rows=[4, -1, 0], one_token=True, seed=2)
    state, pool = state0.clone(), pool0.clone()
    _conv_step(x, xd, weight, bias, state.clone(), pool.clone(), cu, idx)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_g, yd_g = _conv_step(x, xd, weight, bias, state, pool, cu, idx)
    x.copy_(conv_args(DEV, 1, 300, 1024, 4, BF16, seed=3)[0])
    xd.copy_(update_args(DEV, 3, 1, 1024, 4, 4, 5, BF16, one_token=True, seed=4)[0])
    state.copy_(state0)
    pool.copy_(pool0)
    graph.replay()
    state_e, pool_e = state0.clone(), pool0.clone()
    y_e, yd_e = _conv_step(x, xd, weight, bias, state_e, pool_e, cu, idx)
    assert torch.equal(y_g, y_e) and torch.equal(yd_g, yd_e)
    assert torch.equal(state, state_e) and torch.equal(pool, pool_e)


class _ConvBlock(torch.nn.Module):
    """The front end of a Qwen3-Next linear-attention layer: prefill into the pool's rows, then a decode step."""

    def forward(self, x, xd, weight, bias, state, pool, idx):
        y = torch_aura.causal_conv1d(x, weight, bias, state, activation="silu")
        pool[idx.long()] = state
        yd = torch_aura.causal_conv1d_update(xd, pool, weight, bias, "silu", idx)
        return y, yd


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compile_fullgraph_module_with_conv_and_update(mode):
    torch._dynamo.reset()
    x, weight, bias, state, _, _ = conv_args(DEV, 2, 130, 512, 4, BF16, S=4, seed=5)
    xd = update_args(DEV, 2, 1, 512, 4, 4, 4, BF16, one_token=True, seed=6)[0]
    idx = torch.tensor([3, 1], dtype=torch.int32, device=DEV)
    block = _ConvBlock()
    state_e, pool_e = state.clone(), torch.zeros(4, 512, 4, device=DEV)
    y_e, yd_e = block(x, xd, weight, bias, state_e, pool_e, idx)
    fn = torch.compile(block, fullgraph=True, mode=mode)
    for _ in range(3):
        state_c, pool_c = state.clone(), torch.zeros(4, 512, 4, device=DEV)
        y_c, yd_c = fn(x, xd, weight, bias, state_c, pool_c, idx)
    assert torch.equal(y_c, y_e) and torch.equal(yd_c, yd_e)
    assert torch.equal(state_c, state_e) and torch.equal(pool_c, pool_e)


def test_conv_new_lengths_compile_nothing():
    """After one fixed-length and one packed prefill and a decode step, 12 random lengths, batch mixes and
    pool sizes compile no conv kernel again (tests/build/test_gdn_variants.py: Triton's binder says the same)."""
    import random

    rng = random.Random(40)

    def call(B, T, offsets, N, P):
        check_op(torch_aura, "causal_conv1d", conv_args(DEV, B, T, 1024, 4, BF16, offsets=offsets, S=4))
        rows = rng.sample(range(P), N)
        check_op(torch_aura, "causal_conv1d_update", update_args(DEV, N, 1, 1024, 4, 4, P, BF16, rows=rows,
                                                                 one_token=True))

    call(1, 64, None, 2, 8)
    call(1, 100, [0, 30, 30, 100], 3, 8)
    before = _compiled_variants()
    for _ in range(12):
        cut = rng.randint(0, 900)
        call(rng.choice((1, 2, 5)), rng.randint(1, 1900), None, rng.randint(1, 40), rng.randint(40, 300))
        call(1, 900 + cut, [0, cut, cut, 900 + cut], rng.randint(1, 40), rng.randint(40, 300))
    assert _compiled_variants() == before


# ================================================================ plans (TORCH_AURA_GDN_PLAN)
PLAN_CASES = [  # geometry, and what of the launchers it takes
    (1, 4096, 2, 4, 128, 128, BF16, {}),  # a TP shard: the sequence-parallel pass
    (2, 1000, 16, 32, 128, 128, BF16, {"h0": True}),  # the pass beside w/u (sm_90)
    (1, 1300, 4, 8, 128, 128, F16, {"offsets": [0, 7, 7, 300, 1300], "l2norm": True}),  # varlen, L2 norm
    (2, 513, 2, 2, 64, 128, BF16, {"h0": True, "state_v_first": True}),
]


@pytest.mark.parametrize("pooled,direct,native", [(False, False, False), (True, False, False), (True, True, False),
                                                   (True, True, True)],
                         ids=["own-buffers", "pooled-buffers", "pooled-direct", "native"])
@pytest.mark.parametrize("case", PLAN_CASES, ids=[_id(c) for c in PLAN_CASES])
def test_planned_calls_equal_the_launchers(case, pooled, direct, native, monkeypatch):
    """A geometry's first call records its plan; later calls, new values each, replay it, eagerly and
    inside a CUDA graph: every output equals the launchers' bit for bit, with the replay's buffers its
    own allocations or carved from one workspace (``plan.POOL_BUFFERS``), with the C launches called by
    the replay itself, scratch from that workspace (``plan.DIRECT_LAUNCH``), and with the whole replay one
    call into ``native_replay.c`` (``_native.ENABLED``: every plan of these cases replays there)."""
    from torch_aura.triton_kernels import _native
    from torch_aura.triton_kernels.gdn import plan

    monkeypatch.setattr(plan, "POOL_BUFFERS", pooled)
    monkeypatch.setattr(plan, "DIRECT_LAUNCH", direct)
    monkeypatch.setattr(_native, "ENABLED", native)

    B, T, H, HV, K, V, dt, extra = case
    offsets, h0 = extra.get("offsets"), extra.get("h0", False)
    N = B if offsets is None else len(offsets) - 1
    cu = None if offsets is None else torch.tensor(offsets, dtype=torch.int32, device=DEV)
    # built before the capture, as docs/gdn.md asks of graphs: without it the op reads the chunk count on the host
    chunks = None if cu is None else chunk_indices_from_cu_seqlens(cu)

    def args(seed):
        q, k, v, g, beta = make_inputs(DEV, B, T, H, HV, K, V, dt, seed=seed)
        shape = (N, HV, V, K) if extra.get("state_v_first") else (N, HV, K, V)
        init = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(DEV) if h0 else None
        return (q, k, v, g, beta, None, init, cu, chunks, extra.get("l2norm", False),
                extra.get("state_v_first", False))

    calls = [args(seed) for seed in range(3)]
    want = [torch.ops.aura.gdn_chunk(*a) for a in calls]  # the launchers (plans off: the fixture above)
    monkeypatch.setattr(plan, "ENABLED", True)
    monkeypatch.setattr(plan, "_plans", {})
    got = [torch.ops.aura.gdn_chunk(*a) for a in calls]
    assert any(p for p in plan._plans.values()), "no plan was recorded"
    if native:
        assert all(p.native for p in plan._plans.values() if p), [p.native_refused for p in plan._plans.values() if p]
    static = [x.clone() if isinstance(x, torch.Tensor) else x for x in calls[0]]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.aura.gdn_chunk(*static)
    for a, w in zip(calls, want):
        for x, y in zip(static, a):
            if isinstance(x, torch.Tensor):
                x.copy_(y)
        graph.replay()
        got.append(tuple(o.clone() for o in out))
    for i, (o, w) in enumerate(zip(got, want + want)):
        for name, a, b in zip(("o", "final_state"), o, w):
            assert torch.equal(a, b), f"call {i}: planned {name} differs from the launchers'"


@pytest.mark.parametrize("dtype", [BF16, F16, F32], ids=dtype_id)
@pytest.mark.parametrize("L, H, HV, K, V", [(0, 2, 4, 32, 32), (1, 1, 1, 16, 16), (8193, 16, 32, 128, 128),
                                            (37, 3, 6, 96, 80), (5, 2, 4, 256, 256)])
def test_post_conv_matches_torch(L, H, HV, K, V, dtype):
    """vLLM's post-conv step in one launch (gdn/gates.py): Qwen3-Next's heads over a prefill step and odd shapes."""
    from torch_aura.triton_kernels.gdn.gates import gdn_post_conv

    for l2norm, g_exp in ((True, False), (False, True)):
        check_post_conv(gdn_post_conv, DEV, L, H, HV, K, V, dtype, l2norm, g_exp)


@pytest.mark.sanitize
def test_post_conv_small_for_sanitizer():
    from torch_aura.triton_kernels.gdn.gates import gdn_post_conv

    check_post_conv(gdn_post_conv, DEV, 7, 3, 6, 96, 80, BF16)


@pytest.mark.parametrize("N,H,HV,K,V", [(32, 16, 32, 128, 128), (257, 16, 32, 128, 128), (5, 3, 6, 96, 80)])
def test_packed_decode_in_one_launch_equals_gates_then_rule(N, H, HV, K, V):
    """vLLM's packed decode as one launch (the rule's ``gates=`` and ``null=``): bitwise the gates kernel then
    the rule, on vLLM's bf16 [P, HV, V, K] pool with its null slot and padding."""
    from torch_aura.triton_kernels.gdn import gates, recurrent

    check_recurrent_raw_gates(recurrent, gates, DEV, N, H, HV, K, V, BF16)


@pytest.mark.sanitize
def test_packed_decode_in_one_launch_small_for_sanitizer():
    from torch_aura.triton_kernels.gdn import gates, recurrent

    check_recurrent_raw_gates(recurrent, gates, DEV, 5, 3, 6, 96, 80, BF16)


@pytest.mark.parametrize("N,H,HV,K,V", [(32, 16, 32, 128, 128), (257, 16, 32, 128, 128), (5, 3, 6, 96, 80)])
def test_one_token_body_equals_the_loop(N, H, HV, K, V):
    """``recurrent.ONE_TOKEN`` (the packed decode's rule without its token loop): bitwise the loop, both decode
    forms, on vLLM's bf16 [P, HV, V, K] pool."""
    from torch_aura.triton_kernels.gdn import recurrent

    check_one_token_body(recurrent, DEV, N, H, HV, K, V, BF16)


@pytest.mark.sanitize
def test_one_token_body_small_for_sanitizer():
    from torch_aura.triton_kernels.gdn import recurrent

    check_one_token_body(recurrent, DEV, 5, 3, 6, 96, 80, BF16)


def test_launcher_only_arguments_equal_the_op():
    """What vLLM's adapters pass the launchers directly: the conv update's ``null=`` (its null slot untranslated)
    against the op with that slot as -1, and the decode rule's ``out=`` against the op's own o; bitwise."""
    from torch_aura.triton_kernels.gdn import conv, recurrent

    x, pool, weight, bias, act, idx = update_args(DEV, 6, 1, 1024, 4, 3, 9, BF16, rows=[2, 0, 5, -1, 8, 0],
                                                  one_token=True, pool_dtype=BF16, pool_layout="transposed")
    as_minus_one = torch.where(idx == 0, -1, idx).to(torch.int32)
    pool_a, pool_b = pool.clone(), pool.clone()
    want = torch.ops.aura.causal_conv1d_update(x, pool_a, weight, bias, act, as_minus_one)
    assert torch.equal(conv.causal_conv1d_update(x, pool_b, weight, bias, act, idx, null=0), want)
    assert torch.equal(pool_a, pool_b)
    q, k, v, g, beta = make_inputs(DEV, 6, 1, 16, 32, 128, 128, BF16)
    state = torch.randn(12, 32, 128, 128, device=DEV, dtype=BF16)
    rows = torch.tensor([3, -1, 7, 11, 0, 5], dtype=torch.int32, device=DEV)
    s_a, s_b = state.clone(), state.clone()
    o = torch.ops.aura.gdn_recurrent(q, k, v, g, beta, s_a, rows, None, None, True, True)
    out = torch.empty_like(o)
    recurrent.gdn_recurrent(q, k, v, g, beta, s_b, rows, None, None, True, True, out=out)
    assert torch.equal(out, o) and torch.equal(s_a, s_b)
