// Test-only kernels that check the emulator itself (tests/interp/metal/test_emulator.py): that
// it exposes missing barriers, divergent collectives and over-limit threadgroup memory, and that
// its collectives, simdgroup matrices and half/bfloat rounding mean what Metal says they mean.
#include "aura_compat.h"

// Each thread publishes its index, then reads its neighbour's. Without the barrier the result
// depends on the order threads run in (and on NaN poison): the emulator must show it.
template <bool kBarrier>
kernel void selftest_neighbour(device uint* out [[buffer(0)]],
                               uint tid [[thread_index_in_threadgroup]],
                               uint n [[threads_per_threadgroup]]) {
  AURA_TG(uint, tg, 256);
  tg[tid] = tid;
  if (kBarrier) threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = tg[(tid + 1) % n];
}
AURA_INSTANTIATE("selftest_neighbour_racy", selftest_neighbour, false)
AURA_INSTANTIATE("selftest_neighbour_synced", selftest_neighbour, true)

// Threads of one group at two different barriers: an error naming both lines.
kernel void selftest_split_barrier(device uint* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
  if (tid < 16) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  } else {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  out[tid] = tid;
}
AURA_REGISTER(selftest_split_barrier)

// Returning before a barrier is legal: returned threads no longer take part.
kernel void selftest_early_return(device uint* out [[buffer(0)]],
                                  constant uint& live [[buffer(1)]],
                                  uint tid [[thread_index_in_threadgroup]]) {
  AURA_TG(uint, tg, 64);
  if (tid >= live) return;
  tg[tid] = tid * 10;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = tg[live - 1 - tid];
}
AURA_REGISTER(selftest_early_return)

// A collective reached by only some live lanes of a SIMD group (the others wait at the next one):
// an error, since the emulator cannot know the hardware's active mask inside the branch.
kernel void selftest_divergent_sum(device float* out [[buffer(0)]], uint lane [[thread_index_in_simdgroup]]) {
  float x = float(lane);
  if (lane < 8) x = simd_sum(x);
  out[lane] = simd_max(x);
}
AURA_REGISTER(selftest_divergent_sum)

// 40 KiB of threadgroup memory: over Metal's 32 KiB.
kernel void selftest_too_much_threadgroup_memory(device float* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
  AURA_TG(float, big, 10240);
  big[tid] = 1.0f;
  out[tid] = big[tid];
}
AURA_REGISTER(selftest_too_much_threadgroup_memory)

// Every SIMD-group function on one input; out[f * n + tid] holds function f's result.
kernel void selftest_collectives(device const float* x [[buffer(0)]],
                                 device float* out [[buffer(1)]],
                                 uint tid [[thread_index_in_threadgroup]],
                                 uint n [[threads_per_threadgroup]],
                                 uint lane [[thread_index_in_simdgroup]]) {
  const float v = x[tid];
  out[0 * n + tid] = simd_sum(v);
  out[1 * n + tid] = simd_max(v);
  out[2 * n + tid] = simd_min(v);
  out[3 * n + tid] = simd_prefix_exclusive_sum(v);
  out[4 * n + tid] = simd_prefix_inclusive_sum(v);
  out[5 * n + tid] = simd_shuffle_down(v, ushort(3));
  out[6 * n + tid] = simd_shuffle_up(v, ushort(5));
  out[7 * n + tid] = simd_shuffle_xor(v, ushort(6));
  out[8 * n + tid] = simd_broadcast(v, ushort(2));
  out[9 * n + tid] = simd_shuffle(v, ushort((lane * 7) % 16));
  out[10 * n + tid] = float(ulong(simd_ballot(v > 0.0f)) & 0xFFFFFFFFul);
  out[11 * n + tid] = simd_any(v > 2.5f) ? 1.0f : 0.0f;
  out[12 * n + tid] = simd_all(v > -100.0f) ? 1.0f : 0.0f;
  out[13 * n + tid] = simd_shuffle_rotate_down(v, ushort(1));
}
AURA_REGISTER(selftest_collectives)

// D = A * B + C with 8x8 simdgroup matrices; A read transposed when `transpose` is set.
template <typename T>
kernel void selftest_mma(device const T* a [[buffer(0)]],
                         device const T* b [[buffer(1)]],
                         device const float* c [[buffer(2)]],
                         device float* d [[buffer(3)]],
                         constant uint& transpose [[buffer(4)]]) {
  AURA_TG(T, tg_b, 64);
  simdgroup_matrix<T, 8, 8> ma, mb;
  simdgroup_matrix<float, 8, 8> mc, md;
  simdgroup_load(ma, a, 8, ulong2{0, 0}, transpose != 0);
  simdgroup_load(mb, b, 8);
  // copy b through threadgroup memory and load it back: the threadgroup address space path
  simdgroup_store(mb, &tg_b[0], 8);
  simdgroup_barrier(mem_flags::mem_threadgroup);
  simdgroup_load(mb, &tg_b[0], 8);
  simdgroup_load(mc, c, 8);
  simdgroup_multiply_accumulate(md, ma, mb, mc);
  simdgroup_store(md, d, 8);
}
AURA_INSTANTIATE("selftest_mma_f32", selftest_mma, float)
AURA_INSTANTIATE("selftest_mma_f16", selftest_mma, half)
AURA_INSTANTIATE("selftest_mma_bf16", selftest_mma, bfloat)

// Conversions and one rounded operation per element: to_half[i] = half(x[i]),
// to_bf16[i] = bfloat(x[i]), half_mul[i] = half(x[i]) * half(y[i]) (rounded once, in half).
kernel void selftest_rounding(device const float* x [[buffer(0)]],
                              device const float* y [[buffer(1)]],
                              device half* to_half [[buffer(2)]],
                              device bfloat* to_bf16 [[buffer(3)]],
                              device half* half_mul [[buffer(4)]],
                              device bfloat* bf16_add [[buffer(5)]],
                              uint i [[thread_position_in_grid]]) {
  to_half[i] = half(x[i]);
  to_bf16[i] = bfloat(x[i]);
  half_mul[i] = half(x[i]) * half(y[i]);
  bf16_add[i] = bfloat(x[i]) + bfloat(y[i]);
}
AURA_REGISTER(selftest_rounding)

// y[i] = x[i + shift]: with shift > 0 the last threads read past the end of x.
kernel void selftest_shifted_copy(device const float* x [[buffer(0)]],
                                  device float* y [[buffer(1)]],
                                  constant uint& shift [[buffer(2)]],
                                  uint i [[thread_position_in_grid]]) {
  y[i] = x[i + shift];
}
AURA_REGISTER(selftest_shifted_copy)

// Every thread loops to its own trip count with a barrier inside: at the same line the threads
// meet in different iterations, which the GPU does not promise to survive.
kernel void selftest_divergent_trip_count(device uint* out [[buffer(0)]], uint tid [[thread_index_in_threadgroup]]) {
  const uint trips = 2 + tid % 2;  // even threads twice, odd ones three times
  uint i = 0;
  for (; i < trips; ++i) threadgroup_barrier(mem_flags::mem_threadgroup);
  out[tid] = i;
}
AURA_REGISTER(selftest_divergent_trip_count)
