// The emulator harness: runs an op's launch plan (the same plan_op() the Objective-C++ host
// encodes) on CPU tensors, each launch through the fiber scheduler. A C ABI of raw pointers and
// the POD TensorMeta, loaded with ctypes by tests/interp/metal/_emu.py; no torch headers here.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "../plan/launch_plan.h"
#include "emu_runtime.h"

namespace {

int report(char* err, int err_len, const std::string& message) {
  if (err && err_len > 0) {
    std::strncpy(err, message.c_str(), std::size_t(err_len) - 1);
    err[err_len - 1] = '\0';
  }
  return message.empty() ? 0 : 1;
}

aura::mps::OpCall make_call(const aura::mps::TensorMeta* tensors, int n_tensors, const double* scalars, int n_scalars) {
  return aura::mps::OpCall{std::vector<aura::mps::TensorMeta>(tensors, tensors + n_tensors),
                           std::vector<double>(scalars, scalars + n_scalars)};
}

}  // namespace

extern "C" {

// Output specs of a functional op: dtypes[k], ndims[k] and sizes[k * 8 + i] for k < *n_outputs.
int aura_emu_output_specs(const char* op, const aura::mps::TensorMeta* tensors, int n_tensors, const double* scalars,
                          int n_scalars, int max_outputs, int* n_outputs, int* dtypes, int* ndims, std::int64_t* sizes,
                          char* err, int err_len) {
  try {
    auto specs = aura::mps::output_specs(op, make_call(tensors, n_tensors, scalars, n_scalars));
    if (int(specs.size()) > max_outputs) return report(err, err_len, "too many outputs");
    *n_outputs = int(specs.size());
    for (std::size_t k = 0; k < specs.size(); ++k) {
      dtypes[k] = int(specs[k].dtype);
      ndims[k] = int(specs[k].sizes.size());
      for (std::size_t i = 0; i < specs[k].sizes.size(); ++i) sizes[k * aura::mps::kMaxDims + i] = specs[k].sizes[i];
    }
    return 0;
  } catch (const std::exception& e) {
    return report(err, err_len, e.what());
  }
}

// Runs op `op` on tensors (schema order, then outputs); data[i] points at element [0, .., 0].
// Workspaces are filled with 0xFF bytes (NaN): a kernel reading scratch it never wrote fails.
int aura_emu_run_op(const char* op, const aura::mps::TensorMeta* tensors, void* const* data, int n_tensors,
                    const double* scalars, int n_scalars, int lane_order, std::uint64_t seed, int* n_launches,
                    char* err, int err_len) {
  try {
    auto plan = aura::mps::plan_op(op, make_call(tensors, n_tensors, scalars, n_scalars));
    std::vector<std::vector<unsigned char>> workspaces;
    std::vector<void*> args(data, data + n_tensors);
    for (std::int64_t bytes : plan.workspace_bytes) {
      workspaces.emplace_back(std::size_t(bytes), 0xFF);
      args.push_back(workspaces.back().data());
    }
    if (n_launches) *n_launches = int(plan.launches.size());
    for (const auto& launch : plan.launches) {
      void* slots[aura_emu::kMaxBufferSlots] = {};
      int used = 0;
      for (const auto& b : launch.buffers) {
        if (b.arg < 0 || b.arg >= int(args.size())) return report(err, err_len, launch.kernel + ": binding to a missing argument");
        slots[b.slot] = args[b.arg];
        used = std::max(used, b.slot + 1);
      }
      std::vector<unsigned char> params(launch.params.begin(), launch.params.end());
      if (launch.params_slot >= 0) {
        if (params.size() > aura::mps::kMaxParamBytes) return report(err, err_len, launch.kernel + ": setBytes payload over 4 KiB");
        slots[launch.params_slot] = params.data();
        used = std::max(used, launch.params_slot + 1);
      }
      aura_emu::Grid3 groups{launch.groups.x, launch.groups.y, launch.groups.z};
      aura_emu::Grid3 size{launch.group_size.x, launch.group_size.y, launch.group_size.z};
      std::string e = aura_emu::run_dispatch(launch.kernel, groups, size, slots, used, aura_emu::LaneOrder(lane_order), seed);
      if (!e.empty()) return report(err, err_len, e);
    }
    return 0;
  } catch (const std::exception& e) {
    return report(err, err_len, e.what());
  }
}

// One dispatch of any registered kernel (emulator self-tests and probe kernels).
int aura_emu_run_kernel(const char* kernel, const unsigned* groups, const unsigned* group_size, void* const* buffers,
                        int n_buffers, int lane_order, std::uint64_t seed, char* err, int err_len) {
  aura_emu::Grid3 g{groups[0], groups[1], groups[2]}, s{group_size[0], group_size[1], group_size[2]};
  return report(err, err_len, aura_emu::run_dispatch(kernel, g, s, buffers, n_buffers, aura_emu::LaneOrder(lane_order), seed));
}

// Newline-separated registered kernel host names / planned op names.
int aura_emu_kernel_names(char* out, int len) {
  std::string all;
  for (const auto& n : aura_emu::kernel_names()) all += n + "\n";
  return report(out, len, all), int(all.size());
}

int aura_emu_planned_ops(char* out, int len) {
  std::string all;
  for (const auto& n : aura::mps::planned_ops()) all += n + "\n";
  return report(out, len, all), int(all.size());
}

}  // extern "C"
