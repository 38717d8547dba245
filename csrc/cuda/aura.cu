// Host launchers of the AURA family (docs/aura-format.md, ops.md §2): hadamard_rotate, aura_encode,
// aura_write_cache, aura_append (its kernels are instantiated in aura_append.cu), aura_dequantize,
// aura_flash_p1, aura_flash_p2, aura_decode.
// Stable ABI only, current stream, no host synchronisation: grids and the decode split come from
// static values (shapes, SM count, occupancy), never from seq_lens or slot values (decode.md §4, §8).
// Every check a kernel's memory safety relies on is repeated here, since direct torch.ops calls skip
// the Python wrappers' validation.
#include "aura.cuh"
#include "ops.h"

#include <vector>

namespace aura {
namespace {

constexpr int kAutoBlockFloor = 256;  // decode.md §4: a split below this costs more than it saves


FloatKind float_kind(const Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case ScalarType::Float: return FloatKind::kF32;
    case ScalarType::Half: return FloatKind::kF16;
    case ScalarType::BFloat16: return FloatKind::kBF16;
    default:
      detail::fail(__FILE__, name, ": expected dtype float16 / bfloat16 / float32, got ", dtype_name(t.scalar_type()));
  }
}

FloatKind float_kind(ScalarType t, const char* name) {
  AURA_CHECK(t == ScalarType::Float || t == ScalarType::Half || t == ScalarType::BFloat16, name,
             ": expected float32 / float16 / bfloat16, got ", dtype_name(t));
  return t == ScalarType::Float ? FloatKind::kF32 : t == ScalarType::Half ? FloatKind::kF16 : FloatKind::kBF16;
}

void check_head_dim(int64_t D, const char* where) {
  AURA_CHECK(limits::is_aura_head_dim(D), "head_dim: expected one of " AURA_LIMITS_AURA_HEAD_DIMS_TEXT ", got ", D, " (",
             where, ")");
}

void check_bits(int64_t bits, const char* name) {
  AURA_CHECK(limits::is_aura_bits(bits), name, ": expected one of " AURA_LIMITS_AURA_BITS_TEXT ", got ", bits);
}

// A CUDA tensor of rank >= min_dim with a unit last stride (or a last dim of size <= 1).
void check_cuda_rows(const Tensor& t, const char* name, int64_t min_dim = 1) {
  AURA_CHECK(t.is_cuda(), name, ": expected a CUDA tensor");
  AURA_CHECK(t.dim() >= min_dim, name, ": expected rank >= ", min_dim, ", got ", t.dim());
  AURA_CHECK(t.dim() == 0 || t.size(t.dim() - 1) <= 1 || t.stride(t.dim() - 1) == 1, name,
             ": expected a unit stride in the last dim, got ", t.stride(t.dim() - 1));
}

void check_same_device(const Tensor& a, const Tensor& b, const char* name) {
  AURA_CHECK(a.get_device_index() == b.get_device_index(), name, ": expected the device of the first tensor (cuda:",
             a.get_device_index(), "), got cuda:", b.get_device_index());
}

// fp32 [entries] (codebook, boundaries) on the device of `like`.
void check_table(const Tensor& t, const char* name, int64_t entries, const Tensor& like) {
  AURA_CHECK(t.is_cuda() && t.dim() == 1, name, ": expected a 1-D CUDA tensor");
  check_dtype(t, name, ScalarType::Float);
  AURA_CHECK(t.size(0) == entries, name, ": expected ", entries, " entries, got ", t.size(0));
  AURA_CHECK(t.stride(0) == 1 || entries <= 1, name, ": expected a contiguous tensor");
  check_same_device(like, t, name);
}

// int32 [D / 32] mask words (uint32 bit patterns) on the device of `like`.
const uint32_t* sign_mask_ptr(const std::optional<Tensor>& mask, int64_t D, const char* name, const Tensor& like) {
  if (!mask.has_value()) return nullptr;
  const Tensor& t = *mask;
  AURA_CHECK(t.is_cuda() && t.dim() == 1, name, ": expected a 1-D CUDA tensor");
  check_dtype(t, name, ScalarType::Int);
  AURA_CHECK(t.size(0) == D / 32, name, ": expected head_dim // 32 = ", D / 32, " words, got ", t.size(0));
  AURA_CHECK(t.stride(0) == 1 || t.size(0) <= 1, name, ": expected a contiguous tensor");
  check_same_device(like, t, name);
  return static_cast<const uint32_t*>(t.data_ptr());
}

// The leading `lead` dims of t as a row indexer; adjacent dims that are one contiguous run merge, so
// any rank works as long as at most kMaxLeadDims runs remain.
RowIndexer lead_rows(const Tensor& t, int64_t lead, const char* name) {
  RowIndexer r{};
  std::vector<int64_t> size, stride;
  for (int64_t d = 0; d < lead; ++d) {
    if (t.size(d) == 1) continue;
    if (!size.empty() && stride.back() == t.stride(d) * t.size(d)) {
      size.back() *= t.size(d);
      stride.back() = t.stride(d);
    } else {
      size.push_back(t.size(d));
      stride.push_back(t.stride(d));
    }
  }
  AURA_CHECK(int(size.size()) <= kMaxLeadDims, name, ": expected at most ", kMaxLeadDims,
             " non-mergeable leading dims, got ", size.size());
  r.nd = int(size.size());
  for (int i = 0; i < r.nd; ++i) r.size[i] = size[i], r.stride[i] = stride[i];
  return r;
}

int64_t numel_lead(const Tensor& t, int64_t lead) {
  int64_t n = 1;
  for (int64_t d = 0; d < lead; ++d) n *= t.size(d);
  return n;
}

std::vector<int64_t> sizes_of(const Tensor& t, int64_t from, int64_t to) {
  std::vector<int64_t> s;
  for (int64_t d = from; d < to; ++d) s.push_back(t.size(d));
  return s;
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kAuraWarps - 1) / kAuraWarps); }

