"""gdn_chunk's sequential state pass for Hopper (sm_90), written in Gluon (Triton's explicit-layout
dialect) so that the four warpgroup MMAs of a chunk step overlap instead of running one after another.

Why a second implementation of ``state_pass._gdn_state_pass_kernel``: that kernel's step is a chain of
four ``tl.dot``s. Triton waits for each warpgroup MMA right after issuing it, and at BV = 32 it picks
warp-split MMA v2 layouts whose register operands go through shared memory every step, so the tensor
cores idle through most of a step (gdn.md §6.3). Here each step issues its MMAs asynchronously, in
the order the chain needs them, and waits only where a result is read (v^T and o1 separately, with
o1's gating folded into the last MMA's accumulator):

    M_op   = rnd(M)                                  (M = S^T, [BV, K] fp32 in the MMA layout)
    v^T    = u^T - M_op @ w^T          async  \\  issued back to back; MMAs retire in issue order, so
    o1^T   = M_op @ q^T                async  /  v^T is waited for alone and o1 runs under the gating
    M      = e^(G_L) M + rnd(select(valid, v^T e^(G_L - G), 0)) @ k      async
    o^T    = e^G o1^T + rnd(v^T) @ A_qk^T     async, once o1 is in: the MMA accumulates onto e^G o1^T
    o^T   *= scale                     after the last wait; stored through a TMA copy

the same rounding points as the Triton pass and the reference (gdn.md §6). Every register operand
stays in the accumulator layout of the MMA that produced it (one warpgroup, each warp owning 16 rows
of the V tile), so nothing on the chain goes through shared memory. All five chunk tiles arrive as
TMA copies through descriptors of this sequence's rows (zero past its end), ``STAGES`` deep; o leaves
through a descriptor of the same rows, so its last chunk's rows past the end are dropped.

``WAIT`` (``state_pass._overlap_pass``, few sequences): the kernel runs beside the w/u kernel that is still
writing w, u and A_qk, and waits for each chunk's flag before copying its tiles.

Scope: sm_90 (warpgroup MMA), 16-bit inputs, K in {64, 128}, the output path of gdn_chunk. Everything
else, and every other GPU, runs the Triton pass; ``state_pass._state_pass`` chooses, and its tuner may still prefer a Triton
config for a shape. Gluon is experimental in Triton 3.6: an import failure simply disables this path.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy, fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from ._jit import length_agnostic, segment_span, seq_span, v_tile_head_row

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
BT: gl.constexpr = gl.constexpr(64)  # chunk length, as chunk.CHUNK


@gluon.jit
def _wait_published(flag):
    """Spin until the w/u kernel running beside this one has published a chunk (its release of the
    chunk's flag, ``prep._gdn_recompute_w_u_kernel`` with ``PUBLISH``), then order this thread's later
    TMA copies (async proxy) after the acquire (generic proxy)."""
    while gl.atomic_add(flag, 0, sem="acquire", scope="gpu") == 0:
        pass
    gl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _issue_chunk(c, NC, c_base, n_rows, w_d, k_d, u_d, q_d, a_d, w_s, k_s, u_s, q_s, a_s, g_s, bars, g_row, s_gt, v0,
                 ready_row, HV, STAGES: gl.constexpr, NBYTES: gl.constexpr, G_LAYOUT: gl.constexpr,
                 WAIT: gl.constexpr):
    """Start the copies of chunk ``c_base + c``'s tiles into stage ``c % STAGES`` (nothing from ``c = NC``):
    five TMA copies completing on the stage's mbarrier, and the chunk's gate cumsum (one fp32 per token,
    a strided column: too narrow for TMA) as a cp.async group of its own, zero past the sequence's end.
    Gates read ahead into registers instead spilled at 255 registers (gdn.md §6.3). ``WAIT``: w, u and
    A_qk are still being written by the w/u kernel on another stream; wait for chunk ``c``'s flag
    first (the gates come from the solve, already done)."""
    s = c % STAGES
    live = c < NC
    bar = bars.index(s)
    if WAIT:
        if live:
            _wait_published(ready_row + (c_base + c) * HV)
    row = (c_base + c) * BT
    mbarrier.expect(bar, NBYTES, pred=live)
    tma.async_copy_global_to_shared(w_d, [row, 0], bar, w_s.index(s), pred=live)
    tma.async_copy_global_to_shared(q_d, [row, 0], bar, q_s.index(s), pred=live)
    tma.async_copy_global_to_shared(k_d, [row, 0], bar, k_s.index(s), pred=live)
    tma.async_copy_global_to_shared(u_d, [row, v0], bar, u_s.index(s), pred=live)
    tma.async_copy_global_to_shared(a_d, [row, 0], bar, a_s.index(s), pred=live)
    t = row + gl.arange(0, BT, layout=G_LAYOUT)
    # past a segment's last chunk the sequence goes on: ``live`` stops those gates too
    async_copy.async_copy_global_to_shared(g_s.index(s), g_row + t.to(gl.int64) * s_gt, mask=(t < n_rows) & live)
    async_copy.commit_group()


@length_agnostic(gluon.jit)
def gdn_state_pass_sm90_kernel(k, w, u, g_cum, h0, out, final, q, a_qk, cu_seqlens, ready, chunk_offsets, seg_table,
                               scale, T, NT, NS, CPS, HV, GROUP, K, V,
                               s_kb, s_kt, s_kh, s_wb, s_wt, s_wh, s_ub, s_ut, s_uh, s_ob, s_ot, s_oh,
                               s_gb, s_gt, s_gh, s_0n, s_0h, s_0k, s_0v, s_fn, s_fh, s_fk, s_fv,
                               s_ab, s_at, s_ah, s_qb, s_qt, s_qh,
                               IS_VARLEN: gl.constexpr, HAS_H0: gl.constexpr, BK: gl.constexpr,
                               BV: gl.constexpr, STAGES: gl.constexpr, WAIT: gl.constexpr,
                               SEGMENTED: gl.constexpr):
    """One program per (V tile of ``BV`` = 64, value head, sequence), V tiles fastest (as the Triton
    pass); 4 warps = one warpgroup. Module docstring: the step and why. ``WAIT``: ``ready`` holds one
    flag per (chunk, value head) in the w/u kernel's program order, the chunks numbered as
    ``chunk_offsets`` (varlen) or ``n * NT`` do. ``SEGMENTED`` (the sequence-parallel pass): a program
    per (V tile, value head, segment) walks the segment's chunks (``segment_span``) from the start
    state ``h0[j]`` the segment scan left, as the Triton pass does; the chunk index is the
    sequence's, the pipeline stages count from the segment's first chunk."""
    gl.static_assert(BV == 64, "one warpgroup owns 64 state rows (16 per warp)")
    dt: gl.constexpr = k.dtype.element_ty
    # Accumulator layouts: [BV, BK] (the state) and [BV, BT] (v^T, o^T); register A operands in the
    # layout of the MMA that consumes them (for 16-bit types the same registers as the accumulator's).
    acc_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BK, 16])
    acc_t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
    op_t: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_t, k_width=2)
    op_s: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_s, k_width=2)
    tile: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)  # every tile

    i_v, i_hv, row = v_tile_head_row(V, BV, HV)  # the Triton helpers: scalar code, valid Gluon too
    i_h = i_hv // GROUP
    if SEGMENTED:
        n, b, bos, eos, c_lo, c_hi, seg_last = segment_span(row, seg_table, cu_seqlens, T, NT, NS, CPS, IS_VARLEN)
        c_base = c_lo.to(gl.int32)
        NC = (c_hi - c_lo).to(gl.int32)
        h0_row = row
    else:
        n = row
        b, bos, eos = seq_span(n, cu_seqlens, T, IS_VARLEN)
        c_base = 0
        NC = gl.cdiv((eos - bos).to(gl.int32), BT)
        h0_row = n
    n_rows = (eos - bos).to(gl.int32)  # this sequence's tokens; rows are counted from bos below
    v0 = i_v * BV
    rows = gl.maximum(n_rows, 1)  # an empty sequence never copies; keep the descriptor shape valid
    ready_row = ready + i_hv  # the flag of (chunk 0 of this sequence, i_hv)
    if WAIT:
        if IS_VARLEN:
            ready_row += gl.load(chunk_offsets + n).to(gl.int64) * HV
        else:
            ready_row += n.to(gl.int64) * NT * HV

    # Descriptors of this sequence's rows: copies zero-fill past its end (and past K, V), the o store
    # drops what lies there.
    w_d = tma.make_tensor_descriptor(w + b * s_wb + bos * s_wt + i_hv * s_wh, [rows, K], [s_wt, 1], [BT, BK], tile)
    q_d = tma.make_tensor_descriptor(q + b * s_qb + bos * s_qt + i_h * s_qh, [rows, K], [s_qt, 1], [BT, BK], tile)
    k_d = tma.make_tensor_descriptor(k + b * s_kb + bos * s_kt + i_h * s_kh, [rows, K], [s_kt, 1], [BT, BK], tile)
    u_d = tma.make_tensor_descriptor(u + b * s_ub + bos * s_ut + i_hv * s_uh, [rows, V], [s_ut, 1], [BT, BV], tile)
    a_d = tma.make_tensor_descriptor(a_qk + b * s_ab + bos * s_at + i_hv * s_ah, [rows, BT], [s_at, 1], [BT, BT],
                                     tile)
    o_d = tma.make_tensor_descriptor(out + b * s_ob + bos * s_ot + i_hv * s_oh, [rows, V], [s_ot, 1], [BT, BV],
                                     tile)

    w_s = gl.allocate_shared_memory(dt, [STAGES, BT, BK], tile)
    q_s = gl.allocate_shared_memory(dt, [STAGES, BT, BK], tile)
    k_s = gl.allocate_shared_memory(dt, [STAGES, BT, BK], tile)
    u_s = gl.allocate_shared_memory(dt, [STAGES, BT, BV], tile)
    a_s = gl.allocate_shared_memory(dt, [STAGES, BT, BT], tile)
    o_s = gl.allocate_shared_memory(dt, [2, BT, BV], tile)
    g_s = gl.allocate_shared_memory(gl.float32, [STAGES, BT], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()
    NBYTES: gl.constexpr = BT * (3 * BK + BV + BT) * 2
    g_load: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    g_row = g_cum + b * s_gb + bos * s_gt + i_hv * s_gh
    for i in gl.static_range(STAGES - 1):
        _issue_chunk(i, NC, c_base, n_rows, w_d, k_d, u_d, q_d, a_d, w_s, k_s, u_s, q_s, a_s, g_s, bars, g_row,
                     s_gt, v0, ready_row, HV, STAGES, NBYTES, g_load, WAIT)

    vv = v0 + gl.arange(0, BV, layout=gl.SliceLayout(1, acc_s))
    kk = gl.arange(0, BK, layout=gl.SliceLayout(0, acc_s))
    vk_ok = (vv < V)[:, None] & (kk < K)[None, :]
    if HAS_H0:
        M = gl.load(h0 + h0_row * s_0n + i_hv * s_0h + vv[:, None] * s_0v + kk[None, :] * s_0k, mask=vk_ok,
                    other=0.0).to(gl.float32)
    else:
        M = gl.zeros([BV, BK], gl.float32, acc_s)
    zero_t = gl.zeros([BV, BT], gl.float32, acc_t)
    tok = gl.arange(0, BT, layout=gl.SliceLayout(0, acc_t))
    for c in range(0, NC):
        s = c % STAGES
        # Stage (c - 1) % STAGES is free once every warp is past this barrier: chunk c - 1's MMAs were
        # waited for and its u tile read. Chunk c's gates have landed (this thread's copies by the
        # wait, everyone's by the barrier). The o tile stored two chunks ago has left o_s.
        tma.store_wait(pendings=1)
        async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()
        if not WAIT:
            _issue_chunk(c + STAGES - 1, NC, c_base, n_rows, w_d, k_d, u_d, q_d, a_d, w_s, k_s, u_s, q_s, a_s, g_s,
                         bars, g_row, s_gt, v0, ready_row, HV, STAGES, NBYTES, g_load, WAIT)
        c_seq = c_base + c  # the chunk's index in its sequence
        valid = c_seq * BT + tok < n_rows
        G2 = g_s.index(s).load(gl.SliceLayout(0, acc_t)) * LOG2E
        G2_L = gl.sum(gl.where(tok == gl.minimum(n_rows - c_seq * BT, BT) - 1, G2, 0.0), axis=0)  # the last valid row's
        mbarrier.wait(bars.index(s), (c // STAGES) & 1)

        M_op = gl.convert_layout(M.to(dt), op_t)
        v_tok = warpgroup_mma(M_op, w_s.index(s).permute((1, 0)), zero_t, use_acc=False, is_async=True)
        o1_tok = warpgroup_mma(M_op, q_s.index(s).permute((1, 0)), zero_t, use_acc=False, is_async=True)
        if WAIT:  # the flag's round trip to L2 runs under the first two MMAs, not before them
            _issue_chunk(c + STAGES - 1, NC, c_base, n_rows, w_d, k_d, u_d, q_d, a_d, w_s, k_s, u_s, q_s, a_s, g_s,
                         bars, g_row, s_gt, v0, ready_row, HV, STAGES, NBYTES, g_load, WAIT)
        uT = u_s.index(s).permute((1, 0)).load(acc_t)
        vT = warpgroup_mma_wait(num_outstanding=1, deps=(v_tok,))  # MMAs retire in order: v^T, not o1
        vT = uT.to(gl.float32) - vT
        gated = gl.where(valid[None, :], gl.exp2(G2_L - G2)[None, :] * vT, 0.0)
        gated = gl.convert_layout(gated.to(dt), op_s)
        # the state's decay stays here: written before the wait, ptxas 13.0 sees M (the last step's MMA
        # result) modified with two groups in flight and injects a full wait (C7517) after the issue
        m_tok = warpgroup_mma(gated, k_s.index(s), M * gl.exp2(G2_L), is_async=True)
        o1, M_op = warpgroup_mma_wait(num_outstanding=1, deps=(o1_tok, M_op))  # o1; the state update runs on
        # o^T = e^G o1^T + rnd(v^T) A_qk^T: the MMA adds the gated o1 as its accumulator
        vT_op = gl.convert_layout(vT.to(dt), op_t)
        o_tok = warpgroup_mma(vT_op, a_s.index(s).permute((1, 0)), o1 * gl.exp2(G2)[None, :], is_async=True)
        M, oT, gated, vT_op = warpgroup_mma_wait(num_outstanding=0, deps=(m_tok, o_tok, gated, vT_op))
        oT = oT * scale
        ob = o_s.index(c % 2)
        ob.permute((1, 0)).store(oT.to(dt))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_d, [c_seq * BT, v0], ob)
    tma.store_wait(pendings=0)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    if SEGMENTED:
        vk_ok = vk_ok & seg_last  # only a sequence's last segment holds its final state
    gl.store(final + n * s_fn + i_hv * s_fh + vv[:, None] * s_fv + kk[None, :] * s_fk, M, mask=vk_ok)
