// Pass 1 for fp16 / bf16 queries: the warp-split kernel (docs/decode.md §3; docs/aura-format.md §13).
// One file of ~600 lines: its table, lookup, copy and merge layouts serve this kernel alone and change together.
#pragma once

#include "aura_pass1_plan.cuh"
#include "aura_rotate.cuh"

namespace aura {

// Lane (g, c) takes its k values from its own quarter of the row, so it reads one contiguous run of
// packed bits; O's rows come out permuted and the epilogue knows the map (aura-format.md §13).

// fp16 codebook table: an entry per quad (b = 2), pair (b = 3, 4) or code (b = 8), copied across a
// 128-byte bank row so random codes never collide on a bank (layouts: aura-format.md §13).
template <int BITS>
struct HalfTable {
  static constexpr int kIndexBits = BITS == 2 ? 8 : BITS <= 4 ? 2 * BITS : BITS;
  static constexpr int kEntryBytes = BITS == 2 ? 8 : 4;
  static constexpr size_t kBytes = size_t(128) << kIndexBits;
  __device__ static uint32_t lane_offset(int lane) { return uint32_t(lane % (128 / kEntryBytes)) * kEntryBytes; }
};

// Where pass 1's two tables live: interleaved 256-byte rows when both are byte-indexed, else apart.
template <int KB, int VB>
struct TablePair {
  static constexpr bool kInterleaved = HalfTable<KB>::kIndexBits == 8 && HalfTable<VB>::kIndexBits == 8;
  static constexpr int kRow = kInterleaved ? 256 : 128;  // bytes from one entry to the next
  static constexpr size_t kV = kInterleaved ? 128 : HalfTable<KB>::kBytes;  // the V table's base
  static constexpr size_t kBytes = kInterleaved ? size_t(256) * 256 : HalfTable<KB>::kBytes + HalfTable<VB>::kBytes;
};

// Fill from the codebook, entries ROW bytes apart, 16 bytes of copies per store; unrolled over a
// compile-time thread count NT so loads and stores take immediate offsets. TOKEN_PAIRS: the 2-bit
// token-pair entries for_each_pv_tile reads.
template <int BITS, int ROW, int NT, bool TOKEN_PAIRS = false>
__device__ __forceinline__ void fill_half_table(unsigned char* table, const float* cb) {
  using HT = HalfTable<BITS>;
  constexpr int STORES = 128 / 16;  // 16-byte stores per entry's 128 bytes of copies
  constexpr int TOTAL = STORES << HT::kIndexBits;
  constexpr uint32_t M = (1u << BITS) - 1u;
  auto c = [&](uint32_t i) { return __ldg(cb + i); };
#pragma unroll
  for (int k = 0; k < (TOTAL + NT - 1) / NT; ++k) {
    const int i = threadIdx.x + k * NT;
    if (TOTAL % NT != 0 && i >= TOTAL) break;
    const uint32_t e = uint32_t(i) / STORES;
    uint4* dst = reinterpret_cast<uint4*>(table + size_t(e) * ROW) + i % STORES;
    if constexpr (BITS == 2 && TOKEN_PAIRS) {  // {half2(dim d: a, b), half2(dim d + 1: a, b)}
      const uint32_t lo = pack2<__half>(c(e & M), c((e >> 4) & M)), hi = pack2<__half>(c((e >> 2) & M), c(e >> 6));
      *dst = make_uint4(lo, hi, lo, hi);
    } else if constexpr (BITS == 2) {  // 8-byte entries: two copies per store
      const uint32_t lo = pack2<__half>(c(e & M), c((e >> 2) & M)), hi = pack2<__half>(c((e >> 4) & M), c(e >> 6));
      *dst = make_uint4(lo, hi, lo, hi);
    } else {
      const uint32_t v = BITS <= 4 ? pack2<__half>(c(e & M), c(e >> BITS)) : __half_as_ushort(__float2half_rn(c(e)));
      *dst = make_uint4(v, v, v, v);
    }
  }
}

// The F-bit field at bit `bit` of w as a table byte offset (index << 7). `bit` is a compile-time
// constant after unrolling: one shift (a funnel shift for 3-bit pairs that straddle words) and a mask.
template <int F, int N>
__device__ __forceinline__ uint32_t field_offset(const uint32_t (&w)[N], int bit) {
  const int i = bit >> 5, sh = bit & 31;
  uint32_t x;
  if (sh + F > 32 && i + 1 < N) x = __funnelshift_r(w[i], w[i + 1], sh - 7);  // sh > 32 - F >= 7 here
  else if (sh >= 7) x = w[i] >> (sh - 7);
  else x = w[i] << (7 - sh);
  return x & (((1u << F) - 1u) << 7);
}

// Byte offset of the entry whose F-bit index sits at bit `bit` of w, plus the lane's copy offset: one
// byte permute for 256-byte rows, else shift, mask and OR.
template <int F, int ROW, int N>
__device__ __forceinline__ uint32_t entry_offset(const uint32_t (&w)[N], int bit, uint32_t lane_off) {
  if constexpr (ROW == 256) {
    static_assert(F == 8, "256-byte rows take byte-aligned 8-bit indices");
    return __byte_perm(w[bit >> 5], lane_off, 0x5504u | (uint32_t((bit & 31) >> 3) << 4));
  } else {
    return field_offset<F>(w, bit) | lane_off;
  }
}

__device__ __forceinline__ uint32_t lds32(const unsigned char* table, uint32_t off) {
  return *reinterpret_cast<const uint32_t*>(table + off);
}

// {half2(c0, c1), half2(c2, c3)} of the four codes at bit `bit` of w (code c0 lowest).
template <int BITS, int ROW, int N>
__device__ __forceinline__ uint2 quad_halves(const unsigned char* table, uint32_t lane_off, const uint32_t (&w)[N],
                                             int bit) {
  if constexpr (BITS == 2) {
    return *reinterpret_cast<const uint2*>(table + entry_offset<8, ROW>(w, bit, lane_off));
  } else if constexpr (BITS <= 4) {
    return make_uint2(lds32(table, entry_offset<2 * BITS, ROW>(w, bit, lane_off)),
                      lds32(table, entry_offset<2 * BITS, ROW>(w, bit + 2 * BITS, lane_off)));
  } else {
    const uint32_t c0 = lds32(table, entry_offset<8, ROW>(w, bit, lane_off));
    const uint32_t c1 = lds32(table, entry_offset<8, ROW>(w, bit + 8, lane_off));
    const uint32_t c2 = lds32(table, entry_offset<8, ROW>(w, bit + 16, lane_off));
    const uint32_t c3 = lds32(table, entry_offset<8, ROW>(w, bit + 24, lane_off));
    return make_uint2(__byte_perm(c0, c1, 0x5410), __byte_perm(c2, c3, 0x5410));
  }
}

// A lane's quarter of a staged code row, read in groups of whole k-steps (4 codes each) so at most
// 4 words per row (6 for 3-bit codes) are live at a time.
template <int D, int BITS>
struct Quarter {
  static constexpr int kBits = D * BITS / 4;
  static constexpr int kWords = (kBits + 31) / 32;
  static constexpr bool kAligned = kBits % 32 == 0;  // all but D = 64, b = 3 (48-bit quarters)
  static constexpr int kGroupWords = !kAligned ? kWords : std::min(kWords, BITS == 3 ? 6 : 4);
  static constexpr int kGroups = kWords / kGroupWords;
  static constexpr int kStepsPerGroup = (kAligned ? kGroupWords * 32 : kBits) / (4 * BITS);
  static_assert(kGroups * kGroupWords == kWords && kGroups * kStepsPerGroup == D / 16, "quarter groups");
};

// Words [g GW, (g + 1) GW) of lane quarter c of a staged row (16-byte loads where the sizes allow).
template <int D, int BITS>
__device__ __forceinline__ void load_quarter(const uint32_t* row, int c, int g,
                                             uint32_t (&w)[Quarter<D, BITS>::kGroupWords]) {
  using Q = Quarter<D, BITS>;
  constexpr int GW = Q::kGroupWords;
  if constexpr (!Q::kAligned) {  // 48 bits from bit 48c: two words from word 3c/2, shifted by 0 or 16
    const uint32_t* src = row + (3 * c) / 2;
    const int sh = 16 * (c & 1);
    const uint32_t w0 = src[0], w1 = src[1];
    w[0] = __funnelshift_r(w0, w1, sh);
    w[1] = w1 >> sh;
  } else {
    const uint32_t* src = row + c * Q::kWords + g * GW;
    if constexpr (GW % 4 == 0) {
#pragma unroll
      for (int i = 0; i < GW; i += 4) {
        const uint4 v = *reinterpret_cast<const uint4*>(src + i);
        w[i] = v.x, w[i + 1] = v.y, w[i + 2] = v.z, w[i + 3] = v.w;
      }
    } else if constexpr (GW % 2 == 0) {
#pragma unroll
      for (int i = 0; i < GW; i += 2) {
        const uint2 v = *reinterpret_cast<const uint2*>(src + i);
        w[i] = v.x, w[i + 1] = v.y;
      }
    } else {
#pragma unroll
      for (int i = 0; i < GW; ++i) w[i] = src[i];
    }
  }
}

// For each k-step j < D / 16 of a staged 16-row code tile (row stride RS words): f(j, quad of row g4,
// quad of row g4 + 8), this lane's quarter c4 of each row. Shared by QK (K rows) and PV (V rows).
template <int D, int BITS, int RS, int ROW, typename F>
__device__ __forceinline__ void for_each_quad(const uint32_t* tile, const unsigned char* table, uint32_t lane_off,
                                              int g4, int c4, F&& f) {
  using Q = Quarter<D, BITS>;
#pragma unroll
  for (int g = 0; g < Q::kGroups; ++g) {
    uint32_t lo[Q::kGroupWords], hi[Q::kGroupWords];
    load_quarter<D, BITS>(tile + g4 * RS, c4, g, lo);
    load_quarter<D, BITS>(tile + (g4 + 8) * RS, c4, g, hi);
#pragma unroll
    for (int k = 0; k < Q::kStepsPerGroup; ++k) {
      f(g * Q::kStepsPerGroup + k, quad_halves<BITS, ROW>(table, lane_off, lo, 4 * BITS * k),
        quad_halves<BITS, ROW>(table, lane_off, hi, 4 * BITS * k));
    }
  }
}

// PV without transposes (2- and 4-bit values, D * bits >= 256): two token rows interleave by nibbles
// into token-pair indices whose table entries are the A registers themselves, replacing four movmatrix
// per MMA (aura-format.md §13). Lane (g4, c4) reads dims [g4 D/8, (g4 + 1) D/8); f(mt, a[4]) per m-tile.
template <int D, int BITS, int RS, int ROW, typename F>
__device__ __forceinline__ void for_each_pv_tile(const uint32_t* tile, const unsigned char* table, uint32_t lane_off,
                                                 int g4, int c4, F&& f) {
  static_assert((BITS == 2 || BITS == 4) && D * BITS >= 256, "token-pair lookups: 2- or 4-bit rows of whole words");
  constexpr int LW = D * BITS / 256;  // words of a token row per lane
  uint32_t lo[2][LW], hi[2][LW];      // [pair: tokens (2c4, 2c4 + 1), (2c4 + 8, 2c4 + 9)][word]
#pragma unroll
  for (int pr = 0; pr < 2; ++pr) {
    const uint32_t* ra = tile + (2 * c4 + 8 * pr) * RS + g4 * LW;
#pragma unroll
    for (int w = 0; w < LW; ++w) {
      const uint32_t a = ra[w], b = ra[RS + w];
      lo[pr][w] = (a & 0x0F0F0F0Fu) | ((b << 4) & 0xF0F0F0F0u);  // byte k: nibble 2k of a, of b
      hi[pr][w] = ((a >> 4) & 0x0F0F0F0Fu) | (b & 0xF0F0F0F0u);  // byte k: nibble 2k + 1 of a, of b
    }
  }
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) {
    uint32_t a[4];
#pragma unroll
    for (int pr = 0; pr < 2; ++pr) {
      if constexpr (BITS == 2) {  // dims 2mt, 2mt + 1 = nibble mt: word mt / 8, byte (mt % 8) / 2 of lo or hi
        const int bit = 32 * (mt / 8) + 8 * ((mt % 8) / 2);
        const uint2 e = *reinterpret_cast<const uint2*>(
            table + entry_offset<8, ROW>((mt & 1) ? hi[pr] : lo[pr], bit, lane_off));
        a[2 * pr] = e.x, a[2 * pr + 1] = e.y;
      } else {  // dim 2mt: byte mt % 4 of lo word mt / 4; dim 2mt + 1: the same byte of hi
        const int bit = 32 * (mt / 4) + 8 * (mt % 4);
        a[2 * pr] = lds32(table, entry_offset<8, ROW>(lo[pr], bit, lane_off));
        a[2 * pr + 1] = lds32(table, entry_offset<8, ROW>(hi[pr], bit, lane_off));
      }
    }
    f(mt, a);
  }
}

