// The emulator harness: runs an op's launch plan (the same plan_op() the Objective-C++ host
// encodes) on CPU tensors, each launch through the fiber scheduler. A C ABI of raw pointers and
// the POD TensorMeta, loaded with ctypes by tests/_metal.py; no torch headers here.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
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

// A copy of one tensor argument whose last byte sits right before a PROT_NONE page, so a kernel
// reading or writing even one element past the tensor's extent faults (the GPU would silently
// read garbage). Copied in before the launches and back afterwards (outputs, in-place updates).
class GuardedCopy {
 public:
  GuardedCopy(void* data, std::size_t bytes) : data_(data), bytes_(bytes) {
    const std::size_t page = std::size_t(sysconf(_SC_PAGESIZE));
    map_bytes_ = (bytes + page - 1) / page * page + page;
    map_ = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map_ == MAP_FAILED) throw std::runtime_error("guard page allocation failed");
    char* guard = static_cast<char*>(map_) + map_bytes_ - page;
    mprotect(guard, page, PROT_NONE);
    copy_ = guard - bytes;
    std::memcpy(copy_, data, bytes);
  }
  ~GuardedCopy() { munmap(map_, map_bytes_); }
  GuardedCopy(const GuardedCopy&) = delete;
  GuardedCopy& operator=(const GuardedCopy&) = delete;
  void* copy() const { return copy_; }
  bool guards(const void* address) const {  // within the PROT_NONE page after the copy
    const char* a = static_cast<const char*>(address);
    return a >= copy_ + bytes_ && a < static_cast<char*>(map_) + map_bytes_;
  }
  void write_back() const { std::memcpy(data_, copy_, bytes_); }

 private:
  void* data_;
  std::size_t bytes_, map_bytes_ = 0;
  void* map_ = nullptr;
  char* copy_ = nullptr;
};

// Bytes from element [0, .., 0] to one past the last element a view can address.
std::size_t extent_bytes(const aura::mps::TensorMeta& m) {
  if (!m.defined || m.numel() == 0) return 0;
  std::int64_t last = 0;
  for (int d = 0; d < m.ndim; ++d) last += (m.sizes[d] - 1) * m.strides[d];
  return std::size_t(last + 1) * aura::mps::element_size(m.type());
}

// The arguments of one run, each in a GuardedCopy; names the argument a fault hit.
class GuardedArgs {
 public:
  // Adds argument data (or, with 0 bytes, passes the pointer through unguarded).
  void add(void* data, std::size_t bytes) {
    if (bytes == 0) {
      ptrs_.push_back(data);
      return;
    }
    copies_.push_back(std::make_unique<GuardedCopy>(data, bytes));
    copy_arg_.push_back(int(ptrs_.size()));
    ptrs_.push_back(copies_.back()->copy());
  }
  const std::vector<void*>& ptrs() const { return ptrs_; }
  void write_back() const {
    for (const auto& c : copies_) c->write_back();
  }
  // The argument whose guard page holds `address`, or -1.
  int faulting_arg(const void* address) const {
    for (std::size_t i = 0; address && i < copies_.size(); ++i)
      if (copies_[i]->guards(address)) return copy_arg_[i];
    return -1;
  }

 private:
  std::vector<std::unique_ptr<GuardedCopy>> copies_;
  std::vector<int> copy_arg_;
  std::vector<void*> ptrs_;
};

// Host names dispatched so far in this process: the tests check every shipped kernel ran.
std::set<std::string>& launched() {
  static std::set<std::string> names;
  return names;
}

// Runs one dispatch over the guarded arguments; slot_args[slot] is the argument bound there
// (-1: none); `params` (if any) goes to `params_slot`.
std::string dispatch(const std::string& kernel, aura_emu::Grid3 groups, aura_emu::Grid3 size, const GuardedArgs& args,
                     const std::vector<int>& slot_args, std::vector<unsigned char> params, int params_slot,
                     int lane_order, std::uint64_t seed) {
  void* slots[aura_emu::kMaxBufferSlots] = {};
  int used = 0;
  for (int slot = 0; slot < int(slot_args.size()); ++slot) {
    if (slot_args[slot] < 0) continue;
    if (slot >= aura_emu::kMaxBufferSlots || slot_args[slot] >= int(args.ptrs().size()))
      return kernel + ": binding to a missing argument or past slot 30";
    slots[slot] = args.ptrs()[slot_args[slot]];
    used = slot + 1;
  }
  if (params_slot >= 0) {
    if (params.size() > aura::mps::kMaxParamBytes) return kernel + ": setBytes payload over 4 KiB";
    slots[params_slot] = params.data();
    used = std::max(used, params_slot + 1);
  }
  aura_emu::last_fault_address() = nullptr;
  launched().insert(kernel);
  std::string e = aura_emu::run_dispatch(kernel, groups, size, slots, used, aura_emu::LaneOrder(lane_order), seed);
  const int arg = args.faulting_arg(aura_emu::last_fault_address());
  if (arg >= 0) {
    std::string bound;
    for (int slot = 0; slot < int(slot_args.size()); ++slot)
      if (slot_args[slot] == arg) bound += (bound.empty() ? "" : ", ") + std::to_string(slot);
    e += ": an access past the end of argument " + std::to_string(arg) + " (bound at slot " + bound + ")";
  }
  return e;
}

