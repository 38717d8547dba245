// The log-sum-exp merge of the split partials (docs/decode.md §5), also the merge_attn_states op.
#pragma once

#include "decode_plan.cuh"

namespace aura {

struct MergeParams {
  const void* part_out;  // [S, B, Hq, D]
  const float* part_lse; // [S, B, Hq]
  void* out;             // [B, Hq, D]
  float* lse;            // [B, Hq]
  int64_t po_s, po_b, po_h;
  int64_t pl_s, pl_b, pl_h;
  int64_t out_b, out_h, lse_b, lse_h;
  int S, B, Hq, D;
  // the balanced schedule's partials (plan != nullptr): row (b, h)'s splits are its items, found in
  // the plan; item rows of heads_per_cta heads, G query heads per KV head in head_tiles tiles
  const int* plan;
  int G, heads_per_cta, head_tiles, Hkv;
  // the stream-K schedule's (streamk_ctas > 0): row (b, h)'s splits are the pieces of its unit, found
  // from seq_lens as the split kernel cut them (decode_plan.cuh's StreamK)
  int streamk_ctas;
  const int* seq_lens;
  int capacity;
};

// 4 consecutive values as fp32: one 16-byte load when the layout allows (VEC), else 4 scalars.
template <typename TI, bool VEC>
__device__ __forceinline__ float4 load4_merge(const TI* x) {
  if constexpr (VEC) {
    return *reinterpret_cast<const float4*>(x);
  } else {
    return make_float4(to_float<TI>(x[0]), to_float<TI>(x[1]), to_float<TI>(x[2]), to_float<TI>(x[3]));
  }
}

// acc += w[u] * v[u] over a group of U splits; dead splits (w = 0) dropped by a select: their rows may be NaN.
template <int U>
__device__ __forceinline__ void accumulate_group(const float (&wu)[U], const float4 (&v)[U], float4& acc) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (wu[u] > 0.f) {
      acc.x = fmaf(wu[u], v[u].x, acc.x);
      acc.y = fmaf(wu[u], v[u].y, acc.y);
      acc.z = fmaf(wu[u], v[u].z, acc.z);
      acc.w = fmaf(wu[u], v[u].w, acc.w);
    }
  }
}

