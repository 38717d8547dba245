// Helpers shared by the per-family plan files: named access to an OpCall and metadata checks.
// The Python checks (torch_aura/_checks) run before every public call; these repeat the ones a
// kernel's memory safety depends on, since torch.ops.aura.* can be called directly.
#pragma once

#include <cmath>
#include <initializer_list>
#include <string>

#include "launch_plan.h"

namespace aura::mps {

[[noreturn]] void fail(const std::string& arg, const std::string& expected, const std::string& got);
std::string shape_str(const TensorMeta& t);

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// A view of an OpCall with checked, named access.
class Args {
 public:
  Args(const OpCall& call, int n_tensors, int n_scalars, const char* op, int n_strings = 0);
  const TensorMeta& t(int i) const { return call_.tensors[i]; }
  bool has(int i) const { return call_.tensors[i].defined != 0; }
  double s(int i) const { return call_.scalars[i]; }
  bool none(int i) const { return std::isnan(call_.scalars[i]); }
  const std::optional<std::string>& str(int i) const { return call_.strings[i]; }
  std::int64_t n(int i) const { return static_cast<std::int64_t>(call_.scalars[i]); }
  // Argument index of output k (outputs follow the n_tensors schema tensors).
  int out(int k) const { return n_tensors_ + k; }
  const TensorMeta& output(int k) const;
  int workspace(int k) const { return int(call_.tensors.size()) + k; }

 private:
  const OpCall& call_;
  int n_tensors_;
};

// Rank, dtype and (optionally) unit last stride of a tensor argument.
void check(const TensorMeta& t, const char* name, int ndim, std::initializer_list<DType> dtypes,
           bool unit_last_stride = true);
void check_dim(const TensorMeta& t, const char* name, int dim, std::int64_t expected, const char* what);

// Binds `arg` at `slot`, or a stand-in for an absent optional: Metal wants every declared buffer
// bound, and the kernel never reads it (its parameters say so).
void bind(Launch& l, int slot, const Args& a, int arg, int stand_in = 0);

// Metadata of a contiguous tensor (workspaces, and the fp32 partials the plans allocate).
TensorMeta contiguous_meta(DType t, const std::vector<std::int64_t>& sizes);
std::vector<std::int64_t> sizes_of(const TensorMeta& t);

// A tensor operand of a launch: its argument index (-1 = absent) and metadata. Composite plans
// (gdn_chunk, aura_decode) pass workspaces where a stage op would take user tensors.
struct Operand {
  int arg = -1;
  TensorMeta meta{};
  bool present() const { return arg >= 0; }
};
Operand operand(const Args& a, int i);         // schema tensor i (absent when None)
Operand output_operand(const Args& a, int k);  // output k

// Collects launches and workspaces; workspace w is argument n_tensors + w.
class PlanBuilder {
 public:
  explicit PlanBuilder(const OpCall& call) : first_workspace_(int(call.tensors.size())) {}
  Operand workspace(DType t, const std::vector<std::int64_t>& sizes);  // contiguous
  void add(Launch l) { plan_.launches.push_back(std::move(l)); }
  OpPlan take() { return std::move(plan_); }

 private:
  int first_workspace_;
  OpPlan plan_;
};

// Binds an operand, or `stand_in` when it is absent (the kernel's parameters say not to read it).
void bind(Launch& l, int slot, const Operand& x, int stand_in = 0);

// "<prefix>_<dtype>[_<dim>]": the host-name convention of docs/style.md §8.
std::string host_name(const std::string& prefix, DType t, std::int64_t dim = -1);

}  // namespace aura::mps
