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
  kDecodeMinChunk = 64,  // reference/decode.py MIN_CHUNK: the smallest split
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
  // Memory safety when torch.ops.aura.* is called directly with bad data (the wrapper's checks
  // read no data): lengths are clamped to the capacity and page indices to the pool.
  int capacity, num_blocks;
  int pad_;
};
static_assert(sizeof(DecodeSplitParams) == 13 * 8 + 12 * 4, "DecodeSplitParams layout");

struct MergeParams {
  aura_i64 po_stride[3];   // partial_out s, b, h
  aura_i64 pl_stride[3];   // partial_lse s, b, h
  aura_i64 out_stride[2];  // out b, h
  aura_i64 lse_stride[2];  // lse b, h
  int splits, batch, q_heads, head_dim;
};
static_assert(sizeof(MergeParams) == 10 * 8 + 4 * 4, "MergeParams layout");

// ---------------------------------------------------------------------- Gated DeltaNet (gdn.md)
enum : unsigned {
  kGdnChunk = 64,         // BT: tokens per chunk (reference/gdn.py)
  kGdnMaxHeadDim = 256,   // K, V <= 256 (_checks/gdn.py MAX_HEAD_DIM)
  kGdnStateTile = 16,     // fwd_h and recurrent: value columns per threadgroup
  kGdnOutTile = 32,       // fwd_o and recompute_w_u: output columns per MMA pass
};

// Element strides (batch, token, head) of a head-last [B, T, H, X] tensor; X has unit stride.
struct GdnStrides {
  aura_i64 b, t, h;
};

// One parameter block for every GDN kernel; each reads the fields it needs.
struct GdnParams {
  GdnStrides q, k, v, g, beta, ai, w, u, o;
  aura_i64 h_stride[4];      // h: b, flat chunk, hv, row (state rows are K, or V with state_v_first)
  aura_i64 state_stride[3];  // initial state / state pool: n (or slot), hv, row
  aura_i64 final_stride[3];  // final state: n, hv, row
  int batch, tokens, heads, v_heads, key_dim, value_dim;
  int sequences;      // N: B, or len(cu_seqlens) - 1
  int varlen;         // cu_seqlens given (then batch == 1)
  int cu_is_i64;      // cu_seqlens dtype: int64 read as two little-endian words
  int state_v_first;  // states stored [.., V, K]
  int has_state;      // initial state (fwd_h) given
  int has_indices;    // recurrent: state_indices given
  int use_l2norm;     // recurrent: normalise q and k over K in fp32
  float scale;
  int pool_rows;      // recurrent: state pool rows; an index outside [0, rows) is skipped, never read
  int h_rows;         // fwd_h: rows (flat chunks) of h
};
static_assert(sizeof(GdnParams) == 37 * 8 + 16 * 4, "GdnParams layout");

struct CastParams {
  aura_i64 sizes[4];    // up to 4-D, leading dims padded with 1
  aura_i64 strides[4];
  aura_i64 numel;
};
static_assert(sizeof(CastParams) == 9 * 8, "CastParams layout");

// ------------------------------------------------------ GDN front end: causal conv (ops.md §3b)
enum : unsigned {
  kConvMaxWidth = 8,       // W <= 8 taps (_checks/gdn.py MAX_CONV_WIDTH): a fixed register window
  kConvChannelTile = 128,  // channels per threadgroup, one per thread
  kConvTokenTile = 16,     // tokens per thread; a sequence within one tile shifts its state in place
};

// DType codes (launch_plan.h) of operands read through a runtime switch instead of a template.
enum : int { kConvF32 = 0, kConvF16 = 1, kConvBF16 = 2, kConvAbsent = -1 };

