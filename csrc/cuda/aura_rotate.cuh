// The signed Walsh-Hadamard rotation (docs/aura-format.md §2), one warp per vector, in the reference's
// butterfly order (bitwise equal), and the hadamard_rotate kernel.
#pragma once

#include "aura_common.cuh"

namespace aura {

// Butterfly stages (a, b) -> (a + b, a - b) across lanes (stride h) and inside a lane. Across lanes, one
// FMA by -1 or +1 rounds exactly as the subtraction or addition, and is cheaper than a select
// (aura-format.md §13).
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

}  // namespace aura
