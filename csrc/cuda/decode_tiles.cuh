// Tile copies of K and V for the tensor-core kernels: 16-token x 64-dim TMA boxes through tensor maps
// (docs/decode.md §3), encoded on the host.
#pragma once

#include "decode_plan.cuh"

#include <cudaTypedefs.h>  // CUtensorMap, PFN_cuTensorMapEncodeTiled (driver entry point: no libcuda link)

namespace aura {

// A K or V tile is [D / 64][16 rows][64] elements, the 16-byte unit u of row r at u ^ (r % 8) (the 128-byte
// swizzle): an ldmatrix's 8 rows hit 8 bank groups without padding (decode.md §3).
struct TileMaps {  // (CUtensorMap carries its own 64-byte alignment)
  CUtensorMap k, v;
};
__host__ __device__ constexpr int tile_off(int r, int c) {  // element offset of (row r, dim c) in a tile
  return (c >> 6) * (16 * 64) + r * 64 + ((((c >> 3) & 7) ^ (r & 7)) << 3) + (c & 7);
}

// The K and V maps of a 16-bit cache, 4-D with 16-token x 64-dim boxes: contiguous as (D, T_cap, Hkv, B),
// paged as (D, Hkv, page_size, num_blocks). False where the layout or the driver refuses.
inline bool make_tile_maps(const DecodeParams& p, bool bf16, int D, TileMaps& maps) {
  if (!tile_copies_fit(D, p.block_table != nullptr ? p.page_size : 0)) return false;
  const bool paged = p.block_table != nullptr;
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return false;
  auto one = [&](CUtensorMap& m, const void* base, int64_t s0, int64_t s1, int64_t s2) {
    for (int64_t st : {s0, s1, s2})
      if (st <= 0 || (st * 2) % 16 != 0 || st * 2 >= (int64_t(1) << 40)) return false;
    const cuuint64_t dims_c[4] = {cuuint64_t(D), cuuint64_t(p.capacity), cuuint64_t(p.Hkv), cuuint64_t(p.B)};
    const cuuint64_t dims_p[4] = {cuuint64_t(D), cuuint64_t(p.Hkv), cuuint64_t(p.page_size), cuuint64_t(p.num_blocks)};
    // byte strides of dims 1-3: contiguous (t, h, b) = (s2, s1, s0); paged (h, row, block) = (s2, s1, s0)
    const cuuint64_t strides[3] = {cuuint64_t(s2 * 2), cuuint64_t(s1 * 2), cuuint64_t(s0 * 2)};
    const cuuint32_t box_c[4] = {64, 16, 1, 1}, box_p[4] = {64, 1, 16, 1}, unit[4] = {1, 1, 1, 1};
    const cuuint64_t* dims = paged ? dims_p : dims_c;
    const cuuint32_t* box = paged ? box_p : box_c;
    return encode(&m, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                  const_cast<void*>(base), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;  // rows past T_cap land as zeros
  };
  return p.capacity > 0 && (!paged || p.num_blocks > 0) && one(maps.k, p.k, p.k_s0, p.k_s1, p.k_s2) &&
         one(maps.v, p.v, p.v_s0, p.v_s1, p.v_s2);
}

// Zeroes rows [n_rows, 16) of a swizzled 16-token V tile, dims [dim0, dim0 + DIMS): past the split's end
// they hold other tokens (or NaN), and P = 0 must meet finite V. The calling warp's lanes share the work.
template <int DIMS, typename T>
__device__ __forceinline__ void zero_tile_rows(T* vt, int n_rows, int dim0, int lane) {
  for (int idx = lane; idx < (16 - n_rows) * (DIMS / 8); idx += 32) {
    const int r = n_rows + idx / (DIMS / 8), c = dim0 + (idx % (DIMS / 8)) * 8;
    *reinterpret_cast<uint4*>(vt + tile_off(r, c)) = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace aura
