"""Bad input raises ValueError under torch.compile(fullgraph=True) as it does eagerly (the README's
own example compiles the ops), for every family; the message is the eager one."""

import pytest
import torch

import torch_aura


def _flash_decode_bad():
    q, k = torch.randn(2, 4, 64), torch.randn(2, 2, 16, 64)
    return torch_aura.flash_decode, (q, k, k.clone(), torch.tensor([3, 4], dtype=torch.int64))


def _aura_decode_bad():
    cache = torch_aura.AuraCache("aura4", batch=2, kv_heads=2, head_dim=64, capacity=8)
    q = torch.randn(2, 4, 128)  # head dim 128 against a D = 64 cache
    return torch_aura.aura_decode, (q, cache.k_codes, cache.k_norms, cache.v_codes, cache.v_norms,
                                    cache.seq_lens, cache.k_codebook, cache.v_codebook, cache.k_sign_mask,
                                    cache.v_sign_mask, 4, 4)


def _gdn_chunk_bad():
    q = torch.randn(1, 8, 2, 16)
    v = torch.randn(1, 8, 3, 16)  # 3 value heads over 2 key heads: not a multiple
    return torch_aura.gdn_chunk, (q, q.clone(), v, -torch.rand(1, 8, 3), torch.rand(1, 8, 3))


@pytest.mark.parametrize("case", [_flash_decode_bad, _aura_decode_bad, _gdn_chunk_bad],
                         ids=["flash_decode", "aura_decode", "gdn_chunk"])
def test_value_error_compiled_as_eagerly(case):
    fn, args = case()
    with pytest.raises(ValueError) as eager:
        fn(*args)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: fn(*a), fullgraph=True)
    with pytest.raises(ValueError) as traced:
        compiled(*args)
    assert str(eager.value).split("\n")[0] in str(traced.value)