// fp16 / bf16 queries take the warp-split tensor-core kernel, fp32 queries the exact one (aura.cuh).
P1Kernel p1_kernel(int64_t D, int64_t kb, int64_t vb, FloatKind q_kind, int device) {
  const bool warp = q_kind != FloatKind::kF32;
  P1Kernel k{};
  with_dim(D, [&](auto d) { k = p1_kernel_for_dim<decltype(d)::value>(kb, vb, warp, device); });
  return k;
}

struct CacheShape {
  int64_t B, L, Hq, D, Hkv, capacity, page_size, num_blocks;
  bool paged;
};

// Everything pass 1 and aura_decode share: the caches, lengths, tables, and q's shape.
CacheShape check_attention_inputs(const Tensor& q, const char* q_name, const Tensor& kc, const Tensor& kn,
                                  const Tensor& vc, const Tensor& vn, const Tensor& seq_lens, const Tensor& kcb,
                                  const Tensor& vcb, int64_t kb, int64_t vb, const std::optional<Tensor>& block_table) {
  check_cuda_rows(q, q_name, 3);
  AURA_CHECK(q.dim() == 3 || q.dim() == 4, q_name, ": expected [B, Hq, D] or [B, L, Hq, D], got rank ", q.dim());
  float_kind(q, q_name);
  check_bits(kb, "key_bits");
  check_bits(vb, "value_bits");
  CacheShape s{};
  s.B = q.size(0), s.L = q.dim() == 4 ? q.size(1) : 1, s.Hq = q.size(q.dim() - 2), s.D = q.size(q.dim() - 1);
  check_head_dim(s.D, q_name);
  const Tensor* tensors[] = {&kc, &kn, &vc, &vn};
  const char* names[] = {"k_codes", "k_norms", "v_codes", "v_norms"};
  for (int i = 0; i < 4; ++i) {
    check_cuda_rows(*tensors[i], names[i], i % 2 == 0 ? 4 : 3);
    AURA_CHECK(tensors[i]->dim() == (i % 2 == 0 ? 4 : 3), names[i], ": expected rank ", i % 2 == 0 ? 4 : 3);
    check_dtype(*tensors[i], names[i], i % 2 == 0 ? ScalarType::Int : ScalarType::Float);
    check_same_device(q, *tensors[i], names[i]);
  }
  s.paged = block_table.has_value();
  AURA_CHECK(kc.size(3) == s.D * kb / 32, "k_codes: expected ", s.D * kb / 32, " words per row, got ", kc.size(3));
  AURA_CHECK(vc.size(3) == s.D * vb / 32, "v_codes: expected ", s.D * vb / 32, " words per row, got ", vc.size(3));
  for (int d = 0; d < 3; ++d) {
    AURA_CHECK(vc.size(d) == kc.size(d) && kn.size(d) == kc.size(d) && vn.size(d) == kc.size(d),
               "v_codes / k_norms / v_norms: expected k_codes.shape[:3], mismatch in dim ", d);
  }
  if (s.paged) {
    const Tensor& bt = *block_table;
    AURA_CHECK(bt.is_cuda() && bt.dim() == 2, "block_table: expected a 2-D CUDA tensor");
    check_dtype(bt, "block_table", ScalarType::Int);
    check_same_device(q, bt, "block_table");
    AURA_CHECK(bt.size(0) == s.B, "block_table: expected ", s.B, " rows, got ", bt.size(0));
    AURA_CHECK(bt.size(1) <= 1 || bt.stride(1) == 1, "block_table: expected a unit last stride");
    s.num_blocks = kc.size(0), s.page_size = kc.size(1), s.Hkv = kc.size(2);
    s.capacity = bt.size(1) * s.page_size;
  } else {
    AURA_CHECK(kc.size(0) == s.B, "k_codes: expected batch ", s.B, ", got ", kc.size(0));
    s.Hkv = kc.size(1), s.capacity = kc.size(2);
  }
  AURA_CHECK(s.Hkv > 0 && s.Hq % s.Hkv == 0, q_name, ": expected Hq (", s.Hq, ") a multiple of Hkv (", s.Hkv, ")");
  AURA_CHECK(seq_lens.is_cuda() && seq_lens.dim() == 1 && seq_lens.size(0) == s.B, "seq_lens: expected a CUDA "
             "tensor [", s.B, "]");
  check_dtype(seq_lens, "seq_lens", ScalarType::Int);
  check_same_device(q, seq_lens, "seq_lens");
  check_table(kcb, "k_codebook", int64_t(1) << kb, q);
  check_table(vcb, "v_codebook", int64_t(1) << vb, q);
  AURA_CHECK(s.B <= 65535, q_name, ": expected a batch of at most 65535 sequences, got ", s.B);
  AURA_CHECK(s.capacity < (int64_t(1) << 31), "k_codes: expected fewer than 2^31 token slots per sequence");
  return s;
}

