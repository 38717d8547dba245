// Host launchers of the split-K decode family: flash_decode, flash_decode_out, merge_attn_states.
// Stable ABI only (decode.md §9), launched on the current stream, no host synchronisation: the
// split count comes from static values (B, Hkv, SM count), never from seq_lens (decode.md §4, §8).
#include "decode.cuh"
#include "ops.h"

#include <cmath>
#include <vector>

namespace aura {
namespace {

constexpr int kCtasPerSm = 2;          // same stand-in as torch_aura/reference/decode.py
constexpr size_t kSmemBudget = 110 * 1024;  // per CTA, so two CTAs share an H100 SM's 228 KB

bool supported_head_dim(int64_t D) {
  return D == 64 || D == 80 || D == 96 || D == 128 || D == 192 || D == 256 || D == 512;
}

template <typename T, int D>
void launch_split(DecodeParams p, cudaStream_t stream) {
  constexpr bool kTensorCores = !std::is_same_v<T, float>;
  size_t smem;
  if constexpr (kTensorCores) {
    // The group's heads are the 16 rows of the MMA tile; larger groups take balanced tiles of at
    // most 16 heads (each tile re-reads the split from HBM, so only G > 16 pays for it).
    p.head_tiles = ceil_div(p.G, kMmaHeads);
    smem = decode_mma_smem_bytes<T, D>();
  } else {
    // Heads per CTA: the whole group when it fits next to the K/V stages, else balanced tiles.
    constexpr size_t kv_bytes = decode_kv_smem_bytes<T, D>();
    constexpr size_t head_bytes = decode_head_smem_bytes<T, D>();
    const int fit = static_cast<int>(std::max<size_t>(1, (kSmemBudget - kv_bytes) / head_bytes));
    p.head_tiles = ceil_div(p.G, std::min(fit, p.G));
  }
  p.heads_per_cta = ceil_div(p.G, p.head_tiles);
  if constexpr (!kTensorCores) smem = decode_kv_smem_bytes<T, D>() + p.heads_per_cta * decode_head_smem_bytes<T, D>();
  void (*kernel)(DecodeParams);
  int threads;
  if constexpr (kTensorCores) {
    kernel = flash_decode_split_mma_kernel<T, D>;  // only 16-bit types instantiate it
    threads = kMmaThreads;
  } else {
    kernel = flash_decode_split_simt_kernel<T, D>;
    threads = kSimtThreads;
  }
  // Raise the dynamic shared-memory limit once per (instantiation, device): an attribute set outside
  // any stream, so it is legal before and during graph capture alike.
  static bool configured[64] = {};
  int device = 0;
  cudaGetDevice(&device);
  if (device >= 64 || !configured[device]) {
    AURA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBudget)) ==
                   cudaSuccess,
               "flash_decode: cudaFuncSetAttribute failed");
    if (device < 64) configured[device] = true;
  }
  const dim3 grid(p.S, p.Hkv * p.head_tiles, p.B);
  kernel<<<grid, threads, smem, stream>>>(p);
  check_launch("flash_decode split kernel");
}

template <typename T>
void launch_split_any_dim(int64_t D, const DecodeParams& p, cudaStream_t stream) {
  switch (D) {
    case 64: return launch_split<T, 64>(p, stream);
    case 80: return launch_split<T, 80>(p, stream);
    case 96: return launch_split<T, 96>(p, stream);
    case 128: return launch_split<T, 128>(p, stream);
    case 192: return launch_split<T, 192>(p, stream);
    case 256: return launch_split<T, 256>(p, stream);
    case 512: return launch_split<T, 512>(p, stream);
    default: AURA_CHECK(false, "head_dim: expected one of 64, 80, 96, 128, 192, 256, 512, got ", D);
  }
}

template <typename TI, typename TO>
void launch_merge(const MergeParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t(p.B) * p.Hq;
  if (rows == 0) return;
  merge_attn_states_kernel<TI, TO><<<static_cast<unsigned>(ceil_div(int(rows), 4)), 128, 0, stream>>>(p);
  check_launch("merge_attn_states kernel");
}

void check_float_dtype(const Tensor& t, const char* name) {
  const auto dt = t.scalar_type();
  AURA_CHECK(dt == ScalarType::Half || dt == ScalarType::BFloat16 || dt == ScalarType::Float, name,
             ": expected dtype float16 / bfloat16 / float32, got ", dtype_name(dt));
}

void check_same_device(const Tensor& a, const Tensor& b, const char* name) {
  AURA_CHECK(a.get_device_index() == b.get_device_index(), name, ": expected the device of q (cuda:",
             a.get_device_index(), "), got cuda:", b.get_device_index());
}

