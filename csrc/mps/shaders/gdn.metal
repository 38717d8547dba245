// Gated DeltaNet (docs/gdn.md) for the MPS backend: the five chunked stages, the qk l2norm and the
// token-by-token recurrence. Stage order and rounding points follow torch_aura/reference/gdn.py:
// fp32 math, 64-token chunk tiles zero-filled past a sequence's end, and a round trip to the input
// dtype T exactly where the reference calls _rnd (a kernel storing a 16-bit intermediate).
// Any T, any K and V up to 256; the MMA stages pad partial 8x8 tiles with zeros.
#include "aura_compat.h"
#include "aura_params.h"
#include "gdn_varlen.h"

constant constexpr int BT = kGdnChunk;
// g is read as clamp(g, GDN_G_MIN, 0): reference/gdn.py G_MIN says why (-inf: full forget, no NaN)
constant constexpr float GDN_G_MIN = -20.0f;

// g as every GDN op reads it: a log decay clamped to [GDN_G_MIN, 0] (-inf and g > 0 included).
inline float gdn_decay_log(float g) { return min(max(g, GDN_G_MIN), 0.0f); }

// Rounds x to T and back: a 16-bit store and reload, the identity for float.
template <typename T>
inline float gdn_rnd(float x) { return float(T(x)); }

// Flat chunk c (a row of h): its first token and length, by walking the sequences, so no host
// side chunk list is needed. Returns false past the last chunk (the grid may be an upper bound).
inline bool gdn_chunk_span(device const int* cu, constant GdnParams& p, int c, thread int& bos, thread int& len) {
  if (!p.varlen) {
    bos = c * BT;
    len = min(BT, p.tokens - bos);
    return bos < p.tokens;
  }
  for (int n = 0; n < p.sequences; ++n) {
    const int s = gdn_cu(cu, p, n), e = gdn_cu(cu, p, n + 1);
    const int chunks = (max(e - s, 0) + BT - 1) / BT;
    if (c < chunks) {
      bos = s + c * BT;
      len = min(BT, e - bos);
      return true;
    }
    c -= chunks;
  }
  return false;
}

// Flat index of sequence n's first chunk.
inline int gdn_first_chunk(device const int* cu, constant GdnParams& p, int n) {
  int first = 0;
  for (int m = 0; p.varlen && m < n; ++m) first += (max(gdn_cu(cu, p, m + 1) - gdn_cu(cu, p, m), 0) + BT - 1) / BT;
  return first;
}

// Element (b, t, h, x) of a head-last tensor.
inline aura_i64 gdn_at(constant GdnStrides& s, int b, int t, int h, int x) { return b * s.b + t * s.t + h * s.h + x; }

// ----------------------------------------------------------------------------------- casts
// Any float tensor (up to 4-D, strided) -> contiguous fp32: g, beta and initial states may come
// in any float dtype; the stage kernels then read fp32 only, as the reference upcasts on load.
template <typename Tin>
kernel void gdn_cast_f32(device const Tin* x [[buffer(0)]],
                         device float* y [[buffer(1)]],
                         constant CastParams& p [[buffer(2)]],
                         uint i [[thread_position_in_grid]]) {
  if (aura_i64(i) >= p.numel) return;
  aura_i64 rest = i, off = 0;
  for (int d = 3; d >= 0; --d) {
    off += (rest % p.sizes[d]) * p.strides[d];
    rest /= p.sizes[d];
  }
  y[i] = float(x[off]);
}

// ----------------------------------------------------------------------------------- l2norm
// x / sqrt(sum_K x^2 + 1e-6) per [B, T, H] row, stored in T (gdn_chunk rounds it, as FLA does);
// one simdgroup per row, grid (rows). Input strides in p.q, output contiguous.
template <typename T>
kernel void gdn_l2norm(device const T* x [[buffer(0)]],
                       device T* y [[buffer(1)]],
                       constant GdnParams& p [[buffer(2)]],
                       uint row [[threadgroup_position_in_grid]],
                       uint lane [[thread_index_in_simdgroup]]) {
  const int h = int(row) % p.heads, t = (int(row) / p.heads) % p.tokens, b = int(row) / (p.heads * p.tokens);
  device const T* xr = x + gdn_at(p.q, b, t, h, 0);
  float ss = 0.0f;
  for (int d = int(lane); d < p.key_dim; d += 32) ss += float(xr[d]) * float(xr[d]);
  const float norm = sqrt(simd_sum(ss) + 1e-6f);
  for (int d = int(lane); d < p.key_dim; d += 32) y[aura_i64(row) * p.key_dim + d] = T(float(xr[d]) / norm);
}

