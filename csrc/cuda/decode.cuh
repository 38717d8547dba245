// Split-K flash decoding kernels (docs/decode.md): one query token per sequence against a dense
// KV cache, contiguous [B, Hkv, T_cap, D] or paged [num_blocks, page_size, Hkv, D].
//
// A CTA owns (split, KV head, sequence) and the group's query heads, so each K/V byte of a split
// crosses HBM once for the group (§3). fp16/bf16 take the tensor-core kernel, fp32 the CUDA-core
// one (exact fp32 products). The split rule runs on the device from seq_lens, bit for bit the
// reference's split_chunk, so the host fixes S from static values only (§4, §8).
#pragma once

#include "common.cuh"

#include <cudaTypedefs.h>  // CUtensorMap, PFN_cuTensorMapEncodeTiled (driver entry point: no libcuda link)

namespace aura {

// Threads per CTA of the CUDA-core fp32 kernel: 4 warps (tuned there, and it spills registers at 8).
constexpr int kSimtThreads = 128;
#ifndef AURA_DECODE_SMEM_BUDGET
#define AURA_DECODE_SMEM_BUDGET (110 * 1024)  // (experiments override it: tools/decode_timeline.cu)
#endif
constexpr size_t kSmemBudget = AURA_DECODE_SMEM_BUDGET;  // per CTA: two CTAs share a Hopper SM's 228 KB (CTAS_PER_SM = 2)
// The smallest split, one 16-token step per warp: larger ones left short contexts' splits idle (decode.md §13).
constexpr int kMinChunk = 64;
constexpr int kContiguousTile = 64;     // split granularity of the contiguous layout (reference too)
constexpr double kLog2e = 1.4426950408889634;  // host-side: the scale is formed in double
constexpr float kLn2 = 0.6931471805599453f;

// The merge kernel's CTA (merge_attn_states_kernel; the split plan counts its round trips).
constexpr int kMergeChunk = 128;    // dims per merge CTA: 4 per lane
constexpr int kMergeThreads = 128;
constexpr int kMergeWarps = kMergeThreads / 32;
constexpr int kMergeUnroll = 8;     // live splits per warp whose loads are in flight together

#ifndef AURA_DECODE_MAX_STAGES
#define AURA_DECODE_MAX_STAGES 4  // (experiments override it: tools/decode_timeline.cu)
#endif

struct DecodeParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;          // [B, Hq, D] q's dtype, written when S == 1
  float* lse;         // [B, Hq] fp32, written when S == 1
  float* part_out;    // fp32 partial rows of D, written when S != 1: [S, B, Hq] rows, or [items, heads_per_cta] (balanced)
  float* part_lse;    // fp32, one per partial row
  const int* seq_lens;
  const int* block_table;  // nullptr: contiguous layout
  int* plan;               // balanced schedule (S == 0): decode_balance_plan_kernel's work list; nullptr: static
  int64_t q_sb, q_sh;
  int64_t k_s0, k_s1, k_s2;  // contiguous: (b, h, t); paged: (block, row, h)
  int64_t v_s0, v_s1, v_s2;
  int64_t out_sb, out_sh, lse_sb, lse_sh;
  int64_t bt_sb;
  int B, Hq, Hkv, G, S;  // S: splits per sequence of the static schedule; 0: the balanced schedule
  int heads_per_cta, head_tiles;
  int capacity;        // T_cap, or max_blocks * page_size
  int page_size;       // paged only
  int num_blocks;      // paged only
  int D_runtime;       // head dim (also a template parameter of the kernels)
  float scale_log2;    // softmax scale * log2(e)
  int q_vec16;         // q's base and row strides allow 16-byte copies (the tensor-core kernel's q path)
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
constexpr size_t decode_head_smem_bytes() {  // CUDA-core kernel: q, o (D each), p (TS), m, l, alpha
  return sizeof(float) * (2 * D + decode_stage_tokens<T, D>() + 4);
}

// Whether the tile copies (below, TileMaps) can serve a layout: whole 64-dim boxes, and 16-token
// steps that never cross a page.
inline bool tile_copies_fit(int head_dim, int page_size) {  // page_size 0: contiguous
  return head_dim % 64 == 0 && page_size % 16 == 0;
}

// The per-sequence split rule (reference: split_chunk): chunk = round_up(max(kMinChunk, ceil(T/S)), tile),
// run by every CTA on its seq_len and by the host plan on the capacity.
__host__ __device__ __forceinline__ void split_rule(int T, int S, int tile, int& chunk, int& live_splits) {
  const int per_split = ceil_div(T, S) > kMinChunk ? ceil_div(T, S) : kMinChunk;
  chunk = ceil_div(per_split, tile) * tile;
  live_splits = ceil_div(T, chunk);
}

// The automatic split count of the static schedule: the reference's auto_splits (its docstring states
// the rule) with plan_ctas_per_sm and plan_split_floor, step for step (decode.md §4).
// d512_dims: the launcher runs flash_decode_split_dims_kernel where D = 512 tiles fit.
inline int decode_auto_splits(int64_t batch, int64_t kv_heads, int sms, int head_dim, int page_size, int64_t capacity,
                              int tile, bool d512_dims = true) {  // page_size 0: contiguous
  const bool tiles = tile_copies_fit(head_dim, page_size);
  const bool dims_cta = head_dim == 512 && tiles && d512_dims, one_warp_cta = head_dim == 512 && !dims_cta;
  const int64_t slots = int64_t(sms) * ((page_size > 0 && !tiles) || one_warp_cta ? 2 : 1), work = batch * kv_heads;
  if (work == 0 || work >= slots) return 1;
  int64_t s = slots / work;
  if (double(work * s) < 0.8 * double(slots)) ++s;
  const int64_t min_chunk = (kMinChunk + tile - 1) / tile * tile;
  s = std::min<int64_t>({s, 128, std::max<int64_t>(1, (capacity + min_chunk - 1) / min_chunk)});
  int chunk = 0, live = 0;  // a full-capacity sequence under n splits: tokens per split, splits it fills
  auto fill = [&](int64_t n) {
    split_rule(int(capacity), int(n), tile, chunk, live);
    return chunk;
  };
  constexpr int64_t kOneTrip = kMergeWarps * kMergeUnroll;
  const int floor_tokens = dims_cta ? 32 : 128;
  while (s > kOneTrip && fill(s) < floor_tokens) s = std::max<int64_t>(kOneTrip, (s + 1) / 2);
  if (work * 16 <= slots && s < kOneTrip && fill(kOneTrip) >= 128 && chunk <= 256) s = kOneTrip;
  fill(s);
  return std::max(1, live);
}

// What one CTA owns: split s of sequence b, KV head kvh, query heads [hq0, hq0 + nh), and the
// live token range [start, end) of that split; part_row is the partial row of head hq0 (S != 1).
struct SplitWork {
  int s, b, kvh, nh, hq0, start, end;
  int64_t part_row;
};

// Common prologue of both split kernels. Returns false for an empty split after writing what an
// empty split owes: with S > 1, lse = -inf and no partial (the merge skips it; a stale partial may
// hold NaN); with S == 1 nothing merges, so out = 0 and lse = -inf are final.
// In two parts: the CTA's heads (no memory reads, so q can be requested before seq_lens arrives),
// then its tokens.
__device__ __forceinline__ void plan_split_heads(const DecodeParams& p, SplitWork& w) {
  w.s = blockIdx.x;
  w.kvh = blockIdx.y / p.head_tiles;
  const int g0 = (blockIdx.y % p.head_tiles) * p.heads_per_cta;
  w.nh = min(p.heads_per_cta, p.G - g0);
  w.hq0 = w.kvh * p.G + g0;
  w.b = blockIdx.z;
  w.part_row = (int64_t(w.s) * p.B + w.b) * p.Hq + w.hq0;
}
template <typename T>
__device__ __forceinline__ bool plan_split_tokens(const DecodeParams& p, SplitWork& w) {
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
    else p.part_lse[w.part_row + g] = -INFINITY;
  }
  return false;
}
template <typename T>
__device__ __forceinline__ bool plan_split(const DecodeParams& p, SplitWork& w) {
  plan_split_heads(p, w);
  return plan_split_tokens<T>(p, w);
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

// Online-softmax update of one stage for head rows g < nh (one warp per row), log2 units; the
// CUDA-core kernel's (the tensor-core kernel keeps its softmax in registers). The stage has >= 1
// valid token, so m_new is finite and exp2(m_old - m_new) is 0, not NaN, on the first stage
// (m_old = -inf). Writes p in place of the logits and the row's running max, sum and rescale.
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

// Epilogue: a normalised value of head row g, to out (S == 1) or to the fp32 partial (S > 1).
template <typename T>
__device__ __forceinline__ void store_value(const DecodeParams& p, const SplitWork& w, int g, int d, float val) {
  if (p.S == 1) static_cast<T*>(p.out)[w.b * p.out_sb + (w.hq0 + g) * p.out_sh + d] = from_float<T>(val);
  else p.part_out[(w.part_row + g) * p.D_runtime + d] = val;
}

// The lse of head row g from its running max (log2 units) and sum, to lse (S == 1) or the partial's.
__device__ __forceinline__ void store_head_lse(const DecodeParams& p, const SplitWork& w, int g, float M_log2, float L) {
  const float lse = (M_log2 + log2f(L)) * kLn2;  // natural log, scale included; l >= 1
  if (p.S == 1) p.lse[w.b * p.lse_sb + (w.hq0 + g) * p.lse_sh] = lse;
  else p.part_lse[w.part_row + g] = lse;
}

template <int THREADS>
__device__ __forceinline__ void store_lse(const DecodeParams& p, const SplitWork& w, const float* ms, const float* ls) {
  for (int g = threadIdx.x; g < w.nh; g += THREADS) store_head_lse(p, w, g, ms[g], ls[g]);
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

// --------------------------------------------------------------- tensor-core kernel (fp16, bf16)
// Warp-split design (decode.md §3): warps own interleaved 16-token steps with private rings and keep
// their softmax state in registers, so the main loop has no CTA barrier; they merge once at the end.
//   QK:  S^T [16 tok x 8 heads]  = K [16 x D] . Q^T        (K from ldmatrix)
//   PV:  O^T [D x 8 heads]      += V^T [D x 16 tok] . P^T   (P transposed in registers by movmatrix)
// Heads on the MMA's n (8 wide), not m (16): half the MMAs of a GQA-4/8 group, and P stays in registers.

// The end-of-split merge: warp w's output for head g, dim d at [w][g][kMergeRow] + merge_col(g, d).
// A fragment store (fixed m-tile, head tile, register) has its 32 lanes on heads 2 (lane % 4) + e
// and dims lane / 4 + const; XORing bits 3-4 of d with (g / 2) % 4 gives those 32 lanes 32 banks,
// and 32 consecutive dims of one head (the reduction's reads) stay a permutation of one 32-dim run.
// Rows are D floats when D is a multiple of 32, else 112 for D = 80 (split_merge_conflict_free
// checks every instantiation).
template <int D>
constexpr int kMergeRow = D % 32 == 0 ? D : (D + 31) / 32 * 32 + 16;

// Launch shape per head dim: warps per CTA and ring depth (steps in flight per warp), chosen so
// that ring + q fit kSmemBudget (two CTAs per SM, the CTAS_PER_SM of the split plan).
template <typename T, int D>
struct WarpSplitShape {
  static constexpr int kRow = D + 16 / static_cast<int>(sizeof(T));  // +16 B: ldmatrix rows hit disjoint banks
  static constexpr int kMaxHeads = D <= 128 ? 16 : 8;                 // heads one CTA takes (registers)
  static constexpr int kWarps = D <= 192 ? 4 : D <= 256 ? 3 : 1;
  static constexpr size_t kStepBytes = size_t(2) * 16 * kRow * sizeof(T);  // K and V of 16 tokens
  static constexpr size_t kQBytes = size_t(kMaxHeads) * kRow * sizeof(T);
  static constexpr size_t kBarBytes = 4 * AURA_DECODE_MAX_STAGES * sizeof(uint64_t);  // bulk copies: an mbarrier per slot and warp
  static constexpr int kStages =
      std::min<int>(AURA_DECODE_MAX_STAGES, int((kSmemBudget - kQBytes - kBarBytes) / (kWarps * kStepBytes)));
  static constexpr size_t kSmem = kWarps * kStages * kStepBytes + kQBytes + kBarBytes;
  static_assert(kWarps * kStages * sizeof(uint64_t) <= kBarBytes, "barrier area");
  static_assert(kStages >= 2, "a ring needs two steps to overlap loads with math");
  // the end-of-split merge of the warps' states reuses the ring: [W][16][merge row] o, [W][16] m, l
  // and weights (a one-warp CTA has nothing to merge; it stages only its partial there)
  static_assert(kWarps == 1 || size_t(kWarps) * 16 * (kMergeRow<D> + 3) * sizeof(float) <=
                                     kWarps * kStages * kStepBytes,
                "merge area");
};

__host__ __device__ constexpr int merge_col(int g, int d) { return d ^ (((g >> 1) & 3) << 3); }

// A partial staged in shared memory as [heads][D], dims swizzled by merge_col, out as 16-byte rows
// (merge_col keeps 4 aligned dims together); the calling threads are first, first + step, ...
template <int D>
__device__ __forceinline__ void store_staged_partial(const DecodeParams& p, const SplitWork& w, const float* ow,
                                                     int first, int step) {
  float* po = p.part_out + w.part_row * D;  // nh rows of D
  for (int idx = 4 * first; idx < w.nh * D; idx += 4 * step) {
    const int g = idx / D, d = idx % D;
    *reinterpret_cast<float4*>(po + idx) = *reinterpret_cast<const float4*>(ow + g * D + merge_col(g, d));
  }
}
template <int D, int NHT>
constexpr bool split_merge_conflict_free() {
  constexpr int R = kMergeRow<D>;
  for (int mt = 0; mt < D / 16; ++mt)
    for (int n = 0; n < NHT; ++n)
      for (int c = 0; c < 4; ++c)
        if (!distinct_banks(32, [&](int lane) {
              const int g = n * 8 + 2 * (lane & 3) + (c & 1), d = mt * 16 + (lane >> 2) + 8 * (c >> 1);
              return g * R + merge_col(g, d);
            }))
          return false;
  constexpr int N = 8 * NHT * D;  // reads: thread idx -> (g, d) = (idx / D, idx % D)
  for (int idx = 0; idx < N; ++idx)
    if (merge_col(idx / D, idx % D) >= R) return false;
  for (int i0 = 0; i0 < N; i0 += 32)
    if (!distinct_banks(i0 + 32 <= N ? 32 : N - i0, [&](int i) {
          const int g = (i0 + i) / D;
          return g * R + merge_col(g, (i0 + i) % D);
        }))
      return false;
  return true;
}

// Tile copies (D a multiple of 64; contiguous caches, or paged ones whose pages hold a multiple of 16
// tokens, so a 16-token step never crosses a page): one TMA box of 16 tokens x 64 dims per copy,
// landed with the 128-byte swizzle: [D / 64][16 rows][64] elements per K or V tile, the 16-byte
// unit u of row r stored at unit u ^ (r % 8), so the 8 rows an ldmatrix reads hit 8 distinct bank
// groups without padding. Two copies per 16-token step at D = 64, four at 128, against 32 row copies.
struct TileMaps {  // (CUtensorMap carries its own 64-byte alignment)
  CUtensorMap k, v;
};
__host__ __device__ constexpr int tile_off(int r, int c) {  // element offset of (row r, dim c) in a tile
  return (c >> 6) * (16 * 64) + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7);
}

// Encodes the K and V maps of a 16-bit cache as 4-D tensors with 16-token x 64-dim boxes: contiguous
// [B, Hkv, T_cap, D] as (D, T_cap, Hkv, B), paged [num_blocks, page_size, Hkv, D] as (D, Hkv,
// page_size, num_blocks). False when the layout does not qualify (D not a multiple of 64, pages not
// a multiple of 16 tokens, a stride that is not a multiple of 16 bytes, or the driver refuses it).
inline bool make_tile_maps(const DecodeParams& p, bool bf16, int D, TileMaps& maps) {
  if (!tile_copies_fit(D, p.block_table != nullptr ? p.page_size : 0)) return false;
  const bool paged = p.block_table != nullptr;
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return false;
  auto one = [&](CUtensorMap& m, const void* base, int64_t s0, int64_t s1, int64_t s2) {
    for (int64_t st : {s0, s1, s2})
      if (st <= 0 || (st * 2) % 16 != 0 || st * 2 >= (int64_t(1) << 40)) return false;
    const cuuint64_t dims_c[4] = {cuuint64_t(D), cuuint64_t(p.capacity), cuuint64_t(p.Hkv), cuuint64_t(p.B)};
    const cuuint64_t dims_p[4] = {cuuint64_t(D), cuuint64_t(p.Hkv), cuuint64_t(p.page_size), cuuint64_t(p.num_blocks)};
    // byte strides of dims 1-3: contiguous (t, h, b) = (s2, s1, s0); paged (h, row, block) = (s2, s1, s0)
    const cuuint64_t strides[3] = {cuuint64_t(s2 * 2), cuuint64_t(s1 * 2), cuuint64_t(s0 * 2)};
    const cuuint32_t box_c[4] = {64, 16, 1, 1}, box_p[4] = {64, 1, 16, 1}, unit[4] = {1, 1, 1, 1};
    const cuuint64_t* dims = paged ? dims_p : dims_c;
    const cuuint32_t* box = paged ? box_p : box_c;
    return encode(&m, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                  const_cast<void*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;  // rows past T_cap land as zeros
  };
  return p.capacity > 0 && (!paged || p.num_blocks > 0) && one(maps.k, p.k, p.k_s0, p.k_s1, p.k_s2) &&
         one(maps.v, p.v, p.v_s0, p.v_s1, p.v_s2);
}

// Shared memory of the tensor-core kernels: [W][NS][K, V][16][ROW] rings, [kMaxHeads][ROW] q, and
// [W][NS] bulk-copy barriers (one per ring slot of each warp).
template <typename T, int D>
struct MmaSmem {
  using Shape = WarpSplitShape<T, D>;
  static constexpr int kTile = 16 * Shape::kRow;  // elements of one 16-token K or V tile
  T* ring;
  T* tiles;  // the tile-copy ring, [W][NS][K, V][16 * D] swizzled, 1024-byte aligned inside `ring`'s bytes
  T* qs;
  uint64_t* bars;
  __device__ explicit MmaSmem(unsigned char* raw)
      : ring(reinterpret_cast<T*>(raw)),
        tiles(reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023))),
        qs(ring + Shape::kWarps * Shape::kStages * 2 * kTile),
        bars(reinterpret_cast<uint64_t*>(qs + Shape::kMaxHeads * Shape::kRow)) {}
};

