"""Public wrappers of the dense decode family: split-K flash decoding (decode.md, ops.md §1)."""

from __future__ import annotations

import torch

from .. import _debug, _decode_plan
from .._checks import decode as _check
from ._call import checked_call

__all__ = ["flash_decode", "flash_decode_out", "merge_attn_states", "decode_num_splits"]


@_debug.validated
def flash_decode(q, k_cache, v_cache, seq_lens, block_table=None, scale=None, num_splits=0):
    """Attend one query token per sequence to its KV cache (split-K on CUDA).

    The cache layout is chosen by ``block_table``: absent, the caches are contiguous per sequence;
    present, they are paged. Query head ``h`` reads KV head ``h // (Hq // Hkv)`` (GQA, any ratio).
    Tokens at or past ``seq_lens[b]`` (and block-table entries past the last used page) are never
    read, so padding may hold anything.

    Args:
        q: ``[B, Hq, D]`` fp16, bf16 or fp32, unit last stride; ``D`` in
            {64, 80, 96, 128, 192, 256, 512}.
        k_cache: ``[B, Hkv, T_cap, D]`` (any strides with unit last stride), or
            ``[num_blocks, page_size, Hkv, D]`` when ``block_table`` is given; dtype of ``q``.
            ``Hq % Hkv == 0``.
        v_cache: same shape and dtype as ``k_cache``.
        seq_lens: ``[B]`` int32 on q's device, live tokens per sequence, in
            ``[0, capacity]`` (``T_cap``, or ``max_blocks * page_size``); 0 gives an output of
            zeros and lse = -inf.
        block_table: ``[B, max_blocks]`` int32 page indices, or None for the contiguous cache.
            Token ``t`` of sequence ``b`` is slot ``t % page_size`` of page
            ``block_table[b, t // page_size]``; any page size.
        scale: softmax scale; None means ``D ** -0.5``.
        num_splits: 0 chooses the split count from static values only (``B``, ``Hkv``, the
            head dim, the cache capacity and the device's SM count, see
            :func:`decode_num_splits`; never from ``seq_lens``); a
            positive value forces it. The result does not depend on it beyond fp32 rounding.

    Returns:
        ``(out, lse)``: ``out`` ``[B, Hq, D]`` in q's dtype; ``lse`` ``[B, Hq]`` fp32, the natural
        log of the softmax denominator with the scale included.

    Raises:
        ValueError: naming the argument, for a wrong dtype, rank, device, last-dim stride,
            unsupported ``head_dim``, a ``Hq`` not divisible by ``Hkv``, shapes that disagree,
            ``num_splits < 0``, ``seq_lens`` outside ``[0, capacity]`` or a used page index
            outside ``[0, num_blocks)``.
            Data errors (values, not shapes) are raised on CPU always and on CUDA / MPS under
            ``TORCH_AURA_DEBUG=1``; otherwise the kernels clamp or skip them (README,
            "Out-of-range data").

    Example:
        >>> import torch, torch_aura
        >>> q = torch.randn(2, 8, 64)                      # B=2, Hq=8, D=64
        >>> k, v = torch.randn(2, 2, 16, 64), torch.randn(2, 2, 16, 64)  # Hkv=2, T_cap=16
        >>> out, lse = torch_aura.flash_decode(q, k, v, torch.tensor([16, 5], dtype=torch.int32))
        >>> out.shape, lse.shape, out.dtype, lse.dtype
        (torch.Size([2, 8, 64]), torch.Size([2, 8]), torch.float32, torch.float32)
        >>> kp = k.transpose(1, 2).reshape(8, 4, 2, 64)    # paged: 8 pages of 4 tokens
        >>> vp = v.transpose(1, 2).reshape(8, 4, 2, 64)
        >>> table = torch.arange(8, dtype=torch.int32).reshape(2, 4)
        >>> out_p, _ = torch_aura.flash_decode(q, kp, vp, torch.tensor([16, 5], dtype=torch.int32), table)
        >>> torch.allclose(out_p, out, atol=1e-6)
        True
    """
    return checked_call(_check.flash_decode, torch.ops.aura.flash_decode,
                        q, k_cache, v_cache, seq_lens, block_table, scale, num_splits)


@_debug.validated
def flash_decode_out(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits, out, lse):
    """:func:`flash_decode` writing into caller-owned buffers, in place (serving engines, CUDA graphs).

    Args:
        q, k_cache, v_cache, seq_lens, block_table, scale, num_splits: as :func:`flash_decode`
            (here without defaults: pass ``None`` / ``0`` explicitly).
        out: ``[B, Hq, D]`` in q's dtype, unit last stride (may be a strided slice of a larger
            buffer); overwritten with the attention output.
        lse: ``[B, Hq]`` fp32, any strides; overwritten with the log-sum-exp.

    Returns:
        None. Only ``out`` and ``lse`` are written.

    Raises:
        ValueError: as :func:`flash_decode`, plus ``out`` / ``lse`` of the wrong shape, dtype,
            rank or device.

    Example:
        >>> import torch, torch_aura
        >>> q, k, v = torch.randn(1, 4, 64), torch.randn(1, 4, 9, 64), torch.randn(1, 4, 9, 64)
        >>> out, lse = torch.zeros(1, 4, 64), torch.zeros(1, 4)
        >>> torch_aura.flash_decode_out(q, k, v, torch.tensor([9], dtype=torch.int32), None, None, 0, out, lse)
        >>> torch.equal(out, torch_aura.flash_decode(q, k, v, torch.tensor([9], dtype=torch.int32))[0])
        True
    """
    checked_call(_check.flash_decode_out, torch.ops.aura.flash_decode_out,
                 q, k_cache, v_cache, seq_lens, block_table, scale, num_splits, out, lse)


