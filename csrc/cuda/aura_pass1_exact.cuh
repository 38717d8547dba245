// Pass 1 for fp32 queries: the exact kernel, fp32-grade logits from bf16 hi/lo tensor-core products
// (docs/aura-format.md §13).
#pragma once

#include "aura_pass1_plan.cuh"
#include "aura_rotate.cuh"

namespace aura {

// ------------------------------------------------------------------- pass 1: codebook tables
// bf16 hi/lo halves of an fp32 value: x = hi + lo to 16 significant bits.
__device__ __forceinline__ void split_bf16(float x, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  hi = __bfloat16_as_ushort(h);
  lo = __bfloat16_as_ushort(__float2bfloat16_rn(x - __bfloat162float(h)));
}

template <int BITS>
struct CodeTable {
  // b <= 4: one entry per *pair* of codes, index x | y << b, holding the MMA operand registers
  // {hi(x) | hi(y) << 16, lo(x) | lo(y) << 16}: one 8-byte load per register pair. b = 8: 65536 pairs
  // is too many, so one {hi, lo} word per code, paired by byte permutes.
  static constexpr bool kPairs = BITS <= 4;
  static constexpr int kEntries = kPairs ? 1 << (2 * BITS) : 1 << BITS;
  static constexpr int kEntryBytes = kPairs ? 8 : 4;
  // Replicas, one per lane of a shared-memory wavefront (16 lanes for 8-byte loads, 32 for 4-byte):
  // an entry's copies fill one 128-byte bank row, so random codes never collide on a bank.
  static constexpr int kCopies = kPairs ? 16 : 32;
  static constexpr int kStride = kCopies * kEntryBytes;  // 128 bytes
  static constexpr int kBytes = kEntries * kStride;
};

template <int BITS>
__device__ __forceinline__ void fill_code_table(unsigned char* table, const float* cb) {
  using CT = CodeTable<BITS>;
  for (int i = threadIdx.x; i < CT::kEntries * CT::kCopies; i += blockDim.x) {
    const int e = i / CT::kCopies;
    if constexpr (CT::kPairs) {
      uint32_t hx, lx, hy, ly;
      split_bf16(__ldg(cb + (e & ((1 << BITS) - 1))), hx, lx);
      split_bf16(__ldg(cb + (e >> BITS)), hy, ly);
      *reinterpret_cast<uint2*>(table + size_t(i) * 8) = make_uint2(hx | (hy << 16), lx | (ly << 16));
    } else {
      uint32_t h, l;
      split_bf16(__ldg(cb + e), h, l);
      *reinterpret_cast<uint32_t*>(table + size_t(i) * 4) = h | (l << 16);
    }
  }
}

// {hi, lo} bf16x2 operand registers of the code pair (x, y) = (pair & mask, pair >> b), x in the low half.
template <int BITS>
__device__ __forceinline__ uint2 lookup_pair(const unsigned char* lane_table, uint32_t pair) {
  using CT = CodeTable<BITS>;
  if constexpr (CT::kPairs) {
    return *reinterpret_cast<const uint2*>(lane_table + pair * CT::kStride);
  } else {
    const uint32_t ex = *reinterpret_cast<const uint32_t*>(lane_table + (pair & 0xFFu) * CT::kStride);
    const uint32_t ey = *reinterpret_cast<const uint32_t*>(lane_table + (pair >> 8) * CT::kStride);
    return make_uint2(__byte_perm(ex, ey, 0x5410), __byte_perm(ex, ey, 0x7632));
  }
}

// Row stride of a staged code row in words: >= PW (+1 for 3-bit, whose funnel shift reads one word
// past a code) and = 4 mod 8, so the 8 token rows of an MMA fragment land on distinct banks and rows
// stay 16-byte aligned for cp.async.
__host__ __device__ constexpr int staged_row_words(int pw, bool straddles) {
  int rs = pw + (straddles ? 1 : 0);
  while (rs % 8 != 4) ++rs;
  return rs;
}

template <int D, int KB, int VB>
struct P1Config {
  static constexpr int PWK = D * KB / 32, PWV = D * VB / 32;
  static constexpr int RSK = staged_row_words(PWK, KB == 3), RSV = staged_row_words(PWV, VB == 3);
  // Tokens per stage: 64 (four 16-token MMA tiles, one per warp) unless the rows are wide.
  static constexpr int TS = RSK + RSV <= 48 ? 64 : RSK + RSV <= 140 ? 32 : 16;
  static constexpr int TOKEN_TILES = TS / 16;
  static constexpr int KP = kAuraWarps / TOKEN_TILES;  // QK: warps sharing a token tile split D
  static constexpr int KSTEPS = D / 16 / KP;
  static constexpr int MT_PER_WARP = D / 16 / kAuraWarps;  // PV: 16-dim output tiles per warp
  static constexpr int QROW = D + 8;                       // bf16 per q column: +16 B, conflict-free
  static constexpr int PROW = TS + 8;
  static constexpr size_t kTableK = 0;
  static constexpr size_t kTableV = kTableK + CodeTable<KB>::kBytes;
  static constexpr size_t kCodesK = kTableV + CodeTable<VB>::kBytes;  // [2][TS][RSK] words
  static constexpr size_t kCodesV = kCodesK + size_t(2) * TS * RSK * 4;
  static constexpr size_t kNormsK = kCodesV + size_t(2) * TS * RSV * 4;  // [2][TS]
  static constexpr size_t kNormsV = kNormsK + size_t(2) * TS * 4;
  static constexpr size_t kQ = kNormsV + size_t(2) * TS * 4;  // [row tiles][8 columns][QROW] bf16
  static constexpr size_t kP = kQ + size_t(kMaxRowTiles) * 8 * QROW * 2;  // [row tiles][8][PROW] bf16
  static constexpr size_t kS = kP + size_t(kMaxRowTiles) * 8 * PROW * 2;  // [KP][rows][TS] fp32 logits
  static constexpr size_t kStats = kS + size_t(KP) * kMaxRowsPerCta * TS * 4;  // m, l, alpha per row
  static constexpr size_t kBytes = kStats + 3 * kMaxRowsPerCta * 4;
  static_assert(D % 64 == 0 && (D / 16) % KP == 0 && MT_PER_WARP >= 1, "tile shapes");
};

// Where token t of (sequence b, KV head h) lives, for a tensor with (page, row, head) strides.
struct TokenMap {
  const int* pages;  // block_table row of b, or nullptr
  int b, h, page_size, page_shift, num_blocks;
  __device__ __forceinline__ int64_t offset(int64_t s0, int64_t s1, int64_t s2, int t) const {
    if (pages == nullptr) return b * s0 + int64_t(t) * s1 + h * s2;
    int i, row;
    page_of(t, page_size, page_shift, i, row);
    const int page = min(max(pages[i], 0), num_blocks - 1);  // never outside the cache
    return page * s0 + int64_t(row) * s1 + h * s2;
  }
};

template <int PW, int RS, int BYTES, int TS>
__device__ __forceinline__ void stage_code_rows(uint32_t* dst, const uint32_t* src, int64_t s0, int64_t s1,
                                                int64_t s2, const TokenMap& tm, int ts0, int t_end) {
  constexpr int W = BYTES / 4, CPR = PW / W;
  for (int i = threadIdx.x; i < TS * CPR; i += kAuraThreads) {
    const int r = i / CPR, c = i % CPR, t = ts0 + r;
    const bool valid = t < t_end;  // rows past the block are zero-filled without reading memory
    const int64_t off = valid ? tm.offset(s0, s1, s2, t) : 0;
    cp_async<BYTES>(dst + r * RS + c * W, src + off + c * W, valid);
  }
}

template <int PW, int RS, int TS>
__device__ __forceinline__ void stage_codes(uint32_t* dst, const uint32_t* src, int64_t s0, int64_t s1, int64_t s2,
                                            const TokenMap& tm, int ts0, int t_end, int vec) {
  if constexpr (PW % 4 == 0) {
    if (vec == 16) return stage_code_rows<PW, RS, 16, TS>(dst, src, s0, s1, s2, tm, ts0, t_end);
  }
  if constexpr (PW % 2 == 0) {
    if (vec == 8) return stage_code_rows<PW, RS, 8, TS>(dst, src, s0, s1, s2, tm, ts0, t_end);
  }
  stage_code_rows<PW, RS, 4, TS>(dst, src, s0, s1, s2, tm, ts0, t_end);
}

// CTAs per SM the register budget is cut for: three at D = 128 keep 12 warps resident to hide lookup
// and MMA latency; larger D need the registers to stay free of spills (tests/build checks).
template <int D>
constexpr int kP1MinCtas = D == 128 ? 3 : D <= 256 ? 2 : 1;

// Query rows -> B operand columns of the exact kernel: row r -> column r % 4 (hi) and r % 4 + 4 (lo) of
// tile r / 4, in log2 units (exp2 softmax); rows >= R are zero. One warp per row.
template <int D, int QROW>
__device__ __forceinline__ void stage_q_columns(const AuraP1Params& p, const P1Block& blk, uint16_t* qs, int R,
                                                int lane, int warp) {
  for (int r = warp; r < kMaxRowsPerCta; r += kAuraWarps) {
    float v[D / 32];
    if (r < R) {
      const int64_t base = blk.q_offset(p, r);
#pragma unroll
      for (int j = 0; j < D / 32; ++j) v[j] = load_float(p.q, base + lane + 32 * j, p.q_kind);
      if (p.k_sign != nullptr) rotate_warp<D>(v, p.k_sign, p.q_factor, false);  // q_rot = scale Pi_K q
    } else {
#pragma unroll
      for (int j = 0; j < D / 32; ++j) v[j] = 0.f;
    }
    uint16_t* col_hi = qs + ((r / kQRowsPerTile) * 8 + r % kQRowsPerTile) * QROW;
    uint16_t* col_lo = col_hi + kQRowsPerTile * QROW;
#pragma unroll
    for (int j = 0; j < D / 32; ++j) {
      uint32_t hi, lo;
      split_bf16(v[j] * kLog2eF, hi, lo);
      col_hi[lane + 32 * j] = uint16_t(hi);
      col_lo[lane + 32 * j] = uint16_t(lo);
    }
  }
}

// QK of one stage: warp = (token tile, D slice); S^T[16 tokens x 8 columns] over its k-steps, hi and lo
// code halves against the hi/lo query columns, written to ss (times the keys' norms) per D slice.
template <int D, int KB, int VB>
__device__ __forceinline__ void exact_qk(const uint32_t* kcs, const float* kns, const unsigned char* lane_table_k,
                                         const uint32_t* qs32, float* ss, int nrt, int warp, int g4, int c4) {
  using C = P1Config<D, KB, VB>;
  constexpr int TS = C::TS;
  const int tt = warp % C::TOKEN_TILES, kp = warp / C::TOKEN_TILES;
  const uint32_t* row_a = kcs + (tt * 16 + g4) * C::RSK;
  const uint32_t* row_b = row_a + 8 * C::RSK;
  float s[kMaxRowTiles][4] = {};
#pragma unroll 2
  for (int ks = 0; ks < C::KSTEPS; ++ks) {
    const int kk = kp * C::KSTEPS + ks, j0 = 16 * kk + 2 * c4, j1 = j0 + 8;
    const uint2 e0 = lookup_pair<KB>(lane_table_k, code_field<KB, 2>(row_a, j0));  // token g,   dims j0, j0+1
    const uint2 e1 = lookup_pair<KB>(lane_table_k, code_field<KB, 2>(row_b, j0));  // token g+8
    const uint2 e2 = lookup_pair<KB>(lane_table_k, code_field<KB, 2>(row_a, j1));  // token g,   dims j1, j1+1
    const uint2 e3 = lookup_pair<KB>(lane_table_k, code_field<KB, 2>(row_b, j1));
    const uint32_t a_hi[4] = {e0.x, e1.x, e2.x, e3.x}, a_lo[4] = {e0.y, e1.y, e2.y, e3.y};
#pragma unroll
    for (int rt = 0; rt < kMaxRowTiles; ++rt) {
      if (rt < nrt) {
        const uint32_t* col = qs32 + (rt * 8 + g4) * (C::QROW / 2);
        const uint32_t b0 = col[8 * kk + c4], b1 = col[8 * kk + 4 + c4];
        mma_16816<__nv_bfloat16>(s[rt], a_hi, b0, b1);
        mma_16816<__nv_bfloat16>(s[rt], a_lo, b0, b1);
      }
    }
  }
#pragma unroll
  for (int rt = 0; rt < kMaxRowTiles; ++rt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[rt][e] += __shfl_xor_sync(0xffffffffu, s[rt][e], 2);  // hi + lo columns
  }
  if (c4 < 2) {
#pragma unroll
    for (int rt = 0; rt < kMaxRowTiles; ++rt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = rt * kQRowsPerTile + 2 * c4 + (e & 1), tok = tt * 16 + g4 + 8 * (e >> 1);
        if (rt < nrt) ss[(kp * kMaxRowsPerCta + row) * TS + tok] = s[rt][e] * kns[tok];
      }
    }
  }
}

