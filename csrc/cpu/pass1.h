// The CPU kernels' shared attention machinery: pass 1 (split-K partials of an online softmax over
// tiles of K and V rows) and the log-sum-exp merge, for AURA's compressed rows (aura.cpp: codes
// dequantised through byte tables, one norm per row) and for dense fp32 / bf16 / fp16 rows
// (decode.cpp). Included by both; everything here is internal to each translation unit.
//
// Pass 1 work item = (sequence b, KV head, block n). Inside an item, tiles of TILE rows are loaded
// once as fp32 and shared by the G query heads of the group and the L causal queries; scores and the
// V accumulation run an online softmax over the tiles, which gives the reference's (max, sum,
// weighted sum) up to fp32 rounding.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__  // (MSVC targets are all little-endian)
#error "code streams and 16-bit floats are read as little-endian bytes (aura-format.md §6)"
#endif

// x86-64: one baseline build plus an AVX2/FMA clone picked at load time (ifunc), so a binary built
// on one machine runs on any x86-64 and still uses the wide units where they exist.
#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__)
#define AURA_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define AURA_CLONES
#endif

// Helpers of a cloned function must be inlined into it to run on its wide units: a separate copy is
// compiled for the baseline target.
#if defined(__GNUC__)
#define AURA_INLINE inline __attribute__((always_inline))
#else
#define AURA_INLINE inline
#endif

namespace aura_cpu {
namespace {

// Floats of work under which starting another thread (~20-50 us) costs more than it saves.
constexpr int64_t MIN_THREAD_WORK = int64_t(1) << 16;
constexpr int TILE = 32;  // tokens dequantised together (K, V tiles stay in L1/L2); a multiple of 4 (dot4)

// Byte -> its 8 / bits codebook values, built once per call for bits 2 and 4 (an 8-bit code byte
// indexes the codebook itself; 3-bit codes straddle bytes and are looked up one by one).
struct ByteTable {
  int bits;
  std::vector<float> values;  // [256][8 / bits]
  const float* codebook;