// Pass 1 into caller-allocated o [B, L, Hq, NB, D], m, l [B, L, Hq, NB] (contiguous fp32).
void launch_flash_p1(const Tensor& q, const Tensor& kc, const Tensor& kn, const Tensor& vc, const Tensor& vn,
                     const Tensor& seq_lens, const Tensor& kcb, const Tensor& vcb, int64_t kb, int64_t vb,
                     const std::optional<Tensor>& block_table, const CacheShape& s, int64_t block_size, int64_t NB,
                     const uint32_t* k_sign, float q_factor, const P1Kernel& kernel, Tensor& o, Tensor& m, Tensor& l) {
  if (s.B == 0 || s.Hq == 0 || s.L == 0 || NB == 0) return;
  AuraP1Params p{};
  p.q = q.data_ptr();
  p.q_kind = float_kind(q, "q");
  const int hd = int(q.dim()) - 2;
  p.q_sb = q.stride(0), p.q_sl = q.dim() == 4 ? q.stride(1) : 0, p.q_sh = q.stride(hd);
  p.kc = static_cast<const uint32_t*>(kc.data_ptr());
  p.kn = static_cast<const float*>(kn.data_ptr());
  p.vc = static_cast<const uint32_t*>(vc.data_ptr());
  p.vn = static_cast<const float*>(vn.data_ptr());
  // (page, row, head) strides: contiguous [B, Hkv, T_cap, *] -> dims (0, 2, 1), paged -> (0, 1, 2)
  const int row_d = s.paged ? 1 : 2, head_d = s.paged ? 2 : 1;
  p.kc_s0 = kc.stride(0), p.kc_s1 = kc.stride(row_d), p.kc_s2 = kc.stride(head_d);
  p.kn_s0 = kn.stride(0), p.kn_s1 = kn.stride(row_d), p.kn_s2 = kn.stride(head_d);
  p.vc_s0 = vc.stride(0), p.vc_s1 = vc.stride(row_d), p.vc_s2 = vc.stride(head_d);
  p.vn_s0 = vn.stride(0), p.vn_s1 = vn.stride(row_d), p.vn_s2 = vn.stride(head_d);
  // pass 1 steps through rows (and pages) by 32 x 32 -> 64-bit multiply-adds on byte strides
  for (const int64_t st : {p.kc_s1, p.kn_s1, p.vc_s1, p.vn_s1, s.paged ? p.kc_s0 : 0, s.paged ? p.kn_s0 : 0,
                           s.paged ? p.vc_s0 : 0, s.paged ? p.vn_s0 : 0})
    AURA_CHECK(st * 4 <= INT32_MAX, "k/v caches: a row or page stride of ", st, " elements is past the 2^29 supported");
  p.seq_lens = static_cast<const int*>(seq_lens.data_ptr());
  p.block_table = s.paged ? static_cast<const int*>(block_table->data_ptr()) : nullptr;
  p.bt_sb = s.paged ? block_table->stride(0) : 0;
  p.k_cb = static_cast<const float*>(kcb.data_ptr());
  p.v_cb = static_cast<const float*>(vcb.data_ptr());
  p.k_sign = k_sign;
  p.q_factor = q_factor;
  p.o = static_cast<float*>(o.data_ptr());
  p.m = static_cast<float*>(m.data_ptr());
  p.l = static_cast<float*>(l.data_ptr());
  p.B = int(s.B), p.L = int(s.L), p.Hq = int(s.Hq), p.Hkv = int(s.Hkv), p.G = int(s.Hq / s.Hkv);
  p.NB = int(NB), p.block_size = int(block_size), p.capacity = int(s.capacity);
  p.page_size = int(s.page_size), p.page_shift = page_shift_of(s.page_size), p.num_blocks = int(s.num_blocks);
  const int64_t rows = s.L * p.G;
  p.row_groups = int((rows + kMaxRowsPerCta - 1) / kMaxRowsPerCta);
  p.rows_per_cta = int((rows + p.row_groups - 1) / p.row_groups);
  p.kc_rb = int(p.kc_s1 * 4), p.vc_rb = int(p.vc_s1 * 4), p.kn_rb = int(p.kn_s1 * 4), p.vn_rb = int(p.vn_s1 * 4);
  if (s.paged) p.kc_pb = int(p.kc_s0 * 4), p.vc_pb = int(p.vc_s0 * 4), p.kn_pb = int(p.kn_s0 * 4), p.vn_pb = int(p.vn_s0 * 4);
  p.kc_vec = row_vector_bytes(kc);
  p.vc_vec = row_vector_bytes(vc);
  AURA_CHECK(int64_t(s.Hkv) * p.row_groups <= 65535, "q: too many query rows per KV head (", rows, ") for the grid");
  const dim3 grid(unsigned(NB), unsigned(s.Hkv * p.row_groups), unsigned(s.B));
  kernel.fn<<<grid, kernel.threads, kernel.smem, current_stream(q)>>>(p);
  check_launch("aura_flash_p1 kernel");
}