// Online softmax of one stage per query row (log2 units; one warp per row): the D slices' logits
// summed, causal masking, P^T (times the value norms) as hi/lo columns, and the row's max, sum, rescale.
template <int D, int KB, int VB>
__device__ __forceinline__ void exact_softmax(const AuraP1Params& p, const P1Block& blk, const float* ss,
                                              const float* vns, uint16_t* ps, float* ms, float* ls, float* as, int R,
                                              int ts0, int t_end, int lane, int warp) {
  using C = P1Config<D, KB, VB>;
  constexpr int TS = C::TS;
  for (int r = warp; r < R; r += kAuraWarps) {
    const int last = blk.last_visible(p, r);
    constexpr int PER = (TS + 31) / 32;
    float x[PER];
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      const int tt = lane + 32 * k, t = ts0 + tt;
      x[k] = -INFINITY;
      if (tt < TS && t < t_end && t <= last) {
        float v = ss[r * TS + tt];
#pragma unroll
        for (int kp = 1; kp < C::KP; ++kp) v += ss[(kp * kMaxRowsPerCta + r) * TS + tt];
        x[k] = v;
      }
      mx = fmaxf(mx, x[k]);
    }
    mx = warp_max(mx);
    const float m_old = ms[r], m_new = fmaxf(m_old, mx);
    uint16_t* p_hi = ps + ((r / kQRowsPerTile) * 8 + r % kQRowsPerTile) * C::PROW;
    uint16_t* p_lo = p_hi + kQRowsPerTile * C::PROW;
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      const int tt = lane + 32 * k;
      if (tt < TS) {
        const float pr = x[k] == -INFINITY ? 0.f : exp2f(x[k] - m_new);
        sum += pr;
        uint32_t hi, lo;
        split_bf16(pr * vns[tt], hi, lo);
        p_hi[tt] = uint16_t(hi);
        p_lo[tt] = uint16_t(lo);
      }
    }
    sum = warp_sum(sum);
    __syncwarp();  // every lane has read ms[r] before lane 0 overwrites it (racecheck)
    if (lane == 0) {
      // m_new = -inf: nothing seen yet, keep alpha 1 (exp2(-inf - -inf) would be NaN).
      const float alpha = m_new == -INFINITY ? 1.f : exp2f(m_old - m_new);
      ls[r] = ls[r] * alpha + sum;
      ms[r] = m_new;
      as[r] = alpha;
    }
  }
}

