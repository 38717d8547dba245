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


def _gdn_index_cases():
    """(op, its arguments with one strided index tensor, that argument's name): every GDN and conv op that
    reads an index tensor, each index tensor given as a view that skips every other element."""
    g = torch.Generator().manual_seed(0)
    H, HV, K, V = 1, 2, 16, 16
    q, k = torch.randn(1, 70, H, K, generator=g), torch.randn(1, 70, H, K, generator=g)
    v, gate, beta = torch.randn(1, 70, HV, V, generator=g), -torch.rand(1, 70, HV, generator=g), torch.rand(1, 70, HV)
    cu = torch.tensor([0, 0, 30, 30, 70, 70], dtype=torch.int32)[::2]  # [0, 30, 70]: strided
    ci = torch_aura.gdn_chunk_indices(torch.tensor([0, 30, 70], dtype=torch.int32))
    ci_strided = torch.zeros(ci.shape[0], 4, dtype=ci.dtype)[:, :2]  # row stride 4
    ci_strided.copy_(ci)
    rows = torch.tensor([1, 9, 0, 9], dtype=torch.int32)[::2]  # [1, 0]
    state = torch.zeros(2, HV, K, V)
    x, weight = torch.randn(2, 8), torch.randn(8, 4)
    conv_state = torch.zeros(2, 8, 4)
    return [
        (torch.ops.aura.gdn_chunk, (q, k, v, gate, beta, None, None, cu, None, False, False), "cu_seqlens"),
        (torch.ops.aura.gdn_chunk, (q, k, v, gate, beta, None, None, cu.contiguous(), ci_strided, False, False),
         "chunk_indices"),
        (torch.ops.aura.gdn_recurrent, (*[t[0, :2].unsqueeze(1) for t in (q, k, v, gate, beta)], state, rows, None,
                                        None, False, False), "state_indices"),
        (torch.ops.aura.causal_conv1d_update, (x, conv_state, weight, None, None, rows), "state_indices"),
        (torch.ops.aura.causal_conv1d, (torch.randn(1, 70, 8), weight, None, None, cu, None), "cu_seqlens"),
    ]


@pytest.mark.parametrize("op, args, name", _gdn_index_cases(), ids=lambda c: getattr(c, "__name__", None))
def test_strided_index_tensors_are_refused_by_name(op, args, name):
    """The Triton kernels address cu_seqlens, chunk_indices and state_indices from their shapes alone (row n at
    ``+ n``): a strided view would read other rows silently, so every backend refuses one by name."""
    with pytest.raises(ValueError, match=rf"{name}: expected a contiguous tensor"):
        op(*args)
    fixed = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args]
    op(*fixed)  # the same values, contiguous: accepted


def test_the_public_wrappers_check_each_metadata_once_and_every_failure_always(monkeypatch):
    """A model calls each op with one metadata layer after layer: the wrapper's Python check (35 us for
    gdn_recurrent on the CI CPU) runs once per new metadata, as the launchers' do; bad input still raises on
    every call, since a failure is never remembered."""
    from torch_aura._checks import gdn as checks

    seen = []
    original = checks.gdn_recurrent
    monkeypatch.setattr(checks, "gdn_recurrent", lambda *a: seen.append(a[0].shape) or original(*a))
    g = torch.Generator().manual_seed(1)
    q = torch.nn.functional.normalize(torch.randn(2, 1, 1, 16, generator=g), dim=-1)
    v, gate, beta = torch.randn(2, 1, 2, 8, generator=g), -torch.rand(2, 1, 2, generator=g), torch.rand(2, 1, 2)
    pool = torch.zeros(2, 2, 16, 8)
    for _ in range(3):
        torch_aura.gdn_recurrent(q, q, v, gate, beta, pool)
    assert len(seen) == 1
    torch_aura.gdn_recurrent(q[:1], q[:1], v[:1], gate[:1], beta[:1], pool)  # new metadata: checked again
    assert len(seen) == 2
    for _ in range(2):
        with pytest.raises(ValueError, match="k: expected dtype"):
            torch_aura.gdn_recurrent(q, q.double(), v, gate, beta, pool)
    assert len(seen) == 4