// Pass 2 over o [..., NB, D], m, l [..., NB] into contiguous out [..., D] (out_kind) and lse [...].
// after_p1: a programmatic dependent launch behind pass 1 on the same stream (aura_decode), so its CTAs
// wait resident for the partials instead of paying a launch latency after pass 1 drains.
void launch_flash_p2(const Tensor& o, const Tensor& m, const Tensor& l, const uint32_t* v_sign, Tensor& out,
                     Tensor& lse, FloatKind out_kind, bool after_p1 = false) {
  const int64_t nd = o.dim(), D = o.size(nd - 1), NB = o.size(nd - 2), rows = numel_lead(o, nd - 2);
  if (rows == 0) return;
  AuraP2Params p{};
  p.o = static_cast<const float*>(o.data_ptr());
  p.m = static_cast<const float*>(m.data_ptr());
  p.l = static_cast<const float*>(l.data_ptr());
  p.o_rows = lead_rows(o, nd - 2, "o");
  p.m_rows = lead_rows(m, nd - 2, "m");
  p.l_rows = lead_rows(l, nd - 2, "l");
  p.o_sn = o.stride(nd - 2), p.m_sn = m.stride(nd - 2), p.l_sn = l.stride(nd - 2);
  p.rows = rows;
  p.NB = int(NB);
  p.v_sign = v_sign;
  p.factor = float(1.0 / std::sqrt(double(D)));
  p.out = out.data_ptr();
  p.lse = static_cast<float*>(lse.data_ptr());
  p.kind = out_kind;
  const cudaStream_t stream = current_stream(o);
  cudaError_t err = cudaSuccess;
  with_dim(D, [&](auto d) {
    err = launch_after(aura_flash_p2_kernel<decltype(d)::value>, dim3(row_blocks(rows)), dim3(kAuraThreads), 0, stream,
                       after_p1, p);
  });
  AURA_CHECK(err == cudaSuccess, "aura_flash_p2 kernel: launch failed: ", cudaGetErrorString(err));
}

}  // namespace

// ------------------------------------------------------------------------------- the ops
Tensor hadamard_rotate_cuda(Tensor x, std::optional<Tensor> sign_mask, double scale, bool inverse) {
  check_cuda_rows(x, "x");
  const FloatKind kind = float_kind(x, "x");
  const int64_t D = x.size(x.dim() - 1);
  check_head_dim(D, "x.shape[-1]");
  AuraRotateParams p{};
  p.mask = sign_mask_ptr(sign_mask, D, "sign_mask", x);
  Tensor out = torch::stable::new_empty(x, sizes_of(x, 0, x.dim()));
  p.rows = numel_lead(x, x.dim() - 1);
  if (p.rows == 0) return out;
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  p.x = x.data_ptr();
  p.out = out.data_ptr();
  p.x_rows = lead_rows(x, x.dim() - 1, "x");
  p.factor = float(scale / std::sqrt(double(D)));
  p.inverse = inverse ? 1 : 0;
  p.kind = kind;
  const cudaStream_t stream = current_stream(x);
  with_dim(D, [&](auto d) {
    hadamard_rotate_kernel<decltype(d)::value><<<row_blocks(p.rows), kAuraThreads, 0, stream>>>(p);
  });
  check_launch("hadamard_rotate kernel");
  return out;
}

namespace {
// Encode rows of x (as described by p's source fields) with the tables; the destination is in p.
void launch_encode(AuraEncodeParams& p, const Tensor& x, const Tensor& codebook, const Tensor& boundaries,
                   int64_t bits, const std::optional<Tensor>& sign_mask, int64_t D) {
  p.kind = float_kind(x, "x");
  p.x = x.data_ptr();
  p.codebook = static_cast<const float*>(codebook.data_ptr());
  p.boundaries = static_cast<const float*>(boundaries.data_ptr());
  p.mask = sign_mask.has_value() ? static_cast<const uint32_t*>(sign_mask->data_ptr()) : nullptr;
  p.factor = float(1.0 / std::sqrt(double(D)));
  if (p.rows == 0) return;
  p.x_vec16 = row_vector_bytes(x) == 16 ? 1 : 0;
  const cudaStream_t stream = current_stream(x);
  with_dim(D, [&](auto d) {
    constexpr int kRows = ChunkRows<decltype(d)::value>::kRowsPerCta;
    const auto blocks = static_cast<unsigned>((p.rows + kRows - 1) / kRows);
    with_bits(bits, [&](auto b) {
      aura_encode_kernel<decltype(d)::value, decltype(b)::value><<<blocks, kAuraThreads, 0, stream>>>(p);
    });
  });
  check_launch("aura_encode kernel");
}

void check_encode_tables(const Tensor& x, const Tensor& codebook, const Tensor& boundaries, int64_t bits,
                         const std::optional<Tensor>& sign_mask, int64_t D) {
  float_kind(x, "x");
  check_head_dim(D, "x.shape[-1]");
  check_bits(bits, "bits");
  check_table(codebook, "codebook", int64_t(1) << bits, x);
  check_table(boundaries, "boundaries", (int64_t(1) << bits) - 1, x);
  sign_mask_ptr(sign_mask, D, "sign_mask", x);
}
}  // namespace

std::tuple<Tensor, Tensor> aura_encode_cuda(Tensor x, Tensor codebook, Tensor boundaries, int64_t bits,
                                            std::optional<Tensor> sign_mask) {
  check_cuda_rows(x, "x");
  const int64_t nd = x.dim(), D = x.size(nd - 1);
  check_encode_tables(x, codebook, boundaries, bits, sign_mask, D);
  std::vector<int64_t> lead = sizes_of(x, 0, nd - 1), code_shape = lead;
  code_shape.push_back(D * bits / 32);
  Tensor codes = torch::stable::new_empty(x, code_shape, ScalarType::Int);
  Tensor norms = torch::stable::new_empty(x, lead, ScalarType::Float);
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  AuraEncodeParams p{};
  p.rows = numel_lead(x, nd - 1);
  if (p.rows > 0) p.x_rows = lead_rows(x, nd - 1, "x");
  p.codes = static_cast<uint32_t*>(codes.data_ptr());
  p.norms = static_cast<float*>(norms.data_ptr());
  p.codes_vec = row_vector_bytes(codes);
  launch_encode(p, x, codebook, boundaries, bits, sign_mask, D);
  return {codes, norms};
}

