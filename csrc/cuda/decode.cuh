// Split-K flash decoding kernels (docs/decode.md): one query token per sequence against a dense
// KV cache, contiguous [B, Hkv, T_cap, D] or paged [num_blocks, page_size, Hkv, D].
//
// Grid (S, Hkv * head_tiles, B); 256 threads (fp16/bf16) or 128 (fp32). A CTA owns (split s, KV head, sequence b) and the
// query heads of that KV head's group (all G of them unless G is too large for shared memory, then
// a tile of them), so each K/V byte of a split crosses HBM once whatever the GQA ratio (§3).
// Per stage of TS tokens: cp.async K and V rows HBM -> shared memory one stage ahead (double
// buffer), QK, an online softmax per head in base 2, PV. fp16/bf16 caches take the tensor-core
// kernel (mma.m16n8k16, the group's heads as the 16 rows); fp32 caches the CUDA-core kernel,
// which keeps exact fp32 products.
// The split rule runs on the device from seq_lens (the host only fixes S from static values),
// matching torch_aura/reference/decode.py's split_chunk bit for bit.
#pragma once

#include "common.cuh"

namespace aura {

// Threads per CTA. Tensor-core kernel: 8 warps (at batch 1 an SM holds one CTA, and with 4 warps
// the B=1 profile was issue-latency bound); CUDA-core fp32 kernel: 4 warps (tuned there, and it
// spills registers at 8).
constexpr int kMmaThreads = 256;
constexpr int kMmaWarps = kMmaThreads / 32;
constexpr int kSimtThreads = 128;
constexpr int kMinChunk = 256;          // decode.md §4: a split below this costs more than it saves
constexpr int kContiguousTile = 64;     // split granularity of the contiguous layout (reference too)
constexpr double kLog2e = 1.4426950408889634;  // host-side: the scale is formed in double
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
  int D_runtime;       // head dim (also a template parameter of the kernels)
  float scale_log2;    // softmax scale * log2(e)
};

constexpr int kMmaHeads = 16;  // query heads per tensor-core tile (the m of m16n8k16)

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

template <typename T, int D>
constexpr size_t decode_mma_smem_bytes() {  // tensor-core kernel: K/V stages, q, p, logits, m/l/alpha
  constexpr int TS = decode_stage_tokens<T, D>();
  constexpr int KP = TS / 8 < kMmaWarps ? kMmaWarps / (TS / 8) : 1;  // partial-logit slices (see the kernel)
  return decode_kv_smem_bytes<T, D>() + sizeof(T) * kMmaHeads * ((D + 8) + (TS + 8)) +
         sizeof(float) * kMmaHeads * (KP * TS + 3);
}

// The per-sequence split rule (reference: split_chunk): chunk = round_up(max(256, ceil(T/S)), tile).
__device__ __forceinline__ void split_rule(int T, int S, int tile, int& chunk, int& live_splits) {
  const int per_split = max(kMinChunk, ceil_div(T, S));
  chunk = ceil_div(per_split, tile) * tile;
  live_splits = ceil_div(T, chunk);
}

// What one CTA owns: split s of sequence b, KV head kvh, query heads [hq0, hq0 + nh), and the
// live token range [start, end) of that split.
struct SplitWork {
  int s, b, kvh, nh, hq0, start, end;
};

