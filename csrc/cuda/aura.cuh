// AURA compressed KV cache kernels (docs/aura-format.md): the signed Walsh-Hadamard rotation, encode
// (+ the in-place cache write), dequantize, and the compressed-domain split-K decode, pass 1 over
// the packed codes and pass 2 merging the block partials with the inverse rotation fused.
//
// Design: docs/aura-format.md §13. The rotation keeps the reference's stage order (bitwise equal);
// a pass-1 CTA owns every query row of its KV head, so each packed word is read and unpacked once;
// the exact pass 1 splits fp32 into bf16 hi + lo so tensor cores give fp32-grade logits.
#pragma once

#include "common.cuh"

namespace aura {

constexpr int kAuraWarps = 4;  // warps per CTA of every AURA kernel
constexpr int kAuraThreads = 32 * kAuraWarps;
constexpr int kQRowsPerTile = 4;  // query rows per MMA column tile: columns 0-3 hi, 4-7 lo
constexpr int kMaxRowTiles = 2;   // so a pass-1 CTA holds up to 8 query rows (L x G)
constexpr int kMaxRowsPerCta = kQRowsPerTile * kMaxRowTiles;
constexpr int kMaxLeadDims = 6;   // leading dims of [..., D] tensors the row indexer walks
constexpr float kLog2eF = 1.4426950408889634f;
constexpr float kLn2F = 0.6931471805599453f;

enum class FloatKind : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

__device__ __forceinline__ float load_float(const void* base, int64_t i, FloatKind k) {
  switch (k) {
    case FloatKind::kF16: return __half2float(static_cast<const __half*>(base)[i]);
    case FloatKind::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default: return static_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void store_float(void* base, int64_t i, FloatKind k, float v) {
  switch (k) {
    case FloatKind::kF16: static_cast<__half*>(base)[i] = __float2half_rn(v); break;
    case FloatKind::kBF16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<float*>(base)[i] = v; break;
  }
}

// Element offset of row `row` of a tensor's leading dims (any strides): the kernels read views.
struct RowIndexer {
  int nd;
  int64_t size[kMaxLeadDims];
  int64_t stride[kMaxLeadDims];
  __device__ __forceinline__ int64_t offset(int64_t row) const {
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; --d) {
      int64_t q;  // 32-bit division where both fit (always, in practice): the 64-bit one is a long call
      if (((row | size[d]) >> 32) == 0) q = uint32_t(row) / uint32_t(size[d]);
      else q = row / size[d];
      off += (row - q * size[d]) * stride[d];
      row = q;
    }
    return off;
  }
};

// ----------------------------------------------------------------------------- the rotation
// The two kinds of butterfly stage of the unnormalised FWHT (a, b) -> (a + b, a - b). Across lanes
// (stride h lanes) the lane whose index has bit h set holds the upper element b and keeps
// a - b = partner - own; the other keeps own + partner: one FMA by -1 or +1, which rounds exactly as
// that subtraction or addition (cheaper than a select: aura-format.md §13). Inside a lane:
// registers i and i + h, for every stride h < N.
template <int N>
__device__ __forceinline__ void butterfly_lanes(float (&v)[N], int h) {
  const float own = (threadIdx.x & h) != 0 ? -1.f : 1.f;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = fmaf(own, v[i], __shfl_xor_sync(0xffffffffu, v[i], h));
}
template <int N>
__device__ __forceinline__ void butterfly_registers(float (&v)[N]) {
#pragma unroll
  for (int h = 1; h < N; h <<= 1) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if ((i & h) == 0) {
        const float a = v[i], b = v[i + h];
        v[i] = a + b;
        v[i + h] = a - b;
      }
    }
  }
}

// In-place unnormalised FWHT of the warp's D-vector (lane l holds dims l + 32 i), strides 1, 2, ...,
// D/2 like the reference: strides 1..16 across lanes, then 32..D/2 inside each lane.
template <int D>
__device__ __forceinline__ void fwht_warp(float (&v)[D / 32]) {
#pragma unroll
  for (int h = 1; h < 32; h <<= 1) butterfly_lanes(v, h);
  butterfly_registers(v);
}

// s_j = -1 where bit j mod 32 of mask word j div 32 is set: for lane l's dim l + 32 i, word i, bit l.
template <int D>
__device__ __forceinline__ void apply_signs(float (&v)[D / 32], const uint32_t* mask) {
  if (mask == nullptr) return;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < D / 32; ++i)
    if ((mask[i] >> lane) & 1u) v[i] = -v[i];
}

// Forward y = factor * H(s . x) or inverse x = factor * s . H(y), in place; the sign flip is exact, so
// its place relative to the factor does not change a bit.
template <int D>
__device__ __forceinline__ void rotate_warp(float (&v)[D / 32], const uint32_t* mask, float factor, bool inverse) {
  if (!inverse) apply_signs<D>(v, mask);
  fwht_warp<D>(v);
#pragma unroll
  for (int i = 0; i < D / 32; ++i) v[i] *= factor;
  if (inverse) apply_signs<D>(v, mask);
}

struct AuraRotateParams {
  const void* x;
  void* out;  // contiguous [rows, D], x's dtype
  RowIndexer x_rows;
  int64_t rows;
  const uint32_t* mask;  // nullptr: s = +1
  float factor;          // scale / sqrt(D)
  int inverse;
  FloatKind kind;
};

template <int D>
__global__ void __launch_bounds__(kAuraThreads) hadamard_rotate_kernel(const AuraRotateParams p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kAuraWarps + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const int64_t in = p.x_rows.offset(row);
  float v[D / 32];
#pragma unroll
  for (int i = 0; i < D / 32; ++i) v[i] = load_float(p.x, in + lane + 32 * i, p.kind);
  rotate_warp<D>(v, p.mask, p.factor, p.inverse != 0);
#pragma unroll
  for (int i = 0; i < D / 32; ++i) store_float(p.out, row * D + lane + 32 * i, p.kind, v[i]);
}

// -------------------------------------------------------------------------------- bit packing
// N consecutive BITS-bit codes starting at code j of a packed row (LSB first, §6), as one integer
// (code j in the low bits). Only 3-bit codes straddle words: they take a funnel shift over two words,
// so rows in shared memory keep one word of padding after them.
template <int BITS, int N>
__device__ __forceinline__ uint32_t code_field(const uint32_t* row, int j) {
  const int bit = j * BITS;
  uint32_t v;
  if constexpr (BITS == 3) {
    v = __funnelshift_r(row[bit >> 5], row[(bit >> 5) + 1], bit & 31);
  } else {
    v = row[bit >> 5] >> (bit & 31);  // 2, 4, 8 bits: an aligned group never crosses a word
  }
  return v & ((1u << (N * BITS)) - 1u);
}

// The same from a global row of PW words, never reading past the row's last word.
template <int BITS>
__device__ __forceinline__ uint32_t code_at(const uint32_t* row, int pw, int j) {
  const int bit = j * BITS, w = bit >> 5;
  const uint32_t hi = (BITS == 3 && w + 1 < pw) ? row[w + 1] : 0u;
  return __funnelshift_r(row[w], hi, bit & 31) & ((1u << BITS) - 1u);
}

// ---------------------------------------------------------------------------- encode / write
// Encode mapping (not the warp-per-vector one above): a row's D dims are spread over L = D / 32
// consecutive lanes, lane c of the row holding the contiguous dims [32 c, 32 c + 32), so a warp
// encodes 32 / L rows at once. The input comes in 16-byte vectors, the butterfly strides 1..16 stay
// inside the lane (only strides 32..D/2 cross lanes, in the same stage order: still bitwise the
// reference's rotation), and the lane's 32 codes fill exactly BITS whole words of the packed row,
// packed in registers and stored without shared memory.
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
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) sq = fmaf(v[i], v[i], sq);
  const float r = sqrtf(row_sum<CR::kLanes>(sq));
  const bool degenerate = !(r > 0.f) || isinf(r);  // zero, or a NaN/Inf element: codes 2^(b-1)
  // u = x / r as x * (1 / r): one division per row instead of 32 per lane; u may differ from the
  // reference's quotient by one ulp, which moves a code only for a value within ~1e-7 of a boundary
  // (the tests allow 1e-5 / sqrt(D))
  const float inv_r = degenerate ? 0.f : 1.f / r;
  const uint32_t signs = p.mask != nullptr ? __ldg(p.mask + c) : 0u;  // dims 32 c + i: bit i of word c
#pragma unroll
  for (int i = 0; i < 32; ++i) v[i] = __uint_as_float(__float_as_uint(v[i] * inv_r) ^ (((signs >> i) & 1u) << 31));
  fwht_chunk<D>(v);
  uint32_t words[BITS];
#pragma unroll
  for (int w = 0; w < BITS; ++w) words[w] = 0u;
  float cc = 0.f;
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    // idx = #{k : y > boundaries[k]} by binary search over the sorted boundaries (strict >: a tie
    // takes the lower index)
    const float y = v[i] * p.factor;
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
  // |x_hat| = |x| (§5); a zero row has norm 0, a NaN/Inf one norm NaN (propagates like dense attention)
  const float norm = degenerate ? (r == 0.f ? 0.f : __int_as_float(0x7fc00000)) : r / sqrtf(row_sum<CR::kLanes>(cc));
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

