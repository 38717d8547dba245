// Pass 2 of the compressed decode: the merge of the block partials, the inverse rotation fused.
#pragma once

#include "aura_rotate.cuh"

namespace aura {

// ---------------------------------------------------------------------- pass 2: the merge
struct AuraP2Params {
  const float* o;  // [..., NB, D]
  const float* m;  // [..., NB]
  const float* l;
  RowIndexer o_rows, m_rows, l_rows;
  int64_t o_sn, m_sn, l_sn;  // stride of the block dim
  int64_t rows;
  int NB;
  const uint32_t* v_sign;  // non-null: un-rotate (out = s_V . H(o_rot) / sqrt(D))
  float factor;
  void* out;   // contiguous [rows, D]
  float* lse;  // contiguous [rows]
  FloatKind kind;
};

// One warp per (b, (i,) h) row, lane l holding dims l + 32 i. Latency-bound: the first partials load
// with the first m and l (aura-format.md §13). Only blocks with l > 0 count: an empty block's partial
// may be stale or NaN, so it is dropped by a select, never multiplied by 0.
template <int D>
__global__ void __launch_bounds__(kAuraThreads) aura_flash_p2_kernel(const AuraP2Params p) {
  constexpr int V = D / 32, U = 64 / V;  // U blocks per group
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kAuraWarps + (threadIdx.x >> 5);
  const bool live_row = row < p.rows;
  const float* o = p.o + (live_row ? p.o_rows.offset(row) : 0);
  const float* m = p.m + (live_row ? p.m_rows.offset(row) : 0);
  const float* l = p.l + (live_row ? p.l_rows.offset(row) : 0);
  uint32_t v_sign[D / 32];  // the sign mask is no output of pass 1: read before waiting on it
#pragma unroll
  for (int j = 0; j < D / 32; ++j) v_sign[j] = p.v_sign != nullptr ? __ldg(p.v_sign + j) : 0u;
  AURA_PHASE(8);
  grid_dependency_wait();  // launched behind pass 1 (aura_decode): its partials are complete after this
  AURA_PHASE(9);
  if (!live_row) return;
  // group k0 of round n0: blocks n0 + k0 + u, u < U (a block past the round re-reads its last one)
  float v[U][V];
  auto load_group = [&](int n0, int k0, int cnt) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const float* on = o + int64_t(n0 + min(k0 + u, cnt - 1)) * p.o_sn;
#pragma unroll
      for (int i = 0; i < V; ++i) v[u][i] = on[lane + 32 * i];
    }
  };
  auto load_ml = [&](int n, float& mv, float& lv) {  // block n's m and l (l = 0: past the end)
    mv = -INFINITY, lv = 0.f;
    if (n < p.NB) mv = m[n * p.m_sn], lv = l[n * p.l_sn];
  };
  float m0, l0;
  load_ml(lane, m0, l0);
  if (p.NB > 0) load_group(0, 0, min(32, p.NB));
  float M = l0 > 0.f ? m0 : -INFINITY;
  // pass 1 writes l = 0 for an empty block; a non-empty one with a NaN l or m holds NaN/Inf data
  bool poisoned = l0 != 0.f && (l0 != l0 || m0 != m0);
  for (int n = 32 + lane; n < p.NB; n += 32) {  // later rounds (NB > 32)
    float mv, lv;
    load_ml(n, mv, lv);
    if (lv > 0.f) M = fmaxf(M, mv);
    poisoned |= lv != 0.f && (lv != lv || mv != mv);
  }
  M = warp_max(M);
  if (__any_sync(0xffffffffu, poisoned)) {  // propagate, as dense attention does (warp-uniform)
#pragma unroll
    for (int i = 0; i < V; ++i) store_float(p.out, row * D + lane + 32 * i, p.kind, __int_as_float(0x7fc00000));
    if (lane == 0) p.lse[row] = __int_as_float(0x7fc00000);
    return;
  }
  const bool any_live = M > -INFINITY;
  float acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = 0.f;
  float lsum = 0.f;
  if (any_live) {
    for (int n0 = 0; n0 < p.NB; n0 += 32) {
      float mv = m0, lv = l0;
      if (n0 > 0) load_ml(n0 + lane, mv, lv);
      const float w = lv > 0.f ? expf(mv - M) : 0.f;  // block n0 + lane's weight (0: dropped)
      lsum = fmaf(w, lv > 0.f ? lv : 0.f, lsum);
      const int cnt = min(32, p.NB - n0);
      for (int k0 = 0; k0 < cnt; k0 += U) {
        if (n0 > 0 || k0 > 0) load_group(n0, k0, cnt);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const float wk = __shfl_sync(0xffffffffu, w, (k0 + u) & 31);
          const bool use = k0 + u < cnt && wk > 0.f;
#pragma unroll
          for (int i = 0; i < V; ++i) acc[i] = use ? fmaf(wk, v[u][i], acc[i]) : acc[i];
        }
      }
    }
  }
  lsum = warp_sum(lsum);
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = any_live ? acc[i] / lsum : 0.f;
  if (p.v_sign != nullptr) rotate_warp<D>(acc, v_sign, p.factor, true);
#pragma unroll
  for (int i = 0; i < V; ++i) store_float(p.out, row * D + lane + 32 * i, p.kind, acc[i]);
  if (lane == 0) p.lse[row] = any_live ? M + logf(lsum) : -INFINITY;
  AURA_PHASE(10);
}

}  // namespace aura
