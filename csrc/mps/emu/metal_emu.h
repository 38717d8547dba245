// metal_emu.h: the Metal Shading Language environment for clang C++ (docs/metal.md §3, §4).
//
// Force-included (`clang++ -x c++ -include metal_emu.h`) in front of an unmodified `.metal` file.
// Two modes:
//
// * emulation (default): address-space keywords expand to nothing, every kernel parameter's
//   binding attribute becomes a default argument that fetches its buffer or builtin index from the
//   current dispatch, and the SIMD / threadgroup functions talk to the fiber scheduler of
//   emu_runtime.cpp. Kernels then run on CPU threads-as-fibers.
// * lint (`-DAURA_METAL_LINT -fsyntax-only`): `device`, `constant`, `threadgroup` become real clang
//   address spaces, so passing a `device float*` where a `thread float*` is expected is rejected as
//   Apple's compiler rejects it; binding attributes stay attributes (silenced as unknown).
//
// Only clang builds this (g++ ignores ext_vector_type). No libc math header is included on
// purpose: `using namespace metal;` in a shader must not meet a second, global `exp` or `abs`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#ifndef __clang__
#error "metal_emu.h needs clang (ext_vector_type, __bf16, address_space); g++ cannot build it"
#endif

// ------------------------------------------------------------------------- address spaces
#ifdef AURA_METAL_LINT
#define device __attribute__((address_space(1)))
#define constant const __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#else
#define device
#define constant const
#define threadgroup
#endif
#define thread
#define kernel

// ------------------------------------------------------------------------------ scalar types
using half = _Float16;
using bfloat = __bf16;
using uint = unsigned int;
using ushort = unsigned short;
using uchar = unsigned char;
using ulong = unsigned long;

template <class T, int N>
using vec = T __attribute__((ext_vector_type(N)));

#define AURA_EMU_VECTORS(T)                              \
  typedef T T##2 __attribute__((ext_vector_type(2)));   \
  typedef T T##3 __attribute__((ext_vector_type(3)));   \
  typedef T T##4 __attribute__((ext_vector_type(4)));
AURA_EMU_VECTORS(float)
AURA_EMU_VECTORS(half)
AURA_EMU_VECTORS(bfloat)
AURA_EMU_VECTORS(int)
AURA_EMU_VECTORS(uint)
AURA_EMU_VECTORS(short)
AURA_EMU_VECTORS(ushort)
AURA_EMU_VECTORS(char)
AURA_EMU_VECTORS(uchar)
AURA_EMU_VECTORS(ulong)
#undef AURA_EMU_VECTORS

// packed_floatN: no padding (float3 is 16 bytes, packed_float3 is 12).
template <class T, int N>
struct aura_emu_packed {
  T v[N];
  T& operator[](int i) { return v[i]; }
  const T& operator[](int i) const { return v[i]; }
};
using packed_float2 = aura_emu_packed<float, 2>;
using packed_float3 = aura_emu_packed<float, 3>;
using packed_float4 = aura_emu_packed<float, 4>;
using packed_half2 = aura_emu_packed<half, 2>;
using packed_half4 = aura_emu_packed<half, 4>;
static_assert(sizeof(float3) == 16 && sizeof(packed_float3) == 12, "MSL vector sizes");

#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#define MAXFLOAT 3.40282347e+38f
#define FLT_MAX 3.40282347e+38f
#define M_LN2_F 0.693147180559945309f
#define M_LOG2E_F 1.44269504088896341f

// ------------------------------------------------------------------------- runtime interface
#include "emu_interface.h"

