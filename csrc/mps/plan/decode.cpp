// Launch plans of the decode family: flash_decode, flash_decode_out, merge_attn_states.
#include <algorithm>
#include <cmath>

#include "../../generated/limits.h"
#include "../shaders/aura_params.h"
#include "plan_util.h"
#include "plans.h"

namespace aura::mps {
namespace {

// reference/decode.py: STAND_IN_SMS, CTAS_PER_SM, MAX_AUTO_SPLITS. A Mac has no SM count the
// reference could see, so both plan the H100 stand-in grid and produce the same partials.
constexpr int kStandInSms = 132, kCtasPerSm = 2, kMaxAutoSplits = 128;

void check_head_dim(std::int64_t D, const char* arg) {
  if (!limits::is_decode_head_dim(D)) fail(arg, "one of [" AURA_LIMITS_DECODE_HEAD_DIMS_TEXT "]", std::to_string(D));
}

struct DecodeShape {
  std::int64_t B, Hq, Hkv, D;
  bool paged;
};

// Arguments 0..4: q, k_cache, v_cache, seq_lens, block_table (flash_decode and flash_decode_out).
DecodeShape check_decode_inputs(const Args& a) {
  const auto& q = a.t(0);
  check(q, "q", 3, {DType::f32, DType::f16, DType::bf16});
  check(a.t(1), "k_cache", 4, {q.type()});
  check(a.t(2), "v_cache", 4, {q.type()});
  check(a.t(3), "seq_lens", 1, {DType::i32}, false);
  DecodeShape s{q.size(0), q.size(1), 0, q.size(2), a.has(4)};
  check_head_dim(s.D, "head_dim (q.shape[-1])");
  check_dim(a.t(3), "seq_lens", 0, s.B, "the batch size B = q.shape[0]");
  if (s.paged) {
    check(a.t(4), "block_table", 2, {DType::i32});
    check_dim(a.t(4), "block_table", 0, s.B, "B = q.shape[0]");
    s.Hkv = a.t(1).size(2);
  } else {
    check_dim(a.t(1), "k_cache", 0, s.B, "B = q.shape[0], contiguous [B, Hkv, T_cap, D] layout");
    s.Hkv = a.t(1).size(1);
  }
  check_dim(a.t(1), "k_cache", 3, s.D, "head_dim = q.shape[-1]");
  for (int i = 0; i < 4; ++i) check_dim(a.t(2), "v_cache", i, a.t(1).size(i), "the shape of k_cache");
  if (s.Hkv < 1 || s.Hq % s.Hkv != 0)
    fail("q", "query heads Hq (" + std::to_string(s.Hq) + ") to be a multiple of KV heads Hkv (" + std::to_string(s.Hkv) + ")",
         "a ratio that does not divide");
  return s;
}

Launch merge_launch(const TensorMeta& po, const TensorMeta& pl, const TensorMeta& out, const TensorMeta& lse,
                    int po_arg, int pl_arg, int out_arg, int lse_arg, DType out_type) {
  MergeParams p{};
  for (int i = 0; i < 3; ++i) p.po_stride[i] = po.stride(i), p.pl_stride[i] = pl.stride(i);
  for (int i = 0; i < 2; ++i) p.out_stride[i] = out.stride(i), p.lse_stride[i] = lse.stride(i);
  p.splits = int(po.size(0)), p.batch = int(po.size(1)), p.q_heads = int(po.size(2)), p.head_dim = int(po.size(3));
  Launch l;
  l.kernel = "merge_attn_states_" + std::string(dtype_name(po.type())) + "_" + dtype_name(out_type);
  l.groups = {std::uint32_t(p.q_heads), std::uint32_t(p.batch), 1};
  l.group_size = {32, 1, 1};
  l.buffers = {{0, po_arg}, {1, pl_arg}, {2, out_arg}, {3, lse_arg}};
  set_params(l, p, 4);
  return l;
}

// flash_decode(_out): tensors q, k, v, seq_lens, block_table, out, lse; scalars scale, num_splits.
OpPlan plan_flash_decode(const OpCall& call, const char* op) {
  Args a(call, 5, 2, op);
  DecodeShape s = check_decode_inputs(a);
  const TensorMeta& out = a.output(0);
  const TensorMeta& lse = a.output(1);
  check(out, "out", 3, {a.t(0).type()});
  check(lse, "lse", 2, {DType::f32}, false);
  for (int i = 0; i < 3; ++i) check_dim(out, "out", i, a.t(0).size(i), "[B, Hq, D] of q");
  for (int i = 0; i < 2; ++i) check_dim(lse, "lse", i, a.t(0).size(i), "[B, Hq] of q");
  if (a.n(1) < 0) fail("num_splits", ">= 0 (0 = choose automatically)", std::to_string(a.n(1)));

  const int S = decode_num_splits(s.B, s.Hkv, a.n(1));
  const double scale = a.none(0) ? 1.0 / std::sqrt(double(s.D)) : a.s(0);
  DecodeSplitParams p{};
  for (int i = 0; i < 2; ++i) p.q_stride[i] = a.t(0).stride(i);
  // Dims 0..2 are (b, h, t) contiguous or (block, slot, h) paged; the kernel reads them as such.
  for (int i = 0; i < 3; ++i) p.k_stride[i] = a.t(1).stride(i), p.v_stride[i] = a.t(2).stride(i);
  p.table_stride = s.paged ? a.t(4).stride(0) : 0;
  for (int i = 0; i < 2; ++i) p.out_stride[i] = out.stride(i), p.lse_stride[i] = lse.stride(i);
  p.batch = int(s.B), p.q_heads = int(s.Hq), p.kv_heads = int(s.Hkv), p.group = int(s.Hq / s.Hkv);
  p.splits = S;
  p.page_size = s.paged ? int(a.t(1).size(1)) : 0;
  p.tile = s.paged ? p.page_size : int(kDecodeContiguousTile);
  p.direct = S == 1;
  p.scale_log2 = float(scale * 1.4426950408889634);
  p.capacity = int(s.paged ? a.t(4).size(1) * a.t(1).size(1) : a.t(1).size(2));
  p.num_blocks = int(s.paged ? a.t(1).size(0) : 0);

  OpPlan plan;
  const int out_arg = a.out(0), lse_arg = a.out(1);
  int po_arg = out_arg, pl_arg = lse_arg;  // stand-ins when there is no merge
  if (S > 1) {
    plan.workspace_bytes = {std::int64_t(S) * s.B * s.Hq * s.D * 4, std::int64_t(S) * s.B * s.Hq * 4};
    po_arg = a.workspace(0), pl_arg = a.workspace(1);
  }
  Launch split;
  split.kernel = host_name("flash_decode_split", a.t(0).type(), s.D);
  split.groups = {std::uint32_t(S), std::uint32_t(s.Hkv), std::uint32_t(s.B)};
  split.group_size = {kDecodeSimdgroups * 32, 1, 1};
  for (int i = 0; i < 4; ++i) bind(split, i, a, i);
  bind(split, 4, a, 4, 3);  // contiguous layout: seq_lens stands in for the absent block table
  split.buffers.insert(split.buffers.end(), {{5, out_arg}, {6, lse_arg}, {7, po_arg}, {8, pl_arg}});
  set_params(split, p, 9);
  if (s.B * s.Hq > 0) plan.launches.push_back(split);
  if (S > 1 && s.B * s.Hq > 0) {
    TensorMeta po = contiguous_meta(DType::f32, {S, s.B, s.Hq, s.D});
    TensorMeta pl = contiguous_meta(DType::f32, {S, s.B, s.Hq});
    plan.launches.push_back(merge_launch(po, pl, out, lse, po_arg, pl_arg, out_arg, lse_arg, a.t(0).type()));
  }
  return plan;
}

}  // namespace

int decode_num_splits(std::int64_t batch, std::int64_t kv_heads, std::int64_t num_splits) {
  if (num_splits > 0) return int(num_splits);
  const double slots = double(kStandInSms) * kCtasPerSm, work = double(batch) * double(kv_heads);
  if (work == 0 || work >= 0.8 * slots) return 1;  // one wave already fills the GPU
  auto efficiency = [&](int s) {
    double waves = work * s / slots;
    return waves / std::ceil(waves);
  };
  double best = 0;
  for (int s = 1; s <= kMaxAutoSplits; ++s) best = std::max(best, efficiency(s));
  for (int s = 1; s <= kMaxAutoSplits; ++s)
    if (efficiency(s) >= 0.85 * best) return s;  // the smallest: more splits only add merge work
  return 1;
}

std::vector<OutputSpec> specs_flash_decode(const OpCall& call) {
  Args a(call, 5, 2, "flash_decode");
  DecodeShape s = check_decode_inputs(a);
  return {{a.t(0).type(), {s.B, s.Hq, s.D}}, {DType::f32, {s.B, s.Hq}}};
}

OpPlan plan_flash_decode(const OpCall& call) { return plan_flash_decode(call, "flash_decode"); }
OpPlan plan_flash_decode_out(const OpCall& call) { return plan_flash_decode(call, "flash_decode_out"); }

std::vector<OutputSpec> specs_merge_attn_states(const OpCall& call) {
  Args a(call, 2, 0, "merge_attn_states");
  const auto& po = a.t(0);
  check(po, "partial_out", 4, {DType::f32, DType::f16, DType::bf16});
  check(a.t(1), "partial_lse", 3, {DType::f32}, false);
  if (po.size(0) < 1) fail("partial_out.shape[0]", "at least 1 split S", std::to_string(po.size(0)));
  check_head_dim(po.size(3), "head_dim (partial_out.shape[-1])");
  for (int i = 0; i < 3; ++i) check_dim(a.t(1), "partial_lse", i, po.size(i), "[S, B, Hq] of partial_out");
  return {{po.type(), {po.size(1), po.size(2), po.size(3)}}, {DType::f32, {po.size(1), po.size(2)}}};
}

OpPlan plan_merge_attn_states(const OpCall& call) {
  specs_merge_attn_states(OpCall{{call.tensors[0], call.tensors[1]}, call.scalars});
  Args a(call, 2, 0, "merge_attn_states");
  OpPlan plan;
  if (a.t(0).size(1) * a.t(0).size(2) > 0)
    plan.launches.push_back(merge_launch(a.t(0), a.t(1), a.output(0), a.output(1), 0, 1, a.out(0), a.out(1), a.t(0).type()));
  return plan;
}

}  // namespace aura::mps
