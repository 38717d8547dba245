// aura_compat.h: the few constructs that must read differently on Apple's compiler, in the
// emulator and in the lint build (docs/metal.md §5). Every shader includes it first.
#pragma once

#ifdef __METAL_VERSION__
#include <metal_stdlib>
#endif
using namespace metal;

// Threadgroup arrays. Metal: `threadgroup T name[n]`. Emulator: a thread-local static array (a
// group's fibers share one OS thread), registered so the scheduler NaN-poisons it for each new
// threadgroup and counts it against the 32 KiB limit. Lint: a static array in address space 3.
#if defined(__METAL_VERSION__)
#define AURA_TG(T, name, n) threadgroup T name[n]
#elif defined(AURA_METAL_LINT)
#define AURA_TG(T, name, n) static threadgroup T name[n]
#else
#define AURA_TG(T, name, n)              \
  static thread_local T name[n];         \
  ::aura_emu::threadgroup_array(name, sizeof(name), __FILE__, __LINE__)
#endif

// Explicit instantiation under a host name (`<op>_<dtype>_<dim>`). Metal: MLX's
// `template [[host_name(..)]] [[kernel]] decltype(f<..>) f<..>;`. Emulator: a registrar calling
// the specialisation with no arguments (the binding attributes supply them). Lint: taking the
// address instantiates the body, so it is checked.
#define AURA_CAT2(a, b) a##b
#define AURA_CAT(a, b) AURA_CAT2(a, b)
#if defined(__METAL_VERSION__)
#define AURA_INSTANTIATE(name, fn, ...) \
  template [[host_name(name)]] [[kernel]] decltype(fn<__VA_ARGS__>) fn<__VA_ARGS__>;
#elif defined(AURA_METAL_LINT)
#define AURA_INSTANTIATE(name, fn, ...) \
  [[maybe_unused]] static auto AURA_CAT(aura_lint_, __COUNTER__) = &fn<__VA_ARGS__>;
#else
#define AURA_INSTANTIATE(name, fn, ...) \
  static ::aura_emu::Registrar AURA_CAT(aura_kernel_, __COUNTER__)(name, [] { fn<__VA_ARGS__>(); });
#endif

// A non-template kernel: Metal finds it by its function name, the emulator by registration.
#if defined(__METAL_VERSION__) || defined(AURA_METAL_LINT)
#define AURA_REGISTER(fn)
#else
#define AURA_REGISTER(fn) static ::aura_emu::Registrar AURA_CAT(aura_kernel_, __COUNTER__)(#fn, [] { fn(); });
#endif

// Element types by dtype name, for instantiation lists.
#define AURA_FOR_FLOAT_TYPES(X, ...) X(float, f32, __VA_ARGS__) X(half, f16, __VA_ARGS__) X(bfloat, bf16, __VA_ARGS__)