// q of the CTA's heads as one cp.async group, the CTA's first request: issued later, it queues behind
// the whole grid's prefetch (decode.md §13). A q view the 16-byte copies cannot move is copied
// element by element later (run_split_mma).
template <typename T, int D, int NHT, int THREADS = WarpSplitShape<T, D>::kWarps * 32>
__device__ __forceinline__ void stage_q_async(const DecodeParams& p, const SplitWork& w, T* qs) {
  using Shape = WarpSplitShape<T, D>;
  constexpr int ROW = Shape::kRow, CPR = D * int(sizeof(T)) / 16, VEC = 16 / int(sizeof(T));
  if (!p.q_vec16) return;
  const T* qg = static_cast<const T*>(p.q);
  for (int i = threadIdx.x; i < 8 * NHT * CPR; i += THREADS) {
    const int g = i / CPR, c = (i % CPR) * VEC;
    cp_async16(qs + g * ROW + c, g < w.nh ? qg + w.b * p.q_sb + (w.hq0 + g) * p.q_sh + c : qg, g < w.nh);
  }
  cp_async_commit();
}

// q of the CTA's heads element by element, for a q view the 16-byte copies cannot move.
template <typename T, int D, int NHT, int THREADS>
__device__ __forceinline__ void stage_q_elementwise(const DecodeParams& p, const SplitWork& w, T* qs) {
  constexpr int ROW = WarpSplitShape<T, D>::kRow;
  const T* qg = static_cast<const T*>(p.q);
  for (int i = threadIdx.x; i < 8 * NHT * D; i += THREADS) {
    const int g = i / D, d = i % D;
    qs[g * ROW + d] = g < w.nh ? qg[w.b * p.q_sb + (w.hq0 + g) * p.q_sh + d] : from_float<T>(0.f);
  }
}