// ------------------------------------------------------------------- pass 1: codebook tables
// bf16 hi/lo halves of an fp32 value: x = hi + lo to 16 significant bits.
__device__ __forceinline__ void split_bf16(float x, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  hi = __bfloat16_as_ushort(h);
  lo = __bfloat16_as_ushort(__float2bfloat16_rn(x - __bfloat162float(h)));
}

template <int BITS>
struct CodeTable {
  // b <= 4: one entry per *pair* of codes, index x | y << b, holding the MMA operand registers
  // {hi(x) | hi(y) << 16, lo(x) | lo(y) << 16}: one 8-byte load per register pair. b = 8: 65536 pairs
  // is too many, so one {hi, lo} word per code, paired by byte permutes.
  static constexpr bool kPairs = BITS <= 4;
  static constexpr int kEntries = kPairs ? 1 << (2 * BITS) : 1 << BITS;
  static constexpr int kEntryBytes = kPairs ? 8 : 4;
  // Replicas, one per lane of a shared-memory wavefront (16 lanes for 8-byte loads, 32 for 4-byte):
  // an entry's copies fill one 128-byte bank row, so random codes never collide on a bank.
  static constexpr int kCopies = kPairs ? 16 : 32;
  static constexpr int kStride = kCopies * kEntryBytes;  // 128 bytes
  static constexpr int kBytes = kEntries * kStride;
};

template <int BITS>
__device__ __forceinline__ void fill_code_table(unsigned char* table, const float* cb) {
  using CT = CodeTable<BITS>;
  for (int i = threadIdx.x; i < CT::kEntries * CT::kCopies; i += blockDim.x) {
    const int e = i / CT::kCopies;
    if constexpr (CT::kPairs) {
      uint32_t hx, lx, hy, ly;
      split_bf16(__ldg(cb + (e & ((1 << BITS) - 1))), hx, lx);
      split_bf16(__ldg(cb + (e >> BITS)), hy, ly);
      *reinterpret_cast<uint2*>(table + size_t(i) * 8) = make_uint2(hx | (hy << 16), lx | (ly << 16));
    } else {
      uint32_t h, l;
      split_bf16(__ldg(cb + e), h, l);
      *reinterpret_cast<uint32_t*>(table + size_t(i) * 4) = h | (l << 16);
    }
  }
}

// {hi, lo} bf16x2 operand registers of the code pair (x, y) = (pair & mask, pair >> b), x in the low half.
template <int BITS>
__device__ __forceinline__ uint2 lookup_pair(const unsigned char* lane_table, uint32_t pair) {
  using CT = CodeTable<BITS>;
  if constexpr (CT::kPairs) {
    return *reinterpret_cast<const uint2*>(lane_table + pair * CT::kStride);
  } else {
    const uint32_t ex = *reinterpret_cast<const uint32_t*>(lane_table + (pair & 0xFFu) * CT::kStride);
    const uint32_t ey = *reinterpret_cast<const uint32_t*>(lane_table + (pair >> 8) * CT::kStride);
    return make_uint2(__byte_perm(ex, ey, 0x5410), __byte_perm(ex, ey, 0x7632));
  }
}

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

// Row stride of a staged code row in words: >= PW (+1 for 3-bit, whose funnel shift reads one word
// past a code) and = 4 mod 8, so the 8 token rows of an MMA fragment land on distinct banks and rows
// stay 16-byte aligned for cp.async.
__host__ __device__ constexpr int staged_row_words(int pw, bool straddles) {
  int rs = pw + (straddles ? 1 : 0);
  while (rs % 8 != 4) ++rs;
  return rs;
}

template <int D, int KB, int VB>
struct P1Config {
  static constexpr int PWK = D * KB / 32, PWV = D * VB / 32;
  static constexpr int RSK = staged_row_words(PWK, KB == 3), RSV = staged_row_words(PWV, VB == 3);
  // Tokens per stage: 64 (four 16-token MMA tiles, one per warp) unless the rows are wide.
  static constexpr int TS = RSK + RSV <= 48 ? 64 : RSK + RSV <= 140 ? 32 : 16;
  static constexpr int TOKEN_TILES = TS / 16;
  static constexpr int KP = kAuraWarps / TOKEN_TILES;  // QK: warps sharing a token tile split D
  static constexpr int KSTEPS = D / 16 / KP;
  static constexpr int MT_PER_WARP = D / 16 / kAuraWarps;  // PV: 16-dim output tiles per warp
  static constexpr int QROW = D + 8;                       // bf16 per q column: +16 B, conflict-free
  static constexpr int PROW = TS + 8;
  static constexpr size_t kTableK = 0;
  static constexpr size_t kTableV = kTableK + CodeTable<KB>::kBytes;
  static constexpr size_t kCodesK = kTableV + CodeTable<VB>::kBytes;  // [2][TS][RSK] words
  static constexpr size_t kCodesV = kCodesK + size_t(2) * TS * RSK * 4;
  static constexpr size_t kNormsK = kCodesV + size_t(2) * TS * RSV * 4;  // [2][TS]
  static constexpr size_t kNormsV = kNormsK + size_t(2) * TS * 4;
  static constexpr size_t kQ = kNormsV + size_t(2) * TS * 4;  // [row tiles][8 columns][QROW] bf16
  static constexpr size_t kP = kQ + size_t(kMaxRowTiles) * 8 * QROW * 2;  // [row tiles][8][PROW] bf16
  static constexpr size_t kS = kP + size_t(kMaxRowTiles) * 8 * PROW * 2;  // [KP][rows][TS] fp32 logits
  static constexpr size_t kStats = kS + size_t(KP) * kMaxRowsPerCta * TS * 4;  // m, l, alpha per row
  static constexpr size_t kBytes = kStats + 3 * kMaxRowsPerCta * 4;
  static_assert(D % 64 == 0 && (D / 16) % KP == 0 && MT_PER_WARP >= 1, "tile shapes");
};

// Where token t of (sequence b, KV head h) lives, for a tensor with (page, row, head) strides.
struct TokenMap {
  const int* pages;  // block_table row of b, or nullptr
  int b, h, page_size, page_shift, num_blocks;
  __device__ __forceinline__ int64_t offset(int64_t s0, int64_t s1, int64_t s2, int t) const {
    if (pages == nullptr) return b * s0 + int64_t(t) * s1 + h * s2;
    int i, row;
    page_of(t, page_size, page_shift, i, row);
    const int page = min(max(pages[i], 0), num_blocks - 1);  // never outside the cache
    return page * s0 + int64_t(row) * s1 + h * s2;
  }
};

template <int PW, int RS, int BYTES, int TS>
__device__ __forceinline__ void stage_code_rows(uint32_t* dst, const uint32_t* src, int64_t s0, int64_t s1,
                                                int64_t s2, const TokenMap& tm, int ts0, int t_end) {
  constexpr int W = BYTES / 4, CPR = PW / W;
  for (int i = threadIdx.x; i < TS * CPR; i += kAuraThreads) {
    const int r = i / CPR, c = i % CPR, t = ts0 + r;
    const bool valid = t < t_end;  // rows past the block are zero-filled without reading memory
    const int64_t off = valid ? tm.offset(s0, s1, s2, t) : 0;
    cp_async<BYTES>(dst + r * RS + c * W, src + off + c * W, valid);
  }
}

template <int PW, int RS, int TS>
__device__ __forceinline__ void stage_codes(uint32_t* dst, const uint32_t* src, int64_t s0, int64_t s1, int64_t s2,
                                            const TokenMap& tm, int ts0, int t_end, int vec) {
  if constexpr (PW % 4 == 0) {
    if (vec == 16) return stage_code_rows<PW, RS, 16, TS>(dst, src, s0, s1, s2, tm, ts0, t_end);
  }
  if constexpr (PW % 2 == 0) {
    if (vec == 8) return stage_code_rows<PW, RS, 8, TS>(dst, src, s0, s1, s2, tm, ts0, t_end);
  }
  stage_code_rows<PW, RS, 4, TS>(dst, src, s0, s1, s2, tm, ts0, t_end);
}

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

// ------------------------------------------------------------------------- pass 1: the kernel
// CTAs per SM the register budget is cut for (168 registers at 3): at D = 128, the decode shape of the
// targets, three CTAs keep 12 warps resident to hide the lookup and MMA latencies; other head dims
// need more registers per thread to stay free of spills (tests/build checks).
template <int D>
constexpr int kP1MinCtas = D == 128 ? 3 : D <= 256 ? 2 : 1;