@_debug.validated
def merge_attn_states(partial_out, partial_lse):
    """Log-sum-exp merge of attention partials over disjoint key sets (split-K, cascade, CP).

    With ``M = max_s lse_s`` and ``w_s = exp(lse_s - M)``: ``out = sum_s w_s O_s / sum_s w_s``,
    ``lse = M + ln(sum_s w_s)``. Splits with ``lse_s = -inf`` are skipped, so their partials may
    hold anything (even NaN); if every split of a (b, head) is -inf the result is ``out = 0``,
    ``lse = -inf``.

    Args:
        partial_out: ``[S, B, Hq, D]`` fp16, bf16 or fp32 (S >= 1), unit last stride; each
            ``partial_out[s]`` is a normalized attention output over its own keys.
        partial_lse: ``[S, B, Hq]`` fp32, the natural-log lse (scale included) of each partial.

    Returns:
        ``(out, lse)``: ``out`` ``[B, Hq, D]`` in partial_out's dtype (merged in fp32); ``lse``
        ``[B, Hq]`` fp32.

    Raises:
        ValueError: naming the argument, for a wrong dtype, rank, device, last-dim stride,
            unsupported ``head_dim``, ``S == 0`` or shapes that disagree.

    Example:
        >>> import torch, torch_aura
        >>> o = torch.randn(2, 1, 4, 64)
        >>> lse = torch.tensor([[[0.5, 1.0, -float("inf"), 2.0]], [[0.5] + [-float("inf")] * 3]])
        >>> out, m = torch_aura.merge_attn_states(o, lse)
        >>> torch.allclose(out[0, 0], (o[0, 0, 0] + o[1, 0, 0]) / 2), m[0, 0].item() == 0.5 + torch.log(torch.tensor(2.0)).item()
        (True, True)
        >>> m[0, 2].item(), out[0, 2].abs().max().item()
        (-inf, 0.0)
    """
    return checked_call(_check.merge_attn_states, torch.ops.aura.merge_attn_states, partial_out, partial_lse)


def decode_num_splits(batch: int, kv_heads: int, sms: int, ctas_per_sm: int, cap: int = 128,
                      capacity: int | None = None, split_floor: int = 128) -> int:
    """The split count S of the decode grid ``(S, Hkv, B)``, from static values only.

    The CUDA kernels' automatic plan (decode.md §4), one unit of work per (sequence, KV head):
    with ``slots = sms * ctas_per_sm`` and ``work = batch * kv_heads``,

    * ``work >= slots``: 1 (one wave already fills the GPU);
    * else one wave, ``s = slots // work``, plus one when ``work * s < 0.8 * slots`` (a second
      CTA on some SMs beats leaving a fifth of them idle), at most ``cap``;
    * and, when ``capacity`` (the cache's tokens per sequence) is given, where ``chunk(n)`` is a
      full-capacity sequence's split length under n splits (``round_up(max(64, ceil(capacity / n)),
      64)``): at most ``ceil(capacity / 64)`` (no sequence could reach a split beyond that); past 32
      splits (what one CTA of the merge kernel loads in one round trip) no split shorter than
      ``split_floor`` tokens, halving towards 32; 32 splits when at most a sixteenth of the slots are busy,
      ``chunk(32)`` is 128-256 tokens and ``cap >= 32`` (two CTAs on most SMs); and finally
      ``ceil(capacity / chunk(s))``, so no split of a full-capacity sequence is empty (decode.md §4
      has the measurements behind each rule).

    It never sees ``seq_lens``: the grid of a captured CUDA graph must not depend on data. Each
    sequence then uses ``S_b <= S`` of the splits, at least 64 tokens each (empty ones write
    lse = -inf). ``flash_decode`` calls it with the device's SM count, ``ctas_per_sm`` = 1 (2 on
    paged caches without tile copies), ``split_floor`` = 128 (32 at head_dim 512 with tile copies:
    the same 64 KB of K and V per split) and the cache capacity; ``num_splits > 0`` bypasses it.

    Args:
        batch: number of sequences ``B`` (>= 0).
        kv_heads: KV heads ``Hkv`` (>= 1).
        sms: streaming multiprocessors of the GPU (>= 1).
        ctas_per_sm: CTAs per SM the wave fills (>= 1).
        cap: largest split count considered (>= 1).
        capacity: tokens a sequence can hold (>= 1), or None for no such bound.
        split_floor: shortest split, in tokens, kept past 32 splits (>= 1).

    Returns:
        int in ``[1, cap]``.

    Raises:
        ValueError: naming the argument, if one is not a Python int (a tensor is refused: the
            plan must not read device data) or is out of range.

    Example:
        >>> import torch_aura
        >>> torch_aura.decode_num_splits(64, 8, sms=132, ctas_per_sm=1)  # 512 CTAs fill 132 SMs
        1
        >>> torch_aura.decode_num_splits(1, 8, sms=132, ctas_per_sm=1)   # 8 CTAs: split 16 ways
        16
        >>> torch_aura.decode_num_splits(1, 2, sms=132, ctas_per_sm=1, capacity=4096)  # 32 x 128 tokens
        32
    """
    for name, value, low in (("batch", batch, 0), ("kv_heads", kv_heads, 1), ("sms", sms, 1),
                             ("ctas_per_sm", ctas_per_sm, 1), ("cap", cap, 1),
                             ("capacity", 1 if capacity is None else capacity, 1),
                             ("split_floor", split_floor, 1)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name}: expected a Python int (static, never device data), "
                             f"got {type(value).__name__}")
        if value < low:
            raise ValueError(f"{name}: expected >= {low}, got {value}")
    return _decode_plan.auto_splits(batch, kv_heads, sms, ctas_per_sm, cap, capacity, split_floor=split_floor)