void aura_write_cache_cuda(Tensor x, Tensor codes_cache, Tensor norms_cache, Tensor slot_mapping, Tensor codebook,
                           Tensor boundaries, int64_t bits, std::optional<Tensor> sign_mask, bool paged) {
  check_cuda_rows(x, "x", 3);
  AURA_CHECK(x.dim() == 3, "x: expected [N, Hkv, D], got rank ", x.dim());
  const int64_t N = x.size(0), Hkv = x.size(1), D = x.size(2);
  check_encode_tables(x, codebook, boundaries, bits, sign_mask, D);
  check_cuda_rows(codes_cache, "codes_cache", 4);
  check_cuda_rows(norms_cache, "norms_cache", 3);
  AURA_CHECK(codes_cache.dim() == 4 && norms_cache.dim() == 3, "codes_cache / norms_cache: expected rank 4 / 3");
  check_dtype(codes_cache, "codes_cache", ScalarType::Int);
  check_dtype(norms_cache, "norms_cache", ScalarType::Float);
  check_same_device(x, codes_cache, "codes_cache");
  check_same_device(x, norms_cache, "norms_cache");
  const int hd = paged ? 2 : 1;  // the KV-head dim of the layout
  AURA_CHECK(codes_cache.size(hd) == Hkv && codes_cache.size(3) == D * bits / 32, "codes_cache: expected Hkv = ", Hkv,
             " and ", D * bits / 32, " words per row");
  for (int d = 0; d < 3; ++d)
    AURA_CHECK(norms_cache.size(d) == codes_cache.size(d), "norms_cache: expected codes_cache.shape[:3]");
  AURA_CHECK(slot_mapping.is_cuda() && slot_mapping.dim() == 1 && slot_mapping.size(0) == N,
             "slot_mapping: expected a CUDA tensor [", N, "]");
  check_dtype(slot_mapping, "slot_mapping", ScalarType::Long);
  check_same_device(x, slot_mapping, "slot_mapping");
  AURA_CHECK(slot_mapping.stride(0) == 1 || N <= 1, "slot_mapping: expected a contiguous tensor");
  if (N == 0 || Hkv == 0) return;
  torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
  AuraEncodeParams p{};
  p.rows = N * Hkv;
  p.x_rows = lead_rows(x, 2, "x");
  p.codes = static_cast<uint32_t*>(codes_cache.data_ptr());
  p.norms = static_cast<float*>(norms_cache.data_ptr());
  p.slots = static_cast<const int64_t*>(slot_mapping.data_ptr());
  p.Hkv = int(Hkv);
  p.paged = paged ? 1 : 0;
  p.slot_div = paged ? codes_cache.size(1) : codes_cache.size(2);  // page_size or T_cap
  p.n_slots = codes_cache.size(0) * p.slot_div;
  p.c_s0 = codes_cache.stride(0), p.c_s1 = codes_cache.stride(1), p.c_s2 = codes_cache.stride(2);
  p.n_s0 = norms_cache.stride(0), p.n_s1 = norms_cache.stride(1), p.n_s2 = norms_cache.stride(2);
  p.codes_vec = row_vector_bytes(codes_cache);
  if (p.slot_div == 0) return;  // an empty cache: nothing can be written
  launch_encode(p, x, codebook, boundaries, bits, sign_mask, D);
}

namespace {
// One side (K or V) of aura_append: k / v [B, L, Hkv, D] and its cache [.., PW] / norms, checked against
// the layout (contiguous [B, Hkv, T_cap, PW] or paged [num_blocks, page_size, Hkv, PW]).
AuraAppendSide append_side_params(const Tensor& x, const char* x_name, const Tensor& codes, const char* codes_name,
                                  const Tensor& norms, const char* norms_name, const Tensor& codebook,
                                  const char* cb_name, const Tensor& boundaries, const char* bd_name, int64_t bits,
                                  const char* bits_name, const std::optional<Tensor>& sign_mask, const char* mask_name,
                                  bool paged) {
  const int64_t B = x.size(0), Hkv = x.size(2), D = x.size(3);
  check_bits(bits, bits_name);
  check_table(codebook, cb_name, int64_t(1) << bits, x);
  check_table(boundaries, bd_name, (int64_t(1) << bits) - 1, x);
  check_cuda_rows(codes, codes_name, 4);
  check_cuda_rows(norms, norms_name, 3);
  AURA_CHECK(codes.dim() == 4, codes_name, ": expected rank 4, got ", codes.dim());
  AURA_CHECK(norms.dim() == 3, norms_name, ": expected rank 3, got ", norms.dim());
  check_dtype(codes, codes_name, ScalarType::Int);
  check_dtype(norms, norms_name, ScalarType::Float);
  check_same_device(x, codes, codes_name);
  check_same_device(x, norms, norms_name);
  const int hd = paged ? 2 : 1;  // the KV-head dim of the layout
  AURA_CHECK(codes.size(hd) == Hkv && codes.size(3) == D * bits / 32, codes_name, ": expected Hkv = ", Hkv, " and ",
             D * bits / 32, " words per row, got shape [", codes.size(0), ", ", codes.size(1), ", ", codes.size(2),
             ", ", codes.size(3), "]");
  AURA_CHECK(paged || codes.size(0) == B, codes_name, ": expected batch ", B, ", got ", codes.size(0));
  for (int d = 0; d < 3; ++d)
    AURA_CHECK(norms.size(d) == codes.size(d), norms_name, ": expected ", codes_name, ".shape[:3]");
  AuraAppendSide s{};
  s.x = x.data_ptr();
  s.x_sb = x.stride(0), s.x_sl = x.stride(1), s.x_sh = x.stride(2);
  s.x_vec16 = row_vector_bytes(x) == 16 ? 1 : 0;
  s.codebook = static_cast<const float*>(codebook.data_ptr());
  s.boundaries = static_cast<const float*>(boundaries.data_ptr());
  s.mask = sign_mask_ptr(sign_mask, D, mask_name, x);
  s.codes = static_cast<uint32_t*>(codes.data_ptr());
  s.norms = static_cast<float*>(norms.data_ptr());
  s.codes_vec = row_vector_bytes(codes);
  s.c_s0 = codes.stride(0), s.c_s1 = codes.stride(1), s.c_s2 = codes.stride(2);
  s.n_s0 = norms.stride(0), s.n_s1 = norms.stride(1), s.n_s2 = norms.stride(2);
  return s;
}
}  // namespace

