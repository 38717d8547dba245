// AURA compressed KV cache (docs/aura-format.md) for the MPS backend: signed Hadamard rotation,
// encode / cache write, dequantize, compressed-domain pass 1 (with the causal variant) and pass 2
// with the fused inverse Hadamard + sign undo. Order and rounding as
// torch_aura/reference/aura.py: fp32 math, one cast to the output dtype.
//
// Lane layout of one vector (aura-format.md §8): lane l of a simdgroup holds dims l + 32 i,
// i < D / 32, so butterfly strides 1..16 are lane exchanges and 32..D/2 pair registers.
#include "aura_compat.h"
#include "aura_params.h"

// In-place unnormalised FWHT of one vector spread over a simdgroup, strides 1, 2, .., D/2 as the
// reference (so the result is bit-identical): pair (a, b) -> (a + b, a - b).
template <int D>
inline void aura_fwht(thread float* v, uint lane) {
  constexpr int PER = D / 32;
  for (ushort h = 1; h < 32; h <<= 1) {
    for (int i = 0; i < PER; ++i) {
      const float other = simd_shuffle_xor(v[i], h);
      v[i] = (lane & h) ? other - v[i] : v[i] + other;  // the lane holding b keeps a - b
    }
  }
  for (int m = 1; m < PER; m <<= 1) {
    for (int i = 0; i < PER; ++i) {
      if (i & m) continue;
      const float a = v[i], b = v[i + m];
      v[i] = a + b;
      v[i + m] = a - b;
    }
  }
}

// s_j = -1 where bit (j mod 32) of word j / 32 is set: for dim lane + 32 i that is bit `lane` of
// word i.
inline float aura_sign(device const int* mask, int i, uint lane) { return (uint(mask[i]) >> lane) & 1u ? -1.0f : 1.0f; }

inline aura_i64 aura_row(constant AuraRows& r, int lead_dims, aura_i64 row) {
  aura_i64 off = 0;
  for (int d = lead_dims - 1; d >= 0; --d) {
    off += (row % r.size[d]) * r.stride[d];
    row /= r.size[d];
  }
  return off;
}

// Code j of a packed little-endian bit stream (aura-format.md §6); a 3-bit code may straddle two
// words. Shifts on uint: an int shift would smear bit 31.
inline uint aura_code(device const int* words, int j, int bits) {
  const int bit = j * bits, w = bit >> 5, sh = bit & 31;
  uint v = uint(words[w]) >> sh;
  if (sh + bits > 32) v |= uint(words[w + 1]) << (32 - sh);
  return v & ((1u << bits) - 1u);
}

// ---------------------------------------------------------------------------------- rotate
// y = factor * H (s x) (forward) or factor * s (H x) (inverse), factor = scale / sqrt(D).
// Grid (rows), 32 threads. Tout may differ from Tin (aura_decode rotates q into fp32).
template <typename Tin, typename Tout, int D>
kernel void aura_rotate(device const Tin* x [[buffer(0)]],
                        device const int* mask [[buffer(1)]],
                        device Tout* y [[buffer(2)]],
                        constant AuraRowParams& p [[buffer(3)]],
                        uint row [[threadgroup_position_in_grid]],
                        uint lane [[thread_index_in_simdgroup]]) {
  constexpr int PER = D / 32;
  device const Tin* xr = x + aura_row(p.in, p.lead_dims, row);
  float v[PER];
  for (int i = 0; i < PER; ++i) {
    const float s = p.has_mask && !p.inverse ? aura_sign(mask, i, lane) : 1.0f;
    v[i] = s * float(xr[lane + 32 * i]);  // signs before H
  }
  aura_fwht<D>(v, lane);
  device Tout* yr = y + aura_row(p.out, p.lead_dims, row);
  for (int i = 0; i < PER; ++i) {
    const float s = p.has_mask && p.inverse ? aura_sign(mask, i, lane) : 1.0f;  // after H: the transpose
    yr[lane + 32 * i] = Tout(s * v[i] * p.factor);
  }
}