// cp.async of one code row by two lanes: lane half h takes `vec`-byte chunks h, h + 2, ... (dst and src
// point at chunk h, so the rest sit at immediate offsets).
template <int PW>
__device__ __forceinline__ void copy_code_row(uint32_t dst, const char* src, bool ok, int half, int vec) {
  auto chunks = [&](auto bytes) {
    constexpr int V = decltype(bytes)::value, N = PW * 4 / V;  // chunks per row
#pragma unroll
    for (int j = 0; 2 * j < N; ++j)
      if (N % 2 == 0 || 2 * j + half < N) cp_async<V>(dst + 2 * V * j, src + 2 * V * j, ok);
  };
  if constexpr (PW % 4 == 0) {
    if (vec == 16) return chunks(std::integral_constant<int, 16>{});
  }
  if constexpr (PW % 2 == 0) {
    if (vec >= 8) return chunks(std::integral_constant<int, 8>{});
  }
  chunks(std::integral_constant<int, 4>{});
}

// Launch shape per (D, bits): one CTA per SM, so the tables (up to 64 KB) are paid once per SM; as many
// warps as registers allow, and the deepest ring the rest of 220 KB allows.
template <int D, int KB, int VB>
struct WarpP1Shape {
  static constexpr int PWK = D * KB / 32, PWV = D * VB / 32;
  // Row strides in words. Quarters of >= 8 words are read 16 bytes at a time, two rows per
  // 8-lane phase: 4 words of padding put the second row on the other half of the banks.
  static constexpr int RSK = PWK + (Quarter<D, KB>::kWords >= 8 ? 4 : 0);
  static constexpr int RSV = PWV + (Quarter<D, VB>::kWords >= 8 ? 4 : 0);
  static constexpr size_t kStepBytes = size_t(16) * (RSK + RSV) * 4 + 2 * 16 * 4;  // codes + norms, 16 tokens
  static constexpr size_t kTableBytes = TablePair<KB, VB>::kBytes;
  static constexpr int kQRow = D + 8;  // fp16 per staged q row (+16 bytes)
  static constexpr size_t kQBytes = size_t(8) * kQRow * 2;
  static constexpr size_t kBudget = 220 * 1024;
  static constexpr size_t kFree = kBudget - kTableBytes - kQBytes;
  // the most warps whose register share stays free of spills (8-bit codes take 4 lookups per quad;
  // tests/build checks)
  static constexpr int kMaxWarps = D > 128 ? 8 : (KB == 8 && VB == 8) ? 8 : (KB == 8 || VB == 8) ? 12 : 16;
  static constexpr int kWarps = std::min<int>(kMaxWarps, int(kFree / (2 * kStepBytes)));
  static constexpr int kStages = std::min<int>(4, int(kFree / (kWarps * kStepBytes)));
  static constexpr size_t kRingBytes = size_t(kWarps) * kStages * kStepBytes;
  static constexpr size_t kMergeBytes = size_t(kWarps) * 8 * (D + 3) * 4;  // end-of-block merge: o, m, l, weight
  static constexpr size_t kSmem = std::max(kTableBytes + kRingBytes + kQBytes, kMergeBytes);
  static_assert(kTableBytes % 128 == 0 && kStepBytes % 16 == 0, "alignment of the ring slots");
  static constexpr bool kQInRegs = D <= 256;  // B fragments of q for the whole block (D / 8 registers)
  static constexpr bool kPairV = (VB == 2 || VB == 4) && D * VB >= 256;  // PV by for_each_pv_tile
  static_assert(kWarps >= 1 && kStages >= 2, "a ring needs two steps to overlap loads with math");
};