// PV of one stage: warp owns 16-dim output tiles mt = warp + 4 i; O^T[16 dims x 8 columns] += V^T P^T,
// after the rows' rescale.
template <int D, int KB, int VB>
__device__ __forceinline__ void exact_pv(const uint32_t* vcs, const unsigned char* lane_table_v, const uint32_t* ps32,
                                         const float* as, int nrt, int warp, int g4, int c4,
                                         float (&acc)[P1Config<D, KB, VB>::MT_PER_WARP][kMaxRowTiles][4]) {
  using C = P1Config<D, KB, VB>;
  constexpr int TS = C::TS;
#pragma unroll
  for (int rt = 0; rt < kMaxRowTiles; ++rt) {
    const float a0 = as[rt * kQRowsPerTile + ((2 * c4) & 3)], a1 = as[rt * kQRowsPerTile + ((2 * c4 + 1) & 3)];
#pragma unroll
    for (int mi = 0; mi < C::MT_PER_WARP; ++mi) {
      acc[mi][rt][0] *= a0, acc[mi][rt][1] *= a1, acc[mi][rt][2] *= a0, acc[mi][rt][3] *= a1;
    }
  }
#pragma unroll 1
  for (int kt = 0; kt < TS / 16; ++kt) {
    const uint32_t* v0 = vcs + (kt * 16 + 2 * c4) * C::RSV;  // tokens 2c, 2c+1, 2c+8, 2c+9
    const uint32_t* v1 = v0 + C::RSV;
    const uint32_t* v8 = v0 + 8 * C::RSV;
    const uint32_t* v9 = v8 + C::RSV;
    uint32_t b[kMaxRowTiles][2];
#pragma unroll
    for (int rt = 0; rt < kMaxRowTiles; ++rt) {
      const uint32_t* col = ps32 + (rt * 8 + g4) * (C::PROW / 2);
      b[rt][0] = col[8 * kt + c4];
      b[rt][1] = col[8 * kt + 4 + c4];
    }
#pragma unroll
    for (int mi = 0; mi < C::MT_PER_WARP; ++mi) {
      const int da = 16 * (warp + kAuraWarps * mi) + g4, db = da + 8;
      const uint2 e0 = lookup_pair<VB>(lane_table_v, code_field<VB, 1>(v0, da) | (code_field<VB, 1>(v1, da) << VB));
      const uint2 e1 = lookup_pair<VB>(lane_table_v, code_field<VB, 1>(v0, db) | (code_field<VB, 1>(v1, db) << VB));
      const uint2 e2 = lookup_pair<VB>(lane_table_v, code_field<VB, 1>(v8, da) | (code_field<VB, 1>(v9, da) << VB));
      const uint2 e3 = lookup_pair<VB>(lane_table_v, code_field<VB, 1>(v8, db) | (code_field<VB, 1>(v9, db) << VB));
      const uint32_t a_hi[4] = {e0.x, e1.x, e2.x, e3.x}, a_lo[4] = {e0.y, e1.y, e2.y, e3.y};
#pragma unroll
      for (int rt = 0; rt < kMaxRowTiles; ++rt) {
        if (rt < nrt) {
          mma_16816<__nv_bfloat16>(acc[mi][rt], a_hi, b[rt][0], b[rt][1]);
          mma_16816<__nv_bfloat16>(acc[mi][rt], a_lo, b[rt][0], b[rt][1]);
        }
      }
    }
  }
}