// ----------------------------------------------------------------------------------- cumsum
// Chunk-local inclusive cumsum of g (fp32 out); grid (chunks, B), 64 threads over value heads.
template <typename Tg>
kernel void gdn_chunk_cumsum(device const Tg* g [[buffer(0)]],
                             device const int* cu [[buffer(1)]],
                             device float* g_cum [[buffer(2)]],
                             constant GdnParams& p [[buffer(3)]],
                             uint2 group [[threadgroup_position_in_grid]],
                             uint tid [[thread_index_in_threadgroup]]) {
  int bos, len;
  if (!gdn_chunk_span(cu, p, int(group.x), bos, len)) return;
  const int b = int(group.y);
  for (int hv = int(tid); hv < p.v_heads; hv += 64) {
    float acc = 0.0f;
    for (int r = 0; r < len; ++r) {
      acc += gdn_decay_log(float(g[gdn_at(p.g, b, bos + r, hv, 0)]));
      g_cum[gdn_at(p.o, b, bos + r, hv, 0)] = acc;
    }
  }
}

// -------------------------------------------------------------------------------- kkt solve
// Per chunk: A = strictly lower beta_i (k_i . k_j) exp(G_i - G_j), then (I + A)^-1 blocked as the
// reference: 16x16 diagonal blocks by forward substitution, merged 16 -> 32 -> 64 with
// X21 = -(X22 (L21 X11)), all in place in one 64x64 threadgroup tile. Grid (chunks, HV, B), 256
// threads. beta is fp32 here (the plan casts other dtypes).
template <typename T>
kernel void gdn_kkt_solve(device const T* k [[buffer(0)]],
                          device const float* g_cum [[buffer(1)]],
                          device const float* beta [[buffer(2)]],
                          device const int* cu [[buffer(3)]],
                          device T* ai [[buffer(4)]],
                          constant GdnParams& p [[buffer(5)]],
                          uint3 group [[threadgroup_position_in_grid]],
                          uint tid [[thread_index_in_threadgroup]]) {
  constexpr int NT = 256;
  int bos, len;
  if (!gdn_chunk_span(cu, p, int(group.x), bos, len)) return;
  const int hv = int(group.y), b = int(group.z), hk = hv / (p.v_heads / p.heads);
  AURA_TG(float, M, BT * BT);
  AURA_TG(float, tmp, 32 * 32);
  AURA_TG(float, G, BT);
  AURA_TG(float, bt, BT);
  if (int(tid) < BT) {
    const bool live = int(tid) < len;
    G[tid] = live ? g_cum[gdn_at(p.g, b, bos + int(tid), hv, 0)] : 0.0f;
    bt[tid] = live ? beta[gdn_at(p.beta, b, bos + int(tid), hv, 0)] : 0.0f;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int e = int(tid); e < BT * BT; e += NT) {
    const int i = e / BT, j = e % BT;
    float a = 0.0f;
    // select, never multiply by a 0/1 mask: exp(G_i - G_j) above the diagonal may be inf
    if (i > j && i < len) {
      device const T* ki = k + gdn_at(p.k, b, bos + i, hk, 0);
      device const T* kj = k + gdn_at(p.k, b, bos + j, hk, 0);
      float dot = 0.0f;
      for (int d = 0; d < p.key_dim; ++d) dot += float(ki[d]) * float(kj[d]);
      a = dot * bt[i] * exp(G[i] - G[j]);
    }
    M[e] = a;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);

  // Diagonal blocks: X[i, :] = e_i - sum_{j<i} A[i, j] X[j, :]; thread (block, column).
  const int blk = int(tid) / 16, col = int(tid) % 16, o = blk * 16;
  for (int i = 0; i < 16; ++i) {
    float x = 0.0f;
    if (int(tid) < 64) {
      x = i == col ? 1.0f : 0.0f;
      for (int j = 0; j < i; ++j) x -= M[(o + i) * BT + o + j] * M[(o + j) * BT + o + col];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (int(tid) < 64) M[(o + i) * BT + o + col] = x;
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }

  // Merges: for each pair of diagonal blocks of size s, X21 = -(X22 (L21 X11)).
  for (int s = 16; s < BT; s *= 2) {
    const int pairs = BT / (2 * s), cells = s * s;
    for (int e = int(tid); e < pairs * cells; e += NT) {
      const int pr = e / cells, r = (e % cells) / s, c = e % s, o1 = pr * 2 * s, o2 = o1 + s;
      float acc = 0.0f;  // (L21 X11)[r, c]
      for (int j = 0; j < s; ++j) acc += M[(o2 + r) * BT + o1 + j] * M[(o1 + j) * BT + o1 + c];
      tmp[pr * cells + r * s + c] = acc;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int e = int(tid); e < pairs * cells; e += NT) {
      const int pr = e / cells, r = (e % cells) / s, c = e % s, o1 = pr * 2 * s, o2 = o1 + s;
      float acc = 0.0f;  // (X22 tmp)[r, c]
      for (int j = 0; j < s; ++j) acc += M[(o2 + r) * BT + o2 + j] * tmp[pr * cells + j * s + c];
      M[(o2 + r) * BT + o1 + c] = -acc;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  for (int e = int(tid); e < len * BT; e += NT)
    ai[gdn_at(p.ai, b, bos + e / BT, hv, e % BT)] = T(M[e]);
}

// ------------------------------------------------------------------------- MMA tile helpers
// out[64 x 32] (threadgroup, row stride 32) = a[64 x 64] (row stride 64) @ x[64 x 32] (row
// stride 32), 8x8 simdgroup matrices, four simdgroups of two row tiles each. `out` may alias `x`:
// every simdgroup finishes reading before the barrier, then stores.
inline void gdn_mma_64x64_64x32(threadgroup float* a, threadgroup float* x, threadgroup float* out, uint sg) {
  simdgroup_float8x8 acc[2][4];
  for (int rt = 0; rt < 2; ++rt) {
    for (int ct = 0; ct < 4; ++ct) {
      acc[rt][ct] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
      for (int kk = 0; kk < 8; ++kk) {
        simdgroup_float8x8 ma, mx;
        simdgroup_load(ma, a, 64, ulong2{ulong(kk * 8), ulong((2 * sg + rt) * 8)});
        simdgroup_load(mx, x, 32, ulong2{ulong(ct * 8), ulong(kk * 8)});
        simdgroup_multiply_accumulate(acc[rt][ct], ma, mx, acc[rt][ct]);
      }
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int rt = 0; rt < 2; ++rt)
    for (int ct = 0; ct < 4; ++ct) simdgroup_store(acc[rt][ct], out, 32, ulong2{ulong(ct * 8), ulong((2 * sg + rt) * 8)});
  threadgroup_barrier(mem_flags::mem_threadgroup);
}

// --------------------------------------------------------------------------- recompute w, u
// One WY product: dst[:, c] = Ai @ rnd(factor_r * src[:, c]) for 32-column blocks of a width
// `width` source (K for w, V for u); rows past the chunk's end are zero operands and not stored.
template <typename T>
inline void gdn_wy_pass(device const T* src, constant GdnStrides& ss, int src_head, device T* dst, constant GdnStrides& ds, int width,
                        threadgroup float* A, threadgroup float* X, threadgroup float* factor, int b, int bos,
                        int len, int hv, uint tid, uint sg) {
  for (int c0 = 0; c0 < width; c0 += int(kGdnOutTile)) {
    for (int e = int(tid); e < BT * 32; e += 128) {
      const int r = e / 32, c = c0 + e % 32;
      X[e] = r < len && c < width ? gdn_rnd<T>(float(src[gdn_at(ss, b, bos + r, src_head, c)]) * factor[r]) : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    gdn_mma_64x64_64x32(A, X, X, sg);
    for (int e = int(tid); e < len * 32; e += 128) {
      const int r = e / 32, c = c0 + e % 32;
      if (c < width) dst[gdn_at(ds, b, bos + r, hv, c)] = T(X[e]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
}

// w = Ai rnd(beta e^G k), u = Ai rnd(beta v), with simdgroup_matrix MMA. Grid (chunks, HV, B),
// 128 threads (4 simdgroups). beta fp32 (cast by the plan when needed).
template <typename T>
kernel void gdn_recompute_w_u(device const T* k [[buffer(0)]],
                              device const T* v [[buffer(1)]],
                              device const float* beta [[buffer(2)]],
                              device const T* ai [[buffer(3)]],
                              device const float* g_cum [[buffer(4)]],
                              device const int* cu [[buffer(5)]],
                              device T* w [[buffer(6)]],
                              device T* u [[buffer(7)]],
                              constant GdnParams& p [[buffer(8)]],
                              uint3 group [[threadgroup_position_in_grid]],
                              uint tid [[thread_index_in_threadgroup]],
                              uint sg [[simdgroup_index_in_threadgroup]]) {
  int bos, len;
  if (!gdn_chunk_span(cu, p, int(group.x), bos, len)) return;
  const int hv = int(group.y), b = int(group.z), hk = hv / (p.v_heads / p.heads);
  AURA_TG(float, A, BT * BT);
  AURA_TG(float, X, BT * 32);
  AURA_TG(float, factor, BT);
  for (int e = int(tid); e < BT * BT; e += 128)
    A[e] = e / BT < len ? float(ai[gdn_at(p.ai, b, bos + e / BT, hv, e % BT)]) : 0.0f;
  if (int(tid) < BT) {
    const int r = int(tid);
    factor[r] = r < len ? beta[gdn_at(p.beta, b, bos + r, hv, 0)] * exp(g_cum[gdn_at(p.g, b, bos + r, hv, 0)]) : 0.0f;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  gdn_wy_pass(k, p.k, hk, w, p.w, p.key_dim, A, X, factor, b, bos, len, hv, tid, sg);
  if (int(tid) < BT) factor[tid] = int(tid) < len ? beta[gdn_at(p.beta, b, bos + int(tid), hv, 0)] : 0.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  gdn_wy_pass(v, p.v, hv, u, p.u, p.value_dim, A, X, factor, b, bos, len, hv, tid, sg);
}

// ------------------------------------------------------------------------------------ fwd_h
// The sequential state pass. Grid (V / 16 tiles, HV, N), 128 threads; each thread keeps its
// share of the fp32 state tile S[K, 16] in registers. Per chunk (reference order):
//   h[c] = rnd(S);  b_v = u - w rnd(S);  v_new = rnd(b_v)
//   S = exp(G_L) S + k^T rnd(select(valid, exp(G_L - G_r) b_v, 0))
// The initial state is fp32 here (the plan casts other dtypes).
template <typename T>
kernel void gdn_fwd_h(device const T* k [[buffer(0)]],
                      device const T* w [[buffer(1)]],
                      device const T* u [[buffer(2)]],
                      device const float* g_cum [[buffer(3)]],
                      device const float* initial_state [[buffer(4)]],
                      device const int* cu [[buffer(5)]],
                      device T* h [[buffer(6)]],
                      device T* v_new [[buffer(7)]],
                      device float* final_state [[buffer(8)]],
                      constant GdnParams& p [[buffer(9)]],
                      uint3 group [[threadgroup_position_in_grid]],
                      uint tid [[thread_index_in_threadgroup]]) {
  constexpr int BV = kGdnStateTile, PER = kGdnMaxHeadDim * BV / 128;
  const int v0 = int(group.x) * BV, hv = int(group.y), n = int(group.z), hk = hv / (p.v_heads / p.heads);
  int b, bos, eos;
  gdn_sequence(cu, p, n, b, bos, eos);
  eos = max(eos, bos);
  AURA_TG(float, S_rnd, kGdnMaxHeadDim * BV);
  AURA_TG(float, BV_tile, BT * BV);
  AURA_TG(float, G, BT);
  // thread tid owns state cells e = tid + 128 i: row e / BV, column e % BV of the tile
  float S[PER];
  for (int i = 0; i < PER; ++i) {
    const int e = int(tid) + 128 * i, r = e / BV, c = v0 + e % BV;
    const bool live = r < p.key_dim && c < p.value_dim;
    const aura_i64 at = n * p.state_stride[0] + hv * p.state_stride[1] +
                        (p.state_v_first ? c * p.state_stride[2] + r : r * p.state_stride[2] + c);
    S[i] = live && p.has_state ? initial_state[at] : 0.0f;
  }
  int flat = gdn_first_chunk(cu, p, n);
  for (int c0 = bos; c0 < eos; c0 += BT, ++flat) {
    const int len = min(BT, eos - c0);
    for (int i = 0; i < PER; ++i) {
      const int e = int(tid) + 128 * i, r = e / BV, c = v0 + e % BV;
      if (r >= p.key_dim) break;
      const float s = gdn_rnd<T>(S[i]);
      S_rnd[e] = s;
      if (c < p.value_dim && flat < p.h_rows)  // h_rows: a cu_seqlens that disagrees with h never overruns it
        h[b * p.h_stride[0] + flat * p.h_stride[1] + hv * p.h_stride[2] +
          (p.state_v_first ? c * p.h_stride[3] + r : r * p.h_stride[3] + c)] = T(s);
    }
    if (int(tid) < len) G[tid] = g_cum[gdn_at(p.g, b, c0 + int(tid), hv, 0)];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const float g_last = G[len - 1];  // the chunk's last VALID row, not row 63
    for (int e = int(tid); e < BT * BV; e += 128) {
      const int r = e / BV, c = v0 + e % BV;
      float gated = 0.0f;
      if (r < len && c < p.value_dim) {
        device const T* wr = w + gdn_at(p.w, b, c0 + r, hv, 0);
        float ws = 0.0f;
        for (int d = 0; d < p.key_dim; ++d) ws += float(wr[d]) * S_rnd[d * BV + e % BV];
        const float bv = float(u[gdn_at(p.u, b, c0 + r, hv, c)]) - ws;
        v_new[gdn_at(p.o, b, c0 + r, hv, c)] = T(bv);
        gated = gdn_rnd<T>(exp(g_last - G[r]) * bv);
      }
      BV_tile[e] = gated;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const float decay = exp(g_last);
    for (int i = 0; i < PER; ++i) {
      const int e = int(tid) + 128 * i, r = e / BV;
      if (r >= p.key_dim) break;
      float acc = 0.0f;
      for (int t = 0; t < len; ++t) acc += float(k[gdn_at(p.k, b, c0 + t, hk, r)]) * BV_tile[t * BV + e % BV];
      S[i] = decay * S[i] + acc;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // S_rnd, BV_tile and G are refilled next chunk
  }
  for (int i = 0; i < PER; ++i) {
    const int e = int(tid) + 128 * i, r = e / BV, c = v0 + e % BV;
    if (r < p.key_dim && c < p.value_dim)
      final_state[n * p.final_stride[0] + hv * p.final_stride[1] +
                  (p.state_v_first ? c * p.final_stride[2] + r : r * p.final_stride[2] + c)] = S[i];
  }
}

// ------------------------------------------------------------------------------------ fwd_o
// o = scale (e^G (q h[c]) + rnd(select(i >= j, (q k^T) e^(G_i - G_j), 0)) v_new), per chunk and
// 32-column value tile, with simdgroup_matrix MMA over 32-wide K blocks. Grid (V / 32, chunks,
// B * HV), 128 threads: simdgroup sg owns rows 16 sg .. 16 sg + 15. The row scaling e^G is a
// product with a diagonal 8x8 matrix, so no code depends on which lane holds which cell.
template <typename T>
kernel void gdn_fwd_o(device const T* q [[buffer(0)]],
                      device const T* k [[buffer(1)]],
                      device const T* v_new [[buffer(2)]],
                      device const T* h [[buffer(3)]],
                      device const float* g_cum [[buffer(4)]],
                      device const int* cu [[buffer(5)]],
                      device T* o [[buffer(6)]],
                      constant GdnParams& p [[buffer(7)]],
                      uint3 group [[threadgroup_position_in_grid]],
                      uint tid [[thread_index_in_threadgroup]],
                      uint sg [[simdgroup_index_in_threadgroup]]) {
  int bos, len;
  const int flat = int(group.y);
  if (!gdn_chunk_span(cu, p, flat, bos, len)) return;
  const int v0 = int(group.x) * 32, hv = int(group.z) % p.v_heads, b = int(group.z) / p.v_heads;
  const int hk = hv / (p.v_heads / p.heads);
  // K loop: q [64 x 32] at 0, k [64 x 32] at 2048, h [32 x 32] at 4096; then A [64 x 64] at 0
  // and v_new [64 x 32] at 4096; finally the output tile at 0.
  AURA_TG(float, tile, 6144);
  AURA_TG(float, diag, 8 * 64);
  AURA_TG(float, G, BT);
  if (int(tid) < BT) G[tid] = int(tid) < len ? g_cum[gdn_at(p.g, b, bos + int(tid), hv, 0)] : 0.0f;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int e = int(tid); e < 8 * 64; e += 128) {
    const int rt = e / 64, i = (e % 64) / 8, j = e % 8, r = rt * 8 + i;
    diag[e] = i == j && r < len ? exp(G[r]) : 0.0f;
  }
  simdgroup_float8x8 accA[2][8], accO[2][4];
  for (int rt = 0; rt < 2; ++rt) {
    for (int j = 0; j < 8; ++j) accA[rt][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (int j = 0; j < 4; ++j) accO[rt][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  }
  threadgroup float* tq = tile;
  threadgroup float* tk = tile + 2048;
  threadgroup float* th = tile + 4096;
  const aura_i64 h_base = b * p.h_stride[0] + flat * p.h_stride[1] + hv * p.h_stride[2];
  for (int k0 = 0; k0 < p.key_dim; k0 += 32) {
    for (int e = int(tid); e < BT * 32; e += 128) {
      const int r = e / 32, d = k0 + e % 32;
      const bool live = r < len && d < p.key_dim;
      tq[e] = live ? float(q[gdn_at(p.q, b, bos + r, hk, d)]) : 0.0f;
      tk[e] = live ? float(k[gdn_at(p.k, b, bos + r, hk, d)]) : 0.0f;
    }
    for (int e = int(tid); e < 32 * 32; e += 128) {
      const int d = k0 + e / 32, c = v0 + e % 32;
      const bool live = d < p.key_dim && c < p.value_dim;
      th[e] = live ? float(h[h_base + (p.state_v_first ? c * p.h_stride[3] + d : d * p.h_stride[3] + c)]) : 0.0f;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int rt = 0; rt < 2; ++rt) {
      const ulong row = ulong((2 * sg + rt) * 8);
      for (int kk = 0; kk < 4; ++kk) {
        simdgroup_float8x8 mq, mb;
        simdgroup_load(mq, tq, 32, ulong2{ulong(kk * 8), row});
        for (int j = 0; j < 8; ++j) {
          simdgroup_load(mb, tk, 32, ulong2{ulong(kk * 8), ulong(j * 8)}, true);  // k^T
          simdgroup_multiply_accumulate(accA[rt][j], mq, mb, accA[rt][j]);
        }
        for (int j = 0; j < 4; ++j) {
          simdgroup_load(mb, th, 32, ulong2{ulong(j * 8), ulong(kk * 8)});
          simdgroup_multiply_accumulate(accO[rt][j], mq, mb, accO[rt][j]);
        }
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  threadgroup float* tA = tile;
  threadgroup float* tv = tile + 4096;
  for (int rt = 0; rt < 2; ++rt) {
    const int rtile = 2 * int(sg) + rt;
    simdgroup_float8x8 md;
    simdgroup_load(md, diag + rtile * 64, 8);
    for (int j = 0; j < 4; ++j) simdgroup_multiply(accO[rt][j], md, accO[rt][j]);  // e^G_r (q h)
    for (int j = 0; j < 8; ++j) simdgroup_store(accA[rt][j], tA, 64, ulong2{ulong(j * 8), ulong(rtile * 8)});
  }
  for (int e = int(tid); e < BT * 32; e += 128) {
    const int r = e / 32, c = v0 + e % 32;
    tv[e] = r < len && c < p.value_dim ? float(v_new[gdn_at(p.v, b, bos + r, hv, c)]) : 0.0f;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int e = int(tid); e < BT * BT; e += 128) {
    const int i = e / BT, j = e % BT;
    // select, never multiply by a mask: e^(G_i - G_j) above the diagonal may overflow
    tA[e] = i >= j && i < len ? gdn_rnd<T>(tA[e] * exp(G[i] - G[j])) : 0.0f;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int rt = 0; rt < 2; ++rt) {
    const ulong row = ulong((2 * sg + rt) * 8);
    for (int j = 0; j < 4; ++j) {
      for (int kk = 0; kk < 8; ++kk) {
        simdgroup_float8x8 ma, mv;
        simdgroup_load(ma, tA, 64, ulong2{ulong(kk * 8), row});
        simdgroup_load(mv, tv, 32, ulong2{ulong(j * 8), ulong(kk * 8)});
        simdgroup_multiply_accumulate(accO[rt][j], ma, mv, accO[rt][j]);
      }
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int rt = 0; rt < 2; ++rt)
    for (int j = 0; j < 4; ++j) simdgroup_store(accO[rt][j], tile, 32, ulong2{ulong(j * 8), ulong((2 * sg + rt) * 8)});
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int e = int(tid); e < len * 32; e += 128) {
    const int r = e / 32, c = v0 + e % 32;
    if (c < p.value_dim) o[gdn_at(p.o, b, bos + r, hv, c)] = T(p.scale * tile[e]);
  }
}

// -------------------------------------------------------------------------------- recurrent
// Token-by-token recurrence over an in-place state pool (gdn.md §1, §4):
//   S <- e^g S;  r = v - S^T k;  S <- S + k (beta r)^T;  o = scale S^T q
// Grid (V / 16, HV, N), 4 simdgroups of 4 value columns each; lane l owns state rows l + 32 i,
// so both reductions over K are one float4 simd_sum per token, without barriers. q and k
// (optionally l2-normalised) stay fp32; the state is read once and stored once, in the pool's
// dtype TS. Index -1 skips a sequence: no read, no write, its o rows are 0. g and beta are fp32.
template <typename T, typename TS>
kernel void gdn_recurrent(device const T* q [[buffer(0)]],
                          device const T* k [[buffer(1)]],
                          device const T* v [[buffer(2)]],
                          device const float* g [[buffer(3)]],
                          device const float* beta [[buffer(4)]],
                          device TS* state [[buffer(5)]],
                          device const int* state_indices [[buffer(6)]],
                          device const int* cu [[buffer(7)]],
                          device T* o [[buffer(8)]],
                          constant GdnParams& p [[buffer(9)]],
                          uint3 group [[threadgroup_position_in_grid]],
                          uint sg [[simdgroup_index_in_threadgroup]],
                          uint lane [[thread_index_in_simdgroup]]) {
  constexpr int ROWS = kGdnMaxHeadDim / 32, COLS = 4;
  const int hv = int(group.y), n = int(group.z), hk = hv / (p.v_heads / p.heads);
  const int v0 = int(group.x) * int(kGdnStateTile) + int(sg) * COLS;
  int b, bos, eos;
  gdn_sequence(cu, p, n, b, bos, eos);
  eos = max(eos, bos);
  const int slot = p.has_indices ? state_indices[n] : n;
  if (slot < 0 || slot >= p.pool_rows) {  // -1 skips; an out-of-range row is never touched
    for (int t = bos; t < eos; ++t)
      if (int(lane) < COLS && v0 + int(lane) < p.value_dim) o[gdn_at(p.o, b, t, hv, v0 + int(lane))] = T(0.0f);
    return;
  }
  if (eos == bos) return;  // zero-length: the pool row is neither read nor written
  device TS* pool = state + slot * p.state_stride[0] + hv * p.state_stride[1];
  float S[ROWS][COLS];
  for (int i = 0; i < ROWS; ++i) {
    const int r = int(lane) + 32 * i;
    for (int c = 0; c < COLS; ++c) {
      const int col = v0 + c;
      const bool live = r < p.key_dim && col < p.value_dim;
      S[i][c] = live ? float(pool[p.state_v_first ? col * p.state_stride[2] + r : r * p.state_stride[2] + col]) : 0.0f;
    }
  }
  for (int t = bos; t < eos; ++t) {
    float kv[ROWS], qv[ROWS];
    float2 ss = float2{0.0f, 0.0f};
    for (int i = 0; i < ROWS; ++i) {
      const int r = int(lane) + 32 * i;
      kv[i] = r < p.key_dim ? float(k[gdn_at(p.k, b, t, hk, r)]) : 0.0f;
      qv[i] = r < p.key_dim ? float(q[gdn_at(p.q, b, t, hk, r)]) : 0.0f;
      ss += float2{kv[i] * kv[i], qv[i] * qv[i]};
    }
    if (p.use_l2norm) {
      const float2 tot = simd_sum(ss);
      const float nk = sqrt(tot.x + 1e-6f), nq = sqrt(tot.y + 1e-6f);
      for (int i = 0; i < ROWS; ++i) kv[i] /= nk, qv[i] /= nq;
    }
    const float decay = exp(gdn_decay_log(float(g[gdn_at(p.g, b, t, hv, 0)]))), bt = beta[gdn_at(p.beta, b, t, hv, 0)];
    float4 part = float4{0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < ROWS; ++i)
      for (int c = 0; c < COLS; ++c) {
        S[i][c] = decay * S[i][c];
        part[c] += S[i][c] * kv[i];
      }
    const float4 sk = simd_sum(part);
    float4 out_part = float4{0.0f, 0.0f, 0.0f, 0.0f};
    for (int c = 0; c < COLS; ++c) {
      const int col = v0 + c;
      const float r_c = (col < p.value_dim ? float(v[gdn_at(p.v, b, t, hv, col)]) : 0.0f) - sk[c];
      for (int i = 0; i < ROWS; ++i) {
        S[i][c] = S[i][c] + kv[i] * (bt * r_c);
        out_part[c] += S[i][c] * qv[i];
      }
    }
    const float4 oq = simd_sum(out_part);
    if (int(lane) < COLS && v0 + int(lane) < p.value_dim) o[gdn_at(p.o, b, t, hv, v0 + int(lane))] = T(p.scale * oq[lane]);
  }
  for (int i = 0; i < ROWS; ++i) {
    const int r = int(lane) + 32 * i;
    for (int c = 0; c < COLS; ++c) {
      const int col = v0 + c;
      if (r < p.key_dim && col < p.value_dim)
        pool[p.state_v_first ? col * p.state_stride[2] + r : r * p.state_stride[2] + col] = TS(S[i][c]);
    }
  }
}

#define AURA_GDN_STAGES(T, tname, unused)                                          \
  AURA_INSTANTIATE("gdn_l2norm_" #tname, gdn_l2norm, T)                            \
  AURA_INSTANTIATE("gdn_chunk_cumsum_" #tname, gdn_chunk_cumsum, T)                \
  AURA_INSTANTIATE("gdn_kkt_solve_" #tname, gdn_kkt_solve, T)                      \
  AURA_INSTANTIATE("gdn_recompute_w_u_" #tname, gdn_recompute_w_u, T)              \
  AURA_INSTANTIATE("gdn_fwd_h_" #tname, gdn_fwd_h, T)                              \
  AURA_INSTANTIATE("gdn_fwd_o_" #tname, gdn_fwd_o, T)                              \
  AURA_INSTANTIATE("gdn_recurrent_" #tname "_f32", gdn_recurrent, T, float)        \
  AURA_INSTANTIATE("gdn_recurrent_" #tname "_f16", gdn_recurrent, T, half)         \
  AURA_INSTANTIATE("gdn_recurrent_" #tname "_bf16", gdn_recurrent, T, bfloat)
AURA_FOR_FLOAT_TYPES(AURA_GDN_STAGES, _)
// fp32 inputs are used as they are: only 16-bit g, beta and initial states are cast.
AURA_INSTANTIATE("gdn_cast_f32_f16", gdn_cast_f32, half)
AURA_INSTANTIATE("gdn_cast_f32_bf16", gdn_cast_f32, bfloat)
