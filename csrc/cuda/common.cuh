// Shared helpers of torch_aura's CUDA kernels: dtype conversion, 16-byte vector loads, cp.async,
// warp reductions, and host-side checks against the LibTorch stable ABI. Header-only so each
// kernel family's .cu stays one translation unit (and `nvcc -c` checks it alone in CI).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "../generated/limits.h"  // the head dims and bit widths (torch_aura/_limits.py)

// Phase probes of the decode kernels: tools/timeline_probe.cuh defines AURA_PHASE to record a time
// stamp per CTA and phase (tools/aura_timeline.cu, tools/decode_timeline.cu); compiled out elsewhere.
#ifndef AURA_PHASE
#define AURA_PHASE(i)
#endif

namespace aura {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// ------------------------------------------------------------------------------------ device side
template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Unpack N consecutive elements of T, held in the 32-bit words `w`, to fp32.
template <typename T, int N>
__device__ __forceinline__ void words_to_float(const uint32_t* w, float* out) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = __uint_as_float(w[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      float2 f;
      if constexpr (std::is_same_v<T, __half>) {
        f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      } else {
        f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
      }
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
}

// 16 bytes of T (8 half/bf16 or 4 float) from 16-byte aligned shared memory, as fp32.
template <typename T>
__device__ __forceinline__ void load16_float(const T* p, float* out) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  words_to_float<T, 16 / sizeof(T)>(w, out);
}

// 4 consecutive elements of T (8 or 16 bytes, aligned to that size) as fp32.
template <typename T>
__device__ __forceinline__ void load4_float(const T* p, float* out) {
  if constexpr (sizeof(T) == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const uint32_t w[2] = {raw.x, raw.y};
    words_to_float<T, 4>(w, out);
  }
}

// cp.async global -> shared (16 bytes: .cg, bypassing L1; 4 and 8: .ca, for rows that are no 16-byte
// multiple). With `valid` false the bytes are zero-filled and nothing is read: tails never touch memory.
template <int BYTES>
__device__ __forceinline__ void cp_async(unsigned dst, const void* gmem, bool valid) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async moves 4, 8 or 16 bytes");
  const int src_bytes = valid ? BYTES : 0;
  if constexpr (BYTES == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(gmem), "n"(BYTES),
                 "r"(src_bytes));
  }
}
template <int BYTES>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem, bool valid) {
  cp_async<BYTES>(static_cast<unsigned>(__cvta_generic_to_shared(smem)), gmem, valid);
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) { cp_async<16>(smem, gmem, valid); }

// a * b as a 64-bit product of two 32-bit ints: one wide multiply-add (IMAD.WIDE), never the 64 x 64
// multiply a promoted operand can turn into.
__device__ __forceinline__ int64_t mul_wide(int a, int b) {
  int64_t r;
  asm("mul.wide.s32 %0, %1, %2;" : "=l"(r) : "r"(a), "r"(b));
  return r;
}

// An opaque copy of x: the compiler can no longer re-derive the value from its inputs (under
// register pressure it rematerialises cheap-looking expressions, even 64-bit address arithmetic,
// at every use), so a value computed once stays in a register.
template <typename T>
__device__ __forceinline__ T pin(T x) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "pin: a 32- or 64-bit value");
  if constexpr (sizeof(T) == 8) {
    uint64_t v = reinterpret_cast<uint64_t&>(x);
    asm volatile("" : "+l"(v));
    return reinterpret_cast<T&>(v);
  } else {
    uint32_t v = reinterpret_cast<uint32_t&>(x);
    asm volatile("" : "+r"(v));
    return reinterpret_cast<T&>(v);
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__host__ __device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }

// -------------------------------------------------------------------------------------- host side
// Errors name the argument, what was expected and what was given (ops.md); RuntimeError in Python.
// std::to_string, never iostreams: under a private static libstdc++ std::ostringstream crashed
// formatting an integer (uninitialised locale), turning a clear error into a segfault.
namespace detail {
inline void append(std::string& s, const char* x) { s += x; }
inline void append(std::string& s, const std::string& x) { s += x; }
template <typename T, std::enable_if_t<std::is_arithmetic_v<T>, int> = 0>
inline void append(std::string& s, T x) { s += std::to_string(x); }
template <typename... Args>
[[noreturn]] inline void fail(const char* where, const Args&... args) {
  std::string msg;
  (append(msg, args), ...);
  msg += " (";
  msg += where;
  msg += ")";
  throw std::runtime_error(msg);
}
}  // namespace detail