// Bulk copies complete on one mbarrier per ring slot and warp, initialised once per CTA: phases carry
// over from one split to the next (run_split_mma's `uses`), so a barrier is never re-initialised.
template <typename T, int D, bool BULK>
__device__ __forceinline__ void init_ring_barriers(uint64_t* bars) {
  if constexpr (BULK) {
    constexpr int NS = WarpSplitShape<T, D>::kStages;
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
      for (int j = 0; j < NS; ++j) mbar_init(bars + (threadIdx.x >> 5) * NS + j, 1);
      mbar_init_fence();
    }
    __syncwarp();
  }
}

// One split: tokens [w.start, w.end) (>= 1) of sequence w.b, KV head w.kvh, query heads
// [w.hq0, w.hq0 + w.nh), whose q copies stage_q_async issued. Writes out and lse (S == 1) or the
// heads' partial rows w.part_row + g. `uses`: this warp's ring steps before this split (bulk barrier
// phases); `trigger`: release the programmatic dependent (the merge) at the end of the main loop.
template <typename T, int D, int NHT, bool BULK, bool TILES = false>
__device__ __forceinline__ void run_split_mma(const DecodeParams& p, const SplitWork& w, unsigned char* smem_raw,
                                              int& uses, bool trigger, const TileMaps* maps = nullptr) {
  using Shape = WarpSplitShape<T, D>;
  constexpr int W = Shape::kWarps, NS = Shape::kStages, ROW = Shape::kRow;
  constexpr int KS = D / 16;                          // QK k-steps = PV m-tiles
  constexpr int CPR = D * int(sizeof(T)) / 16;        // 16-byte chunks per row
  constexpr int CPL = 16 * CPR / 32;                  // chunks per lane per 16-row tile
  constexpr int VEC = 16 / int(sizeof(T));            // elements per 16-byte chunk
  constexpr int TILE = MmaSmem<T, D>::kTile;
  constexpr bool kQInRegs = KS * NHT <= 16;           // B fragments of q held for the whole split
  static_assert(D % 16 == 0 && (16 * CPR) % 32 == 0, "tile shapes");
  static_assert(8 * NHT <= Shape::kMaxHeads, "head tile");
  static_assert(!TILES || (BULK && D % 64 == 0 && size_t(W) * NS * 2 * 16 * D * sizeof(T) + 1024 <=
                                                       size_t(W) * NS * 2 * TILE * sizeof(T)),
                "tile copies: whole 64-dim boxes, and the aligned tile ring inside the padded ring's bytes");
  constexpr int STILE = TILES ? 16 * D : TILE;      // elements of one K or V tile in the ring
  // element offset of (token row r, dim c) in a K or V tile
  auto at = [](int r, int c) { return TILES ? tile_off(r, c) : r * ROW + c; };

  const MmaSmem<T, D> sm(smem_raw);
  T* ring = sm.ring;
  T* qs = sm.qs;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nh = w.nh;
  AURA_PHASE(1);
  T* my_ring = (TILES ? sm.tiles : ring) + warp * NS * 2 * STILE;

  // ---- this warp's steps: s = warp, warp + W, ... of the split's ceil(len / 16)
  const int n_steps = ceil_div(w.end - w.start, 16);
  const int my_n = n_steps > warp ? ceil_div(n_steps - warp, W) : 0;
  auto step_t0 = [&](int i) { return w.start + (warp + W * i) * 16; };

  // ---- copies, engine picked on the host (launch_split): TILES (2-D tensor-map boxes); BULK (lane
  // r < 16 brings K row r, lane 16 + r its V row, on the slot's mbarrier: fewest issue instructions
  // for long splits); else cp.async, 16 bytes per instruction at loop-invariant offsets (lower
  // latency for short splits). Rows past the end are zero-filled: P = 0 must meet finite V.
  const bool paged = p.block_table != nullptr;
  const bool linear = !paged || p.page_size % 16 == 0;  // a step's rows are consecutive in memory
  const T* kg = static_cast<const T*>(p.k);
  const T* vg = static_cast<const T*>(p.v);
  const int64_t k_head = paged ? w.kvh * p.k_s2 : w.b * p.k_s0 + w.kvh * p.k_s1;
  const int64_t v_head = paged ? w.kvh * p.v_s2 : w.b * p.v_s0 + w.kvh * p.v_s1;
  const int k_rs = int(paged ? p.k_s1 : p.k_s2), v_rs = int(paged ? p.v_s1 : p.v_s2);  // row strides (host: fit int32)
  // Paged: the page (and row in page) of a step's first row (pages of 16k tokens) or of this lane's
  // row (any page size), resolved one step before its copies: off their issue path.
  const bool per_row = !linear;
  auto locate = [&](int i, int& page, int& row) {
    page = 0, row = 0;
    const int t = step_t0(i) + (per_row ? (lane & 15) : 0);
    if (paged && i < my_n && t < w.end) {
      page = min(max(p.block_table[w.b * p.bt_sb + t / p.page_size], 0), p.num_blocks - 1);  // never outside
      row = t % p.page_size;
    }
  };
  int next_page, next_row;
  locate(0, next_page, next_row);
  uint64_t* bars = sm.bars + warp * NS;  // this warp's, BULK
  const int u0 = uses;  // bulk barriers: step i of this split is the warp's step u0 + i through its ring
  auto slot = [&](int i) { return (u0 + i) % NS; };
  auto issue = [&](int i) {  // step i into ring slot slot(i)
    if (i < my_n) {
      const int t0 = step_t0(i), n_rows = w.end - t0;
      const int page = next_page, row = next_row;
      locate(i + 1, next_page, next_row);
      T* kd = my_ring + slot(i) * 2 * STILE;
      T* vd = kd + STILE;
      if constexpr (TILES) {
        // whole boxes: rows past T_cap land as zeros, rows in [w.end, T_cap) are zeroed in V after
        // they land (the main loop): P = 0 must meet finite V
        fence_proxy_async_shared();
        __syncwarp();
        if (lane == 0) {
          mbar_arrive_expect_tx(bars + slot(i), unsigned(2 * 16 * D * sizeof(T)));
          // box coordinates, innermost first: contiguous (d, t, h, b), paged (d, h, row in page, page)
          const int c1 = paged ? w.kvh : t0, c2 = paged ? row : w.kvh, c3 = paged ? page : w.b;
#pragma unroll
          for (int c = 0; c < D / 64; ++c) {
            tensor_copy_g2s_4d(kd + c * 16 * 64, &maps->k, c * 64, c1, c2, c3, bars + slot(i));
            tensor_copy_g2s_4d(vd + c * 16 * 64, &maps->v, c * 64, c1, c2, c3, bars + slot(i));
          }
        }
      } else if constexpr (BULK) {
        const bool is_v = lane >= 16, ok = (lane & 15) < n_rows;
        const int r = lane & 15;
        // contiguous caches only (the launcher never pairs BULK with a block table)
        const int64_t off = is_v ? int64_t(t0 + r) * p.v_s2 + v_head : int64_t(t0 + r) * p.k_s2 + k_head;
        T* dst = (is_v ? vd : kd) + r * ROW;
        fence_proxy_async_shared();  // this lane's ldmatrix reads of the slot come before the refill
        __syncwarp();
        if (lane == 0) mbar_arrive_expect_tx(bars + slot(i), unsigned(2 * min(16, n_rows) * D * sizeof(T)));
        __syncwarp();  // the expected bytes are posted before any copy can complete
        if (ok) {
          bulk_copy_g2s(dst, (is_v ? vg : kg) + off, unsigned(D * sizeof(T)), bars + slot(i));
        } else {
#pragma unroll
          for (int c = 0; c < CPR; ++c) reinterpret_cast<uint4*>(dst)[c] = make_uint4(0, 0, 0, 0);
        }
      } else if (linear) {
        const T* ks = kg + k_head + (paged ? page * p.k_s0 + row * p.k_s1 : int64_t(t0) * p.k_s2);
        const T* vs = vg + v_head + (paged ? page * p.v_s0 + row * p.v_s1 : int64_t(t0) * p.v_s2);
#pragma unroll
        for (int j = 0; j < CPL; ++j) {
          const int idx = lane + 32 * j, r = idx / CPR, c = (idx % CPR) * VEC;
          const bool ok = r < n_rows;
          cp_async16(kd + r * ROW + c, ok ? ks + r * k_rs + c : kg, ok);
          cp_async16(vd + r * ROW + c, ok ? vs + r * v_rs + c : vg, ok);
        }
      } else {
#pragma unroll
        for (int j = 0; j < CPL; ++j) {
          const int idx = lane + 32 * j, r = idx / CPR, c = (idx % CPR) * VEC;
          const bool ok = r < n_rows;
          const int pg = __shfl_sync(0xffffffffu, page, r), rw = __shfl_sync(0xffffffffu, row, r);
          cp_async16(kd + r * ROW + c, ok ? kg + k_head + pg * p.k_s0 + rw * p.k_s1 + c : kg, ok);
          cp_async16(vd + r * ROW + c, ok ? vg + v_head + pg * p.v_s0 + rw * p.v_s1 + c : vg, ok);
        }
      }
    }
    if constexpr (!BULK) cp_async_commit();  // one group per step (empty past the end)
  };
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) issue(i);  // the ring fills while q is staged

  if (p.q_vec16) {  // q's group is older than the ring's NS - 1 (cp.async) or the only one (bulk)
    if constexpr (BULK) cp_async_wait<0>();
    else cp_async_wait<NS - 1>();
  } else {
    stage_q_elementwise<T, D, NHT, W * 32>(p, w, qs);
  }
  __syncthreads();  // the only CTA barrier before the end: q visible to every warp
  AURA_PHASE(2);

  // B fragments of q: head n*8 + lane/4... via ldmatrix (rows = heads, 16 k-values of D per step)
  const int qb_row = lane & 7, qb_col = 8 * ((lane >> 3) & 1);
  uint32_t qreg[kQInRegs ? NHT : 1][kQInRegs ? KS : 1][2];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int n = 0; n < NHT; ++n)
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        uint32_t b[2];
        ldmatrix_x2(b, qs + (n * 8 + qb_row) * ROW + ks * 16 + qb_col);
        qreg[n][ks][0] = b[0], qreg[n][ks][1] = b[1];
      }
  }

  // Per head column (tile n, column e = head n*8 + 2*(lane%4) + e): running max (warp-uniform
  // per column), this lane's share of the sum, and O^T fragments [m-tile][n][4].
  float m_run[NHT][2], l_run[NHT][2], o[KS][NHT][4];