// The dim of accumulator c of m-tile mt in lane (g4, c4) (its column: 2 c4 + c % 2), undoing the
// quarter or token-pair permutation of the lookups.
template <int D, bool PAIR_V>
__host__ __device__ constexpr int merge_dim(int g4, int mt, int c) {
  return PAIR_V ? g4 * (D / 8) + 2 * mt + (c >> 1) : (g4 >> 1) * (D / 4) + 4 * mt + 2 * (c >> 1) + (g4 & 1);
}
// Where (column r, dim d) sits in its warp's [8][D] merge block: the low bits of d XORed so a store's
// 32 lanes and the reduction's 32 consecutive dims both hit 32 banks (aura-format.md §13).
template <int D, bool PAIR_V>
__host__ __device__ constexpr int merge_swizzle(int r, int d) {
  constexpr int g_shift = PAIR_V ? (D == 64 ? 3 : D == 128 ? 4 : D == 256 ? 5 : 6)   // log2(D / 8)
                                 : (D == 64 ? 4 : D == 128 ? 5 : D == 256 ? 6 : 7);  // log2(D / 4)
  const int c4 = (r >> 1) & 3;
  return PAIR_V ? d ^ ((((d >> g_shift) & 7) << 2) | c4) : d ^ ((((d >> g_shift) & 3) << 1) | (c4 << 3));
}
// Checked at compile time for every instantiation: stores and reads free of bank conflicts, and the
// swizzle a permutation of each column's dims.
template <int D, bool PAIR_V>
constexpr bool block_merge_conflict_free() {
  for (int mt = 0; mt < D / 16; ++mt)
    for (int c = 0; c < 4; ++c)
      if (!distinct_banks(32, [&](int lane) {
            const int r = 2 * (lane & 3) + (c & 1);
            return r * D + merge_swizzle<D, PAIR_V>(r, merge_dim<D, PAIR_V>(lane >> 2, mt, c));
          }))
        return false;
  for (int r = 0; r < 8; ++r)
    for (int d0 = 0; d0 < D; d0 += 32) {
      for (int d = d0; d < d0 + 32; ++d) {
        const int x = merge_swizzle<D, PAIR_V>(r, d);
        if (x < d0 || x >= d0 + 32) return false;  // stays inside its 32-dim run: a permutation
      }
      if (!distinct_banks(32, [&](int i) { return r * D + merge_swizzle<D, PAIR_V>(r, d0 + i); })) return false;
    }
  return true;
}