#define AURA_STRINGIFY_(x) #x
#define AURA_STRINGIFY(x) AURA_STRINGIFY_(x)
#define AURA_CHECK(cond, ...) \
  do {                        \
    if (!(cond)) ::aura::detail::fail(__FILE__ ":" AURA_STRINGIFY(__LINE__), __VA_ARGS__); \
  } while (0)

// Call f(std::integral_constant<int, V>) for the run-time value v among the compile-time Vs (the
// instantiated head dims or bit widths, e.g. AURA_LIMITS_DECODE_HEAD_DIMS); `what` names v on a miss.
template <int V, int... Rest, typename F>
void with_one_of(int64_t v, const char* what, const char* listed, F&& f) {
  if (v == V) return f(std::integral_constant<int, V>{});
  if constexpr (sizeof...(Rest) > 0) {
    return with_one_of<Rest...>(v, what, listed, f);
  } else {
    detail::fail(__FILE__, what, ": expected one of ", listed, ", got ", v);
  }
}

inline std::string dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Float: return "float32";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    default: return "dtype #" + std::to_string(static_cast<int>(t));
  }
}

inline void check_cuda_tensor(const Tensor& t, const char* name, int64_t ndim) {
  AURA_CHECK(t.is_cuda(), name, ": expected a CUDA tensor");
  AURA_CHECK(t.dim() == ndim, name, ": expected a ", ndim, "-D tensor, got ", t.dim(), "-D");
  AURA_CHECK(t.numel() == 0 || t.size(ndim - 1) <= 1 || t.stride(ndim - 1) == 1, name,
             ": expected a unit stride in the last dim, got ", t.stride(ndim - 1));
}

inline void check_dtype(const Tensor& t, const char* name, ScalarType expected) {
  AURA_CHECK(t.scalar_type() == expected, name, ": expected dtype ", dtype_name(expected), ", got ",
             dtype_name(t.scalar_type()));
}

// The largest vector (16, 8 or 4 bytes) that moves every row of t: base, row size and leading strides are
// multiples of it (views that allow none are rejected, never read misaligned: decode.md §3).
inline int row_vector_bytes(const Tensor& t) {
  const int64_t nd = t.dim(), elem = int64_t(t.element_size());
  const auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  for (int v : {16, 8}) {
    bool ok = addr % v == 0 && (t.size(nd - 1) * elem) % v == 0;
    for (int64_t d = 0; d + 1 < nd; ++d) ok = ok && (t.size(d) <= 1 || (t.stride(d) * elem) % v == 0);
    if (ok) return v;
  }
  return 4;
}

inline void check_vector_aligned(const Tensor& t, const char* name) {
  const auto addr = reinterpret_cast<uintptr_t>(t.data_ptr());
  AURA_CHECK(addr % 16 == 0, name, ": expected a 16-byte aligned data pointer (16-byte vector loads), got ",
             "an address = ", addr % 16, " mod 16");
  const int64_t elt = static_cast<int64_t>(t.element_size());
  for (int64_t i = 0; i + 1 < t.dim(); ++i)
    AURA_CHECK(t.size(i) <= 1 || (t.stride(i) * elt) % 16 == 0, name, ": expected 16-byte multiples for ",
               "every stride but the last, got stride[", i, "] = ", t.stride(i), " elements of ", elt, " bytes");
}

inline cudaStream_t current_stream(const Tensor& t) {
  void* stream = nullptr;
  // Plain return-code check: the CHECK macro's name changed between torch 2.11 and 2.13 headers.
  AURA_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream) == AOTI_TORCH_SUCCESS,
             "aoti_torch_get_current_cuda_stream failed");
  return static_cast<cudaStream_t>(stream);
}

inline int sm_count(int device) {
  // Cached per device: the split plan must never cost a driver round trip per call.
  static int cache[64] = {0};
  if (device < 64 && cache[device] > 0) return cache[device];
  int sms = 0;
  AURA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess,
             "cudaDeviceGetAttribute(MultiProcessorCount) failed");
  if (device < 64) cache[device] = sms;
  return sms;
}