void aura_append_cuda(Tensor k, Tensor v, Tensor k_codes, Tensor k_norms, Tensor v_codes, Tensor v_norms,
                      Tensor seq_lens, Tensor k_codebook, Tensor k_boundaries, Tensor v_codebook, Tensor v_boundaries,
                      int64_t key_bits, int64_t value_bits, std::optional<Tensor> k_sign_mask,
                      std::optional<Tensor> v_sign_mask, std::optional<Tensor> block_table) {
  check_cuda_rows(k, "k", 4);
  check_cuda_rows(v, "v", 4);
  AURA_CHECK(k.dim() == 4, "k: expected [B, L, Hkv, D], got rank ", k.dim());
  AURA_CHECK(v.dim() == 4, "v: expected [B, L, Hkv, D], got rank ", v.dim());
  for (int d = 0; d < 4; ++d) AURA_CHECK(v.size(d) == k.size(d), "v: expected the shape of k, mismatch in dim ", d);
  const FloatKind kind = float_kind(k, "k");
  AURA_CHECK(v.scalar_type() == k.scalar_type(), "v: expected the dtype of k, got ", dtype_name(v.scalar_type()));
  check_same_device(k, v, "v");
  const int64_t B = k.size(0), L = k.size(1), Hkv = k.size(2), D = k.size(3);
  check_head_dim(D, "k.shape[-1]");
  const bool paged = block_table.has_value();
  int64_t capacity = 0;
  AuraAppendParams p{};
  p.k = append_side_params(k, "k", k_codes, "k_codes", k_norms, "k_norms", k_codebook, "k_codebook", k_boundaries,
                           "k_boundaries", key_bits, "key_bits", k_sign_mask, "k_sign_mask", paged);
  p.v = append_side_params(v, "v", v_codes, "v_codes", v_norms, "v_norms", v_codebook, "v_codebook", v_boundaries,
                           "v_boundaries", value_bits, "value_bits", v_sign_mask, "v_sign_mask", paged);
  for (int d = 0; d < 3; ++d)
    AURA_CHECK(v_codes.size(d) == k_codes.size(d), "v_codes: expected k_codes.shape[:3], mismatch in dim ", d);
  AURA_CHECK(seq_lens.is_cuda() && seq_lens.dim() == 1 && seq_lens.size(0) == B, "seq_lens: expected a CUDA tensor [",
             B, "]");
  check_dtype(seq_lens, "seq_lens", ScalarType::Int);
  check_same_device(k, seq_lens, "seq_lens");
  AURA_CHECK(seq_lens.stride(0) == 1 || B <= 1, "seq_lens: expected a contiguous tensor");
  if (paged) {
    const Tensor& bt = *block_table;
    AURA_CHECK(bt.is_cuda() && bt.dim() == 2, "block_table: expected a 2-D CUDA tensor");
    check_dtype(bt, "block_table", ScalarType::Int);
    check_same_device(k, bt, "block_table");
    AURA_CHECK(bt.size(0) == B, "block_table: expected ", B, " rows, got ", bt.size(0));
    AURA_CHECK(bt.size(1) <= 1 || bt.stride(1) == 1, "block_table: expected a unit last stride");
    p.block_table = static_cast<const int*>(bt.data_ptr());
    p.bt_sb = bt.stride(0);
    AURA_CHECK(k_codes.size(0) <= INT32_MAX, "k_codes: expected fewer than 2^31 pages");
    p.num_blocks = int(k_codes.size(0)), p.page_size = int(k_codes.size(1));
    capacity = bt.size(1) * k_codes.size(1);
  } else {
    capacity = k_codes.size(2);
  }
  AURA_CHECK(capacity < (int64_t(1) << 31), "k_codes: expected fewer than 2^31 token slots per sequence");
  p.capacity = int(capacity);
  AURA_CHECK(B <= INT32_MAX, "k: expected at most 2^31 - 1 sequences, got ", B);
  AURA_CHECK(L * Hkv < (int64_t(1) << 31), "k: expected L * Hkv < 2^31, got ", L * Hkv);
  if (B == 0 || L == 0) return;  // nothing is written and seq_lens does not move
  torch::stable::accelerator::DeviceGuard guard(k.get_device_index());
  p.kind = kind;
  p.seq_lens = static_cast<int*>(seq_lens.data_ptr());
  p.L = int(L), p.Hkv = int(Hkv);
  p.factor = float(1.0 / std::sqrt(double(D)));
  launch_aura_append_kernel(p, B, D, key_bits, value_bits, current_stream(k));
}