#pragma unroll
  for (int n = 0; n < NHT; ++n) m_run[n][0] = m_run[n][1] = -INFINITY, l_run[n][0] = l_run[n][1] = 0.f;
#pragma unroll
  for (int mt = 0; mt < KS; ++mt)
#pragma unroll
    for (int n = 0; n < NHT; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_col = 8 * (lane >> 4);  // K: A tiles, rows = tokens
  const int v_row = (lane & 7) + 8 * (lane >> 4), v_col = 8 * ((lane >> 3) & 1);  // V^T: A tiles via .trans

  for (int i = 0; i < my_n; ++i) {
    __syncwarp();  // every lane is done reading the slot the next copy overwrites
    issue(i + NS - 1);
    if constexpr (BULK) {
      mbar_wait(bars + slot(i), ((u0 + i) / NS) & 1);  // step i's copies have landed
    } else {
      cp_async_wait<NS - 1>();  // step i's group has landed (for this lane)
    }
    const int t0 = step_t0(i);
    if constexpr (TILES) {
      const int n_rows = w.end - t0;
      if (n_rows < 16) {  // the split's last step: V rows past the end hold other tokens (or garbage)
        T* vz = my_ring + slot(i) * 2 * STILE + STILE;
        for (int idx = lane; idx < (16 - n_rows) * (D / 8); idx += 32) {
          const int r = n_rows + idx / (D / 8), c = (idx % (D / 8)) * 8;
          *reinterpret_cast<uint4*>(vz + tile_off(r, c)) = make_uint4(0, 0, 0, 0);
        }
      }
    }
    __syncwarp();  // ... and for the whole warp, with its zeroed tail rows
    const T* kt = my_ring + slot(i) * 2 * STILE;
    const T* vt = kt + STILE;

    // QK, two accumulator chains per head tile so consecutive MMAs do not wait on each other
    float s[NHT][2][4] = {};
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, kt + at(a_row, ks * 16 + a_col));
#pragma unroll
      for (int n = 0; n < NHT; ++n) {
        uint32_t b0, b1;
        if constexpr (kQInRegs) {
          b0 = qreg[n][ks][0], b1 = qreg[n][ks][1];
        } else {
          uint32_t b[2];
          ldmatrix_x2(b, qs + (n * 8 + qb_row) * ROW + ks * 16 + qb_col);
          b0 = b[0], b1 = b[1];
        }
        mma_16816<T>(s[n][ks & 1], a, b0, b1);
      }
    }
    // softmax: rows of S^T are tokens lane/4 (c0, c1) and lane/4 + 8 (c2, c3)
    const bool ok_lo = t0 + (lane >> 2) < w.end, ok_hi = t0 + (lane >> 2) + 8 < w.end;
    uint32_t pb[NHT][2];
    float alpha[NHT][2];
    bool grew = false;
