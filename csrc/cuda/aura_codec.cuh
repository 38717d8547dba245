// Codes <-> vectors (docs/aura-format.md §5-6): encode (and the in-place cache write) and dequantize.
#pragma once

#include "aura_rotate.cuh"

namespace aura {

// Encode runs a row over D / 32 lanes, lane c holding dims [32 c, 32 c + 32): 16-byte loads, butterfly
// strides 1..16 inside the lane, and 32 codes that fill whole words (aura-format.md §13).
template <int D>
struct ChunkRows {
  static constexpr int kLanes = D / 32;  // lanes per row
  static constexpr int kRowsPerWarp = 32 / kLanes;
  static constexpr int kRowsPerCta = kRowsPerWarp * kAuraWarps;
};

// The unnormalised FWHT of a row held in lane chunks (stage order 1, 2, ..., D/2 as the reference):
// strides 1..16 inside each lane, then 32..D/2 across the row's D/32 lanes.
template <int D>
__device__ __forceinline__ void fwht_chunk(float (&v)[32]) {
  butterfly_registers(v);
#pragma unroll
  for (int h = 1; h < D / 32; h <<= 1) butterfly_lanes(v, h);
}

// Sum over the L lanes of a row (xor steps stay inside the row's aligned lane group).
template <int L>
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int o = 1; o < L; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// 32 consecutive elements of a row from element `at` as fp32: four or eight 16-byte loads when
// `vec16` (the host checked base, strides and row size), else element by element.
__device__ __forceinline__ void load_chunk(const void* base, int64_t at, FloatKind kind, bool vec16, float (&v)[32]) {
  if (vec16 && kind == FloatKind::kF32) {
    const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(base) + at);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float4 f = __ldg(src + i);
      v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
    }
  } else if (vec16) {
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + at);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 u = __ldg(src + i);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
      if (kind == FloatKind::kBF16) words_to_float<__nv_bfloat16, 8>(w, v + 8 * i);
      else words_to_float<__half, 8>(w, v + 8 * i);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = load_float(base, at + i, kind);
  }
}

// N words to dst with the widest stores `vec` (16, 8 or 4 bytes, checked on the host) allows.
template <int N>
__device__ __forceinline__ void store_words(uint32_t* dst, const uint32_t (&w)[N], int vec) {
  if constexpr (N % 4 == 0) {
    if (vec == 16) {
#pragma unroll
      for (int i = 0; i < N; i += 4) *reinterpret_cast<uint4*>(dst + i) = make_uint4(w[i], w[i + 1], w[i + 2], w[i + 3]);
      return;
    }
  }
  if constexpr (N % 2 == 0) {
    if (vec >= 8) {
#pragma unroll
      for (int i = 0; i < N; i += 2) *reinterpret_cast<uint2*>(dst + i) = make_uint2(w[i], w[i + 1]);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) dst[i] = w[i];
}

struct AuraEncodeParams {
  const void* x;
  RowIndexer x_rows;  // rows of x: [..., D] (encode) or [N, Hkv] (write)
  int64_t rows;
  FloatKind kind;
  int x_vec16;  // rows start 16-byte aligned: vector loads
  const float* codebook;    // [2^b]
  const float* boundaries;  // [2^b - 1]
  const uint32_t* mask;
  float factor;  // 1 / sqrt(D)
  // Destination: encode writes contiguous codes [rows, PW] and norms [rows]; a cache write scatters
  // row (n, h) to slot_mapping[n] of the cache (slots < 0 or past the end write nothing).
  uint32_t* codes;
  float* norms;
  int codes_vec;  // widest store (16, 8, 4 bytes) the destination rows allow
  const int64_t* slots;  // nullptr: encode
  int Hkv, paged;
  int64_t slot_div;  // T_cap (contiguous) or page_size (paged)
  int64_t n_slots;
  int64_t c_s0, c_s1, c_s2;  // codes cache strides (contiguous: b, h, t; paged: block, row, h)
  int64_t n_s0, n_s1, n_s2;  // norms cache strides
};

// Encode one row held in lane chunks (aura-format.md §5-6): v holds this lane's 32 elements (chunk c) of
// the row as fp32 (zeros for a row that will not be stored); words gets the chunk's packed codes, and the
// corrected norm is returned (the same on every lane of the row). Every lane of the warp must call it
// (row sums and butterflies shuffle across the row's lanes). cb_s / bd_s: the codebook and boundaries in
// shared memory; mask: the sign mask words or nullptr; factor: 1 / sqrt(D). Shared by aura_encode /
// aura_write_cache (aura_encode_kernel) and aura_append (aura_append.cuh), so both store the same bits.
template <int D, int BITS>
__device__ __forceinline__ float encode_chunk(float (&v)[32], int c, const float* cb_s, const float* bd_s,
                                              const uint32_t* mask, float factor, uint32_t (&words)[BITS]) {
  using CR = ChunkRows<D>;
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) sq = fmaf(v[i], v[i], sq);
  const float r = sqrtf(row_sum<CR::kLanes>(sq));
  const bool degenerate = !(r > 0.f) || isinf(r);  // zero, or a NaN/Inf element: codes 2^(b-1)
  // x * (1 / r): one division per row; one ulp off the reference's quotient, which moves a code only
  // within ~1e-7 of a boundary (the tests allow it)
  const float inv_r = degenerate ? 0.f : 1.f / r;
  const uint32_t signs = mask != nullptr ? __ldg(mask + c) : 0u;  // dims 32 c + i: bit i of word c
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = __uint_as_float(__float_as_uint(v[i] * inv_r) ^ (((signs >> i) & 1u) << 31));
  fwht_chunk<D>(v);
#pragma unroll
  for (int w = 0; w < BITS; ++w) words[w] = 0u;
  float cc = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    // idx = #{k : y > boundaries[k]} by binary search over the sorted boundaries (strict >: a tie
    // takes the lower index)
    const float y = v[i] * factor;
    uint32_t k = 0;
#pragma unroll
    for (int step = 1 << (BITS - 1); step > 0; step >>= 1)
      if (y > bd_s[k + step - 1]) k += step;
    if (degenerate) k = 1u << (BITS - 1);
    const float cv = cb_s[k];
    cc = fmaf(cv, cv, cc);
    const int bit = i * BITS;  // compile-time after unrolling: the packing is shifts and ORs
    words[bit >> 5] |= k << (bit & 31);
    if ((bit & 31) + BITS > 32) words[(bit >> 5) + 1] |= k >> (32 - (bit & 31));
  }
  // Every lane runs this full-mask shuffle, degenerate or not: behind the ternary only the non-degenerate
  // lanes ran it and waited for the rest, which hung a warp mixing live and padding rows (aura_append).
  const float cc_row = row_sum<CR::kLanes>(cc);
  // |x_hat| = |x| (aura-format.md §5); a zero row has norm 0, a NaN/Inf one norm NaN (propagates like dense attention)
  return degenerate ? (r == 0.f ? 0.f : __int_as_float(0x7fc00000)) : r / sqrtf(cc_row);
}

