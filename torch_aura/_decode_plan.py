"""The decode grid's plan: the split count S and each sequence's split rule (decode.md §4).

Pure integer arithmetic on static values, shared by the public ``torch_aura.decode_num_splits``
(``ops/decode.py``) and the reference (``reference/decode.py``, which plans the same grid as the
kernels). The CUDA launcher's copy is ``csrc/cuda/decode_plan.cuh``
(``tests/build/test_cuda_compile.py`` compares the two). Imports nothing of the package.
"""

from __future__ import annotations

import torch

# Smallest chunk of tokens a split takes (decode.md §4): one 16-token step for each of the CUDA
# tensor-core kernel's 4 warps. A larger floor starves short contexts at batch 1 (256 left 4 of 29
# splits per KV head live at T = 1k; 64 took an H100 graph replay from 10.3 to 7.4 us).
MIN_CHUNK = 64

# Split chunks of the contiguous layout are rounded to this many tokens: the kernel's K/V stage
# length (decode.md §3: 32-64 tokens; 16 at D = 512, which divides 64). A kernel must use this
# same granularity for its split boundaries to match the reference's partials bit for bit.
CONTIGUOUS_TILE = 64

# Upper bound of the automatic split count (decode.md §4: deliberately high so batch 1 with one
# KV head can still spread over every SM).
MAX_AUTO_SPLITS = 128

# Splits whose partials one CTA of the CUDA merge kernel loads in one round trip (4 warps x 8 loads in
# flight); past it the plan keeps splits of at least 128 tokens (decode.md §4).
MERGE_ONE_TRIP_SPLITS = 32

# Stand-in GPU for devices that have no SM count (CPU, MPS, meta): an H100 SXM, 132 SMs. On a CUDA
# device the real SM count is used, so the reference plans the same grid as the kernel.
STAND_IN_SMS = 132


def plan_ctas_per_sm(head_dim: int, paged: bool = False, page_size: int = 16) -> int:
    """CTAs per SM the automatic plan fills (decode.md §4, with the measurements): one four-warp
    tensor-core CTA streams an SM's share of HBM by itself (at D = 512 the four warps split the dims);
    two on paged caches the tile copies cannot serve (head dims not a multiple of 64, pages not a
    multiple of 16 tokens), whose cp.async copies (and, at D = 512, one-warp CTAs) want the second
    CTA's warps in flight."""
    return 2 if paged and not tile_copies_fit(head_dim, page_size) else 1


def plan_split_floor(head_dim: int, paged: bool = False, page_size: int = 16) -> int:
    """Shortest split, in tokens, the automatic plan keeps past MERGE_ONE_TRIP_SPLITS splits
    (decode.md §4 has the sweeps): 128 tokens, measured at D = 128 (64 KB of 16-bit K and V); 32 for
    the D = 512 dim-split CTA, the same 64 KB. Other head dims keep 128 tokens until swept."""
    return 32 if head_dim == 512 and tile_copies_fit(head_dim, page_size if paged else 0) else 128


def tile_copies_fit(head_dim: int, page_size: int) -> bool:
    """Whether K/V move as 2-D tensor-map tiles (decode.md §3; page_size 0: contiguous)."""
    return head_dim % 64 == 0 and page_size % 16 == 0


def auto_splits(batch: int, kv_heads: int, sms: int, ctas_per_sm: int, cap: int = MAX_AUTO_SPLITS,
                capacity: int | None = None, tile: int = CONTIGUOUS_TILE, split_floor: int = 128) -> int:
    """The split count for a grid of ``batch * kv_heads`` CTAs per split (decode.md §4).

    One wave: ``S = slots // work`` with ``slots = sms * ctas_per_sm``, plus one split when that
    wave would leave more than a fifth of the slots idle, at most ``cap``. With a ``capacity`` (the
    cache's tokens per sequence), where ``chunk(n)`` is a full-capacity sequence's split length under
    n splits (:func:`split_chunk`):

    * never more splits than such a sequence can fill (``ceil(capacity / round_up(MIN_CHUNK, tile))``:
      a split that no sequence can reach is an idle CTA and a merge input for nothing);
    * past :data:`MERGE_ONE_TRIP_SPLITS` splits, none shorter than ``split_floor`` tokens
      (:func:`plan_split_floor`): S halves towards 32;
    * with at most a sixteenth of the slots busy, 32 splits (``cap`` permitting) when ``chunk(32)`` is
      128-256 tokens (two CTAs on most SMs: medium reads at batch 1);
    * finally ``ceil(capacity / chunk(S))``: no split of a full-capacity sequence is left empty.

    Pure integer arithmetic on static values; the public, documented face of this function is
    ``torch_aura.decode_num_splits`` (which validates its arguments and calls this).
    """
    slots, work = sms * ctas_per_sm, batch * kv_heads
    if work == 0 or work >= slots:
        return 1
    s = slots // work
    if work * s < 0.8 * slots:
        s += 1  # a thin wave: a second CTA on some SMs beats leaving a fifth of them idle
    s = min(s, cap)
    if capacity is None:
        return s
    s = min(s, max(1, _ceil_div(capacity, _ceil_div(MIN_CHUNK, tile) * tile)))

    def chunk(n):
        return split_chunk(capacity, n, tile)[0]

    one_trip = MERGE_ONE_TRIP_SPLITS
    while s > one_trip and chunk(s) < split_floor:
        s = max(one_trip, _ceil_div(s, 2))
    if work * 16 <= slots and s < one_trip <= cap and 128 <= chunk(one_trip) <= 256:
        s = one_trip
    return max(1, split_chunk(capacity, s, tile)[1])


def device_sms(device: torch.device) -> int:
    """The SM count the plan uses on ``device``: the real one on CUDA, else :data:`STAND_IN_SMS`."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return STAND_IN_SMS


def plan_num_splits(batch: int, kv_heads: int, device: torch.device, num_splits: int = 0, *,
                    head_dim: int = 128, paged: bool = False, capacity: int | None = None,
                    tile: int = CONTIGUOUS_TILE) -> int:
    """Host-side split count S: ``num_splits`` when positive, else :func:`auto_splits` (``tile``:
    the split granularity, the page size of a paged cache).

    Takes no ``seq_lens`` on purpose: the grid must depend only on values fixed for a captured
    batch shape (decode.md §4, §8 rule 2); ``capacity`` (the cache's token capacity) is a shape.
    """
    if num_splits > 0:
        return int(num_splits)
    return auto_splits(batch, kv_heads, device_sms(device), plan_ctas_per_sm(head_dim, paged, tile),
                       capacity=capacity, tile=tile, split_floor=plan_split_floor(head_dim, paged, tile))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def split_chunk(seq_len: int, num_splits: int, tile: int) -> tuple[int, int]:
    """Per-sequence split rule run by every CTA on the device (decode.md §4).

    Returns ``(chunk, S_b)``: split ``s`` of this sequence covers tokens
    ``[s * chunk, min((s + 1) * chunk, seq_len))``, and exactly the splits ``s < S_b`` are
    non-empty. ``chunk = round_up(max(MIN_CHUNK, ceil(T / S)), tile)`` and ``S_b = ceil(T / chunk)``,
    so ``S_b <= S`` and a sequence of 0 tokens has no live split at all.

    The floor is applied before rounding to whole tiles so that a split never straddles a page,
    even for page sizes that do not divide it (decode.md §6: a CTA resolves each page index once).
    """
    chunk = _ceil_div(max(MIN_CHUNK, _ceil_div(seq_len, num_splits)), tile) * tile
    return chunk, _ceil_div(seq_len, chunk)