// The wave-efficiency split count (FlashAttention's num_splits_heuristic: the smallest S within 85%
// of the best last-wave fill), from static values only: AURA's exact kernel. The dense decode plans
// one wave instead (decode_auto_splits, decode.md §4).
inline int auto_splits(int64_t batch, int64_t kv_heads, int sms, int ctas_per_sm, int max_splits = 128) {
  const double slots = double(sms) * ctas_per_sm, work = double(batch) * kv_heads;
  if (work == 0 || work >= 0.8 * slots) return 1;
  auto eff = [&](int s) {
    const double waves = work * s / slots;
    return waves / std::ceil(waves);
  };
  double best = 0;
  for (int s = 1; s <= max_splits; ++s) best = std::max(best, eff(s));
  for (int s = 1; s <= max_splits; ++s)
    if (eff(s) >= 0.85 * best) return s;
  return 1;
}

// Set a kernel attribute once per (kernel, attribute, device): not stream work, so legal during graph
// capture, and later launches make no driver call for it.
template <auto Kernel, cudaFuncAttribute Attr>
void set_kernel_attribute_once(int value, const char* what) {
  static bool done[64] = {};
  int device = 0;
  cudaGetDevice(&device);
  if (device < 64 && done[device]) return;
  AURA_CHECK(cudaFuncSetAttribute(Kernel, Attr, value) == cudaSuccess, what, ": cudaFuncSetAttribute failed");
  if (device < 64) done[device] = true;
}

// Launch `kernel` on `stream`; with `dependent`, as a programmatic dependent of the previous kernel
// on the stream (it starts while that one drains and must call grid_dependency_wait() before
// reading its results; the previous kernel calls grid_dependents_launch() when it may). Captured
// into CUDA graphs as a programmatic edge.
template <typename... Params>
cudaError_t launch_after(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                         bool dependent, const Params&... p) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = dependent ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, p...);
}

// Page and row-in-page of token t: a shift and a mask for power-of-two page sizes (page_shift >= 0,
// from the host), a division otherwise.
__device__ __forceinline__ void page_of(int t, int page_size, int page_shift, int& page, int& row) {
  if (page_shift >= 0) {
    page = t >> page_shift, row = t & (page_size - 1);
  } else {
    page = t / page_size, row = t % page_size;
  }
}

inline int page_shift_of(int64_t page_size) {  // log2(page_size) for powers of two, else -1
  for (int s = 0; s < 31; ++s)
    if ((int64_t(1) << s) == page_size) return s;
  return -1;
}

inline void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  AURA_CHECK(err == cudaSuccess, what, ": CUDA launch failed: ", cudaGetErrorString(err));
}

}  // namespace aura