// q rows of the block (rows warp, warp + W, ... < 8) as fp32 registers, zero past R: loaded first, since
// at B = 1 the kernel is latency-bound.
template <int D, int W, int QR>
__device__ __forceinline__ void load_q_rows(const AuraP1Params& p, const P1Block& blk, int lane, int warp,
                                            float (&q_row)[QR][D / 32]) {
#pragma unroll
  for (int k = 0; k < QR; ++k) {
    const int r = warp + k * W;
#pragma unroll
    for (int j = 0; j < D / 32; ++j) q_row[k][j] = 0.f;
    if (r < blk.R) {
      const int64_t base = blk.q_offset(p, r);
#pragma unroll
      for (int j = 0; j < D / 32; ++j) q_row[k][j] = load_float(p.q, base + lane + 32 * j, p.q_kind);
    }
  }
}

// The q rows, rotated where aura_decode fused the rotation (q_rot = scale Pi_K q), to shared memory as
// fp16 q_rot * log2(e), one [kQRow] row each.
template <int D, int W, int QR, int QROW>
__device__ __forceinline__ void stage_q_rows(const AuraP1Params& p, const P1Block& blk, float (&q_row)[QR][D / 32],
                                             const uint32_t (&k_sign)[D / 32], uint16_t* qs, int lane, int warp) {
#pragma unroll
  for (int k = 0; k < QR; ++k) {
    const int r = warp + k * W;
    if (r < 8) {
      if (r < blk.R && p.k_sign != nullptr) rotate_warp<D>(q_row[k], k_sign, p.q_factor, false);
#pragma unroll
      for (int j = 0; j < D / 32; ++j) qs[r * QROW + lane + 32 * j] = __half_as_ushort(__float2half_rn(q_row[k][j] * kLog2eF));
    }
  }
}