// ------------------------------------------------------------------------ encode and write
// Per vector (aura-format.md §5): r = |x|; u = x / r; y = Pi u; idx_j = #{k: y_j > bound_k};
// norm = r / |codebook[idx]|; zero / non-finite rows get codes 2^(b-1) and norm 0 / NaN. Grid (rows),
// 32 threads. write_mode 0 stores rows like x's; 1 / 2 scatter row (n, h) of x [N, Hkv, D] to
// slot_mapping[n] of a contiguous / paged cache (slot < 0 or out of range: skipped).
template <typename T, int D>
kernel void aura_encode(device const T* x [[buffer(0)]],
                        device const float* codebook [[buffer(1)]],
                        device const float* boundaries [[buffer(2)]],
                        device const int* mask [[buffer(3)]],
                        device const int* slot_mapping [[buffer(4)]],
                        device int* codes [[buffer(5)]],
                        device float* norms [[buffer(6)]],
                        constant AuraRowParams& p [[buffer(7)]],
                        uint row [[threadgroup_position_in_grid]],
                        uint lane [[thread_index_in_simdgroup]]) {
  constexpr int PER = D / 32;
  aura_i64 codes_at, norm_at;
  if (p.write_mode == 0) {
    codes_at = aura_row(p.out, p.lead_dims, row);
    norm_at = aura_row(p.norms, p.lead_dims, row);
  } else {
    const int n = int(row) / p.kv_heads, h = int(row) % p.kv_heads;
    const aura_i64 slot = aura_i64(uint(slot_mapping[2 * n])) | (aura_i64(slot_mapping[2 * n + 1]) << 32);  // int64
    if (slot < 0 || slot >= p.slots) return;  // padding row (or a bad slot: never written out of bounds)
    const aura_i64 a = slot / p.slot_div, t = slot % p.slot_div;
    // contiguous [B, Hkv, T_cap, PW]: (b, h, t); paged [blocks, page, Hkv, PW]: (block, offset, h)
    const aura_i64 i0 = a, i1 = p.write_mode == 1 ? aura_i64(h) : t, i2 = p.write_mode == 1 ? t : aura_i64(h);
    codes_at = i0 * p.cache_stride[0] + i1 * p.cache_stride[1] + i2 * p.cache_stride[2];
    norm_at = i0 * p.norms_cache_stride[0] + i1 * p.norms_cache_stride[1] + i2 * p.norms_cache_stride[2];
  }
  AURA_TG(float, cb, 256);
  AURA_TG(float, bd, 256);
  AURA_TG(uint, idx_tg, D);
  const int levels = 1 << p.bits;
  for (int i = int(lane); i < levels; i += 32) {
    cb[i] = codebook[i];
    if (i < levels - 1) bd[i] = boundaries[i];
  }
  device const T* xr = x + aura_row(p.in, p.lead_dims, row);
  float v[PER];
  float ss = 0.0f;
  for (int i = 0; i < PER; ++i) {
    v[i] = float(xr[lane + 32 * i]);
    ss += v[i] * v[i];
  }
  const float r = sqrt(simd_sum(ss));
  const bool bad = r == 0.0f || !isfinite(r);  // any NaN / Inf element makes r NaN or inf
  for (int i = 0; i < PER; ++i) {
    const float u = bad ? 0.0f : v[i] / r;
    v[i] = (p.has_mask ? aura_sign(mask, i, lane) : 1.0f) * u;
  }
  aura_fwht<D>(v, lane);
  threadgroup_barrier(mem_flags::mem_threadgroup);  // codebook and boundaries loaded
  float cs = 0.0f;
  for (int i = 0; i < PER; ++i) {
    const float y = v[i] * p.factor;
    int lo = 0, hi = levels - 1;  // count boundaries strictly below y: a tie takes the lower index
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (bd[mid] < y) lo = mid + 1;
      else hi = mid;
    }
    const uint idx = bad ? uint(levels / 2) : uint(lo);
    idx_tg[lane + 32 * i] = idx;
    cs += cb[idx] * cb[idx];
  }
  const float c_norm = sqrt(simd_sum(cs));
  // corrected norm keeps |x_hat| = |x|; zero row: 0; NaN/Inf row: NaN (propagates like dense attention)
  if (lane == 0) norms[norm_at] = bad ? (r == 0.0f ? 0.0f : NAN) : r / c_norm;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const int words = D * p.bits / 32;
  for (int w = int(lane); w < words; w += 32) {
    uint word = 0;
    for (int j = (32 * w) / p.bits; j < D && j * p.bits < 32 * (w + 1); ++j) {
      const int shift = j * p.bits - 32 * w;  // negative: the spilled high part of a 3-bit code
      word |= shift >= 0 ? idx_tg[j] << shift : idx_tg[j] >> (-shift);
    }
    codes[codes_at + w] = int(word);
  }
}

