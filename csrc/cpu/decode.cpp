// Dense decode attention on the CPU (torch_aura/reference/decode.py's flash_decode): pass1.h over fp32,
// bf16 or fp16 rows read in place from a contiguous or paged cache, then the log-sum-exp merge. One
// call serves a whole ragged batch and reads no row past a sequence's length, where ATen's fused
// CPU attention needs a call per length (or a mask that still reads the padding).
#include "dense_avx2.h"
#include "pass1.h"

using namespace aura_cpu;

namespace {

// Mirrors torch_aura/cpu/native.py's _DecodeArgs field for field (ctypes.Structure).
struct DecodeArgs {
  const uint8_t* q;  // [B, Hq, D] of kind q_kind, unit last stride
  int64_t q_kind, q_stride[2];  // bytes (b, h)
  double scale;
  const uint8_t* k;
  const uint8_t* v;
  int64_t kind;  // RowKind of K and V (F32, BF16 or F16)
  int64_t k_stride[3], v_stride[3];  // bytes: contiguous (b, h, t) | paged (page, row, h)
  const int32_t* seq_lens;  // [B] contiguous
  const int32_t* block_table;  // [B, max_pages] or null (contiguous cache)
  int64_t bt_stride[2];
  int64_t B, Hq, Hkv, D, capacity, page_size, num_pages;  // num_pages: the paged cache's first dim
  uint8_t* out;  // [B, Hq, D] of kind out_kind, unit last stride
  int64_t out_kind, out_stride[2];  // bytes (b, h)
  float* lse;  // [B, Hq] fp32
  int64_t lse_stride[2];  // floats
  int64_t threads;
  int64_t portable;  // 1: pass1.h's portable item even where the AVX2 one could run (tests compare the two)
  int64_t bad[2];  // out: the (b, page) of the first invalid length or page index
};

// Pass-1 items per call the block size aims for (blocks x sequences x KV heads), and its shortest block.
constexpr int64_t ITEMS = 64, MIN_BLOCK = 256;

// Tokens per pass-1 item, from the shapes alone (so the answer does not depend on the thread count): one
// block per sequence where B * Hkv already gives ITEMS items, else up to ITEMS / (B * Hkv) blocks of at
// least MIN_BLOCK tokens, rounded up to whole tiles.
int64_t block_size(int64_t B, int64_t Hkv, int64_t max_len) {
  auto cdiv = [](int64_t x, int64_t y) { return (x + y - 1) / y; };
  const int64_t splits = std::max<int64_t>(1, std::min(cdiv(max_len, MIN_BLOCK), cdiv(ITEMS, std::max<int64_t>(B * Hkv, 1))));
  return std::max<int64_t>(TILE, cdiv(cdiv(max_len, splits), TILE) * TILE);
}

float load(RowKind kind, const uint8_t* p) {
  switch (kind) {
    case RowKind::BF16: {
      uint16_t h;
      std::memcpy(&h, p, sizeof h);
      const uint32_t bits = uint32_t(h) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
    case RowKind::F16: {
      uint16_t h;
      std::memcpy(&h, p, sizeof h);
      return half_to_float(h);
    }
    default: {
      float f;
      std::memcpy(&f, p, sizeof f);
      return f;
    }
  }
}

uint16_t float_to_bf16(float f) {  // round to nearest even, NaN to 0x7FC0: torch's own conversion
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::isnan(f)) return 0x7FC0u;
  return uint16_t((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

uint16_t float_to_half(float f) {  // IEEE binary16, round to nearest even (as the hardware conversion)
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return uint16_t(sign | 0x7E00u);  // NaN
  if (x >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // rounds to >= 65520: inf
  if (x < 0x38800000u) {  // below the smallest normal half: a subnormal (or zero), rounded once
    const float sub = std::fabs(f) * 16777216.0f;  // in units of 2^-24, exact
    const float r = std::nearbyint(sub);  // round-half-even under the default rounding mode
    return uint16_t(sign | uint32_t(r));
  }
  const uint32_t rounded = x + 0xFFFu + ((x >> 13) & 1u);
  return uint16_t(sign | ((rounded - 0x38000000u) >> 13));
}

void store(RowKind kind, uint8_t* p, float f) {
  switch (kind) {
    case RowKind::BF16: {
      const uint16_t h = float_to_bf16(f);
      std::memcpy(p, &h, sizeof h);
      break;
    }
    case RowKind::F16: {
      const uint16_t h = float_to_half(f);
      std::memcpy(p, &h, sizeof h);
      break;
    }
    default:
      std::memcpy(p, &f, sizeof f);
  }
}

// Pass 1 with the AVX2 item where the CPU has AVX2, FMA and F16C, else run_item.
int run_dense_pass1(const Pass1& p, const RowSource& k, const RowSource& v, bool portable) {
#ifdef AURA_HAVE_DENSE_AVX2
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           __builtin_cpu_supports("f16c");
  if (avx2 && !portable && p.L == 1) {
    switch (k.kind) {
      case RowKind::F32: return run_pass1(p, k, v, dense_item<RowKind::F32>);
      case RowKind::BF16: return run_pass1(p, k, v, dense_item<RowKind::BF16>);
      case RowKind::F16: return run_pass1(p, k, v, dense_item<RowKind::F16>);
      default: break;
    }
  }
#else
  (void)portable;
#endif
  return run_pass1(p, k, v);
}

}  // namespace

// 0: done; 1: a thread or an allocation failed; 2: a length outside [0, capacity] or a used page index
// outside [0, num_pages), at bad = (b, page index or -1): nothing was read past the cache, nothing written.
// Blocks of block_size tokens are pass 1's items; their partials live only for the call.
extern "C" int aura_cpu_flash_decode(DecodeArgs* a) {
  const int64_t B = a->B, Hq = a->Hq, D = a->D;
  int64_t max_len = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = a->seq_lens[b];
    if (n < 0 || n > a->capacity) {
      a->bad[0] = b, a->bad[1] = -1;
      return 2;
    }
    max_len = std::max(max_len, n);
    if (!a->block_table) continue;
    for (int64_t j = 0; j < (n + a->page_size - 1) / a->page_size; ++j) {
      const int64_t page = a->block_table[b * a->bt_stride[0] + j * a->bt_stride[1]];
      if (page < 0 || page >= a->num_pages) {
        a->bad[0] = b, a->bad[1] = j;
        return 2;
      }
    }
  }
  const int64_t bs = block_size(B, a->Hkv, max_len);
  const int64_t NB = std::max<int64_t>(1, (max_len + bs - 1) / bs);
  const int64_t rows = B * Hq;
  std::vector<float> q, o, m, l, y, z;
  try {
    q.resize(rows * D);
    o.resize(rows * NB * D);
    m.resize(rows * NB);
    l.resize(rows * NB);
    y.resize(rows * D);
    z.resize(rows);
  } catch (...) {
    return 1;
  }
  const RowKind q_kind = RowKind(a->q_kind), out_kind = RowKind(a->out_kind);
  const int64_t q_size = q_kind == RowKind::F32 ? 4 : 2, out_size = out_kind == RowKind::F32 ? 4 : 2;
  const float scale = float(a->scale);
  for (int64_t r = 0; r < rows; ++r) {  // q widened to fp32, then scaled (the reference's rounding order)
    const uint8_t* src = a->q + (r / Hq) * a->q_stride[0] + (r % Hq) * a->q_stride[1];
    for (int64_t j = 0; j < D; ++j) q[r * D + j] = load(q_kind, src + j * q_size) * scale;
  }
  const Pass1 p{q.data(), a->seq_lens, a->block_table, {a->bt_stride[0], a->bt_stride[1]}, B, 1, Hq, a->Hkv,
                D, max_len, a->page_size, bs, NB, o.data(), m.data(), l.data(), a->threads};
  const RowKind kind = RowKind(a->kind);
  const RowSource k{kind, a->k, {a->k_stride[0], a->k_stride[1], a->k_stride[2]}};
  const RowSource v{kind, a->v, {a->v_stride[0], a->v_stride[1], a->v_stride[2]}};
  if (run_dense_pass1(p, k, v, a->portable != 0) != 0) return 1;
  if (parallel(rows, a->threads, rows * NB * D, [&](int64_t first, int64_t step) {
        for (int64_t r = first; r < rows; r += step) merge_row(o.data(), m.data(), l.data(), r, NB, D, y.data(), z.data());
      }) != 0)
    return 1;
  for (int64_t r = 0; r < rows; ++r) {  // rounded once to out's dtype, into out's strides
    uint8_t* dst = a->out + (r / Hq) * a->out_stride[0] + (r % Hq) * a->out_stride[1];
    for (int64_t j = 0; j < D; ++j) store(out_kind, dst + j * out_size, y[r * D + j]);
    a->lse[(r / Hq) * a->lse_stride[0] + (r % Hq) * a->lse_stride[1]] = z[r];
  }
  return 0;
}
