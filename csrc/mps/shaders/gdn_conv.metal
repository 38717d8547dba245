// The GDN front end (ops.md §3b) for the MPS backend: the depthwise causal conv over time of
// causal_conv1d (prefill) and causal_conv1d_update (decode), as torch_aura/reference/gdn.py
// computes it: y[t, c] = act(bias[c] + sum_j w[c, j] x[t - (W - 1) + j, c]) in fp32, rounded once
// to x's dtype. A sequence's left context is the end of its state row, which afterwards holds the
// last S inputs of [old row | the sequence]. One thread per channel (x is token-major: a SIMD
// group reads 32 adjacent channels of a token) walks its tokens with a register window.
#include "aura_compat.h"
#include "aura_params.h"
#include "gdn_varlen.h"

constant constexpr int MAXW = kConvMaxWidth;

// Element i of a float tensor of any dtype: weight and bias are read once per thread, which does
// not pay for 9x the instantiations.
inline float conv_load(device const uchar* base, int dtype, aura_i64 i) {
  if (dtype == kConvF16) return float(reinterpret_cast<device const half*>(base)[i]);
  if (dtype == kConvBF16) return float(reinterpret_cast<device const bfloat*>(base)[i]);
  return reinterpret_cast<device const float*>(base)[i];
}

// The sequence holding token t of batch row b (varlen: the last n with cu[n] <= t, which passes
// over empty sequences). bos <= t < eos holds even for offsets the reference rejects, so a
// context read stays inside its state row.
inline void conv_sequence_of(device const int* cu, constant ConvParams& p, int b, int t, thread int& n,
                             thread int& bos, thread int& eos) {
  if (!p.varlen) {
    n = b, bos = 0, eos = p.tokens;
    return;
  }
  int lo = 0, hi = p.sequences - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (gdn_cu(cu, p, mid) <= t) lo = mid;
    else hi = mid - 1;
  }
  n = lo;
  bos = min(gdn_cu(cu, p, n), t);
  eos = max(gdn_cu(cu, p, n + 1), t + 1);
}

// The state row of sequence n (row n, or state_indices[n]), or -1: no state, or a skipped
// sequence (index -1, or a row outside the pool, which is never touched).
inline int conv_row(device const int* indices, constant ConvParams& p, int n) {
  if (!p.has_state) return -1;
  const int row = p.has_indices ? indices[n] : n;
  return row >= 0 && row < p.pool_rows ? row : -1;
}

// State row start; entry i is i * state_stride[2] further. Any view: vLLM hands its [P, S, C] pool
// over transposed (entries C apart); the plan refuses zero strides, so the entries are distinct.
inline aura_i64 conv_state_at(constant ConvParams& p, int row, int c) {
  return row * p.state_stride[0] + c * p.state_stride[1];
}

// Input `pos` of channel c for a sequence starting at bos: x, or before bos the end of the state
// row (zeros without one).
template <typename T, typename TS>
inline float conv_input(device const T* xc, device const TS* state, constant ConvParams& p, int c, int row, int bos,
                        int pos) {
  if (pos >= bos) return float(xc[pos * p.x_stride[1]]);
  return row < 0 ? 0.0f : float(state[conv_state_at(p, row, c) + (p.state_len + pos - bos) * p.state_stride[2]]);
}

// The row takes the last S entries of [row | the sequence's len >= 1 inputs], in place: entry i
// reads entry i + len, which this thread, walking i upwards, has not overwritten yet.
template <typename T, typename TS>
inline void conv_shift_state(device TS* row, device const T* xc, constant ConvParams& p, int bos, int len) {
  const aura_i64 step = p.state_stride[2];
  for (int i = 0; i < p.state_len; ++i) {
    const int src = i + len;
    row[i * step] = src < p.state_len ? row[src * step] : TS(float(xc[(bos + src - p.state_len) * p.x_stride[1]]));
  }
}

