// Dense decode attention on the CPU (torch_aura/reference/decode.py's flash_decode): pass1.h over fp32,
// bf16 or fp16 rows read in place from a contiguous or paged cache, then the log-sum-exp merge. One
// call serves a whole ragged batch and reads no row past a sequence's length, where ATen's fused
// CPU attention needs a call per length (or a mask that still reads the padding).
#include "pass1.h"

using namespace aura_cpu;

namespace {

// Mirrors torch_aura/cpu/native.py's _DecodeArgs field for field (ctypes.Structure).
struct DecodeArgs {
  const float* q;  // [B, Hq, D] contiguous fp32, already scaled
  const uint8_t* k;
  const uint8_t* v;
  int64_t kind;  // RowKind of K and V (F32, BF16 or F16)
  int64_t k_stride[3], v_stride[3];  // bytes: contiguous (b, h, t) | paged (page, row, h)
  const int32_t* seq_lens;  // [B] contiguous, each in [0, max_len]
  const int32_t* block_table;  // [B, max_pages] or null (contiguous cache)
  int64_t bt_stride[2];
  int64_t B, Hq, Hkv, D, max_len, page_size, block_size;
  float* out;  // [B, Hq, D] contiguous
  float* lse;  // [B, Hq] contiguous
  int64_t threads;
};

}  // namespace

// Blocks of block_size tokens are pass 1's items (their count comes from the shapes alone, so the
// answer does not depend on the thread count); their partials live only for the call.
extern "C" int aura_cpu_flash_decode(const DecodeArgs* a) {
  const int64_t NB = std::max<int64_t>(1, (a->max_len + a->block_size - 1) / a->block_size);
  const int64_t rows = a->B * a->Hq;
  std::vector<float> o, m, l;
  try {
    o.resize(rows * NB * a->D);
    m.resize(rows * NB);
    l.resize(rows * NB);
  } catch (...) {
    return 1;
  }
  const Pass1 p{a->q, a->seq_lens, a->block_table, {a->bt_stride[0], a->bt_stride[1]}, a->B, 1, a->Hq, a->Hkv,
                a->D, a->max_len, a->page_size, a->block_size, NB, o.data(), m.data(), l.data(), a->threads};
  const RowKind kind = RowKind(a->kind);
  const RowSource k{kind, a->k, {a->k_stride[0], a->k_stride[1], a->k_stride[2]}};
  const RowSource v{kind, a->v, {a->v_stride[0], a->v_stride[1], a->v_stride[2]}};
  if (run_pass1(p, k, v) != 0) return 1;
  return parallel(rows, a->threads, rows * NB * a->D, [&](int64_t first, int64_t step) {
    for (int64_t r = first; r < rows; r += step) merge_row(o.data(), m.data(), l.data(), r, NB, a->D, a->out, a->lse);
  });
}