// strings[i] == nullptr: a str? argument given as None.
aura::mps::OpCall make_call(const aura::mps::TensorMeta* tensors, int n_tensors, const double* scalars, int n_scalars,
                            const char* const* strings, int n_strings) {
  aura::mps::OpCall call{std::vector<aura::mps::TensorMeta>(tensors, tensors + n_tensors),
                         std::vector<double>(scalars, scalars + n_scalars)};
  for (int i = 0; i < n_strings; ++i)
    call.strings.push_back(strings[i] ? std::optional<std::string>(strings[i]) : std::nullopt);
  return call;
}

}  // namespace

extern "C" {

// Output specs of a functional op: dtypes[k], ndims[k] and sizes[k * 8 + i] for k < *n_outputs.
int aura_emu_output_specs(const char* op, const aura::mps::TensorMeta* tensors, int n_tensors, const double* scalars,
                          int n_scalars, const char* const* strings, int n_strings, int max_outputs, int* n_outputs,
                          int* dtypes, int* ndims, std::int64_t* sizes, char* err, int err_len) {
  try {
    auto specs = aura::mps::output_specs(op, make_call(tensors, n_tensors, scalars, n_scalars, strings, n_strings));
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
// Every tensor and workspace runs in a guarded copy (see GuardedCopy); workspaces start as 0xFF
// bytes (NaN), so a kernel reading scratch it never wrote fails.
int aura_emu_run_op(const char* op, const aura::mps::TensorMeta* tensors, void* const* data, int n_tensors,
                    const double* scalars, int n_scalars, const char* const* strings, int n_strings, int lane_order,
                    std::uint64_t seed, int* n_launches, char* err, int err_len) {
  try {
    auto plan = aura::mps::plan_op(op, make_call(tensors, n_tensors, scalars, n_scalars, strings, n_strings));
    GuardedArgs args;
    for (int i = 0; i < n_tensors; ++i) args.add(data[i], extent_bytes(tensors[i]));
    std::vector<std::vector<unsigned char>> workspaces;
    workspaces.reserve(plan.workspace_bytes.size());
    for (std::int64_t bytes : plan.workspace_bytes) {
      workspaces.emplace_back(std::size_t(bytes), 0xFF);
      args.add(workspaces.back().data(), std::size_t(bytes));
    }
    if (n_launches) *n_launches = int(plan.launches.size());
    for (const auto& launch : plan.launches) {
      std::vector<int> slot_args;
      for (const auto& b : launch.buffers) {
        if (b.slot < 0) return report(err, err_len, launch.kernel + ": negative buffer slot");
        if (int(slot_args.size()) <= b.slot) slot_args.resize(std::size_t(b.slot) + 1, -1);
        slot_args[std::size_t(b.slot)] = b.arg;
      }
      std::string e = dispatch(launch.kernel, {launch.groups.x, launch.groups.y, launch.groups.z},
                               {launch.group_size.x, launch.group_size.y, launch.group_size.z}, args, slot_args,
                               {launch.params.begin(), launch.params.end()}, launch.params_slot, lane_order, seed);
      if (!e.empty()) return report(err, err_len, e);
    }
    args.write_back();
    return 0;
  } catch (const std::exception& e) {
    return report(err, err_len, e.what());
  }
}

// One dispatch of any registered kernel (emulator self-tests and probe kernels); buffer i sits
// at slot i, guarded when bytes[i] > 0 (its extent).
int aura_emu_run_kernel(const char* kernel, const unsigned* groups, const unsigned* group_size, void* const* buffers,
                        const std::uint64_t* bytes, int n_buffers, int lane_order, std::uint64_t seed, char* err,
                        int err_len) {
  try {
    GuardedArgs args;
    std::vector<int> slot_args;
    for (int i = 0; i < n_buffers; ++i) {
      args.add(buffers[i], std::size_t(bytes[i]));
      slot_args.push_back(buffers[i] ? i : -1);
    }
    std::string e = dispatch(kernel, {groups[0], groups[1], groups[2]}, {group_size[0], group_size[1], group_size[2]},
                             args, slot_args, {}, -1, lane_order, seed);
    if (e.empty()) args.write_back();
    return report(err, err_len, e);
  } catch (const std::exception& e) {
    return report(err, err_len, e.what());
  }
}

// Newline-separated registered kernel host names / planned op names.
int aura_emu_kernel_names(char* out, int len) {
  std::string all;
  for (const auto& n : aura_emu::kernel_names()) all += n + "\n";
  return report(out, len, all), int(all.size());
}

int aura_emu_launched_kernels(char* out, int len) {
  std::string all;
  for (const auto& n : launched()) all += n + "\n";
  return report(out, len, all), int(all.size());
}

int aura_emu_planned_ops(char* out, int len) {
  std::string all;
  for (const auto& n : aura::mps::planned_ops()) all += n + "\n";
  return report(out, len, all), int(all.size());
}

}  // extern "C"