// The block's unnormalised partials (aura-format.md §8): o in the rotated domain (the hi and lo
// columns' halves added), m in natural-log units, l.
template <int D, int KB, int VB>
__device__ __forceinline__ void store_exact_partial(const AuraP1Params& p, const P1Block& blk, const float* ms,
                                                    const float* ls,
                                                    const float (&acc)[P1Config<D, KB, VB>::MT_PER_WARP][kMaxRowTiles][4],
                                                    int R, int nrt, int warp, int g4, int c4) {
  using C = P1Config<D, KB, VB>;
  auto out_row = [&](int r) { return blk.out_row(p, r); };
  for (int r = threadIdx.x; r < R; r += kAuraThreads) {
    p.m[out_row(r)] = ms[r] * kLn2F;  // -inf stays -inf for a row that saw nothing
    p.l[out_row(r)] = ls[r];
  }
#pragma unroll
  for (int mi = 0; mi < C::MT_PER_WARP; ++mi) {
#pragma unroll
    for (int rt = 0; rt < kMaxRowTiles; ++rt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = acc[mi][rt][e] + __shfl_xor_sync(0xffffffffu, acc[mi][rt][e], 2);
        const int row = rt * kQRowsPerTile + 2 * c4 + (e & 1);
        const int d = 16 * (warp + kAuraWarps * mi) + g4 + 8 * (e >> 1);
        if (c4 < 2 && rt < nrt && row < R) p.o[out_row(row) * D + d] = v;
      }
    }
  }
}

