// What both pass-1 kernels share (docs/aura-format.md §8): the parameters, and the plan of one CTA's
// query rows and token block.
#pragma once

#include "aura_common.cuh"

namespace aura {

constexpr int kQRowsPerTile = 4;  // query rows per MMA column tile: columns 0-3 hi, 4-7 lo
constexpr int kMaxRowTiles = 2;   // so a pass-1 CTA holds up to 8 query rows (L x G)
constexpr int kMaxRowsPerCta = kQRowsPerTile * kMaxRowTiles;

// ---------------------------------------------------------------------------- pass 1: plan
struct AuraP1Params {
  const void* q;  // q_rot [B, (L,) Hq, D] (or the raw q when k_sign is set), any float dtype
  FloatKind q_kind;
  int64_t q_sb, q_sl, q_sh;
  const uint32_t* kc;
  const float* kn;
  const uint32_t* vc;
  const float* vn;
  // Strides of (page, row, head), layout-neutral: contiguous pages are sequences and rows tokens
  // (dims 0, 2, 1 of [B, Hkv, T_cap, *]); paged ones blocks and rows in the block (dims 0, 1, 2).
  int64_t kc_s0, kc_s1, kc_s2, kn_s0, kn_s1, kn_s2, vc_s0, vc_s1, vc_s2, vn_s0, vn_s1, vn_s2;
  const int* seq_lens;
  const int* block_table;  // nullptr: contiguous
  int64_t bt_sb;
  const float* k_cb;
  const float* v_cb;
  const uint32_t* k_sign;  // non-null: q is raw, rotate it here with factor (aura_decode's fused q rotation)
  float q_factor;
  float* o;  // [B, L, Hq, NB, D] contiguous
  float* m;  // [B, L, Hq, NB]
  float* l;
  int B, L, Hq, Hkv, G, NB, block_size, capacity, page_size, page_shift, num_blocks;
  int rows_per_cta, row_groups;  // the L x G query rows of a KV head, in CTA groups of <= 8
  int kc_vec, vc_vec;            // bytes per cp.async of the code rows (16, 8 or 4)
  // the row and (paged) page strides above in bytes, for the warp-split kernel's copies (< 2^31)
  int kc_rb, vc_rb, kn_rb, vn_rb, kc_pb, vc_pb, kn_pb, vn_pb;
};

// What one pass-1 CTA owns: token block n of sequence b, KV head kvh, query rows [r0, r0 + R) of that
// head's L x G rows (flattened i * G + g), and the tokens [t0, t_end) that some row of it sees.
struct P1Block {
  int n, b, kvh, r0, R, T, t0, t_end;
  // Element offset of query row r (position i, head h) in q
  __device__ __forceinline__ int64_t q_offset(const AuraP1Params& p, int r) const {
    const int i = (r0 + r) / p.G, h = kvh * p.G + (r0 + r) % p.G;
    return b * p.q_sb + i * p.q_sl + h * p.q_sh;
  }
  // [B, L, Hq, NB] index of (row r, block n)
  __device__ __forceinline__ int64_t out_row(const AuraP1Params& p, int r) const {
    const int i = (r0 + r) / p.G, h = kvh * p.G + (r0 + r) % p.G;
    return ((int64_t(b) * p.L + i) * p.Hq + h) * p.NB + n;
  }
  // Query row r sits at position T - L + i and sees tokens t <= that (causal; L = 1: all of them).
  __device__ __forceinline__ int last_visible(const AuraP1Params& p, int r) const { return T - p.L + (r0 + r) / p.G; }
};

// Shared plan of both pass-1 kernels, in two parts: the CTA's query rows (no memory reads: the
// warp-split kernel issues its q loads before the sequence length arrives) and its tokens.
__device__ __forceinline__ bool plan_p1_rows(const AuraP1Params& p, P1Block& w) {
  w.n = blockIdx.x, w.b = blockIdx.z;
  w.t0 = w.n * p.block_size;
  w.kvh = blockIdx.y / p.row_groups, w.r0 = (blockIdx.y % p.row_groups) * p.rows_per_cta;
  w.R = min(p.rows_per_cta, p.L * p.G - w.r0);
  return w.R > 0;
}
// seq_len = seq_lens[b]. Returns false when the CTA has nothing to read, after writing what an empty
// block owes (o = 0, m = -inf, l = 0: the merge skips it).
template <int D>
__device__ __forceinline__ bool plan_p1_tokens(const AuraP1Params& p, P1Block& w, int nthreads, int seq_len) {
  // Clamped, so a bad seq_len can only give a wrong answer, never an out-of-bounds read.
  w.T = min(max(seq_len, 0), p.capacity);
  w.t_end = min(min(w.t0 + p.block_size, w.T), w.last_visible(p, w.R - 1) + 1);  // the last row sees the most
  if (w.t_end > w.t0) return true;
  for (int i = threadIdx.x; i < w.R * D; i += nthreads) p.o[w.out_row(p, i / D) * D + i % D] = 0.f;
  for (int r = threadIdx.x; r < w.R; r += nthreads) p.m[w.out_row(p, r)] = -INFINITY, p.l[w.out_row(p, r)] = 0.f;
  return false;
}

}  // namespace aura
