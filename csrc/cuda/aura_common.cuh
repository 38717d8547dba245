// What every AURA kernel shares (docs/aura-format.md): the CTA shape, float loads and stores by run-time
// dtype, the row indexer of strided views, the packed code layout, and the host's (D, bits) dispatch.
#pragma once

#include "common.cuh"

namespace aura {

constexpr int kAuraWarps = 4;  // warps per CTA of every AURA kernel
constexpr int kAuraThreads = 32 * kAuraWarps;

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

// -------------------------------------------------------------------------------- bit packing
// N consecutive BITS-bit codes starting at code j of a packed row (LSB first, aura-format.md §6), as one integer
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

// The bit widths and head dims the kernels are instantiated for (csrc/generated/limits.h).
template <typename F>
void with_bits(int64_t bits, F&& f) { with_one_of<AURA_LIMITS_AURA_BITS>(bits, "bits", AURA_LIMITS_AURA_BITS_TEXT, f); }
template <typename F>
void with_dim(int64_t D, F&& f) {
  with_one_of<AURA_LIMITS_AURA_HEAD_DIMS>(D, "head_dim", AURA_LIMITS_AURA_HEAD_DIMS_TEXT, f);
}

}  // namespace aura
