// The op table: schema name -> (output specs, plan). Both consumers, the Objective-C++ host and
// the emulator harness, reach every plan through output_specs() and plan_op() below.
#include <map>

#include "plans.h"

namespace aura::mps {
namespace {

using SpecsFn = std::vector<OutputSpec> (*)(const OpCall&);
using PlanFn = OpPlan (*)(const OpCall&);

struct OpEntry {
  SpecsFn specs;  // nullptr: the op returns nothing (it writes caller-owned tensors)
  PlanFn plan;
};

const std::map<std::string, OpEntry>& table() {
#define AURA_OP(op) {#op, {specs_##op, plan_##op}}
#define AURA_INPLACE_OP(op) {#op, {nullptr, plan_##op}}
  static const std::map<std::string, OpEntry> t = {
      AURA_OP(flash_decode), AURA_INPLACE_OP(flash_decode_out), AURA_OP(merge_attn_states),
      AURA_OP(hadamard_rotate), AURA_OP(aura_encode), AURA_INPLACE_OP(aura_write_cache),
      AURA_INPLACE_OP(aura_append), AURA_OP(aura_dequantize), AURA_OP(aura_flash_p1), AURA_OP(aura_flash_p2),
      AURA_OP(aura_decode),
      AURA_OP(gdn_chunk), AURA_OP(gdn_chunk_cumsum), AURA_OP(gdn_kkt_solve), AURA_OP(gdn_recompute_w_u),
      AURA_OP(gdn_fwd_h), AURA_OP(gdn_fwd_o), AURA_OP(gdn_recurrent), AURA_OP(causal_conv1d),
      AURA_OP(causal_conv1d_update),
  };
#undef AURA_OP
#undef AURA_INPLACE_OP
  return t;
}

const OpEntry& entry(const std::string& op) {
  auto it = table().find(op);
  if (it == table().end()) throw PlanError("aura::" + op + ": no Metal plan for this op");
  return it->second;
}

}  // namespace

bool has_plan(const std::string& op) { return table().count(op) != 0; }

std::vector<std::string> planned_ops() {
  std::vector<std::string> names;
  for (const auto& kv : table()) names.push_back(kv.first);
  return names;
}

std::vector<OutputSpec> output_specs(const std::string& op, const OpCall& inputs) {
  const OpEntry& e = entry(op);
  return e.specs ? e.specs(inputs) : std::vector<OutputSpec>{};
}

OpPlan plan_op(const std::string& op, const OpCall& call) { return entry(op).plan(call); }

}  // namespace aura::mps