template <int D, int KB, int VB>
__global__ void __launch_bounds__(kAuraThreads, kP1MinCtas<D>) aura_flash_p1_kernel(const AuraP1Params p) {
  using C = P1Config<D, KB, VB>;
  constexpr int TS = C::TS;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g4 = lane >> 2, c4 = lane & 3;  // mma fragment coordinates (row group, column pair)

  P1Block blk;
  if (!plan_p1_rows(p, blk) || !plan_p1_tokens<D>(p, blk, kAuraThreads, p.seq_lens[blk.b])) return;
  const int b = blk.b, kvh = blk.kvh, R = blk.R, t0 = blk.t0, t_end = blk.t_end;
  auto out_row = [&](int r) { return blk.out_row(p, r); };

  unsigned char* table_k = smem + C::kTableK;
  unsigned char* table_v = smem + C::kTableV;
  uint32_t* codes_k = reinterpret_cast<uint32_t*>(smem + C::kCodesK);
  uint32_t* codes_v = reinterpret_cast<uint32_t*>(smem + C::kCodesV);
  float* norms_k = reinterpret_cast<float*>(smem + C::kNormsK);
  float* norms_v = reinterpret_cast<float*>(smem + C::kNormsV);
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem + C::kQ);
  uint16_t* ps = reinterpret_cast<uint16_t*>(smem + C::kP);
  float* ss = reinterpret_cast<float*>(smem + C::kS);
  float* ms = reinterpret_cast<float*>(smem + C::kStats);
  float* ls = ms + kMaxRowsPerCta;
  float* as = ls + kMaxRowsPerCta;

  const TokenMap tm{p.block_table != nullptr ? p.block_table + b * p.bt_sb : nullptr, b, kvh, p.page_size,
                    p.page_shift, p.num_blocks};
  auto issue_stage = [&](int st, int buf) {
    const int ts0 = t0 + st * TS;
    stage_codes<C::PWK, C::RSK, TS>(codes_k + buf * TS * C::RSK, p.kc, p.kc_s0, p.kc_s1, p.kc_s2, tm, ts0, t_end,
                                    p.kc_vec);
    stage_codes<C::PWV, C::RSV, TS>(codes_v + buf * TS * C::RSV, p.vc, p.vc_s0, p.vc_s1, p.vc_s2, tm, ts0, t_end,
                                    p.vc_vec);
    for (int i = tid; i < 2 * TS; i += kAuraThreads) {
      const int r = i % TS, t = ts0 + r;
      const bool valid = t < t_end;  // zero-filled: p * norm_V = 0 for rows past the block
      if (i < TS) {
        cp_async<4>(norms_k + buf * TS + r, p.kn + (valid ? tm.offset(p.kn_s0, p.kn_s1, p.kn_s2, t) : 0), valid);
      } else {
        cp_async<4>(norms_v + buf * TS + r, p.vn + (valid ? tm.offset(p.vn_s0, p.vn_s1, p.vn_s2, t) : 0), valid);
      }
    }
    cp_async_commit();
  };
  const int n_stages = ceil_div(t_end - t0, TS);
  issue_stage(0, 0);  // in flight while the tables and queries are prepared

  // Padding words of the staged rows are read (masked) by the 3-bit funnel shift: keep them defined.
  for (int i = tid; i < 2 * TS; i += kAuraThreads) {
    for (int w = C::PWK; w < C::RSK; ++w) codes_k[i * C::RSK + w] = 0u;
    for (int w = C::PWV; w < C::RSV; ++w) codes_v[i * C::RSV + w] = 0u;
  }
  fill_code_table<KB>(table_k, p.k_cb);
  fill_code_table<VB>(table_v, p.v_cb);
  for (int i = tid; i < kMaxRowTiles * 8 * C::PROW; i += kAuraThreads) ps[i] = 0;  // unused rows stay 0
  for (int r = tid; r < kMaxRowsPerCta; r += kAuraThreads) ms[r] = -INFINITY, ls[r] = 0.f, as[r] = 1.f;
  // Query rows -> B operand columns: row r -> column r % 4 (hi) and r % 4 + 4 (lo) of tile r / 4, in
  // log2 units (exp2 softmax); rows >= R are zero.
  for (int r = warp; r < kMaxRowsPerCta; r += kAuraWarps) {
    float v[D / 32];
    if (r < R) {
      const int64_t base = blk.q_offset(p, r);
#pragma unroll
      for (int j = 0; j < D / 32; ++j) v[j] = load_float(p.q, base + lane + 32 * j, p.q_kind);
      if (p.k_sign != nullptr) rotate_warp<D>(v, p.k_sign, p.q_factor, false);  // q_rot = scale Pi_K q
    } else {
#pragma unroll
      for (int j = 0; j < D / 32; ++j) v[j] = 0.f;
    }
    uint16_t* col_hi = qs + ((r / kQRowsPerTile) * 8 + r % kQRowsPerTile) * C::QROW;
    uint16_t* col_lo = col_hi + kQRowsPerTile * C::QROW;
#pragma unroll
    for (int j = 0; j < D / 32; ++j) {
      uint32_t hi, lo;
      split_bf16(v[j] * kLog2eF, hi, lo);
      col_hi[lane + 32 * j] = uint16_t(hi);
      col_lo[lane + 32 * j] = uint16_t(lo);
    }
  }
  __syncthreads();

  const int nrt = ceil_div(R, kQRowsPerTile);
  const unsigned char* lane_table_k = table_k + (lane % CodeTable<KB>::kCopies) * CodeTable<KB>::kEntryBytes;
  const unsigned char* lane_table_v = table_v + (lane % CodeTable<VB>::kCopies) * CodeTable<VB>::kEntryBytes;
  const uint32_t* qs32 = reinterpret_cast<const uint32_t*>(qs);
  const uint32_t* ps32 = reinterpret_cast<const uint32_t*>(ps);
  float acc[C::MT_PER_WARP][kMaxRowTiles][4] = {};

  for (int st = 0; st < n_stages; ++st) {
    if (st + 1 < n_stages) {
      issue_stage(st + 1, (st + 1) & 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int buf = st & 1, ts0 = t0 + st * TS;
    const uint32_t* kcs = codes_k + buf * TS * C::RSK;
    const uint32_t* vcs = codes_v + buf * TS * C::RSV;
    const float* kns = norms_k + buf * TS;
    const float* vns = norms_v + buf * TS;

    // ---- QK: warp = (token tile, D slice); S^T[16 tokens x 8 columns] over its k-steps.
    {
      const int tt = warp % C::TOKEN_TILES, kp = warp / C::TOKEN_TILES;
      const uint32_t* row_a = kcs + (tt * 16 + g4) * C::RSK;
      const uint32_t* row_b = row_a + 8 * C::RSK;
      float s[kMaxRowTiles][4] = {};
#pragma unroll 2
      for (int ks = 0; ks < C::KSTEPS; ++ks) {
        const int kk = kp * C::KSTEPS + ks, j0 = 16 * kk + 2 * c4, j1 = j0 + 8;
        const uint2 e0 = lookup_pair<KB>(lane_table_k, code_field<KB, 2>(row_a, j0));  // token g,   dims j0, j0+1
        const uint2 e1 = lookup_pair<KB>(lane_table_k, code_field<KB, 2>(row_b, j0));  // token g+8
        const uint2 e2 = lookup_pair<KB>(lane_table_k, code_field<KB, 2>(row_a, j1));  // token g,   dims j1, j1+1
        const uint2 e3 = lookup_pair<KB>(lane_table_k, code_field<KB, 2>(row_b, j1));
        const uint32_t a_hi[4] = {e0.x, e1.x, e2.x, e3.x}, a_lo[4] = {e0.y, e1.y, e2.y, e3.y};
#pragma unroll
        for (int rt = 0; rt < kMaxRowTiles; ++rt) {
          if (rt < nrt) {
            const uint32_t* col = qs32 + (rt * 8 + g4) * (C::QROW / 2);
            const uint32_t b0 = col[8 * kk + c4], b1 = col[8 * kk + 4 + c4];
            mma_16816<__nv_bfloat16>(s[rt], a_hi, b0, b1);
            mma_16816<__nv_bfloat16>(s[rt], a_lo, b0, b1);
          }
        }
      }
#pragma unroll
      for (int rt = 0; rt < kMaxRowTiles; ++rt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[rt][e] += __shfl_xor_sync(0xffffffffu, s[rt][e], 2);  // hi + lo columns
      }
      if (c4 < 2) {
#pragma unroll
        for (int rt = 0; rt < kMaxRowTiles; ++rt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = rt * kQRowsPerTile + 2 * c4 + (e & 1), tok = tt * 16 + g4 + 8 * (e >> 1);
            if (rt < nrt) ss[(kp * kMaxRowsPerCta + row) * TS + tok] = s[rt][e] * kns[tok];
          }
        }
      }
    }
    __syncthreads();

    // ---- online softmax per query row (log2 units), P^T (times the value norms) as hi/lo columns.
    for (int r = warp; r < R; r += kAuraWarps) {
      const int last = blk.last_visible(p, r);
      constexpr int PER = (TS + 31) / 32;
      float x[PER];
      float mx = -INFINITY;
#pragma unroll
      for (int k = 0; k < PER; ++k) {
        const int tt = lane + 32 * k, t = ts0 + tt;
        x[k] = -INFINITY;
        if (tt < TS && t < t_end && t <= last) {
          float v = ss[r * TS + tt];
#pragma unroll
          for (int kp = 1; kp < C::KP; ++kp) v += ss[(kp * kMaxRowsPerCta + r) * TS + tt];
          x[k] = v;
        }
        mx = fmaxf(mx, x[k]);
      }
      mx = warp_max(mx);
      const float m_old = ms[r], m_new = fmaxf(m_old, mx);
      uint16_t* p_hi = ps + ((r / kQRowsPerTile) * 8 + r % kQRowsPerTile) * C::PROW;
      uint16_t* p_lo = p_hi + kQRowsPerTile * C::PROW;
      float sum = 0.f;
#pragma unroll
      for (int k = 0; k < PER; ++k) {
        const int tt = lane + 32 * k;
        if (tt < TS) {
          const float pr = x[k] == -INFINITY ? 0.f : exp2f(x[k] - m_new);
          sum += pr;
          uint32_t hi, lo;
          split_bf16(pr * vns[tt], hi, lo);
          p_hi[tt] = uint16_t(hi);
          p_lo[tt] = uint16_t(lo);
        }
      }
      sum = warp_sum(sum);
      __syncwarp();  // every lane has read ms[r] before lane 0 overwrites it (racecheck)
      if (lane == 0) {
        // m_new = -inf: nothing seen yet, keep alpha 1 (exp2(-inf - -inf) would be NaN).
        const float alpha = m_new == -INFINITY ? 1.f : exp2f(m_old - m_new);
        ls[r] = ls[r] * alpha + sum;
        ms[r] = m_new;
        as[r] = alpha;
      }
    }
    __syncthreads();

    // ---- PV: warp owns 16-dim output tiles mt = warp + 4 i; O^T[16 dims x 8 columns] += V^T P^T.
    {
#pragma unroll
      for (int rt = 0; rt < kMaxRowTiles; ++rt) {
        const float a0 = as[rt * kQRowsPerTile + ((2 * c4) & 3)], a1 = as[rt * kQRowsPerTile + ((2 * c4 + 1) & 3)];
#pragma unroll
        for (int mi = 0; mi < C::MT_PER_WARP; ++mi) {
          acc[mi][rt][0] *= a0, acc[mi][rt][1] *= a1, acc[mi][rt][2] *= a0, acc[mi][rt][3] *= a1;
        }
      }
#pragma unroll 1
      for (int kt = 0; kt < TS / 16; ++kt) {
        const uint32_t* v0 = vcs + (kt * 16 + 2 * c4) * C::RSV;  // tokens 2c, 2c+1, 2c+8, 2c+9
        const uint32_t* v1 = v0 + C::RSV;
        const uint32_t* v8 = v0 + 8 * C::RSV;
        const uint32_t* v9 = v8 + C::RSV;
        uint32_t b[kMaxRowTiles][2];
#pragma unroll
        for (int rt = 0; rt < kMaxRowTiles; ++rt) {
          const uint32_t* col = ps32 + (rt * 8 + g4) * (C::PROW / 2);
          b[rt][0] = col[8 * kt + c4];
          b[rt][1] = col[8 * kt + 4 + c4];
        }
#pragma unroll
        for (int mi = 0; mi < C::MT_PER_WARP; ++mi) {
          const int da = 16 * (warp + kAuraWarps * mi) + g4, db = da + 8;
          const uint2 e0 = lookup_pair<VB>(lane_table_v, code_field<VB, 1>(v0, da) | (code_field<VB, 1>(v1, da) << VB));
          const uint2 e1 = lookup_pair<VB>(lane_table_v, code_field<VB, 1>(v0, db) | (code_field<VB, 1>(v1, db) << VB));
          const uint2 e2 = lookup_pair<VB>(lane_table_v, code_field<VB, 1>(v8, da) | (code_field<VB, 1>(v9, da) << VB));
          const uint2 e3 = lookup_pair<VB>(lane_table_v, code_field<VB, 1>(v8, db) | (code_field<VB, 1>(v9, db) << VB));
          const uint32_t a_hi[4] = {e0.x, e1.x, e2.x, e3.x}, a_lo[4] = {e0.y, e1.y, e2.y, e3.y};
#pragma unroll
          for (int rt = 0; rt < kMaxRowTiles; ++rt) {
            if (rt < nrt) {
              mma_16816<__nv_bfloat16>(acc[mi][rt], a_hi, b[rt][0], b[rt][1]);
              mma_16816<__nv_bfloat16>(acc[mi][rt], a_lo, b[rt][0], b[rt][1]);
            }
          }
        }
      }
    }
    __syncthreads();  // the next stage's loads overwrite this buffer, ss and ps
  }

  // Unnormalised partials (§8): o in the rotated domain, m in natural-log units.
  for (int r = tid; r < R; r += kAuraThreads) {
    p.m[out_row(r)] = ms[r] * kLn2F;  // -inf stays -inf for a row that saw nothing
    p.l[out_row(r)] = ls[r];
  }
#pragma unroll
  for (int mi = 0; mi < C::MT_PER_WARP; ++mi) {
#pragma unroll
    for (int rt = 0; rt < kMaxRowTiles; ++rt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = acc[mi][rt][e] + __shfl_xor_sync(0xffffffffu, acc[mi][rt][e], 2);
        const int row = rt * kQRowsPerTile + 2 * c4 + (e & 1);
        const int d = 16 * (warp + kAuraWarps * mi) + g4 + 8 * (e >> 1);
        if (c4 < 2 && rt < nrt && row < R) p.o[out_row(row) * D + d] = v;
      }
    }
  }
}