#pragma unroll
    for (int n = 0; n < NHT; ++n) {
      float x[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const bool ok = c < 2 ? ok_lo : ok_hi;
        x[c] = ok ? (s[n][0][c] + s[n][1][c]) * p.scale_log2 : -INFINITY;
      }
      float pr[4];
      grew |= online_softmax_tile(x, m_run[n], l_run[n], pr, alpha[n]);
      // P^T as the B operand (k = tokens, n = heads): transpose both 8x8 halves in registers
      pb[n][0] = movmatrix_trans(pack2<T>(pr[0], pr[1]));  // tokens 0-7
      pb[n][1] = movmatrix_trans(pack2<T>(pr[2], pr[3]));  // tokens 8-15
    }
    // Rescale O only when some running max moved (after the first steps it rarely does): a
    // warp-uniform branch, so D/4 multiplies per lane are skipped on most steps.
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int mt = 0; mt < KS; ++mt)
#pragma unroll
        for (int n = 0; n < NHT; ++n) {
          o[mt][n][0] *= alpha[n][0], o[mt][n][1] *= alpha[n][1];
          o[mt][n][2] *= alpha[n][0], o[mt][n][3] *= alpha[n][1];
        }
    }
    // PV
#pragma unroll
    for (int mt = 0; mt < KS; ++mt) {
      uint32_t a[4];
      ldmatrix_x4_trans(a, vt + at(v_row, mt * 16 + v_col));
#pragma unroll
      for (int n = 0; n < NHT; ++n) mma_16816<T>(o[mt][n], a, pb[n][0], pb[n][1]);
    }
  }
  AURA_PHASE(4);
  if constexpr (!BULK) cp_async_wait<0>();  // only empty groups remain; drain before the ring is reused
  uses = u0 + my_n;
  if (trigger) grid_dependents_launch();  // the merge (programmatic dependent launch) may start its prologue

  // ---- merge the warps' states (decode.md §5 within the CTA), through the drained ring
