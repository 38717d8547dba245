// Split-K flash decoding kernels (docs/decode.md): one query token per sequence against a dense
// KV cache, contiguous [B, Hkv, T_cap, D] or paged [num_blocks, page_size, Hkv, D].
//
// Grid (S, Hkv * head_tiles, B), 128 threads. A CTA owns (split s, KV head, sequence b) and the
// query heads of that KV head's group (all G of them unless G is too large for shared memory, then
// a tile of them), so each K/V byte of a split crosses HBM once whatever the GQA ratio (§3).
// Per stage of TS tokens:
//   1. cp.async K and V rows HBM -> shared memory, one stage ahead (double buffer);
//   2. QK: one thread per (head, token) computes the full dot product from shared memory (rows are
//      padded by 16 bytes, so the 8 lanes of a 16-byte access phase hit disjoint banks);
//   3. online softmax per head in base 2 (q pre-scaled by scale * log2 e), one warp per head;
//   4. PV: one thread per (head, 4 dims) accumulates the stage and rescales the running output,
//      kept in shared memory so any G fits (no register array sized by a run-time G).
// The split rule runs on the device from seq_lens (the host only fixes S from static values),
// matching torch_aura/reference/decode.py's split_chunk bit for bit.
#pragma once

#include "common.cuh"

namespace aura {

constexpr int kDecodeThreads = 128;
constexpr int kMinChunk = 256;          // decode.md §4: a split below this costs more than it saves
constexpr int kContiguousTile = 64;     // split granularity of the contiguous layout (reference too)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct DecodeParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;          // [B, Hq, D] q's dtype, written when S == 1
  float* lse;         // [B, Hq] fp32, written when S == 1
  float* part_out;    // [S, B, Hq, D] fp32 contiguous, written when S > 1
  float* part_lse;    // [S, B, Hq] fp32 contiguous, written when S > 1
  const int* seq_lens;
  const int* block_table;  // nullptr: contiguous layout
  int64_t q_sb, q_sh;
  int64_t k_s0, k_s1, k_s2;  // contiguous: (b, h, t); paged: (block, row, h)
  int64_t v_s0, v_s1, v_s2;
  int64_t out_sb, out_sh, lse_sb, lse_sh;
  int64_t bt_sb;
  int B, Hq, Hkv, G, S;
  int heads_per_cta, head_tiles;
  int capacity;        // T_cap, or max_blocks * page_size
  int page_size;       // paged only
  int num_blocks;      // paged only
  float scale_log2;    // softmax scale * log2(e)
};

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
constexpr size_t decode_head_smem_bytes() {  // q, o (D each), p (TS), m, l, alpha
  return sizeof(float) * (2 * D + decode_stage_tokens<T, D>() + 4);
}

// The per-sequence split rule (reference: split_chunk): chunk = round_up(max(256, ceil(T/S)), tile).
__device__ __forceinline__ void split_rule(int T, int S, int tile, int& chunk, int& live_splits) {
  const int per_split = max(kMinChunk, ceil_div(T, S));
  chunk = ceil_div(per_split, tile) * tile;
  live_splits = ceil_div(T, chunk);
}

