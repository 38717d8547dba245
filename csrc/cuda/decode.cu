// Host launchers of the split-K decode family: flash_decode, flash_decode_out, merge_attn_states.
// Stable ABI only (decode.md §9), launched on the current stream, no host synchronisation: the
// split count comes from static values (B, Hkv, SM count), never from seq_lens (decode.md §4, §8).
#include "decode.cuh"
#include "ops.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

namespace aura {
namespace {

constexpr int kCtasPerSm = 2;  // resident split CTAs per SM (kSmemBudget keeps it true): the balanced grid's slots
// The balanced schedule (decode.cuh): items per CTA slot the plan aims at (claiming balances to about
// one item; 4 measured best of 1, 2, 4, 8) and the shortest item. Opt-in: it has not beaten the static
// splits yet (decode.md §4).
constexpr int kBalancedItemsPerSlot = 4;
constexpr int kBalancedMinChunk = 256;

enum class Schedule { kStatic, kBalanced, kStreamK };

// TORCH_AURA_DECODE_ITEMS_PER_SLOT (1-64, default kBalancedItemsPerSlot): the balanced plan's item
// count per CTA slot, a tuning knob for bench_decode.py --schedules (fewer, longer items or more, shorter).
int balanced_items_per_slot() {
  const char* env = std::getenv("TORCH_AURA_DECODE_ITEMS_PER_SLOT");
  if (env == nullptr || *env == '\0') return kBalancedItemsPerSlot;
  const int k = std::atoi(env);
  AURA_CHECK(k >= 1 && k <= 64, "TORCH_AURA_DECODE_ITEMS_PER_SLOT: expected an integer in [1, 64], got ", env);
  return k;
}

// A switch read on every call (so a test or a benchmark can compare its values in one process): the
// index of its value in `choices`, 0 (choices[0], the default) when unset or empty; any other value
// raises, naming the variable and its choices.
int env_choice(const char* name, std::initializer_list<const char*> choices) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return 0;
  std::string listed;
  int i = 0;
  for (const char* c : choices) {
    if (std::strcmp(env, c) == 0) return i;
    listed += (i++ == 0 ? "" : ", ") + std::string(c);
  }
  AURA_CHECK(false, name, ": expected one of ", listed, ", got ", env);
  return 0;
}

// TORCH_AURA_DECODE_STREAMK_CTAS_PER_SM (1 or 2, default 1): the stream-K grid's CTAs per SM.
int streamk_ctas_per_sm() {
  return env_choice("TORCH_AURA_DECODE_STREAMK_CTAS_PER_SM", {"1", "2"}) + 1;
}

// The stream-K rule the H200's --schedules runs suggest (decode.md §4), opt-in as `adaptive` until both GPUs
// have timed it: stream-K where the static plan splits a read and each SM's share of a full cache is at least
// kStreamKMinShare tokens (below it, or with no merge to pay for, the static splits won), two CTAs per SM on
// contiguous caches and one on paged ones. 0: the static splits.
constexpr int64_t kStreamKMinShare = 6144;
int adaptive_streamk_ctas_per_sm(const DecodeParams& p, int static_splits, int sms) {
  const int64_t tokens = int64_t(p.capacity) * p.B * p.Hkv * p.head_tiles;
  if (static_splits <= 1 || tokens < kStreamKMinShare * sms) return 0;
  return p.block_table != nullptr ? 1 : 2;
}

struct SchedulePick {
  Schedule kind;
  int streamk_ctas_per_sm;  // kStreamK
};

// TORCH_AURA_DECODE_SCHEDULE=auto|static|balanced|streamk|adaptive (default auto = static until another
// schedule pays). num_splits > 0 always means the static schedule, and so do fp32 caches (the CUDA-core
// kernel); stream-K also needs D <= 256 (D = 512 runs its own CTAs) and B <= kStreamKMaxBatch.
SchedulePick pick_schedule(const DecodeParams& p, bool tensor_cores, int64_t num_splits, int static_splits, int sms) {
  const int forced = env_choice("TORCH_AURA_DECODE_SCHEDULE", {"auto", "static", "balanced", "streamk", "adaptive"});
  if (!tensor_cores || num_splits != 0) return {Schedule::kStatic, 0};
  if (forced == 2) return {Schedule::kBalanced, 0};
  if ((forced == 3 || forced == 4) && p.D_runtime <= 256 && p.B <= kStreamKMaxBatch) {
    const int per_sm = forced == 3 ? streamk_ctas_per_sm() : adaptive_streamk_ctas_per_sm(p, static_splits, sms);
    if (per_sm > 0) return {Schedule::kStreamK, per_sm};
  }
  return {Schedule::kStatic, 0};
}

// TORCH_AURA_DECODE_COPY=auto|tiles|rows (for comparisons): rows moves K/V row by row (1-D bulk copies
// for long contiguous splits, cp.async otherwise) instead of as 2-D tensor-map tiles (decode.md §3).
bool tile_copies_allowed() { return env_choice("TORCH_AURA_DECODE_COPY", {"auto", "tiles", "rows"}) != 2; }

// TORCH_AURA_DECODE_D512=auto|dims|warp: at D = 512 with tile copies, four warps that split the dims
// (auto, dims; flash_decode_split_dims_kernel) or the one-warp CTA (warp, for comparisons).
bool d512_dims_allowed() { return env_choice("TORCH_AURA_DECODE_D512", {"auto", "dims", "warp"}) != 2; }

// grid_ctas > 0: the balanced kernel's persistent grid, a programmatic dependent of the plan kernel, or
// the stream-K grid (p.streamk_ctas); else the static grid (S, Hkv * head_tiles, B); with the tile copies'
// tensor maps where the kernel takes them.
template <auto Kernel>
void launch_split_kernel(const DecodeParams& p, int threads, size_t smem, cudaStream_t stream, int grid_ctas = 0,
                         const TileMaps& maps = TileMaps{}) {
  AURA_CHECK(smem <= kSmemBudget, "flash_decode: shared memory plan exceeds the budget: ", smem);
  // the whole per-CTA budget, whatever this launch needs (the fp32 kernel's need varies per call)
  set_kernel_attribute_once<Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize>(int(kSmemBudget), "flash_decode");
  const dim3 grid = p.streamk_ctas > 0 ? dim3(p.streamk_ctas) : dim3(p.S, p.Hkv * p.head_tiles, p.B);
  if constexpr (std::is_invocable_v<decltype(Kernel), DecodeParams, TileMaps>) {  // the tensor-core kernels
    if (grid_ctas > 0) {  // balanced
      const cudaError_t err = launch_after(Kernel, dim3(grid_ctas), dim3(threads), smem, stream, true, p, maps);
      AURA_CHECK(err == cudaSuccess, "flash_decode balanced kernel: launch failed: ", cudaGetErrorString(err));
      return;
    }
    Kernel<<<grid, threads, smem, stream>>>(p, maps);
  } else {
    Kernel<<<grid, threads, smem, stream>>>(p);
  }
  check_launch("flash_decode split kernel");
}

// heads per CTA of the tensor-core kernels: the whole group up to kMaxHeads, else balanced tiles (each
// re-reads the split, so only such groups pay for it)
template <typename T, int D>
void set_mma_head_tiles(DecodeParams& p) {
  p.head_tiles = ceil_div(p.G, WarpSplitShape<T, D>::kMaxHeads);
  p.heads_per_cta = ceil_div(p.G, p.head_tiles);
}

// grid_ctas > 0: the balanced schedule (p.plan set, p.S == 0) on that many persistent CTAs. p.streamk_ctas > 0:
// the stream-K schedule.
template <typename T, int D>
void launch_split(DecodeParams p, cudaStream_t stream, int grid_ctas) {
  if constexpr (!std::is_same_v<T, float>) {
    // Tensor cores: the group's heads are the MMA's n (8 per tile), in the head tiles the caller set
    // (set_mma_head_tiles: the balanced plan counts them too).
    using Shape = WarpSplitShape<T, D>;
    // Copy engine from static values only (capacity is a shape, not data): bulk copies where a
    // full-capacity split gives each warp >= 16 steps (bandwidth-bound), else cp.async (latency-bound
    // short splits, and paged caches, where per-row page lookups cost bulk more; decode.md §13).
    // The balanced schedule's items are planned for long reads: bulk for every contiguous cache.
    const int per_split = ceil_div(std::max(p.capacity, 1), std::max(p.S, 1));
    const bool bulk = p.block_table == nullptr && (grid_ctas > 0 || ceil_div(per_split, 16 * Shape::kWarps) >= 16);
    // Swizzled 2-D tiles through tensor maps wherever the layout allows (D a multiple of 64, pages of
    // 16k tokens), for long and short splits alike: the fastest engine everywhere measured (decode.md
    // §3). Static values too: the maps hold shapes and base pointers only.
    TileMaps maps{};
    const bool tiles = make_tile_maps(p, std::is_same_v<T, __nv_bfloat16>, D, maps) && tile_copies_allowed();
    if constexpr (D == 512) {
      if (tiles && d512_dims_allowed() && grid_ctas == 0) {
        using Dims = DimSplitShape<T>;
        return launch_split_kernel<flash_decode_split_dims_kernel<T>>(p, Dims::kWarps * 32, Dims::kSmem, stream, 0,
                                                                      maps);
      }
    }
    auto go = [&](auto nht, auto bulk_tag, auto tiles_tag) {
      constexpr int nht_v = decltype(nht)::value;
      constexpr bool bulk_v = decltype(bulk_tag)::value;
      if constexpr (D <= 256) {  // (pick_schedule)
        if (p.streamk_ctas > 0)
          return launch_split_kernel<flash_decode_streamk_mma_kernel<T, D, nht_v, bulk_v, decltype(tiles_tag)::value>>(
              p, Shape::kWarps * 32, Shape::kSmem, stream, 0, maps);
      }
      if (grid_ctas > 0)
        launch_split_kernel<flash_decode_balanced_mma_kernel<T, D, nht_v, bulk_v, decltype(tiles_tag)::value>>(
            p, Shape::kWarps * 32, Shape::kSmem, stream, grid_ctas, maps);
      else
        launch_split_kernel<flash_decode_split_mma_kernel<T, D, nht_v, bulk_v, decltype(tiles_tag)::value>>(
            p, Shape::kWarps * 32, Shape::kSmem, stream, 0, maps);
    };
    auto with_engine = [&](auto nht) {
      if constexpr (D % 64 == 0) {
        if (tiles) return go(nht, std::true_type{}, std::true_type{});
      }
      if (bulk) go(nht, std::true_type{}, std::false_type{});
      else go(nht, std::false_type{}, std::false_type{});
    };
    if (p.heads_per_cta <= 8) {
      with_engine(std::integral_constant<int, 1>{});
    } else if constexpr (Shape::kMaxHeads > 8) {
      with_engine(std::integral_constant<int, 2>{});
    }
  } else {
    // CUDA cores: heads per CTA = the whole group when it fits next to the K/V stages, else tiles.
    constexpr size_t kv_bytes = decode_kv_smem_bytes<T, D>();
    constexpr size_t head_bytes = decode_head_smem_bytes<T, D>();
    const int fit = static_cast<int>(std::max<size_t>(1, (kSmemBudget - kv_bytes) / head_bytes));
    p.head_tiles = ceil_div(p.G, std::min(fit, p.G));
    p.heads_per_cta = ceil_div(p.G, p.head_tiles);
    launch_split_kernel<flash_decode_split_simt_kernel<T, D>>(
        p, kSimtThreads, kv_bytes + p.heads_per_cta * head_bytes, stream);
  }
}

// f(std::integral_constant<int, D>) for the supported head dims (csrc/generated/limits.h)
template <typename F>
void with_head_dim(int64_t D, F&& f) {
  with_one_of<AURA_LIMITS_DECODE_HEAD_DIMS>(D, "head_dim", AURA_LIMITS_DECODE_HEAD_DIMS_TEXT, f);
}

template <typename T>
void launch_split_any_dim(int64_t D, const DecodeParams& p, cudaStream_t stream, int grid_ctas) {
  with_head_dim(D, [&](auto d) { launch_split<T, decltype(d)::value>(p, stream, grid_ctas); });
}

// after_split: a programmatic dependent launch behind the split kernel (same stream), so the
// merge's CTAs are resident and waiting (griddepcontrol.wait) when the split grid drains instead of
// paying a full launch latency after it; captured into CUDA graphs as a programmatic edge.
template <typename TI, typename TO>
void launch_merge(const MergeParams& p, cudaStream_t stream, bool after_split) {
  const int64_t rows = int64_t(p.B) * p.Hq;
  if (rows == 0) return;
  AURA_CHECK(rows <= int64_t(INT32_MAX), "merge_attn_states: too many (batch, head) rows: ", rows);
  // 16-byte loads of fp32 partials when base and strides allow (always, for the split kernel's own)
  const bool vec = std::is_same_v<TI, float> && reinterpret_cast<uintptr_t>(p.part_out) % 16 == 0 &&
                   p.po_s % 4 == 0 && p.po_b % 4 == 0 && p.po_h % 4 == 0;
  cudaError_t err;
  auto launch = [&](auto vec_tag) {
    constexpr auto kernel = merge_attn_states_kernel<TI, TO, decltype(vec_tag)::value>;
    // The split kernel runs with the largest shared-memory carveout; asking the same for the merge
    // spares the SMs an L1/shared reconfiguration between the two.
    set_kernel_attribute_once<kernel, cudaFuncAttributePreferredSharedMemoryCarveout>(
        int(cudaSharedmemCarveoutMaxShared), "merge_attn_states");
    const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(ceil_div(p.D, kMergeChunk)));
    err = launch_after(kernel, grid, dim3(kMergeThreads), 0, stream, after_split, p);
  };
  if (vec) launch(std::true_type{});
  else launch(std::false_type{});
  AURA_CHECK(err == cudaSuccess, "merge_attn_states kernel: launch failed: ", cudaGetErrorString(err));
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
  AURA_CHECK(limits::is_decode_head_dim(D), "head_dim: expected one of " AURA_LIMITS_DECODE_HEAD_DIMS_TEXT ", got ", D);
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
  for (const Tensor* t : {&k, &v, &seq_lens, &out, &lse})
    check_same_device(q, *t, "k_cache / v_cache / seq_lens / out / lse");
  check_vector_aligned(k, "k_cache");
  check_vector_aligned(v, "v_cache");
  for (const Tensor* t : {&k, &v})  // the kernels offset the rows of a 16-token step in 32-bit arithmetic
    AURA_CHECK(std::abs(t->stride(paged ? 1 : 2)) * 16 < (int64_t(1) << 31), "k_cache / v_cache: token stride ",
               t->stride(paged ? 1 : 2), " elements is too large (expected < 2^27)");
  if (paged) {
    check_cuda_tensor(*block_table, "block_table", 2);
    check_dtype(*block_table, "block_table", ScalarType::Int);
    check_same_device(q, *block_table, "block_table");
    AURA_CHECK(block_table->size(0) == B, "block_table: expected ", B, " rows, got ", block_table->size(0));
  }