// ------------------------------------------------------------------------------ append slots
// aura_append's first dispatch (then aura_encode's write mode for K and for V, which read only
// these slots). Row b reads seq_lens[b] and writes the int64 slots of its L tokens in
// aura_write_cache's numbering (reference/aura.py append_slots): position t = seq_lens[b] + i goes
// to slot b * T_cap + t (contiguous) or page * page_size + t % page_size with page =
// block_table[b, t / page_size] (paged); -1 (skipped by the writes) where t is negative, at or past
// the capacity, or its table entry is not a page. After a barrier, seq_lens[b] += L (not clamped,
// wrapping like torch's int32 add), as AuraCache.append. Grid (B), 32 threads: no other group
// touches row b, and the writes that follow read the slots, never seq_lens.
kernel void aura_append_slots(device int* seq_lens [[buffer(0)]],
                              device const int* block_table [[buffer(1)]],
                              device int* slots [[buffer(2)]],
                              constant AuraAppendParams& p [[buffer(3)]],
                              uint b [[threadgroup_position_in_grid]],
                              uint tid [[thread_index_in_threadgroup]]) {
  const int t0 = seq_lens[b * p.seq_stride];
  threadgroup_barrier(mem_flags::mem_device);  // every thread has read seq_lens[b]
  for (int i = int(tid); i < p.tokens; i += 32) {
    const aura_i64 t = aura_i64(t0) + i;
    aura_i64 slot = -1;
    if (t >= 0 && t < p.capacity) {
      if (p.paged == 0) {
        slot = aura_i64(b) * p.capacity + t;
      } else {
        const int page = block_table[b * p.table_stride[0] + (t / p.page_size) * p.table_stride[1]];
        if (page >= 0 && page < p.num_blocks) slot = aura_i64(page) * p.page_size + t % p.page_size;
      }
    }
    const aura_i64 at = 2 * (aura_i64(b) * p.tokens + i);  // int64 as two little-endian words
    slots[at] = int(uint(slot & 0xffffffff));
    slots[at + 1] = int(slot >> 32);
  }
  threadgroup_barrier(mem_flags::mem_device);
  if (tid == 0) seq_lens[b * p.seq_stride] = int(uint(t0) + uint(p.tokens));
}
AURA_REGISTER(aura_append_slots)

// ------------------------------------------------------------------------------- dequantize
// norm * codebook[idx] (rotated domain) or, with the mask, factor * s (H (norm * codebook[idx])).
template <typename Tout, int D>
kernel void aura_dequantize(device const int* codes [[buffer(0)]],
                            device const float* norms [[buffer(1)]],
                            device const float* codebook [[buffer(2)]],
                            device const int* mask [[buffer(3)]],
                            device Tout* out [[buffer(4)]],
                            constant AuraRowParams& p [[buffer(5)]],
                            uint row [[threadgroup_position_in_grid]],
                            uint lane [[thread_index_in_simdgroup]]) {
  constexpr int PER = D / 32;
  device const int* cr = codes + aura_row(p.in, p.lead_dims, row);
  const float norm = norms[aura_row(p.norms, p.lead_dims, row)];
  float v[PER];
  for (int i = 0; i < PER; ++i) v[i] = norm * codebook[aura_code(cr, int(lane) + 32 * i, p.bits)];
  if (p.has_mask) {
    aura_fwht<D>(v, lane);
    for (int i = 0; i < PER; ++i) v[i] = aura_sign(mask, i, lane) * v[i] * p.factor;
  }
  device Tout* o = out + aura_row(p.out, p.lead_dims, row);
  for (int i = 0; i < PER; ++i) o[lane + 32 * i] = Tout(v[i]);
}