template <int D, int BITS>
__global__ void __launch_bounds__(kAuraThreads) aura_encode_kernel(const AuraEncodeParams p) {
  using CR = ChunkRows<D>;
  constexpr int PW = D * BITS / 32, NB = (1 << BITS) - 1;
  __shared__ float cb_s[1 << BITS], bd_s[1 << BITS];
  for (int i = threadIdx.x; i < (1 << BITS); i += blockDim.x) {
    cb_s[i] = p.codebook[i];
    if (i < NB) bd_s[i] = p.boundaries[i];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, c = lane % CR::kLanes;  // c: this lane's chunk of the row
  const int64_t row = int64_t(blockIdx.x) * CR::kRowsPerCta + (threadIdx.x >> 5) * CR::kRowsPerWarp + lane / CR::kLanes;
  // Lanes of a row past the end or with a dropped slot still run the row's shuffles; they only skip
  // memory. (Whole rows share the fate, so a row group never mixes.)
  bool live = row < p.rows;
  int64_t codes_off = row * PW, norm_off = row;
  if (live && p.slots != nullptr) {
    const int64_t n = row / p.Hkv, h = row % p.Hkv;
    const int64_t slot = p.slots[n];
    live = slot >= 0 && slot < p.n_slots;  // padding (or a bad slot: never written out of bounds)
    const int64_t q = slot / p.slot_div, r = slot % p.slot_div;
    if (p.paged) {
      codes_off = q * p.c_s0 + r * p.c_s1 + h * p.c_s2;
      norm_off = q * p.n_s0 + r * p.n_s1 + h * p.n_s2;
    } else {
      codes_off = q * p.c_s0 + h * p.c_s1 + r * p.c_s2;
      norm_off = q * p.n_s0 + h * p.n_s1 + r * p.n_s2;
    }
  }

  float v[32];
  if (live) {
    load_chunk(p.x, p.x_rows.offset(row) + 32 * c, p.kind, p.x_vec16 != 0, v);
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i) v[i] = 0.f;
  }
  uint32_t words[BITS];
  const float norm = encode_chunk<D, BITS>(v, c, cb_s, bd_s, p.mask, p.factor, words);
  if (!live) return;
  store_words<BITS>(p.codes + codes_off + c * BITS, words, p.codes_vec);
  if (c == 0) p.norms[norm_off] = norm;
}

// -------------------------------------------------------------------------------- dequantize
struct AuraDequantParams {
  const uint32_t* codes;
  const float* norms;
  RowIndexer code_rows, norm_rows;
  int64_t rows;
  const float* codebook;
  const uint32_t* mask;  // non-null: return the original domain
  float factor;
  void* out;  // contiguous [rows, D]
  FloatKind kind;
};

template <int D, int BITS>
__global__ void __launch_bounds__(kAuraThreads) aura_dequantize_kernel(const AuraDequantParams p) {
  constexpr int PW = D * BITS / 32, V = D / 32;
  __shared__ float cb_s[1 << BITS];
  for (int i = threadIdx.x; i < (1 << BITS); i += blockDim.x) cb_s[i] = p.codebook[i];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kAuraWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const uint32_t* codes = p.codes + p.code_rows.offset(row);
  const float norm = p.norms[p.norm_rows.offset(row)];
  float v[V];
#pragma unroll
  for (int i = 0; i < V; ++i) v[i] = norm * cb_s[code_at<BITS>(codes, PW, lane + 32 * i)];
  if (p.mask != nullptr) rotate_warp<D>(v, p.mask, p.factor, true);
#pragma unroll
  for (int i = 0; i < V; ++i) store_float(p.out, row * D + lane + 32 * i, p.kind, v[i]);
}

}  // namespace aura