// QK of one step: S^T [16 tokens x 8 columns], two accumulator chains; rows of S^T: tokens g4
// (s[.][0..1]) and g4 + 8 (s[.][2..3]). A operands from the K table's quads of the lane's quarter.
template <int D, int KB, int VB>
__device__ __forceinline__ void warp_qk(const uint32_t* kc, const unsigned char* table_k, uint32_t lk,
                                        const uint32_t* q_quarter, const uint32_t (&qf)[WarpP1Shape<D, KB, VB>::kQInRegs ? D / 8 : 1],
                                        int g4, int c4, float (&s)[2][4]) {
  using S = WarpP1Shape<D, KB, VB>;
  for_each_quad<D, KB, S::RSK, TablePair<KB, VB>::kRow>(kc, table_k, lk, g4, c4, [&](int kk, uint2 ql, uint2 qh) {
    const uint32_t a[4] = {ql.x, qh.x, ql.y, qh.y};  // tokens g4 / g4 + 8, k 2c4 (pair 2kk) / 2c4 + 8 (2kk + 1)
    uint32_t b0, b1;
    if constexpr (S::kQInRegs) {
      b0 = qf[2 * kk], b1 = qf[2 * kk + 1];
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(q_quarter + 2 * kk);
      b0 = v.x, b1 = v.y;
    }
    mma_16816<__half>(s[kk & 1], a, b0, b1);
  });
}

// PV of one step: O^T [D x 8 columns] += V^T P^T, after the rescale (only when a running max moved). A
// operands from token-pair lookups (2-, 4-bit) or transposed natural-layout quads.
template <int D, int KB, int VB>
__device__ __forceinline__ void warp_pv(const uint32_t* vc, const unsigned char* table_v, uint32_t lv, uint32_t pb0,
                                        uint32_t pb1, bool grew, const float (&alpha)[2], int g4, int c4,
                                        float (&o)[D / 16][4]) {
  using S = WarpP1Shape<D, KB, VB>;
  constexpr int ROW = TablePair<KB, VB>::kRow;
  if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
      o[mt][0] *= alpha[0], o[mt][1] *= alpha[1];
      o[mt][2] *= alpha[0], o[mt][3] *= alpha[1];
    }
  }
  if constexpr (S::kPairV) {
    for_each_pv_tile<D, VB, S::RSV, ROW>(vc, table_v, lv, g4, c4,
                                         [&](int mt, const uint32_t(&a)[4]) { mma_16816<__half>(o[mt], a, pb0, pb1); });
  } else {
    for_each_quad<D, VB, S::RSV, ROW>(vc, table_v, lv, g4, c4, [&](int mt, uint2 ql, uint2 qh) {
      const uint32_t a[4] = {movmatrix_trans(ql.x), movmatrix_trans(ql.y), movmatrix_trans(qh.x), movmatrix_trans(qh.y)};
      mma_16816<__half>(o[mt], a, pb0, pb1);
    });
  }
}

