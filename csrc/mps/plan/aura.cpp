// Launch plans of the AURA family (csrc/mps/shaders/aura.metal; reference/aura.py).
#include <algorithm>

#include "../../generated/limits.h"
#include "../shaders/aura_params.h"
#include "plan_util.h"
#include "plans.h"

namespace aura::mps {
namespace {

constexpr std::initializer_list<DType> kFloats = {DType::f32, DType::f16, DType::bf16};

void check_dim_supported(std::int64_t D, const char* where) {
  if (!limits::is_aura_head_dim(D))
    fail("head_dim", "one of [" AURA_LIMITS_AURA_HEAD_DIMS_TEXT "]", std::to_string(D) + " (" + where + ")");
}

void check_bits(double bits, const char* arg) {
  bool ok = false;  // compared as doubles (a schema float): 4.5 or NaN is no bit width
  for (int b : limits::kAuraBits) ok = ok || bits == b;
  if (!ok) fail(arg, "one of [" AURA_LIMITS_AURA_BITS_TEXT "]", std::to_string(bits));
}

void check_table(const Args& a, int i, const char* name, std::int64_t entries) {
  check(a.t(i), name, 1, {DType::f32}, false);
  if (a.t(i).stride(0) != 1 && entries > 1) fail(name, "a contiguous tensor", "strided");
  check_dim(a.t(i), name, 0, entries, "2**bits (- 1 for boundaries)");
}

void check_mask(const Args& a, int i, const char* name, std::int64_t D) {
  if (!a.has(i)) return;
  check(a.t(i), name, 1, {DType::i32}, false);
  if (a.t(i).stride(0) != 1 && D > 32) fail(name, "a contiguous tensor", "strided");
  check_dim(a.t(i), name, 0, D / 32, "head_dim // 32 words");
}

// Leading dims of a tensor as AuraRows (the first `lead` dims).
AuraRows rows_of(const TensorMeta& t, int lead) {
  if (lead > int(kAuraMaxLeadDims)) fail("tensor", "at most 6 leading dims", std::to_string(lead));
  AuraRows r{};
  for (int d = 0; d < lead; ++d) r.size[d] = t.sizes[d], r.stride[d] = t.strides[d];
  return r;
}

std::int64_t rows_count(const TensorMeta& t, int lead) {
  std::int64_t n = 1;
  for (int d = 0; d < lead; ++d) n *= t.sizes[d];
  return n;
}

std::string kernel_name(const char* op, DType t, std::int64_t D) { return host_name(op, t, D); }

Launch row_launch(const std::string& kernel, std::int64_t rows) {
  Launch l;
  l.kernel = kernel;
  l.groups = {std::uint32_t(rows), 1, 1};
  l.group_size = {32, 1, 1};
  return l;
}

// y = rotate(x) with the given output operand (hadamard_rotate, and q's rotation in aura_decode).
void add_rotate(PlanBuilder& pb, const Operand& x, const Operand& mask, const Operand& y, double scale, bool inverse) {
  const int lead = x.meta.ndim - 1;
  const std::int64_t D = x.meta.size(-1), rows = rows_count(x.meta, lead);
  AuraRowParams p{};
  p.in = rows_of(x.meta, lead), p.out = rows_of(y.meta, lead);
  p.rows = rows, p.lead_dims = lead, p.has_mask = mask.present(), p.inverse = inverse;
  p.factor = float(scale / std::sqrt(double(D)));
  Launch l = row_launch("aura_rotate_" + std::string(dtype_name(x.meta.type())) + "_" + dtype_name(y.meta.type()) + "_" +
                            std::to_string(D), rows);
  bind(l, 0, x);
  bind(l, 1, mask, x.arg);
  bind(l, 2, y);
  set_params(l, p, 3);
  if (rows > 0) pb.add(l);
}

// ---- hadamard_rotate(x, sign_mask; scale, inverse)
std::int64_t rotate_checks(const Args& a) {
  const TensorMeta& x = a.t(0);
  if (x.ndim < 1) fail("x", "a tensor of rank >= 1 ([..., D])", "a scalar");
  check(x, "x", x.ndim, kFloats);
  check_dim_supported(x.size(-1), "x.shape[-1]");
  check_mask(a, 1, "sign_mask", x.size(-1));
  return x.size(-1);
}

// ---- aura_encode(x, codebook, boundaries, sign_mask; bits) and the encode launch
// The codebook, boundaries and sign mask of one encode; `side` prefixes their names ("k_", "v_": aura_append).
void encode_table_checks(const Args& a, int cb, int bd, int mask, double bits, std::int64_t D,
                         const char* bits_name = "bits", const std::string& side = "") {
  check_bits(bits, bits_name);
  check_table(a, cb, (side + "codebook").c_str(), std::int64_t(1) << int(bits));
  check_table(a, bd, (side + "boundaries").c_str(), (std::int64_t(1) << int(bits)) - 1);
  check_mask(a, mask, (side + "sign_mask").c_str(), D);
}

// aura_encode over the rows of tensor `xi` (x): input, codebook, boundaries, sign mask bound.
Launch encode_launch(const Args& a, const TensorMeta& x, int lead, int cb, int bd, int mask, int xi = 0) {
  const std::int64_t D = x.size(-1);
  Launch l = row_launch(kernel_name("aura_encode", x.type(), D), rows_count(x, lead));
  bind(l, 0, a, xi);
  bind(l, 1, a, cb);
  bind(l, 2, a, bd);
  bind(l, 3, a, mask, xi);
  return l;
}

// aura_encode's write mode: rows go to the cache slots of `codes` [.., PW] / `norms`, contiguous (mode 1:
// [B, Hkv, T_cap]) or paged (mode 2: [num_blocks, page_size, Hkv]).
void set_cache_write(AuraRowParams& p, const TensorMeta& codes, const TensorMeta& norms, bool paged,
                     std::int64_t Hkv) {
  p.write_mode = paged ? 2 : 1;
  p.kv_heads = int(Hkv);
  p.slot_div = int(paged ? codes.size(1) : codes.size(2));
  p.slots = codes.size(0) * codes.size(paged ? 1 : 2);
  for (int d = 0; d < 3; ++d) p.cache_stride[d] = codes.stride(d), p.norms_cache_stride[d] = norms.stride(d);
}

AuraRowParams encode_params(const TensorMeta& x, int lead, int bits, bool has_mask) {
  AuraRowParams p{};
  p.in = rows_of(x, lead);
  p.rows = rows_count(x, lead), p.lead_dims = lead, p.bits = bits, p.has_mask = has_mask;
  p.factor = float(1.0 / std::sqrt(double(x.size(-1))));
  return p;
}

// ---- dequantize(codes, norms, codebook, sign_mask; bits, out_dtype)
std::int64_t dequantize_checks(const Args& a) {
  const TensorMeta& codes = a.t(0);
  if (codes.ndim < 1) fail("codes", "a tensor of rank >= 1", "a scalar");
  check(codes, "codes", codes.ndim, {DType::i32});
  check_bits(a.s(0), "bits");
  const std::int64_t D = codes.size(-1) * 32 / std::int64_t(a.s(0));
  if (codes.size(-1) * 32 % std::int64_t(a.s(0)) != 0) fail("codes.shape[-1]", "PW = head_dim * bits / 32", std::to_string(codes.size(-1)));
  check_dim_supported(D, "from codes.shape[-1]");
  check(a.t(1), "norms", codes.ndim - 1, {DType::f32}, false);
  for (int d = 0; d < codes.ndim - 1; ++d) check_dim(a.t(1), "norms", d, codes.size(d), "codes.shape[:-1]");
  check_table(a, 2, "codebook", std::int64_t(1) << int(a.s(0)));
  check_mask(a, 3, "sign_mask", D);
  return D;
}

DType out_dtype_or(const Args& a, int i, DType fallback) { return a.none(i) ? fallback : DType(int(a.s(i))); }

// ---- attention inputs (pass 1 and aura_decode): tensors q, kc, kn, vc, vn, seq, kcb, vcb at
// 0..7 and the block table at `table`; bits scalars at `bits`.
struct AttnShape {
  std::int64_t B, L, Hq, D, Hkv, capacity, page_size;
  bool causal;
};

AttnShape attention_checks(const Args& a, const char* qname, int table, int bits) {
  const TensorMeta& q = a.t(0);
  if (q.ndim != 3 && q.ndim != 4) fail(qname, "a 3-D or 4-D tensor", "shape " + shape_str(q));
  check(q, qname, q.ndim, kFloats);
  AttnShape s{};
  s.causal = q.ndim == 4, s.B = q.size(0), s.L = s.causal ? q.size(1) : 1, s.Hq = q.size(-2), s.D = q.size(-1);
  check_dim_supported(s.D, "q.shape[-1]");
  check_bits(a.s(bits), "key_bits");
  check_bits(a.s(bits + 1), "value_bits");
  const std::int64_t pwk = s.D * std::int64_t(a.s(bits)) / 32, pwv = s.D * std::int64_t(a.s(bits + 1)) / 32;
  check(a.t(1), "k_codes", 4, {DType::i32});
  check(a.t(3), "v_codes", 4, {DType::i32});
  check(a.t(2), "k_norms", 3, {DType::f32});
  check(a.t(4), "v_norms", 3, {DType::f32});
  check(a.t(5), "seq_lens", 1, {DType::i32}, false);
  check_dim(a.t(5), "seq_lens", 0, s.B, "batch of q");
  if (a.has(table)) {
    check(a.t(table), "block_table", 2, {DType::i32}, false);
    check_dim(a.t(table), "block_table", 0, s.B, "batch of q");
    s.page_size = a.t(1).size(1), s.Hkv = a.t(1).size(2), s.capacity = a.t(table).size(1) * s.page_size;
  } else {
    check_dim(a.t(1), "k_codes", 0, s.B, "batch of q");
    s.page_size = 0, s.Hkv = a.t(1).size(1), s.capacity = a.t(1).size(2);
  }
  check_dim(a.t(1), "k_codes", 3, pwk, "PW = head_dim * key_bits / 32");
  check_dim(a.t(3), "v_codes", 3, pwv, "PW = head_dim * value_bits / 32");
  for (int d = 0; d < 3; ++d) {
    check_dim(a.t(3), "v_codes", d, a.t(1).size(d), "k_codes.shape[:3]");
    check_dim(a.t(2), "k_norms", d, a.t(1).size(d), "k_codes.shape[:3]");
    check_dim(a.t(4), "v_norms", d, a.t(1).size(d), "k_codes.shape[:3]");
  }
  if (s.Hkv < 1 || s.Hq % s.Hkv != 0) fail(qname, "query heads a multiple of KV heads", std::to_string(s.Hq) + " vs " + std::to_string(s.Hkv));
  check_table(a, 6, "k_codebook", std::int64_t(1) << int(a.s(bits)));
  check_table(a, 7, "v_codebook", std::int64_t(1) << int(a.s(bits + 1)));
  return s;
}

std::vector<std::int64_t> lead_sizes(const AttnShape& s) {
  return s.causal ? std::vector<std::int64_t>{s.B, s.L, s.Hq} : std::vector<std::int64_t>{s.B, s.Hq};
}

std::vector<OutputSpec> partial_specs(const AttnShape& s, std::int64_t NB) {
  auto lead = lead_sizes(s);
  auto o = lead, ml = lead;
  o.push_back(NB), o.push_back(s.D), ml.push_back(NB);
  return {{DType::f32, o}, {DType::f32, ml}, {DType::f32, ml}};
}

// Pass 1 reading q (operand) and the cache tensors of `a` (indices 1..7, table), writing o, m, l.
void add_p1(PlanBuilder& pb, const Args& a, const AttnShape& s, const Operand& q, int table, int bits,
            std::int64_t block_size, const Operand& o, const Operand& m, const Operand& l) {
  const std::int64_t NB = ceil_div(s.capacity, block_size);
  AuraP1Params p{};
  const int qi = s.causal ? 1 : -1;  // non-causal q has no query dim: stride 0
  p.q_stride[0] = q.meta.stride(0), p.q_stride[1] = qi > 0 ? q.meta.stride(1) : 0, p.q_stride[2] = q.meta.stride(-2);
  for (int d = 0; d < 3; ++d) {
    p.k_stride[d] = a.t(1).stride(d), p.v_stride[d] = a.t(3).stride(d);
    p.kn_stride[d] = a.t(2).stride(d), p.vn_stride[d] = a.t(4).stride(d);
  }
  p.table_stride = a.has(table) ? a.t(table).stride(0) : 0;
  // o [B, (L,) Hq, NB, D], m / l [B, (L,) Hq, NB]: (b, i, h, n) strides, i = 0 when not causal
  const int off = s.causal ? 0 : 1;
  for (int d = 0, src = 0; d < 4; ++d) {
    if (d == 1 && off) {
      p.o_stride[d] = 0, p.ml_stride[d] = 0;
      continue;
    }
    p.o_stride[d] = o.meta.stride(src), p.ml_stride[d] = m.meta.stride(src);
    ++src;
  }
  if (l.meta.ndim != m.meta.ndim) fail("l", "the shape of m", shape_str(l.meta));
  for (int d = 0; d < m.meta.ndim; ++d)
    if (l.meta.strides[d] != m.meta.strides[d]) fail("l", "the strides of m", "different strides");
  p.batch = int(s.B), p.queries = int(s.L), p.q_heads = int(s.Hq), p.kv_heads = int(s.Hkv), p.group = int(s.Hq / s.Hkv);
  p.capacity = int(s.capacity), p.block_size = int(block_size), p.page_size = int(s.page_size);
  p.key_bits = int(a.s(bits)), p.value_bits = int(a.s(bits + 1));
  p.num_blocks = int(a.has(table) ? a.t(1).size(0) : 0);
  Launch launch;
  launch.kernel = kernel_name("aura_flash_p1", q.meta.type(), s.D);
  launch.groups = {std::uint32_t(NB), std::uint32_t(s.Hkv), std::uint32_t(s.B)};
  launch.group_size = {kAuraP1Simdgroups * 32, 1, 1};
  bind(launch, 0, q);
  for (int i = 1; i < 8; ++i) bind(launch, i, a, i);
  bind(launch, 8, a, table, 5);
  bind(launch, 9, o);
  bind(launch, 10, m);
  bind(launch, 11, l);
  set_params(launch, p, 12);
  if (NB * s.B > 0) pb.add(launch);
}

// Pass 2 over partials o [lead.., NB, D], m, l [lead.., NB] into out [lead.., D], lse [lead..].
void add_p2(PlanBuilder& pb, const Operand& o, const Operand& m, const Operand& l, const Operand& mask,
            const Operand& out, const Operand& lse) {
  const int lead = o.meta.ndim - 2;
  const std::int64_t D = o.meta.size(-1), rows = rows_count(o.meta, lead);
  AuraRowParams p{};
  p.in = rows_of(o.meta, lead), p.norms = rows_of(m.meta, lead), p.aux = rows_of(l.meta, lead);
  p.out = rows_of(out.meta, lead), p.out2 = rows_of(lse.meta, lead);
  p.block_stride[0] = o.meta.stride(-2), p.block_stride[1] = m.meta.stride(-1), p.block_stride[2] = l.meta.stride(-1);
  p.rows = rows, p.lead_dims = lead, p.blocks = int(o.meta.size(-2)), p.has_mask = mask.present();
  p.factor = float(1.0 / std::sqrt(double(D)));
  Launch launch = row_launch(kernel_name("aura_flash_p2", out.meta.type(), D), rows);
  bind(launch, 0, o);
  bind(launch, 1, m);
  bind(launch, 2, l);
  bind(launch, 3, mask, o.arg);
  bind(launch, 4, out);
  bind(launch, 5, lse);
  set_params(launch, p, 6);
  if (rows > 0) pb.add(launch);
}

// reference/aura.py decode_block_size: static values only, never seq_lens.
std::int64_t decode_block_size(std::int64_t capacity, std::int64_t page_size, std::int64_t num_splits) {
  constexpr std::int64_t kAutoBlockTokens = 256;
  std::int64_t bs = num_splits <= 0 ? kAutoBlockTokens : ceil_div(capacity, num_splits);
  bs = std::max<std::int64_t>(bs, 1);
  if (page_size) bs = ceil_div(bs, page_size) * page_size;
  return bs;
}

}  // namespace

std::vector<OutputSpec> specs_hadamard_rotate(const OpCall& call) {
  Args a(call, 2, 2, "hadamard_rotate");
  rotate_checks(a);
  const TensorMeta& x = a.t(0);
  return {{x.type(), sizes_of(x)}};
}

OpPlan plan_hadamard_rotate(const OpCall& call) {
  Args a(call, 2, 2, "hadamard_rotate");
  rotate_checks(a);
  PlanBuilder pb(call);
  add_rotate(pb, operand(a, 0), operand(a, 1), output_operand(a, 0), a.s(0), a.s(1) != 0);
  return pb.take();
}

std::vector<OutputSpec> specs_aura_encode(const OpCall& call) {
  Args a(call, 4, 1, "aura_encode");
  rotate_checks(Args(OpCall{{a.t(0), a.t(3)}, {1.0, 0.0}}, 2, 2, "aura_encode"));
  const TensorMeta& x = a.t(0);
  encode_table_checks(a, 1, 2, 3, a.s(0), x.size(-1));
  std::vector<std::int64_t> lead(x.sizes, x.sizes + x.ndim - 1), codes = lead;
  codes.push_back(x.size(-1) * std::int64_t(a.s(0)) / 32);
  return {{DType::i32, codes}, {DType::f32, lead}};
}

OpPlan plan_aura_encode(const OpCall& call) {
  specs_aura_encode(OpCall{{call.tensors.begin(), call.tensors.begin() + 4}, call.scalars});
  Args a(call, 4, 1, "aura_encode");
  const TensorMeta& x = a.t(0);
  const int lead = x.ndim - 1;
  AuraRowParams p = encode_params(x, lead, int(a.s(0)), a.has(3));
  p.out = rows_of(a.output(0), lead), p.norms = rows_of(a.output(1), lead);
  Launch l = encode_launch(a, x, lead, 1, 2, 3);
  bind(l, 4, a, 0);  // no slot mapping
  bind(l, 5, a, a.out(0));
  bind(l, 6, a, a.out(1));
  set_params(l, p, 7);
  PlanBuilder pb(call);
  if (p.rows > 0) pb.add(l);
  return pb.take();
}

// aura_write_cache(x, codes_cache, norms_cache, slot_mapping, codebook, boundaries, sign_mask;
// bits, paged)
OpPlan plan_aura_write_cache(const OpCall& call) {
  Args a(call, 7, 2, "aura_write_cache");
  const TensorMeta& x = a.t(0);
  check(x, "x", 3, kFloats);
  const std::int64_t N = x.size(0), Hkv = x.size(1), D = x.size(2);
  check_dim_supported(D, "x.shape[-1]");
  encode_table_checks(a, 4, 5, 6, a.s(0), D);
  const bool paged = a.s(1) != 0;
  check(a.t(1), "codes_cache", 4, {DType::i32});
  check(a.t(2), "norms_cache", 3, {DType::f32});
  check(a.t(3), "slot_mapping", 1, {DType::i64}, false);
  check_dim(a.t(3), "slot_mapping", 0, N, "one slot per row of x");
  if (a.t(3).stride(0) != 1 && N > 1) fail("slot_mapping", "a contiguous tensor", "strided");
  check_dim(a.t(1), "codes_cache", paged ? 2 : 1, Hkv, "Hkv of x");
  check_dim(a.t(1), "codes_cache", 3, D * std::int64_t(a.s(0)) / 32, "PW = head_dim * bits / 32");
  for (int d = 0; d < 3; ++d) check_dim(a.t(2), "norms_cache", d, a.t(1).size(d), "codes_cache.shape[:3]");
  AuraRowParams p = encode_params(x, 2, int(a.s(0)), a.has(6));
  set_cache_write(p, a.t(1), a.t(2), paged, Hkv);
  Launch l = encode_launch(a, x, 2, 4, 5, 6);
  bind(l, 4, a, 3);
  bind(l, 5, a, 1);
  bind(l, 6, a, 2);
  set_params(l, p, 7);
  PlanBuilder pb(call);
  if (N * Hkv > 0 && p.slots > 0) pb.add(l);
  return pb.take();
}

// aura_append(k, v, k_codes, k_norms, v_codes, v_norms, seq_lens, k_codebook, k_boundaries, v_codebook,
// v_boundaries, k_sign_mask, v_sign_mask, block_table; key_bits, value_bits): AuraCache.append as
// reference/aura.py append_with composes it, in three dispatches on one stream: aura_append_slots
// (each row's int64 slots from seq_lens into a workspace, then seq_lens += L), and aura_encode's
// write mode (the aura_write_cache launch) for K and for V over those slots. Nothing is read on the
// host. Data the reference rejects (a negative seq_lens, a block-table entry that is not a page)
// only skips the tokens concerned, as on CUDA.
namespace {
constexpr int kAppendK = 0, kAppendV = 1, kAppendKCodes = 2, kAppendSeqLens = 6, kAppendTable = 13;
constexpr std::int64_t kInt32Limit = std::int64_t(1) << 31;

// Tables and sign mask of one side (K: tensors 7, 8, 11, scalar 0; V: 9, 10, 12, scalar 1).
void append_table_checks(const Args& a, int side, std::int64_t D) {
  encode_table_checks(a, 7 + 2 * side, 8 + 2 * side, 11 + side, a.s(side), D, side == 0 ? "key_bits" : "value_bits",
                      side == 0 ? "k_" : "v_");
}

// One side's write: aura_encode in write mode over x [B, L, Hkv, D] (rows (b, i, h); row n = b * L + i
// of the slots), codes at `codes`, norms at `codes` + 1.
void add_append_write(PlanBuilder& pb, const Args& a, int side, bool paged, const Operand& slots) {
  const int x = side == 0 ? kAppendK : kAppendV, codes = kAppendKCodes + 2 * side;
  const TensorMeta& xm = a.t(x);
  AuraRowParams p = encode_params(xm, 3, int(a.s(side)), a.has(11 + side));
  set_cache_write(p, a.t(codes), a.t(codes + 1), paged, xm.size(2));
  Launch l = encode_launch(a, xm, 3, 7 + 2 * side, 8 + 2 * side, 11 + side, x);
  bind(l, 4, slots);
  bind(l, 5, a, codes);
  bind(l, 6, a, codes + 1);
  set_params(l, p, 7);
  if (p.rows > 0 && p.slots > 0) pb.add(l);
}
}  // namespace

OpPlan plan_aura_append(const OpCall& call) {
  Args a(call, 14, 2, "aura_append");
  const TensorMeta& k = a.t(kAppendK);
  const TensorMeta& v = a.t(kAppendV);
  check(k, "k", 4, kFloats);
  check(v, "v", 4, kFloats);
  if (v.type() != k.type())
    fail("v", std::string("the dtype of k (") + dtype_name(k.type()) + ")", dtype_name(v.type()));
  for (int d = 0; d < 4; ++d) check_dim(v, "v", d, k.size(d), "the shape of k [B, L, Hkv, D]");
  const std::int64_t B = k.size(0), L = k.size(1), Hkv = k.size(2), D = k.size(3);
  check_dim_supported(D, "k.shape[-1]");
  append_table_checks(a, 0, D);
  append_table_checks(a, 1, D);
  const bool paged = a.has(kAppendTable);
  const TensorMeta& kc = a.t(kAppendKCodes);
  check(kc, "k_codes", 4, {DType::i32});
  check(a.t(3), "k_norms", 3, {DType::f32});
  check(a.t(4), "v_codes", 4, {DType::i32});
  check(a.t(5), "v_norms", 3, {DType::f32});
  if (paged) {
    check(a.t(kAppendTable), "block_table", 2, {DType::i32}, false);
    check_dim(a.t(kAppendTable), "block_table", 0, B, "batch of k");
    check_dim(kc, "k_codes", 2, Hkv, "Hkv of k (paged [num_blocks, page_size, Hkv, PW])");
  } else {
    check_dim(kc, "k_codes", 0, B, "batch of k (contiguous [B, Hkv, T_cap, PW])");
    check_dim(kc, "k_codes", 1, Hkv, "Hkv of k (contiguous [B, Hkv, T_cap, PW])");
  }
  check_dim(kc, "k_codes", 3, D * std::int64_t(a.s(0)) / 32, "PW = head_dim * key_bits / 32");
  check_dim(a.t(4), "v_codes", 3, D * std::int64_t(a.s(1)) / 32, "PW = head_dim * value_bits / 32");
  for (int d = 0; d < 3; ++d) {
    check_dim(a.t(4), "v_codes", d, kc.size(d), "k_codes.shape[:3]");
    check_dim(a.t(3), "k_norms", d, kc.size(d), "k_codes.shape[:3]");
    check_dim(a.t(5), "v_norms", d, kc.size(d), "k_codes.shape[:3]");
  }
  check(a.t(kAppendSeqLens), "seq_lens", 1, {DType::i32}, false);
  check_dim(a.t(kAppendSeqLens), "seq_lens", 0, B, "batch of k");
  // the kernels' int arithmetic: positions, slots' divisor, rows of the encode grid
  const std::int64_t capacity = paged ? a.t(kAppendTable).size(1) * kc.size(1) : kc.size(2);
  if (capacity >= kInt32Limit) fail("k_codes", "fewer than 2^31 token slots per sequence", std::to_string(capacity));
  if (paged && kc.size(0) >= kInt32Limit) fail("k_codes", "fewer than 2^31 pages", std::to_string(kc.size(0)));
  if (B * L * std::max<std::int64_t>(Hkv, 1) >= kInt32Limit)
    fail("k", "B * L * Hkv < 2^31", std::to_string(B) + " * " + std::to_string(L) + " * " + std::to_string(Hkv));

  PlanBuilder pb(call);
  if (B * L == 0) return pb.take();  // nothing is written and seq_lens does not move
  const Operand slots = pb.workspace(DType::i64, {B * L});
  AuraAppendParams p{};
  p.seq_stride = a.t(kAppendSeqLens).stride(0);
  if (paged) p.table_stride[0] = a.t(kAppendTable).stride(0), p.table_stride[1] = a.t(kAppendTable).stride(1);
  p.tokens = int(L), p.capacity = int(capacity), p.paged = paged;
  p.page_size = paged ? int(kc.size(1)) : 0, p.num_blocks = paged ? int(kc.size(0)) : 0;
  Launch l;
  l.kernel = "aura_append_slots";
  l.groups = {std::uint32_t(B), 1, 1};
  l.group_size = {32, 1, 1};
  bind(l, 0, a, kAppendSeqLens);
  bind(l, 1, a, kAppendTable, kAppendSeqLens);
  bind(l, 2, slots);
  set_params(l, p, 3);
  pb.add(l);
  add_append_write(pb, a, 0, paged, slots);
  add_append_write(pb, a, 1, paged, slots);
  return pb.take();
}

std::vector<OutputSpec> specs_aura_dequantize(const OpCall& call) {
  Args a(call, 4, 2, "aura_dequantize");
  const std::int64_t D = dequantize_checks(a);
  const TensorMeta& codes = a.t(0);
  std::vector<std::int64_t> sizes(codes.sizes, codes.sizes + codes.ndim - 1);
  sizes.push_back(D);
  return {{out_dtype_or(a, 1, DType::f32), sizes}};
}

OpPlan plan_aura_dequantize(const OpCall& call) {
  Args a(call, 4, 2, "aura_dequantize");
  const std::int64_t D = dequantize_checks(a);
  const TensorMeta& codes = a.t(0);
  const int lead = codes.ndim - 1;
  AuraRowParams p{};
  p.in = rows_of(codes, lead), p.norms = rows_of(a.t(1), lead), p.out = rows_of(a.output(0), lead);
  p.rows = rows_count(codes, lead), p.lead_dims = lead, p.bits = int(a.s(0)), p.has_mask = a.has(3);
  p.factor = float(1.0 / std::sqrt(double(D)));
  Launch l = row_launch(kernel_name("aura_dequantize", a.output(0).type(), D), p.rows);
  bind(l, 0, a, 0);
  bind(l, 1, a, 1);
  bind(l, 2, a, 2);
  bind(l, 3, a, 3, 0);
  bind(l, 4, a, a.out(0));
  set_params(l, p, 5);
  PlanBuilder pb(call);
  if (p.rows > 0) pb.add(l);
  return pb.take();
}

// aura_flash_p1(q_rot, kc, kn, vc, vn, seq_lens, kcb, vcb, block_table; key_bits, value_bits,
// block_size)
std::vector<OutputSpec> specs_aura_flash_p1(const OpCall& call) {
  Args a(call, 9, 3, "aura_flash_p1");
  AttnShape s = attention_checks(a, "q_rot", 8, 0);
  if (a.n(2) < 1) fail("block_size", "a positive int", std::to_string(a.n(2)));
  return partial_specs(s, ceil_div(s.capacity, a.n(2)));
}

OpPlan plan_aura_flash_p1(const OpCall& call) {
  specs_aura_flash_p1(OpCall{{call.tensors.begin(), call.tensors.begin() + 9}, call.scalars});
  Args a(call, 9, 3, "aura_flash_p1");
  AttnShape s = attention_checks(a, "q_rot", 8, 0);
  PlanBuilder pb(call);
  add_p1(pb, a, s, operand(a, 0), 8, 0, a.n(2), output_operand(a, 0), output_operand(a, 1), output_operand(a, 2));
  return pb.take();
}

// aura_flash_p2(o, m, l, v_sign_mask; out_dtype)
std::vector<OutputSpec> specs_aura_flash_p2(const OpCall& call) {
  Args a(call, 4, 1, "aura_flash_p2");
  const TensorMeta& o = a.t(0);
  if (o.ndim != 4 && o.ndim != 5) fail("o", "a 4-D or 5-D tensor", "shape " + shape_str(o));
  check(o, "o", o.ndim, {DType::f32});
  check_dim_supported(o.size(-1), "o.shape[-1]");
  for (int i : {1, 2}) {
    check(a.t(i), i == 1 ? "m" : "l", o.ndim - 1, {DType::f32}, false);
    for (int d = 0; d < o.ndim - 1; ++d) check_dim(a.t(i), i == 1 ? "m" : "l", d, o.size(d), "o.shape[:-1]");
  }
  check_mask(a, 3, "v_sign_mask", o.size(-1));
  std::vector<std::int64_t> lead(o.sizes, o.sizes + o.ndim - 2), out = lead;
  out.push_back(o.size(-1));
  return {{out_dtype_or(a, 0, DType::f32), out}, {DType::f32, lead}};
}

OpPlan plan_aura_flash_p2(const OpCall& call) {
  specs_aura_flash_p2(OpCall{{call.tensors.begin(), call.tensors.begin() + 4}, call.scalars});
  Args a(call, 4, 1, "aura_flash_p2");
  PlanBuilder pb(call);
  add_p2(pb, operand(a, 0), operand(a, 1), operand(a, 2), operand(a, 3), output_operand(a, 0), output_operand(a, 1));
  return pb.take();
}

// aura_decode(q, kc, kn, vc, vn, seq_lens, kcb, vcb, k_sign_mask, v_sign_mask, block_table;
// key_bits, value_bits, scale, num_splits): rotate q with the scale folded in, pass 1, pass 2.
std::vector<OutputSpec> specs_aura_decode(const OpCall& call) {
  Args a(call, 11, 4, "aura_decode");
  AttnShape s = attention_checks(a, "q", 10, 0);
  if (!a.has(8)) fail("k_sign_mask", "an int32 tensor [head_dim // 32]", "None");
  if (!a.has(9)) fail("v_sign_mask", "an int32 tensor [head_dim // 32]", "None");
  check_mask(a, 8, "k_sign_mask", s.D);
  check_mask(a, 9, "v_sign_mask", s.D);
  if (a.n(3) < 0) fail("num_splits", "an int >= 0", std::to_string(a.n(3)));
  auto lead = lead_sizes(s), out = lead;
  out.push_back(s.D);
  return {{a.t(0).type(), out}, {DType::f32, lead}};
}

OpPlan plan_aura_decode(const OpCall& call) {
  specs_aura_decode(OpCall{{call.tensors.begin(), call.tensors.begin() + 11}, call.scalars});
  Args a(call, 11, 4, "aura_decode");
  AttnShape s = attention_checks(a, "q", 10, 0);
  PlanBuilder pb(call);
  const TensorMeta& q = a.t(0);
  Operand q_rot = pb.workspace(DType::f32, sizes_of(q));  // q rotated, scale folded in, fp32
  const std::int64_t bs = decode_block_size(s.capacity, s.page_size, a.n(3));
  const std::int64_t NB = ceil_div(s.capacity, bs);
  auto specs = partial_specs(s, NB);
  Operand o = pb.workspace(DType::f32, specs[0].sizes), m = pb.workspace(DType::f32, specs[1].sizes);
  Operand l = pb.workspace(DType::f32, specs[2].sizes);
  const double scale = a.none(2) ? 1.0 / std::sqrt(double(s.D)) : a.s(2);
  add_rotate(pb, operand(a, 0), operand(a, 8), q_rot, scale, false);
  add_p1(pb, a, s, q_rot, 10, 0, bs, o, m, l);
  add_p2(pb, o, m, l, operand(a, 9), output_operand(a, 0), output_operand(a, 1));
  return pb.take();
}

}  // namespace aura::mps
