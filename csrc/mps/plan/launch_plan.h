// Launch plans: portable C++ (no Apple, no torch headers) that turns tensor metadata into the
// dispatches of one op (docs/metal.md §7). The Objective-C++ host (csrc/mps/encode.mm) encodes
// these plans on the MPS stream; the emulator harness (csrc/mps/emu/harness.cpp) runs the very
// same plans on CPU tensors, so grid, binding and workspace logic is tested on Linux.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace aura::mps {

enum class DType : std::int32_t { f32 = 0, f16 = 1, bf16 = 2, i32 = 3, i64 = 4 };

std::size_t element_size(DType t);
const char* dtype_name(DType t);  // "f32", "f16", "bf16", ...: the dtype part of host names

constexpr int kMaxDims = 8;

// One tensor argument: sizes and strides in elements, like at::Tensor. The storage offset is not
// here: the host binds each buffer at `storage_offset * element_size` (the emulator receives the
// already-offset data pointer), so a kernel always sees element [0, .., 0] at its base.
// Plain old data with a fixed layout: tests/_metal.py mirrors it with ctypes.
struct TensorMeta {
  std::int32_t defined;  // 0 for an absent optional (Tensor? = None)
  std::int32_t dtype;    // DType
  std::int32_t ndim;
  std::int32_t reserved;
  std::int64_t sizes[kMaxDims];
  std::int64_t strides[kMaxDims];

  DType type() const { return DType(dtype); }
  std::int64_t size(int i) const { return sizes[i < 0 ? i + ndim : i]; }
  std::int64_t stride(int i) const { return strides[i < 0 ? i + ndim : i]; }
  std::int64_t numel() const;
};

// The arguments of one call in schema order: every Tensor / Tensor? argument in `tensors`
// (then the outputs a functional op returns, allocated from output_specs), every str / str?
// argument in `strings` (None = nullopt), every other argument in `scalars` as a double (None =
// NaN, bool = 0/1, ScalarType = DType code).
struct OpCall {
  std::vector<TensorMeta> tensors;
  std::vector<double> scalars;
  std::vector<std::optional<std::string>> strings = {};
};

struct OutputSpec {
  DType dtype;
  std::vector<std::int64_t> sizes;  // contiguous
};

struct Dim3 {
  std::uint32_t x = 1, y = 1, z = 1;
};

// Buffer slot `slot` receives tensor argument `arg` (index into OpCall::tensors, then workspaces).
struct Binding {
  int slot;
  int arg;
};

struct Launch {
  std::string kernel;  // host name of an AURA_INSTANTIATE'd kernel
  Dim3 groups, group_size;
  std::vector<Binding> buffers;
  std::vector<std::uint8_t> params;  // setBytes payload (<= 4 KiB)
  int params_slot = -1;
};

// A whole op: scratch buffers (argument indices tensors.size() + i, uninitialised) and the
// dispatches, encoded in order on one stream (each sees the previous one's writes).
struct OpPlan {
  std::vector<std::int64_t> workspace_bytes;
  std::vector<Launch> launches;
};

// Bad input: the message names the argument, what was expected and what was given (ops.md).
class PlanError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The entry points both consumers call (defined in plan/ops.cpp).
bool has_plan(const std::string& op);
std::vector<std::string> planned_ops();
std::vector<OutputSpec> output_specs(const std::string& op, const OpCall& inputs);
OpPlan plan_op(const std::string& op, const OpCall& call);

constexpr std::size_t kMaxParamBytes = 4096;  // Metal's setBytes limit

template <class P>
void set_params(Launch& l, const P& p, int slot) {
  static_assert(sizeof(P) <= kMaxParamBytes, "parameters beyond 4 KiB must go through a buffer");
  l.params.resize(sizeof(P));
  std::memcpy(l.params.data(), &p, sizeof(P));
  l.params_slot = slot;
}

}  // namespace aura::mps