// Common prologue of both split kernels. Returns false for an empty split after writing what an
// empty split owes: with S > 1, lse = -inf and no partial (the merge skips it; a stale partial may
// hold NaN); with S == 1 nothing merges, so out = 0 and lse = -inf are final.
template <typename T>
__device__ __forceinline__ bool plan_split(const DecodeParams& p, SplitWork& w) {
  w.s = blockIdx.x;
  w.kvh = blockIdx.y / p.head_tiles;
  const int g0 = (blockIdx.y % p.head_tiles) * p.heads_per_cta;
  w.nh = min(p.heads_per_cta, p.G - g0);
  w.hq0 = w.kvh * p.G + g0;
  w.b = blockIdx.z;
  // Clamped, so a bad seq_len can only give a wrong answer, never an out-of-bounds read.
  const int T_b = min(max(p.seq_lens[w.b], 0), p.capacity);
  int chunk, live_splits;
  split_rule(T_b, p.S, p.block_table != nullptr ? p.page_size : kContiguousTile, chunk, live_splits);
  w.start = w.s * chunk;
  w.end = min(w.start + chunk, T_b);
  if (w.s < live_splits && w.nh > 0) return true;
  for (int i = threadIdx.x; i < w.nh * p.D_runtime; i += blockDim.x) {
    if (p.S == 1)
      static_cast<T*>(p.out)[w.b * p.out_sb + (w.hq0 + i / p.D_runtime) * p.out_sh + i % p.D_runtime] = from_float<T>(0.f);
  }
  for (int g = threadIdx.x; g < w.nh; g += blockDim.x) {
    if (p.S == 1) p.lse[w.b * p.lse_sb + (w.hq0 + g) * p.lse_sh] = -INFINITY;
    else p.part_lse[(int64_t(w.s) * p.B + w.b) * p.Hq + w.hq0 + g] = -INFINITY;
  }
  return false;
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

// Online-softmax update of one stage for head rows g < nh (one warp per row), log2 units. The
// stage has >= 1 valid token, so m_new is finite and exp2(m_old - m_new) is 0, not NaN, on the
// first stage (m_old = -inf). Writes p (as P_T) and the row's running max, sum and rescale.
// With KP > 1 the logits arrive as KP partial sums over slices of D, KP_STRIDE floats apart.
template <int TS, typename P_T, int THREADS, int KP = 1, int KP_STRIDE = 0>
__device__ __forceinline__ void softmax_stage(const float* s_rows, P_T* p_rows, int p_stride, float* ms, float* ls,
                                              float* as, int nh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  auto logit = [&](int g, int r) {
    float x = s_rows[g * TS + r];
#pragma unroll
    for (int kp = 1; kp < KP; ++kp) x += s_rows[kp * KP_STRIDE + g * TS + r];  // -inf + -inf = -inf
    return x;
  };
  for (int g = warp; g < nh; g += THREADS / 32) {
    float mx = -INFINITY;
    for (int r = lane; r < TS; r += 32) mx = fmaxf(mx, logit(g, r));
    mx = warp_max(mx);
    const float m_old = ms[g];
    const float m_new = fmaxf(m_old, mx);
    float sum = 0.f;
    for (int r = lane; r < TS; r += 32) {
      const float x = logit(g, r);
      const float pr = x == -INFINITY ? 0.f : exp2f(x - m_new);
      p_rows[g * p_stride + r] = from_float<P_T>(pr);
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

// Epilogue: a normalised value of head row g, to out (S == 1) or to the fp32 partial (S > 1).
template <typename T>
__device__ __forceinline__ void store_value(const DecodeParams& p, const SplitWork& w, int g, int d, float val) {
  if (p.S == 1) static_cast<T*>(p.out)[w.b * p.out_sb + (w.hq0 + g) * p.out_sh + d] = from_float<T>(val);
  else p.part_out[((int64_t(w.s) * p.B + w.b) * p.Hq + w.hq0 + g) * p.D_runtime + d] = val;
}

template <int THREADS>
__device__ __forceinline__ void store_lse(const DecodeParams& p, const SplitWork& w, const float* ms, const float* ls) {
  for (int g = threadIdx.x; g < w.nh; g += THREADS) {
    const float lse = (ms[g] + log2f(ls[g])) * kLn2;  // natural log, scale included; l >= 1
    if (p.S == 1) p.lse[w.b * p.lse_sb + (w.hq0 + g) * p.lse_sh] = lse;
    else p.part_lse[(int64_t(w.s) * p.B + w.b) * p.Hq + w.hq0 + g] = lse;
  }
}

// ------------------------------------------------------------------------ CUDA-core kernel (fp32)
// Exact fp32 math for fp32 caches (tensor cores would round K and V to tf32). Per stage:
//   QK: one thread per (head, token), the full dot product from shared memory (rows padded by 16
//       bytes: the 8 lanes of a 16-byte access phase hit disjoint banks), VEC partial sums;
//   PV: one thread per (head, 4 dims), output accumulators in shared memory so any G fits.
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
    softmax_stage<TS, float, kSimtThreads>(ss, ss, TS, ms, ls, as, nh);  // p overwrites the logits in place
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

// --------------------------------------------------------------- tensor-core kernel (fp16, bf16)
// The group's query heads are the 16 rows of an mma.m16n8k16 tile (rows >= nh are zero), so QK of
// a stage is S[16 x TS] = Q[16 x D] K^T and PV is O[16 x D] += P[16 x TS] V, fp32 accumulation.
// K rows are exactly the "col" B operand of QK (ldmatrix), V is read transposed (ldmatrix.trans).
// q stays in the input dtype (exact) and the softmax scale multiplies the fp32 logits; P is
// rounded to the input dtype for the PV product, as FlashAttention does; l sums fp32 p.
// O lives in registers: warp w owns the 8-column tiles w, w+8, ... of D.
template <typename T, int D>
__global__ void __launch_bounds__(kMmaThreads) flash_decode_split_mma_kernel(const DecodeParams p) {
  constexpr int TS = decode_stage_tokens<T, D>();
  constexpr int ROW = decode_row_elems<T, D>();
  constexpr int M = kMmaHeads;
  constexpr int QROW = D + 8;   // padded rows: ldmatrix's 8 row addresses hit disjoint banks
  constexpr int PROW = TS + 8;
  constexpr int NT = D / 8;     // 8-column tiles of the output
  constexpr int NT_W = (NT + kMmaWarps - 1) / kMmaWarps;  // output tiles per warp
  static_assert(TS % 16 == 0 && D % 16 == 0, "tile shapes");
  // QK work split: the warps over TS/8 token tiles; with fewer tiles than warps, D is cut into KP
  // slices (KP * tiles = warps) and the softmax adds the partial logits.
  constexpr int QK_TILES_PER_ROUND = TS / 8 < kMmaWarps ? TS / 8 : kMmaWarps;
  constexpr int KP = kMmaWarps / QK_TILES_PER_ROUND;
  static_assert((D / 16) % KP == 0, "D splits evenly into KP slices of 16-wide k-steps");
  constexpr int KSTEPS_PER_PART = D / 16 / KP;
  constexpr int KACC = KSTEPS_PER_PART < 4 ? KSTEPS_PER_PART : 4;

  SplitWork w;
  if (!plan_split<T>(p, w)) return;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* kbuf = reinterpret_cast<T*>(smem_raw);  // [2][TS][ROW]
  T* vbuf = kbuf + 2 * TS * ROW;             // [2][TS][ROW]
  T* qs = vbuf + 2 * TS * ROW;               // [M][QROW] raw q, rows >= nh zero
  T* ps = qs + M * QROW;                     // [M][PROW] p in the input dtype
  float* ss = reinterpret_cast<float*>(ps + M * PROW);  // [KP][M][TS] scaled (partial) logits
  float* ms = ss + KP * M * TS;
  float* ls = ms + M;
  float* as = ls + M;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nh = w.nh;
  const int n_stages = ceil_div(w.end - w.start, TS);

  issue_kv_stage<T, D, TS, ROW, kMmaThreads>(p, w, kbuf, vbuf, 0, 0);
  const T* qg = static_cast<const T*>(p.q);
  for (int i = tid; i < M * D; i += kMmaThreads) {
    const int g = i / D, d = i % D;
    qs[g * QROW + d] = g < nh ? qg[w.b * p.q_sb + (w.hq0 + g) * p.q_sh + d] : from_float<T>(0.f);
  }
  for (int i = tid; i < M * PROW; i += kMmaThreads) ps[i] = from_float<T>(0.f);  // rows >= nh stay 0
  for (int g = tid; g < M; g += kMmaThreads) ms[g] = -INFINITY, ls[g] = 0.f, as[g] = 0.f;

  float o[NT_W][4];
#pragma unroll
  for (int i = 0; i < NT_W; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  // ldmatrix row addresses: A tiles (rows = heads) and B tiles (rows = tokens).
  const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_col = 8 * (lane >> 4);
  const int b_row = lane & 7, b_col = 8 * ((lane >> 3) & 1);

  for (int st = 0; st < n_stages; ++st) {
    next_stage<T, D, TS, ROW, kMmaThreads>(p, w, kbuf, vbuf, st, n_stages);
    const T* kt = kbuf + (st & 1) * TS * ROW;
    const T* vt = vbuf + (st & 1) * TS * ROW;
    const int nvalid = min(TS, w.end - (w.start + st * TS));

    // QK: warp w computes the 8-token tiles w, w+8, ... of S over its slice of D (the whole of D
    // unless the stage has fewer tiles than warps, then the idle warps take slices: KP partials).
    // KACC independent accumulators keep the chain of dependent MMAs short.
    for (int j = warp % QK_TILES_PER_ROUND; j < TS / 8; j += QK_TILES_PER_ROUND) {
      const int kp = warp / QK_TILES_PER_ROUND;
      float c[KACC][4] = {};
#pragma unroll
      for (int ks = 0; ks < KSTEPS_PER_PART; ++ks) {
        const int k0 = (kp * KSTEPS_PER_PART + ks) * 16;
        uint32_t a[4], b[2];
        ldmatrix_x4(a, qs + a_row * QROW + k0 + a_col);
        ldmatrix_x2(b, kt + (j * 8 + b_row) * ROW + k0 + b_col);
        mma_16816<T>(c[ks % KACC], a, b[0], b[1]);
      }
      const int r0 = lane >> 2, col = j * 8 + 2 * (lane & 3);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < KACC; ++i) sum += c[i][e];
        const int r = r0 + 8 * (e >> 1), t = col + (e & 1);
        ss[kp * M * TS + r * TS + t] = t < nvalid ? sum * p.scale_log2 : -INFINITY;
      }
    }
    __syncthreads();
    softmax_stage<TS, T, kMmaThreads, KP, M * TS>(ss, ps, PROW, ms, ls, as, nh);
    __syncthreads();

    // PV: rescale this warp's output rows, then accumulate P V over the stage's 16-token steps.
    const float a_lo = as[lane >> 2], a_hi = as[(lane >> 2) + 8];
#pragma unroll
    for (int i = 0; i < NT_W; ++i) {
      o[i][0] *= a_lo, o[i][1] *= a_lo, o[i][2] *= a_hi, o[i][3] *= a_hi;
    }
#pragma unroll
    for (int k0 = 0; k0 < TS; k0 += 16) {
      uint32_t a[4];
      ldmatrix_x4(a, ps + a_row * PROW + k0 + a_col);
#pragma unroll
      for (int i = 0; i < NT_W; ++i) {
        const int nt = warp + kMmaWarps * i;
        if (nt < NT) {
          uint32_t b[2];
          ldmatrix_x2_trans(b, vt + (k0 + b_row + b_col) * ROW + nt * 8);
          mma_16816<T>(o[i], a, b[0], b[1]);
        }
      }
    }
    __syncthreads();
  }
  const int r0 = lane >> 2;
#pragma unroll
  for (int i = 0; i < NT_W; ++i) {
    const int nt = warp + kMmaWarps * i;
    if (nt >= NT) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int g = r0 + 8 * (e >> 1), d = nt * 8 + 2 * (lane & 3) + (e & 1);
      if (g < nh) store_value<T>(p, w, g, d, o[i][e] / ls[g]);
    }
  }
  store_lse<kMmaThreads>(p, w, ms, ls);
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

constexpr int kMergeMaxChunks = 4;  // 4 dims per lane per chunk, 128 dims per chunk: D <= 512

// One warp per (b, query head): the log-sum-exp merge of decode.md §5. Lane l owns dims
// 4l..4l+3 of every 128-wide chunk. The split weights are computed once (lanes over splits) and
// broadcast; the loop over splits has no data-dependent branch, so the unrolled loads of several
// splits are in flight together: a split with lse = -inf gets weight 0 and its (possibly stale,
// NaN) partial is discarded by a select, never multiplied. With no live split out = 0, lse = -inf.
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
  float acc[kMergeMaxChunks][4];
#pragma unroll
  for (int c = 0; c < kMergeMaxChunks; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
  float wsum = 0.f;
  const TI* po = static_cast<const TI*>(p.part_out) + b * p.po_b + h * p.po_h;
  __shared__ float wsplit[4][32];  // this warp's split weights, 32 at a time
  float* ws = wsplit[threadIdx.x >> 5];
  for (int s0 = 0; s0 < p.S; s0 += 32) {
    const float l = s0 + lane < p.S ? lse_in[(s0 + lane) * p.pl_s] : -INFINITY;
    const float w_lane = l == -INFINITY ? 0.f : expf(l - M);
    wsum += w_lane;
    // The weights go through shared memory, not a shuffle in the loop: LLVM does not unroll a loop
    // holding a convergent shuffle when it needs a remainder, and without unrolling every split
    // cost one full memory latency (ncu at B=1: 15 us for 29 splits).
    __syncwarp();
    ws[lane] = w_lane;
    __syncwarp();
    const int n = min(32, p.S - s0);
#pragma unroll 4
    for (int i = 0; i < n; ++i) {
      const float w = ws[i];  // one address for the whole warp: a broadcast
      const TI* part = po + int64_t(s0 + i) * p.po_s;
#pragma unroll
      for (int c = 0; c < kMergeMaxChunks; ++c) {
        const int d = 128 * c + 4 * lane;
        if (d < p.D) {  // D is a multiple of 4 (checked on the host)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float v = to_float<TI>(part[d + e]);
            acc[c][e] = w > 0.f ? fmaf(w, v, acc[c][e]) : acc[c][e];
          }
        }
      }
    }
  }
  wsum = warp_sum(wsum);
  const float inv = 1.f / wsum;
#pragma unroll
  for (int c = 0; c < kMergeMaxChunks; ++c) {
    const int d = 128 * c + 4 * lane;
    if (d < p.D) {
#pragma unroll
      for (int e = 0; e < 4; ++e) out[d + e] = from_float<TO>(acc[c][e] * inv);
    }
  }
  if (lane == 0) p.lse[b * p.lse_b + h * p.lse_h] = M + logf(wsum);
}

}  // namespace aura