// ------------------------------------------- pass 1 for fp16 / bf16 queries: the warp-split kernel
// The dense decode's warp-split design (docs/decode.md §3; aura-format.md §13): no CTA barrier in the
// main loop, one fp16 MMA per product (errors below the half-precision output's own rounding).
// Lane (g, c) takes its k values from its own quarter of the row, dims [c D/4, (c+1) D/4), so each
// lane reads one contiguous run of packed bits; O's rows come out permuted and the epilogue knows the map.

// fp16 codebook tables. Every entry fills 128 bytes with copies for the lanes of a shared-memory
// wavefront (32 copies of 4 bytes, or 16 of 8), and lane l reads its own copy: random codes never
// collide on a bank. When both widths have 8-bit indices (b in {2, 4, 8}) the K and V tables
// interleave in 256-byte rows (K copies first, V copies second): a lookup's byte offset is then
// (index << 8) | lane copy, which one byte permute builds from the packed word (PRMT + LDS per
// lookup). Otherwise (3-bit codes) rows are 128 bytes apart per table and the offset takes a shift,
// a mask and an OR.
//   b = 2:    one entry per *quad* of codes (8-bit index): {half2(C0, C1), half2(C2, C3)}, 8 bytes
//   b = 3, 4: one entry per pair (6- or 8-bit index): half2(C0, C1)
//   b = 8:    one entry per code, the fp16 in the low half (a pair is two loads and a byte permute)
// A lookup always returns a quad, the four codes of one row in one k-step: two operand registers.
template <int BITS>
struct HalfTable {
  static constexpr int kIndexBits = BITS == 2 ? 8 : BITS <= 4 ? 2 * BITS : BITS;
  static constexpr int kEntryBytes = BITS == 2 ? 8 : 4;
  static constexpr size_t kBytes = size_t(128) << kIndexBits;
  __device__ static uint32_t lane_offset(int lane) { return uint32_t(lane % (128 / kEntryBytes)) * kEntryBytes; }
};

// Where pass 1's two tables live: interleaved 256-byte rows when both are byte-indexed, else apart.
template <int KB, int VB>
struct TablePair {
  static constexpr bool kInterleaved = HalfTable<KB>::kIndexBits == 8 && HalfTable<VB>::kIndexBits == 8;
  static constexpr int kRow = kInterleaved ? 256 : 128;  // bytes from one entry to the next
  static constexpr size_t kV = kInterleaved ? 128 : HalfTable<KB>::kBytes;  // the V table's base
  static constexpr size_t kBytes = kInterleaved ? size_t(256) * 256 : HalfTable<KB>::kBytes + HalfTable<VB>::kBytes;
};

// Fill from the codebook (cb: 2^b fp32 values in global memory, read through L1); entries ROW bytes apart.
// A thread builds one entry value and stores 16 bytes of copies at once (4 or 2 of them).
// The loop is unrolled over a compile-time thread count NT, so a thread's store column (i % 8) is fixed
// and its entries step by NT / 8: the codebook reads and stores take immediate offsets.
// TOKEN_PAIRS (2-bit values read by for_each_pv_tile): an entry's byte index holds two dims of two
// tokens (bits 0-3: token a, dims d and d + 1; bits 4-7: token b) and its two registers are the dims'
// (a, b) pairs. 4-bit pair entries already are (low nibble, high nibble) = (a, b).
template <int BITS, int ROW, int NT, bool TOKEN_PAIRS = false>
__device__ __forceinline__ void fill_half_table(unsigned char* table, const float* cb) {
  using HT = HalfTable<BITS>;
  constexpr int STORES = 128 / 16;  // 16-byte stores per entry's 128 bytes of copies
  constexpr int TOTAL = STORES << HT::kIndexBits;
  constexpr uint32_t M = (1u << BITS) - 1u;
  auto c = [&](uint32_t i) { return __ldg(cb + i); };
#pragma unroll
  for (int k = 0; k < (TOTAL + NT - 1) / NT; ++k) {
    const int i = threadIdx.x + k * NT;
    if (TOTAL % NT != 0 && i >= TOTAL) break;
    const uint32_t e = uint32_t(i) / STORES;
    uint4* dst = reinterpret_cast<uint4*>(table + size_t(e) * ROW) + i % STORES;
    if constexpr (BITS == 2 && TOKEN_PAIRS) {  // {half2(dim d: a, b), half2(dim d + 1: a, b)}
      const uint32_t lo = pack2<__half>(c(e & M), c((e >> 4) & M)), hi = pack2<__half>(c((e >> 2) & M), c(e >> 6));
      *dst = make_uint4(lo, hi, lo, hi);
    } else if constexpr (BITS == 2) {  // 8-byte entries: two copies per store
      const uint32_t lo = pack2<__half>(c(e & M), c((e >> 2) & M)), hi = pack2<__half>(c((e >> 4) & M), c(e >> 6));
      *dst = make_uint4(lo, hi, lo, hi);
    } else {
      const uint32_t v = BITS <= 4 ? pack2<__half>(c(e & M), c(e >> BITS)) : __half_as_ushort(__float2half_rn(c(e)));
      *dst = make_uint4(v, v, v, v);
    }
  }
}

