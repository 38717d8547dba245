// The argument block of aura_cpu_flash_p1 (aura.cpp), the one C++ definition of it. Python passes it
// through ctypes as torch_aura/cpu/native.py's _P1Args, which cannot include this header:
// tests/build/test_pass1_struct.py checks that the two agree field for field (names, types, order,
// offsets), so change both together.
#pragma once

#include <cstdint>

namespace aura_cpu {

struct P1Args {
  const float* q;  // [B, L, Hq, D] contiguous fp32, already rotated and scaled
  const uint8_t* k_codes;
  const uint8_t* v_codes;
  const float* k_norms;
  const float* v_norms;
  int64_t k_code_stride[3], v_code_stride[3];  // bytes: contiguous (b, h, t) | paged (page, row, h)
  int64_t k_norm_stride[3], v_norm_stride[3];  // floats, same roles
  const int32_t* seq_lens;  // [B] contiguous
  const int32_t* block_table;  // [B, max_pages] or null (contiguous cache)
  int64_t bt_stride[2];
  const float* k_codebook;
  const float* v_codebook;
  int64_t key_bits, value_bits;
  int64_t B, L, Hq, Hkv, D, capacity, page_size, block_size, num_blocks;
  float* o;  // [B, L, Hq, NB, D]
  float* m;  // [B, L, Hq, NB]
  float* l;
  int64_t threads;
};

}  // namespace aura_cpu
