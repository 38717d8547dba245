// Pass 1's host-side dispatch: the kernel instance for run-time (D, key bits, value bits, query dtype).
#pragma once

#include "aura_pass1_exact.cuh"
#include "aura_pass1_warp.cuh"

namespace aura {

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

}  // namespace aura