// One CTA per (b, query head, 128-dim chunk). Latency-bound, so it counts round trips: each warp's first
// U partials load with the lse values (decode.md §5). A split with lse = -inf is dropped by a select (its
// partial may be stale NaN); a NaN lse makes the row NaN; no live split gives out = 0, lse = -inf.
template <typename TI, typename TO, bool VEC>
__global__ void __launch_bounds__(kMergeThreads) merge_attn_states_kernel(const MergeParams p) {
  // the same 8 float4 loads in flight per lane (half that for 16-bit partials: 4 scalar loads each)
  constexpr int U = VEC ? kMergeUnroll : kMergeUnroll / 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int b = static_cast<int>(blockIdx.x / p.Hq), h = static_cast<int>(blockIdx.x % p.Hq);
  const int d0 = blockIdx.y * kMergeChunk, dl = d0 + 4 * lane;  // D is a multiple of 4 (checked on the host)
  const bool lane_dims = dl < p.D;
  TO* out = static_cast<TO*>(p.out) + b * p.out_b + h * p.out_h;
  AURA_PHASE(8);
  __shared__ long long steps_before[kStreamKMaxBatch + 1];
  if (p.streamk_ctas > 0) streamk_step_prefix(p.seq_lens, p.B, p.capacity, steps_before);  // inputs: before the wait
  grid_dependency_wait();  // launched behind the split kernel: its partials are complete after this
  AURA_PHASE(9);
  // splits of this row: S at strides (pl_s, po_s) from its first: static, or a unit's items (balanced)
  // or pieces (stream-K), partial rows of heads_per_cta heads
  int S = p.S;
  int64_t pl_s = p.pl_s, po_s = p.po_s, first_lse = b * p.pl_b + h * p.pl_h, first_po = b * p.po_b + h * p.po_h;
  if (p.plan != nullptr || p.streamk_ctas > 0) {
    const int units = p.Hkv * p.head_tiles, gi = h % p.G;
    const int unit = (h / p.G) * p.head_tiles + gi / p.heads_per_cta;
    int64_t row0;  // the unit's first partial row
    if (p.plan != nullptr) {
      const int* P = p.plan + kPlanPrefix;
      S = P[b + 1] - P[b];
      row0 = int64_t(units) * P[b] + int64_t(unit) * S;
    } else {
      const long long len = steps_before[b + 1] - steps_before[b], first = steps_before[b] * units + unit * len;
      const StreamK sk{steps_before[p.B] * units, p.streamk_ctas};
      const int c0 = len > 0 ? sk.cta_of(first) : 0;
      S = len > 0 ? sk.cta_of(first + len - 1) - c0 + 1 : 0;
      row0 = c0 + int64_t(b) * units + unit;
    }
    row0 = row0 * p.heads_per_cta + gi % p.heads_per_cta;
    pl_s = p.heads_per_cta, po_s = int64_t(p.heads_per_cta) * p.D;
    first_lse = row0, first_po = row0 * p.D;
  }
  const float* lse_in = p.part_lse + first_lse;
  const TI* po = static_cast<const TI*>(p.part_out) + first_po + dl;

  // splits i0 + u * kMergeWarps (u < U) of round s0: this lane's 4 dims of their partials where
  // live[u], else zeros
  auto load_group = [&](int s0, int i0, const bool (&live)[U], float4 (&v)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      v[u] = live[u] && lane_dims ? load4_merge<TI, VEC>(po + int64_t(s0 + i0 + u * kMergeWarps) * po_s)
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
  };
  float4 first[U];  // the warp's first group, loaded with the lse values (weights unknown yet)
  {
    bool live[U];
#pragma unroll
    for (int u = 0; u < U; ++u) live[u] = warp + u * kMergeWarps < min(kMergeThreads, S);
    load_group(0, warp, live, first);
  }
  float M = -INFINITY;
  bool nan_split = false;  // a NaN lse comes from NaN/Inf data (empty splits write -inf): propagate it
  for (int s = lane; s < S; s += 32) {
    const float l = lse_in[s * pl_s];
    M = fmaxf(M, l);
    nan_split |= l != l;
  }
  M = warp_max(M);  // the same value in every warp
  if (__any_sync(0xffffffffu, nan_split)) {  // warp-uniform, and the same in every warp
    for (int d = d0 + threadIdx.x; d < min(p.D, d0 + kMergeChunk); d += kMergeThreads)
      out[d] = from_float<TO>(__int_as_float(0x7fc00000));
    if (threadIdx.x == 0 && blockIdx.y == 0) p.lse[b * p.lse_b + h * p.lse_h] = __int_as_float(0x7fc00000);
    return;
  }
  if (M == -INFINITY) {
    for (int d = d0 + threadIdx.x; d < min(p.D, d0 + kMergeChunk); d += kMergeThreads) out[d] = from_float<TO>(0.f);
    if (threadIdx.x == 0 && blockIdx.y == 0) p.lse[b * p.lse_b + h * p.lse_h] = -INFINITY;
    return;
  }
  __shared__ float ws[kMergeThreads];
  __shared__ float4 parts[kMergeWarps][32];
  __shared__ float wsums[kMergeWarps];
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float wsum = 0.f;  // this thread's splits; summed over the CTA at the end
  for (int s0 = 0; s0 < S; s0 += kMergeThreads) {
    const int s = s0 + threadIdx.x;
    const float l = s < S ? lse_in[s * pl_s] : -INFINITY;
    const float wl = l == -INFINITY ? 0.f : expf(l - M);
    wsum += wl;
    __syncthreads();  // the previous round's readers of ws are done
    ws[threadIdx.x] = wl;
    __syncthreads();
    const int n = min(kMergeThreads, S - s0);
    for (int i0 = warp; i0 < n; i0 += kMergeWarps * U) {
      float wu[U];
      bool live[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = i0 + u * kMergeWarps;
        wu[u] = i < n ? ws[i] : 0.f;
        live[u] = wu[u] > 0.f;
      }
      float4 v[U];
      if (s0 == 0 && i0 == warp) {
#pragma unroll
        for (int u = 0; u < U; ++u) v[u] = first[u];
      } else {
        load_group(s0, i0, live, v);  // later groups: dead splits are never loaded
      }
      accumulate_group<U>(wu, v, acc);
    }
  }
  wsum = warp_sum(wsum);
  if (lane == 0) wsums[warp] = wsum;
  parts[warp][lane] = acc;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int wi = 0; wi < kMergeWarps; ++wi) total += wsums[wi];
  const float inv = 1.f / total;
  const int q4 = threadIdx.x;  // 4-dim group of the chunk
  if (q4 < kMergeChunk / 4 && d0 + 4 * q4 < p.D) {
    float4 sum = parts[0][q4];
#pragma unroll
    for (int wi = 1; wi < kMergeWarps; ++wi) {
      const float4 x = parts[wi][q4];
      sum.x += x.x, sum.y += x.y, sum.z += x.z, sum.w += x.w;
    }
    TO* o = out + d0 + 4 * q4;
    o[0] = from_float<TO>(sum.x * inv);
    o[1] = from_float<TO>(sum.y * inv);
    o[2] = from_float<TO>(sum.z * inv);
    o[3] = from_float<TO>(sum.w * inv);
  }
  if (threadIdx.x == 0 && blockIdx.y == 0) p.lse[b * p.lse_b + h * p.lse_h] = M + logf(total);
  AURA_PHASE(10);
}

}  // namespace aura
