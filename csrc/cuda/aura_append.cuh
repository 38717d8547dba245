// aura_append (ops.md §2, docs/aura-format.md §7): one launch per cache write. Token i of row b is
// encoded into position seq_lens[b] + i of the K and V caches (contiguous or paged), then seq_lens[b]
// advances by L. One CTA per sequence row: it reads seq_lens[b], encodes and stores the row's L x Hkv K
// and V vectors (encode_chunk, the very device code of aura_encode / aura_write_cache, so the bits are the
// same), and after a __syncthreads advances seq_lens[b]. No other CTA touches row b, so no grid-wide sync
// and no atomics; nothing is read on the host, so the launch can be captured in a CUDA graph.
#pragma once

#include "aura_codec.cuh"

namespace aura {

// One side (K or V) of an append.
struct AuraAppendSide {
  const void* x;                // [B, L, Hkv, D], unit last stride
  int64_t x_sb, x_sl, x_sh;     // its strides in elements
  int x_vec16;                  // every row starts 16-byte aligned: vector loads
  const float* codebook;        // [2^b]
  const float* boundaries;      // [2^b - 1]
  const uint32_t* mask;         // [D / 32] or nullptr
  uint32_t* codes;              // contiguous [B, Hkv, T_cap, PW] or paged [num_blocks, page_size, Hkv, PW]
  float* norms;                 // codes.shape[:3]
  int codes_vec;                // widest store (16, 8, 4 bytes) the cache rows allow
  int64_t c_s0, c_s1, c_s2;     // codes strides of dims 0, 1, 2
  int64_t n_s0, n_s1, n_s2;     // norms strides
};

struct AuraAppendParams {
  AuraAppendSide k, v;
  FloatKind kind;               // k's and v's dtype
  int* seq_lens;                // [B] int32, read and advanced
  const int* block_table;       // [B, max_blocks] int32 (unit last stride), nullptr: contiguous
  int64_t bt_sb;
  int L, Hkv;                   // L * Hkv < 2^31 (checked on the host): 32-bit row arithmetic
  int capacity;                 // T_cap, or max_blocks * page_size (< 2^31)
  int page_size, num_blocks;
  float factor;                 // 1 / sqrt(D)
};

// Encode and store this CTA's row of one side: rows (i, h) of the L x Hkv vectors, kRowsPerCta at a time.
// Every thread runs the same number of iterations (the loop bound is uniform), so the shuffles inside
// encode_chunk always see whole warps; a row that is not stored (past L * Hkv, a position at or past the
// capacity, a negative position, or a block-table entry that is not a page) only skips the memory ops.
template <int D, int BITS>
__device__ __forceinline__ void append_side(const AuraAppendSide& s, const AuraAppendParams& p, int64_t b, int t0,
                                            const float* cb_s, const float* bd_s) {
  using CR = ChunkRows<D>;
  const int lane = threadIdx.x & 31, c = lane % CR::kLanes;
  const int rows = p.L * p.Hkv;
  for (int base = 0; base < rows; base += CR::kRowsPerCta) {
    const int row = base + (threadIdx.x >> 5) * CR::kRowsPerWarp + lane / CR::kLanes;
    const int i = int(unsigned(row) / unsigned(p.Hkv)), h = row - i * p.Hkv;  // token i of the chunk, KV head h
    const int64_t pos = int64_t(t0) + i;                                      // its position in row b
    bool live = row < rows && pos >= 0 && pos < p.capacity;
    const int t = live ? int(pos) : 0;
    int64_t codes_off = 0, norm_off = 0;
    if (live) {
      if (p.block_table != nullptr) {
        const int q = int(unsigned(t) / unsigned(p.page_size)), r = t - q * p.page_size;
        const int page = p.block_table[b * p.bt_sb + q];
        live = page >= 0 && page < p.num_blocks;  // an unallocated page (-1): never written out of bounds
        codes_off = int64_t(page) * s.c_s0 + int64_t(r) * s.c_s1 + int64_t(h) * s.c_s2;
        norm_off = int64_t(page) * s.n_s0 + int64_t(r) * s.n_s1 + int64_t(h) * s.n_s2;
      } else {
        codes_off = b * s.c_s0 + int64_t(h) * s.c_s1 + int64_t(t) * s.c_s2;
        norm_off = b * s.n_s0 + int64_t(h) * s.n_s1 + int64_t(t) * s.n_s2;
      }
    }
    float v[32];
    if (live) {
      load_chunk(s.x, b * s.x_sb + int64_t(i) * s.x_sl + int64_t(h) * s.x_sh + 32 * c, p.kind, s.x_vec16 != 0, v);
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = 0.f;
    }
    uint32_t words[BITS];
    const float norm = encode_chunk<D, BITS>(v, c, cb_s, bd_s, s.mask, p.factor, words);
    if (live) {
      store_words<BITS>(s.codes + codes_off + c * BITS, words, s.codes_vec);
      if (c == 0) s.norms[norm_off] = norm;
    }
  }
}

// Grid (B), kAuraThreads threads: CTA b owns sequence row b.
template <int D, int KB, int VB>
__global__ void __launch_bounds__(kAuraThreads) aura_append_kernel(const AuraAppendParams p) {
  __shared__ float kcb_s[1 << KB], kbd_s[1 << KB], vcb_s[1 << VB], vbd_s[1 << VB];
  for (int j = threadIdx.x; j < (1 << KB); j += blockDim.x) {
    kcb_s[j] = p.k.codebook[j];
    if (j < (1 << KB) - 1) kbd_s[j] = p.k.boundaries[j];
  }
  for (int j = threadIdx.x; j < (1 << VB); j += blockDim.x) {
    vcb_s[j] = p.v.codebook[j];
    if (j < (1 << VB) - 1) vbd_s[j] = p.v.boundaries[j];
  }
  const int64_t b = blockIdx.x;
  const int t0 = p.seq_lens[b];  // every thread reads it before the barrier below
  __syncthreads();
  append_side<D, KB>(p.k, p, b, t0, kcb_s, kbd_s);
  append_side<D, VB>(p.v, p, b, t0, vcb_s, vbd_s);
  __syncthreads();  // every read of seq_lens[b] is done: advance it (not clamped, as AuraCache.append)
  if (threadIdx.x == 0) p.seq_lens[b] = int(unsigned(t0) + unsigned(p.L));  // wraps like torch's int32 add
}

// Host side: launch the (D, key_bits, value_bits) instantiation on `stream` (defined in aura_append.cu).
void launch_aura_append_kernel(const AuraAppendParams& p, int64_t B, int64_t D, int64_t key_bits, int64_t value_bits,
                               cudaStream_t stream);

}  // namespace aura