// ------------------------------------------------------------------------------------ pass 1
// Per (block n, KV head, sequence b), one threadgroup serves every query head of the KV head's
// group and every causal query (aura-format.md §9): rows (query, head) go in tiles of four, and
// for each tile every token's K and V codes are unpacked and looked up once and feed all four
// rows (one float4 simd_sum). Simdgroup w takes tokens t0 + w, t0 + w + 4, ... Two passes over
// the block, as the reference: the rows' max m over their visible scores (combined across
// simdgroups), then p = exp(s - m), l = sum p, o = sum (p norm_V) codebook_V[idx_V], the
// simdgroups' l and o added through threadgroup memory. A row that sees no token of the block
// writes m = -inf, l = 0, o = 0. Grid (NB, Hkv, B), 4 simdgroups.
inline device const int* aura_cache_row(device const int* cache, constant aura_i64* stride, device const int* table,
                                        constant AuraP1Params& p, int b, int h, int t) {
  if (p.page_size == 0) return cache + b * stride[0] + h * stride[1] + t * stride[2];
  const int page = clamp(table[b * p.table_stride + t / p.page_size], 0, p.num_blocks - 1);
  return cache + page * stride[0] + (t % p.page_size) * stride[1] + h * stride[2];
}

inline float aura_cache_norm(device const float* norms, constant aura_i64* stride, device const int* table,
                             constant AuraP1Params& p, int b, int h, int t) {
  if (p.page_size == 0) return norms[b * stride[0] + h * stride[1] + t * stride[2]];
  const int page = clamp(table[b * p.table_stride + t / p.page_size], 0, p.num_blocks - 1);
  return norms[page * stride[0] + (t % p.page_size) * stride[1] + h * stride[2]];
}