// Validates everything the kernel relies on for memory safety (the Python wrapper validated the
// same things already; direct torch.ops calls land here without it) and runs the split + merge.
void run_flash_decode(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& seq_lens,
                      const std::optional<Tensor>& block_table, std::optional<double> scale, int64_t num_splits,
                      const Tensor& out, const Tensor& lse) {
  check_cuda_tensor(q, "q", 3);
  check_float_dtype(q, "q");
  check_cuda_tensor(k, "k_cache", 4);
  check_cuda_tensor(v, "v_cache", 4);
  check_dtype(k, "k_cache", q.scalar_type());
  check_dtype(v, "v_cache", q.scalar_type());
  const bool paged = block_table.has_value();
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  AURA_CHECK(supported_head_dim(D), "head_dim: expected one of 64, 80, 96, 128, 192, 256, 512, got ", D);
  for (int i = 0; i < 4; ++i)
    AURA_CHECK(k.size(i) == v.size(i), "v_cache: expected the shape of k_cache, got a mismatch in dim ", i);
  AURA_CHECK(k.size(3) == D, "k_cache: expected head dim ", D, " (q's), got ", k.size(3));
  const int64_t Hkv = paged ? k.size(2) : k.size(1);
  AURA_CHECK(Hkv > 0 && Hq % Hkv == 0, "q: expected Hq (", Hq, ") to be a multiple of Hkv (", Hkv, ")");
  AURA_CHECK(paged || k.size(0) == B, "k_cache: expected batch ", B, " (q's), got ", k.size(0));
  check_cuda_tensor(seq_lens, "seq_lens", 1);
  check_dtype(seq_lens, "seq_lens", ScalarType::Int);
  AURA_CHECK(seq_lens.size(0) == B, "seq_lens: expected shape [", B, "], got [", seq_lens.size(0), "]");
  AURA_CHECK(num_splits >= 0, "num_splits: expected >= 0, got ", num_splits);
  AURA_CHECK(B <= 65535, "q: expected a batch of at most 65535 sequences, got ", B);
  check_cuda_tensor(out, "out", 3);
  check_dtype(out, "out", q.scalar_type());
  AURA_CHECK(out.size(0) == B && out.size(1) == Hq && out.size(2) == D, "out: expected shape [", B, ", ", Hq,
             ", ", D, "]");
  AURA_CHECK(lse.is_cuda() && lse.dim() == 2 && lse.size(0) == B && lse.size(1) == Hq, "lse: expected a CUDA "
             "tensor of shape [", B, ", ", Hq, "]");
  check_dtype(lse, "lse", ScalarType::Float);
  for (const Tensor* t : {&k, &v, &seq_lens, &out, &lse}) check_same_device(q, *t, "k_cache / v_cache / seq_lens / out / lse");
  check_vector_aligned(k, "k_cache");
  check_vector_aligned(v, "v_cache");
  if (paged) {
    check_cuda_tensor(*block_table, "block_table", 2);
    check_dtype(*block_table, "block_table", ScalarType::Int);
    check_same_device(q, *block_table, "block_table");
    AURA_CHECK(block_table->size(0) == B, "block_table: expected ", B, " rows, got ", block_table->size(0));
  }

  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  const cudaStream_t stream = current_stream(q);
  const int S = num_splits > 0 ? static_cast<int>(num_splits)
                               : auto_splits(B, Hkv, sm_count(q.get_device_index()), kCtasPerSm);
  if (B == 0 || Hq == 0) return;

  DecodeParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.out = out.data_ptr();
  p.lse = static_cast<float*>(lse.data_ptr());
  p.seq_lens = static_cast<const int*>(seq_lens.data_ptr());
  p.block_table = paged ? static_cast<const int*>(block_table->data_ptr()) : nullptr;
  p.q_sb = q.stride(0), p.q_sh = q.stride(1);
  p.k_s0 = k.stride(0), p.k_s1 = k.stride(1), p.k_s2 = k.stride(2);
  p.v_s0 = v.stride(0), p.v_s1 = v.stride(1), p.v_s2 = v.stride(2);
  p.out_sb = out.stride(0), p.out_sh = out.stride(1);
  p.lse_sb = lse.stride(0), p.lse_sh = lse.stride(1);
  p.bt_sb = paged ? block_table->stride(0) : 0;
  p.B = int(B), p.Hq = int(Hq), p.Hkv = int(Hkv), p.G = int(Hq / Hkv), p.S = S;
  p.page_size = paged ? int(k.size(1)) : 0;
  p.num_blocks = paged ? int(k.size(0)) : 0;
  p.capacity = paged ? int(block_table->size(1) * k.size(1)) : int(k.size(2));
  p.D_runtime = int(D);
  p.scale_log2 = float((scale.has_value() ? *scale : 1.0 / std::sqrt(double(D))) * kLog2e);

  Tensor part_out = q, part_lse = q;  // placeholders; real buffers only when S > 1
  if (S > 1) {
    // Through torch's caching allocator (graph-pool aware under capture), never cudaMalloc.
    part_out = torch::stable::new_empty(q, std::vector<int64_t>{S, B, Hq, D}, ScalarType::Float);
    part_lse = torch::stable::new_empty(q, std::vector<int64_t>{S, B, Hq}, ScalarType::Float);
    p.part_out = static_cast<float*>(part_out.data_ptr());
    p.part_lse = static_cast<float*>(part_lse.data_ptr());
  }
  switch (q.scalar_type()) {
    case ScalarType::Float: launch_split_any_dim<float>(D, p, stream); break;
    case ScalarType::Half: launch_split_any_dim<__half>(D, p, stream); break;
    default: launch_split_any_dim<__nv_bfloat16>(D, p, stream); break;
  }
  if (S > 1) {
    MergeParams m{};
    m.part_out = part_out.data_ptr();
    m.part_lse = p.part_lse;
    m.out = out.data_ptr();
    m.lse = p.lse;
    m.po_s = B * Hq * D, m.po_b = Hq * D, m.po_h = D;
    m.pl_s = B * Hq, m.pl_b = Hq, m.pl_h = 1;
    m.out_b = out.stride(0), m.out_h = out.stride(1);
    m.lse_b = lse.stride(0), m.lse_h = lse.stride(1);
    m.S = S, m.B = int(B), m.Hq = int(Hq), m.D = int(D);
    switch (q.scalar_type()) {
      case ScalarType::Float: launch_merge<float, float>(m, stream); break;
      case ScalarType::Half: launch_merge<float, __half>(m, stream); break;
      default: launch_merge<float, __nv_bfloat16>(m, stream); break;
    }
  }
}

}  // namespace