// The warps' states merge through the drained shared memory into the block's partial: unnormalised o
// (rotated domain), m in natural log, l.
template <int D, int KB, int VB>
__device__ __forceinline__ void merge_block_partial(const AuraP1Params& p, const P1Block& blk, unsigned char* smem,
                                                    const float (&m_run)[2], float (&l_run)[2],
                                                    const float (&o)[D / 16][4], int warp, int g4, int c4) {
  using S = WarpP1Shape<D, KB, VB>;
  constexpr int W = S::kWarps;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 4);
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 8);
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 16);
  }
  __syncthreads();  // every warp is done with the ring and the tables
  static_assert(block_merge_conflict_free<D, S::kPairV>(), "end-of-block merge layout");
  float* ow = reinterpret_cast<float*>(smem);  // [W][8][D], dims swizzled (merge_swizzle)
  const WarpStates<W, 8> st{ow + W * 8 * D, ow + W * 8 * D + W * 8, ow + W * 8 * D + 2 * W * 8};  // [W][8] each
  if (g4 == 0) {
#pragma unroll
    for (int e = 0; e < 2; ++e) st.m[warp * 8 + 2 * c4 + e] = m_run[e], st.l[warp * 8 + 2 * c4 + e] = l_run[e];
  }
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = 2 * c4 + (c & 1);
      ow[(warp * 8 + r) * D + merge_swizzle<D, S::kPairV>(r, merge_dim<D, S::kPairV>(g4, mt, c))] = o[mt][c];
    }
  __syncthreads();
  AURA_PHASE(5);
  st.weigh();
  __syncthreads();
  for (int idx = threadIdx.x; idx < blk.R * D; idx += W * 32) {
    const int r = idx / D, d = idx % D;
    float acc = 0.f;
#pragma unroll
    for (int wi = 0; wi < W; ++wi) acc += st.weight(wi, r) * ow[(wi * 8 + r) * D + merge_swizzle<D, S::kPairV>(r, d)];
    p.o[blk.out_row(p, r) * D + d] = acc;
  }
  for (int r = threadIdx.x; r < blk.R; r += W * 32) {
    p.m[blk.out_row(p, r)] = st.row_max(r) * kLn2F;  // -inf stays -inf for a row that saw nothing
    p.l[blk.out_row(p, r)] = st.row_sum(r);
  }
}

