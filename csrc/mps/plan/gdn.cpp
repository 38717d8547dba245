// Launch plans of the Gated DeltaNet family: the five chunk stages, their composition gdn_chunk,
// gdn_recurrent (kernels in csrc/mps/shaders/gdn.metal) and the front end's causal conv
// (gdn_conv.metal); order and rounding as torch_aura/reference/gdn.py.
#include <algorithm>

#include "../shaders/aura_params.h"
#include "plan_util.h"
#include "plans.h"

namespace aura::mps {
namespace {

constexpr std::initializer_list<DType> kFloats = {DType::f32, DType::f16, DType::bf16};

struct GdnShape {
  std::int64_t B = 0, T = 0, H = 0, HV = 0, K = 0, V = 0, N = 0;
  Operand cu;              // cu_seqlens (absent: fixed length)
  std::int64_t chunks = 0; // grid size over flat chunks (exact, or an upper bound for varlen)
};

void check_head_dim(std::int64_t d, const char* arg, const char* which) {
  if (d < 1 || d > kGdnMaxHeadDim) fail(arg, std::string("head dim ") + which + " (last dim) in 1..256", std::to_string(d));
}

// Key-like [B, T, H, K] and value-like [B, T, HV, V] operands of one dtype.
GdnShape check_k_v(const TensorMeta& k, const char* kn, const TensorMeta& v, const char* vn) {
  check(k, kn, 4, kFloats);
  check(v, vn, 4, {k.type()});
  GdnShape s;
  s.B = k.size(0), s.T = k.size(1), s.H = k.size(2), s.K = k.size(3), s.HV = v.size(2), s.V = v.size(3);
  check_dim(v, vn, 0, s.B, "B of the key tensor");
  check_dim(v, vn, 1, s.T, "T of the key tensor");
  check_head_dim(s.K, kn, "K");
  check_head_dim(s.V, vn, "V");
  if (s.H < 1 || s.HV % s.H != 0)
    fail(vn, "HV (value heads) to be a multiple of H (q/k heads)", std::to_string(s.HV) + " vs " + std::to_string(s.H));
  return s;
}

void check_bthv(const TensorMeta& t, const char* name, const GdnShape& s, std::initializer_list<DType> dtypes) {
  check(t, name, 3, dtypes);
  check_dim(t, name, 0, s.B, "B");
  check_dim(t, name, 1, s.T, "T");
  check_dim(t, name, 2, s.HV, "HV");
}

// cu_seqlens when given: int32 / int64 [N + 1], contiguous, batch B == 1 (`batch_arg` names the
// tensor B comes from). Sets N (B without cu_seqlens) and returns its operand.
Operand cu_seqlens(const Args& a, int cu_arg, std::int64_t B, const char* batch_arg, std::int64_t& N) {
  N = B;
  if (!a.has(cu_arg)) return {};
  const TensorMeta& cu = a.t(cu_arg);
  check(cu, "cu_seqlens", 1, {DType::i32, DType::i64}, false);
  if (cu.stride(0) != 1 && cu.size(0) > 1) fail("cu_seqlens", "a contiguous tensor", "strided");
  if (B != 1) fail(batch_arg, "batch size B == 1 when cu_seqlens is given", "B = " + std::to_string(B));
  N = cu.size(0) - 1;
  if (N < 0) fail("cu_seqlens", "shape [N+1] with N >= 0", "an empty tensor");
  return operand(a, cu_arg);
}

bool cu_is_i64(const Operand& cu) { return cu.present() && cu.meta.type() == DType::i64; }

// Varlen metadata: sets N, cu and the chunk grid (chunk_indices' row count when given, else the
// bound T / 64 + N: each sequence adds at most one partial chunk; kernels skip the surplus).
void varlen(GdnShape& s, const Args& a, int cu_arg, int ci_arg) {
  const std::int64_t bt = kGdnChunk;
  s.chunks = ceil_div(s.T, bt);
  s.cu = cu_seqlens(a, cu_arg, s.B, "q", s.N);
  if (!s.cu.present()) {
    if (ci_arg >= 0 && a.has(ci_arg)) fail("chunk_indices", "None when cu_seqlens is None", "a tensor");
    return;
  }
  s.chunks = ci_arg >= 0 && a.has(ci_arg) ? a.t(ci_arg).size(0) : s.T / bt + s.N;
}

GdnStrides strides_of(const TensorMeta& t) {
  return t.defined ? GdnStrides{t.stride(0), t.stride(1), t.ndim > 2 ? t.stride(2) : 0} : GdnStrides{0, 0, 0};
}

GdnParams base_params(const GdnShape& s) {
  GdnParams p{};
  p.batch = int(s.B), p.tokens = int(s.T), p.heads = int(s.H), p.v_heads = int(s.HV);
  p.key_dim = int(s.K), p.value_dim = int(s.V), p.sequences = int(s.N);
  p.varlen = s.cu.present();
  p.cu_is_i64 = cu_is_i64(s.cu);
  return p;
}

// Every GDN kernel takes its tensors at slots 0.. in order and its parameters right after; an
// absent optional is bound to the first operand (the parameters tell the kernel not to read it).
template <class P>
void add_stage(PlanBuilder& pb, const std::string& kernel, Dim3 groups, std::uint32_t threads,
               std::initializer_list<Operand> operands, const P& params) {
  Launch l;
  l.kernel = kernel;
  l.groups = groups;
  l.group_size = {threads, 1, 1};
  int slot = 0;
  for (const Operand& x : operands) bind(l, slot++, x, operands.begin()->arg);
  set_params(l, params, slot);
  pb.add(l);
}

std::uint32_t u32(std::int64_t x) { return std::uint32_t(x); }

// x as contiguous fp32: itself when it already is fp32, else a cast into a workspace. Kernels
// read fp32 g, beta and initial states, as the reference upcasts them on load.
Operand as_f32(PlanBuilder& pb, const Operand& x) {
  if (!x.present() || x.meta.type() == DType::f32) return x;
  const TensorMeta& m = x.meta;
  CastParams p{};
  const int pad = 4 - m.ndim;
  for (int d = 0; d < 4; ++d) {
    p.sizes[d] = d < pad ? 1 : m.sizes[d - pad];
    p.strides[d] = d < pad ? 0 : m.strides[d - pad];
  }
  p.numel = m.numel();
  Operand y = pb.workspace(DType::f32, sizes_of(m));  // the contiguous layout of x's shape
  if (p.numel > 0) add_stage(pb, host_name("gdn_cast_f32", m.type()), {u32(ceil_div(p.numel, 256)), 1, 1}, 256, {x, y}, p);
  return y;
}

void add_cumsum(PlanBuilder& pb, const GdnShape& s, const Operand& g, const Operand& g_cum) {
  GdnParams p = base_params(s);
  p.g = strides_of(g.meta), p.o = strides_of(g_cum.meta);
  add_stage(pb, host_name("gdn_chunk_cumsum", g.meta.type()), {u32(s.chunks), u32(s.B), 1}, 64, {g, s.cu, g_cum}, p);
}

void add_kkt(PlanBuilder& pb, const GdnShape& s, const Operand& k, const Operand& g_cum, const Operand& beta32,
             const Operand& ai) {
  GdnParams p = base_params(s);
  p.k = strides_of(k.meta), p.g = strides_of(g_cum.meta), p.beta = strides_of(beta32.meta), p.ai = strides_of(ai.meta);
  add_stage(pb, host_name("gdn_kkt_solve", k.meta.type()), {u32(s.chunks), u32(s.HV), u32(s.B)}, 256,
            {k, g_cum, beta32, s.cu, ai}, p);
}

void add_w_u(PlanBuilder& pb, const GdnShape& s, const Operand& k, const Operand& v, const Operand& beta32,
             const Operand& ai, const Operand& g_cum, const Operand& w, const Operand& u) {
  GdnParams p = base_params(s);
  p.k = strides_of(k.meta), p.v = strides_of(v.meta), p.beta = strides_of(beta32.meta), p.ai = strides_of(ai.meta);
  p.g = strides_of(g_cum.meta), p.w = strides_of(w.meta), p.u = strides_of(u.meta);
  add_stage(pb, host_name("gdn_recompute_w_u", k.meta.type()), {u32(s.chunks), u32(s.HV), u32(s.B)}, 128,
            {k, v, beta32, ai, g_cum, s.cu, w, u}, p);
}

void add_fwd_h(PlanBuilder& pb, const GdnShape& s, const Operand& k, const Operand& w, const Operand& u,
               const Operand& g_cum, const Operand& init32, bool v_first, const Operand& h, const Operand& v_new,
               const Operand& final_state) {
  GdnParams p = base_params(s);
  p.k = strides_of(k.meta), p.w = strides_of(w.meta), p.u = strides_of(u.meta), p.g = strides_of(g_cum.meta);
  p.o = strides_of(v_new.meta);
  for (int i = 0; i < 4; ++i) p.h_stride[i] = h.meta.stride(i);
  p.h_rows = int(h.meta.size(1));
  for (int i = 0; i < 3; ++i) {
    p.state_stride[i] = init32.present() ? init32.meta.stride(i) : 0;
    p.final_stride[i] = final_state.meta.stride(i);
  }
  p.state_v_first = v_first, p.has_state = init32.present();
  if (s.N > 0)
    add_stage(pb, host_name("gdn_fwd_h", k.meta.type()), {u32(ceil_div(s.V, kGdnStateTile)), u32(s.HV), u32(s.N)}, 128,
              {k, w, u, g_cum, init32, s.cu, h, v_new, final_state}, p);
}

void add_fwd_o(PlanBuilder& pb, const GdnShape& s, const Operand& q, const Operand& k, const Operand& v_new,
               const Operand& h, const Operand& g_cum, double scale, bool v_first, const Operand& o) {
  GdnParams p = base_params(s);
  p.q = strides_of(q.meta), p.k = strides_of(k.meta), p.v = strides_of(v_new.meta), p.g = strides_of(g_cum.meta);
  p.o = strides_of(o.meta);
  for (int i = 0; i < 4; ++i) p.h_stride[i] = h.meta.stride(i);
  p.state_v_first = v_first, p.scale = float(scale);
  add_stage(pb, host_name("gdn_fwd_o", q.meta.type()), {u32(ceil_div(s.V, kGdnOutTile)), u32(s.chunks), u32(s.B * s.HV)},
            128, {q, k, v_new, h, g_cum, s.cu, o}, p);
}

double scale_or_default(const Args& a, int i, std::int64_t K) { return a.none(i) ? 1.0 / std::sqrt(double(K)) : a.s(i); }

// ---- gdn_chunk_cumsum(g, cu_seqlens, chunk_indices)
GdnShape cumsum_shape(const Args& a) {
  check(a.t(0), "g", 3, kFloats);
  GdnShape s;
  s.B = a.t(0).size(0), s.T = a.t(0).size(1), s.HV = a.t(0).size(2), s.H = 1;
  varlen(s, a, 1, 2);
  return s;
}

// ---- gdn_kkt_solve(k, g_cum, beta, cu_seqlens, chunk_indices)
GdnShape kkt_shape(const Args& a) {
  check(a.t(0), "k", 4, kFloats);
  GdnShape s;
  s.B = a.t(0).size(0), s.T = a.t(0).size(1), s.H = a.t(0).size(2), s.K = a.t(0).size(3);
  check_head_dim(s.K, "k", "K");
  check(a.t(1), "g_cum", 3, {DType::f32});
  s.HV = a.t(1).size(2);
  if (s.HV % s.H != 0) fail("g_cum", "HV (value heads) to be a multiple of H (q/k heads)", std::to_string(s.HV));
  check_bthv(a.t(1), "g_cum", s, {DType::f32});
  check_bthv(a.t(2), "beta", s, kFloats);
  varlen(s, a, 3, 4);
  return s;
}

// ---- gdn_recompute_w_u(k, v, beta, Ai, g_cum, cu_seqlens, chunk_indices)
GdnShape w_u_shape(const Args& a) {
  GdnShape s = check_k_v(a.t(0), "k", a.t(1), "v");
  check_bthv(a.t(2), "beta", s, kFloats);
  check(a.t(3), "Ai", 4, {a.t(0).type()});
  check_bthv(a.t(4), "g_cum", s, {DType::f32});
  for (int i = 0; i < 3; ++i) check_dim(a.t(3), "Ai", i, i == 2 ? s.HV : a.t(0).size(i), "[B, T, HV, 64]");
  check_dim(a.t(3), "Ai", 3, kGdnChunk, "[B, T, HV, 64] from gdn_kkt_solve");
  varlen(s, a, 5, 6);
  return s;
}

// ---- gdn_fwd_h(k, w, u, g_cum, initial_state, cu_seqlens, chunk_indices; state_v_first)
GdnShape fwd_h_shape(const Args& a) {
  GdnShape s = check_k_v(a.t(0), "k", a.t(2), "u");
  check(a.t(1), "w", 4, {a.t(0).type()});
  for (int i = 0; i < 4; ++i) check_dim(a.t(1), "w", i, i == 2 ? s.HV : a.t(0).size(i), "[B, T, HV, K]");
  check_bthv(a.t(3), "g_cum", s, {DType::f32});
  varlen(s, a, 5, 6);
  if (s.cu.present() && !a.has(6)) fail("chunk_indices", "a [NT_total, 2] int32 tensor when cu_seqlens is given", "None");
  return s;
}

void check_state(const TensorMeta& t, const char* name, const GdnShape& s, bool v_first, bool pool) {
  check(t, name, 4, kFloats);
  if (!pool) check_dim(t, name, 0, s.N, "N, one state per sequence");
  check_dim(t, name, 1, s.HV, "HV");
  check_dim(t, name, 2, v_first ? s.V : s.K, v_first ? "V (state_v_first)" : "K");
  check_dim(t, name, 3, v_first ? s.K : s.V, v_first ? "K (state_v_first)" : "V");
}

// ---- gdn_fwd_o(q, k, v_new, h, g_cum, cu_seqlens, chunk_indices; scale, state_v_first)
GdnShape fwd_o_shape(const Args& a) {
  GdnShape s = check_k_v(a.t(0), "q", a.t(2), "v_new");
  check(a.t(1), "k", 4, {a.t(0).type()});
  for (int i = 0; i < 4; ++i) check_dim(a.t(1), "k", i, a.t(0).size(i), "the shape of q");
  check(a.t(3), "h", 5, {a.t(0).type()});
  check_bthv(a.t(4), "g_cum", s, {DType::f32});
  varlen(s, a, 5, 6);
  const bool v_first = a.s(1) != 0;
  check_dim(a.t(3), "h", 0, s.B, "B");
  if (!s.cu.present()) check_dim(a.t(3), "h", 1, s.chunks, "NT, the chunks of T");
  s.chunks = a.t(3).size(1);  // the kernel skips chunk ids past the last one
  check_dim(a.t(3), "h", 2, s.HV, "HV");
  check_dim(a.t(3), "h", 3, v_first ? s.V : s.K, "the state rows");
  check_dim(a.t(3), "h", 4, v_first ? s.K : s.V, "the state columns");
  return s;
}

// ---- gdn_chunk / gdn_recurrent inputs: q, k, v, g, beta
GdnShape qkv_shape(const Args& a) {
  check(a.t(0), "q", 4, kFloats);
  check(a.t(1), "k", 4, {a.t(0).type()});
  for (int i = 0; i < 4; ++i) check_dim(a.t(1), "k", i, a.t(0).size(i), "the shape of q");
  GdnShape s = check_k_v(a.t(1), "k", a.t(2), "v");
  check_bthv(a.t(3), "g", s, kFloats);
  check_bthv(a.t(4), "beta", s, kFloats);
  return s;
}

}  // namespace

std::vector<OutputSpec> specs_gdn_chunk_cumsum(const OpCall& call) {
  Args a(call, 3, 0, "gdn_chunk_cumsum");
  GdnShape s = cumsum_shape(a);
  return {{DType::f32, {s.B, s.T, s.HV}}};
}

OpPlan plan_gdn_chunk_cumsum(const OpCall& call) {
  Args a(call, 3, 0, "gdn_chunk_cumsum");
  GdnShape s = cumsum_shape(a);
  PlanBuilder pb(call);
  if (s.chunks * s.B > 0) add_cumsum(pb, s, operand(a, 0), output_operand(a, 0));
  return pb.take();
}

std::vector<OutputSpec> specs_gdn_kkt_solve(const OpCall& call) {
  Args a(call, 5, 0, "gdn_kkt_solve");
  GdnShape s = kkt_shape(a);
  return {{a.t(0).type(), {s.B, s.T, s.HV, kGdnChunk}}};
}

OpPlan plan_gdn_kkt_solve(const OpCall& call) {
  Args a(call, 5, 0, "gdn_kkt_solve");
  GdnShape s = kkt_shape(a);
  PlanBuilder pb(call);
  if (s.chunks * s.B * s.HV > 0) add_kkt(pb, s, operand(a, 0), operand(a, 1), as_f32(pb, operand(a, 2)), output_operand(a, 0));
  return pb.take();
}

std::vector<OutputSpec> specs_gdn_recompute_w_u(const OpCall& call) {
  Args a(call, 7, 0, "gdn_recompute_w_u");
  GdnShape s = w_u_shape(a);
  return {{a.t(0).type(), {s.B, s.T, s.HV, s.K}}, {a.t(1).type(), {s.B, s.T, s.HV, s.V}}};
}

OpPlan plan_gdn_recompute_w_u(const OpCall& call) {
  Args a(call, 7, 0, "gdn_recompute_w_u");
  GdnShape s = w_u_shape(a);
  PlanBuilder pb(call);
  if (s.chunks * s.B * s.HV > 0)
    add_w_u(pb, s, operand(a, 0), operand(a, 1), as_f32(pb, operand(a, 2)), operand(a, 3), operand(a, 4),
            output_operand(a, 0), output_operand(a, 1));
  return pb.take();
}

std::vector<OutputSpec> specs_gdn_fwd_h(const OpCall& call) {
  Args a(call, 7, 1, "gdn_fwd_h");
  GdnShape s = fwd_h_shape(a);
  const bool v_first = a.s(0) != 0;
  const std::int64_t r = v_first ? s.V : s.K, c = v_first ? s.K : s.V;
  if (a.has(4)) check_state(a.t(4), "initial_state", s, v_first, false);
  return {{a.t(0).type(), {s.B, s.chunks, s.HV, r, c}}, {a.t(2).type(), {s.B, s.T, s.HV, s.V}}, {DType::f32, {s.N, s.HV, r, c}}};
}

OpPlan plan_gdn_fwd_h(const OpCall& call) {
  specs_gdn_fwd_h(OpCall{{call.tensors.begin(), call.tensors.begin() + 7}, call.scalars});
  Args a(call, 7, 1, "gdn_fwd_h");
  GdnShape s = fwd_h_shape(a);
  PlanBuilder pb(call);
  add_fwd_h(pb, s, operand(a, 0), operand(a, 1), operand(a, 2), operand(a, 3), as_f32(pb, operand(a, 4)), a.s(0) != 0,
            output_operand(a, 0), output_operand(a, 1), output_operand(a, 2));
  return pb.take();
}

std::vector<OutputSpec> specs_gdn_fwd_o(const OpCall& call) {
  Args a(call, 7, 2, "gdn_fwd_o");
  GdnShape s = fwd_o_shape(a);
  return {{a.t(0).type(), {s.B, s.T, s.HV, s.V}}};
}

OpPlan plan_gdn_fwd_o(const OpCall& call) {
  Args a(call, 7, 2, "gdn_fwd_o");
  GdnShape s = fwd_o_shape(a);
  PlanBuilder pb(call);
  if (s.chunks * s.B * s.HV > 0)
    add_fwd_o(pb, s, operand(a, 0), operand(a, 1), operand(a, 2), operand(a, 3), operand(a, 4),
              scale_or_default(a, 0, s.K), a.s(1) != 0, output_operand(a, 0));
  return pb.take();
}

// gdn_chunk(q, k, v, g, beta, initial_state, cu_seqlens, chunk_indices; scale, use_qk_l2norm,
// state_v_first): the stages of reference/gdn.py gdn_chunk, intermediates in workspaces.
std::vector<OutputSpec> specs_gdn_chunk(const OpCall& call) {
  Args a(call, 8, 3, "gdn_chunk");
  GdnShape s = qkv_shape(a);
  varlen(s, a, 6, 7);
  const bool v_first = a.s(2) != 0;
  if (a.has(5)) check_state(a.t(5), "initial_state", s, v_first, false);
  return {{a.t(0).type(), {s.B, s.T, s.HV, s.V}}, {DType::f32, {s.N, s.HV, v_first ? s.V : s.K, v_first ? s.K : s.V}}};
}

OpPlan plan_gdn_chunk(const OpCall& call) {
  specs_gdn_chunk(OpCall{{call.tensors.begin(), call.tensors.begin() + 8}, call.scalars});
  Args a(call, 8, 3, "gdn_chunk");
  GdnShape s = qkv_shape(a);
  varlen(s, a, 6, 7);
  const bool v_first = a.s(2) != 0;
  const DType T = a.t(0).type();
  PlanBuilder pb(call);
  Operand q = operand(a, 0), k = operand(a, 1);
  if (a.s(1) != 0 && s.B * s.T * s.H > 0) {
    // normalised in fp32, rounded to the input dtype (reference gdn_chunk)
    Operand qn = pb.workspace(T, {s.B, s.T, s.H, s.K}), kn = pb.workspace(T, {s.B, s.T, s.H, s.K});
    for (auto [src, dst] : {std::pair{q, qn}, std::pair{k, kn}}) {
      GdnParams p = base_params(s);
      p.q = strides_of(src.meta);
      add_stage(pb, host_name("gdn_l2norm", T), {u32(s.B * s.T * s.H), 1, 1}, 32, {src, dst}, p);
    }
    q = qn, k = kn;
  }
  Operand beta32 = as_f32(pb, operand(a, 4)), init32 = as_f32(pb, operand(a, 5));
  Operand g_cum = pb.workspace(DType::f32, {s.B, s.T, s.HV});
  Operand ai = pb.workspace(T, {s.B, s.T, s.HV, kGdnChunk});
  Operand w = pb.workspace(T, {s.B, s.T, s.HV, s.K}), u = pb.workspace(T, {s.B, s.T, s.HV, s.V});
  const std::int64_t r = v_first ? s.V : s.K, c = v_first ? s.K : s.V;
  Operand h = pb.workspace(T, {s.B, std::max<std::int64_t>(s.chunks, 1), s.HV, r, c});
  Operand v_new = pb.workspace(T, {s.B, s.T, s.HV, s.V});
  if (s.chunks * s.B * s.HV > 0) {
    add_cumsum(pb, s, operand(a, 3), g_cum);
    add_kkt(pb, s, k, g_cum, beta32, ai);
    add_w_u(pb, s, k, operand(a, 2), beta32, ai, g_cum, w, u);
  }
  add_fwd_h(pb, s, k, w, u, g_cum, init32, v_first, h, v_new, output_operand(a, 1));
  if (s.chunks * s.B * s.HV > 0)
    add_fwd_o(pb, s, q, k, v_new, h, g_cum, scale_or_default(a, 0, s.K), v_first, output_operand(a, 0));
  return pb.take();
}

// gdn_recurrent(q, k, v, g, beta, state, state_indices, cu_seqlens; scale, use_qk_l2norm,
// state_v_first)
std::vector<OutputSpec> specs_gdn_recurrent(const OpCall& call) {
  Args a(call, 8, 3, "gdn_recurrent");
  GdnShape s = qkv_shape(a);
  varlen(s, a, 7, -1);
  check_state(a.t(5), "state", s, a.s(2) != 0, true);
  if (a.has(6)) {
    check(a.t(6), "state_indices", 1, {DType::i32});  // read densely by the kernel
    check_dim(a.t(6), "state_indices", 0, s.N, "one pool row per sequence, -1 = skip");
  } else if (a.t(5).size(0) < s.N) {
    fail("state", "at least N = " + std::to_string(s.N) + " pool rows", std::to_string(a.t(5).size(0)) + " rows");
  }
  return {{a.t(0).type(), {s.B, s.T, s.HV, s.V}}};
}

OpPlan plan_gdn_recurrent(const OpCall& call) {
  specs_gdn_recurrent(OpCall{{call.tensors.begin(), call.tensors.begin() + 8}, call.scalars});
  Args a(call, 8, 3, "gdn_recurrent");
  GdnShape s = qkv_shape(a);
  varlen(s, a, 7, -1);
  PlanBuilder pb(call);
  Operand g32 = as_f32(pb, operand(a, 3)), beta32 = as_f32(pb, operand(a, 4));
  const Operand o = output_operand(a, 0);
  GdnParams p = base_params(s);
  p.q = strides_of(a.t(0)), p.k = strides_of(a.t(1)), p.v = strides_of(a.t(2));
  p.g = strides_of(g32.meta), p.beta = strides_of(beta32.meta), p.o = strides_of(o.meta);
  for (int i = 0; i < 3; ++i) p.state_stride[i] = a.t(5).stride(i);
  p.state_v_first = a.s(2) != 0, p.has_indices = a.has(6), p.use_l2norm = a.s(1) != 0;
  p.pool_rows = int(a.t(5).size(0));
  p.scale = float(scale_or_default(a, 0, s.K));
  if (s.N * s.HV > 0)
    add_stage(pb, "gdn_recurrent_" + std::string(dtype_name(a.t(0).type())) + "_" + dtype_name(a.t(5).type()),
              {u32(ceil_div(s.V, kGdnStateTile)), u32(s.HV), u32(s.N)}, 128,
              {operand(a, 0), operand(a, 1), operand(a, 2), g32, beta32, operand(a, 5), operand(a, 6), s.cu, o}, p);
  return pb.take();
}

// ======================================================================== the front end (ops.md §3b)
namespace {

static_assert(int(DType::f32) == kConvF32 && int(DType::f16) == kConvF16 && int(DType::bf16) == kConvBF16,
              "gdn_conv.metal reads weight and bias by DType code");

// activation None, "silu" or "swish" (transformers' name for SiLU): whether SiLU follows the conv.
bool conv_silu(const std::optional<std::string>& activation) {
  if (!activation) return false;
  if (*activation != "silu" && *activation != "swish")
    fail("activation", "None, \"silu\" or \"swish\"", "\"" + *activation + "\"");
  return true;
}

// weight [C, W], bias [C] and conv_state [rows, C, S >= max(W - 1, 1)] (its rows checked by the
// caller), whatever float dtypes each; the fields of ConvParams both ops share. conv_state may have
// any strides (it is written through them), but no zero stride: aliased entries would race.
ConvParams conv_params(const Args& a, int weight, int bias, int state, std::int64_t C) {
  const TensorMeta& w = a.t(weight);
  check(w, "weight", 2, kFloats);
  check_dim(w, "weight", 0, C, "C, one filter per channel of x");
  const std::int64_t W = w.size(1);
  if (W < 1 || W > kConvMaxWidth) fail("weight", "W (taps, weight.shape[1]) in 1..8", std::to_string(W));
  ConvParams p{};
  p.channels = int(C), p.width = int(W);
  p.weight_dtype = int(w.type()), p.weight_stride = w.stride(0);
  p.bias_dtype = kConvAbsent;
  if (a.has(bias)) {
    check(a.t(bias), "bias", 1, kFloats, false);
    check_dim(a.t(bias), "bias", 0, C, "one per channel of x");
    p.bias_dtype = int(a.t(bias).type()), p.bias_stride = a.t(bias).stride(0);
  }
  if (a.has(state)) {
    const TensorMeta& st = a.t(state);
    check(st, "conv_state", 3, kFloats, false);
    for (int d = 0; d < 3; ++d)
      if (st.stride(d) == 0 && st.size(d) > 1)
        fail("conv_state", "a tensor whose elements do not alias (no zero stride; .clone() makes one)",
             "strides (" + std::to_string(st.stride(0)) + ", " + std::to_string(st.stride(1)) + ", " +
                 std::to_string(st.stride(2)) + ")");
    check_dim(st, "conv_state", 1, C, "C, the channels of x");
    if (st.size(2) < std::max<std::int64_t>(W - 1, 1))
      fail("conv_state", "S = shape[2] >= max(W - 1, 1) inputs of left context", std::to_string(st.size(2)));
    p.has_state = 1, p.state_len = int(st.size(2)), p.pool_rows = int(st.size(0));
    for (int d = 0; d < 3; ++d) p.state_stride[d] = st.stride(d);
  }
  p.silu = conv_silu(a.str(0));
  return p;
}

// causal_conv1d(x, weight, bias, conv_state, cu_seqlens; activation): x [B, T, C], conv_state
// [N, C, S]. Sets cu.
ConvParams conv1d_params(const Args& a, Operand& cu) {
  const TensorMeta& x = a.t(0);
  check(x, "x", 3, kFloats);
  ConvParams p = conv_params(a, 1, 2, 3, x.size(2));
  std::int64_t N = 0;
  cu = cu_seqlens(a, 4, x.size(0), "x", N);
  if (p.has_state) check_dim(a.t(3), "conv_state", 0, N, "N, one row per sequence");
  p.batch = int(x.size(0)), p.tokens = int(x.size(1)), p.sequences = int(N);
  p.varlen = cu.present(), p.cu_is_i64 = cu_is_i64(cu);
  p.x_stride[0] = x.stride(0), p.x_stride[1] = x.stride(1);
  return p;
}

// causal_conv1d_update(x, conv_state, weight, bias, state_indices; activation): x [N, C] or
// [N, L, C] (sequence n is batch row n), conv_state a pool [P, C, S].
ConvParams conv_update_params(const Args& a) {
  const TensorMeta& x = a.t(0);
  if (x.ndim != 2 && x.ndim != 3) fail("x", "a 2-D [N, C] or 3-D [N, L, C] tensor", "shape " + shape_str(x));
  check(x, "x", x.ndim, kFloats);
  check(a.t(1), "conv_state", 3, kFloats, false);  // required here; conv_params checks the rest
  ConvParams p = conv_params(a, 2, 3, 1, x.size(-1));
  const std::int64_t N = x.size(0);
  if (a.has(4)) {
    check(a.t(4), "state_indices", 1, {DType::i32});
    check_dim(a.t(4), "state_indices", 0, N, "one pool row per sequence, -1 = skip");
    p.has_indices = 1;
  } else if (p.pool_rows < N) {
    fail("conv_state", "at least N = " + std::to_string(N) + " pool rows", std::to_string(p.pool_rows) + " rows");
  }
  p.batch = int(N), p.tokens = x.ndim == 3 ? int(x.size(1)) : 1, p.sequences = int(N);
  p.x_stride[0] = x.stride(0), p.x_stride[1] = x.ndim == 3 ? x.stride(1) : 0;
  return p;
}

// The conv, then (when a thread does not hold a whole sequence) the state roll as a second
// dispatch, so that every thread has read its context before any row changes. Operands in
// gdn_conv.metal's slot order: x, weight, bias, conv_state, cu_seqlens, state_indices, y.
OpPlan conv_plan(const OpCall& call, ConvParams p, std::initializer_list<Operand> operands) {
  PlanBuilder pb(call);
  const Operand& x = operands.begin()[0];
  const Operand& state = operands.begin()[3];
  if (std::int64_t(p.batch) * p.tokens * p.channels * p.sequences == 0) return pb.take();
  const std::string types = std::string(dtype_name(x.meta.type())) + "_" +
                            dtype_name(state.present() ? state.meta.type() : x.meta.type());
  const std::uint32_t channel_groups = u32(ceil_div(p.channels, kConvChannelTile));
  p.tile = int(kConvTokenTile);
  const bool whole = !p.varlen && p.tokens <= p.tile;  // one thread per sequence and channel
  p.shift_state = whole && p.has_state;
  add_stage(pb, "causal_conv1d_" + types, {channel_groups, u32(ceil_div(p.tokens, p.tile)), u32(p.batch)},
            kConvChannelTile, operands, p);
  if (p.has_state && !whole)
    add_stage(pb, "causal_conv1d_shift_state_" + types, {channel_groups, u32(p.sequences), 1}, kConvChannelTile,
              operands, p);
  return pb.take();
}

}  // namespace

std::vector<OutputSpec> specs_causal_conv1d(const OpCall& call) {
  Args a(call, 5, 0, "causal_conv1d", 1);
  Operand cu;
  conv1d_params(a, cu);
  return {{a.t(0).type(), sizes_of(a.t(0))}};
}

OpPlan plan_causal_conv1d(const OpCall& call) {
  Args a(call, 5, 0, "causal_conv1d", 1);
  Operand cu;
  ConvParams p = conv1d_params(a, cu);
  return conv_plan(call, p, {operand(a, 0), operand(a, 1), operand(a, 2), operand(a, 3), cu, {}, output_operand(a, 0)});
}

std::vector<OutputSpec> specs_causal_conv1d_update(const OpCall& call) {
  Args a(call, 5, 0, "causal_conv1d_update", 1);
  conv_update_params(a);
  return {{a.t(0).type(), sizes_of(a.t(0))}};
}

OpPlan plan_causal_conv1d_update(const OpCall& call) {
  Args a(call, 5, 0, "causal_conv1d_update", 1);
  ConvParams p = conv_update_params(a);
  return conv_plan(call, p, {operand(a, 0), operand(a, 2), operand(a, 3), operand(a, 1), {}, operand(a, 4),
                             output_operand(a, 0)});
}

}  // namespace aura::mps
