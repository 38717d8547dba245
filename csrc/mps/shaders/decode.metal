// Split-K flash decoding (docs/decode.md) for the MPS backend: the split kernel and the
// log-sum-exp merge. Stage order and rounding points follow torch_aura/reference/decode.py: inputs
// upcast to fp32 on load, q pre-scaled (by scale * log2(e): the kernel works in base 2), fp32
// partials, one rounding to the output dtype after the merge.
#include "aura_compat.h"
#include "aura_params.h"

inline int decode_ceil_div(int a, int b) { return (a + b - 1) / b; }

// Row of token t of sequence b, KV head h, in either cache layout.
template <typename T>
inline device const T* decode_kv_row(device const T* cache, constant aura_i64* stride, device const int* block_table,
                                     constant DecodeSplitParams& p, uint b, uint h, int t) {
  if (p.page_size == 0) return cache + b * stride[0] + h * stride[1] + t * stride[2];
  const int page = clamp(block_table[b * p.table_stride + t / p.page_size], 0, p.num_blocks - 1);
  return cache + page * stride[0] + (t % p.page_size) * stride[1] + h * stride[2];
}

// Grid (splits, Hkv, B), kDecodeSimdgroups * 32 threads. One threadgroup serves every query head
// of its KV head (decode.md §3): K/V rows are read once per head tile, not once per query head.
// Lane l owns dims l + 32 i; simdgroup w takes tokens start + w, start + w + 4, ...
template <typename T, int D>
kernel void flash_decode_split(device const T* q [[buffer(0)]],
                               device const T* k [[buffer(1)]],
                               device const T* v [[buffer(2)]],
                               device const int* seq_lens [[buffer(3)]],
                               device const int* block_table [[buffer(4)]],
                               device T* out [[buffer(5)]],
                               device float* lse [[buffer(6)]],
                               device float* partial_out [[buffer(7)]],
                               device float* partial_lse [[buffer(8)]],
                               constant DecodeSplitParams& p [[buffer(9)]],
                               uint3 group [[threadgroup_position_in_grid]],
                               uint sg [[simdgroup_index_in_threadgroup]],
                               uint lane [[thread_index_in_simdgroup]],
                               uint tid [[thread_index_in_threadgroup]]) {
  constexpr int kDimsPerLane = (D + 31) / 32;
  constexpr int W = kDecodeSimdgroups, HT = kDecodeHeadTile;
  const uint s = group.x, kvh = group.y, b = group.z;

  // The per-sequence split rule of reference/decode.py split_chunk, on the device: the host never
  // reads seq_lens (decode.md §4).
  const int seq_len = clamp(seq_lens[b], 0, p.capacity);
  const int chunk = decode_ceil_div(max(int(kDecodeMinChunk), decode_ceil_div(seq_len, p.splits)), p.tile) * p.tile;
  const int live_splits = decode_ceil_div(seq_len, chunk);
  const int start = int(s) * chunk, end = min(start + chunk, seq_len);

  AURA_TG(float, tg_m, W * HT);
  AURA_TG(float, tg_l, W * HT);
  AURA_TG(float, tg_o, HT * D);

  for (int h0 = 0; h0 < p.group; h0 += HT) {
    const int nh = min(HT, p.group - h0);
    const uint hq0 = kvh * p.group + h0;
    if (int(s) >= live_splits) {
      // Empty split: lse = -inf so the merge skips it (its partial stays unwritten); with one
      // split (seq_len == 0) this is the final answer: out = 0, lse = -inf.
      for (int i = int(tid); i < nh * D; i += W * 32) {
        if (p.direct) out[b * p.out_stride[0] + (hq0 + i / D) * p.out_stride[1] + i % D] = T(0.0f);
      }
      if (int(tid) < nh) {
        if (p.direct) lse[b * p.lse_stride[0] + (hq0 + tid) * p.lse_stride[1]] = -INFINITY;
        else partial_lse[(s * p.batch + b) * p.q_heads + hq0 + tid] = -INFINITY;
      }
      continue;
    }

    float qv[HT][kDimsPerLane];
    float acc[HT][kDimsPerLane];
    float m[HT], l[HT];
    for (int hh = 0; hh < HT; ++hh) {
      m[hh] = -INFINITY;
      l[hh] = 0.0f;
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = int(lane) + 32 * i;
        const bool live = hh < nh && d < D;
        qv[hh][i] = live ? float(q[b * p.q_stride[0] + (hq0 + hh) * p.q_stride[1] + d]) * p.scale_log2 : 0.0f;
        acc[hh][i] = 0.0f;
      }
    }

    for (int t = start + int(sg); t < end; t += W) {
      device const T* krow = decode_kv_row(k, p.k_stride, block_table, p, b, kvh, t);
      device const T* vrow = decode_kv_row(v, p.v_stride, block_table, p, b, kvh, t);
      float4 dot = float4{0.0f, 0.0f, 0.0f, 0.0f};
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = int(lane) + 32 * i;
        const float kd = d < D ? float(krow[d]) : 0.0f;
        for (int hh = 0; hh < HT; ++hh) dot[hh] += qv[hh][i] * kd;
      }
      const float4 logit = simd_sum(dot);  // the whole head tile in one collective
      float vd[kDimsPerLane];
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = int(lane) + 32 * i;
        vd[i] = d < D ? float(vrow[d]) : 0.0f;
      }
      for (int hh = 0; hh < nh; ++hh) {
        const float m_new = max(m[hh], logit[hh]);
        const float alpha = exp2(m[hh] - m_new);  // m = -inf before the first token: alpha = 0
        const float pr = exp2(logit[hh] - m_new);
        l[hh] = l[hh] * alpha + pr;
        for (int i = 0; i < kDimsPerLane; ++i) acc[hh][i] = acc[hh][i] * alpha + pr * vd[i];
        m[hh] = m_new;
      }
    }

    // Merge the W simdgroups' states: max, weights, then their accumulators one after another.
    if (lane < uint(HT)) {
      tg_m[sg * HT + lane] = m[lane];
      tg_l[sg * HT + lane] = l[lane];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float M[HT], L[HT], mine[HT];
    for (int hh = 0; hh < HT; ++hh) {
      M[hh] = -INFINITY;
      for (int w = 0; w < W; ++w) M[hh] = max(M[hh], tg_m[w * HT + hh]);
      L[hh] = 0.0f;
      for (int w = 0; w < W; ++w) {
        const float mw = tg_m[w * HT + hh];
        // A simdgroup that saw no token (short last split) has m = -inf and l = 0: weight 0.
        L[hh] += mw == -INFINITY ? 0.0f : exp2(mw - M[hh]) * tg_l[w * HT + hh];
      }
      mine[hh] = m[hh] == -INFINITY ? 0.0f : exp2(m[hh] - M[hh]);
    }
    for (int w = 0; w < W; ++w) {
      if (int(sg) == w) {
        for (int hh = 0; hh < nh; ++hh) {
          for (int i = 0; i < kDimsPerLane; ++i) {
            const int d = int(lane) + 32 * i;
            if (d < D) tg_o[hh * D + d] = (w == 0 ? 0.0f : tg_o[hh * D + d]) + acc[hh][i] * mine[hh];
          }
        }
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }

    for (int i = int(tid); i < nh * D; i += W * 32) {
      const int hh = i / D, d = i % D;
      const float o = tg_o[i] / L[hh];  // normalized: O_s = sum p v / l
      if (p.direct) out[b * p.out_stride[0] + (hq0 + hh) * p.out_stride[1] + d] = T(o);
      else partial_out[((s * p.batch + b) * p.q_heads + hq0 + hh) * D + d] = o;
    }
    if (int(tid) < nh) {
      const float lse_nat = (M[tid] + log2(L[tid])) * M_LN2_F;  // back to natural log at the boundary
      if (p.direct) lse[b * p.lse_stride[0] + (hq0 + tid) * p.lse_stride[1]] = lse_nat;
      else partial_lse[(s * p.batch + b) * p.q_heads + hq0 + tid] = lse_nat;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // tg_m / tg_o are reused by the next head tile
  }
}

// Log-sum-exp merge (decode.md §5), one simdgroup per (query head, sequence); grid (Hq, B).
// Splits with lse = -inf are skipped (their partial may hold NaN), never weighted by 0; with no
// live split out = 0 and lse = -inf.
template <typename Tin, typename Tout>
kernel void merge_attn_states(device const Tin* partial_out [[buffer(0)]],
                              device const float* partial_lse [[buffer(1)]],
                              device Tout* out [[buffer(2)]],
                              device float* lse [[buffer(3)]],
                              constant MergeParams& p [[buffer(4)]],
                              uint2 group [[threadgroup_position_in_grid]],
                              uint lane [[thread_index_in_threadgroup]]) {
  const uint h = group.x, b = group.y;
  device const float* pl = partial_lse + b * p.pl_stride[1] + h * p.pl_stride[2];
  device const Tin* po = partial_out + b * p.po_stride[1] + h * p.po_stride[2];
  device Tout* o = out + b * p.out_stride[0] + h * p.out_stride[1];
  float M = -INFINITY;
  for (int s = 0; s < p.splits; ++s) M = max(M, pl[s * p.pl_stride[0]]);
  if (M == -INFINITY) {
    for (int d = int(lane); d < p.head_dim; d += 32) o[d] = Tout(0.0f);
    if (lane == 0) lse[b * p.lse_stride[0] + h * p.lse_stride[1]] = -INFINITY;
    return;
  }
  float w_sum = 0.0f;
  for (int s = 0; s < p.splits; ++s) {
    const float ls = pl[s * p.pl_stride[0]];
    w_sum += ls == -INFINITY ? 0.0f : exp(ls - M);
  }
  for (int d = int(lane); d < p.head_dim; d += 32) {
    float acc = 0.0f;
    for (int s = 0; s < p.splits; ++s) {
      const float ls = pl[s * p.pl_stride[0]];
      if (ls != -INFINITY) acc += exp(ls - M) * float(po[s * p.po_stride[0] + d]);
    }
    o[d] = Tout(acc / w_sum);
  }
  if (lane == 0) lse[b * p.lse_stride[0] + h * p.lse_stride[1]] = M + log(w_sum);
}

#define AURA_DECODE_SPLIT(T, tname, D) AURA_INSTANTIATE("flash_decode_split_" #tname "_" #D, flash_decode_split, T, D)
#define AURA_DECODE_SPLIT_DIMS(T, tname, unused) \
  AURA_DECODE_SPLIT(T, tname, 64) AURA_DECODE_SPLIT(T, tname, 80) AURA_DECODE_SPLIT(T, tname, 96) \
  AURA_DECODE_SPLIT(T, tname, 128) AURA_DECODE_SPLIT(T, tname, 192) AURA_DECODE_SPLIT(T, tname, 256) \
  AURA_DECODE_SPLIT(T, tname, 512)
AURA_FOR_FLOAT_TYPES(AURA_DECODE_SPLIT_DIMS, _)

// Merge: partials of any float dtype into their own dtype (merge_attn_states), or fp32 partials
// of the split kernel into q's dtype (flash_decode).
AURA_INSTANTIATE("merge_attn_states_f32_f32", merge_attn_states, float, float)
AURA_INSTANTIATE("merge_attn_states_f32_f16", merge_attn_states, float, half)
AURA_INSTANTIATE("merge_attn_states_f32_bf16", merge_attn_states, float, bfloat)
AURA_INSTANTIATE("merge_attn_states_f16_f16", merge_attn_states, half, half)
AURA_INSTANTIATE("merge_attn_states_bf16_bf16", merge_attn_states, bfloat, bfloat)