#pragma unroll
  for (int n = 0; n < NHT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      l_run[n][e] += __shfl_xor_sync(0xffffffffu, l_run[n][e], 4);
      l_run[n][e] += __shfl_xor_sync(0xffffffffu, l_run[n][e], 8);
      l_run[n][e] += __shfl_xor_sync(0xffffffffu, l_run[n][e], 16);
    }
  // f(head g, dim d, value, l of head g) for every accumulator of this lane's O^T fragments
  auto each_fragment = [&](auto&& f) {
#pragma unroll
    for (int mt = 0; mt < KS; ++mt)
#pragma unroll
      for (int n = 0; n < NHT; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          f(n * 8 + 2 * (lane & 3) + (c & 1), mt * 16 + (lane >> 2) + 8 * (c >> 1), o[mt][n][c], l_run[n][c & 1]);
  };
  // f(head g, m, l) for the head columns this lane's quad holds (lanes 0-3 speak for the warp)
  auto each_head_state = [&](auto&& f) {
    if (lane < 4) {
#pragma unroll
      for (int n = 0; n < NHT; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) f(n * 8 + 2 * lane + e, m_run[n][e], l_run[n][e]);
    }
  };
  if constexpr (W == 1) {
    // One warp (D = 512): nothing to merge between warps. The split is live, so every head saw a
    // token and l >= 1. A partial (S > 1) is staged in the drained ring and stored as coalesced
    // 16-byte rows, faster than scattered fragment stores (decode.md §13); S == 1 writes out directly.
    if (p.S != 1) {
      static_assert(D % 32 == 0 && 8 * NHT * D * sizeof(float) <= NS * 2 * TILE * sizeof(T), "staging area");
      float* ow = reinterpret_cast<float*>(smem_raw);  // [8 NHT][D]
      __syncwarp();  // every lane's last ldmatrix reads of the ring come before the staging writes
      each_fragment([&](int g, int d, float v, float l) { ow[g * D + merge_col(g, d)] = v / l; });
      __syncwarp();
      store_staged_partial<D>(p, w, ow, lane, 32);
    } else {
      each_fragment([&](int g, int d, float v, float l) {
        if (g < nh) store_value<T>(p, w, g, d, v / l);
      });
    }
    AURA_PHASE(5);
    each_head_state([&](int g, float m, float l) {
      if (g < nh) store_head_lse(p, w, g, m, l);
    });
  } else {
    __syncthreads();  // every warp is done with the ring
    constexpr int OROW = kMergeRow<D>;
    static_assert(split_merge_conflict_free<D, NHT>(), "end-of-split merge layout");
    float* ow = reinterpret_cast<float*>(smem_raw);  // [W][16][OROW], dims swizzled (merge_col)
    const WarpStates<W, 16> st{ow + W * 16 * OROW, ow + W * 16 * OROW + W * 16, ow + W * 16 * OROW + 2 * W * 16};
    each_head_state([&](int g, float m, float l) { st.m[warp * 16 + g] = m, st.l[warp * 16 + g] = l; });
    each_fragment([&](int g, int d, float v, float) { ow[(warp * 16 + g) * OROW + merge_col(g, d)] = v; });
    __syncthreads();
    AURA_PHASE(5);
    st.weigh();
    __syncthreads();
    for (int idx = threadIdx.x; idx < nh * D; idx += W * 32) {
      const int g = idx / D, d = idx % D;
      float acc = 0.f;
#pragma unroll
      for (int wi = 0; wi < W; ++wi) acc += st.weight(wi, g) * ow[(wi * 16 + g) * OROW + merge_col(g, d)];
      store_value<T>(p, w, g, d, acc / st.row_sum(g));
    }
    for (int g = threadIdx.x; g < nh; g += W * 32) store_head_lse(p, w, g, st.row_max(g), st.row_sum(g));
  }
  AURA_PHASE(6);
}

// The static schedule: grid (S, Hkv * head_tiles, B), one split per CTA (decode.md §4).
template <typename T, int D, int NHT, bool BULK, bool TILES = false>
__global__ void __launch_bounds__(WarpSplitShape<T, D>::kWarps * 32)
    flash_decode_split_mma_kernel(const DecodeParams p, const __grid_constant__ TileMaps maps) {
  AURA_PHASE(0);
  SplitWork w;
  plan_split_heads(p, w);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const MmaSmem<T, D> sm(smem_raw);
  stage_q_async<T, D, NHT>(p, w, sm.qs);  // before seq_lens: q is the first request
  if (!plan_split_tokens<T>(p, w)) {
    cp_async_wait<0>();  // q's copies land before the shared memory is handed on
    return;
  }
  init_ring_barriers<T, D, BULK>(sm.bars);
  int uses = 0;
  run_split_mma<T, D, NHT, BULK, TILES>(p, w, smem_raw, uses, true, &maps);
}

// ------------------------------------------------------------------------ D = 512 across four warps
// decode.md §7: the one-warp D = 512 CTA is issue- and latency-bound. Here four warps share every
// step, warp w owning dims [128 w, 128 w + 128): their partial logits meet in shared memory (one CTA
// barrier per step), so each runs the same softmax and the end needs no merge of warp states. Warp 0
// refills step i - 1's slot after step i's barrier, which every warp passes only after reading it.
// Tile copies only (contiguous, or pages of 16k).
template <typename T>
struct DimSplitShape {
  static constexpr int kDim = 512, kWarps = 4, kWarpDims = kDim / kWarps;
  static constexpr int kTile = 16 * kDim;                      // elements of one K or V tile
  static constexpr size_t kStepBytes = size_t(2) * kTile * sizeof(T);
  static constexpr int kRow = WarpSplitShape<T, kDim>::kRow;   // q rows, as stage_q_async lays them
  static constexpr int kStages = 3;
  static constexpr size_t kQBytes = size_t(8) * kRow * sizeof(T);
  static constexpr size_t kLogitBytes = size_t(2) * kWarps * 32 * sizeof(float4);  // [2][W][32 lanes]
  static constexpr size_t kSmem = 1024 + kStages * kStepBytes + kQBytes + kLogitBytes + kStages * sizeof(uint64_t);
  static_assert(kSmem <= kSmemBudget, "two CTAs per SM");
  static_assert(size_t(8) * kDim * sizeof(float) <= kStages * kStepBytes, "partial staging area");
};

