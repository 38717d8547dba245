// Per-op plan and output-spec functions, one group per family file; plan/ops.cpp tables them.
#pragma once

#include "launch_plan.h"

namespace aura::mps {

// Every op: its output specs (from the input tensors only) and its plan (inputs, then outputs).
#define AURA_PLANNED_OP(op)                                      \
  std::vector<OutputSpec> specs_##op(const OpCall& call);        \
  OpPlan plan_##op(const OpCall& call);
#define AURA_PLANNED_INPLACE_OP(op) OpPlan plan_##op(const OpCall& call);  // returns nothing

// decode.cpp
int decode_num_splits(std::int64_t batch, std::int64_t kv_heads, std::int64_t num_splits);
AURA_PLANNED_OP(flash_decode)
AURA_PLANNED_INPLACE_OP(flash_decode_out)
AURA_PLANNED_OP(merge_attn_states)

// gdn.cpp
AURA_PLANNED_OP(gdn_chunk)
AURA_PLANNED_OP(gdn_chunk_cumsum)
AURA_PLANNED_OP(gdn_kkt_solve)
AURA_PLANNED_OP(gdn_recompute_w_u)
AURA_PLANNED_OP(gdn_fwd_h)
AURA_PLANNED_OP(gdn_fwd_o)
AURA_PLANNED_OP(gdn_recurrent)
AURA_PLANNED_OP(causal_conv1d)
AURA_PLANNED_OP(causal_conv1d_update)

// aura.cpp
AURA_PLANNED_OP(hadamard_rotate)
AURA_PLANNED_OP(aura_encode)
AURA_PLANNED_INPLACE_OP(aura_write_cache)
AURA_PLANNED_INPLACE_OP(aura_append)
AURA_PLANNED_OP(aura_dequantize)
AURA_PLANNED_OP(aura_flash_p1)
AURA_PLANNED_OP(aura_flash_p2)
AURA_PLANNED_OP(aura_decode)

}  // namespace aura::mps
