"""The sequence-parallel state pass of ``gdn_chunk`` / ``gdn_fwd_h`` (gdn.md §6): with few heads and
sequences (tensor-parallel shards) the serial pass leaves most SMs idle, so each sequence is cut into
segments of ``cps`` chunks. ``_segment_plan`` decides; the summary kernel gives each segment its
zero-start end state and transfer matrix, the scan chains them into every segment's start state,
and the pass (``state_pass``) then runs all segments at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import launch, tensor_key
from .._tune import Config, Tuner, cdiv
from . import _common, plan
from ._common import _dot_prec, _pass_copies_tiles, _pow2, _s3, _state_strides
from ._jit import BT, _chain_operands, length_agnostic, rows_desc, segment_span, seq_span, v_tile_head_row


@triton.jit
def _split_dot(a, b, acc, PREC: tl.constexpr):
    """``acc + a @ b`` for an fp32 ``a`` and a 16-bit tile ``b`` as loaded (exact data). ``"bf16x2"``:
    ``a`` split into two bf16 parts (``hi + lo``, ~16 mantissa bits), each multiplied by ``b`` as it is,
    so no fp32 copy of ``b`` goes through shared memory; else one product at ``PREC`` (tf32, ieee) of
    ``b`` in fp32."""
    if PREC == "bf16x2":
        hi = a.to(tl.bfloat16)
        lo = (a - hi.to(tl.float32)).to(tl.bfloat16)
        return tl.dot(lo, b, tl.dot(hi, b, acc))
    else:
        return tl.dot(a, b.to(tl.float32), acc, input_precision=PREC)


@length_agnostic(triton.jit)
def _gdn_segment_summary_kernel(k, w, u, g_cum, At, Bt, seg_table, cu_seqlens, T, NT, NS, CPS, HV, GROUP, K, V,
                                s_kb, s_kt, s_kh, s_wb, s_wt, s_wh, s_ub, s_ut, s_uh, s_gb, s_gt, s_gh,
                                IS_VARLEN: tl.constexpr, TMA: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                                DOT_PREC: tl.constexpr, TRANSFER_PREC: tl.constexpr):
    """Summary of one segment for one value head, transposed as in the pass: a program per (row tile,
    value head, segment), tiles fastest, carries rows ``i_t * BV ..`` of two chains over the segment's
    chunks, which read each chunk's w and k tiles once:

    * ``B^T`` (``Bt [S, HV, V, K]``), the segment's zero-start end state: exactly the pass's update
      (``rnd(M)``, ``rnd(gated)``) without the output;
    * ``A^T`` (``At [S, HV, K, K]``), where ``A`` (``K x K``) maps the state entering the segment to its
      share of the state leaving it: per chunk ``A <- (e^(G_L) I - k^T diag(e^(G_L - G)) w) A``, the same
      update with ``u = 0`` from ``A^T = I``, kept in fp32 (products at ``TRANSFER_PREC``, ``_split_dot``)
      since every later segment's start state goes through it.

    Rows past V (of B) or K (of A) stay zero and are not stored. A sequence's last segment has no
    successor to feed: its program skips the chunks (the scan never reads its slot)."""
    n_tiles = tl.cdiv(tl.maximum(V, K), BV)
    pid = tl.program_id(0)
    i_t, rest = pid % n_tiles, pid // n_tiles
    i_hv, j = rest % HV, (rest // HV).to(tl.int64)
    i_h = i_hv // GROUP
    n, b, bos, eos, c_lo, c_hi, last = segment_span(j, seg_table, cu_seqlens, T, NT, NS, CPS, IS_VARLEN)
    c_hi = tl.where(last, c_lo, c_hi)
    w_d, k_d, u_d = w, k, u  # the pointer path ignores these
    if TMA:
        w_d = rows_desc(w, b, i_hv, eos, s_wb, s_wt, s_wh, K, BK)
        k_d = rows_desc(k, b, i_h, eos, s_kb, s_kt, s_kh, K, BK)
        u_d = rows_desc(u, b, i_hv, eos, s_ub, s_ut, s_uh, V, BV)
    kk = tl.arange(0, BK)
    rr = i_t * BV + tl.arange(0, BV)
    MA = tl.where((rr[:, None] == kk[None, :]) & (kk < K)[None, :], 1.0, 0.0)
    MB = tl.zeros([BV, BK], tl.float32)
    for c in range(c_lo, c_hi):
        start = bos + c * BT
        rows = start + tl.arange(0, BT)
        ok = rows < eos
        wt, kt, uT, G2_L, G2 = _chain_operands(
            k, w, u, g_cum, k_d, w_d, u_d, b, start, rows, ok, eos, i_h, i_hv, rr, i_t * BV, K, V,
            s_kb, s_kt, s_kh, s_wb, s_wt, s_wh, s_ub, s_ut, s_uh, s_gb, s_gt, s_gh, TMA, BK, BV)
        vB = uT.to(tl.float32) - tl.dot(MB.to(kt.dtype), tl.trans(wt), input_precision=DOT_PREC)
        vA = -_split_dot(MA, tl.trans(wt), tl.zeros([BV, BT], tl.float32), TRANSFER_PREC)
        gB = tl.where(ok[None, :], tl.exp2(G2_L - G2)[None, :] * vB, 0.0).to(kt.dtype)
        gA = tl.where(ok[None, :], tl.exp2(G2_L - G2)[None, :] * vA, 0.0)
        MB = MB * tl.exp2(G2_L) + tl.dot(gB, kt, input_precision=DOT_PREC)
        MA = _split_dot(gA, kt, MA * tl.exp2(G2_L), TRANSFER_PREC)
    k_ok = (kk < K)[None, :]
    tl.store(Bt + ((j * HV + i_hv) * V + rr[:, None]) * K + kk[None, :], MB, mask=(rr < V)[:, None] & k_ok)
    tl.store(At + ((j * HV + i_hv) * K + rr[:, None]) * K + kk[None, :], MA, mask=(rr < K)[:, None] & k_ok)


@triton.jit
def _scan_start(h0, final, n, i_hv, vv, cols, mask, ns, s_0n, s_0h, s_0k, s_0v, s_fn, s_fh, s_fk, s_fv,
                HAS_H0: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr):
    """The scan's start tile ``S^T[vv, cols]`` of sequence ``n`` (h0, or zeros), fp32; a sequence without
    chunks (``ns == 0``) has no segment, so its final state is this tile, stored here."""
    if HAS_H0:
        x = tl.load(h0 + n * s_0n + i_hv * s_0h + vv[:, None] * s_0v + cols[None, :] * s_0k, mask=mask,
                    other=0.0).to(tl.float32)
    else:
        x = tl.zeros([BV, BC], tl.float32)
    tl.store(final + n * s_fn + i_hv * s_fh + vv[:, None] * s_fv + cols[None, :] * s_fk, x, mask=mask & (ns == 0))
    return x


@length_agnostic(triton.jit)
def _gdn_segment_scan_kernel(h0, At, Bt, S0, final, cu_seqlens, seg_first, T, NS, CPS, HV, K, V,
                             s_0n, s_0h, s_0k, s_0v, s_fn, s_fh, s_fk, s_fv,
                             IS_VARLEN: tl.constexpr, HAS_H0: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr,
                             PREC: tl.constexpr, IN_REGS: tl.constexpr):
    """The start state of every segment of one sequence, for one (V tile, value head): ``S0[j0] = h0``,
    then ``S_(s+1) = A_s S_s + B_s``, kept transposed (``S0 [S, HV, V, K]``, fp32, products at
    ``PREC``) as ``S0[j+1] = S0[j] A_j^T + B_j^T``. A sequence without chunks has no segment: its
    final state is the start state, written here.

    ``IN_REGS`` (``_scan_in_regs``; ``BC`` = the padded K, at most 128): the ``[BV, BC]`` state stays
    in registers across segments as the dot's operand and accumulator; each step loads ``A_j^T`` and
    ``B_j^T`` straight into the dot (the software pipeline copies step j+1's A into shared memory
    while step j multiplies) and stores ``S0[j+1]`` once, never reading it back: no CTA barrier or
    global round trip of the state in the loop. Else (fp32 inputs, or K > 128: the operands of a full
    ``K x K`` product would not fit) in ``BC``-wide column blocks through memory, the CTA barrier
    making a step's stores visible to the next step's loads."""
    i_v, i_hv, n = v_tile_head_row(V, BV, HV)
    if IS_VARLEN:
        b, bos, eos = seq_span(n, cu_seqlens, T, True)
        ns = tl.cdiv(tl.cdiv(tl.maximum(eos - bos, 0), BT), CPS)
        j0 = tl.load(seg_first + n).to(tl.int64)
    else:
        ns = NS
        j0 = n.to(tl.int64) * NS
    vv = i_v * BV + tl.arange(0, BV)
    v_ok = vv < V
    cc = tl.arange(0, BC)
    if IN_REGS:
        mask = v_ok[:, None] & (cc < K)[None, :]
        S = _scan_start(h0, final, n, i_hv, vv, cc, mask, ns, s_0n, s_0h, s_0k, s_0v, s_fn, s_fh, s_fk, s_fv,
                        HAS_H0, BV, BC)
        # scalar bases carried through the loop, loop-invariant offsets: no pointer tiles held in registers
        s_off = vv[:, None] * K + cc[None, :]
        s_base = S0 + (j0 * HV + i_hv) * V * K
        tl.store(s_base + s_off, S, mask=mask & (ns > 0))
        a_off = cc[:, None] * K + cc[None, :]
        a_ok = (cc < K)[:, None] & (cc < K)[None, :]
        a_base = At + (j0 * HV + i_hv) * K * K
        b_base = Bt + (j0 * HV + i_hv) * V * K
        for s in range(0, ns - 1):
            a = tl.load(a_base + a_off, mask=a_ok, other=0.0)  # zeros past K keep S's padding zero
            S = tl.dot(S, a, tl.load(b_base + s_off, mask=mask, other=0.0), input_precision=PREC)
            s_base += HV * V * K
            tl.store(s_base + s_off, S, mask=mask)
            a_base += HV * K * K
            b_base += HV * V * K
    else:
        for c0 in range(0, K, BC):
            cols = c0 + cc
            mask = v_ok[:, None] & (cols < K)[None, :]
            x = _scan_start(h0, final, n, i_hv, vv, cols, mask, ns, s_0n, s_0h, s_0k, s_0v, s_fn, s_fh, s_fk, s_fv,
                            HAS_H0, BV, BC)
            tl.store(S0 + ((j0 * HV + i_hv) * V + vv[:, None]) * K + cols[None, :], x, mask=mask & (ns > 0))
        for s in range(0, ns - 1):
            tl.debug_barrier()
            j = j0 + s
            row_s = (j * HV + i_hv) * V + vv[:, None]
            row_a = (j * HV + i_hv) * K
            for c0 in range(0, K, BC):
                cols = c0 + cc
                mask = v_ok[:, None] & (cols < K)[None, :]
                acc = tl.load(Bt + row_s * K + cols[None, :], mask=mask, other=0.0)
                for r0 in range(0, K, BC):
                    rr = r0 + cc
                    m = tl.load(S0 + row_s * K + rr[None, :], mask=v_ok[:, None] & (rr < K)[None, :], other=0.0)
                    a = tl.load(At + (row_a + rr[:, None]) * K + cols[None, :],
                                mask=(rr < K)[:, None] & (cols < K)[None, :], other=0.0)
                    acc += tl.dot(m, a, input_precision=PREC)
                tl.store(S0 + (row_s + HV * V) * K + cols[None, :], acc, mask=mask)


@length_agnostic(triton.jit)
def _gdn_segment_table_kernel(cu_seqlens, table, seg_first, N, T, CPS, n_seg, BLOCK: tl.constexpr):
    """The varlen plan of the sequence-parallel pass, one program (``_segment_table``): sequence ``n``
    has ``cdiv(its chunks, CPS)`` segments (its end clamped to T, as ``segment_span`` reads it); its
    first row ``seg_first[n]`` is the running count before it, and its segment ``s`` is row
    ``seg_first[n] + s`` of ``table``: ``(n, s * CPS)``. Rows from the total count up to the static
    bound ``n_seg`` hold ``-1``; rows past ``n_seg`` are never written. One launch replaces the dozen
    small torch ops the table took (eager host time, and their kernels in a graph)."""
    carry = tl.zeros([], tl.int64)
    for n0 in range(0, N, BLOCK):
        nn = n0 + tl.arange(0, BLOCK)
        ok = nn < N
        bos = tl.load(cu_seqlens + nn, mask=ok, other=0).to(tl.int64)
        eos = tl.minimum(tl.load(cu_seqlens + nn + 1, mask=ok, other=0).to(tl.int64), T)
        ns = tl.where(ok, tl.cdiv(tl.cdiv(tl.maximum(eos - bos, 0), BT), CPS), 0)
        first = carry + tl.cumsum(ns, 0) - ns
        tl.store(seg_first + nn, first, mask=ok)
        for s in range(0, tl.max(ns, 0)):
            row = first + s
            live = ok & (s < ns) & (row < n_seg)
            tl.store(table + row * 2, nn.to(tl.int32), mask=live)
            tl.store(table + row * 2 + 1, (s * CPS).to(tl.int32), mask=live)
        carry += tl.sum(ns, 0)
    for j0 in range(0, n_seg, BLOCK):
        jj = j0 + tl.arange(0, BLOCK)
        spare = (jj >= carry) & (jj < n_seg)
        tl.store(table + jj * 2, -1, mask=spare)
        tl.store(table + jj * 2 + 1, -1, mask=spare)


# ------------------------------------------------------------------ the sequence-parallel pass
# Segments shorter than this many chunks spend more on their summary (two chains: B and A) and the
# scan than they save; fewer segments than _SEG_MIN_COUNT per sequence save little (the pass's
# latency is about 2 / count of the serial chain's, plus the scan).
_SEG_MIN_CHUNKS = 8
_SEG_MIN_COUNT = 4


def _segment_plan(device: torch.device, N: int, HV: int, V: int, NT: int, NT_total: int, varlen: bool) -> int:
    """Chunks per segment for the sequence-parallel pass, or 0 for the serial pass (gdn.md §6).

    The serial pass has one program per (64-wide V tile, value head, sequence), each a latency-bound
    chain over all of its sequence's chunks: with few heads and sequences (tensor-parallel shards)
    most SMs idle. Split each sequence into segments of ``cps`` chunks so that the per-segment pass
    fills about one wave of SMs. Only static facts decide (SM count, N, heads, V, the chunk count of
    the shapes: ``NT`` per sequence, or the total ``NT_total``, chunk_indices' length, for varlen), so
    the plan is the same in eager calls and CUDA-graph replays and needs no host sync. Varlen sizes the
    segments as if one sequence held every chunk and reserves one partial segment per sequence, so the
    segment count is bounded by ``cdiv(NT_total, cps) + N`` whatever the lengths are; it splits only
    where the spare slots give at least one segment per sequence. Shapes that already fill the GPU
    get 0: the serial path, unchanged.
    """
    if device.type != "cuda" or N == 0 or HV == 0:
        return 0
    slots = _common.sm_count(device) // (HV * cdiv(V, 64))  # segments whose pass programs fit in one wave
    segs, chunks = (slots - N, NT_total) if varlen else (slots // N, NT)
    segs = min(segs, chunks // _SEG_MIN_CHUNKS)
    # varlen: fewer split segments than sequences lost to the serial pass (gdn.md §6)
    enough = segs >= _SEG_MIN_COUNT and (not varlen or segs >= N)
    return cdiv(chunks, segs) if enough else 0


def _segment_table(cu_seqlens: torch.Tensor, T: int, cps: int, n_seg: int):
    """Varlen segment bookkeeping in one launch (``_gdn_segment_table_kernel``; no host sync):
    ``seg_table [n_seg, 2]`` int32 rows ``(sequence, first chunk)`` in sequence order, ``-1`` rows past
    the real count (``n_seg`` is a static bound), and ``seg_first [N]``, each sequence's first row."""
    N = cu_seqlens.shape[0] - 1
    table = torch.empty((max(n_seg, 1), 2), dtype=torch.int32, device=cu_seqlens.device)
    seg_first = torch.empty(max(N, 1), dtype=torch.int64, device=cu_seqlens.device)
    launch(_gdn_segment_table_kernel, (1,), (tensor_key(cu_seqlens),), cu_seqlens, table, seg_first, N, T, cps, n_seg,
           BLOCK=1024, num_warps=4)
    return table[:n_seg], seg_first[:N]


# A program carries two fp32 [BV, K] chains (B and A), latency-bound like the pass's: 8 warps hold both at
# BV = 64 (ptxas, sm_90, bf16: 32 B of spill; 4 warps ~1 KB); narrower tiles give more programs where one
# wave is not full; the last config (pointer loads) fits where two copy stages do not.
_SEG_SUMMARY = Tuner("gdn_segment_summary", [
    Config({"BV": 64}, num_warps=8, num_stages=2), Config({"BV": 32}, num_warps=4, num_stages=2),
    Config({"BV": 64}, num_warps=8, num_stages=3), Config({"BV": 32, "TMA": False}, num_warps=4, num_stages=1),
])
plan.TUNERS.append(_SEG_SUMMARY)


def _scan_in_regs(K: int, dtype: torch.dtype) -> bool:
    """Whether the segment scan keeps its state in registers (``IN_REGS``): 16-bit inputs (tf32x3
    products) at K <= 128. Sized from ptxas's report for sm_90: at BV = 16 and 8 warps (warps split
    along A's 128 columns, 16 each) the three tf32 products' operands fit in 255 registers with ~100 B
    of spill and A's fp32 tile (64 KiB) plus its prefetched successor in shared memory; 4 warps spill
    kilobytes, and so does the fp32 (``ieee``, CUDA-core) product at any width, whose operands all sit
    in registers: fp32 inputs and K > 128 keep the column-block path."""
    return _pow2(K) <= 128 and dtype != torch.float32


def _transfer_prec(dtype: torch.dtype) -> str:
    # A is fp32 (gdn.md §6). On the summary's chain bf16 inputs split it in two bf16 parts (``_split_dot``,
    # ~16 mantissa bits against the 7 of the pass's bf16 state operand); fp16 inputs multiply it in tf32
    # (10 bits; an fp16 part could overflow where A's entries grow), fp32 inputs in full fp32. The scan
    # multiplies in tf32x3 (~fp32) for either 16-bit dtype.
    return {torch.float32: "ieee", torch.bfloat16: "bf16x2"}.get(dtype, "tf32")


def _segment_starts(k, w, u, g_cum, initial_state, cu_seqlens, NT, NT_total, final, state_v_first, cps):
    """Summary and scan of the sequence-parallel pass: per segment its zero-start end state B and
    transfer matrix A (``_gdn_segment_summary_kernel``, all segments in parallel), then per sequence
    the start state of each segment (``_gdn_segment_scan_kernel``), which also writes the final
    state of sequences without chunks. Returns ``(S0, seg_table, NS, n_seg)``: the start states
    ``[n_seg, HV, V, K]`` fp32, the varlen table (``_segment_table``), segments per sequence (fixed
    length) and the segment count (the pass's grid rows)."""
    B, T, H, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    dev = k.device
    varlen = cu_seqlens is not None
    N = final.shape[0]
    if varlen:
        NS, n_seg = 0, min(NT_total, cdiv(NT_total, cps) + N)
        seg_table, seg_first = _segment_table(cu_seqlens, T, cps, n_seg)
    else:
        NS = cdiv(NT, cps)
        n_seg = N * NS
        seg_table = seg_first = None
    rows = max(n_seg, 1)  # valid pointers without segments (the scan then only writes final states)
    At = torch.empty((rows, HV, K, K), dtype=torch.float32, device=dev)
    Bt = torch.empty((rows, HV, V, K), dtype=torch.float32, device=dev)
    S0 = torch.empty_like(Bt)
    cu = cu_seqlens
    facts = (H, HV, K, V, state_v_first, *map(tensor_key, (k, w, u, g_cum, initial_state, cu_seqlens)))
    if n_seg:
        tma_ready = _pass_copies_tiles(k, w, u)

        def summary(cfg: Config):
            BV = min(cfg.kwargs["BV"], _pow2(V))
            launch(
                _gdn_segment_summary_kernel, (cdiv(max(V, K), BV) * HV * n_seg,), facts,
                k, w, u, g_cum, At, Bt, seg_table, cu, T, NT, NS, cps, HV, HV // H, K, V,
                *_s3(k), *_s3(w), *_s3(u), *_s3(g_cum), IS_VARLEN=varlen,
                TMA=tma_ready and cfg.kwargs.get("TMA", True), BK=_pow2(K), BV=BV, DOT_PREC=_dot_prec(k.dtype),
                TRANSFER_PREC=_transfer_prec(k.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages)

        with _common.descriptor_workspace(dev):
            _SEG_SUMMARY((K, V, k.dtype, varlen, tma_ready), summary, dev)
    # 16-bit inputs at K <= 128: the state in registers (_scan_in_regs); else 64-wide column blocks
    in_regs = _scan_in_regs(K, k.dtype)
    BV = min(16 if in_regs else 32, _pow2(V))
    launch(
        _gdn_segment_scan_kernel, (cdiv(V, BV) * N * HV,), facts,
        initial_state, At, Bt, S0, final, cu, seg_first,
        T, NS, cps, HV, K, V, *_state_strides(initial_state, state_v_first), *_state_strides(final, state_v_first),
        IS_VARLEN=varlen, HAS_H0=initial_state is not None, BV=BV, BC=_pow2(K) if in_regs else min(64, _pow2(K)),
        PREC="ieee" if k.dtype == torch.float32 else "tf32x3", IN_REGS=in_regs, num_warps=8 if in_regs else 4,
        **({"num_stages": 2} if in_regs else {}))  # the column-block path keeps Triton's default, as measured
    return S0, seg_table, NS, n_seg