template <typename Tq, int D>
kernel void aura_flash_p1(device const Tq* q [[buffer(0)]],
                          device const int* k_codes [[buffer(1)]],
                          device const float* k_norms [[buffer(2)]],
                          device const int* v_codes [[buffer(3)]],
                          device const float* v_norms [[buffer(4)]],
                          device const int* seq_lens [[buffer(5)]],
                          device const float* k_codebook [[buffer(6)]],
                          device const float* v_codebook [[buffer(7)]],
                          device const int* block_table [[buffer(8)]],
                          device float* o [[buffer(9)]],
                          device float* m_out [[buffer(10)]],
                          device float* l_out [[buffer(11)]],
                          constant AuraP1Params& p [[buffer(12)]],
                          uint3 group [[threadgroup_position_in_grid]],
                          uint sg [[simdgroup_index_in_threadgroup]],
                          uint lane [[thread_index_in_simdgroup]],
                          uint tid [[thread_index_in_threadgroup]]) {
  constexpr int PER = D / 32, W = kAuraP1Simdgroups, RT = 4;
  const int n = int(group.x), kvh = int(group.y), b = int(group.z);
  AURA_TG(float, cbk, 256);
  AURA_TG(float, cbv, 256);
  AURA_TG(float, tg_m, W * RT);
  AURA_TG(float, tg_l, W * RT);
  AURA_TG(float, tg_o, RT * D);
  for (int i = int(tid); i < (1 << p.key_bits); i += W * 32) cbk[i] = k_codebook[i];
  for (int i = int(tid); i < (1 << p.value_bits); i += W * 32) cbv[i] = v_codebook[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const int seq_len = clamp(seq_lens[b], 0, p.capacity);
  const int t0 = n * p.block_size, t1 = min(min(t0 + p.block_size, p.capacity), seq_len);
  const int rows = p.queries * p.group;
  for (int r0 = 0; r0 < rows; r0 += RT) {
    const int nr = min(RT, rows - r0);
    float qv[RT][PER];
    int last[RT];  // causal: row r (query qi) sees tokens t <= seq_len - L + qi
    for (int r = 0; r < RT; ++r) {
      const int row = min(r0 + r, rows - 1), qi = row / p.group, hq = kvh * p.group + row % p.group;
      last[r] = r < nr ? seq_len - p.queries + qi : -1;
      for (int i = 0; i < PER; ++i)
        qv[r][i] = float(q[b * p.q_stride[0] + qi * p.q_stride[1] + hq * p.q_stride[2] + lane + 32 * i]);
    }
    float m[RT];
    for (int r = 0; r < RT; ++r) m[r] = -INFINITY;
    for (int t = t0 + int(sg); t < t1; t += W) {
      device const int* kr = aura_cache_row(k_codes, p.k_stride, block_table, p, b, kvh, t);
      float4 dot = float4{0.0f, 0.0f, 0.0f, 0.0f};
      for (int i = 0; i < PER; ++i) {
        const float kv = cbk[aura_code(kr, int(lane) + 32 * i, p.key_bits)];  // unpacked once, four rows
        for (int r = 0; r < RT; ++r) dot[r] += qv[r][i] * kv;
      }
      const float4 s = simd_sum(dot) * aura_cache_norm(k_norms, p.kn_stride, block_table, p, b, kvh, t);
      for (int r = 0; r < RT; ++r)
        if (t <= last[r]) m[r] = max(m[r], s[r]);
    }
    if (lane < uint(RT)) tg_m[sg * RT + lane] = m[lane];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float M[RT];
    for (int r = 0; r < RT; ++r) {
      M[r] = -INFINITY;
      for (int w = 0; w < W; ++w) M[r] = max(M[r], tg_m[w * RT + r]);
    }
    float l[RT], acc[RT][PER];
    for (int r = 0; r < RT; ++r) {
      l[r] = 0.0f;
      for (int i = 0; i < PER; ++i) acc[r][i] = 0.0f;
    }
    for (int t = t0 + int(sg); t < t1; t += W) {
      device const int* kr = aura_cache_row(k_codes, p.k_stride, block_table, p, b, kvh, t);
      device const int* vr = aura_cache_row(v_codes, p.v_stride, block_table, p, b, kvh, t);
      float4 dot = float4{0.0f, 0.0f, 0.0f, 0.0f};
      float vv[PER];
      for (int i = 0; i < PER; ++i) {
        const float kv = cbk[aura_code(kr, int(lane) + 32 * i, p.key_bits)];
        for (int r = 0; r < RT; ++r) dot[r] += qv[r][i] * kv;
        vv[i] = cbv[aura_code(vr, int(lane) + 32 * i, p.value_bits)];
      }
      const float4 s = simd_sum(dot) * aura_cache_norm(k_norms, p.kn_stride, block_table, p, b, kvh, t);
      const float vn = aura_cache_norm(v_norms, p.vn_stride, block_table, p, b, kvh, t);
      for (int r = 0; r < RT; ++r) {
        if (t > last[r]) continue;  // masked: selected out, never exp(-inf) times garbage
        const float pr = exp(s[r] - M[r]);
        l[r] += pr;
        const float pv = pr * vn;
        for (int i = 0; i < PER; ++i) acc[r][i] += pv * vv[i];
      }
    }
    if (lane < uint(RT)) tg_l[sg * RT + lane] = l[lane];
    for (int w = 0; w < W; ++w) {  // the simdgroups' o, added one after another
      if (int(sg) == w)
        for (int r = 0; r < RT; ++r)
          for (int i = 0; i < PER; ++i) tg_o[r * D + lane + 32 * i] = (w == 0 ? 0.0f : tg_o[r * D + lane + 32 * i]) + acc[r][i];
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (int e = int(tid); e < nr * D; e += W * 32) {
      const int r = e / D, row = r0 + r, qi = row / p.group, hq = kvh * p.group + row % p.group;
      o[b * p.o_stride[0] + qi * p.o_stride[1] + hq * p.o_stride[2] + n * p.o_stride[3] + e % D] = tg_o[e];
    }
    if (int(tid) < nr) {
      const int row = r0 + int(tid), qi = row / p.group, hq = kvh * p.group + row % p.group;
      float L = 0.0f;
      for (int w = 0; w < W; ++w) L += tg_l[w * RT + tid];
      const aura_i64 ml = b * p.ml_stride[0] + qi * p.ml_stride[1] + hq * p.ml_stride[2] + n * p.ml_stride[3];
      m_out[ml] = M[tid];
      l_out[ml] = L;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // tg_m, tg_l and tg_o are reused by the next tile
  }
}

// ------------------------------------------------------------------------------------ pass 2
// Log-sum-exp merge of the block partials over blocks with l > 0 (an empty one is skipped, never
// weighted by 0; a non-empty one with NaN l or m, from NaN/Inf data, makes the row NaN), then, given the V mask, the fused un-rotation
// out = s_V * H(o_rot) / sqrt(D) as the in-register butterfly. No live block: out 0, lse -inf.
// Grid (rows of [B, (L,) Hq]), 32 threads. Rows: o in `in`, m in `norms`, l in `aux`, out in
// `out`, lse in `out2`.
template <typename Tout, int D>
kernel void aura_flash_p2(device const float* o [[buffer(0)]],
                          device const float* m [[buffer(1)]],
                          device const float* l [[buffer(2)]],
                          device const int* mask [[buffer(3)]],
                          device Tout* out [[buffer(4)]],
                          device float* lse [[buffer(5)]],
                          constant AuraRowParams& p [[buffer(6)]],
                          uint row [[threadgroup_position_in_grid]],
                          uint lane [[thread_index_in_simdgroup]]) {
  constexpr int PER = D / 32;
  device const float* orow = o + aura_row(p.in, p.lead_dims, row);
  device const float* mrow = m + aura_row(p.norms, p.lead_dims, row);
  device const float* lrow = l + aura_row(p.aux, p.lead_dims, row);
  float M = -INFINITY;
  bool poisoned = false;  // pass 1 writes l = 0 for an empty block; NaN l or m there is NaN/Inf data
  for (int n = 0; n < p.blocks; ++n) {
    const float ln = lrow[n * p.block_stride[2]], mn = mrow[n * p.block_stride[1]];
    if (ln > 0.0f) M = max(M, mn);
    poisoned = poisoned || (ln != 0.0f && (isnan(ln) || isnan(mn)));
  }
  float v[PER];
  float lsum = 0.0f;
  for (int i = 0; i < PER; ++i) v[i] = 0.0f;
  const bool any_live = M != -INFINITY;
  for (int n = 0; n < p.blocks && any_live; ++n) {
    const float ln = lrow[n * p.block_stride[2]];
    if (!(ln > 0.0f)) continue;
    const float w = exp(mrow[n * p.block_stride[1]] - M);
    lsum += w * ln;
    for (int i = 0; i < PER; ++i) v[i] += w * orow[n * p.block_stride[0] + lane + 32 * i];
  }
  const float denom = any_live ? lsum : 1.0f;
  for (int i = 0; i < PER; ++i) v[i] = poisoned ? NAN : any_live ? v[i] / denom : 0.0f;
  if (p.has_mask) {
    aura_fwht<D>(v, lane);
    for (int i = 0; i < PER; ++i) v[i] = aura_sign(mask, i, lane) * v[i] * p.factor;
  }
  device Tout* orow_out = out + aura_row(p.out, p.lead_dims, row);
  for (int i = 0; i < PER; ++i) orow_out[lane + 32 * i] = Tout(v[i]);
  if (lane == 0) lse[aura_row(p.out2, p.lead_dims, row)] = poisoned ? NAN : any_live ? M + log(denom) : -INFINITY;
}

#define AURA_ROTATE(Tin, tin, Tout, tout, D) \
  AURA_INSTANTIATE("aura_rotate_" #tin "_" #tout "_" #D, aura_rotate, Tin, Tout, D)
#define AURA_PER_DIM(D)                                                            \
  AURA_ROTATE(float, f32, float, f32, D)                                           \
  AURA_ROTATE(half, f16, half, f16, D)                                             \
  AURA_ROTATE(bfloat, bf16, bfloat, bf16, D)                                       \
  AURA_ROTATE(half, f16, float, f32, D)                                            \
  AURA_ROTATE(bfloat, bf16, float, f32, D)                                         \
  AURA_INSTANTIATE("aura_encode_f32_" #D, aura_encode, float, D)                   \
  AURA_INSTANTIATE("aura_encode_f16_" #D, aura_encode, half, D)                    \
  AURA_INSTANTIATE("aura_encode_bf16_" #D, aura_encode, bfloat, D)                 \
  AURA_INSTANTIATE("aura_dequantize_f32_" #D, aura_dequantize, float, D)           \
  AURA_INSTANTIATE("aura_dequantize_f16_" #D, aura_dequantize, half, D)            \
  AURA_INSTANTIATE("aura_dequantize_bf16_" #D, aura_dequantize, bfloat, D)         \
  AURA_INSTANTIATE("aura_flash_p1_f32_" #D, aura_flash_p1, float, D)               \
  AURA_INSTANTIATE("aura_flash_p1_f16_" #D, aura_flash_p1, half, D)                \
  AURA_INSTANTIATE("aura_flash_p1_bf16_" #D, aura_flash_p1, bfloat, D)             \
  AURA_INSTANTIATE("aura_flash_p2_f32_" #D, aura_flash_p2, float, D)               \
  AURA_INSTANTIATE("aura_flash_p2_f16_" #D, aura_flash_p2, half, D)                \
  AURA_INSTANTIATE("aura_flash_p2_bf16_" #D, aura_flash_p2, bfloat, D)
AURA_PER_DIM(64)
AURA_PER_DIM(128)
AURA_PER_DIM(256)
AURA_PER_DIM(512)
