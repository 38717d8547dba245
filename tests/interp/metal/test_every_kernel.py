"""Every shipped Metal kernel instantiation (every dtype and head dim of csrc/mps/shaders) runs
under the emulator against the reference, on the smallest input that reaches it; then the test
checks that no registered kernel was left unlaunched."""

import torch
import torch.nn.functional as F

import torch_aura
from _compare import check_op, emulated_results, reference_results
from torch_aura.reference import aura as ref_aura

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
ONE = ("forward",)


def _decode_sweep(emu):
    g = torch.Generator().manual_seed(0)
    for dt in FLOATS:
        for D in (64, 80, 96, 128, 192, 256, 512):
            q = torch.randn(1, 2, D, generator=g).to(dt)
            k, v = (torch.randn(1, 1, 5, D, generator=g).to(dt) for _ in range(2))
            # one sequence and one KV head: the automatic plan splits, so the merge into dt runs too
            check_op(emu, "flash_decode", (q, k, v, torch.tensor([5], dtype=torch.int32), None, None, 0), ONE)
        po, pl = torch.randn(3, 1, 2, 64, generator=g).to(dt), torch.randn(3, 1, 2, generator=g)
        check_op(emu, "merge_attn_states", (po, pl), ONE)


def _gdn_sweep(emu):
    g = torch.Generator().manual_seed(1)
    for dt in FLOATS:
        q, k = (F.normalize(torch.randn(1, 9, 1, 8, generator=g), dim=-1).to(dt) for _ in range(2))
        v = torch.randn(1, 9, 2, 8, generator=g).to(dt)
        gg = F.logsigmoid(torch.randn(1, 9, 2, generator=g)).to(dt)  # 16-bit g and beta: the casts run
        beta = torch.rand(1, 9, 2, generator=g).to(dt)
        h0 = torch.randn(1, 2, 8, 8, generator=g).to(dt)
        tol = {} if dt == torch.float32 else {"ratio": 2e-2}
        check_op(emu, "gdn_chunk", (q, k, v, gg, beta, None, h0, None, None, True, False), ONE, **tol)
        for state_dt in FLOATS:
            pool = torch.randn(1, 2, 8, 8, generator=g).to(state_dt)
            check_op(emu, "gdn_recurrent", (q, k, v, gg, beta, pool), ONE, **tol)


def _conv_sweep(emu):
    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(3, 4, generator=g), torch.randn(3, generator=g)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)  # varlen: the state roll is its own dispatch
    for dt in FLOATS:
        x = torch.randn(1, 5, 3, generator=g).to(dt)
        for state_dt in FLOATS:
            check_op(emu, "causal_conv1d", (x, w, b, torch.randn(2, 3, 4, generator=g).to(state_dt), cu, "silu"), ONE)


def _aura_sweep(emu):
    g = torch.Generator().manual_seed(2)
    for D in (64, 128, 256, 512):
        cb, bd = torch_aura.aura_codebook(4, D)
        km, vm = torch_aura.aura_sign_mask(D, kind="k"), torch_aura.aura_sign_mask(D, kind="v")
        k, v = torch.randn(1, 1, 3, D, generator=g), torch.randn(1, 1, 3, D, generator=g)
        kc, kn = ref_aura.aura_encode(k, cb, bd, 4, km)
        vc, vn = ref_aura.aura_encode(v, cb, bd, 4, vm)
        lens = torch.tensor([3], dtype=torch.int32)
        for dt in FLOATS:
            x = torch.randn(2, D, generator=g).to(dt)
            check_op(emu, "hadamard_rotate", (x, km, 1.0, False), ONE)
            got = emulated_results(emu, "aura_encode", (x, cb, bd, 4, km))
            want = reference_results("aura_encode", (x, cb, bd, 4, km))
            torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-7)
            assert (ref_aura.unpack_codes(got[0], 4, D) - ref_aura.unpack_codes(want[0], 4, D)).abs().max() <= 1
            check_op(emu, "aura_dequantize", (kc, kn, cb, 4, km, dt), ONE)
            q = torch.randn(1, 2, D, generator=g).to(dt)
            check_op(emu, "aura_flash_p1", (q, kc, kn, vc, vn, lens, cb, cb, 4, 4), ONE)
            check_op(emu, "aura_decode", (q, kc, kn, vc, vn, lens, cb, cb, km, vm, 4, 4), ONE)
            # aura_append: its slots kernel, then the write kernel of dt for K and V (the last token past T_cap)
            kv = torch.randn(2, 1, 2, 1, D, generator=g).to(dt)
            args = (kv[0], kv[1], kc.clone(), kn.clone(), vc.clone(), vn.clone(), torch.tensor([2], dtype=torch.int32),
                    cb, bd, cb, bd, 4, 4, km, vm)
            got, want = emulated_results(emu, "aura_append", args), reference_results("aura_append", args)
            assert torch.equal(got[4], want[4]) and emu.last_launches == 3
            for i in (0, 2):
                assert (ref_aura.unpack_codes(got[i], 4, D) - ref_aura.unpack_codes(want[i], 4, D)).abs().max() <= 1
                torch.testing.assert_close(got[i + 1], want[i + 1], rtol=1e-5, atol=1e-7)


def test_every_shipped_kernel_runs_and_matches(emu):
    _decode_sweep(emu)
    _gdn_sweep(emu)
    _conv_sweep(emu)
    _aura_sweep(emu)
    shipped = {n for n in emu.kernel_names() if not n.startswith(("selftest_", "probe_"))}
    missing = shipped - emu.launched_kernels()
    assert not missing, f"registered Metal kernels never launched: {sorted(missing)}"
