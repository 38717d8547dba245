// Where the time of a flash_decode goes: a standalone driver of the real split kernel (tensor-core,
// bf16) and merge kernel with their phase probes (AURA_PHASE, recorded by tools/timeline_probe.cuh),
// plus CUDA-graph timings of the pieces, on the launcher's own plan (decode.cuh: decode_auto_splits; decode.cu: copy
// engine). No torch at run time (its headers only):
//
//   nvcc -std=c++20 -O3 -DUSE_CUDA --expt-relaxed-constexpr -gencode arch=compute_90,code=sm_90 \
//        -I$(python3 -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])') -Icsrc \
//        tools/decode_timeline.cu -o /tmp/decode_timeline && /tmp/decode_timeline [B T D]
//
// Phases (us from the first split CTA's start, median over the live CTAs): split 1 seq_len known,
// 2 q staged (barrier), 4 main loop done (last warp), 5 warp partials in shared memory, 6 exit (last
// warp); merge 8 entry, 9 dependency resolved, 10 exit.
// Then the spread of the loop ends over the CTAs (percentiles, and medians by CTAs per SM: the
// memory system shares bandwidth per SM under saturation, docs/decode.md §4). Experiment knobs:
// DT_ENGINE=tiles|rows|bulk|cpasync forces a copy engine (rows: the launcher's row engines),
// DT_SMEM=<bytes> pads the CTA's shared memory (fewer CTAs per SM), DT_PAD=<elements> staggers the (b, h)
// rows' start addresses, DT_BYSM=1 prints each SM's and each CTA's loop end (GPCs show as runs of SM ids),
// DT_STREAMK=1|2 runs the stream-K schedule with that many CTAs per SM instead of the static splits (a
// CTA's loop end is its last piece's), -DAURA_DECODE_MAX_STAGES=<n> caps the ring depth and
// -DAURA_DECODE_SMEM_BUDGET=<bytes> raises the CTA's budget (deeper rings).
#include "timeline_probe.cuh"
// (defines AURA_PHASE before the kernels are included)
#include "cuda/decode.cuh"

using namespace aura;
using T = __nv_bfloat16;

