"""Small input rules that used to disagree between entry points (issue 25, item 7)."""

import numpy as np
import pytest
import torch

import torch_aura


def _decode_inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 64, generator=g), torch.randn(2, 2, 16, 64, generator=g), torch.randn(2, 2, 16, 64, generator=g)
    return q, k, v, torch.tensor([3, 16], dtype=torch.int32)


def test_a_0d_tensor_scale_is_accepted_by_the_wrapper_as_by_the_op():
    q, k, v, s = _decode_inputs()
    by_float, _ = torch_aura.flash_decode(q, k, v, s, scale=0.5)
    assert torch.equal(torch_aura.flash_decode(q, k, v, s, scale=torch.tensor(0.5))[0], by_float)
    assert torch.equal(torch.ops.aura.flash_decode(q, k, v, s, None, torch.tensor(0.5))[0], by_float)
    with pytest.raises(ValueError, match="scale: expected a float, a 0-D tensor or None"):
        torch_aura.flash_decode(q, k, v, s, scale=torch.tensor([0.5]))


def test_aura_cache_takes_numpy_integers():
    cache = torch_aura.AuraCache("aura4", batch=np.int64(2), kv_heads=np.int32(2), head_dim=np.int64(64),
                                 capacity=np.int64(16), seed=np.uint8(3), layer=np.int16(1))
    assert (cache.batch, cache.kv_heads, cache.head_dim, cache.capacity) == (2, 2, 64, 16)
    cache.append(torch.randn(2, 3, 2, 64), torch.randn(2, 3, 2, 64))
    cache.crop(np.int64(1))
    cache.grow(np.int32(32))
    assert cache.seq_lens.tolist() == [2, 2] and cache.capacity == 32
    with pytest.raises(ValueError, match="batch: expected a positive int"):
        torch_aura.AuraCache("aura4", batch=np.float64(2), kv_heads=2, head_dim=64, capacity=16)


def test_aura_write_cache_refuses_duplicate_slots_as_gdn_recurrent_refuses_duplicate_rows():
    cb, bd = torch_aura.aura_codebook(4, 64)
    codes, norms = torch.zeros(1, 2, 8, 8, dtype=torch.int32), torch.zeros(1, 2, 8)
    with pytest.raises(ValueError, match=r"slot_mapping: expected distinct slots .*\[1\]"):
        torch_aura.aura_write_cache(torch.randn(3, 2, 64), codes, norms, torch.tensor([1, 1, -1]), cb, bd, 4)
    assert not norms.any(), "nothing may be written before the error"
    torch_aura.aura_write_cache(torch.randn(3, 2, 64), codes, norms, torch.tensor([1, -1, -1]), cb, bd, 4)
    assert (norms[0, :, 1] > 0).all() and int((norms > 0).sum()) == 2


@pytest.mark.parametrize("chunk", ["one token", "prefill chunk", "ragged chunk"])
def test_paged_append_into_an_unallocated_page_raises_before_anything_changes(chunk):
    bt = torch.tensor([[0, 1], [2, -1]], dtype=torch.int32)  # row 1's second page is not allocated
    cache = torch_aura.AuraCache("aura4", batch=2, kv_heads=1, head_dim=64, num_blocks=4, page_size=4,
                                 block_table=bt)
    cache.append(torch.randn(2, 4, 1, 64), torch.randn(2, 4, 1, 64))  # fills page 0 of each row
    state = [t.clone() for t in (cache.k_codes, cache.k_norms, cache.v_codes, cache.v_norms, cache.seq_lens)]
    k = {"one token": torch.randn(2, 1, 64), "prefill chunk": torch.randn(2, 3, 1, 64),
         "ragged chunk": torch.randn(2, 3, 1, 64)}[chunk]
    lengths = torch.tensor([3, 1]) if chunk == "ragged chunk" else None
    with pytest.raises(ValueError, match=r"block_table: rows \[1\] have no valid page"):
        cache.append(k, k.clone(), lengths=lengths)
    after = (cache.k_codes, cache.k_norms, cache.v_codes, cache.v_norms, cache.seq_lens)
    assert all(torch.equal(a, b) for a, b in zip(state, after)), "nothing may change before the error"
    # a row that writes nothing needs no page: row 1 appends 0 tokens
    cache.append(k, k.clone(), lengths=torch.tensor([k.shape[1] if k.dim() == 4 else 1, 0]))
    assert cache.seq_lens.tolist() == [4 + (k.shape[1] if k.dim() == 4 else 1), 4]