namespace aura_emu {

template <class T>
struct vec_info {
  static constexpr int n = 1;
  using elem = T;
};
template <class E, int N>
struct vec_info<E __attribute__((ext_vector_type(N)))> {
  static constexpr int n = N;
  using elem = E;
};

// Binding proxies: see the attribute trick below. Conversion picks the parameter's type.
template <int Slot>
struct buffer_binding {
  template <class T>
  operator T*() const { return static_cast<T*>(buffer_address(Slot)); }
  template <class T>
  operator T&() const { return *static_cast<T*>(buffer_address(Slot)); }
};
template <int Which>
struct builtin_binding {
  template <class T>
  operator T() const {
    Idx3 v = builtin_index(Which);
    using E = typename vec_info<T>::elem;
    if constexpr (vec_info<T>::n == 1) return T(v.x);
    else if constexpr (vec_info<T>::n == 2) return T{E(v.x), E(v.y)};
    else return T{E(v.x), E(v.y), E(v.z)};
  }
};
template <int Slot>
struct arg_slot {
  buffer_binding<Slot> operator[](int) const { return {}; }
};
template <int Which>
struct builtin_slot {
  builtin_binding<Which> operator[](int) const { return {}; }
};
inline constexpr int no_attr[1] = {0};

}  // namespace aura_emu

// --------------------------------------------------------- binding attributes (emulation only)
// `device float* y [[buffer(0)]]` becomes
// `device float* y [[maybe_unused]] = ::aura_emu::arg_slot<0>{}[::aura_emu::no_attr[0]]`: every
// kernel turns into a function callable with no arguments. Every kernel parameter must carry one.
#ifndef AURA_METAL_LINT
#define AURA_EMU_BUILTIN(which) maybe_unused]] = ::aura_emu::builtin_slot<::aura_emu::which>{}[::aura_emu::no_attr[0
#define buffer(i) maybe_unused]] = ::aura_emu::arg_slot<(i)>{}[::aura_emu::no_attr[0
#define thread_position_in_grid AURA_EMU_BUILTIN(kTidInGrid)
#define thread_position_in_threadgroup AURA_EMU_BUILTIN(kTidInGroup)
#define threadgroup_position_in_grid AURA_EMU_BUILTIN(kGroupInGrid)
#define threads_per_threadgroup AURA_EMU_BUILTIN(kThreadsPerGroup)
#define threadgroups_per_grid AURA_EMU_BUILTIN(kGroupsPerGrid)
#define threads_per_grid AURA_EMU_BUILTIN(kThreadsPerGrid)
#define thread_index_in_threadgroup AURA_EMU_BUILTIN(kIndexInGroup)
#define thread_index_in_simdgroup AURA_EMU_BUILTIN(kLaneInSimd)
#define simdgroup_index_in_threadgroup AURA_EMU_BUILTIN(kSimdInGroup)
#define threads_per_simdgroup AURA_EMU_BUILTIN(kThreadsPerSimd)
#define simdgroups_per_threadgroup AURA_EMU_BUILTIN(kSimdsPerGroup)
#endif

// ------------------------------------------------------------------------------ the library
namespace metal {

// ---- math: scalars in float (half / bfloat go through float, as the GPU's fp32 ALUs do)
#define AURA_EMU_UNARY(name, builtin)                                    \
  inline float name(float x) { return builtin(x); }                     \
  inline half name(half x) { return half(builtin(float(x))); }          \
  inline bfloat name(bfloat x) { return bfloat(builtin(float(x))); }
#define AURA_EMU_MATH_SET                            \
  AURA_EMU_UNARY(exp, __builtin_expf)               \
  AURA_EMU_UNARY(exp2, __builtin_exp2f)             \
  AURA_EMU_UNARY(log, __builtin_logf)               \
  AURA_EMU_UNARY(log2, __builtin_log2f)             \
  AURA_EMU_UNARY(sqrt, __builtin_sqrtf)             \
  AURA_EMU_UNARY(tanh, __builtin_tanhf)             \
  AURA_EMU_UNARY(floor, __builtin_floorf)           \
  AURA_EMU_UNARY(ceil, __builtin_ceilf)             \
  AURA_EMU_UNARY(fabs, __builtin_fabsf)             \
  inline float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); } \
  inline float divide(float a, float b) { return a / b; }
AURA_EMU_MATH_SET
namespace precise { AURA_EMU_MATH_SET }
namespace fast { AURA_EMU_MATH_SET }
#undef AURA_EMU_MATH_SET
#undef AURA_EMU_UNARY