template <typename T>
__global__ void __launch_bounds__(DimSplitShape<T>::kWarps * 32, 2)
    flash_decode_split_dims_kernel(const DecodeParams p, const __grid_constant__ TileMaps maps) {
  using Shape = DimSplitShape<T>;
  constexpr int D = Shape::kDim, W = Shape::kWarps, NS = Shape::kStages, ROW = Shape::kRow, TILE = Shape::kTile;
  constexpr int KS = Shape::kWarpDims / 16;  // this warp's QK k-steps = its PV m-tiles
  SplitWork w;
  plan_split_heads(p, w);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* tiles = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  T* qs = tiles + NS * 2 * TILE;
  float4* logits = reinterpret_cast<float4*>(qs + 8 * ROW);
  uint64_t* full = reinterpret_cast<uint64_t*>(logits + 2 * W * 32);
  stage_q_async<T, D, 1, W * 32>(p, w, qs);  // before seq_lens: q is the first request
  if (!plan_split_tokens<T>(p, w)) {
    cp_async_wait<0>();
    return;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nh = w.nh, dim0 = warp * Shape::kWarpDims;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int j = 0; j < NS; ++j) mbar_init(full + j, 1);
    mbar_init_fence();
  }
  __syncthreads();  // the barriers are initialised before any thread waits on them

  const int n_steps = ceil_div(w.end - w.start, 16);
  const bool paged = p.block_table != nullptr;
  constexpr int BOXES = D / 64;  // per tile: lanes [0, BOXES) copy K's boxes, [BOXES, 2 BOXES) V's
  auto issue = [&](int i) {     // warp 0: step i into slot i % NS (free: see the kernel's comment)
    if (i >= n_steps) return;
    const int slot = i % NS, t0 = w.start + 16 * i;
    int c1 = t0, c2 = w.kvh, c3 = w.b;  // box coordinates, innermost first: contiguous (d, t, h, b)
    if (paged) {                        // paged (d, h, row in page, page)
      const int page = min(max(p.block_table[w.b * p.bt_sb + t0 / p.page_size], 0), p.num_blocks - 1);
      c1 = w.kvh, c2 = t0 % p.page_size, c3 = page;
    }
    if (lane == 0) mbar_arrive_expect_tx(full + slot, unsigned(2 * TILE * sizeof(T)));
    __syncwarp();  // the barrier expects the bytes before any box can complete
    if (lane < 2 * BOXES) {
      const int c = lane % BOXES;
      const bool v_box = lane >= BOXES;
      tensor_copy_g2s_4d(tiles + slot * 2 * TILE + (v_box ? TILE : 0) + c * 16 * 64, v_box ? &maps.v : &maps.k,
                         c * 64, c1, c2, c3, full + slot);
    }
  };
  if (warp == 0) {
#pragma unroll
    for (int i = 0; i < NS; ++i) issue(i);
  }
  if (p.q_vec16) {
    cp_async_wait<0>();
  } else {
    stage_q_elementwise<T, D, 1, W * 32>(p, w, qs);
  }
  __syncthreads();  // q visible to every warp

  const int qb_row = lane & 7, qb_col = 8 * ((lane >> 3) & 1);
  uint32_t qreg[KS][2];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t b[2];
    ldmatrix_x2(b, qs + qb_row * ROW + dim0 + ks * 16 + qb_col);
    qreg[ks][0] = b[0], qreg[ks][1] = b[1];
  }
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, o[KS][4];
#pragma unroll
  for (int mt = 0; mt < KS; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
  const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_col = 8 * (lane >> 4);  // K: A tiles, rows = tokens
  const int v_row = (lane & 7) + 8 * (lane >> 4), v_col = 8 * ((lane >> 3) & 1);  // V^T: A tiles via .trans

  for (int i = 0; i < n_steps; ++i) {
    const int slot = i % NS, t0 = w.start + 16 * i, n_rows = w.end - t0;
    mbar_wait(full + slot, (i / NS) & 1);
    const T* kt = tiles + slot * 2 * TILE;
    T* vt = tiles + slot * 2 * TILE + TILE;
    if (n_rows < 16) {  // the split's last step: V rows past the end hold other tokens (or NaN)
      for (int idx = lane; idx < (16 - n_rows) * (Shape::kWarpDims / 8); idx += 32) {
        const int r = n_rows + idx / (Shape::kWarpDims / 8), c = dim0 + (idx % (Shape::kWarpDims / 8)) * 8;
        *reinterpret_cast<uint4*>(vt + tile_off(r, c)) = make_uint4(0, 0, 0, 0);
      }
      __syncwarp();
    }
    float s[2][4] = {};  // this warp's share of S^T [16 tokens x 8 heads], two accumulator chains
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, kt + tile_off(a_row, dim0 + ks * 16 + a_col));
      mma_16816<T>(s[ks & 1], a, qreg[ks][0], qreg[ks][1]);
    }
    float4* xb = logits + (i & 1) * W * 32;  // double-buffered: one barrier per step suffices
    xb[warp * 32 + lane] = make_float4(s[0][0] + s[1][0], s[0][1] + s[1][1], s[0][2] + s[1][2], s[0][3] + s[1][3]);
    __syncthreads();  // also: every warp is done with step i - 1's slot
    if (warp == 0 && i > 0) issue(i - 1 + NS);
    float4 tot = xb[lane];  // summed in warp order: the same logits in every warp
#pragma unroll
    for (int wi = 1; wi < W; ++wi) {
      const float4 x = xb[wi * 32 + lane];
      tot.x += x.x, tot.y += x.y, tot.z += x.z, tot.w += x.w;
    }
    const bool ok_lo = t0 + (lane >> 2) < w.end, ok_hi = t0 + (lane >> 2) + 8 < w.end;
    const float x[4] = {ok_lo ? tot.x * p.scale_log2 : -INFINITY, ok_lo ? tot.y * p.scale_log2 : -INFINITY,
                        ok_hi ? tot.z * p.scale_log2 : -INFINITY, ok_hi ? tot.w * p.scale_log2 : -INFINITY};
    float pr[4], alpha[2];
    const bool grew = online_softmax_tile(x, m_run, l_run, pr, alpha);
    const uint32_t pb0 = movmatrix_trans(pack2<T>(pr[0], pr[1])), pb1 = movmatrix_trans(pack2<T>(pr[2], pr[3]));
    if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
      for (int mt = 0; mt < KS; ++mt)
        o[mt][0] *= alpha[0], o[mt][1] *= alpha[1], o[mt][2] *= alpha[0], o[mt][3] *= alpha[1];
    }
#pragma unroll
    for (int mt = 0; mt < KS; ++mt) {
      uint32_t a[4];
      ldmatrix_x4_trans(a, vt + tile_off(v_row, dim0 + mt * 16 + v_col));
      mma_16816<T>(o[mt], a, pb0, pb1);
    }
  }
  grid_dependents_launch();  // the merge (programmatic dependent launch) may start its prologue

#pragma unroll
  for (int e = 0; e < 2; ++e) {  // each lane summed its own token rows: the column's l over the quads
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 4);
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 8);
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 16);
  }
  // f(head g, dim d, value) for this lane's O^T fragments of the warp's dims
  auto each_fragment = [&](auto&& f) {
#pragma unroll
    for (int mt = 0; mt < KS; ++mt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        f(2 * (lane & 3) + (c & 1), dim0 + mt * 16 + (lane >> 2) + 8 * (c >> 1), o[mt][c] / l_run[c & 1]);
  };
  if (p.S != 1) {  // a partial: staged (dims swizzled, conflict-free) and stored as 16-byte rows
    __syncthreads();  // every warp is done with the ring
    float* ow = reinterpret_cast<float*>(tiles);  // [8][D]
    each_fragment([&](int g, int d, float v) { ow[g * D + merge_col(g, d)] = v; });
    __syncthreads();
    store_staged_partial<D>(p, w, ow, threadIdx.x, W * 32);
  } else {
    each_fragment([&](int g, int d, float v) {
      if (g < nh) store_value<T>(p, w, g, d, v);
    });
  }
  if (warp == 0 && lane < 4) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (2 * lane + e < nh) store_head_lse(p, w, 2 * lane + e, m_run[e], l_run[e]);
    }
  }
}

// ------------------------------------------------------------------------ the balanced schedule
// decode.md §4: static splits leave SMs idle (CTAs finish at different times under saturation), so
// the balanced schedule hands out work at run time. decode_balance_plan_kernel reads seq_lens on the
// device and cuts every (sequence, KV head, head tile) into chunks of one length, sized so that the
// whole batch makes about kBalancedItemsPerSlot items per CTA slot; a persistent grid of one CTA per
// slot claims items from a counter until none is left. Each item writes its own partial rows (item
// * heads_per_cta + g), so which CTA ran an item changes nothing: the result is deterministic, and a
// graph replay is bitwise eager. The merge finds a row's items from the plan.
// Int32 slots of the plan (a workspace of kPlanPrefix + B + 1):
constexpr int kPlanCounter = 0;  // items claimed so far (zeroed by the plan kernel in every call)
constexpr int kPlanChunk = 1;    // tokens per item
constexpr int kPlanItems = 2;    // items in all
constexpr int kPlanPrefix = 4;   // [B + 1]: exclusive prefix over sequences of their chunk counts
constexpr int kPlanThreads = 1024;

