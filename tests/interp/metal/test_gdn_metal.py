"""Gated DeltaNet kernels (csrc/mps/shaders/gdn.metal) under the emulator vs the reference:
every stage on its own (inputs from the reference stages), the composed gdn_chunk and the
recurrent decode step, on the shared samples and on T = 0, 1, 63, 64, 65 with K, V up to 256."""

import pytest
import torch
import torch.nn.functional as F

import _metal
from _compare import check_op
from _gdn_check import check_decay_domain
from _samples.gdn import SAMPLES
from _util import GDN_CHUNK_RATIO, GDN_RECURRENT_RATIO, dtype_id
from torch_aura.reference import gdn as ref


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_samples(emu, name):
    for sample in SAMPLES[name]("cpu"):
        check_op(emu, name, sample.args, orders=("forward", "shuffled"))


def _inputs(B, T, H, HV, K, V, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=g), dim=-1).to(dtype)
    k = F.normalize(torch.randn(B, T, H, K, generator=g), dim=-1).to(dtype)
    v = torch.randn(B, T, HV, V, generator=g).to(dtype)
    gg = F.logsigmoid(torch.randn(B, T, HV, generator=g))
    beta = torch.rand(B, T, HV, generator=g)
    return q, k, v, gg, beta


# (B, T, H, HV, K, V): chunk edges, GVA ratios 1..3, K and V not multiples of 8, the 256 limit.
SHAPES = [(1, 0, 1, 1, 16, 16), (2, 1, 1, 2, 8, 24), (1, 63, 2, 2, 33, 17), (1, 64, 1, 3, 64, 40),
          (2, 65, 1, 1, 20, 64), (1, 130, 1, 1, 256, 256)]


# every shape in fp32 and bf16, except the 256 x 256 one (fp32 only: it alone takes ~8 s)
STAGE_CASES = [(s, dt) for s in SHAPES for dt in (torch.float32, torch.bfloat16) if s[4] * s[5] <= 128 * 128 or dt == torch.float32]


@pytest.mark.parametrize("shape,dtype", STAGE_CASES,
                         ids=["B{}-T{}-H{}-HV{}-K{}-V{}-".format(*s) + dtype_id(dt) for s, dt in STAGE_CASES])
def test_chunk_stages_and_whole(emu, shape, dtype):
    B, T, H, HV, K, V = shape
    q, k, v, g, beta = _inputs(B, T, H, HV, K, V, dtype, seed=T + K)
    tol = {} if dtype == torch.float32 else {"ratio": GDN_CHUNK_RATIO}
    orders = ("forward",) if T > 64 else ("forward", "reverse")
    g_cum = ref.gdn_chunk_cumsum(g)
    check_op(emu, "gdn_chunk_cumsum", (g, None, None), orders=orders)
    Ai = ref.gdn_kkt_solve(k, g_cum, beta)
    check_op(emu, "gdn_kkt_solve", (k, g_cum, beta, None, None), orders=orders, **tol)
    w, u = ref.gdn_recompute_w_u(k, v, beta, Ai, g_cum)
    check_op(emu, "gdn_recompute_w_u", (k, v, beta, Ai, g_cum, None, None), orders=orders, **tol)
    h0 = torch.randn(B, HV, K, V, generator=torch.Generator().manual_seed(7))
    h, v_new, _ = ref.gdn_fwd_h(k, w, u, g_cum, h0)
    check_op(emu, "gdn_fwd_h", (k, w, u, g_cum, h0, None, None, False), orders=orders, **tol)
    check_op(emu, "gdn_fwd_o", (q, k, v_new, h, g_cum, None, None, None, False), orders=orders, **tol)
    check_op(emu, "gdn_chunk", (q, k, v, g, beta, None, h0), orders=("forward",), **tol)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
def test_recurrent_pool_varlen_skip_and_l2norm(emu, dtype, state_dtype):
    # 3 sequences packed in T = 9 (lengths 4, 0, 5), a shuffled 5-row pool, one skipped sequence
    q, k, v, g, beta = _inputs(1, 9, 2, 4, 40, 20, dtype, seed=3)
    pool = torch.randn(5, 4, 20, 40, generator=torch.Generator().manual_seed(4)).to(state_dtype)  # [V, K]
    cu = torch.tensor([0, 4, 4, 9], dtype=torch.int64)
    for indices in (torch.tensor([3, 0, 1], dtype=torch.int32), torch.tensor([-1, 2, 4], dtype=torch.int32)):
        check_op(emu, "gdn_recurrent", (q, k, v, g, beta, pool, indices, cu, 0.5, True, True),
                 orders=("forward", "shuffled"),
                 **({} if dtype == torch.float32 and state_dtype == torch.float32 else {"ratio": GDN_RECURRENT_RATIO}))


def test_chunk_equals_recurrent_on_a_long_varlen_batch(emu):
    # the two emulated formulations agree with each other (independent kernels, same math)
    q, k, v, g, beta = _inputs(1, 150, 1, 2, 24, 16, torch.float32, seed=5)
    cu = torch.tensor([0, 70, 70, 150], dtype=torch.int32)
    o_chunk, s_chunk = emu.run_op("gdn_chunk", q, k, v, g, beta, None, None, cu, None, False, False)
    pool = torch.zeros(3, 2, 24, 16)
    o_rec = emu.run_op("gdn_recurrent", q, k, v, g, beta, pool, None, cu, None, False, False)
    torch.testing.assert_close(o_chunk, o_rec, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s_chunk, pool, rtol=1e-4, atol=1e-4)


def test_bad_pool_rows_and_offsets_never_fault(emu):
    # direct calls with data the reference rejects: an index past the pool is skipped (o = 0,
    # nothing written), offsets past T are clamped; nothing is read or written out of bounds
    q, k, v, g, beta = _inputs(1, 6, 1, 1, 16, 8, torch.float32, seed=9)
    pool = torch.randn(2, 1, 16, 8)
    before = pool.clone()
    o = emu.run_op("gdn_recurrent", q, k, v, g, beta, pool, torch.tensor([10**6, 1], dtype=torch.int32),
                   torch.tensor([0, 3, 10**6], dtype=torch.int32))
    assert torch.equal(o[0, :3], torch.zeros(3, 1, 8)) and torch.equal(pool[0], before[0])
    assert not torch.equal(pool[1], before[1])  # the valid sequence (clamped to end at T) ran


def test_strided_state_indices_are_refused_by_name(emu):
    # the kernel reads state_indices densely: a strided view would update the wrong pool rows
    q, k, v, g, beta = _inputs(1, 4, 1, 1, 16, 8, torch.float32, seed=10)
    indices = torch.tensor([0, 9, 1, 9], dtype=torch.int32)[::2]
    with pytest.raises(_metal.EmulatorError, match="state_indices: expected a unit stride"):
        emu.run_op("gdn_recurrent", q, k, v, g, beta, torch.randn(2, 1, 16, 8), indices, torch.tensor([0, 2, 4]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_g_outside_the_usual_range(emu, dtype):
    # -inf (full forget) and g > 0 (read as 0): finite, and equal to the fp64 recurrence
    from types import SimpleNamespace

    impl = SimpleNamespace(gdn_chunk=lambda *a: emu.run_op("gdn_chunk", *a),
                           gdn_recurrent=lambda *a: emu.run_op("gdn_recurrent", *a))
    check_decay_domain(impl, "cpu", dtype)