  torch::stable::accelerator::DeviceGuard guard(q.get_device_index());
  const cudaStream_t stream = current_stream(q);
  const int sms = sm_count(q.get_device_index()), slots = sms * kCtasPerSm;
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
  p.B = int(B), p.Hq = int(Hq), p.Hkv = int(Hkv), p.G = int(Hq / Hkv);
  p.page_size = paged ? int(k.size(1)) : 0;
  p.num_blocks = paged ? int(k.size(0)) : 0;
  p.capacity = paged ? int(block_table->size(1) * k.size(1)) : int(k.size(2));
  p.D_runtime = int(D);
  p.scale_log2 = float((scale.has_value() ? *scale : 1.0 / std::sqrt(double(D))) * kLog2e);
  p.q_vec16 = row_vector_bytes(q) == 16;  // (q's last stride is 1: check_cuda_tensor)

  const bool tensor_cores = q.scalar_type() != ScalarType::Float;
  if (tensor_cores) {  // kMaxHeads depends on D only: any 16-bit type gives the same tiles
    with_head_dim(D, [&](auto d) { set_mma_head_tiles<__half, decltype(d)::value>(p); });
  }
  const bool d512_dims = D == 512 && tile_copies_allowed() && d512_dims_allowed();
  const int static_splits =
      num_splits > 0 ? static_cast<int>(num_splits)
                     : decode_auto_splits(B, Hkv, sms, int(D), p.page_size, p.capacity,
                                          paged ? p.page_size : kContiguousTile, d512_dims);
  const SchedulePick schedule = pick_schedule(p, tensor_cores, num_splits, static_splits, sms);