// The F-bit field at bit `bit` of w as a table byte offset (index << 7). `bit` is a compile-time
// constant after unrolling: one shift (a funnel shift for 3-bit pairs that straddle words) and a mask.
template <int F, int N>
__device__ __forceinline__ uint32_t field_offset(const uint32_t (&w)[N], int bit) {
  const int i = bit >> 5, sh = bit & 31;
  uint32_t x;
  if (sh + F > 32 && i + 1 < N) x = __funnelshift_r(w[i], w[i + 1], sh - 7);  // sh > 32 - F >= 7 here
  else if (sh >= 7) x = w[i] >> (sh - 7);
  else x = w[i] << (7 - sh);
  return x & (((1u << F) - 1u) << 7);
}

// Byte offset of the entry whose F-bit index sits at bit `bit` of w, plus the lane's copy offset.
// 256-byte rows (8-bit indices on byte boundaries): one PRMT puts byte `bit / 8` of the word above
// the lane offset's low byte (its other bytes are zero). 128-byte rows: shift, mask, OR.
template <int F, int ROW, int N>
__device__ __forceinline__ uint32_t entry_offset(const uint32_t (&w)[N], int bit, uint32_t lane_off) {
  if constexpr (ROW == 256) {
    static_assert(F == 8, "256-byte rows take byte-aligned 8-bit indices");
    return __byte_perm(w[bit >> 5], lane_off, 0x5504u | (uint32_t((bit & 31) >> 3) << 4));
  } else {
    return field_offset<F>(w, bit) | lane_off;
  }
}

__device__ __forceinline__ uint32_t lds32(const unsigned char* table, uint32_t off) {
  return *reinterpret_cast<const uint32_t*>(table + off);
}

// {half2(c0, c1), half2(c2, c3)} of the four codes at bit `bit` of w (code c0 lowest).
template <int BITS, int ROW, int N>
__device__ __forceinline__ uint2 quad_halves(const unsigned char* table, uint32_t lane_off, const uint32_t (&w)[N],
                                             int bit) {
  if constexpr (BITS == 2) {
    return *reinterpret_cast<const uint2*>(table + entry_offset<8, ROW>(w, bit, lane_off));
  } else if constexpr (BITS <= 4) {
    return make_uint2(lds32(table, entry_offset<2 * BITS, ROW>(w, bit, lane_off)),
                      lds32(table, entry_offset<2 * BITS, ROW>(w, bit + 2 * BITS, lane_off)));
  } else {
    const uint32_t c0 = lds32(table, entry_offset<8, ROW>(w, bit, lane_off));
    const uint32_t c1 = lds32(table, entry_offset<8, ROW>(w, bit + 8, lane_off));
    const uint32_t c2 = lds32(table, entry_offset<8, ROW>(w, bit + 16, lane_off));
    const uint32_t c3 = lds32(table, entry_offset<8, ROW>(w, bit + 24, lane_off));
    return make_uint2(__byte_perm(c0, c1, 0x5410), __byte_perm(c2, c3, 0x5410));
  }
}

// A lane's quarter of a staged code row, read in groups of whole k-steps (4 codes each) so at most
// 4 words per row (6 for 3-bit codes) are live at a time.
template <int D, int BITS>
struct Quarter {
  static constexpr int kBits = D * BITS / 4;
  static constexpr int kWords = (kBits + 31) / 32;
  static constexpr bool kAligned = kBits % 32 == 0;  // all but D = 64, b = 3 (48-bit quarters)
  static constexpr int kGroupWords = !kAligned ? kWords : std::min(kWords, BITS == 3 ? 6 : 4);
  static constexpr int kGroups = kWords / kGroupWords;
  static constexpr int kStepsPerGroup = (kAligned ? kGroupWords * 32 : kBits) / (4 * BITS);
  static_assert(kGroups * kGroupWords == kWords && kGroups * kStepsPerGroup == D / 16, "quarter groups");
};

// Words [g GW, (g + 1) GW) of lane quarter c of a staged row (16-byte loads where the sizes allow).
template <int D, int BITS>
__device__ __forceinline__ void load_quarter(const uint32_t* row, int c, int g,
                                             uint32_t (&w)[Quarter<D, BITS>::kGroupWords]) {
  using Q = Quarter<D, BITS>;
  constexpr int GW = Q::kGroupWords;
  if constexpr (!Q::kAligned) {  // 48 bits from bit 48c: two words from word 3c/2, shifted by 0 or 16
    const uint32_t* src = row + (3 * c) / 2;
    const int sh = 16 * (c & 1);
    const uint32_t w0 = src[0], w1 = src[1];
    w[0] = __funnelshift_r(w0, w1, sh);
    w[1] = w1 >> sh;
  } else {
    const uint32_t* src = row + c * Q::kWords + g * GW;
    if constexpr (GW % 4 == 0) {
#pragma unroll
      for (int i = 0; i < GW; i += 4) {
        const uint4 v = *reinterpret_cast<const uint4*>(src + i);
        w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
      }
    } else if constexpr (GW % 2 == 0) {
#pragma unroll
      for (int i = 0; i < GW; i += 2) {
        const uint2 v = *reinterpret_cast<const uint2*>(src + i);
        w[i] = v.x, w[i + 1] = v.y;
      }
    } else {
#pragma unroll
      for (int i = 0; i < GW; ++i) w[i] = src[i];
    }
  }
}

// For each k-step j < D / 16 of a staged 16-row code tile (row stride RS words): f(j, quad of row g4,
// quad of row g4 + 8), this lane's quarter c4 of each row. Shared by QK (K rows) and PV (V rows).
template <int D, int BITS, int RS, int ROW, typename F>
__device__ __forceinline__ void for_each_quad(const uint32_t* tile, const unsigned char* table, uint32_t lane_off,
                                              int g4, int c4, F&& f) {
  using Q = Quarter<D, BITS>;
#pragma unroll
  for (int g = 0; g < Q::kGroups; ++g) {
    uint32_t lo[Q::kGroupWords], hi[Q::kGroupWords];
    load_quarter<D, BITS>(tile + g4 * RS, c4, g, lo);
    load_quarter<D, BITS>(tile + (g4 + 8) * RS, c4, g, hi);
#pragma unroll
    for (int k = 0; k < Q::kStepsPerGroup; ++k) {
      f(g * Q::kStepsPerGroup + k, quad_halves<BITS, ROW>(table, lane_off, lo, 4 * BITS * k),
        quad_halves<BITS, ROW>(table, lane_off, hi, 4 * BITS * k));
    }
  }
}

// PV without transposes (2- and 4-bit values, D * bits >= 256): lane (g4, c4) reads the D / 8 dims
// [g4 D/8, (g4 + 1) D/8) of tokens 2c4, 2c4 + 1, 2c4 + 8 and 2c4 + 9, exactly the k (token) pairs of
// its A fragments, and m-tile mt takes its dims 2mt (tile row g4) and 2mt + 1 (tile row g4 + 8).
// The words of two token rows interleave by nibbles into token-pair indices (a shift and a mask-merge
// per word and half), and a table entry is then the A register itself: half2(code of token a, code
// of token b) of a dim (4-bit: one dim per index byte; 2-bit: two dims, an 8-byte entry). This
// replaces the four movmatrix transposes per MMA of the natural-layout lookup (for_each_quad).
// f(mt, a[4]) per m-tile.
template <int D, int BITS, int RS, int ROW, typename F>
__device__ __forceinline__ void for_each_pv_tile(const uint32_t* tile, const unsigned char* table, uint32_t lane_off,
                                                 int g4, int c4, F&& f) {
  static_assert((BITS == 2 || BITS == 4) && D * BITS >= 256, "token-pair lookups: 2- or 4-bit rows of whole words");
  constexpr int LW = D * BITS / 256;  // words of a token row per lane
  uint32_t lo[2][LW], hi[2][LW];      // [pair: tokens (2c4, 2c4 + 1), (2c4 + 8, 2c4 + 9)][word]
#pragma unroll
  for (int pr = 0; pr < 2; ++pr) {
    const uint32_t* ra = tile + (2 * c4 + 8 * pr) * RS + g4 * LW;
#pragma unroll
    for (int w = 0; w < LW; ++w) {
      const uint32_t a = ra[w], b = ra[RS + w];
      lo[pr][w] = (a & 0x0F0F0F0Fu) | ((b << 4) & 0xF0F0F0F0u);  // byte k: nibble 2k of a, of b
      hi[pr][w] = ((a >> 4) & 0x0F0F0F0Fu) | (b & 0xF0F0F0F0u);  // byte k: nibble 2k + 1 of a, of b
    }
  }
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) {
    uint32_t a[4];
#pragma unroll
    for (int pr = 0; pr < 2; ++pr) {
      if constexpr (BITS == 2) {  // dims 2mt, 2mt + 1 = nibble mt: word mt / 8, byte (mt % 8) / 2 of lo or hi
        const int bit = 32 * (mt / 8) + 8 * ((mt % 8) / 2);
        const uint2 e = *reinterpret_cast<const uint2*>(
            table + entry_offset<8, ROW>((mt & 1) ? hi[pr] : lo[pr], bit, lane_off));
        a[2 * pr] = e.x, a[2 * pr + 1] = e.y;
      } else {  // dim 2mt: byte mt % 4 of lo word mt / 4; dim 2mt + 1: the same byte of hi
        const int bit = 32 * (mt / 4) + 8 * (mt % 4);
        a[2 * pr] = lds32(table, entry_offset<8, ROW>(lo[pr], bit, lane_off));
        a[2 * pr + 1] = lds32(table, entry_offset<8, ROW>(hi[pr], bit, lane_off));
      }
    }
    f(mt, a);
  }
}

