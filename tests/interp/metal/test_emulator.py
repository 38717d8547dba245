"""The emulator itself (docs/metal.md §3, §6): it must expose what a GPU would punish (missing
barriers, divergent collectives, threadgroup memory over 32 KiB, oversized groups) and compute
what Metal defines (SIMD-group functions, the simdgroup_matrix lane layout, RNE rounding)."""

import pytest
import torch

import _metal

POISON = 0xFFFFFFFF  # uninitialised threadgroup memory reads as all ones


def _run(emu, kernel, groups, size, buffers, order="forward", seed=0):
    emu.run_kernel(kernel, groups, size, buffers, lane_order=order, seed=seed)
    return buffers


def test_missing_barrier_is_exposed(emu):
    # Forward order: thread 0 reads slot 1 before thread 1 wrote it, so it sees the poison; the
    # same kernel with the barrier is right in every order.
    n = 64
    seen = []
    for order in ("forward", "reverse", "shuffled"):
        out = torch.zeros(n, dtype=torch.int32)
        _run(emu, "selftest_neighbour_racy", [1], [n], [out], order)
        seen.append(out.clone())
    expected = (torch.arange(n) + 1) % n
    assert any(((s.long() & POISON) == POISON).any() for s in seen), "the racy kernel never read poisoned memory"
    assert not all(torch.equal(s.long(), expected) for s in seen)
    for order in ("forward", "reverse", "shuffled"):
        out = torch.zeros(n, dtype=torch.int32)
        _run(emu, "selftest_neighbour_synced", [1], [n], [out], order, seed=5)
        assert torch.equal(out.long(), expected), order


def test_threads_at_different_barriers_abort_with_both_lines(emu):
    with pytest.raises(_metal.EmulatorError, match=r"different barriers: .*selftest.metal:\d+.*selftest.metal:\d+"):
        _run(emu, "selftest_split_barrier", [1], [32], [torch.zeros(32, dtype=torch.int32)])


def test_barrier_in_loops_of_different_trip_counts_is_an_error(emu):
    with pytest.raises(_metal.EmulatorError, match=r"returned after 2 barriers while thread \d+ waits at its barrier number 3"):
        _run(emu, "selftest_divergent_trip_count", [1], [64], [torch.zeros(64, dtype=torch.int32)])


def test_return_before_barrier_is_legal(emu):
    out = torch.full((64,), -1, dtype=torch.int32)
    live = torch.tensor([40], dtype=torch.int32)
    _run(emu, "selftest_early_return", [1], [64], [out, live], "reverse")
    assert torch.equal(out[:40], torch.arange(39, -1, -1, dtype=torch.int32) * 10)
    assert (out[40:] == -1).all()


def test_collective_in_divergent_branch_is_an_error(emu):
    with pytest.raises(_metal.EmulatorError, match="reached by only some live lanes"):
        _run(emu, "selftest_divergent_sum", [1], [32], [torch.zeros(32)])


def test_threadgroup_memory_limit(emu):
    with pytest.raises(_metal.EmulatorError, match="exceeds the 32 KiB"):
        _run(emu, "selftest_too_much_threadgroup_memory", [1], [32], [torch.zeros(32)])


def test_thread_limit(emu):
    with pytest.raises(_metal.EmulatorError, match="1 to 1024"):
        _run(emu, "selftest_early_return", [1], [1025], [torch.zeros(1025, dtype=torch.int32), torch.tensor([1])])


def _simd_reference(x: torch.Tensor) -> list[torch.Tensor]:
    """What each SIMD-group function returns for x, per SIMD group of 32 (the last one partial)."""
    n = x.numel()
    outs = [torch.zeros(n) for _ in range(14)]
    for s0 in range(0, n, 32):
        v = x[s0 : s0 + 32]
        m = v.numel()
        lanes = torch.arange(m)
        res = [v.sum().expand(m), v.max().expand(m), v.min().expand(m), torch.cumsum(v, 0) - v,
               torch.cumsum(v, 0),
               torch.where(lanes + 3 < m, v[(lanes + 3).clamp(max=m - 1)], v),
               torch.where(lanes >= 5, v[(lanes - 5).clamp(min=0)], v),
               torch.where((lanes ^ 6) < m, v[(lanes ^ 6).clamp(max=m - 1)], v),
               v[2].expand(m), v[(lanes * 7) % 16],
               torch.tensor(float(sum(1 << int(i) for i in lanes if v[i] > 0))).expand(m),
               torch.tensor(float((v > 2.5).any())).expand(m), torch.tensor(float((v > -100).all())).expand(m),
               v[((lanes + 1) % 32).clamp(max=m - 1)]]
        for o, r in zip(outs, res):
            o[s0 : s0 + 32] = r
    return outs


def test_simd_group_functions(emu):
    # 48 threads: one full SIMD group and one of 16 live lanes (collectives act on live lanes).
    n = 48
    x = torch.randn(n, generator=torch.Generator().manual_seed(0)).round(decimals=2)
    out = torch.zeros(14 * n)
    for order in ("forward", "shuffled"):
        _run(emu, "selftest_collectives", [1], [n], [x, out], order, seed=2)
        got = out.view(14, n)
        names = ["sum", "max", "min", "prefix_exclusive", "prefix_inclusive", "shuffle_down", "shuffle_up",
                 "shuffle_xor", "broadcast", "shuffle", "ballot", "any", "all", "rotate_down"]
        for name, g, r in zip(names, got, _simd_reference(x)):
            if name == "rotate_down":
                g, r = g[:32], r[:32]  # the partial group's rotation wraps into dead lanes
            torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-5, msg=name)