// Grid (C / 128, token tiles, B), thread = (channel, p.tile tokens). Window slot k holds input
// t - (MAXW - 1) + k, so tap j of W sits at slot MAXW - W + j and every index is a constant once
// the loops unroll (a runtime index would spill the window). With p.shift_state the thread held
// its whole sequence and rolls the state row itself, after having read its context.
template <typename T, typename TS>
kernel void causal_conv1d(device const T* x [[buffer(0)]],
                          device const uchar* weight [[buffer(1)]],
                          device const uchar* bias [[buffer(2)]],
                          device TS* state [[buffer(3)]],
                          device const int* cu [[buffer(4)]],
                          device const int* indices [[buffer(5)]],
                          device T* y [[buffer(6)]],
                          constant ConvParams& p [[buffer(7)]],
                          uint3 group [[threadgroup_position_in_grid]],
                          uint tid [[thread_index_in_threadgroup]]) {
  const int c = int(group.x) * int(kConvChannelTile) + int(tid), b = int(group.z);
  if (c >= p.channels) return;
  const int first = MAXW - p.width, t0 = int(group.y) * p.tile, t1 = min(t0 + p.tile, p.tokens);
  float w[MAXW];
  for (int k = 0; k < MAXW; ++k)
    w[k] = k >= first ? conv_load(weight, p.weight_dtype, c * p.weight_stride + k - first) : 0.0f;
  const float bias_c = p.bias_dtype == kConvAbsent ? 0.0f : conv_load(bias, p.bias_dtype, c * p.bias_stride);
  device const T* xc = x + b * p.x_stride[0] + c;
  device T* yc = y + aura_i64(b) * p.tokens * p.channels + c;
  float win[MAXW];
  int n = 0, bos = 0, eos = 0, row = -1;
  for (int t = t0; t < t1; ++t) {
    if (t >= eos) {  // the tile's first token or a new sequence: load its W - 1 inputs of context
      conv_sequence_of(cu, p, b, t, n, bos, eos);
      row = conv_row(indices, p, n);
      for (int k = 0; k < MAXW; ++k) win[k] = k > first ? conv_input(xc, state, p, c, row, bos, t - MAXW + k) : 0.0f;
    }
    for (int k = 0; k + 1 < MAXW; ++k) win[k] = win[k + 1];
    win[MAXW - 1] = float(xc[t * p.x_stride[1]]);
    float acc = bias_c;
    // skip, never multiply by a zero tap: an inf older than the window must not become NaN
    for (int k = 0; k < MAXW; ++k)
      if (k >= first) acc = fma(w[k], win[k], acc);
    if (p.silu) acc = acc / (1.0f + exp(-acc));
    const bool skipped = p.has_indices && row < 0;  // index -1: its y rows are 0
    yc[aura_i64(t) * p.channels] = T(skipped ? 0.0f : acc);
  }
  if (p.shift_state && row >= 0) conv_shift_state(state + conv_state_at(p, row, c), xc, p, bos, eos - bos);
}

// Grid (C / 128, N), dispatched after causal_conv1d (which read every old row as context) when
// sequences span several threads: each state row takes its sequence's last S inputs. The slots
// are causal_conv1d's; an empty sequence leaves its row untouched.
template <typename T, typename TS>
kernel void causal_conv1d_shift_state(device const T* x [[buffer(0)]],
                                      device TS* state [[buffer(3)]],
                                      device const int* cu [[buffer(4)]],
                                      device const int* indices [[buffer(5)]],
                                      constant ConvParams& p [[buffer(7)]],
                                      uint2 group [[threadgroup_position_in_grid]],
                                      uint tid [[thread_index_in_threadgroup]]) {
  const int c = int(group.x) * int(kConvChannelTile) + int(tid), n = int(group.y);
  if (c >= p.channels) return;
  const int row = conv_row(indices, p, n);
  int b, bos, eos;
  gdn_sequence(cu, p, n, b, bos, eos);
  if (row >= 0 && eos > bos)
    conv_shift_state(state + conv_state_at(p, row, c), x + b * p.x_stride[0] + c, p, bos, eos - bos);
}

#define AURA_CONV_KERNELS(T, tname, TS, sname)                                                \
  AURA_INSTANTIATE("causal_conv1d_" #tname "_" #sname, causal_conv1d, T, TS)                  \
  AURA_INSTANTIATE("causal_conv1d_shift_state_" #tname "_" #sname, causal_conv1d_shift_state, T, TS)
#define AURA_CONV_STATE_TYPES(T, tname, unused) \
  AURA_CONV_KERNELS(T, tname, float, f32)       \
  AURA_CONV_KERNELS(T, tname, half, f16)        \
  AURA_CONV_KERNELS(T, tname, bfloat, bf16)
AURA_FOR_FLOAT_TYPES(AURA_CONV_STATE_TYPES, _)