template <int D>
void run_case(int B, int Hq, int Hkv, int T_len, int sms, int S_force = 0) {  // S_force > 0: that split count
  using Shape = WarpSplitShape<T, D>;
  const int G = Hq / Hkv;
  const char* pad_env = std::getenv("DT_PAD");  // elements between (b, h) rows: staggers the rows' start addresses
  const int64_t row = int64_t(T_len) * D + (pad_env ? std::atoi(pad_env) : 0);
  const size_t kv = size_t(B) * Hkv * row;
  T *q, *k, *v, *out;
  float *lse, *part_out, *part_lse;
  int* seq;
  CK(cudaMalloc(&q, size_t(B) * Hq * D * 2));
  CK(cudaMalloc(&k, kv * 2));
  CK(cudaMalloc(&v, kv * 2));
  CK(cudaMalloc(&out, size_t(B) * Hq * D * 2));
  CK(cudaMalloc(&lse, size_t(B) * Hq * 4));
  CK(cudaMalloc(&seq, B * 4));
  tl::fill_bf16<<<64, 256>>>(q, size_t(B) * Hq * D);
  tl::fill_bf16<<<1024, 256>>>(k, kv);
  tl::fill_bf16<<<1024, 256>>>(v, kv);
  std::vector<int> sl(B, T_len);
  CK(cudaMemcpy(seq, sl.data(), B * 4, cudaMemcpyHostToDevice));

  // the launcher's plan (decode.cu), or DT_STREAMK's grid of that many CTAs per SM
  const char* streamk_env = std::getenv("DT_STREAMK");
  const int streamk_ctas = streamk_env ? sms * std::atoi(streamk_env) : 0;
  const int S = S_force > 0 ? S_force : decode_auto_splits(B, Hkv, sms, D, 0, T_len, kContiguousTile);
  const int head_tiles = ceil_div(G, Shape::kMaxHeads), heads_per_cta = ceil_div(G, head_tiles);
  const size_t part_rows = streamk_ctas > 0 ? size_t(streamk_partial_rows(streamk_ctas, B, Hkv * head_tiles,
                                                                          heads_per_cta))
                                            : size_t(S) * B * Hq;  // decode.cu's bounds
  CK(cudaMalloc(&part_out, part_rows * D * 4));
  CK(cudaMalloc(&part_lse, part_rows * 4));
  DecodeParams p{};
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse, p.part_out = part_out, p.part_lse = part_lse;
  p.seq_lens = seq, p.block_table = nullptr;
  p.q_sb = int64_t(Hq) * D, p.q_sh = D;
  p.k_s0 = p.v_s0 = int64_t(Hkv) * row, p.k_s1 = p.v_s1 = row, p.k_s2 = p.v_s2 = D;
  p.out_sb = int64_t(Hq) * D, p.out_sh = D, p.lse_sb = Hq, p.lse_sh = 1;
  p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.G = G, p.S = streamk_ctas > 0 ? 0 : S, p.streamk_ctas = streamk_ctas;
  p.head_tiles = head_tiles, p.heads_per_cta = heads_per_cta;
  p.capacity = T_len, p.D_runtime = D;
  p.q_vec16 = 1;  // the buffers here are 16-byte aligned
  p.scale_log2 = float(1.0 / std::sqrt(double(D)) * 1.4426950408889634);
  const int per_split = ceil_div(T_len, S);
  // DT_ENGINE: tiles (the launcher's default where the layout allows), rows (the launcher's row
  // engines: bulk rows for long splits, else cp.async), bulk (bulk rows), cpasync
  const char* engine = std::getenv("DT_ENGINE");
  const char e = engine ? engine[0] : 't';
  const bool bulk = e == 'b' || (e != 'c' && ceil_div(per_split, 16 * Shape::kWarps) >= 16);
  TileMaps maps{};
  const bool tiles = e == 't' && make_tile_maps(p, true, D, maps);
  auto split = tiles  ? flash_decode_split_mma_kernel<T, D, 1, true, D % 64 == 0>
               : bulk ? flash_decode_split_mma_kernel<T, D, 1, true>
                      : flash_decode_split_mma_kernel<T, D, 1, false>;
  if constexpr (D <= 256 && D % 64 == 0) {
    if (streamk_ctas > 0 && tiles) split = flash_decode_streamk_mma_kernel<T, D, 1, true, true>;
  }
  if (streamk_ctas > 0 && (!tiles || D > 256)) {
    std::printf("DT_STREAMK: the tile copies at D <= 256 only (D%d, engine %c)\n", D, e);
    std::exit(1);
  }
  CK(cudaFuncSetAttribute(split, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBudget)));
  const char* smem_env = std::getenv("DT_SMEM");  // bytes of dynamic shared memory (pads the CTA: occupancy)
  const size_t smem = smem_env ? size_t(std::atoi(smem_env)) : Shape::kSmem;
  const dim3 grid = streamk_ctas > 0 ? dim3(streamk_ctas) : dim3(S, Hkv * p.head_tiles, B);
  const int split_ctas = int(grid.x * grid.y * grid.z);
  MergeParams m{};
  m.part_out = part_out, m.part_lse = part_lse, m.out = out, m.lse = lse;
  m.po_s = int64_t(B) * Hq * D, m.po_b = int64_t(Hq) * D, m.po_h = D;
  m.pl_s = int64_t(B) * Hq, m.pl_b = Hq, m.pl_h = 1;
  m.out_b = int64_t(Hq) * D, m.out_h = D, m.lse_b = Hq, m.lse_h = 1;
  m.S = p.S, m.B = B, m.Hq = Hq, m.D = D;
  if (streamk_ctas > 0) {  // the merge finds each unit's pieces from seq_lens (decode.cu)
    m.G = G, m.heads_per_cta = heads_per_cta, m.head_tiles = head_tiles, m.Hkv = Hkv;
    m.streamk_ctas = streamk_ctas, m.seq_lens = seq, m.capacity = T_len;
  }
  auto merge = merge_attn_states_kernel<float, T, true>;
  CK(cudaFuncSetAttribute(merge, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared)));

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto decode = [&](bool with_merge) {
    split<<<grid, Shape::kWarps * 32, smem, st>>>(p, maps);
    if (with_merge && p.S != 1)
      CK(launch_after(merge, dim3(unsigned(B * Hq), unsigned(ceil_div(D, kMergeChunk))), dim3(kMergeThreads), 0, st,
                      true, m));
  };
  for (int i = 0; i < 20; ++i) decode(true);
  CK(cudaStreamSynchronize(st));

  tl::reset();
  decode(true);
  CK(cudaStreamSynchronize(st));
  if (streamk_ctas > 0) std::printf("D%d B%d %d/%d T%-6d stream-K %d CTAs", D, B, Hq, Hkv, T_len, streamk_ctas);
  else std::printf("D%d B%d %d/%d T%-6d S %3d", D, B, Hq, Hkv, T_len, S);
  std::printf(" (%s, %d warps, ring %d) |", tiles ? "tiles" : bulk ? "bulk rows" : "cp.async", Shape::kWarps,
              Shape::kStages);
  tl::print_phases(split_ctas, B * Hq * ceil_div(D, kMergeChunk), {1, 2, 4, 5, 6, 8, 9, 10}, {4, 6});
  std::printf("\n");
  tl::print_spread(split_ctas, 4);  // before the graph replays overwrite the stamps
  const float t_dec = tl::graph_us(st, [&] { decode(true); }), t_split = tl::graph_us(st, [&] { decode(false); });
  std::printf(" | graph us: split+merge %.2f split %.2f (%.2f TB/s)\n", t_dec, t_split, 2.0 * kv * 2 / t_dec * 1e-6);
  CK(cudaGetLastError());
  for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)out, (void*)lse, (void*)seq, (void*)part_out, (void*)part_lse})
    CK(cudaFree(ptr));
  CK(cudaStreamDestroy(st));
}

int main(int argc, char** argv) {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (argc >= 4) {  // one case, e.g. under ncu: decode_timeline B T D [S [Hq Hkv]] (default: that D's heads below)
    const int B = std::atoi(argv[1]), T_len = std::atoi(argv[2]), D = std::atoi(argv[3]);
    const int S = argc >= 5 ? std::atoi(argv[4]) : 0;
    const int Hq = argc >= 7 ? std::atoi(argv[5]) : D == 256 ? 16 : D == 512 ? 16 : 32;
    const int Hkv = argc >= 7 ? std::atoi(argv[6]) : D == 256 ? 8 : D == 512 ? 2 : 8;
    if (D == 256) run_case<256>(B, Hq, Hkv, T_len, sms, S);
    else if (D == 512) run_case<512>(B, Hq, Hkv, T_len, sms, S);
    else run_case<128>(B, Hq, Hkv, T_len, sms, S);
    return 0;
  }
  for (int T_len : {1024, 4096, 8192, 32768, 131072}) run_case<128>(1, 32, 8, T_len, sms);
  run_case<128>(8, 32, 8, 32768, sms);
  run_case<128>(32, 32, 8, 8192, sms);
  run_case<256>(1, 16, 8, 32768, sms);
  run_case<512>(1, 16, 2, 32768, sms);
  return 0;
}