Tensor aura_dequantize_cuda(Tensor codes, Tensor norms, Tensor codebook, int64_t bits, std::optional<Tensor> sign_mask,
                            std::optional<ScalarType> out_dtype) {
  check_cuda_rows(codes, "codes");
  check_dtype(codes, "codes", ScalarType::Int);
  check_bits(bits, "bits");
  const int64_t nd = codes.dim(), PW = codes.size(nd - 1), D = PW * 32 / bits;
  AURA_CHECK((PW * 32) % bits == 0 && limits::is_aura_head_dim(D), "codes.shape[-1]: expected ", bits,
             "-bit rows of a head_dim in " AURA_LIMITS_AURA_HEAD_DIMS_TEXT ", got ", PW, " words");
  AURA_CHECK(norms.is_cuda() && norms.dim() == nd - 1, "norms: expected a CUDA tensor of rank ", nd - 1);
  check_dtype(norms, "norms", ScalarType::Float);
  for (int64_t d = 0; d + 1 < nd; ++d)
    AURA_CHECK(norms.size(d) == codes.size(d), "norms: expected codes.shape[:-1], mismatch in dim ", d);
  check_same_device(codes, norms, "norms");
  check_table(codebook, "codebook", int64_t(1) << bits, codes);
  const ScalarType dt = out_dtype.value_or(ScalarType::Float);
  AuraDequantParams p{};
  p.kind = float_kind(dt, "out_dtype");
  p.mask = sign_mask_ptr(sign_mask, D, "sign_mask", codes);
  std::vector<int64_t> shape = sizes_of(codes, 0, nd - 1);
  shape.push_back(D);
  Tensor out = torch::stable::new_empty(codes, shape, dt);
  p.rows = numel_lead(codes, nd - 1);
  if (p.rows == 0) return out;
  torch::stable::accelerator::DeviceGuard guard(codes.get_device_index());
  p.codes = static_cast<const uint32_t*>(codes.data_ptr());
  p.norms = static_cast<const float*>(norms.data_ptr());
  p.code_rows = lead_rows(codes, nd - 1, "codes");
  p.norm_rows = lead_rows(norms, nd - 1, "norms");
  p.codebook = static_cast<const float*>(codebook.data_ptr());
  p.factor = float(1.0 / std::sqrt(double(D)));
  p.out = out.data_ptr();
  const cudaStream_t stream = current_stream(codes);
  with_dim(D, [&](auto d) {
    with_bits(bits, [&](auto b) {
      aura_dequantize_kernel<decltype(d)::value, decltype(b)::value><<<row_blocks(p.rows), kAuraThreads, 0, stream>>>(p);
    });
  });
  check_launch("aura_dequantize kernel");
  return out;
}

std::tuple<Tensor, Tensor, Tensor> aura_flash_p1_cuda(Tensor q_rot, Tensor k_codes, Tensor k_norms, Tensor v_codes,
                                                      Tensor v_norms, Tensor seq_lens, Tensor k_codebook,
                                                      Tensor v_codebook, int64_t key_bits, int64_t value_bits,
                                                      std::optional<Tensor> block_table, int64_t block_size) {
  const CacheShape s = check_attention_inputs(q_rot, "q_rot", k_codes, k_norms, v_codes, v_norms, seq_lens,
                                              k_codebook, v_codebook, key_bits, value_bits, block_table);
  AURA_CHECK(block_size >= 1 && block_size < (int64_t(1) << 30), "block_size: expected a positive int, got ",
             block_size);
  const int64_t NB = (s.capacity + block_size - 1) / block_size;  // static: never from seq_lens
  std::vector<int64_t> lead{s.B};
  if (q_rot.dim() == 4) lead.push_back(s.L);
  lead.push_back(s.Hq);
  lead.push_back(NB);
  Tensor m = torch::stable::new_empty(q_rot, lead, ScalarType::Float);
  Tensor l = torch::stable::new_empty(q_rot, lead, ScalarType::Float);
  lead.push_back(s.D);
  Tensor o = torch::stable::new_empty(q_rot, lead, ScalarType::Float);
  torch::stable::accelerator::DeviceGuard guard(q_rot.get_device_index());
  const P1Kernel kernel = p1_kernel(s.D, key_bits, value_bits, float_kind(q_rot, "q_rot"), q_rot.get_device_index());
  launch_flash_p1(q_rot, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook, key_bits, value_bits,
                  block_table, s, block_size, NB, nullptr, 1.f, kernel, o, m, l);
  return {o, m, l};
}

