// Shared machinery of the standalone kernel drivers (tools/aura_timeline.cu, tools/decode_timeline.cu):
// per-CTA phase time stamps (%globaltimer) recorded by the AURA_PHASE probes of the kernels, their
// per-phase medians, CUDA-graph timings, and a few fill kernels. Include it before the kernel header:
// it defines AURA_PHASE (unless -DAURA_TIMELINE_OFF, which times the kernels as shipped).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <vector>

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

namespace tl {
// Phases 0-7 belong to the first kernel of a decode (CTAs from 0), 8-11 to the second (CTAs from
// kSecond). A stamp is taken by lane 0 of every warp: first = the earliest warp, last = the latest.
constexpr int kMaxCtas = 8192, kPhases = 12, kSecond = 6144;
__device__ unsigned long long first[kMaxCtas][kPhases], last[kMaxCtas][kPhases];
__device__ int sm_of[kMaxCtas];  // the SM a CTA ran on (recorded with its first phase)
__device__ __forceinline__ void stamp(int phase) {
  if ((threadIdx.x & 31) != 0) return;
  const int cta = (phase >= 8 ? kSecond : 0) + blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (cta >= kMaxCtas) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (phase == 0 || phase == 8) {
    int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    sm_of[cta] = sm;
  }
  atomicMin(&first[cta][phase], t);
  atomicMax(&last[cta][phase], t);
}

inline void reset() {
  std::vector<unsigned long long> lo(size_t(kMaxCtas) * kPhases, ~0ull), hi(lo.size(), 0ull);
  CK(cudaMemcpyToSymbol(first, lo.data(), lo.size() * 8));
  CK(cudaMemcpyToSymbol(last, hi.data(), hi.size() * 8));
}

// The stamps of the last run, copied back: microseconds from the first kernel's earliest start
// (phase 0 over its n1 CTAs), per CTA and phase; a CTA that never reached a phase has no stamp.
struct Stamps {
  std::vector<unsigned long long> lo, hi;  // first[][] and last[][]
  std::vector<int> sm;
  unsigned long long t0 = ~0ull;
  explicit Stamps(int n1) : lo(size_t(kMaxCtas) * kPhases), hi(lo.size()), sm(kMaxCtas) {
    CK(cudaMemcpyFromSymbol(lo.data(), first, lo.size() * 8));
    CK(cudaMemcpyFromSymbol(hi.data(), last, hi.size() * 8));
    CK(cudaMemcpyFromSymbol(sm.data(), sm_of, sm.size() * 4));
    for (int c = 0; c < n1; ++c) t0 = std::min(t0, lo[size_t(c) * kPhases]);
  }
  bool reached(int cta, int ph) const { return hi[size_t(cta) * kPhases + ph] != 0; }
  // the earliest warp's stamp, or the latest's (`late`)
  double us(int cta, int ph, bool late) const {
    const size_t k = size_t(cta) * kPhases + ph;
    return double((long long)((late ? hi[k] : lo[k]) - t0)) * 1e-3;
  }
};

// Prints " phase:us" for each phase: the median over the CTAs that reached it, in microseconds from
// the first CTA's start (phase 0) of the first kernel. Phases listed in `use_last` report the latest
// warp of each CTA (a loop's end, an exit), the others the earliest (after a barrier they agree).
inline void print_phases(int n1, int n2, std::initializer_list<int> phases, std::initializer_list<int> use_last) {
  const Stamps st(n1);
  for (int ph : phases) {
    const int base = ph >= 8 ? kSecond : 0, n = ph >= 8 ? n2 : n1;
    const bool late = std::find(use_last.begin(), use_last.end(), ph) != use_last.end();
    std::vector<double> a;
    for (int c = base; c < base + n; ++c)
      if (st.reached(c, ph)) a.push_back(st.us(c, ph, late));
    if (a.empty()) continue;
    std::sort(a.begin(), a.end());
    std::printf(" %d:%.2f", ph, a[a.size() / 2]);
  }
}

// The spread of one phase over the first kernel's n1 CTAs (latest warp of each): percentiles in us
// from the first CTA's start, and the median per number of that kernel's CTAs sharing the SM.
inline void print_spread(int n1, int ph) {
  const Stamps st(n1);
  std::vector<int> per_sm(1024, 0);
  for (int c = 0; c < n1; ++c)
    if (st.reached(c, ph)) per_sm[st.sm[c] & 1023]++;
  std::vector<double> a;
  std::vector<std::vector<double>> by_share(5);
  for (int c = 0; c < n1; ++c) {
    if (!st.reached(c, ph)) continue;
    const double us = st.us(c, ph, true);
    a.push_back(us);
    by_share[std::min(per_sm[st.sm[c] & 1023], 4)].push_back(us);
  }
  if (a.empty()) return;
  std::sort(a.begin(), a.end());
  auto pct = [&](double q) { return a[std::min(a.size() - 1, size_t(q * a.size()))]; };
  std::printf("   phase %d over %zu CTAs: p0 %.1f p10 %.1f p50 %.1f p90 %.1f max %.1f |", ph, a.size(), a[0], pct(0.1),
              pct(0.5), pct(0.9), a.back());
  for (int k = 1; k <= 4; ++k) {
    auto& v = by_share[k];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    std::printf(" %d/SM: %zu CTAs median %.1f max %.1f;", k, v.size(), v[v.size() / 2], v.back());
  }
  std::printf("\n");
  if (std::getenv("DT_BYSM") != nullptr) {  // the latest CTA of each SM, by SM id (GPCs are runs of ids)
    std::vector<double> sm_end(1024, -1);
    for (int c = 0; c < n1; ++c)
      if (st.reached(c, ph)) sm_end[st.sm[c] & 1023] = std::max(sm_end[st.sm[c] & 1023], st.us(c, ph, true));
    std::printf("   by SM:");
    for (int i = 0; i < 1024; ++i)
      if (sm_end[i] >= 0) std::printf(" %d:%.0f", i, sm_end[i]);
    std::printf("\n   by CTA:");
    for (int c = 0; c < n1; ++c)
      if (st.reached(c, ph)) std::printf(" %.0f", st.us(c, ph, true));
    std::printf("\n");
  }
}

// Median microseconds per body() of CUDA-graph replays (20 bodies per graph, 15 replays).
template <typename F>
float graph_us(cudaStream_t st, F&& body) {
  constexpr int kInner = 20;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kInner; ++i) body();
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int r = 0; r < 15; ++r) {
    CK(cudaEventRecord(e0, st));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms * 1e3f / kInner);
  }
  std::sort(ts.begin(), ts.end());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return ts[ts.size() / 2];
}

// Deterministic fills: hashed words, values in [lo, lo + 1), bf16 values in [-1, 1].
__global__ void fill_words(uint32_t* w, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 0x9E3779B9u ^ seed;
    x ^= x >> 16, x *= 0x85EBCA6Bu, x ^= x >> 13, x *= 0xC2B2AE35u, x ^= x >> 16;
    w[i] = x;
  }
}
__global__ void fill_floats(float* x, size_t n, float lo) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = lo + float((i * 2654435761u) % 1000) * 1e-3f;
}
__global__ void fill_bf16(__nv_bfloat16* q, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    q[i] = __float2bfloat16(float(int((i * 2654435761u) % 2001) - 1000) * 1e-3f);
}
__global__ void empty_kernel() {}
}  // namespace tl

#ifndef AURA_TIMELINE_OFF
#define AURA_PHASE(i) tl::stamp(i)
#endif
