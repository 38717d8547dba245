// Per-op plan and output-spec functions, one group per family file; plan/ops.cpp tables them.
#pragma once

#include "launch_plan.h"

namespace aura::mps {

// decode.cpp
int decode_num_splits(std::int64_t batch, std::int64_t kv_heads, std::int64_t num_splits);
std::vector<OutputSpec> specs_flash_decode(const OpCall& call);
OpPlan plan_flash_decode(const OpCall& call);
OpPlan plan_flash_decode_out(const OpCall& call);
std::vector<OutputSpec> specs_merge_attn_states(const OpCall& call);
OpPlan plan_merge_attn_states(const OpCall& call);

}  // namespace aura::mps
