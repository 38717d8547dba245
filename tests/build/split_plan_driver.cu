// Prints the CUDA launcher's automatic split count (decode.cuh: decode_auto_splits) for each line of
// "sms batch kv_heads head_dim page_size capacity" on stdin (page_size 0: contiguous), so
// tests/build/test_cuda_compile.py can hold it to the reference plan without a GPU.
#include "cuda/decode.cuh"

#include <cstdio>

int main() {
  int sms, batch, kv_heads, head_dim, page_size, capacity;
  while (std::scanf("%d %d %d %d %d %d", &sms, &batch, &kv_heads, &head_dim, &page_size, &capacity) == 6)
    std::printf("%d\n", aura::decode_auto_splits(batch, kv_heads, sms, head_dim, page_size, capacity,
                                                 page_size > 0 ? page_size : aura::kContiguousTile));
  return 0;
}
