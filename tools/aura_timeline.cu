// Where the time of a batch-1 aura_decode goes: a standalone driver of the real pass-1 (warp-split)
// and pass-2 kernels with their phase probes (AURA_PHASE, recorded by tools/timeline_probe.cuh),
// plus CUDA-graph timings of the pieces. No torch at run time (its headers only), so it builds in
// seconds on the GPU machine:
//
//   nvcc -std=c++20 -O3 -DUSE_CUDA --expt-relaxed-constexpr -gencode arch=compute_90,code=sm_90 \
//        -I$(python3 -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])') -Icsrc \
//        -Itools tools/aura_timeline.cu -o /tmp/aura_timeline && /tmp/aura_timeline
//
// Phases (us from the first pass-1 CTA's start, median over CTAs): p1 1 loads issued, 2 codebooks +
// q staged, 3 tables filled, 4 main loop done (last warp), 5 warp partials in shared memory, 6 exit
// (last warp); p2 8 entry, 9 dependency resolved, 10 exit.
#include "timeline_probe.cuh"
// (defines AURA_PHASE before the kernels are included)
#include "cuda/aura.cuh"

using namespace aura;

template <int KB, int VB>
void run_case(int B, int T, int sms) {
  constexpr int D = 128, Hq = 32, Hkv = 8, G = Hq / Hkv;
  using S = WarpP1Shape<D, KB, VB>;
  constexpr int PWK = D * KB / 32, PWV = D * VB / 32;
  const size_t rows = size_t(B) * Hkv * T;
  uint32_t *kc, *vc, *ksign, *vsign;
  float *kn, *vn, *kcb, *vcb;
  __nv_bfloat16 *q, *out;
  int* seq;
  CK(cudaMalloc(&kc, rows * PWK * 4));
  CK(cudaMalloc(&vc, rows * PWV * 4));
  CK(cudaMalloc(&kn, rows * 4));
  CK(cudaMalloc(&vn, rows * 4));
  CK(cudaMalloc(&kcb, (1 << KB) * 4));
  CK(cudaMalloc(&vcb, (1 << VB) * 4));
  CK(cudaMalloc(&ksign, D / 8));
  CK(cudaMalloc(&vsign, D / 8));
  CK(cudaMalloc(&q, size_t(B) * Hq * D * 2));
  CK(cudaMalloc(&out, size_t(B) * Hq * D * 2));
  CK(cudaMalloc(&seq, B * 4));
  tl::fill_words<<<1024, 256>>>(kc, rows * PWK, 1);
  tl::fill_words<<<1024, 256>>>(vc, rows * PWV, 2);
  tl::fill_words<<<1, 32>>>(ksign, D / 32, 3);
  tl::fill_words<<<1, 32>>>(vsign, D / 32, 4);
  tl::fill_floats<<<1024, 256>>>(kn, rows, 8.f);
  tl::fill_floats<<<1024, 256>>>(vn, rows, 8.f);
  tl::fill_bf16<<<64, 256>>>(q, size_t(B) * Hq * D);
  std::vector<float> cbk(1 << KB), cbv(1 << VB);
  for (int i = 0; i < (1 << KB); ++i) cbk[i] = (i - (1 << KB) / 2 + 0.5f) * 0.02f;
  for (int i = 0; i < (1 << VB); ++i) cbv[i] = (i - (1 << VB) / 2 + 0.5f) * 0.05f;
  CK(cudaMemcpy(kcb, cbk.data(), cbk.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(vcb, cbv.data(), cbv.size() * 4, cudaMemcpyHostToDevice));
  std::vector<int> sl(B, T);
  CK(cudaMemcpy(seq, sl.data(), B * 4, cudaMemcpyHostToDevice));

  // aura_decode's automatic block size (aura.cu)
  const int work = B * Hkv, S_ = std::clamp(sms / std::max(work, 1), 1, 128);
  int bs = std::max(256, (T + S_ - 1) / S_);
  bs = (bs + 63) / 64 * 64;
  const int NB = (T + bs - 1) / bs;
  float *o, *m, *l, *lse;
  CK(cudaMalloc(&o, size_t(B) * Hq * NB * D * 4));
  CK(cudaMalloc(&m, size_t(B) * Hq * NB * 4));
  CK(cudaMalloc(&l, size_t(B) * Hq * NB * 4));
  CK(cudaMalloc(&lse, size_t(B) * Hq * 4));

  AuraP1Params p{};
  p.q = q, p.q_kind = FloatKind::kBF16, p.q_sb = Hq * D, p.q_sl = 0, p.q_sh = D;
  p.kc = kc, p.kn = kn, p.vc = vc, p.vn = vn;
  p.kc_s0 = int64_t(Hkv) * T * PWK, p.kc_s1 = PWK, p.kc_s2 = int64_t(T) * PWK;
  p.vc_s0 = int64_t(Hkv) * T * PWV, p.vc_s1 = PWV, p.vc_s2 = int64_t(T) * PWV;
  p.kn_s0 = p.vn_s0 = int64_t(Hkv) * T, p.kn_s1 = p.vn_s1 = 1, p.kn_s2 = p.vn_s2 = T;
  p.seq_lens = seq, p.block_table = nullptr, p.bt_sb = 0;
  p.k_cb = kcb, p.v_cb = vcb, p.k_sign = ksign, p.q_factor = 1.f / D;
  p.o = o, p.m = m, p.l = l;
  p.B = B, p.L = 1, p.Hq = Hq, p.Hkv = Hkv, p.G = G, p.NB = NB, p.block_size = bs, p.capacity = T;
  p.page_size = 0, p.page_shift = -1, p.num_blocks = 0, p.rows_per_cta = G, p.row_groups = 1;
  p.kc_vec = 16, p.vc_vec = PWV % 4 == 0 ? 16 : 8;
  p.kc_rb = PWK * 4, p.vc_rb = PWV * 4, p.kn_rb = p.vn_rb = 4;
  auto p1 = aura_flash_p1_warp_kernel<D, KB, VB>;
  CK(cudaFuncSetAttribute(p1, cudaFuncAttributeMaxDynamicSharedMemorySize, int(S::kSmem)));
  const dim3 grid(NB, Hkv, B);

  AuraP2Params p2{};
  p2.o = o, p2.m = m, p2.l = l;
  p2.o_rows.nd = p2.m_rows.nd = p2.l_rows.nd = 1;
  p2.o_rows.size[0] = p2.m_rows.size[0] = p2.l_rows.size[0] = int64_t(B) * Hq;
  p2.o_rows.stride[0] = int64_t(NB) * D, p2.m_rows.stride[0] = p2.l_rows.stride[0] = NB;
  p2.o_sn = D, p2.m_sn = p2.l_sn = 1, p2.rows = int64_t(B) * Hq, p2.NB = NB;
  p2.v_sign = vsign, p2.factor = 1.f / std::sqrt(float(D)), p2.out = out, p2.lse = lse, p2.kind = FloatKind::kBF16;
  const dim3 grid2(unsigned((p2.rows + kAuraWarps - 1) / kAuraWarps));

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto decode = [&](bool with_p2) {
    p1<<<grid, S::kWarps * 32, S::kSmem, st>>>(p);
    if (with_p2) CK(launch_after(aura_flash_p2_kernel<D>, grid2, dim3(kAuraThreads), 0, st, true, p2));
  };
  for (int i = 0; i < 20; ++i) decode(true);
  CK(cudaStreamSynchronize(st));

  // ---- timeline of one decode (after warm-up; caches warm, as in graph replays)
  tl::reset();
  decode(true);
  CK(cudaStreamSynchronize(st));
  std::printf("KB%d VB%d B%d T%-6d block %5d NB %2d x %2d warps, ring %d |", KB, VB, B, T, bs, NB, S::kWarps,
              S::kStages);
  tl::print_phases(NB * Hkv * B, int(grid2.x), {1, 2, 3, 4, 5, 6, 8, 9, 10}, {4, 6});
  // ---- graph replays: p1 + p2, p1 alone, and an empty kernel's floor
  const float t_dec = tl::graph_us(st, [&] { decode(true); }), t_p1 = tl::graph_us(st, [&] { decode(false); }),
              t_empty = tl::graph_us(st, [&] { tl::empty_kernel<<<1, 32, 0, st>>>(); });
  std::printf(" | graph us: p1+p2 %.2f p1 %.2f (empty kernel %.2f)\n", t_dec, t_p1, t_empty);
  CK(cudaGetLastError());
  for (void* ptr : {(void*)kc, (void*)vc, (void*)kn, (void*)vn, (void*)kcb, (void*)vcb, (void*)ksign, (void*)vsign,
                    (void*)q, (void*)out, (void*)seq, (void*)o, (void*)m, (void*)l, (void*)lse})
    CK(cudaFree(ptr));
  CK(cudaStreamDestroy(st));
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (int T : {256, 4096, 32768, 131072}) run_case<4, 2>(1, T, sms);
  for (int T : {32768}) run_case<4, 4>(1, T, sms);
  run_case<4, 2>(8, 32768, sms);
  return 0;
}