std::tuple<Tensor, Tensor> aura_flash_p2_cuda(Tensor o, Tensor m, Tensor l, std::optional<Tensor> v_sign_mask,
                                              std::optional<ScalarType> out_dtype) {
  check_cuda_rows(o, "o", 4);
  AURA_CHECK(o.dim() == 4 || o.dim() == 5, "o: expected [B, (L,) Hq, NB, D], got rank ", o.dim());
  check_dtype(o, "o", ScalarType::Float);
  const int64_t nd = o.dim(), D = o.size(nd - 1);
  check_head_dim(D, "o.shape[-1]");
  for (const Tensor* t : {&m, &l}) {
    AURA_CHECK(t->is_cuda() && t->dim() == nd - 1, "m / l: expected CUDA tensors of rank ", nd - 1);
    check_dtype(*t, "m / l", ScalarType::Float);
    check_same_device(o, *t, "m / l");
    for (int64_t d = 0; d + 1 < nd; ++d)
      AURA_CHECK(t->size(d) == o.size(d), "m / l: expected o.shape[:-1], mismatch in dim ", d);
  }
  AURA_CHECK(o.size(nd - 2) < (int64_t(1) << 31), "o: too many blocks");
  const uint32_t* v_sign = sign_mask_ptr(v_sign_mask, D, "v_sign_mask", o);
  const ScalarType dt = out_dtype.value_or(ScalarType::Float);
  const FloatKind kind = float_kind(dt, "out_dtype");
  std::vector<int64_t> lead = sizes_of(o, 0, nd - 2), shape = lead;
  shape.push_back(D);
  Tensor out = torch::stable::new_empty(o, shape, dt);
  Tensor lse = torch::stable::new_empty(o, lead, ScalarType::Float);
  torch::stable::accelerator::DeviceGuard guard(o.get_device_index());
  launch_flash_p2(o, m, l, v_sign, out, lse, kind);
  return {out, lse};
}

std::tuple<Tensor, Tensor> aura_decode_cuda(Tensor q, Tensor k_codes, Tensor k_norms, Tensor v_codes, Tensor v_norms,
                                            Tensor seq_lens, Tensor k_codebook, Tensor v_codebook, Tensor k_sign_mask,
                                            Tensor v_sign_mask, int64_t key_bits, int64_t value_bits,
                                            std::optional<Tensor> block_table, std::optional<double> scale,
                                            int64_t num_splits) {
  const CacheShape s = check_attention_inputs(q, "q", k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook,
                                              v_codebook, key_bits, value_bits, block_table);
  AURA_CHECK(num_splits >= 0, "num_splits: expected an int >= 0, got ", num_splits);
  const uint32_t* k_sign = sign_mask_ptr(k_sign_mask, s.D, "k_sign_mask", q);
  const uint32_t* v_sign = sign_mask_ptr(v_sign_mask, s.D, "v_sign_mask", q);
  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  const int device = q.get_device_index();
  const P1Kernel kernel = p1_kernel(s.D, key_bits, value_bits, float_kind(q, "q"), device);

  // Block size from static values only. num_splits = S > 0: the reference's rule (ceil(capacity / S),
  // whole pages). Automatic: enough blocks to fill the GPU (decode.md §4's wave efficiency, counting
  // one unit of work per KV head and CTA row group), never below 256 tokens, whole 64-token stages.
  const int64_t G = s.Hq / s.Hkv, row_groups = (s.L * G + kMaxRowsPerCta - 1) / kMaxRowsPerCta;
  int64_t bs;
  if (num_splits > 0) {
    bs = std::max<int64_t>(1, (s.capacity + num_splits - 1) / num_splits);
    if (s.paged) bs = (bs + s.page_size - 1) / s.page_size * s.page_size;
  } else {
    // The warp-split kernel's CTA fills an SM: one full wave of them (more blocks cost the merge
    // little); the exact kernel's small CTAs follow the wave-efficiency rule.
    const int64_t work = s.B * s.Hkv * row_groups, slots = int64_t(sm_count(device)) * kernel.ctas_per_sm;
    const int S = kernel.warp_split ? int(std::clamp<int64_t>(slots / std::max<int64_t>(work, 1), 1, 128))
                                    : auto_splits(s.B, s.Hkv * row_groups, sm_count(device), kernel.ctas_per_sm);
    bs = std::max<int64_t>(kAutoBlockFloor, (s.capacity + S - 1) / S);
    bs = (bs + 63) / 64 * 64;
  }
  bs = std::min<int64_t>(bs, int64_t(1) << 30);
  const int64_t NB = (s.capacity + bs - 1) / bs;
  std::vector<int64_t> lead{s.B, s.L, s.Hq, NB};
  Tensor m = torch::stable::new_empty(q, lead, ScalarType::Float);
  Tensor l = torch::stable::new_empty(q, lead, ScalarType::Float);
  lead.push_back(s.D);
  Tensor o = torch::stable::new_empty(q, lead, ScalarType::Float);
  const double sc = scale.has_value() ? *scale : 1.0 / std::sqrt(double(s.D));
  // q is rotated inside pass 1 (q_rot = scale Pi_K q, one butterfly per query row), saving a launch.
  launch_flash_p1(q, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, v_codebook, key_bits, value_bits,
                  block_table, s, bs, NB, k_sign, float(sc / std::sqrt(double(s.D))), kernel, o, m, l);
  std::vector<int64_t> out_shape = sizes_of(q, 0, q.dim()), lse_shape = sizes_of(q, 0, q.dim() - 1);
  Tensor out = torch::stable::new_empty(q, out_shape);
  Tensor lse = torch::stable::new_empty(q, lse_shape, ScalarType::Float);
  launch_flash_p2(o, m, l, v_sign, out, lse, float_kind(q, "q"), /*after_p1=*/true);
  return {out, lse};
}

}  // namespace aura
