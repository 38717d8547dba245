#include "plan_util.h"

#include <algorithm>

namespace aura::mps {

std::size_t element_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::i64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

std::int64_t TensorMeta::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= sizes[i];
  return n;
}

void fail(const std::string& arg, const std::string& expected, const std::string& got) {
  throw PlanError(arg + ": expected " + expected + ", got " + got);
}

std::string shape_str(const TensorMeta& t) {
  std::string s = "(";
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.sizes[i]);
  return s + (t.ndim == 1 ? ",)" : ")");
}

Args::Args(const OpCall& call, int n_tensors, int n_scalars, const char* op, int n_strings)
    : call_(call), n_tensors_(n_tensors) {
  if (int(call.tensors.size()) < n_tensors || int(call.scalars.size()) != n_scalars ||
      int(call.strings.size()) != n_strings)
    throw PlanError(std::string(op) + ": expected " + std::to_string(n_tensors) + " tensor, " +
                    std::to_string(n_scalars) + " scalar and " + std::to_string(n_strings) + " string arguments, got " +
                    std::to_string(call.tensors.size()) + ", " + std::to_string(call.scalars.size()) + " and " +
                    std::to_string(call.strings.size()));
}

const TensorMeta& Args::output(int k) const {
  if (out(k) >= int(call_.tensors.size())) throw PlanError("output " + std::to_string(k) + " was not allocated");
  return call_.tensors[out(k)];
}

void check(const TensorMeta& t, const char* name, int ndim, std::initializer_list<DType> dtypes, bool unit_last_stride) {
  if (!t.defined) fail(name, "a tensor", "None");
  if (t.ndim != ndim) fail(name, "a " + std::to_string(ndim) + "-D tensor", "shape " + shape_str(t));
  bool ok = false;
  std::string names;
  for (DType d : dtypes) {
    ok = ok || d == t.type();
    names += (names.empty() ? "" : " / ") + std::string(dtype_name(d));
  }
  if (!ok) fail(name, "dtype " + names, dtype_name(t.type()));
  if (unit_last_stride && ndim > 0 && t.size(-1) > 1 && t.stride(-1) != 1)
    fail(name, "a unit stride in the last dim", "stride " + std::to_string(t.stride(-1)));
}

void check_dim(const TensorMeta& t, const char* name, int dim, std::int64_t expected, const char* what) {
  if (t.size(dim) != expected)
    fail(std::string(name) + ".shape[" + std::to_string(dim) + "]", std::to_string(expected) + " (" + what + ")",
         std::to_string(t.size(dim)) + " (shape " + shape_str(t) + ")");
}

void bind(Launch& l, int slot, const Args& a, int arg, int stand_in) {
  bool present = arg >= 0 && (arg >= a.out(0) || a.has(arg));  // outputs and workspaces always exist
  l.buffers.push_back({slot, present ? arg : stand_in});
}

TensorMeta contiguous_meta(DType t, const std::vector<std::int64_t>& sizes) {
  TensorMeta m{};
  m.defined = 1, m.dtype = std::int32_t(t), m.ndim = int(sizes.size());
  int i = 0;
  for (std::int64_t s : sizes) m.sizes[i++] = s;
  std::int64_t stride = 1;
  for (int j = m.ndim - 1; j >= 0; --j) m.strides[j] = stride, stride *= m.sizes[j];
  return m;
}

Operand operand(const Args& a, int i) { return a.has(i) ? Operand{i, a.t(i)} : Operand{}; }
Operand output_operand(const Args& a, int k) { return Operand{a.out(k), a.output(k)}; }

std::vector<std::int64_t> sizes_of(const TensorMeta& t) { return {t.sizes, t.sizes + t.ndim}; }

Operand PlanBuilder::workspace(DType t, const std::vector<std::int64_t>& sizes) {
  Operand w{first_workspace_ + int(plan_.workspace_bytes.size()), contiguous_meta(t, sizes)};
  plan_.workspace_bytes.push_back(std::max<std::int64_t>(1, w.meta.numel()) * std::int64_t(element_size(t)));
  return w;
}

void bind(Launch& l, int slot, const Operand& x, int stand_in) { l.buffers.push_back({slot, x.present() ? x.arg : stand_in}); }

std::string host_name(const std::string& prefix, DType t, std::int64_t dim) {
  return prefix + "_" + dtype_name(t) + (dim >= 0 ? "_" + std::to_string(dim) : "");
}

}  // namespace aura::mps
