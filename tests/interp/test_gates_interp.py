"""``triton_kernels/gdn/gates.py`` (vLLM's GDN preparation in one launch) under the interpreter, against PyTorch's
formulas (the adapters' CPU path). The gates: odd head counts, engine row views, the softplus threshold and its
tiny-exponent end, every input dtype, and the pool rows of vLLM's slots (negatives and the null slot -> -1).
The post-conv step: q / k split and l2-normalised per head, v split, gates, on odd head shapes and row views."""

import pytest
import torch
import torch.nn.functional as F
from _gdn_check import check_post_conv, torch_gates

from torch_aura.triton_kernels.gdn.gates import gdn_gates, gdn_post_conv


@pytest.mark.parametrize("M, HV", [(0, 4), (1, 1), (7, 3), (5, 32), (3, 48)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale, threshold", [(1.0, 20.0), (0.5, 20.0), (2.0, 10.0)])
def test_gates_match_the_formula(M, HV, dtype, scale, threshold):
    gen = torch.Generator().manual_seed(M * 100 + HV)
    ba = (torch.randn(M, 2 * HV, generator=gen) * 30).to(dtype)  # vLLM's [b | a] projection: row views
    b, a = ba[:, :HV], ba[:, HV:]
    if M:
        a[0, 0] = 20.0 / scale  # the threshold itself (before dt_bias moves it), and far on each side
        a[-1, -1] = -90.0
    A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)
    g, beta, rows = gdn_gates(a, b, A_log, dt_bias, scale, threshold)
    want_g, want_beta = torch_gates(a, b, A_log, dt_bias, scale, threshold)
    assert rows is None and g.shape == a.shape and g.dtype == beta.dtype == torch.float32
    torch.testing.assert_close(g, want_g, rtol=2e-6, atol=1e-30)
    torch.testing.assert_close(beta, want_beta, rtol=2e-6, atol=1e-30)


def test_softplus_keeps_the_digits_of_a_tiny_exponent():
    """log(1 + e) rounds to 0 in fp32 once e < 6e-8; g then still carries -exp(A_log) * e, as log1p gives."""
    a = torch.tensor([[-40.0, -17.0, -9.0, 0.0, 19.9, 20.1]])
    g, _, _ = gdn_gates(a, torch.zeros_like(a), torch.zeros(6), torch.zeros(6))
    want = -F.softplus(a.double()).float()
    torch.testing.assert_close(g, want, rtol=1e-6, atol=0)
    assert (g[0, :3] < 0).all()


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("null", [0, -1, 5])
def test_rows_take_valid_slots_and_skip_the_rest(slot_dtype, null):
    slots = torch.tensor([3, 0, -1, 5, 7, -4], dtype=slot_dtype)
    a = torch.randn(6, 1, 4)
    _, _, rows = gdn_gates(a, torch.randn(6, 1, 4), torch.zeros(4), torch.zeros(4), slots=slots, null=null)
    want = torch.where((slots >= 0) & (slots != null), slots, -1).to(torch.int32)
    assert rows.dtype == torch.int32 and torch.equal(rows, want)


@pytest.mark.parametrize("L, H, HV, K, V", [(0, 2, 4, 32, 32), (1, 1, 1, 16, 16), (5, 3, 6, 24, 40),
                                            (9, 16, 32, 128, 128), (4, 2, 2, 256, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("l2norm, g_exp", [(True, False), (False, True)])
def test_post_conv_splits_normalises_and_gates(L, H, HV, K, V, dtype, l2norm, g_exp):
    check_post_conv(gdn_post_conv, "cpu", L, H, HV, K, V, dtype, l2norm, g_exp)


def test_post_conv_rejects_a_row_of_the_wrong_width():
    with pytest.raises(ValueError, match="2\\*H\\*K \\+ HV\\*V"):
        gdn_post_conv(torch.randn(2, 100), torch.randn(2, 2), torch.randn(2, 2), torch.zeros(2), torch.zeros(2),
                      2, 16, 16)
