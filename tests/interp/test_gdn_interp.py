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