# docs/metal.md §3: the documented simdgroup_matrix layout, lane -> (row, first column).
LAYOUT = {lane: (4 * (lane // 16) + (lane // 2) % 4, 4 * ((lane // 8) % 2) + 2 * (lane % 2)) for lane in range(32)}


def test_simdgroup_layout_probe_reads_the_documented_table(emu):
    # The same probe kernel a Mac runs (tests/mps/probes): on Linux it checks the emulator models
    # the documented table; on a Mac it checks the table against the hardware.
    cells = torch.arange(64, dtype=torch.float32)
    out = torch.zeros(64 * 3)
    _run(emu, "probe_simdgroup_layout", [1], [32], [cells, out])
    for lane, e, value in out.view(64, 3).tolist():
        row, col0 = LAYOUT[int(lane)]
        assert value == 8 * row + col0 + e, (lane, e, value)
    # spot checks straight from the table in docs/metal.md
    assert LAYOUT[9] == (0, 6) and LAYOUT[18] == (5, 0) and LAYOUT[31] == (7, 6)


@pytest.mark.parametrize("dtype,kernel", [(torch.float32, "selftest_mma_f32"), (torch.float16, "selftest_mma_f16"),
                                          (torch.bfloat16, "selftest_mma_bf16")])
@pytest.mark.parametrize("transpose", [0, 1])
def test_simdgroup_multiply_accumulate(emu, dtype, kernel, transpose):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(8, 8, generator=g).to(dtype)
    b = torch.randn(8, 8, generator=g).to(dtype)
    c = torch.randn(8, 8, generator=g)
    d = torch.zeros(8, 8)
    _run(emu, kernel, [1], [32], [a, b, c, d, torch.tensor([transpose], dtype=torch.int32)])
    a_eff = a.float().t() if transpose else a.float()
    torch.testing.assert_close(d, a_eff @ b.float() + c, rtol=1e-5, atol=1e-5)


def test_half_and_bfloat_round_to_nearest_even(emu):
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(4000, generator=g) * 10,
                   # exact ties: halfway between two bf16 / fp16 neighbours
                   torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 65520.0, -65504.0])])
    y = torch.randn(x.numel(), generator=g)
    n = x.numel()
    th, tb, hm, ba = (torch.zeros(n, dtype=dt) for dt in (torch.float16, torch.bfloat16, torch.float16, torch.bfloat16))
    _run(emu, "selftest_rounding", [n // 2], [2], [x, y, th, tb, hm, ba])
    assert torch.equal(th, x.to(torch.float16))
    assert torch.equal(tb, x.to(torch.bfloat16))
    # one rounding per operation, as the GPU computes half * half (torch: float math, one rounding)
    assert torch.equal(hm, x.half() * y.half())
    assert torch.equal(ba, x.bfloat16() + y.bfloat16())


def test_numerics_probe_runs(emu):
    # On a Mac this measures fast-math error; here the emulator's libm must agree with fp64.
    x = torch.linspace(-8, 8, 257)
    out = torch.zeros(13 * x.numel())
    _run(emu, "probe_numerics", [5], [64], [x, out, torch.tensor([x.numel()], dtype=torch.int32)])
    got = out.view(13, -1).double()
    xd = x.double()
    torch.testing.assert_close(got[0], xd.exp(), rtol=1e-6, atol=0)
    torch.testing.assert_close(got[9], xd.tanh(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got[12], (x.bfloat16() * torch.tensor(1.7).bfloat16()).double())


def test_every_shader_kernel_is_registered(emu):
    names = set(emu.kernel_names())
    assert {"flash_decode_split_f16_128", "merge_attn_states_f32_bf16"} <= names


def test_every_op_has_a_metal_plan(emu):
    # register.mm registers exactly the planned ops for the MPS key: all of them
    from torch_aura._schema import OPS

    assert sorted(emu.planned_ops()) == sorted(OPS)


def test_plan_output_specs_equal_the_fakes(emu):
    # the outputs register.mm allocates from a plan are those the fake (torch_aura/_checks) promises
    from _samples import all_samples
    from torch_aura import _checks

    for name, samples in all_samples().items():
        for s in samples("cpu"):
            cpp = emu.output_specs(name, s.args)
            py = [(tuple(t.shape), t.dtype) for t in _checks.for_op(name)(*s.args)]
            assert cpp == py, f"{name}/{s.id}: C++ output specs {cpp} != fake specs {py}"


def test_reading_past_the_end_of_a_buffer_is_an_error_naming_it(emu):
    # every argument sits right before a PROT_NONE page: one element too far faults, and the
    # fault becomes an error naming the buffer instead of a crash
    x, y = torch.arange(64, dtype=torch.float32), torch.zeros(64)
    _run(emu, "selftest_shifted_copy", [2], [32], [x, y, torch.tensor([0], dtype=torch.int32)])
    assert torch.equal(y, x)
    with pytest.raises(_metal.EmulatorError, match=r"memory fault .* past the end of argument 0 \(bound at slot 0\)"):
        _run(emu, "selftest_shifted_copy", [2], [32], [x, y, torch.tensor([1], dtype=torch.int32)])
    # the process survives and the emulator keeps working
    _run(emu, "selftest_shifted_copy", [2], [32], [x, y, torch.tensor([0], dtype=torch.int32)])
