// Objective-C++ host of the MPS backend: what register.mm needs from encode.mm.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "plan/launch_plan.h"

namespace aura::mps {

DType dtype_of(c10::ScalarType t);
c10::ScalarType scalar_type_of(DType t);
TensorMeta meta_of(const at::Tensor& t);  // sizes and strides; the offset goes to setBuffer

// Encodes every launch of `plan` on the current MPS stream; `args` are the plan's arguments
// (schema tensors, outputs, workspaces) in order.
void encode(const OpPlan& plan, const std::vector<at::Tensor>& args);

}  // namespace aura::mps
