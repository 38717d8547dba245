// aura_append's kernel instantiations (every head dim x key bits x value bits), in a translation unit
// of their own so they compile beside aura.cu; the op (checks, parameters) is aura_append_cuda in aura.cu.
#include "aura_append.cuh"

namespace aura {

void launch_aura_append_kernel(const AuraAppendParams& p, int64_t B, int64_t D, int64_t key_bits, int64_t value_bits,
                               cudaStream_t stream) {
  with_dim(D, [&](auto d) {
    with_bits(key_bits, [&](auto kb) {
      with_bits(value_bits, [&](auto vb) {
        aura_append_kernel<decltype(d)::value, decltype(kb)::value, decltype(vb)::value>
            <<<dim3(unsigned(B)), dim3(kAuraThreads), 0, stream>>>(p);
      });
    });
  });
  check_launch("aura_append kernel");
}

}  // namespace aura