// cp.async of one code row of PW words by half a warp-pair: lane half h takes chunks h, h + 2, ... of
// `vec` bytes (16, 8 or 4: what the tensor's base and strides allow, decided on the host). dst and src
// already point at the lane's first chunk (chunk h), so the rest sit at immediate offsets.
template <int PW>
__device__ __forceinline__ void copy_code_row(uint32_t dst, const char* src, bool ok, int half, int vec) {
  auto chunks = [&](auto bytes) {
    constexpr int V = decltype(bytes)::value, N = PW * 4 / V;  // chunks per row
#pragma unroll
    for (int j = 0; 2 * j < N; ++j)
      if (N % 2 == 0 || 2 * j + half < N) cp_async<V>(dst + 2 * V * j, src + 2 * V * j, ok);
  };
  if constexpr (PW % 4 == 0) {
    if (vec == 16) return chunks(std::integral_constant<int, 16>{});
  }
  if constexpr (PW % 2 == 0) {
    if (vec >= 8) return chunks(std::integral_constant<int, 8>{});
  }
  chunks(std::integral_constant<int, 4>{});
}

// Launch shape per (D, bits): one CTA per SM (the two tables, up to 64 KB, are paid once per SM
// instead of once per CTA), as many warps as registers allow, and a ring as deep as the rest of the
// 220 KB allows (2..4 steps in flight per warp).
template <int D, int KB, int VB>
struct WarpP1Shape {
  static constexpr int PWK = D * KB / 32, PWV = D * VB / 32;
  // Row strides in words. Quarters of >= 8 words are read 16 bytes at a time, two rows per
  // 8-lane phase: 4 words of padding put the second row on the other half of the banks.
  static constexpr int RSK = PWK + (Quarter<D, KB>::kWords >= 8 ? 4 : 0);
  static constexpr int RSV = PWV + (Quarter<D, VB>::kWords >= 8 ? 4 : 0);
  static constexpr size_t kStepBytes = size_t(16) * (RSK + RSV) * 4 + 2 * 16 * 4;  // codes + norms, 16 tokens
  static constexpr size_t kTableBytes = TablePair<KB, VB>::kBytes;
  static constexpr int kQRow = D + 8;  // fp16 per staged q row (+16 bytes)
  static constexpr size_t kQBytes = size_t(8) * kQRow * 2;
  static constexpr size_t kBudget = 220 * 1024;
  static constexpr size_t kFree = kBudget - kTableBytes - kQBytes;
  // 16 warps leave 128 registers per thread: enough at D <= 128 except with 8-bit codes (4 lookups
  // per quad), which take 12 warps (168 registers), or 8 when both are 8-bit, to stay free of spills
  // (tests/build checks)
  static constexpr int kMaxWarps = D > 128 ? 8 : (KB == 8 && VB == 8) ? 8 : (KB == 8 || VB == 8) ? 12 : 16;
  static constexpr int kWarps = std::min<int>(kMaxWarps, int(kFree / (2 * kStepBytes)));
  static constexpr int kStages = std::min<int>(4, int(kFree / (kWarps * kStepBytes)));
  static constexpr size_t kRingBytes = size_t(kWarps) * kStages * kStepBytes;
  static constexpr size_t kMergeBytes = size_t(kWarps) * 8 * (D + 3) * 4;  // end-of-block merge: o, m, l, weight
  static constexpr size_t kSmem = std::max(kTableBytes + kRingBytes + kQBytes, kMergeBytes);
  static_assert(kTableBytes % 128 == 0 && kStepBytes % 16 == 0, "alignment of the ring slots");
  static constexpr bool kQInRegs = D <= 256;  // B fragments of q for the whole block (D / 8 registers)
  static constexpr bool kPairV = (VB == 2 || VB == 4) && D * VB >= 256;  // PV by for_each_pv_tile
  static_assert(kWarps >= 1 && kStages >= 2, "a ring needs two steps to overlap loads with math");
};

// The warps' partial outputs meet in shared memory at the end of a block. Accumulator c of m-tile mt
// in lane (g4, c4) is query column 2 c4 + c % 2 and dim merge_dim(g4, mt, c): tile row rho is dim
// (rho % 8) D/8 + 2 mt + rho / 8 with token-pair lookups, else it came from quarter (rho % 8) / 2,
// pair 2 mt + rho / 8, element rho % 2.
template <int D, bool PAIR_V>
__host__ __device__ constexpr int merge_dim(int g4, int mt, int c) {
  return PAIR_V ? g4 * (D / 8) + 2 * mt + (c >> 1) : (g4 >> 1) * (D / 4) + 4 * mt + 2 * (c >> 1) + (g4 & 1);
}
// Where (column r, dim d) sits in its warp's [8][D] block: d with its low five bits XORed by the bits
// that tell the 32 lanes of one store apart (g4's bits of d, and c4 = r / 2), so each store's 32
// lanes hit 32 banks; the XOR reads only bits >= 5 of d or is triangular in them, so 32 consecutive
// dims of one column (the reduction's reads) still hit 32 banks (aura-format.md §13).
template <int D, bool PAIR_V>
__host__ __device__ constexpr int merge_swizzle(int r, int d) {
  constexpr int g_shift = PAIR_V ? (D == 64 ? 3 : D == 128 ? 4 : D == 256 ? 5 : 6)   // log2(D / 8)
                                 : (D == 64 ? 4 : D == 128 ? 5 : D == 256 ? 6 : 7);  // log2(D / 4)
  const int c4 = (r >> 1) & 3;
  return PAIR_V ? d ^ ((((d >> g_shift) & 7) << 2) | c4) : d ^ ((((d >> g_shift) & 3) << 1) | (c4 << 3));
}
// Checked at compile time for every instantiation: stores and reads free of bank conflicts, and the
// swizzle a permutation of each column's dims.
template <int D, bool PAIR_V>
constexpr bool block_merge_conflict_free() {
  for (int mt = 0; mt < D / 16; ++mt)
    for (int c = 0; c < 4; ++c)
      if (!distinct_banks(32, [&](int lane) {
            const int r = 2 * (lane & 3) + (c & 1);
            return r * D + merge_swizzle<D, PAIR_V>(r, merge_dim<D, PAIR_V>(lane >> 2, mt, c));
          }))
        return false;
  for (int r = 0; r < 8; ++r)
    for (int d0 = 0; d0 < D; d0 += 32) {
      for (int d = d0; d < d0 + 32; ++d) {
        const int x = merge_swizzle<D, PAIR_V>(r, d);
        if (x < d0 || x >= d0 + 32) return false;  // stays inside its 32-dim run: a permutation
      }
      if (!distinct_banks(32, [&](int i) { return r * D + merge_swizzle<D, PAIR_V>(r, d0 + i); })) return false;
    }
  return true;
}