  ByteTable(const float* cb, int b) : bits(b), codebook(cb) {
    if (b != 2 && b != 4) return;
    const int per_byte = 8 / b;
    values.resize(256 * per_byte);
    for (int byte = 0; byte < 256; ++byte)
      for (int j = 0; j < per_byte; ++j) values[byte * per_byte + j] = cb[(byte >> (j * b)) & ((1 << b) - 1)];
  }
};

template <int W>  // W = codes per byte: 8 bytes per step, one fixed-size table copy per byte, no call
static inline void expand_bytes(const float* __restrict table, const uint8_t* __restrict src, int64_t bytes,
                                float* __restrict dst) {
  for (int64_t i = 0; i < bytes; i += 8) {  // bytes = D * b / 8 is a multiple of 8 for every D, b
    uint64_t word;
    std::memcpy(&word, src + i, sizeof word);
    for (int k = 0; k < 8; ++k)
      std::memcpy(dst + (i + k) * W, table + ((word >> (8 * k)) & 0xFF) * W, sizeof(float) * W);
  }
}

// Codes of one vector (a little-endian bit stream, code j at bits [j b, j b + b)) -> D floats.
static inline void dequantise(const ByteTable& t, const uint8_t* src, int64_t D, float* dst) {
  switch (t.bits) {
    case 8: expand_bytes<1>(t.codebook, src, D, dst); break;
    case 4: expand_bytes<2>(t.values.data(), src, D / 2, dst); break;
    case 2: expand_bytes<4>(t.values.data(), src, D / 4, dst); break;
    default:  // 3 bits: 8 codes in every 3 bytes (D is a multiple of 8)
      for (int64_t i = 0; i < D / 8; ++i) {
        const uint32_t v = src[3 * i] | (uint32_t(src[3 * i + 1]) << 8) | (uint32_t(src[3 * i + 2]) << 16);
        for (int j = 0; j < 8; ++j) dst[8 * i + j] = t.codebook[(v >> (3 * j)) & 7];
      }
  }
}

// s[i] = q . k[i] for 4 rows at once: four independent accumulators hide the FMA latency.
static AURA_INLINE void dot4(const float* q, const float* const* k, int64_t D, float* s) {
  const float *k0 = k[0], *k1 = k[1], *k2 = k[2], *k3 = k[3];
  float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
#pragma omp simd reduction(+ : d0, d1, d2, d3)
  for (int64_t j = 0; j < D; ++j) {
    d0 += q[j] * k0[j];
    d1 += q[j] * k1[j];
    d2 += q[j] * k2[j];
    d3 += q[j] * k3[j];
  }
  s[0] = d0, s[1] = d1, s[2] = d2, s[3] = d3;
}

// Runs fn(first, step) on `threads` threads (the caller included): item i goes to thread i % threads.
// One thread when the call's work (in floats touched) is too small to pay for starting others.
template <class F>
static int parallel(int64_t items, int64_t threads, int64_t work, const F& fn) {
  threads = work < 2 * MIN_THREAD_WORK ? 1 : std::max<int64_t>(1, std::min<int64_t>(threads, items));
  try {
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < threads; ++t) pool.emplace_back(fn, t, threads);
    fn(0, threads);
    for (auto& th : pool) th.join();
  } catch (...) {  // no thread or no memory: reported as an error code, never thrown across C
    return 1;
  }
  return 0;
}

// Where pass 1 reads one side's (K's or V's) rows. Strides in bytes: (b, h, t) of a contiguous cache,
// (page, row, h) of a paged one.
enum class RowKind : int64_t { Codes = 0, F32 = 1, BF16 = 2, F16 = 3 };

struct RowSource {
  RowKind kind;
  const uint8_t* rows;
  int64_t stride[3];
  const float* norms = nullptr;  // Codes: one fp32 norm per row, strides in floats
  int64_t norm_stride[3] = {0, 0, 0};
  const ByteTable* table = nullptr;  // Codes: the codebook's byte table
};

static inline float half_to_float(uint16_t h) {  // IEEE binary16, subnormals and non-finites included
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1Fu) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else {  // zero or subnormal: man * 2^-24, exact in fp32
    float f = float(man) * 5.9604644775390625e-08f;
    std::memcpy(&bits, &f, sizeof bits);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Row (c0, c1, c2) of a side as D fp32 values, and its norm (1 for dense rows: scores and weights are
// multiplied by it, exactly): an fp32 row is read where it lies, any other is converted into buf.
static AURA_INLINE const float* row_of(const RowSource& s, int64_t c0, int64_t c1, int64_t c2, int64_t D, float* buf,
                                  float* norm) {
  const uint8_t* row = s.rows + c0 * s.stride[0] + c1 * s.stride[1] + c2 * s.stride[2];
  *norm = 1.0f;
  switch (s.kind) {
    case RowKind::Codes:
      dequantise(*s.table, row, D, buf);
      *norm = s.norms[c0 * s.norm_stride[0] + c1 * s.norm_stride[1] + c2 * s.norm_stride[2]];
      return buf;
    case RowKind::F32:
      return reinterpret_cast<const float*>(row);
    case RowKind::BF16: {  // a bf16 is the high half of its fp32: one shift per element, vectorised
      const uint16_t* h = reinterpret_cast<const uint16_t*>(row);  // rows are 2-byte aligned (unit stride)
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) {
        const uint32_t bits = uint32_t(h[j]) << 16;
        std::memcpy(buf + j, &bits, sizeof bits);  // a bit cast, not a type pun
      }
      return buf;
    }
    case RowKind::F16:
      for (int64_t j = 0; j < D; ++j) {
        uint16_t h;
        std::memcpy(&h, row + 2 * j, sizeof h);
        buf[j] = half_to_float(h);
      }
      return buf;
  }
  return buf;
}

// The geometry of one pass-1 call.
struct Pass1 {
  const float* q;  // [B, L, Hq, D] contiguous fp32, already scaled (and, for AURA, rotated)
  const int32_t* seq_lens;  // [B] contiguous
  const int32_t* block_table;  // [B, max_pages] or null (contiguous cache)
  int64_t bt_stride[2];
  int64_t B, L, Hq, Hkv, D, capacity, page_size, block_size, num_blocks;
  float* o;  // [B, L, Hq, NB, D]
  float* m;  // [B, L, Hq, NB]
  float* l;
  int64_t threads;
};

// exp(x) for x <= 0 (scores minus their running max), written so the compiler vectorises it (libm's
// expf is a scalar call per token and query). 2^n * e^r with |r| <= ln2 / 2 and a degree-6 Taylor
// polynomial: relative error ~2.5e-7, about 1 ulp; x below -86 returns 0 (e^-86 < 5e-38 adds
// nothing next to the max's p = 1, and keeps 2^n * p a normal float).
static AURA_INLINE float exp_nonpositive(float x) {
  const float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187e-06f;
  const float kRound = 12582912.0f;  // 1.5 * 2^23: (v + kRound) - kRound rounds v to the nearest integer
  const bool tiny = x < -86.0f;
  x = tiny ? 0.0f : x;
  const float n = (x * kLog2e + kRound) - kRound;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += int32_t(n) * (1 << 23);  // times 2^n (n in [-124, 0]: the result stays a normal float)
  float e;
  std::memcpy(&e, &bits, sizeof e);
  return tiny ? 0.0f : e;
}

// Locality 1 (prefetcht2): the next tile waits in L2 and leaves L1 to the tile being computed.
#if defined(__GNUC__)
#define AURA_PREFETCH(p) __builtin_prefetch((p), 0, 1)
#else
#define AURA_PREFETCH(p) ((void)(p))
#endif

// The next tile's rows of one side, prefetched a few at a time between pieces of this tile's work (a
// whole tile at once fills the core's miss buffers, and the work then waits behind its own prefetches).
struct Pump {
  const uint8_t* rows[TILE];
  const float* norms[TILE];
  int64_t n = 0, bytes = 0, done = 0;

  void set(const RowSource& s, int64_t i, const int64_t* c) {
    rows[i] = s.rows + c[0] * s.stride[0] + c[1] * s.stride[1] + c[2] * s.stride[2];
    norms[i] = s.norms ? s.norms + c[0] * s.norm_stride[0] + c[1] * s.norm_stride[1] + c[2] * s.norm_stride[2] : nullptr;
  }
  // Never inlined: inside the FP loops it changed their code (its trip count follows the thread's next
  // item), and the output differed in the last bit between thread counts.
  __attribute__((noinline)) void upto(int64_t r) {  // rows [done, r) of the n
    for (r = std::min(r, n); done < r; ++done) {
      for (int64_t off = 0; off < bytes; off += 64) AURA_PREFETCH(rows[done] + off);
      if (norms[done]) AURA_PREFETCH(norms[done]);
    }
  }
};

struct Scratch {
  std::vector<float> k, v, kn, vn, s, pv, acc, run_m, run_l, zeros;  // pv, acc: rows padded to a multiple of 4
  std::vector<uint8_t> poisoned;
  const float* krow[TILE];  // the tile's rows: in the cache (fp32) or in k / v (converted)
  const float* vrow[TILE];
  const uint8_t* kraw[TILE + 8];  // the dense item's rows as they lie (decode.cpp), padded to its token blocks
  const uint8_t* vraw[TILE];
  Pump kpump, vpump;
};

constexpr int RB = 4, JB = 16;  // V accumulation register block: up to 4 query rows x 16 dims

// acc[r][:] += sum_i pv[r][i] * v[i][:] for R <= RB rows r: each V load feeds R FMAs and the R x 16
// accumulators stay in registers over the tile's tokens.
template <int R>
static AURA_INLINE void accumulate_v(const float* pv, const float* const* v, int64_t nt, int64_t D, float* acc,
                                     Pump& pump) {
  for (int64_t j0 = 0; j0 < D; j0 += JB) {
    pump.upto((j0 + JB) * pump.n / D);
    float a[R][JB];
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < JB; ++j) a[r][j] = acc[r * D + j0 + j];
    for (int64_t i = 0; i < nt; ++i) {
      const float* vi = v[i] + j0;
      for (int r = 0; r < R; ++r) {
        const float p = pv[r * TILE + i];
        for (int j = 0; j < JB; ++j) a[r][j] += p * vi[j];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < JB; ++j) acc[r * D + j0 + j] = a[r][j];
  }
}

// All `rows` query rows of an item, RB at a time, then the remainder (a GQA group of 2 does no work
// for padding rows).
static AURA_INLINE void accumulate_rows(const float* pv, const float* const* v, int64_t nt, int64_t D, float* acc,
                                   int64_t rows, Pump& pump) {
  int64_t r0 = 0;
  for (; r0 + RB <= rows; r0 += RB) accumulate_v<RB>(pv + r0 * TILE, v, nt, D, acc + r0 * D, pump);
  switch (rows - r0) {
    case 3: accumulate_v<3>(pv + r0 * TILE, v, nt, D, acc + r0 * D, pump); break;
    case 2: accumulate_v<2>(pv + r0 * TILE, v, nt, D, acc + r0 * D, pump); break;
    case 1: accumulate_v<1>(pv + r0 * TILE, v, nt, D, acc + r0 * D, pump); break;
    default: break;
  }
}

// Bytes of one row of a side (codes: D * bits / 8).
static inline int64_t row_bytes(const RowSource& s, int64_t D) {
  switch (s.kind) {
    case RowKind::Codes: return D * s.table->bits / 8;
    case RowKind::F32: return 4 * D;
    default: return 2 * D;
  }
}

// The cache coordinates of token t of (sequence b, KV head h): (b, h, t) or (page, row, h).
static AURA_INLINE void coords(const Pass1& a, int64_t b, int64_t h, int64_t t, int64_t* c) {
  if (a.block_table) {
    c[0] = a.block_table[b * a.bt_stride[0] + (t / a.page_size) * a.bt_stride[1]];
    c[1] = t % a.page_size;
    c[2] = h;
  } else {
    c[0] = b, c[1] = h, c[2] = t;
  }
}

// The live token range [t0, t_end) of an item and its (b, h).
struct ItemSpan {
  int64_t b, h, n, t0, t_end;
};

static AURA_INLINE ItemSpan item_span(const Pass1& a, int64_t item) {
  const int64_t NB = a.num_blocks;
  ItemSpan s;
  s.n = item % NB, s.h = (item / NB) % a.Hkv, s.b = item / (NB * a.Hkv);
  s.t0 = s.n * a.block_size;
  s.t_end = std::min({s.t0 + a.block_size, a.capacity, int64_t(a.seq_lens[s.b])});
  return s;
}

// Query row r of an item's scratch into partial `row` of o / m / l.
static inline void store_partial(const Pass1& a, const Scratch& w, int64_t r, int64_t row) {
  float* o = a.o + row * a.D;
  if (w.poisoned[r]) {  // NaN / Inf data: the reference's partial is NaN, so is ours
    const float NaN = std::numeric_limits<float>::quiet_NaN();
    std::fill(o, o + a.D, NaN);
    a.m[row] = NaN;
    a.l[row] = NaN;
  } else {
    std::memcpy(o, &w.acc[r * a.D], sizeof(float) * a.D);
    a.m[row] = w.run_m[r];
    a.l[row] = w.run_l[r];
  }
}

AURA_CLONES void run_item(const Pass1& a, const RowSource& k, const RowSource& v, int64_t item, int64_t next_item,
                          Scratch& w) {
  const int64_t NB = a.num_blocks, D = a.D, G = a.Hq / a.Hkv, L = a.L;
  const ItemSpan span = item_span(a, item);
  const int64_t n = span.n, h = span.h, b = span.b;
  const int64_t seq = a.seq_lens[b];
  const int64_t t0 = span.t0, t_end = span.t_end;
  // The rows after this tile (this item's next tile, else the next item's first) are prefetched while
  // this tile is computed: DRAM latency hides behind the work, and 4 KiB pages stop the hardware's
  // prefetcher at every page of a paged cache.
  const ItemSpan next = next_item >= 0 ? item_span(a, next_item) : ItemSpan{0, 0, 0, 0, 0};
  const int64_t kbytes = row_bytes(k, D), vbytes = row_bytes(v, D);
  const int64_t R = L * G;  // query rows of this item: (l, g)
  const float NEG_INF = -std::numeric_limits<float>::infinity();
  std::fill(w.acc.begin(), w.acc.end(), 0.0f);
  std::fill(w.run_m.begin(), w.run_m.begin() + R, NEG_INF);
  std::fill(w.run_l.begin(), w.run_l.begin() + R, 0.0f);
  std::fill(w.poisoned.begin(), w.poisoned.begin() + R, 0);

  for (int64_t ts = t0; ts < t_end; ts += TILE) {
    const int64_t nt = std::min<int64_t>(TILE, t_end - ts);
    const bool same = ts + TILE < t_end;
    const int64_t pb = same ? b : next.b, ph = same ? h : next.h, pt = same ? ts + TILE : next.t0;
    const int64_t pn = std::max<int64_t>(0, std::min<int64_t>(TILE, same ? t_end - pt : next.t_end - next.t0));
    w.kpump.n = w.vpump.n = pn;
    w.kpump.bytes = kbytes, w.vpump.bytes = vbytes;
    w.kpump.done = w.vpump.done = 0;
    for (int64_t i = 0; i < pn; ++i) {
      int64_t c[3];
      coords(a, pb, ph, pt + i, c);
      w.kpump.set(k, i, c);
      w.vpump.set(v, i, c);
    }
    for (int64_t i = 0; i < nt; ++i) {
      int64_t c[3];  // (b, h, t) or (page, row, h)
      coords(a, b, h, ts + i, c);
      w.krow[i] = row_of(k, c[0], c[1], c[2], D, &w.k[i * D], &w.kn[i]);
      w.vrow[i] = row_of(v, c[0], c[1], c[2], D, &w.v[i * D], &w.vn[i]);
    }
    for (int64_t i = nt; i < (nt + 3) / 4 * 4; ++i) w.krow[i] = w.zeros.data();  // dot4 reads groups of 4 rows
    // Scores and the online-softmax update per query row; pv[r][i] = p * norm_V, 0 where row r does
    // not see token i (never 0 * a NaN norm: unseen tokens add exactly nothing).
    std::fill(w.pv.begin(), w.pv.end(), 0.0f);
    for (int64_t lq = 0; lq < L; ++lq) {
      const int64_t last = seq - L + lq;  // causal query lq sees t <= last (L = 1: every live token)
      const int64_t seen = std::min<int64_t>(nt, last - ts + 1);
      if (seen <= 0) continue;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t r = lq * G + g;
        const float* q = a.q + ((b * L + lq) * a.Hq + h * G + g) * D;
        float* s = &w.s[0];
        float tile_max = NEG_INF;
        for (int64_t i = 0; i < seen; i += 4) {
          w.kpump.upto(w.kpump.done + 4);
          dot4(q, &w.krow[i], D, s + i);  // rows past nt are zeros
        }
        for (int64_t i = 0; i < seen; ++i) {
          s[i] *= w.kn[i];
          if (std::isnan(s[i])) w.poisoned[r] = 1;
          tile_max = std::max(tile_max, s[i]);
        }
        if (w.poisoned[r]) continue;  // the row's partial is NaN whatever comes next
        const float m_new = std::max(w.run_m[r], tile_max);
        if (m_new == NEG_INF) continue;  // every score -inf: nothing to add
        const float rescale = w.run_m[r] == NEG_INF ? 0.0f : std::exp(w.run_m[r] - m_new);
        float* acc = &w.acc[r * D];
        if (rescale != 1.0f) {
          for (int64_t j = 0; j < D; ++j) acc[j] *= rescale;
        }
        float l_sum = w.run_l[r] * rescale;
        float* pv = &w.pv[r * TILE];
#pragma omp simd reduction(+ : l_sum)
        for (int64_t i = 0; i < seen; ++i) {
          const float p = exp_nonpositive(s[i] - m_new);
          l_sum += p;
          pv[i] = p * w.vn[i];
        }
        w.run_m[r] = m_new;
        w.run_l[r] = l_sum;
      }
    }
    accumulate_rows(w.pv.data(), w.vrow, nt, D, w.acc.data(), R, w.vpump);
    w.kpump.upto(pn);
    w.vpump.upto(pn);
  }
  for (int64_t lq = 0; lq < L; ++lq)
    for (int64_t g = 0; g < G; ++g) store_partial(a, w, lq * G + g, ((b * L + lq) * a.Hq + h * G + g) * NB + n);
}

// Every item of a pass-1 call on a.threads threads, through item(a, k, v, item, next_item, scratch)
// (run_item unless a caller has a specialised one); 0, or 1 where a thread could not start.
template <class Item>
inline int run_pass1(const Pass1& a, const RowSource& k, const RowSource& v, const Item& item_fn) {
  const int64_t items = a.B * a.Hkv * a.num_blocks;
  const int64_t rows = a.L * (a.Hq / a.Hkv);
  auto run = [&](int64_t first, int64_t step) {
    Scratch w;
    w.k.resize(TILE * a.D);
    w.zeros.assign(a.D, 0.0f);
    w.v.resize(TILE * a.D);
    w.kn.resize(TILE);
    w.vn.resize(TILE);
    w.s.resize(TILE);
    const int64_t padded = (rows + RB - 1) / RB * RB;
    w.pv.resize(padded * TILE);
    w.acc.resize(padded * a.D);
    w.run_m.resize(rows);
    w.run_l.resize(rows);
    w.poisoned.resize(rows);
    for (int64_t item = first; item < items; item += step) item_fn(a, k, v, item, item + step < items ? item + step : -1, w);
  };
  return parallel(items, a.threads, a.B * a.L * a.Hq * a.capacity * a.D, run);
}

inline int run_pass1(const Pass1& a, const RowSource& k, const RowSource& v) {
  return run_pass1(a, k, v, [](const Pass1& a, const RowSource& k, const RowSource& v, int64_t item, int64_t next,
                               Scratch& w) { run_item(a, k, v, item, next, w); });
}

// Log-sum-exp merge of the NB block partials of row r (reference merge_partials / aura_flash_p2): empty
// blocks (l == 0) are skipped, never weighted by 0; a live NaN partial makes the row NaN; no live block
// gives out = 0, lse = -inf. o [rows, NB, D], m / l [rows, NB] -> out [rows, D], lse [rows].
inline void merge_row(const float* o, const float* m, const float* l, int64_t r, int64_t NB, int64_t D, float* out,
                      float* lse) {
  const float NEG_INF = -std::numeric_limits<float>::infinity(), NaN = std::numeric_limits<float>::quiet_NaN();
  {
    const float *mr = m + r * NB, *lr = l + r * NB;
    float* y = out + r * D;
    bool poisoned = false;
    float M = NEG_INF;
    for (int64_t n = 0; n < NB; ++n) {
      poisoned |= lr[n] != 0.0f && (std::isnan(lr[n]) || std::isnan(mr[n]));
      if (lr[n] > 0.0f) M = std::max(M, mr[n]);
    }
    if (poisoned) {
      std::fill(y, y + D, NaN);
      lse[r] = NaN;
      return;
    }
    std::fill(y, y + D, 0.0f);
    if (!std::isfinite(M)) {  // no live block: out = 0, lse = -inf
      lse[r] = NEG_INF;
    } else {
      float l_sum = 0.0f;
      for (int64_t n = 0; n < NB; ++n) {
        if (!(lr[n] > 0.0f)) continue;
        const float w = std::exp(mr[n] - M);
        l_sum += w * lr[n];
        const float* on = o + (r * NB + n) * D;
        for (int64_t j = 0; j < D; ++j) y[j] += w * on[j];
      }
      for (int64_t j = 0; j < D; ++j) y[j] /= l_sum;
      lse[r] = M + std::log(l_sum);
    }
  }
}

}  // namespace
}  // namespace aura_cpu