// One CTA. chunk = round_up(max(min_chunk, ceil(tokens * units / target_items)), tile), at most the
// capacity rounded up to a tile; so items <= target_items + B * units (the host's buffer bound).
__global__ void __launch_bounds__(kPlanThreads)
    decode_balance_plan_kernel(const int* seq_lens, int B, int capacity, int tile, int units, int target_items,
                               int min_chunk, int* plan) {
  grid_dependents_launch();  // the split kernel may launch; it reads the plan after grid_dependency_wait()
  __shared__ long long part[kPlanThreads / 32];
  __shared__ int warp_tot[kPlanThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  auto len = [&](int b) { return min(max(seq_lens[b], 0), capacity); };  // clamped as the split kernels clamp
  long long tokens = 0;
  for (int b = tid; b < B; b += kPlanThreads) tokens += len(b);
  for (int o = 16; o > 0; o >>= 1) tokens += __shfl_xor_sync(0xffffffffu, tokens, o);
  if (lane == 0) part[warp] = tokens;
  __syncthreads();
  tokens = 0;
  for (int i = 0; i < kPlanThreads / 32; ++i) tokens += part[i];
  const long long want = (tokens * units + target_items - 1) / target_items;
  const long long cap = (static_cast<long long>(max(capacity, 1)) + tile - 1) / tile * tile;
  const long long c = min(cap, max(static_cast<long long>(min_chunk), want));
  const int chunk = static_cast<int>((c + tile - 1) / tile * tile);
  int carry = 0;  // chunks of the sequences before this round
  for (int b0 = 0; b0 < B; b0 += kPlanThreads) {
    const int b = b0 + tid;
    const int n = b < B ? ceil_div(len(b), chunk) : 0;
    int x = n;  // inclusive scan: warps, then the warps' totals
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == 31) warp_tot[warp] = x;
    __syncthreads();
    int before = carry;
    for (int i = 0; i < warp; ++i) before += warp_tot[i];
    if (b < B) plan[kPlanPrefix + b] = before + x - n;
    int round = 0;
    for (int i = 0; i < kPlanThreads / 32; ++i) round += warp_tot[i];
    carry += round;
    __syncthreads();  // warp_tot is rewritten by the next round
  }
  if (tid == 0) {
    plan[kPlanPrefix + B] = carry;
    plan[kPlanCounter] = 0;
    plan[kPlanChunk] = chunk;
    plan[kPlanItems] = carry * units;
  }
}

// Item -> work. Items run sequence by sequence, then unit (KV head, head tile), then chunk: sequence b
// owns items [units * P[b], units * P[b + 1]).
__device__ __forceinline__ SplitWork balanced_item(const DecodeParams& p, int item, int chunk) {
  const int* P = p.plan + kPlanPrefix;
  const int units = p.Hkv * p.head_tiles, x = item / units;
  int lo = 0, hi = p.B;  // the last b with P[b] <= x (a sequence without chunks has P[b] == P[b + 1])
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (P[mid] <= x) lo = mid;
    else hi = mid;
  }
  SplitWork w;
  w.b = lo;
  const int n_b = P[lo + 1] - P[lo], r = item - units * P[lo];
  const int unit = r / n_b;
  w.s = r % n_b;
  w.kvh = unit / p.head_tiles;
  const int g0 = (unit % p.head_tiles) * p.heads_per_cta;
  w.nh = min(p.heads_per_cta, p.G - g0);
  w.hq0 = w.kvh * p.G + g0;
  w.start = w.s * chunk;
  w.end = min(w.start + chunk, min(max(p.seq_lens[w.b], 0), p.capacity));
  w.part_row = int64_t(item) * p.heads_per_cta;
  return w;
}

// A persistent CTA per slot, launched behind the plan kernel: claim an item, run it, repeat. Two CTAs
// per SM, as kSmemBudget plans: without the bound ptxas kept D = 256 at 168 registers and spilled.
template <typename T, int D, int NHT, bool BULK>
__global__ void __launch_bounds__(WarpSplitShape<T, D>::kWarps * 32, 2)
    flash_decode_balanced_mma_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const MmaSmem<T, D> sm(smem_raw);
  __shared__ int claimed;
  init_ring_barriers<T, D, BULK>(sm.bars);
  int uses = 0;
  grid_dependency_wait();  // the plan and its zeroed counter
  for (;;) {
    if (threadIdx.x == 0) claimed = atomicAdd(p.plan + kPlanCounter, 1);
    __syncthreads();
    const int item = claimed;  // read by all before run_split_mma's barrier lets thread 0 claim again
    // the plan's totals are re-read per item (cached loads) rather than held across it: at D >= 192
    // the main loop needs every register
    if (item >= p.plan[kPlanItems]) break;
    const SplitWork w = balanced_item(p, item, p.plan[kPlanChunk]);
    stage_q_async<T, D, NHT>(p, w, sm.qs);
    run_split_mma<T, D, NHT, BULK>(p, w, smem_raw, uses, false);
    if constexpr (BULK) fence_proxy_async_shared();  // the epilogue's generic writes to the ring, before bulk refills
    __syncthreads();  // the next item's copies overwrite the ring and q
  }
  grid_dependents_launch();
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
  // the balanced schedule's partials (plan != nullptr): row (b, h)'s splits are its items, found in
  // the plan; item rows of heads_per_cta heads, G query heads per KV head in head_tiles tiles
  const int* plan;
  int G, heads_per_cta, head_tiles, Hkv;
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

// One CTA per (b, query head, 128-dim chunk): the log-sum-exp merge of decode.md §5. The merge is
// latency-bound, so it counts round trips: warp w loads splits w, w + 4, ... U at once, the first U
// together with the lse values (at batch 1 the whole merge is one round trip). Dims in 128-wide
// chunks give a long D more CTAs (decode.md §13).
// A split with lse = -inf has weight 0 and its partial, possibly stale or NaN, is dropped by a select;
// a NaN lse (NaN/Inf in the data) makes the whole row NaN, as one split would
// (past each warp's first U splits it is not even loaded). With no live split out = 0, lse = -inf
// (exp(-inf - -inf) would be NaN).
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
  grid_dependency_wait();  // launched behind the split kernel: its partials are complete after this
  AURA_PHASE(9);
  // splits of this row: S at strides (pl_s, po_s) from its first, static or from the balanced plan
  int S = p.S;
  int64_t pl_s = p.pl_s, po_s = p.po_s, first_lse = b * p.pl_b + h * p.pl_h, first_po = b * p.po_b + h * p.po_h;
  if (p.plan != nullptr) {
    const int* P = p.plan + kPlanPrefix;
    const int units = p.Hkv * p.head_tiles, gi = h % p.G;
    const int unit = (h / p.G) * p.head_tiles + gi / p.heads_per_cta;
    S = P[b + 1] - P[b];
    const int64_t row0 = (int64_t(units) * P[b] + int64_t(unit) * S) * p.heads_per_cta + gi % p.heads_per_cta;
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
#pragma unroll
      for (int u = 0; u < U; ++u) {  // dead splits (w = 0) dropped by a select: their rows may be NaN
        if (wu[u] > 0.f) {
          acc.x = fmaf(wu[u], v[u].x, acc.x);
          acc.y = fmaf(wu[u], v[u].y, acc.y);
          acc.z = fmaf(wu[u], v[u].z, acc.z);
          acc.w = fmaf(wu[u], v[u].w, acc.w);
        }
      }
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