template <int D, int KB, int VB>
__global__ void __launch_bounds__(WarpP1Shape<D, KB, VB>::kWarps * 32, 1)
    aura_flash_p1_warp_kernel(const AuraP1Params p) {
  using S = WarpP1Shape<D, KB, VB>;
  constexpr int W = S::kWarps, NS = S::kStages, RSK = S::RSK, RSV = S::RSV, NQ = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g4 = lane >> 2, c4 = lane & 3;
  AURA_PHASE(0);
  P1Block blk;
  if (!plan_p1_rows(p, blk)) return;
  // Latency-bound at B = 1: q, the sign mask, seq_lens and the ring's first (speculative) steps go out
  // together, and the tables are built before anything waits on the sequence length.
  constexpr int QR = (8 + W - 1) / W;
  float q_row[QR][D / 32];
#pragma unroll
  for (int k = 0; k < QR; ++k) {
    const int r = warp + k * W;
#pragma unroll
    for (int j = 0; j < D / 32; ++j) q_row[k][j] = 0.f;
    if (r < blk.R) {
      const int64_t base = blk.q_offset(p, r);
#pragma unroll
      for (int j = 0; j < D / 32; ++j) q_row[k][j] = load_float(p.q, base + lane + 32 * j, p.q_kind);
    }
  }
  uint32_t k_sign[D / 32];
#pragma unroll
  for (int j = 0; j < D / 32; ++j) k_sign[j] = p.k_sign != nullptr ? __ldg(p.k_sign + j) : 0u;
  const int seq_len = p.seq_lens[blk.b];  // used only after the prologue
  AURA_PHASE(1);
  unsigned char* table_k = smem;
  using TP = TablePair<KB, VB>;
  unsigned char* table_v = smem + TP::kV;
  unsigned char* ring = smem + S::kTableBytes;  // [W][NS] steps: K codes, V codes, K norms, V norms
  uint16_t* qs = reinterpret_cast<uint16_t*>(ring + S::kRingBytes);  // [8][kQRow] fp16 q_rot * log2(e)

  // ---- this warp's steps: s = warp, warp + W, ... of the block's ceil(len / 16). Until seq_lens
  // arrives, the block is taken to end where the cache does (t_spec): the first NS - 1 steps are
  // issued for that extent. Rows past the true end (still inside the cache) are masked by a select,
  // their value norms selected to 0 (a stale norm may be NaN).
  const int t_spec = min(blk.t0 + p.block_size, p.capacity);
  auto steps_of = [&](int t_end) {
    const int n_steps = ceil_div(t_end - blk.t0, 16);
    return n_steps > warp ? ceil_div(n_steps - warp, W) : 0;
  };
  int my_n = steps_of(t_spec), t_copy_end = t_spec;  // both become the true extent's once it is known
  auto step_t0 = [&](int i) { return blk.t0 + (warp + W * i) * 16; };

  // ---- copies: lane l stages row l % 16 of a step (its codes in two halves by l / 16, and the K norm
  // for l < 16, the V norm otherwise). To keep the issue path short, the block-fixed parts of the
  // offsets (head; contiguous: sequence) and the lane half's first chunk are folded into base
  // pointers, pinned in registers (else re-derived at every step: aura-format.md §13); the rest is
  // one 32 x 32 -> 64-bit multiply-add per pointer on byte strides from the host (int32, checked
  // there). Rows past the block are clamped to its last token (the copy reads nothing for them: zero
  // fill), so no select guards an address. Paged caches read a row's page one step ahead.
  const int crow = lane & 15, chalf = lane >> 4;
  const bool paged = p.block_table != nullptr;
  const int* pages = paged ? p.block_table + blk.b * p.bt_sb : nullptr;
  const int t_last = t_spec - 1;
  auto fixed = [&](int64_t s0, int64_t s2) { return (paged ? 0 : int64_t(blk.b) * s0) + int64_t(blk.kvh) * s2; };
  auto bytes = [](const void* base, int64_t elems) { return static_cast<const char*>(base) + elems * 4; };
  const int kc_vec = p.kc_vec, vc_vec = p.vc_vec;
  const char* kc_base = pin(bytes(p.kc, fixed(p.kc_s0, p.kc_s2)) + chalf * kc_vec);
  const char* vc_base = pin(bytes(p.vc, fixed(p.vc_s0, p.vc_s2)) + chalf * vc_vec);
  const char* n_base = pin(chalf == 0 ? bytes(p.kn, fixed(p.kn_s0, p.kn_s2)) : bytes(p.vn, fixed(p.vn_s0, p.vn_s2)));
  const int n_rb = pin(chalf == 0 ? p.kn_rb : p.vn_rb);
  // the warp's ring (slot s at + s * kStepBytes) as a pointer, and this lane's destinations in slot 0
  const unsigned char* ring_w = ring + warp * NS * S::kStepBytes;
  const uint32_t kd0 = pin(smem_addr(ring_w) + uint32_t(crow * RSK * 4 + chalf * kc_vec));
  const uint32_t vd0 = pin(smem_addr(ring_w) + uint32_t((16 * RSK + crow * RSV) * 4 + chalf * vc_vec));
  const uint32_t nd0 = pin(smem_addr(ring_w) + uint32_t((16 * (RSK + RSV) + lane) * 4));
  int t_issue = step_t0(0) + crow, issue_slot = 0;  // this lane's token and ring slot at the next issued step
  // paged: the page of the next issued row, read one step ahead (off the issue path)
  int next_page = 0, next_row = 0;
  auto locate = [&](int t) {
    int i;
    page_of(min(t, t_last), p.page_size, p.page_shift, i, next_row);
    next_page = min(max(pages[i], 0), p.num_blocks - 1);  // never outside the cache
  };
  if (paged) locate(t_issue);
  auto issue = [&](int i) {  // step i into ring slot i % NS
    if (i < my_n) {
      const bool ok = t_issue < t_copy_end;
      const char *ks, *vs, *ns;
      if (!paged) {  // rows past the block: clamped (the copy reads nothing for them: zero fill)
        const int t = min(t_issue, t_last);
        ks = kc_base + mul_wide(t, p.kc_rb), vs = vc_base + mul_wide(t, p.vc_rb), ns = n_base + mul_wide(t, n_rb);
      } else {
        const int page = next_page, row = next_row;
        ks = kc_base + mul_wide(page, p.kc_pb) + mul_wide(row, p.kc_rb);
        vs = vc_base + mul_wide(page, p.vc_pb) + mul_wide(row, p.vc_rb);
        ns = n_base + mul_wide(page, chalf == 0 ? p.kn_pb : p.vn_pb) + mul_wide(row, n_rb);
        locate(t_issue + W * 16);
      }
      t_issue += W * 16;
      const uint32_t slot = uint32_t(issue_slot * S::kStepBytes);
      issue_slot = issue_slot + 1 == NS ? 0 : issue_slot + 1;
      copy_code_row<S::PWK>(kd0 + slot, ks, ok, chalf, kc_vec);
      copy_code_row<S::PWV>(vd0 + slot, vs, ok, chalf, vc_vec);
      cp_async<4>(nd0 + slot, ns, ok);
    }
    cp_async_commit();  // one group per step (empty past the end)
  };
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) issue(i);  // the ring fills while the tables and q are prepared

