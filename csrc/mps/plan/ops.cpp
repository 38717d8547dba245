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
  static const std::map<std::string, OpEntry> t = {
      {"flash_decode", {specs_flash_decode, plan_flash_decode}},
      {"flash_decode_out", {nullptr, plan_flash_decode_out}},
      {"merge_attn_states", {specs_merge_attn_states, plan_merge_attn_states}},
  };
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
