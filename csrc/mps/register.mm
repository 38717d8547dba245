// torch_aura._C_mps: implementations only (TORCH_LIBRARY_IMPL). Every schema lives in
// torch_aura/_schema.py and is defined from Python before this module loads.
//
// One boxed kernel serves every op: it reads the call's arguments in schema order straight off
// the dispatcher stack (tensors -> TensorMeta, strings as they are, the rest -> doubles), asks
// the portable plan code for the output specs and the launch plan (plan_op, the function the
// Linux emulator harness runs), allocates outputs and workspaces on the MPS device and encodes
// the plan.
#include <Python.h>
#include <torch/library.h>

#include <cmath>

#include "mps_host.h"

namespace aura::mps {
namespace {

// The kind of a schema argument's type, looking through Optional (Tensor? is a Tensor argument).
c10::TypeKind kind_of(const c10::Argument& arg) {
  const auto& type = arg.type();
  if (auto opt = type->cast<c10::OptionalType>()) return opt->getElementType()->kind();
  return type->kind();
}

double scalar_of(const c10::IValue& v) {
  if (v.isNone()) return std::nan("");  // None: the plans read NaN as "not given"
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return double(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  TORCH_CHECK(false, "aura MPS: unsupported argument type ", v.tagKind());
}

void run_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const std::string name = schema.name().substr(schema.name().find("::") + 2);
  const std::size_t n_args = schema.arguments().size();
  auto args = torch::jit::last(*stack, n_args);

  OpCall call;
  std::vector<at::Tensor> tensors;
  c10::optional<at::Device> device;
  for (std::size_t i = 0; i < n_args; ++i) {
    const c10::IValue& v = args[i];
    const c10::TypeKind kind = kind_of(schema.arguments()[i]);
    if (kind == c10::TypeKind::TensorType) {
      at::Tensor t = v.isTensor() ? v.toTensor() : at::Tensor();
      if (t.defined() && !device) device = t.device();
      call.tensors.push_back(meta_of(t));
      tensors.push_back(t);
    } else if (kind == c10::TypeKind::ScalarTypeType && !v.isNone()) {
      call.scalars.push_back(double(int(dtype_of(v.toScalarType()))));  // boxed as an int
    } else if (kind == c10::TypeKind::StringType) {
      call.strings.push_back(v.isNone() ? std::nullopt : std::optional<std::string>(v.toStringRef()));
    } else {
      call.scalars.push_back(scalar_of(v));
    }
  }
  TORCH_CHECK(device.has_value(), "aura::", name, ": no tensor argument");

  std::vector<at::Tensor> outputs;
  try {
    for (const OutputSpec& spec : output_specs(name, call)) {
      outputs.push_back(at::empty(spec.sizes, at::TensorOptions().dtype(scalar_type_of(spec.dtype)).device(*device)));
      call.tensors.push_back(meta_of(outputs.back()));
      tensors.push_back(outputs.back());
    }
    OpPlan plan = plan_op(name, call);
    for (std::int64_t bytes : plan.workspace_bytes)
      tensors.push_back(at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(*device)));
    encode(plan, tensors);
  } catch (const PlanError& e) {
    // bad input: the same named message as the Python checks, as a ValueError-like error
    TORCH_CHECK_VALUE(false, e.what());
  }

  torch::jit::drop(*stack, n_args);
  for (at::Tensor& t : outputs) torch::jit::push(*stack, std::move(t));
}

}  // namespace
}  // namespace aura::mps

// Importing the module runs the registration below; it exports nothing else.
extern "C" PyObject* PyInit__C_mps(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C_mps", "torch_aura Metal kernels", -1, nullptr};
  return PyModule_Create(&def);
}

TORCH_LIBRARY_IMPL(aura, MPS, m) {
  for (const std::string& name : aura::mps::planned_ops())
    m.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&aura::mps::run_op>());
}