#pragma unroll
  for (int k = 0; k < QR; ++k) {
    const int r = warp + k * W;
    if (r < 8) {
      if (r < blk.R && p.k_sign != nullptr) rotate_warp<D>(q_row[k], k_sign, p.q_factor, false);  // q_rot = scale Pi_K q
#pragma unroll
      for (int j = 0; j < D / 32; ++j)
        qs[r * S::kQRow + lane + 32 * j] = __half_as_ushort(__float2half_rn(q_row[k][j] * kLog2eF));
    }
  }
  AURA_PHASE(2);
  fill_half_table<KB, TP::kRow, W * 32>(table_k, p.k_cb);
  fill_half_table<VB, TP::kRow, W * 32, S::kPairV>(table_v, p.v_cb);
  __syncthreads();  // the last CTA barrier before the end: tables and q visible to every warp
  AURA_PHASE(3);
  if (!plan_p1_tokens<D>(p, blk, W * 32, seq_len)) {  // CTA-uniform
    cp_async_wait<0>();  // the speculative copies land before the shared memory is handed on
    return;
  }
  my_n = steps_of(blk.t_end), t_copy_end = blk.t_end;

  // q's B fragments: k-step kk takes pairs 2kk, 2kk+1 of lane quarter c4 of row g4
  const uint32_t* q_quarter = reinterpret_cast<const uint32_t*>(qs + g4 * S::kQRow + c4 * (D / 4));
  uint32_t qf[S::kQInRegs ? NQ : 1];
  if constexpr (S::kQInRegs) {
#pragma unroll
    for (int j = 0; j < NQ; j += 2) {
      const uint2 v = *reinterpret_cast<const uint2*>(q_quarter + j);
      qf[j] = v.x, qf[j + 1] = v.y;
    }
  }
  // Visible-token limit of this lane's two columns (rows 2 c4 + e): causal rows see t <= T - L + i;
  // columns past R see nothing.
  int lim[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int r = 2 * c4 + e;
    lim[e] = r < blk.R ? min(blk.t_end, blk.last_visible(p, r) + 1) : blk.t0;
  }
  const uint32_t lk = HalfTable<KB>::lane_offset(lane), lv = HalfTable<VB>::lane_offset(lane);
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, o[D / 16][4];
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;

  for (int i = 0, read_slot = 0; i < my_n; ++i) {
    __syncwarp();  // every lane is done reading the slot the next copy overwrites
    issue(i + NS - 1);
    cp_async_wait<NS - 1>();  // step i's group has landed (for this lane) ...
    __syncwarp();             // ... and for the whole warp
    const uint32_t* kc = reinterpret_cast<const uint32_t*>(ring_w + size_t(read_slot) * S::kStepBytes);
    read_slot = read_slot + 1 == NS ? 0 : read_slot + 1;
    const uint32_t* vc = kc + 16 * RSK;
    const float* kn = reinterpret_cast<const float*>(vc + 16 * RSV);
    const float* vn = kn + 16;

    // QK, two accumulator chains; rows of S^T: tokens g4 (s[.][0..1]) and g4 + 8 (s[.][2..3])
    float s[2][4] = {};
    for_each_quad<D, KB, RSK, TP::kRow>(kc, table_k, lk, g4, c4, [&](int kk, uint2 ql, uint2 qh) {
      const uint32_t a[4] = {ql.x, qh.x, ql.y, qh.y};  // tokens g4 / g4 + 8, k 2c4 (pair 2kk) / 2c4 + 8 (2kk + 1)
      uint32_t b0, b1;
      if constexpr (S::kQInRegs) {
        b0 = qf[2 * kk], b1 = qf[2 * kk + 1];
      } else {
        const uint2 v = *reinterpret_cast<const uint2*>(q_quarter + 2 * kk);
        b0 = v.x, b1 = v.y;
      }
      mma_16816<__half>(s[kk & 1], a, b0, b1);
    });
    // softmax over each column (log2 units), logits scaled by the keys' norms
    const int t_lo = step_t0(i) + g4, t_hi = t_lo + 8;
    const float nk_lo = kn[g4], nk_hi = kn[g4 + 8];
    float x[4];
    x[0] = t_lo < lim[0] ? (s[0][0] + s[1][0]) * nk_lo : -INFINITY;
    x[1] = t_lo < lim[1] ? (s[0][1] + s[1][1]) * nk_lo : -INFINITY;
    x[2] = t_hi < lim[0] ? (s[0][2] + s[1][2]) * nk_hi : -INFINITY;
    x[3] = t_hi < lim[1] ? (s[0][3] + s[1][3]) * nk_hi : -INFINITY;
    float pr[4], alpha[2];
    const bool grew = online_softmax_tile(x, m_run, l_run, pr, alpha);
    // P^T (times the values' norms; l sums plain p) as the B operand, transposed in registers
    const float nv_lo = t_lo < blk.t_end ? vn[g4] : 0.f, nv_hi = t_hi < blk.t_end ? vn[g4 + 8] : 0.f;
    const uint32_t pb0 = movmatrix_trans(pack2<__half>(pr[0] * nv_lo, pr[1] * nv_lo));  // tokens 0-7
    const uint32_t pb1 = movmatrix_trans(pack2<__half>(pr[2] * nv_hi, pr[3] * nv_hi));  // tokens 8-15
    if (__any_sync(0xffffffffu, grew)) {  // rescale only when some running max moved
#pragma unroll
      for (int mt = 0; mt < D / 16; ++mt) {
        o[mt][0] *= alpha[0], o[mt][1] *= alpha[1];
        o[mt][2] *= alpha[0], o[mt][3] *= alpha[1];
      }
    }
    if constexpr (S::kPairV) {  // PV: A fragments straight from token-pair lookups
      for_each_pv_tile<D, VB, RSV, TP::kRow>(vc, table_v, lv, g4, c4,
                                             [&](int mt, const uint32_t(&a)[4]) { mma_16816<__half>(o[mt], a, pb0, pb1); });
    } else {
      // PV: m-tile mt's A operand is the transpose of four 8x8 blocks [tokens x dims] looked up in the
      // natural layout: rows 0-7 of the tile <- quarter pair 2mt, rows 8-15 <- pair 2mt + 1
      for_each_quad<D, VB, RSV, TP::kRow>(vc, table_v, lv, g4, c4, [&](int mt, uint2 ql, uint2 qh) {
        const uint32_t a[4] = {movmatrix_trans(ql.x), movmatrix_trans(ql.y), movmatrix_trans(qh.x), movmatrix_trans(qh.y)};
        mma_16816<__half>(o[mt], a, pb0, pb1);
      });
    }
  }
  AURA_PHASE(4);
  cp_async_wait<0>();  // only empty groups remain; drain before the shared memory is reused
  grid_dependents_launch();  // pass 2 (a programmatic dependent launch) may start its prologue

  // ---- merge the warps' states into the block's partial (unnormalised o, m in natural log, l)
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 4);
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 8);
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 16);
  }
  __syncthreads();  // every warp is done with the ring and the tables
  static_assert(block_merge_conflict_free<D, S::kPairV>(), "end-of-block merge layout");
  float* ow = reinterpret_cast<float*>(smem);  // [W][8][D], dims swizzled (merge_swizzle)
  const WarpStates<W, 8> st{ow + W * 8 * D, ow + W * 8 * D + W * 8, ow + W * 8 * D + 2 * W * 8};  // [W][8] each
  if (g4 == 0) {
#pragma unroll
    for (int e = 0; e < 2; ++e) st.m[warp * 8 + 2 * c4 + e] = m_run[e], st.l[warp * 8 + 2 * c4 + e] = l_run[e];
  }
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = 2 * c4 + (c & 1);
      ow[(warp * 8 + r) * D + merge_swizzle<D, S::kPairV>(r, merge_dim<D, S::kPairV>(g4, mt, c))] = o[mt][c];
    }
  __syncthreads();
  AURA_PHASE(5);
  st.weigh();
  __syncthreads();
  for (int idx = threadIdx.x; idx < blk.R * D; idx += W * 32) {
    const int r = idx / D, d = idx % D;
    float acc = 0.f;
#pragma unroll
    for (int wi = 0; wi < W; ++wi) acc += st.weight(wi, r) * ow[(wi * 8 + r) * D + merge_swizzle<D, S::kPairV>(r, d)];
    p.o[blk.out_row(p, r) * D + d] = acc;
  }
  for (int r = threadIdx.x; r < blk.R; r += W * 32) {
    p.m[blk.out_row(p, r)] = st.row_max(r) * kLn2F;  // -inf stays -inf for a row that saw nothing
    p.l[blk.out_row(p, r)] = st.row_sum(r);
  }
  AURA_PHASE(6);
}

// Host side of pass 1: the instantiation for run-time (D, key bits, value bits, query precision). The
// 128 instantiations are spread over aura_p1_d{64,128,256,512}.cu so they compile in parallel.
struct P1Kernel {
  void (*fn)(AuraP1Params);
  size_t smem;
  int threads;
  int ctas_per_sm;
  bool warp_split;  // the fp16 tensor-core kernel: one CTA per SM, split to fill one wave
};

// WARP: the warp-split kernel for fp16 / bf16 queries; otherwise the exact (fp32-query) kernel.
template <int D, int KB, int VB, bool WARP>
P1Kernel p1_kernel_of(int device) {
  // Dynamic shared memory above 48 KB and the occupancy, once per (instantiation, device): attribute
  // calls are not stream work, so they are legal during graph capture as well.
  static int ctas[64] = {};
  constexpr auto fn = WARP ? aura_flash_p1_warp_kernel<D, KB, VB> : aura_flash_p1_kernel<D, KB, VB>;
  constexpr size_t smem = WARP ? WarpP1Shape<D, KB, VB>::kSmem : P1Config<D, KB, VB>::kBytes;
  constexpr int threads = WARP ? WarpP1Shape<D, KB, VB>::kWarps * 32 : kAuraThreads;
  if (device >= 64 || ctas[device] == 0) {
    AURA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) == cudaSuccess,
               "aura_flash_p1: cudaFuncSetAttribute failed for ", smem, " bytes of shared memory");
    int n = 0;
    AURA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, threads, smem) == cudaSuccess,
               "aura_flash_p1: occupancy query failed");
    n = std::max(n, 1);
    if (device < 64) ctas[device] = n;
    return {fn, smem, threads, n, WARP};
  }
  return {fn, smem, threads, ctas[device], WARP};
}

// The bit widths and head dims the kernels are instantiated for (csrc/generated/limits.h).
template <typename F>
void with_bits(int64_t bits, F&& f) { with_one_of<AURA_LIMITS_AURA_BITS>(bits, "bits", AURA_LIMITS_AURA_BITS_TEXT, f); }
template <typename F>
void with_dim(int64_t D, F&& f) {
  with_one_of<AURA_LIMITS_AURA_HEAD_DIMS>(D, "head_dim", AURA_LIMITS_AURA_HEAD_DIMS_TEXT, f);
}

template <int D>
P1Kernel p1_kernel_for_dim(int64_t kb, int64_t vb, bool warp, int device);  // defined in aura_p1_d<D>.cu

#define AURA_DEFINE_P1_FOR_DIM(DIM)                                                                    \
  template <>                                                                                          \
  P1Kernel p1_kernel_for_dim<DIM>(int64_t kb, int64_t vb, bool warp, int device) {                     \
    P1Kernel k{};                                                                                      \
    with_bits(kb, [&](auto kbits) {                                                                    \
      with_bits(vb, [&](auto vbits) {                                                                  \
        constexpr int KB = decltype(kbits)::value, VB = decltype(vbits)::value;                        \
        k = warp ? p1_kernel_of<DIM, KB, VB, true>(device) : p1_kernel_of<DIM, KB, VB, false>(device); \
      });                                                                                              \
    });                                                                                                \
    return k;                                                                                          \
  }

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

// One warp per (b, (i,) h) row, lane l holding dims l + 32 i (the butterfly's mapping). Latency-bound,
// so it counts round trips: the first group's partial rows load with the first round's m and l
// (aura-format.md §13), and the row's addresses are worked out before waiting on pass 1.
// Blocks with l > 0 only (a NaN l compares false): an empty block's partial may be stale or
// poisoned, so it is dropped by a select, never multiplied by 0.
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