template <int D, int KB, int VB>
__global__ void __launch_bounds__(WarpP1Shape<D, KB, VB>::kWarps * 32, 1)
    aura_flash_p1_warp_kernel(const AuraP1Params p) {
  using S = WarpP1Shape<D, KB, VB>;
  constexpr int W = S::kWarps, NS = S::kStages, RSK = S::RSK, RSV = S::RSV, NQ = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g4 = lane >> 2, c4 = lane & 3;
  AURA_PHASE(0);
  P1Block blk;
  if (!plan_p1_rows(p, blk)) return;
  // Latency-bound at B = 1: q, the sign mask, seq_lens and the ring's first (speculative) steps go out
  // together, and the tables are built before anything waits on the sequence length.
  constexpr int QR = (8 + W - 1) / W;
  float q_row[QR][D / 32];
  load_q_rows<D, W, QR>(p, blk, lane, warp, q_row);
  uint32_t k_sign[D / 32];
#pragma unroll
  for (int j = 0; j < D / 32; ++j) k_sign[j] = p.k_sign != nullptr ? __ldg(p.k_sign + j) : 0u;
  const int seq_len = p.seq_lens[blk.b];  // used only after the prologue
  AURA_PHASE(1);
  unsigned char* table_k = smem;
  using TP = TablePair<KB, VB>;
  unsigned char* table_v = smem + TP::kV;
  unsigned char* ring = smem + S::kTableBytes;  // [W][NS] steps: K codes, V codes, K norms, V norms
  uint16_t* qs = reinterpret_cast<uint16_t*>(ring + S::kRingBytes);  // [8][kQRow] fp16 q_rot * log2(e)

  // ---- this warp's steps: s = warp, warp + W, ...; until seq_lens arrives the block is taken to end
  // where the cache does (t_spec), rows past the true end masked later (aura-format.md §13)
  const int t_spec = min(blk.t0 + p.block_size, p.capacity);
  auto steps_of = [&](int t_end) {
    const int n_steps = ceil_div(t_end - blk.t0, 16);
    return n_steps > warp ? ceil_div(n_steps - warp, W) : 0;
  };
  int my_n = steps_of(t_spec), t_copy_end = t_spec;  // both become the true extent's once it is known
  auto step_t0 = [&](int i) { return blk.t0 + (warp + W * i) * 16; };

  // ---- copies: lane l stages row l % 16 of a step. Block-fixed offsets are folded into base pointers
  // pinned in registers, else re-derived at every step (aura-format.md §13). (The ring stays in
  // closures here: as a struct it compiled to different code, decode.md §13.)
  const int crow = lane & 15, chalf = lane >> 4;
  const bool paged = p.block_table != nullptr;
  const int* pages = paged ? p.block_table + blk.b * p.bt_sb : nullptr;
  const int t_last = t_spec - 1;
  auto fixed = [&](int64_t s0, int64_t s2) { return (paged ? 0 : int64_t(blk.b) * s0) + int64_t(blk.kvh) * s2; };
  auto bytes = [](const void* base, int64_t elems) { return static_cast<const char*>(base) + elems * 4; };
  const int kc_vec = p.kc_vec, vc_vec = p.vc_vec;
  const char* kc_base = pin(bytes(p.kc, fixed(p.kc_s0, p.kc_s2)) + chalf * kc_vec);
  const char* vc_base = pin(bytes(p.vc, fixed(p.vc_s0, p.vc_s2)) + chalf * vc_vec);
  const char* n_base = pin(chalf == 0 ? bytes(p.kn, fixed(p.kn_s0, p.kn_s2)) : bytes(p.vn, fixed(p.vn_s0, p.vn_s2)));
  const int n_rb = pin(chalf == 0 ? p.kn_rb : p.vn_rb);
  // the warp's ring (slot s at + s * kStepBytes) as a pointer, and this lane's destinations in slot 0
  const unsigned char* ring_w = ring + warp * NS * S::kStepBytes;
  const uint32_t kd0 = pin(smem_addr(ring_w) + uint32_t(crow * RSK * 4 + chalf * kc_vec));
  const uint32_t vd0 = pin(smem_addr(ring_w) + uint32_t((16 * RSK + crow * RSV) * 4 + chalf * vc_vec));
  const uint32_t nd0 = pin(smem_addr(ring_w) + uint32_t((16 * (RSK + RSV) + lane) * 4));
  int t_issue = step_t0(0) + crow, issue_slot = 0;  // this lane's token and ring slot at the next issued step
  // paged: the page of the next issued row, read one step ahead (off the issue path)
  int next_page = 0, next_row = 0;
  auto locate = [&](int t) {
    int i;
    page_of(min(t, t_last), p.page_size, p.page_shift, i, next_row);
    next_page = min(max(pages[i], 0), p.num_blocks - 1);  // never outside the cache
  };
  if (paged) locate(t_issue);
  auto issue = [&](int i) {  // step i into ring slot i % NS
    if (i < my_n) {
      const bool ok = t_issue < t_copy_end;
      const char *ks, *vs, *ns;
      if (!paged) {  // rows past the block: clamped (the copy reads nothing for them: zero fill)
        const int t = min(t_issue, t_last);
        ks = kc_base + mul_wide(t, p.kc_rb), vs = vc_base + mul_wide(t, p.vc_rb), ns = n_base + mul_wide(t, n_rb);
      } else {
        const int page = next_page, row = next_row;
        ks = kc_base + mul_wide(page, p.kc_pb) + mul_wide(row, p.kc_rb);
        vs = vc_base + mul_wide(page, p.vc_pb) + mul_wide(row, p.vc_rb);
        ns = n_base + mul_wide(page, chalf == 0 ? p.kn_pb : p.vn_pb) + mul_wide(row, n_rb);
        locate(t_issue + W * 16);
      }
      t_issue += W * 16;
      const uint32_t slot = uint32_t(issue_slot * S::kStepBytes);
      issue_slot = issue_slot + 1 == NS ? 0 : issue_slot + 1;
      copy_code_row<S::PWK>(kd0 + slot, ks, ok, chalf, kc_vec);
      copy_code_row<S::PWV>(vd0 + slot, vs, ok, chalf, vc_vec);
      cp_async<4>(nd0 + slot, ns, ok);
    }
    cp_async_commit();  // one group per step (empty past the end)
  };
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) issue(i);  // the ring fills while the tables and q are prepared

  stage_q_rows<D, W, QR, S::kQRow>(p, blk, q_row, k_sign, qs, lane, warp);
  AURA_PHASE(2);
  fill_half_table<KB, TP::kRow, W * 32>(table_k, p.k_cb);
  fill_half_table<VB, TP::kRow, W * 32, S::kPairV>(table_v, p.v_cb);
  __syncthreads();  // the last CTA barrier before the end: tables and q visible to every warp
  AURA_PHASE(3);
  if (!plan_p1_tokens<D>(p, blk, W * 32, seq_len)) {  // CTA-uniform
    cp_async_wait<0>();  // the speculative copies land before the shared memory is handed on
    return;
  }
  my_n = steps_of(blk.t_end), t_copy_end = blk.t_end;

  // q's B fragments: k-step kk takes pairs 2kk, 2kk+1 of lane quarter c4 of row g4
  const uint32_t* q_quarter = reinterpret_cast<const uint32_t*>(qs + g4 * S::kQRow + c4 * (D / 4));
  uint32_t qf[S::kQInRegs ? NQ : 1];
  if constexpr (S::kQInRegs) {
#pragma unroll
    for (int j = 0; j < NQ; j += 2) {
      const uint2 v = *reinterpret_cast<const uint2*>(q_quarter + j);
      qf[j] = v.x, qf[j + 1] = v.y;
    }
  }
  // Visible-token limit of this lane's two columns (rows 2 c4 + e): causal rows see t <= T - L + i;
  // columns past R see nothing.
  int lim[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int r = 2 * c4 + e;
    lim[e] = r < blk.R ? min(blk.t_end, blk.last_visible(p, r) + 1) : blk.t0;
  }
  const uint32_t lk = HalfTable<KB>::lane_offset(lane), lv = HalfTable<VB>::lane_offset(lane);
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, o[D / 16][4];
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;

  for (int i = 0, read_slot = 0; i < my_n; ++i) {
    __syncwarp();  // every lane is done reading the slot the next copy overwrites
    issue(i + NS - 1);
    cp_async_wait<NS - 1>();  // step i's group has landed (for this lane) ...
    __syncwarp();             // ... and for the whole warp
    const uint32_t* kc = reinterpret_cast<const uint32_t*>(ring_w + size_t(read_slot) * S::kStepBytes);
    read_slot = read_slot + 1 == NS ? 0 : read_slot + 1;
    const uint32_t* vc = kc + 16 * RSK;
    const float* kn = reinterpret_cast<const float*>(vc + 16 * RSV);
    const float* vn = kn + 16;

    // QK, two accumulator chains; rows of S^T: tokens g4 (s[.][0..1]) and g4 + 8 (s[.][2..3])
    float s[2][4] = {};
    warp_qk<D, KB, VB>(kc, table_k, lk, q_quarter, qf, g4, c4, s);
    // softmax over each column (log2 units), logits scaled by the keys' norms
    const int t_lo = step_t0(i) + g4, t_hi = t_lo + 8;
    const float nk_lo = kn[g4], nk_hi = kn[g4 + 8];
    float x[4];
    x[0] = t_lo < lim[0] ? (s[0][0] + s[1][0]) * nk_lo : -INFINITY;
    x[1] = t_lo < lim[1] ? (s[0][1] + s[1][1]) * nk_lo : -INFINITY;
    x[2] = t_hi < lim[0] ? (s[0][2] + s[1][2]) * nk_hi : -INFINITY;
    x[3] = t_hi < lim[1] ? (s[0][3] + s[1][3]) * nk_hi : -INFINITY;
    float pr[4], alpha[2];
    const bool grew = online_softmax_tile(x, m_run, l_run, pr, alpha);
    // P^T (times the values' norms; l sums plain p) as the B operand, transposed in registers
    const float nv_lo = t_lo < blk.t_end ? vn[g4] : 0.f, nv_hi = t_hi < blk.t_end ? vn[g4 + 8] : 0.f;
    const uint32_t pb0 = movmatrix_trans(pack2<__half>(pr[0] * nv_lo, pr[1] * nv_lo));  // tokens 0-7
    const uint32_t pb1 = movmatrix_trans(pack2<__half>(pr[2] * nv_hi, pr[3] * nv_hi));  // tokens 8-15
    warp_pv<D, KB, VB>(vc, table_v, lv, pb0, pb1, grew, alpha, g4, c4, o);
  }
  AURA_PHASE(4);
  cp_async_wait<0>();  // only empty groups remain; drain before the shared memory is reused
  grid_dependents_launch();  // pass 2 (a programmatic dependent launch) may start its prologue
  merge_block_partial<D, KB, VB>(p, blk, smem, m_run, l_run, o, warp, g4, c4);
  AURA_PHASE(6);
}

}  // namespace aura