inline float abs(float x) { return __builtin_fabsf(x); }
inline int abs(int x) { return x < 0 ? -x : x; }
inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float pow(float a, float b) { return __builtin_powf(a, b); }
inline float fmax(float a, float b) { return __builtin_fmaxf(a, b); }
inline float fmin(float a, float b) { return __builtin_fminf(a, b); }
// MSL max/min of floats follow fmax/fmin (a NaN operand yields the other one).
inline float max(float a, float b) { return __builtin_fmaxf(a, b); }
inline float min(float a, float b) { return __builtin_fminf(a, b); }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline uint max(uint a, uint b) { return a > b ? a : b; }
inline uint min(uint a, uint b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
template <class T>
inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
template <class T>
inline T select(T a, T b, bool c) { return c ? b : a; }
inline bool isnan(float x) { return __builtin_isnan(x); }
inline bool isinf(float x) { return __builtin_isinf(x); }
inline bool isfinite(float x) { return __builtin_isfinite(x); }
inline uint popcount(uint x) { return uint(__builtin_popcount(x)); }
inline uint ctz(uint x) { return x ? uint(__builtin_ctz(x)) : 32u; }

template <class To, class From>
inline To as_type(From x) {
  static_assert(sizeof(To) == sizeof(From), "as_type: sizes must match");
  return __builtin_bit_cast(To, x);
}

template <class T>
struct numeric_limits;
template <>
struct numeric_limits<float> {
  static constexpr float infinity() { return __builtin_inff(); }
  static constexpr float quiet_NaN() { return __builtin_nanf(""); }
  static constexpr float max() { return 3.40282347e+38f; }
  static constexpr float lowest() { return -3.40282347e+38f; }
  static constexpr float epsilon() { return 1.1920929e-7f; }
};
template <>
struct numeric_limits<half> {
  static constexpr half infinity() { return half(__builtin_inff()); }
  static constexpr half max() { return half(65504.0f); }
  static constexpr half lowest() { return half(-65504.0f); }
};
template <>
struct numeric_limits<int> {
  static constexpr int max() { return 2147483647; }
  static constexpr int lowest() { return -2147483647 - 1; }
};
template <>
struct numeric_limits<uint> {
  static constexpr uint max() { return 4294967295u; }
  static constexpr uint lowest() { return 0u; }
};

template <class T, int N>
struct array {
  T v[N];
  T& operator[](int i) { return v[i]; }
  const T& operator[](int i) const { return v[i]; }
  static constexpr int size() { return N; }
};

// ---- synchronisation
enum class mem_flags : int { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
inline constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

// The call site is a hidden default argument: threads waiting at different barriers abort the run
// with both source lines. With one fiber running at a time every barrier is a full fence.
inline void threadgroup_barrier(mem_flags, const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  ::aura_emu::threadgroup_barrier_at(file, line);
}
inline void simdgroup_barrier(mem_flags, const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  ::aura_emu::simd_rendezvous(nullptr, 0, 0, file, line);
}

// ---- SIMD-group collectives (act on live lanes; reached by all of them or it is an error)
namespace emu_detail {
template <class T>
struct reduce {
  template <class Op>
  static T run(T x, Op op, const char* file, unsigned line) {
    static_assert(sizeof(T) <= ::aura_emu::kMailboxBytes);
    auto r = ::aura_emu::simd_rendezvous(&x, sizeof(T), 0, file, line);
    bool first = true;
    T acc{};
    for (unsigned l = 0; l < ::aura_emu::kSimdWidth; ++l) {  // lane order: fixed, like a tree would not be
      if (!(r.live_mask >> l & 1u)) continue;
      T v = __builtin_bit_cast(T, *reinterpret_cast<const aura_emu_packed<unsigned char, sizeof(T)>*>(
                                      r.lanes + l * ::aura_emu::kMailboxBytes));
      acc = first ? v : op(acc, v);
      first = false;
    }
    return acc;
  }
};
template <class T>
inline T lane_value(const ::aura_emu::Rendezvous& r, unsigned l) {
  return __builtin_bit_cast(T, *reinterpret_cast<const aura_emu_packed<unsigned char, sizeof(T)>*>(
                                   r.lanes + l * ::aura_emu::kMailboxBytes));
}
template <class T>
inline T vmax(T a, T b) {
  if constexpr (::aura_emu::vec_info<T>::n == 1) return max(a, b);
  else return __builtin_elementwise_max(a, b);
}
template <class T>
inline T vmin(T a, T b) {
  if constexpr (::aura_emu::vec_info<T>::n == 1) return min(a, b);
  else return __builtin_elementwise_min(a, b);
}
}  // namespace emu_detail

#define AURA_EMU_SITE const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()
template <class T>
inline T simd_sum(T x, AURA_EMU_SITE) {
  return emu_detail::reduce<T>::run(x, [](T a, T b) { return a + b; }, file, line);
}
template <class T>
inline T simd_product(T x, AURA_EMU_SITE) {
  return emu_detail::reduce<T>::run(x, [](T a, T b) { return a * b; }, file, line);
}
template <class T>
inline T simd_max(T x, AURA_EMU_SITE) {
  return emu_detail::reduce<T>::run(x, [](T a, T b) { return emu_detail::vmax(a, b); }, file, line);
}
template <class T>
inline T simd_min(T x, AURA_EMU_SITE) {
  return emu_detail::reduce<T>::run(x, [](T a, T b) { return emu_detail::vmin(a, b); }, file, line);
}
template <class T>
inline T simd_or(T x, AURA_EMU_SITE) {
  return emu_detail::reduce<T>::run(x, [](T a, T b) { return a | b; }, file, line);
}
template <class T>
inline T simd_and(T x, AURA_EMU_SITE) {
  return emu_detail::reduce<T>::run(x, [](T a, T b) { return a & b; }, file, line);
}
template <class T>
inline T simd_xor(T x, AURA_EMU_SITE) {
  return emu_detail::reduce<T>::run(x, [](T a, T b) { return a ^ b; }, file, line);
}

// Prefix sums over the live lanes below this one (exclusive) or up to it (inclusive).
template <class T>
inline T simd_prefix_exclusive_sum(T x, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(&x, sizeof(T), 0, file, line);
  T acc{};
  for (unsigned l = 0; l < r.lane; ++l)
    if (r.live_mask >> l & 1u) acc = acc + emu_detail::lane_value<T>(r, l);
  return acc;
}
template <class T>
inline T simd_prefix_inclusive_sum(T x, AURA_EMU_SITE) {
  return simd_prefix_exclusive_sum(x, file, line) + x;
}

// Shuffles: the source lane (and delta / mask) must be uniform where MSL says so; the rendezvous
// checks the uniform argument. down/up leave lanes whose source falls off the end unchanged.
template <class T>
inline T simd_shuffle(T x, ushort src, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(&x, sizeof(T), ::aura_emu::kNotUniform, file, line);
  if (src >= ::aura_emu::kSimdWidth || !(r.live_mask >> src & 1u)) ::aura_emu::fail("simd_shuffle from a dead lane", file, line);
  return emu_detail::lane_value<T>(r, src);
}
template <class T>
inline T simd_broadcast(T x, ushort src, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(&x, sizeof(T), src, file, line);
  if (src >= ::aura_emu::kSimdWidth || !(r.live_mask >> src & 1u)) ::aura_emu::fail("simd_broadcast from a dead lane", file, line);
  return emu_detail::lane_value<T>(r, src);
}
template <class T>
inline T simd_broadcast_first(T x, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(&x, sizeof(T), 0, file, line);
  return emu_detail::lane_value<T>(r, unsigned(__builtin_ctz(r.live_mask)));
}
template <class T>
inline T simd_shuffle_down(T x, ushort delta, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(&x, sizeof(T), delta, file, line);
  unsigned src = r.lane + delta;
  return src < ::aura_emu::kSimdWidth && (r.live_mask >> src & 1u) ? emu_detail::lane_value<T>(r, src) : x;
}
template <class T>
inline T simd_shuffle_up(T x, ushort delta, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(&x, sizeof(T), delta, file, line);
  return r.lane >= delta && (r.live_mask >> (r.lane - delta) & 1u) ? emu_detail::lane_value<T>(r, r.lane - delta) : x;
}
template <class T>
inline T simd_shuffle_rotate_down(T x, ushort delta, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(&x, sizeof(T), delta, file, line);
  return emu_detail::lane_value<T>(r, (r.lane + delta) % ::aura_emu::kSimdWidth);
}
template <class T>
inline T simd_shuffle_rotate_up(T x, ushort delta, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(&x, sizeof(T), delta, file, line);
  return emu_detail::lane_value<T>(r, (r.lane + ::aura_emu::kSimdWidth - delta) % ::aura_emu::kSimdWidth);
}
template <class T>
inline T simd_shuffle_xor(T x, ushort mask, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(&x, sizeof(T), mask, file, line);
  unsigned src = (r.lane ^ mask) % ::aura_emu::kSimdWidth;
  return (r.live_mask >> src & 1u) ? emu_detail::lane_value<T>(r, src) : x;
}
struct simd_vote {
  ulong v;
  explicit operator ulong() const { return v; }
  bool any() const { return v != 0; }
};
inline simd_vote simd_ballot(bool pred, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(&pred, sizeof(bool), 0, file, line);
  ulong bits = 0;
  for (unsigned l = 0; l < ::aura_emu::kSimdWidth; ++l)
    if ((r.live_mask >> l & 1u) && emu_detail::lane_value<bool>(r, l)) bits |= 1ul << l;
  return simd_vote{bits};
}
inline bool simd_all(bool pred, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(&pred, sizeof(bool), 0, file, line);
  for (unsigned l = 0; l < ::aura_emu::kSimdWidth; ++l)
    if ((r.live_mask >> l & 1u) && !emu_detail::lane_value<bool>(r, l)) return false;
  return true;
}
inline bool simd_any(bool pred, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(&pred, sizeof(bool), 0, file, line);
  for (unsigned l = 0; l < ::aura_emu::kSimdWidth; ++l)
    if ((r.live_mask >> l & 1u) && emu_detail::lane_value<bool>(r, l)) return true;
  return false;
}

// ---- simdgroup_matrix<T, Cols, Rows>: 8x8 only, distributed over the 32 lanes.
// Lane layout of ml-explore/mlx steel/gemm/mma.h (BaseMMAFrag), docs/metal.md §3: a lane's two
// elements share a row and sit in adjacent columns.
inline constexpr unsigned simdgroup_row(unsigned lane) { return 4 * (lane / 16) + (lane / 2) % 4; }
inline constexpr unsigned simdgroup_col(unsigned lane, unsigned e) { return 4 * ((lane / 8) % 2) + 2 * (lane % 2) + e; }

template <class T, int Cols, int Rows>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "the emulator models 8x8 simdgroup matrices only");
  vec<T, 2> elems;
  simdgroup_matrix() : elems{T(0), T(0)} {}
  // The scalar constructor builds a diagonal matrix (MSL semantics), not a filled one.
  explicit simdgroup_matrix(T diag) {
    unsigned lane = ::aura_emu::builtin_index(::aura_emu::kLaneInSimd).x;
    unsigned r = simdgroup_row(lane);
    elems = vec<T, 2>{simdgroup_col(lane, 0) == r ? diag : T(0), simdgroup_col(lane, 1) == r ? diag : T(0)};
  }
  thread vec<T, 2>& thread_elements() { return elems; }
  const thread vec<T, 2>& thread_elements() const { return elems; }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int C, int R>
inline simdgroup_matrix<T, C, R> make_filled_simdgroup_matrix(T v) {
  simdgroup_matrix<T, C, R> m;
  m.elems = vec<T, 2>{v, v};
  return m;
}

// load/store: every lane of the SIMD group takes part (a rendezvous enforces uniform flow), then
// moves its own two cells. matrix_origin is (column, row); transpose reads element (r, c) from
// src[(origin.y + c) * elements_per_row + origin.x + r].
template <class T, int C, int R, class P>
inline void simdgroup_load(thread simdgroup_matrix<T, C, R>& m, P src, ulong elements_per_row = 8,
                           ulong2 matrix_origin = ulong2{0, 0}, bool transpose_matrix = false, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(nullptr, 0, long(elements_per_row), file, line);
  unsigned row = simdgroup_row(r.lane);
  for (unsigned e = 0; e < 2; ++e) {
    unsigned col = simdgroup_col(r.lane, e);
    ulong i = transpose_matrix ? (matrix_origin.y + col) * elements_per_row + matrix_origin.x + row
                               : (matrix_origin.y + row) * elements_per_row + matrix_origin.x + col;
    m.elems[e] = T(src[i]);
  }
}
template <class T, int C, int R, class P>
inline void simdgroup_store(const thread simdgroup_matrix<T, C, R>& m, P dst, ulong elements_per_row = 8,
                            ulong2 matrix_origin = ulong2{0, 0}, bool transpose_matrix = false, AURA_EMU_SITE) {
  auto r = ::aura_emu::simd_rendezvous(nullptr, 0, long(elements_per_row), file, line);
  using Dst = std::remove_cvref_t<decltype(dst[0])>;
  unsigned row = simdgroup_row(r.lane);
  for (unsigned e = 0; e < 2; ++e) {
    unsigned col = simdgroup_col(r.lane, e);
    ulong i = transpose_matrix ? (matrix_origin.y + col) * elements_per_row + matrix_origin.x + row
                               : (matrix_origin.y + row) * elements_per_row + matrix_origin.x + col;
    dst[i] = Dst(m.elems[e]);
  }
}

// d = a * b + c, a collective of all 32 lanes: each lane deposits its cells of a, b and c (as
// float), the full matrices are rebuilt from the lane layout, and each lane computes its two
// cells of d in fp32 with a fixed k order.
template <class TD, class TA, class TB, class TC>
inline void simdgroup_multiply_accumulate(thread simdgroup_matrix<TD, 8, 8>& d, const thread simdgroup_matrix<TA, 8, 8>& a,
                                          const thread simdgroup_matrix<TB, 8, 8>& b, const thread simdgroup_matrix<TC, 8, 8>& c,
                                          AURA_EMU_SITE) {
  float mine[6] = {float(a.elems[0]), float(a.elems[1]), float(b.elems[0]), float(b.elems[1]),
                   float(c.elems[0]), float(c.elems[1])};
  auto r = ::aura_emu::simd_rendezvous(mine, sizeof(mine), 0, file, line);
  if (r.live_mask != 0xFFFFFFFFu) ::aura_emu::fail("simdgroup_multiply_accumulate needs all 32 lanes live", file, line);
  float A[8][8], B[8][8], Cm[8][8];
  for (unsigned l = 0; l < 32; ++l) {
    const float* v = reinterpret_cast<const float*>(r.lanes + l * ::aura_emu::kMailboxBytes);
    for (unsigned e = 0; e < 2; ++e) {
      unsigned row = simdgroup_row(l), col = simdgroup_col(l, e);
      A[row][col] = v[e];
      B[row][col] = v[2 + e];
      Cm[row][col] = v[4 + e];
    }
  }
  unsigned row = simdgroup_row(r.lane);
  for (unsigned e = 0; e < 2; ++e) {
    unsigned col = simdgroup_col(r.lane, e);
    float acc = 0.0f;
    for (unsigned k = 0; k < 8; ++k) acc += A[row][k] * B[k][col];
    d.elems[e] = TD(acc + Cm[row][col]);
  }
}
template <class TD, class TA, class TB>
inline void simdgroup_multiply(thread simdgroup_matrix<TD, 8, 8>& d, const thread simdgroup_matrix<TA, 8, 8>& a,
                               const thread simdgroup_matrix<TB, 8, 8>& b, AURA_EMU_SITE) {
  simdgroup_matrix<TD, 8, 8> zero;
  simdgroup_multiply_accumulate(d, a, b, zero, file, line);
}
#undef AURA_EMU_SITE

}  // namespace metal
