// Kernel parameter structs, compiled as MSL and as host C++ (the pattern of pytorch/pytorch
// c10/metal/common.h). Only 8-byte fields first, then 4-byte ones, so both compilers agree on the
// layout; the static_asserts pin the sizes. Strides are in elements.
#pragma once

#ifdef __METAL_VERSION__
typedef long aura_i64;
#else
#include <cstdint>
typedef std::int64_t aura_i64;
#endif

// ------------------------------------------------------------------------ decode (decode.md)
enum : unsigned {
  kDecodeSimdgroups = 4,  // simdgroups per split threadgroup; each takes every 4th token
  kDecodeHeadTile = 4,    // query heads of a GQA group processed together (one float4 simd_sum)
  kDecodeMinChunk = 256,  // reference/decode.py MIN_CHUNK: smallest split worth a threadgroup
  kDecodeContiguousTile = 64,  // reference/decode.py CONTIGUOUS_TILE: split granularity
};

struct DecodeSplitParams {
  aura_i64 q_stride[2];    // b, h
  aura_i64 k_stride[3];    // contiguous: b, h, t; paged: block, slot, h
  aura_i64 v_stride[3];
  aura_i64 table_stride;   // block_table row stride
  aura_i64 out_stride[2];  // direct store (one split): out b, h
  aura_i64 lse_stride[2];  //                           lse b, h
  int batch, q_heads, kv_heads, group;  // group = Hq / Hkv
  int splits, tile, page_size;          // page_size 0 = contiguous cache
  int direct;                           // 1: one split, store out/lse; 0: store fp32 partials
  float scale_log2;                     // softmax scale * log2(e): the kernel works in base 2
  int pad_;
};
static_assert(sizeof(DecodeSplitParams) == 13 * 8 + 10 * 4, "DecodeSplitParams layout");

struct MergeParams {
  aura_i64 po_stride[3];   // partial_out s, b, h
  aura_i64 pl_stride[3];   // partial_lse s, b, h
  aura_i64 out_stride[2];  // out b, h
  aura_i64 lse_stride[2];  // lse b, h
  int splits, batch, q_heads, head_dim;
};
static_assert(sizeof(MergeParams) == 10 * 8 + 4 * 4, "MergeParams layout");
