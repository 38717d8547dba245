// What every split-K decode kernel shares (docs/decode.md): the launch parameters, the split rule run
// on the device and by the host plan, what one CTA owns (SplitWork), and the epilogue's stores.
#pragma once

#include "common.cuh"

namespace aura {

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
  int streamk_ctas;        // > 0: the stream-K schedule (S == 0) over this many CTAs
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

// Whether the tile copies (TileMaps, decode_tiles.cuh) can serve a layout: whole 64-dim boxes, and 16-token
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

// Sequence b's tokens clamped to [0, capacity], as every decode kernel reads them: a bad seq_len can only
// give a wrong answer, never an out-of-bounds read.
__device__ __forceinline__ int live_tokens(const int* seq_lens, int b, int capacity) {
  return min(max(seq_lens[b], 0), capacity);
}

// A work unit of a sequence, (KV head, head tile) = (unit / head_tiles, unit % head_tiles): its query heads.
// (plan_split_heads spells it out on blockIdx.y: through this helper ptxas spilled the fp32 D = 64 kernel.)
__device__ __forceinline__ void set_unit_heads(const DecodeParams& p, int unit, SplitWork& w) {
  w.kvh = unit / p.head_tiles;
  const int g0 = (unit % p.head_tiles) * p.heads_per_cta;
  w.nh = min(p.heads_per_cta, p.G - g0);
  w.hq0 = w.kvh * p.G + g0;
}

// The split kernels' prologue, in two parts so q can be requested before seq_lens arrives. An empty
// split writes what it owes and returns false: S > 1, lse = -inf (the merge skips its stale partial);
// S == 1, the final out = 0, lse = -inf.
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
  const int T_b = live_tokens(p.seq_lens, w.b, p.capacity);
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

// The stream-K schedule (decode_streamk.cuh, decode.md §4), read by the merge too. The batch's work is
// its 16-token steps in unit order (sequence, then unit), ceil(T_b / 16) per unit; CTA c of C runs steps
// [c * n / C, (c + 1) * n / C) of the n, as one piece per unit it meets, and piece (c, unit u of the batch)
// writes partial row c + u: unique, since both orders run along the same steps (rows < C + B * units).
constexpr int kStreamKMaxBatch = 128;  // the per-sequence step prefix sits in shared memory
struct StreamK {
  long long steps;  // n
  int ctas;         // C
  __device__ __forceinline__ long long first_step(int c) const { return c * steps / ctas; }
  // the CTA whose range holds step x (the last c with first_step(c) <= x)
  __device__ __forceinline__ int cta_of(long long x) const { return int(((x + 1) * ctas - 1) / steps); }
};
// The partial rows a stream-K launch of `ctas` CTAs may write, heads_per_cta per row: c + u < C + B * units.
inline int64_t streamk_partial_rows(int ctas, int64_t batch, int64_t units, int heads_per_cta) {
  return (ctas + batch * units) * heads_per_cta;
}

// steps_before[b]: the 16-token steps of sequences before b (live_tokens);
// steps_before[B]: all of them (B <= kStreamKMaxBatch). Called by every thread; ends with a CTA barrier.
__device__ __forceinline__ void streamk_step_prefix(const int* seq_lens, int B, int capacity, long long* steps_before) {
  constexpr int kRounds = kStreamKMaxBatch / 32;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int n[kRounds];
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {  // every load issued before the first scan
      const int b = 32 * r + lane;
      n[r] = b < B ? ceil_div(live_tokens(seq_lens, b, capacity), 16) : 0;
    }
    long long carry = 0;
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      long long x = n[r];  // inclusive scan over the warp
      for (int o = 1; o < 32; o <<= 1) {
        const long long y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
      }
      if (32 * r + lane < B) steps_before[32 * r + lane] = carry + x - n[r];
      carry += __shfl_sync(0xffffffffu, x, 31);
    }
    if (lane == 0) steps_before[B] = carry;
  }
  __syncthreads();
}

// The unit that holds step x < n: its sequence b, unit in b, first step and length in steps (>= 1).
struct StreamKUnit {
  int b, unit, steps;
  long long first;
};
__device__ __forceinline__ StreamKUnit streamk_unit_of(const long long* steps_before, int B, int units, long long x) {
  int lo = 0, hi = B;  // the last b with steps_before[b] * units <= x: its steps reach past x, so it is not empty
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (steps_before[mid] * units <= x) lo = mid;
    else hi = mid;
  }
  const int len = int(steps_before[lo + 1] - steps_before[lo]);
  const int unit = int((x - steps_before[lo] * units) / len);
  return {lo, unit, len, steps_before[lo] * units + int64_t(unit) * len};
}

// The balanced schedule's plan (decode_balanced.cuh), read by the merge too.
// Int32 slots of the plan (a workspace of kPlanPrefix + B + 1):
constexpr int kPlanCounter = 0;  // items claimed so far (zeroed by the plan kernel in every call)
constexpr int kPlanChunk = 1;    // tokens per item
constexpr int kPlanItems = 2;    // items in all
constexpr int kPlanPrefix = 4;   // [B + 1]: exclusive prefix over sequences of their chunk counts
constexpr int kPlanThreads = 1024;

}  // namespace aura