template <typename T, int D>
__global__ void __launch_bounds__(kDecodeThreads) flash_decode_split_kernel(const DecodeParams p) {
  constexpr int TS = decode_stage_tokens<T, D>();
  constexpr int ROW = decode_row_elems<T, D>();
  constexpr int VEC = 16 / sizeof(T);  // elements per 16-byte chunk
  constexpr int CPR = D / VEC;         // 16-byte chunks per row
  constexpr int D4 = D / 4;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* kbuf = reinterpret_cast<T*>(smem_raw);  // [2][TS][ROW]
  T* vbuf = kbuf + 2 * TS * ROW;             // [2][TS][ROW]
  const int hpc = p.heads_per_cta;
  float* qs = reinterpret_cast<float*>(vbuf + 2 * TS * ROW);  // [hpc][D], pre-scaled
  float* os = qs + hpc * D;                                   // [hpc][D], running output
  float* ps = os + hpc * D;                                   // [hpc][TS], logits then p
  float* ms = ps + hpc * TS;                                  // [hpc] running max (log2 units)
  float* ls = ms + hpc;                                       // [hpc] running sum
  float* as = ls + hpc;                                       // [hpc] this stage's rescale

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int s = blockIdx.x;
  const int kvh = blockIdx.y / p.head_tiles;
  const int g0 = (blockIdx.y % p.head_tiles) * hpc;
  const int nh = min(hpc, p.G - g0);
  const int hq0 = kvh * p.G + g0;  // first query head of this CTA
  const int b = blockIdx.z;
  if (nh <= 0) return;

  // Clamped, so a bad seq_len can only give a wrong answer, never an out-of-bounds read.
  const int T_b = min(max(p.seq_lens[b], 0), p.capacity);
  const bool paged = p.block_table != nullptr;
  int chunk, live_splits;
  split_rule(T_b, p.S, paged ? p.page_size : kContiguousTile, chunk, live_splits);

  if (s >= live_splits) {
    // An empty split. With S > 1 it writes lse = -inf and no partial: the merge skips it (a stale
    // partial may hold NaN). With S == 1 nothing merges, so out = 0 and lse = -inf are final.
    for (int i = tid; i < nh * D; i += kDecodeThreads) {
      if (p.S == 1) {
        T* out = static_cast<T*>(p.out);
        out[b * p.out_sb + (hq0 + i / D) * p.out_sh + i % D] = from_float<T>(0.f);
      }
    }
    for (int g = tid; g < nh; g += kDecodeThreads) {
      if (p.S == 1) p.lse[b * p.lse_sb + (hq0 + g) * p.lse_sh] = -INFINITY;
      else p.part_lse[(int64_t(s) * p.B + b) * p.Hq + hq0 + g] = -INFINITY;
    }
    return;
  }
  const int start = s * chunk;
  const int end = min(start + chunk, T_b);
  const int n_stages = ceil_div(end - start, TS);

  const T* kg = static_cast<const T*>(p.k);
  const T* vg = static_cast<const T*>(p.v);
  auto issue_stage = [&](int stage, int buf) {
    const int t0 = start + stage * TS;
    for (int idx = tid; idx < TS * CPR; idx += kDecodeThreads) {
      const int r = idx / CPR, c = idx % CPR, t = t0 + r;
      const bool valid = t < end;
      int64_t ko = 0, vo = 0;
      if (valid) {
        if (paged) {
          int page = p.block_table[b * p.bt_sb + t / p.page_size];
          page = min(max(page, 0), p.num_blocks - 1);  // never read outside the cache
          const int row = t % p.page_size;
          ko = page * p.k_s0 + row * p.k_s1 + kvh * p.k_s2;
          vo = page * p.v_s0 + row * p.v_s1 + kvh * p.v_s2;
        } else {
          ko = b * p.k_s0 + kvh * p.k_s1 + int64_t(t) * p.k_s2;
          vo = b * p.v_s0 + kvh * p.v_s1 + int64_t(t) * p.v_s2;
        }
      }
      cp_async16(kbuf + (buf * TS + r) * ROW + c * VEC, kg + ko + c * VEC, valid);
      cp_async16(vbuf + (buf * TS + r) * ROW + c * VEC, vg + vo + c * VEC, valid);
    }
    cp_async_commit();
  };

  issue_stage(0, 0);  // overlaps with loading q below

  const T* qg = static_cast<const T*>(p.q);
  for (int i = tid; i < nh * D; i += kDecodeThreads) {
    qs[i] = to_float<T>(qg[b * p.q_sb + (hq0 + i / D) * p.q_sh + i % D]) * p.scale_log2;
    os[i] = 0.f;
  }
  for (int g = tid; g < nh; g += kDecodeThreads) {
    ms[g] = -INFINITY;
    ls[g] = 0.f;
  }

  for (int st = 0; st < n_stages; ++st) {
    if (st + 1 < n_stages) {
      issue_stage(st + 1, (st + 1) & 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* kt = kbuf + (st & 1) * TS * ROW;
    const T* vt = vbuf + (st & 1) * TS * ROW;
    const int nvalid = min(TS, end - (start + st * TS));  // >= 1

    // 1. logits (log2 units), -inf past the end of the split
    for (int task = tid; task < nh * TS; task += kDecodeThreads) {
      const int g = task / TS, r = task % TS;
      float logit = -INFINITY;
      if (r < nvalid) {
        // VEC independent partial sums: a single accumulator would make the dot product one
        // D-long chain of dependent FMAs (latency-bound); this keeps it CPR long.
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
      ps[g * TS + r] = logit;
    }
    __syncthreads();

    // 2. online softmax: one warp per head. The stage has >= 1 valid token, so m_new is finite
    //    and exp2(m_old - m_new) is 0 (not NaN) on the first stage, where m_old = -inf.
    for (int g = warp; g < nh; g += kDecodeThreads / 32) {
      float* pg = ps + g * TS;
      float mx = -INFINITY;
      for (int r = lane; r < TS; r += 32) mx = fmaxf(mx, pg[r]);
      mx = warp_max(mx);
      const float m_new = fmaxf(ms[g], mx);
      const float alpha = exp2f(ms[g] - m_new);
      float sum = 0.f;
      for (int r = lane; r < TS; r += 32) {
        const float x = pg[r];
        const float pr = x == -INFINITY ? 0.f : exp2f(x - m_new);
        pg[r] = pr;
        sum += pr;
      }
      sum = warp_sum(sum);
      __syncwarp();
      if (lane == 0) {
        ls[g] = ls[g] * alpha + sum;
        ms[g] = m_new;
        as[g] = alpha;
      }
    }
    __syncthreads();

    // 3. o = alpha * o + sum_t p_t v_t over this stage's valid rows
    for (int task = tid; task < nh * D4; task += kDecodeThreads) {
      const int g = task / D4, d0 = (task % D4) * 4;
      const float* pg = ps + g * TS;
      // Two accumulator sets (even / odd rows) halve the FMA chains; full stages take an unrolled
      // path with a compile-time trip count so the shared-memory loads are issued ahead.
      float acc[2][4] = {};
      if (nvalid == TS) {
#pragma unroll 8
        for (int r = 0; r < TS; ++r) {
          float vf[4];
          load4_float<T>(vt + r * ROW + d0, vf);
          const float pr = pg[r];
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[r & 1][i] = fmaf(pr, vf[i], acc[r & 1][i]);
        }
      } else {
        for (int r = 0; r < nvalid; ++r) {
          float vf[4];
          load4_float<T>(vt + r * ROW + d0, vf);
          const float pr = pg[r];
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[0][i] = fmaf(pr, vf[i], acc[0][i]);
        }
      }
      const float alpha = as[g];
      float* o = os + g * D + d0;
#pragma unroll
      for (int i = 0; i < 4; ++i) o[i] = fmaf(o[i], alpha, acc[0][i] + acc[1][i]);
    }
    __syncthreads();  // the next stage's loads overwrite this buffer and ps
  }

  // Normalised partial (or the final output when S == 1); l >= 1 since the max token has p = 1.
  for (int i = tid; i < nh * D; i += kDecodeThreads) {
    const int g = i / D, d = i % D;
    const float val = os[i] / ls[g];
    if (p.S == 1) {
      static_cast<T*>(p.out)[b * p.out_sb + (hq0 + g) * p.out_sh + d] = from_float<T>(val);
    } else {
      p.part_out[((int64_t(s) * p.B + b) * p.Hq + hq0 + g) * D + d] = val;
    }
  }
  for (int g = tid; g < nh; g += kDecodeThreads) {
    const float lse = (ms[g] + log2f(ls[g])) * kLn2;  // natural log, scale included
    if (p.S == 1) p.lse[b * p.lse_sb + (hq0 + g) * p.lse_sh] = lse;
    else p.part_lse[(int64_t(s) * p.B + b) * p.Hq + hq0 + g] = lse;
  }
}

struct MergeParams {
  const void* part_out;  // [S, B, Hq, D]
  const float* part_lse; // [S, B, Hq]
  void* out;             // [B, Hq, D]
  float* lse;            // [B, Hq]
  int64_t po_s, po_b, po_h;
  int64_t pl_s, pl_b, pl_h;
  int64_t out_b, out_h, lse_b, lse_h;
  int S, B, Hq, D;
};

constexpr int kMergeMaxDimsPerLane = 16;  // D <= 512

// One warp per (b, query head): the log-sum-exp merge of decode.md §5. Splits with lse = -inf are
// skipped (never 0 * stale partial); with no live split out = 0 and lse = -inf.
template <typename TI, typename TO>
__global__ void __launch_bounds__(128) merge_attn_states_kernel(const MergeParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (row >= int64_t(p.B) * p.Hq) return;
  const int b = static_cast<int>(row / p.Hq), h = static_cast<int>(row % p.Hq);
  const float* lse_in = p.part_lse + b * p.pl_b + h * p.pl_h;

  float M = -INFINITY;
  for (int s = lane; s < p.S; s += 32) M = fmaxf(M, lse_in[s * p.pl_s]);
  M = warp_max(M);
  TO* out = static_cast<TO*>(p.out) + b * p.out_b + h * p.out_h;
  if (M == -INFINITY) {  // every split empty (seq_len 0): exp(-inf - -inf) would be NaN
    for (int d = lane; d < p.D; d += 32) out[d] = from_float<TO>(0.f);
    if (lane == 0) p.lse[b * p.lse_b + h * p.lse_h] = -INFINITY;
    return;
  }
  float acc[kMergeMaxDimsPerLane];
#pragma unroll
  for (int j = 0; j < kMergeMaxDimsPerLane; ++j) acc[j] = 0.f;
  float wsum = 0.f;
  const TI* po = static_cast<const TI*>(p.part_out) + b * p.po_b + h * p.po_h;
  for (int s = 0; s < p.S; ++s) {
    const float l = lse_in[s * p.pl_s];  // the same address for every lane: one broadcast
    if (l == -INFINITY) continue;        // warp-uniform
    const float w = expf(l - M);
    wsum += w;
    const TI* ps = po + s * p.po_s;
#pragma unroll
    for (int j = 0; j < kMergeMaxDimsPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < p.D) acc[j] = fmaf(w, to_float<TI>(ps[d]), acc[j]);
    }
  }
  const float inv = 1.f / wsum;
#pragma unroll
  for (int j = 0; j < kMergeMaxDimsPerLane; ++j) {
    const int d = lane + 32 * j;
    if (d < p.D) out[d] = from_float<TO>(acc[j] * inv);
  }
  if (lane == 0) p.lse[b * p.lse_b + h * p.lse_h] = M + logf(wsum);
}

}  // namespace aura