std::tuple<Tensor, Tensor> flash_decode_cuda(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seq_lens,
                                             std::optional<Tensor> block_table, std::optional<double> scale,
                                             int64_t num_splits) {
  check_cuda_tensor(q, "q", 3);
  Tensor out = torch::stable::new_empty(q, std::vector<int64_t>{q.size(0), q.size(1), q.size(2)});
  Tensor lse = torch::stable::new_empty(q, std::vector<int64_t>{q.size(0), q.size(1)}, ScalarType::Float);
  run_flash_decode(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits, out, lse);
  return {out, lse};
}

void flash_decode_out_cuda(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seq_lens,
                           std::optional<Tensor> block_table, std::optional<double> scale, int64_t num_splits,
                           Tensor out, Tensor lse) {
  run_flash_decode(q, k_cache, v_cache, seq_lens, block_table, scale, num_splits, out, lse);
}

std::tuple<Tensor, Tensor> merge_attn_states_cuda(Tensor partial_out, Tensor partial_lse) {
  check_cuda_tensor(partial_out, "partial_out", 4);
  check_float_dtype(partial_out, "partial_out");
  AURA_CHECK(partial_lse.is_cuda() && partial_lse.dim() == 3, "partial_lse: expected a 3-D CUDA tensor");
  check_dtype(partial_lse, "partial_lse", ScalarType::Float);
  check_same_device(partial_out, partial_lse, "partial_lse");
  const int64_t S = partial_out.size(0), B = partial_out.size(1), Hq = partial_out.size(2), D = partial_out.size(3);
  AURA_CHECK(partial_lse.size(0) == S && partial_lse.size(1) == B && partial_lse.size(2) == Hq,
             "partial_lse: expected shape [", S, ", ", B, ", ", Hq, "] (partial_out's first three dims)");
  AURA_CHECK(D <= 128 * kMergeMaxChunks && D % 4 == 0, "partial_out: expected a head_dim that is a multiple of 4 "
             "and at most 512, got ", D);
  Tensor out = torch::stable::new_empty(partial_out, std::vector<int64_t>{B, Hq, D});
  Tensor lse = torch::stable::new_empty(partial_out, std::vector<int64_t>{B, Hq}, ScalarType::Float);
  torch::stable::accelerator::DeviceGuard guard(partial_out.get_device_index());
  MergeParams m{};
  m.part_out = partial_out.data_ptr();
  m.part_lse = static_cast<const float*>(partial_lse.data_ptr());
  m.out = out.data_ptr();
  m.lse = static_cast<float*>(lse.data_ptr());
  m.po_s = partial_out.stride(0), m.po_b = partial_out.stride(1), m.po_h = partial_out.stride(2);
  m.pl_s = partial_lse.stride(0), m.pl_b = partial_lse.stride(1), m.pl_h = partial_lse.stride(2);
  m.out_b = Hq * D, m.out_h = D, m.lse_b = Hq, m.lse_h = 1;
  m.S = int(S), m.B = int(B), m.Hq = int(Hq), m.D = int(D);
  const cudaStream_t stream = current_stream(partial_out);
  switch (partial_out.scalar_type()) {
    case ScalarType::Float: launch_merge<float, float>(m, stream); break;
    case ScalarType::Half: launch_merge<__half, __half>(m, stream); break;
    default: launch_merge<__nv_bfloat16, __nv_bfloat16>(m, stream); break;
  }
  return {out, lse};
}

}  // namespace aura
