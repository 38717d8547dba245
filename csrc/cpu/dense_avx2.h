// Pass 1 of dense decode (one query per sequence, fp32 / bf16 / fp16 rows) with AVX2 + FMA (+ F16C for
// fp16) intrinsics, chosen at run time by decode.cpp where the CPU has them: the same item, online
// softmax and outputs as pass1.h's run_item, with K read once for up to 4 query heads of the group and
// blocks of 2-4 tokens (8 independent FMA chains, one horizontal sum for 8 scores), bf16 / fp16 widened
// in registers rather than through a buffer, and the next tile's rows prefetched between token blocks.
#pragma once

#include "pass1.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define AURA_HAVE_DENSE_AVX2 1
#include <immintrin.h>

#define AURA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define AURA_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

namespace aura_cpu {
namespace {

template <RowKind KIND>
AURA_AVX2_INLINE __m256 load8(const uint8_t* p) {  // 8 consecutive elements of a row as fp32
  if constexpr (KIND == RowKind::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (KIND == RowKind::BF16) {  // a bf16 is the high half of its fp32
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

// [sum v0, ..., sum v7]
AURA_AVX2_INLINE __m256 hsum8(const __m256* v) {
  const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

// s[g * TILE + i0 + t] = q_g . row[i0 + t] for GC query rows and TB tokens (GC * TB <= 8 accumulators).
template <RowKind KIND, int GC, int TB>
AURA_AVX2_INLINE void score_block(const float* q, int64_t D, const uint8_t* const* row, float* s) {
  constexpr int64_t ES = KIND == RowKind::F32 ? 4 : 2;
  __m256 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t j = 0; j < D; j += 8) {
    __m256 kv[TB];
    for (int t = 0; t < TB; ++t) kv[t] = load8<KIND>(row[t] + j * ES);
    for (int g = 0; g < GC; ++g) {
      const __m256 qv = _mm256_loadu_ps(q + g * D + j);
      for (int t = 0; t < TB; ++t) acc[g * TB + t] = _mm256_fmadd_ps(qv, kv[t], acc[g * TB + t]);
    }
  }
  alignas(32) float sums[8];
  _mm256_store_ps(sums, hsum8(acc));
  for (int g = 0; g < GC; ++g)
    for (int t = 0; t < TB; ++t) s[g * TILE + t] = sums[g * TB + t];
}

template <RowKind KIND, int GC>
AURA_AVX2_INLINE void score_rows(const float* q, int64_t D, const uint8_t* const* row, int64_t nt, float* s,
                                 Pump& pump) {
  constexpr int TB = GC == 1 ? 8 : GC == 2 ? 4 : 2;  // rows past nt are the zero row
  for (int64_t i = 0; i < nt; i += TB) {
    pump.upto(pump.done + TB);
    score_block<KIND, GC, TB>(q, D, row + i, s + i);
  }
}

// acc[g][:] += sum_i p[g][i] * v[i][:] for GC rows: each V load feeds GC FMAs, 16 dims at a time.
template <RowKind KIND, int GC>
AURA_AVX2_INLINE void accumulate_block(const float* p, const uint8_t* const* row, int64_t nt, int64_t D, float* acc,
                                       Pump& pump) {
  constexpr int64_t ES = KIND == RowKind::F32 ? 4 : 2;
  for (int64_t j = 0; j < D; j += 16) {
    pump.upto((j + 16) * pump.n / D);
    __m256 a0[GC], a1[GC];
    for (int g = 0; g < GC; ++g) a0[g] = _mm256_loadu_ps(acc + g * D + j), a1[g] = _mm256_loadu_ps(acc + g * D + j + 8);
    for (int64_t i = 0; i < nt; ++i) {
      const __m256 v0 = load8<KIND>(row[i] + j * ES), v1 = load8<KIND>(row[i] + (j + 8) * ES);
      for (int g = 0; g < GC; ++g) {
        const __m256 pg = _mm256_broadcast_ss(p + g * TILE + i);
        a0[g] = _mm256_fmadd_ps(pg, v0, a0[g]);
        a1[g] = _mm256_fmadd_ps(pg, v1, a1[g]);
      }
    }
    for (int g = 0; g < GC; ++g) _mm256_storeu_ps(acc + g * D + j, a0[g]), _mm256_storeu_ps(acc + g * D + j + 8, a1[g]);
  }
}

// Byte addresses of n rows of side s from token t of (b, h), walking the block table a page at a time.
AURA_AVX2_INLINE void row_addresses(const Pass1& a, const RowSource& s, int64_t b, int64_t h, int64_t t, int64_t n,
                                    const uint8_t** out) {
  if (!a.block_table) {
    const uint8_t* base = s.rows + b * s.stride[0] + h * s.stride[1];
    for (int64_t i = 0; i < n; ++i) out[i] = base + (t + i) * s.stride[2];
    return;
  }
  int64_t page = t / a.page_size, slot = t % a.page_size;
  const uint8_t* base = s.rows + a.block_table[b * a.bt_stride[0] + page * a.bt_stride[1]] * s.stride[0] + h * s.stride[2];
  for (int64_t i = 0; i < n; ++i) {
    out[i] = base + slot * s.stride[1];
    if (++slot == a.page_size && i + 1 < n) {
      slot = 0, ++page;
      base = s.rows + a.block_table[b * a.bt_stride[0] + page * a.bt_stride[1]] * s.stride[0] + h * s.stride[2];
    }
  }
}

template <RowKind KIND>
AURA_AVX2 void dense_item(const Pass1& a, const RowSource& k, const RowSource& v, int64_t item, int64_t next_item,
                          Scratch& w) {
  const int64_t NB = a.num_blocks, D = a.D, G = a.Hq / a.Hkv;
  const ItemSpan span = item_span(a, item);
  const int64_t n = span.n, h = span.h, b = span.b, t0 = span.t0, t_end = span.t_end;
  const ItemSpan next = next_item >= 0 ? item_span(a, next_item) : ItemSpan{0, 0, 0, 0, 0};
  const int64_t bytes = D * (KIND == RowKind::F32 ? 4 : 2);
  const float NEG_INF = -std::numeric_limits<float>::infinity();
  const float* q = a.q + (b * a.Hq + h * G) * D;
  const uint8_t* zero_row = reinterpret_cast<const uint8_t*>(w.zeros.data());
  std::fill(w.acc.begin(), w.acc.begin() + G * D, 0.0f);
  std::fill(w.run_m.begin(), w.run_m.begin() + G, NEG_INF);
  std::fill(w.run_l.begin(), w.run_l.begin() + G, 0.0f);
  std::fill(w.poisoned.begin(), w.poisoned.begin() + G, 0);
  w.kpump.bytes = w.vpump.bytes = bytes;

  for (int64_t ts = t0; ts < t_end; ts += TILE) {
    const int64_t nt = std::min<int64_t>(TILE, t_end - ts);
    const bool same = ts + TILE < t_end;
    const int64_t pb = same ? b : next.b, ph = same ? h : next.h, pt = same ? ts + TILE : next.t0;
    const int64_t pn = std::max<int64_t>(0, std::min<int64_t>(TILE, same ? t_end - pt : next.t_end - next.t0));
    row_addresses(a, k, pb, ph, pt, pn, w.kpump.rows);
    row_addresses(a, v, pb, ph, pt, pn, w.vpump.rows);
    for (int64_t i = 0; i < pn; ++i) w.kpump.norms[i] = w.vpump.norms[i] = nullptr;
    w.kpump.n = w.vpump.n = pn;
    w.kpump.done = w.vpump.done = 0;
    row_addresses(a, k, b, h, ts, nt, w.kraw);
    row_addresses(a, v, b, h, ts, nt, w.vraw);
    for (int64_t i = nt; i < TILE + 8; ++i) w.kraw[i] = zero_row;

    float* s = w.pv.data();  // scores, then p, per row: [G][TILE]
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
      const float* qg = q + g0 * D;
      float* sg = s + g0 * TILE;
      switch (std::min<int64_t>(4, G - g0)) {
        case 1: score_rows<KIND, 1>(qg, D, w.kraw, nt, sg, w.kpump); break;
        case 2: score_rows<KIND, 2>(qg, D, w.kraw, nt, sg, w.kpump); break;
        case 3: score_rows<KIND, 3>(qg, D, w.kraw, nt, sg, w.kpump); break;
        default: score_rows<KIND, 4>(qg, D, w.kraw, nt, sg, w.kpump); break;
      }
    }
    // The online-softmax update of each row, as run_item's (dense rows: norms of 1).
    for (int64_t g = 0; g < G; ++g) {
      float* pg = s + g * TILE;
      float tile_max = NEG_INF;
      bool nan = false;  // branch-free, so the loop vectorises
      for (int64_t i = 0; i < nt; ++i) {
        nan |= pg[i] != pg[i];
        tile_max = std::max(tile_max, pg[i]);
      }
      w.poisoned[g] |= nan;
      const float m_new = std::max(w.run_m[g], tile_max);
      if (w.poisoned[g] || m_new == NEG_INF) {  // adds nothing (a poisoned row's partial is NaN anyway)
        std::fill(pg, pg + nt, 0.0f);
        continue;
      }
      const float rescale = w.run_m[g] == NEG_INF ? 0.0f : std::exp(w.run_m[g] - m_new);
      float* acc = &w.acc[g * D];
      if (rescale != 1.0f) {
        for (int64_t j = 0; j < D; ++j) acc[j] *= rescale;
      }
      float l_sum = w.run_l[g] * rescale;
      for (int64_t i = 0; i < nt; ++i) {
        const float p = exp_nonpositive(pg[i] - m_new);
        l_sum += p;
        pg[i] = p;
      }
      w.run_m[g] = m_new;
      w.run_l[g] = l_sum;
    }
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
      const float* pg = s + g0 * TILE;
      float* acc = &w.acc[g0 * D];
      switch (std::min<int64_t>(4, G - g0)) {
        case 1: accumulate_block<KIND, 1>(pg, w.vraw, nt, D, acc, w.vpump); break;
        case 2: accumulate_block<KIND, 2>(pg, w.vraw, nt, D, acc, w.vpump); break;
        case 3: accumulate_block<KIND, 3>(pg, w.vraw, nt, D, acc, w.vpump); break;
        default: accumulate_block<KIND, 4>(pg, w.vraw, nt, D, acc, w.vpump); break;
      }
    }
    w.kpump.upto(pn);
    w.vpump.upto(pn);
  }
  for (int64_t g = 0; g < G; ++g) store_partial(a, w, g, (b * a.Hq + h * G + g) * NB + n);
}

}  // namespace
}  // namespace aura_cpu
#endif