template <int D, int KB, int VB>
__global__ void __launch_bounds__(kAuraThreads, kP1MinCtas<D>) aura_flash_p1_kernel(const AuraP1Params p) {
  using C = P1Config<D, KB, VB>;
  constexpr int TS = C::TS;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g4 = lane >> 2, c4 = lane & 3;  // mma fragment coordinates (row group, column pair)

  P1Block blk;
  if (!plan_p1_rows(p, blk) || !plan_p1_tokens<D>(p, blk, kAuraThreads, p.seq_lens[blk.b])) return;
  const int b = blk.b, kvh = blk.kvh, R = blk.R, t0 = blk.t0, t_end = blk.t_end;

  unsigned char* table_k = smem + C::kTableK;
  unsigned char* table_v = smem + C::kTableV;
  uint32_t* codes_k = reinterpret_cast<uint32_t*>(smem + C::kCodesK);
  uint32_t* codes_v = reinterpret_cast<uint32_t*>(smem + C::kCodesV);
  float* norms_k = reinterpret_cast<float*>(smem + C::kNormsK);
  float* norms_v = reinterpret_cast<float*>(smem + C::kNormsV);
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem + C::kQ);
  uint16_t* ps = reinterpret_cast<uint16_t*>(smem + C::kP);
  float* ss = reinterpret_cast<float*>(smem + C::kS);
  float* ms = reinterpret_cast<float*>(smem + C::kStats);
  float* ls = ms + kMaxRowsPerCta;
  float* as = ls + kMaxRowsPerCta;

  const TokenMap tm{p.block_table != nullptr ? p.block_table + b * p.bt_sb : nullptr, b, kvh, p.page_size,
                    p.page_shift, p.num_blocks};
  auto issue_stage = [&](int st, int buf) {  // the codes and norms of stage st into buffer buf
    const int ts0 = t0 + st * TS;
    stage_codes<C::PWK, C::RSK, TS>(codes_k + buf * TS * C::RSK, p.kc, p.kc_s0, p.kc_s1, p.kc_s2, tm, ts0, t_end,
                                    p.kc_vec);
    stage_codes<C::PWV, C::RSV, TS>(codes_v + buf * TS * C::RSV, p.vc, p.vc_s0, p.vc_s1, p.vc_s2, tm, ts0, t_end,
                                    p.vc_vec);
    for (int i = tid; i < 2 * TS; i += kAuraThreads) {
      const int r = i % TS, t = ts0 + r;
      const bool valid = t < t_end;  // zero-filled: p * norm_V = 0 for rows past the block
      if (i < TS) {
        cp_async<4>(norms_k + buf * TS + r, p.kn + (valid ? tm.offset(p.kn_s0, p.kn_s1, p.kn_s2, t) : 0), valid);
      } else {
        cp_async<4>(norms_v + buf * TS + r, p.vn + (valid ? tm.offset(p.vn_s0, p.vn_s1, p.vn_s2, t) : 0), valid);
      }
    }
    cp_async_commit();
  };
  const int n_stages = ceil_div(t_end - t0, TS);
  issue_stage(0, 0);  // in flight while the tables and queries are prepared

  // Padding words of the staged rows are read (masked) by the 3-bit funnel shift: keep them defined.
  for (int i = tid; i < 2 * TS; i += kAuraThreads) {
    for (int w = C::PWK; w < C::RSK; ++w) codes_k[i * C::RSK + w] = 0u;
    for (int w = C::PWV; w < C::RSV; ++w) codes_v[i * C::RSV + w] = 0u;
  }
  fill_code_table<KB>(table_k, p.k_cb);
  fill_code_table<VB>(table_v, p.v_cb);
  for (int i = tid; i < kMaxRowTiles * 8 * C::PROW; i += kAuraThreads) ps[i] = 0;  // unused rows stay 0
  for (int r = tid; r < kMaxRowsPerCta; r += kAuraThreads) ms[r] = -INFINITY, ls[r] = 0.f, as[r] = 1.f;
  stage_q_columns<D, C::QROW>(p, blk, qs, R, lane, warp);
  __syncthreads();

  const int nrt = ceil_div(R, kQRowsPerTile);
  const unsigned char* lane_table_k = table_k + (lane % CodeTable<KB>::kCopies) * CodeTable<KB>::kEntryBytes;
  const unsigned char* lane_table_v = table_v + (lane % CodeTable<VB>::kCopies) * CodeTable<VB>::kEntryBytes;
  const uint32_t* qs32 = reinterpret_cast<const uint32_t*>(qs);
  const uint32_t* ps32 = reinterpret_cast<const uint32_t*>(ps);
  float acc[C::MT_PER_WARP][kMaxRowTiles][4] = {};

  for (int st = 0; st < n_stages; ++st) {
    if (st + 1 < n_stages) {
      issue_stage(st + 1, (st + 1) & 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int buf = st & 1, ts0 = t0 + st * TS;
    const uint32_t* kcs = codes_k + buf * TS * C::RSK;
    const uint32_t* vcs = codes_v + buf * TS * C::RSV;
    const float* kns = norms_k + buf * TS;
    const float* vns = norms_v + buf * TS;

    exact_qk<D, KB, VB>(kcs, kns, lane_table_k, qs32, ss, nrt, warp, g4, c4);
    __syncthreads();
    exact_softmax<D, KB, VB>(p, blk, ss, vns, ps, ms, ls, as, R, ts0, t_end, lane, warp);
    __syncthreads();
    exact_pv<D, KB, VB>(vcs, lane_table_v, ps32, as, nrt, warp, g4, c4, acc);
    __syncthreads();  // the next stage's loads overwrite this buffer, ss and ps
  }
  store_exact_partial<D, KB, VB>(p, blk, ms, ls, acc, R, nrt, warp, g4, c4);
}

}  // namespace aura
