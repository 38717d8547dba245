// Generated from torch_aura/_limits.py by `python -m torch_aura._limits`: do not edit.
// tests/registration/test_limits.py fails when this file and the table differ.
#pragma once

// AURA_LIMITS_<NAME>: the comma list (template arguments, initialisers);
// AURA_LIMITS_<NAME>_TEXT: the same as a string, for error messages.
#define AURA_LIMITS_DECODE_HEAD_DIMS 64, 80, 96, 128, 192, 256, 512
#define AURA_LIMITS_DECODE_HEAD_DIMS_TEXT "64, 80, 96, 128, 192, 256, 512"
#define AURA_LIMITS_AURA_HEAD_DIMS 64, 128, 256, 512
#define AURA_LIMITS_AURA_HEAD_DIMS_TEXT "64, 128, 256, 512"
#define AURA_LIMITS_AURA_BITS 2, 3, 4, 8
#define AURA_LIMITS_AURA_BITS_TEXT "2, 3, 4, 8"

namespace aura::limits {

inline constexpr int kDecodeHeadDims[] = {AURA_LIMITS_DECODE_HEAD_DIMS};
constexpr bool is_decode_head_dim(long long v) { return v == 64 || v == 80 || v == 96 || v == 128 || v == 192 || v == 256 || v == 512; }
inline constexpr int kAuraHeadDims[] = {AURA_LIMITS_AURA_HEAD_DIMS};
constexpr bool is_aura_head_dim(long long v) { return v == 64 || v == 128 || v == 256 || v == 512; }
inline constexpr int kAuraBits[] = {AURA_LIMITS_AURA_BITS};
constexpr bool is_aura_bits(long long v) { return v == 2 || v == 3 || v == 4 || v == 8; }

}  // namespace aura::limits
