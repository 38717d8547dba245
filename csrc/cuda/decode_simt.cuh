// The CUDA-core split kernel for fp32 caches (exact fp32 products; docs/decode.md §3): K/V stages in
// shared memory, one thread per (head, token) logit.
#pragma once

#include "decode_plan.cuh"

namespace aura {

// Threads per CTA of the CUDA-core fp32 kernel: 4 warps (tuned there, and it spills registers at 8).
constexpr int kSimtThreads = 128;

// Stage length: one K tile of about 16 KB (bf16 D=128: 64 tokens; D=512: 16; fp32 D=512: 8).
template <typename T, int D>
constexpr int decode_stage_tokens() {
  constexpr int t = 16384 / (D * static_cast<int>(sizeof(T)));
  return t >= 64 ? 64 : t >= 32 ? 32 : t >= 16 ? 16 : 8;
}

// Padded row length in elements: +16 bytes makes row-parallel 16-byte reads bank-conflict free.
template <typename T, int D>
constexpr int decode_row_elems() { return D + 16 / static_cast<int>(sizeof(T)); }

template <typename T, int D>
constexpr size_t decode_kv_smem_bytes() {
  return size_t(2) * 2 * decode_stage_tokens<T, D>() * decode_row_elems<T, D>() * sizeof(T);
}

template <typename T, int D>
constexpr size_t decode_head_smem_bytes() {  // CUDA-core kernel: q, o (D each), p (TS), m, l, alpha
  return sizeof(float) * (2 * D + decode_stage_tokens<T, D>() + 4);
}

// cp.async one stage of TS K and V rows into padded shared rows (ROW elements apart). Rows past
// the split's end are zero-filled without reading memory, so P * V never meets stale NaN.
template <typename T, int D, int TS, int ROW, int THREADS>
__device__ __forceinline__ void issue_kv_stage(const DecodeParams& p, const SplitWork& w, T* kbuf, T* vbuf,
                                               int stage, int buf) {
  constexpr int VEC = 16 / sizeof(T), CPR = D / VEC;
  const T* kg = static_cast<const T*>(p.k);
  const T* vg = static_cast<const T*>(p.v);
  const int t0 = w.start + stage * TS;
  for (int idx = threadIdx.x; idx < TS * CPR; idx += THREADS) {
    const int r = idx / CPR, c = idx % CPR, t = t0 + r;
    const bool valid = t < w.end;
    int64_t ko = 0, vo = 0;
    if (valid) {
      if (p.block_table != nullptr) {
        int page = p.block_table[w.b * p.bt_sb + t / p.page_size];
        page = min(max(page, 0), p.num_blocks - 1);  // never read outside the cache
        const int row = t % p.page_size;
        ko = page * p.k_s0 + row * p.k_s1 + w.kvh * p.k_s2;
        vo = page * p.v_s0 + row * p.v_s1 + w.kvh * p.v_s2;
      } else {
        ko = w.b * p.k_s0 + w.kvh * p.k_s1 + int64_t(t) * p.k_s2;
        vo = w.b * p.v_s0 + w.kvh * p.v_s1 + int64_t(t) * p.v_s2;
      }
    }
    cp_async16(kbuf + (buf * TS + r) * ROW + c * VEC, kg + ko + c * VEC, valid);
    cp_async16(vbuf + (buf * TS + r) * ROW + c * VEC, vg + vo + c * VEC, valid);
  }
  cp_async_commit();
}

// Issue stage st+1 (if any), then wait until stage st has landed for the whole CTA.
template <typename T, int D, int TS, int ROW, int THREADS>
__device__ __forceinline__ void next_stage(const DecodeParams& p, const SplitWork& w, T* kbuf, T* vbuf, int st,
                                           int n_stages) {
  if (st + 1 < n_stages) {
    issue_kv_stage<T, D, TS, ROW, THREADS>(p, w, kbuf, vbuf, st + 1, (st + 1) & 1);
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

// Online softmax of one stage, one warp per head row, log2 units; p overwrites the logits. The stage
// has a valid token, so m_new is finite and the first stage's exp2(-inf - m_new) is 0, not NaN.
template <int TS, int THREADS>
__device__ __forceinline__ void softmax_stage(float* s_rows, float* ms, float* ls, float* as, int nh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int g = warp; g < nh; g += THREADS / 32) {
    float mx = -INFINITY;
    for (int r = lane; r < TS; r += 32) mx = fmaxf(mx, s_rows[g * TS + r]);
    mx = warp_max(mx);
    const float m_old = ms[g];
    const float m_new = fmaxf(m_old, mx);
    float sum = 0.f;
    for (int r = lane; r < TS; r += 32) {
      const float x = s_rows[g * TS + r];
      const float pr = x == -INFINITY ? 0.f : exp2f(x - m_new);
      s_rows[g * TS + r] = pr;
      sum += pr;
    }
    sum = warp_sum(sum);
    __syncwarp();
    if (lane == 0) {
      const float alpha = exp2f(m_old - m_new);
      ls[g] = ls[g] * alpha + sum;
      ms[g] = m_new;
      as[g] = alpha;
    }
  }
}

// Exact fp32 (tensor cores would round K and V to tf32): QK one thread per (head, token), PV one per
// (head, 4 dims), the output in shared memory so any G fits.
template <typename T, int D>
__global__ void __launch_bounds__(kSimtThreads) flash_decode_split_simt_kernel(const DecodeParams p) {
  constexpr int TS = decode_stage_tokens<T, D>();
  constexpr int ROW = decode_row_elems<T, D>();
  constexpr int VEC = 16 / sizeof(T);
  constexpr int CPR = D / VEC;
  constexpr int D4 = D / 4;

  SplitWork w;
  if (!plan_split<T>(p, w)) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* kbuf = reinterpret_cast<T*>(smem_raw);  // [2][TS][ROW]
  T* vbuf = kbuf + 2 * TS * ROW;             // [2][TS][ROW]
  const int hpc = p.heads_per_cta;
  float* qs = reinterpret_cast<float*>(vbuf + 2 * TS * ROW);  // [hpc][D], pre-scaled
  float* os = qs + hpc * D;                                   // [hpc][D], running output
  float* ss = os + hpc * D;                                   // [hpc][TS], logits then p
  float* ms = ss + hpc * TS;                                  // [hpc] running max (log2 units)
  float* ls = ms + hpc;                                       // [hpc] running sum
  float* as = ls + hpc;                                       // [hpc] this stage's rescale
  const int tid = threadIdx.x, nh = w.nh;
  const int n_stages = ceil_div(w.end - w.start, TS);

  issue_kv_stage<T, D, TS, ROW, kSimtThreads>(p, w, kbuf, vbuf, 0, 0);  // overlaps with loading q below
  const T* qg = static_cast<const T*>(p.q);
  for (int i = tid; i < nh * D; i += kSimtThreads) {
    qs[i] = to_float<T>(qg[w.b * p.q_sb + (w.hq0 + i / D) * p.q_sh + i % D]) * p.scale_log2;
    os[i] = 0.f;
  }
  for (int g = tid; g < nh; g += kSimtThreads) ms[g] = -INFINITY, ls[g] = 0.f;

  for (int st = 0; st < n_stages; ++st) {
    next_stage<T, D, TS, ROW, kSimtThreads>(p, w, kbuf, vbuf, st, n_stages);
    const T* kt = kbuf + (st & 1) * TS * ROW;
    const T* vt = vbuf + (st & 1) * TS * ROW;
    const int nvalid = min(TS, w.end - (w.start + st * TS));  // >= 1

    for (int task = tid; task < nh * TS; task += kSimtThreads) {
      const int g = task / TS, r = task % TS;
      float logit = -INFINITY;
      if (r < nvalid) {
        // VEC independent partial sums keep the dependent FMA chain CPR long, not D long.
        float acc[VEC];
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[i] = 0.f;
        const T* krow = kt + r * ROW;
        const float4* q4 = reinterpret_cast<const float4*>(qs + g * D);
#pragma unroll
        for (int c = 0; c < CPR; ++c) {
          float kf[VEC];
          load16_float<T>(krow + c * VEC, kf);
#pragma unroll
          for (int i = 0; i < VEC; i += 4) {
            const float4 qv = q4[(c * VEC + i) / 4];  // a warp-uniform address: a broadcast
            acc[i] = fmaf(qv.x, kf[i], acc[i]);
            acc[i + 1] = fmaf(qv.y, kf[i + 1], acc[i + 1]);
            acc[i + 2] = fmaf(qv.z, kf[i + 2], acc[i + 2]);
            acc[i + 3] = fmaf(qv.w, kf[i + 3], acc[i + 3]);
          }
        }
        logit = 0.f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) logit += acc[i];
      }
      ss[g * TS + r] = logit;
    }
    __syncthreads();
    softmax_stage<TS, kSimtThreads>(ss, ms, ls, as, nh);  // p overwrites the logits in place
    __syncthreads();
    for (int task = tid; task < nh * D4; task += kSimtThreads) {
      const int g = task / D4, d0 = (task % D4) * 4;
      const float* pg = ss + g * TS;
      // Rows in pairs, two accumulator sets: two independent FMA chains, and only compile-time
      // register indices (a run-time index would move the array to local memory).
      float even[4] = {0.f, 0.f, 0.f, 0.f}, odd[4] = {0.f, 0.f, 0.f, 0.f};
      int r = 0;
      for (; r + 1 < nvalid; r += 2) {
        float v0[4], v1[4];
        load4_float<T>(vt + r * ROW + d0, v0);
        load4_float<T>(vt + (r + 1) * ROW + d0, v1);
        const float p0 = pg[r], p1 = pg[r + 1];
#pragma unroll
        for (int i = 0; i < 4; ++i) even[i] = fmaf(p0, v0[i], even[i]), odd[i] = fmaf(p1, v1[i], odd[i]);
      }
      if (r < nvalid) {
        float v0[4];
        load4_float<T>(vt + r * ROW + d0, v0);
#pragma unroll
        for (int i = 0; i < 4; ++i) even[i] = fmaf(pg[r], v0[i], even[i]);
      }
      const float alpha = as[g];
      float* o = os + g * D + d0;
#pragma unroll
      for (int i = 0; i < 4; ++i) o[i] = fmaf(o[i], alpha, even[i] + odd[i]);
    }
    __syncthreads();  // the next stage's loads overwrite this buffer and ss
  }
  for (int i = tid; i < nh * D; i += kSimtThreads) store_value<T>(p, w, i / D, i % D, os[i] / ls[i / D]);
  store_lse<kSimtThreads>(p, w, ms, ls);
}

}  // namespace aura
