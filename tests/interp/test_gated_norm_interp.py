"""``triton_kernels/gdn/gated_norm.py`` (the gated RMSNorm that ends a transformers GDN layer, one launch) under
the interpreter, against transformers' own ``*RMSNormGated`` forward: row counts around a program's block, head
dims that are not a power of two, gate rows that are views of a wider projection, weights in the activations'
dtype (a rounded product) and in fp32, and the integration's forward inside a real Qwen3-Next layer."""

import pytest
import torch

from torch_aura.triton_kernels.gdn import gated_norm

transformers = pytest.importorskip("transformers")
from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next  # noqa: E402

# one ulp of the output dtype (its last rounding may differ: rsqrt and exp are not PyTorch's to the bit)
TOL = {torch.float32: dict(rtol=2e-6, atol=2e-6), torch.float16: dict(rtol=1e-3, atol=1e-3)}


def _norm(D, weight_dtype, gen):
    norm = qwen3_next.Qwen3NextRMSNormGated(D, eps=1e-6).to(weight_dtype)
    norm.weight.data = (1 + 0.3 * torch.randn(D, generator=gen)).to(weight_dtype)
    return norm


@pytest.mark.parametrize("N, D", [(0, 128), (1, 128), (31, 128), (32, 128), (33, 128), (70, 96), (5, 32),
                                  (9, 256), (3, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("weight_dtype", ["same", torch.float32])
def test_kernel_matches_transformers_gated_norm(N, D, dtype, weight_dtype):
    gen = torch.Generator().manual_seed(N * 1000 + D)
    norm = _norm(D, dtype if weight_dtype == "same" else weight_dtype, gen)
    o = (3 * torch.randn(N, D, generator=gen)).to(dtype)
    z = (2 * torch.randn(N, D + 24, generator=gen)).to(dtype)[:, 5:5 + D]  # the gate: a view of a wider row
    want = norm(o, z)
    got = gated_norm.gated_rms_norm(o, z, norm.weight, norm.variance_epsilon)
    assert got.shape == want.shape and got.dtype == want.dtype == dtype
    torch.testing.assert_close(got, want, **TOL[dtype])


def test_leading_dims_and_a_zero_row():
    """``[B, T, HV, D]`` calls are rows of D; an all-zero row normalises to zeros (rsqrt(eps), not NaN)."""
    gen = torch.Generator().manual_seed(7)
    norm = _norm(64, torch.float32, gen)
    o, z = torch.randn(2, 3, 4, 64, generator=gen), torch.randn(2, 3, 4, 64, generator=gen)
    o[1, 2, 3] = 0
    got = gated_norm.gated_rms_norm(o, z, norm.weight, norm.variance_epsilon)
    torch.testing.assert_close(got, norm(o, z), **TOL[torch.float32])
    assert got[1, 2, 3].eq(0).all()


@torch.no_grad()
def test_the_integration_serves_a_qwen3_next_layer(monkeypatch):
    """With the layers patched and the kernel allowed (CUDA-only otherwise), a real Qwen3-Next GDN layer's norm
    runs through the kernel and its output is transformers' own."""
    from torch_aura.integrations.transformers import gdn

    config = transformers.Qwen3NextConfig(hidden_size=64, linear_num_key_heads=2, linear_num_value_heads=4,
                                          linear_key_head_dim=16, linear_value_head_dim=32, num_hidden_layers=1,
                                          layer_types=["linear_attention"], num_experts=2, vocab_size=64)
    torch.manual_seed(0)
    layer = qwen3_next.Qwen3NextGatedDeltaNet(config, layer_idx=0).eval()
    x = torch.randn(2, 9, 64)
    want = layer(x)
    calls = []
    kernel = gated_norm.gated_rms_norm
    monkeypatch.setattr(gated_norm, "gated_rms_norm", lambda *a: calls.append(a[0].shape) or kernel(*a))
    monkeypatch.setattr(gdn, "_fused_norm", lambda norm, x, gate: True)
    gdn.unpatch()
    try:
        gdn.patch(["transformers.models.qwen3_next.modeling_qwen3_next"])
        got = layer(x)
    finally:
        gdn.unpatch()
    assert calls == [torch.Size([2 * 9 * 4, 32])]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)  # the GDN kernels' own fp32 rounding included
