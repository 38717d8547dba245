// AURA on the CPU: the encode, rotation, pass 1 and pass 2 of torch_aura/reference/aura.py
// (docs/aura-format.md §5-8) as plain C++ with C entry points, loaded with ctypes by
// torch_aura/cpu/native.py: no torch headers, so one build serves every torch version. Pass 1 and the
// merge are pass1.h's, over rows dequantised through a byte table (a 256-entry table maps a code byte
// to its 8 / b coordinates; the reference unpacks every code into int64 tensors instead).
#include <Python.h>

#include "pass1.h"
#include "pass1_args.h"

using namespace aura_cpu;

extern "C" int aura_cpu_flash_p1(const P1Args* a) {
  const ByteTable kt(a->k_codebook, int(a->key_bits)), vt(a->v_codebook, int(a->value_bits));
  const Pass1 p{a->q, a->seq_lens, a->block_table, {a->bt_stride[0], a->bt_stride[1]}, a->B, a->L, a->Hq, a->Hkv,
                a->D, a->capacity, a->page_size, a->block_size, a->num_blocks, a->o, a->m, a->l, a->threads};
  auto side = [](const uint8_t* codes, const int64_t* code_stride, const float* norms, const int64_t* norm_stride,
                 const ByteTable& table) {
    RowSource s{RowKind::Codes, codes, {code_stride[0], code_stride[1], code_stride[2]}, norms,
                {norm_stride[0], norm_stride[1], norm_stride[2]}, &table};
    return s;
  };
  return run_pass1(p, side(a->k_codes, a->k_code_stride, a->k_norms, a->k_norm_stride, kt),
                   side(a->v_codes, a->v_code_stride, a->v_norms, a->v_norm_stride, vt));
}

// ---------------------------------------------------------------------------------------------
// Rotation and pass 2, so a CPU decode is three native calls instead of ~90 small tensor ops.

// Unnormalised Walsh-Hadamard transform in place, in the reference's butterfly order (strides
// 1, 2, ..., D/2; (a + b, a - b)), so the sums round exactly as torch_aura.reference.fwht's do.
static void fwht(float* x, int64_t D) {
  for (int64_t h = 1; h < D; h *= 2)
    for (int64_t blk = 0; blk < D; blk += 2 * h)
      for (int64_t i = blk; i < blk + h; ++i) {
        const float a = x[i], b = x[i + h];
        x[i] = a + b;
        x[i + h] = a - b;
      }
}

static inline float sign_of(const int32_t* mask, int64_t j) {  // -1 where bit j of the mask is set
  return mask && ((uint32_t(mask[j / 32]) >> (j % 32)) & 1u) ? -1.0f : 1.0f;
}

// rows x D fp32 in place: forward y = factor H(s x), inverse x = factor s (H y) (aura-format.md §2).
extern "C" int aura_cpu_rotate(float* x, int64_t rows, int64_t D, const int32_t* sign_mask, double factor,
                               int32_t inverse) {
  const float f = float(factor);
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * D;
    if (!inverse)
      for (int64_t j = 0; j < D; ++j) v[j] *= sign_of(sign_mask, j);
    fwht(v, D);
    for (int64_t j = 0; j < D; ++j) v[j] = inverse ? sign_of(sign_mask, j) * v[j] * f : v[j] * f;
  }
  return 0;
}

extern "C" int aura_cpu_flash_p2(const float* o, const float* m, const float* l, int64_t rows, int64_t NB,
                                 int64_t D, const int32_t* v_sign_mask, float* out, float* lse, int64_t threads) {
  return parallel(rows, threads, rows * NB * D, [&](int64_t first, int64_t step) {
    for (int64_t r = first; r < rows; r += step) {
      merge_row(o, m, l, r, NB, D, out, lse);
      if (v_sign_mask) aura_cpu_rotate(out + r * D, 1, D, v_sign_mask, 1.0 / std::sqrt(double(D)), 1);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Encode (aura-format.md §5-6, reference encode_indices + pack_codes): norm, unit direction,
// rotation, nearest centroid (count of boundaries strictly below y), corrected norm, bit packing.
static void encode_row(const float* x, int64_t D, const int32_t* mask, const float* codebook,
                       const float* boundaries, int64_t bits, float* y, int32_t* words, float* norm) {
  float r2 = 0.0f;
  for (int64_t j = 0; j < D; ++j) r2 += x[j] * x[j];
  const float r = std::sqrt(r2);
  const bool bad = r == 0.0f || !std::isfinite(r);  // zero, or any NaN / Inf element
  for (int64_t j = 0; j < D; ++j) y[j] = bad ? 0.0f : x[j] / r;
  aura_cpu_rotate(y, 1, D, mask, 1.0 / std::sqrt(double(D)), 0);
  const int64_t n_bounds = (int64_t(1) << bits) - 1, PW = D * bits / 32;
  std::fill(words, words + PW, 0);
  float c2 = 0.0f;
  for (int64_t j = 0; j < D; ++j) {
    uint32_t code = uint32_t(std::lower_bound(boundaries, boundaries + n_bounds, y[j]) - boundaries);
    c2 += codebook[code] * codebook[code];
    if (bad) code = 1u << (bits - 1);  // a bad row's codes are fixed; its norm says what it was
    const int64_t bit = j * bits, w = bit >> 5, sh = bit & 31;
    words[w] = int32_t(uint32_t(words[w]) | (code << sh));
    if (sh + bits > 32) words[w + 1] = int32_t(uint32_t(words[w + 1]) | (code >> (32 - sh)));
  }
  *norm = r == 0.0f ? 0.0f : bad ? std::numeric_limits<float>::quiet_NaN() : r / std::sqrt(c2);
}

// x [rows, D] fp32 -> codes int32 [rows, D * bits / 32], norms fp32 [rows].
extern "C" int aura_cpu_encode(const float* x, int64_t rows, int64_t D, const int32_t* mask, const float* codebook,
                               const float* boundaries, int64_t bits, int32_t* codes, float* norms, int64_t threads) {
  const int64_t PW = D * bits / 32;
  return parallel(rows, threads, rows * D, [&](int64_t first, int64_t step) {
    std::vector<float> y(D);
    for (int64_t r = first; r < rows; r += step)
      encode_row(x + r * D, D, mask, codebook, boundaries, bits, y.data(), codes + r * PW, norms + r);
  });
}

// A loadable module so setuptools builds it like any extension; Python reaches the C entry
// points through ctypes (torch_aura/cpu/native.py), not through this module object.
extern "C" PyObject* PyInit__C_cpu(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C_cpu", "torch_aura CPU kernels (ctypes entry points)", -1,
                            nullptr};
  return PyModule_Create(&def);
}