namespace aura {
// ------------------------------------------------------------------ tensor-core building blocks
// ldmatrix: 8x8 tiles of 16-bit values from shared memory, one 16-byte row address per lane
// (lanes 0-7 tile 0, 8-15 tile 1, ...). Register i of lane l then holds tile i's (row l/4,
// cols 2(l%4), 2(l%4)+1), or with .trans the transposed pair (rows 2(l%4), 2(l%4)+1, col l/4).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// Transpose an 8x8 matrix of 16-bit values held as in ldmatrix (lane l: row l/4, cols 2(l%4)+{0,1})
// in registers: lane l then holds row l/4 of the transpose. Turns an MMA accumulator (packed to
// 16 bits) into the B operand of the next MMA without a trip through shared memory.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// ------------------------------------------------ bulk copies (sm_90 TMA engine, no tensor map)
// cp.async.bulk moves a contiguous run of bytes global -> shared and reports completion as
// transaction bytes on an mbarrier: one instruction per row instead of one cp.async per 16 bytes.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes mbarrier inits visible to the async proxy (the bulk copies that complete on them).
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// One arrival that also announces `bytes` more transaction bytes for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Spin until the phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, unsigned bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
// One box of a 4-D tensor map (coordinates innermost first) into shared memory, completing on `bar`.
__device__ __forceinline__ void tensor_copy_g2s_4d(void* smem, const void* tmap, int c0, int c1, int c2, int c3,
                                                   uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_addr(smem)),
      "l"(tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
}
// Orders this thread's earlier generic-proxy shared-memory accesses (ldmatrix reads of a ring slot)
// before later async-proxy writes to the same bytes (the bulk copy refilling that slot).
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx: 2 ulp, exp2(-inf) = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Programmatic dependent launch (sm_90): the primary grid lets its dependent start launching, and
// the dependent waits for the primary's completion and memory before touching its outputs.
__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// D (16x8 fp32) += A (16x16, row-major) * B (16x8, "col": stored as 8 rows of 16 k-values).
// Fragments (PTX ISA, mma.m16n8k16): a0/a1 rows l/4 and l/4+8, cols 2(l%4)+{0,1}; a2/a3 the same
// rows, cols + 8; b0 k = 2(l%4)+{0,1}, n = l/4, b1 k + 8; d0/d1 row l/4, d2/d3 row l/4+8, cols
// 2(l%4)+{0,1}.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two fp32 values as one 16-bit pair register (lo in the low half: the lower column / k index).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// One online-softmax step of the warp-split kernels on an S^T tile [16 tokens x 8 columns] in the mma
// accumulator layout (x[0..1]: token lane/4, x[2..3]: token lane/4 + 8; log2 units, -inf masked). True
// where a running max grew on this lane: the caller rescales O only if any lane's did.
__device__ __forceinline__ bool online_softmax_tile(const float (&x)[4], float (&m_run)[2], float (&l_run)[2],
                                                    float (&pr)[4], float (&alpha)[2]) {
  bool grew = false;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    float mx = fmaxf(x[e], x[e + 2]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float m_new = fmaxf(m_run[e], mx);
    grew |= m_new > m_run[e];
    // m_new = -inf only if every logit so far is -inf: keep the (zero) state, never NaN;
    // exp2(-inf) = 0 covers the first step (m_old = -inf) and masked logits
    alpha[e] = m_new == -INFINITY ? 1.f : fast_exp2(m_run[e] - m_new);
    pr[e] = m_new == -INFINITY ? 0.f : fast_exp2(x[e] - m_new);
    pr[e + 2] = m_new == -INFINITY ? 0.f : fast_exp2(x[e + 2] - m_new);
    l_run[e] = l_run[e] * alpha[e] + pr[e] + pr[e + 2];
    m_run[e] = m_new;
  }
  return grew;
}
// Whether the n (<= 32) 4-byte words word_of(0), ..., word_of(n - 1) of one shared-memory access sit on
// n distinct banks (no conflict). Evaluated at compile time by the merge-buffer layout checks.
template <typename F>
constexpr bool distinct_banks(int n, F word_of) {
  unsigned banks = 0;
  for (int i = 0; i < n; ++i) {
    const unsigned bit = 1u << (word_of(i) % 32);
    if (banks & bit) return false;
    banks |= bit;
  }
  return true;
}

// The end-of-block merge of W warps' states for R rows (decode.md §5), through shared [W][R] m (log2), l
// and weights: weigh() once after the warps wrote m and l, row_sum / weight after another barrier. A
// warp that saw no token gets weight 0, never exp2(-inf - -inf).
template <int W, int R>
struct WarpStates {
  float* m;  // [W][R]
  float* l;
  float* w;
  __device__ __forceinline__ float row_max(int r) const {
    float M = -INFINITY;
#pragma unroll
    for (int wi = 0; wi < W; ++wi) M = fmaxf(M, m[wi * R + r]);
    return M;
  }
  __device__ __forceinline__ void weigh() const {
    if (threadIdx.x < W * R) {
      const float mi = m[threadIdx.x];
      w[threadIdx.x] = mi == -INFINITY ? 0.f : exp2f(mi - row_max(threadIdx.x % R));
    }
  }
  __device__ __forceinline__ float weight(int wi, int r) const { return w[wi * R + r]; }
  __device__ __forceinline__ float row_sum(int r) const {  // the merged l of row r
    float L = 0.f;
#pragma unroll
    for (int wi = 0; wi < W; ++wi) L += w[wi * R + r] * l[wi * R + r];
    return L;
  }
};

}  // namespace aura