struct ConvParams {
  aura_i64 x_stride[2];      // b, t (channels have unit stride; y is contiguous [B, T, C])
  aura_i64 state_stride[3];  // pool row, channel, entry (any strides: vLLM's pool is [P, S, C])
  aura_i64 weight_stride;    // channel (the W taps have unit stride)
  aura_i64 bias_stride;
  int batch, tokens, channels, width, state_len;
  int sequences;                 // N: B, or len(cu_seqlens) - 1
  int varlen, cu_is_i64;         // as GdnParams
  int weight_dtype, bias_dtype;  // kConv* codes; bias kConvAbsent when None
  int has_state, has_indices;
  int pool_rows;    // state rows; an index outside [0, rows) skips its sequence
  int silu;         // activation "silu" / "swish"
  int tile;         // tokens per thread
  int shift_state;  // 1: each thread holds a whole sequence and shifts its state row itself
};
static_assert(sizeof(ConvParams) == 7 * 8 + 16 * 4, "ConvParams layout");

// ---------------------------------------------------------------- AURA compressed KV (aura-format.md)
enum : unsigned {
  kAuraMaxLeadDims = 6,  // leading dims of a [..., D] tensor addressed by AuraRows
  kAuraP1Simdgroups = 4, // pass 1: simdgroups per (block, KV head, sequence) threadgroup
};

// Row r of a tensor with leading dims `size` (innermost last) starts at sum_d idx_d * stride[d].
struct AuraRows {
  aura_i64 size[kAuraMaxLeadDims];
  aura_i64 stride[kAuraMaxLeadDims];
};

// Rotate, encode / write_cache, dequantize and pass 2: one row (vector of D) per simdgroup.
struct AuraRowParams {
  AuraRows in, out, norms, aux;  // aux: pass 2's l rows (m uses `norms`), lse rows use `out2`
  AuraRows out2;
  aura_i64 rows;
  aura_i64 block_stride[3];     // pass 2: stride over NB of o, m, l
  aura_i64 cache_stride[3];     // write_cache: codes cache dims 0..2
  aura_i64 norms_cache_stride[3];
  aura_i64 slots;               // write_cache: number of valid slots
  int lead_dims, bits, has_mask, inverse;
  int write_mode;               // 0: encode rows; 1: write_cache contiguous; 2: write_cache paged
  int kv_heads, slot_div;       // write_cache: Hkv; T_cap (contiguous) or page_size (paged)
  int blocks;                   // pass 2: NB
  float factor;                 // scale / sqrt(D) of the (inverse) rotation
  int pad_;
};
static_assert(sizeof(AuraRowParams) == (5 * 12 + 1 + 9 + 1) * 8 + 10 * 4, "AuraRowParams layout");

// aura_append's slots dispatch (aura.metal aura_append_slots): one threadgroup per sequence row.
struct AuraAppendParams {
  aura_i64 seq_stride;       // seq_lens
  aura_i64 table_stride[2];  // block_table: row, column
  int tokens;                // L
  int capacity;              // T_cap (contiguous) or max_blocks * page_size (paged), < 2^31
  int paged, page_size;      // paged: slots are page * page_size + offset
  int num_blocks;            // paged: an entry outside [0, num_blocks) is no page (token skipped)
  int pad_;
};
static_assert(sizeof(AuraAppendParams) == 3 * 8 + 6 * 4, "AuraAppendParams layout");

struct AuraP1Params {
  aura_i64 q_stride[3];          // b, (query i), h
  aura_i64 k_stride[3], v_stride[3];      // contiguous: b, h, t; paged: block, slot, h
  aura_i64 kn_stride[3], vn_stride[3];    // norms, same dims
  aura_i64 table_stride;
  aura_i64 o_stride[4];          // o: b, i, h, n (unit last)
  aura_i64 ml_stride[4];         // m and l: b, i, h, n
  int batch, queries, q_heads, kv_heads, group;
  int capacity, block_size, page_size;  // page_size 0 = contiguous
  int key_bits, value_bits;
  int num_blocks;  // paged: page indices are clamped to the pool (memory safety on bad data)
  int pad_;
};
static_assert(sizeof(AuraP1Params) == 24 * 8 + 12 * 4, "AuraP1Params layout");