  // Through torch's caching allocator (graph-pool aware under capture), never cudaMalloc. The
  // partials and their lse share one buffer (one allocation fewer per call: host time).
  Tensor partials = q, plan = q;  // placeholders; real buffers only where used
  int64_t part_rows = 0;          // partial rows of D floats; their lse follow them
  int grid_ctas = 0;
  if (schedule.kind == Schedule::kBalanced) {
    p.S = 0;
    const int64_t units = Hkv * p.head_tiles;  // work units per sequence: KV heads x head tiles
    const int64_t target = int64_t(slots) * balanced_items_per_slot();
    const int64_t items_max = target + B * units;  // decode_balance_plan_kernel's bound
    AURA_CHECK(items_max * p.heads_per_cta <= int64_t(INT32_MAX), "flash_decode: too many work items for the "
               "balanced schedule (", items_max, "); set TORCH_AURA_DECODE_SCHEDULE=static");
    plan = torch::stable::new_empty(q, std::vector<int64_t>{kPlanPrefix + B + 1}, ScalarType::Int);
    part_rows = items_max * p.heads_per_cta;
    p.plan = static_cast<int*>(plan.data_ptr());
    grid_ctas = int(std::min<int64_t>(slots, items_max));
    decode_balance_plan_kernel<<<1, kPlanThreads, 0, stream>>>(
        p.seq_lens, p.B, p.capacity, paged ? p.page_size : kContiguousTile, int(units), int(target),
        kBalancedMinChunk, p.plan);
    check_launch("flash_decode plan kernel");
  } else if (schedule.kind == Schedule::kStreamK) {
    p.S = 0;
    p.streamk_ctas = sms * schedule.streamk_ctas_per_sm;
    part_rows = streamk_partial_rows(p.streamk_ctas, B, Hkv * p.head_tiles, p.heads_per_cta);
  } else {
    p.S = static_splits;
    if (p.S > 1) part_rows = int64_t(p.S) * B * Hq;
  }
  if (p.S != 1) {  // [part_rows, D] partials, then [part_rows] lse (16-byte aligned: D % 16 == 0)
    partials = torch::stable::new_empty(q, std::vector<int64_t>{part_rows * (D + 1)}, ScalarType::Float);
    p.part_out = static_cast<float*>(partials.data_ptr());
    p.part_lse = p.part_out + part_rows * D;
  }
  switch (q.scalar_type()) {
    case ScalarType::Float: launch_split_any_dim<float>(D, p, stream, grid_ctas); break;
    case ScalarType::Half: launch_split_any_dim<__half>(D, p, stream, grid_ctas); break;
    default: launch_split_any_dim<__nv_bfloat16>(D, p, stream, grid_ctas); break;
  }
  if (p.S != 1) {
    MergeParams m{};
    m.part_out = p.part_out;
    m.part_lse = p.part_lse;
    m.out = out.data_ptr();
    m.lse = p.lse;
    if (p.plan != nullptr || p.streamk_ctas > 0) {  // rows (item or piece, head in tile) of D, found per unit
      m.plan = p.plan, m.G = p.G, m.heads_per_cta = p.heads_per_cta, m.head_tiles = p.head_tiles, m.Hkv = p.Hkv;
      m.streamk_ctas = p.streamk_ctas, m.seq_lens = p.seq_lens, m.capacity = p.capacity;
    } else {
      m.po_s = B * Hq * D, m.po_b = Hq * D, m.po_h = D;
      m.pl_s = B * Hq, m.pl_b = Hq, m.pl_h = 1;
    }
    m.out_b = out.stride(0), m.out_h = out.stride(1);
    m.lse_b = lse.stride(0), m.lse_h = lse.stride(1);
    m.S = p.S, m.B = int(B), m.Hq = int(Hq), m.D = int(D);
    switch (q.scalar_type()) {
      case ScalarType::Float: launch_merge<float, float>(m, stream, true); break;
      case ScalarType::Half: launch_merge<float, __half>(m, stream, true); break;
      default: launch_merge<float, __nv_bfloat16>(m, stream, true); break;
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
  AURA_CHECK(D <= 512 && D % 4 == 0, "partial_out: expected a head_dim that is a multiple of 4 "
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
    case ScalarType::Float: launch_merge<float, float>(m, stream, false); break;
    case ScalarType::Half: launch_merge<__half, __half>(m, stream, false); break;
    default: launch_merge<__nv_bfloat16, __nv_bfloat16>(m, stream, false); break;
  }
  return {out, lse};
}

}  // namespace aura
