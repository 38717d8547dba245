// Probe kernels (docs/metal.md §8): they measure what the emulator can only assume. On a Mac,
// tests/mps/probes/test_probes.py runs them on the GPU; on Linux, tests/interp/metal runs the same
// source under the emulator, so both sides answer the same question with the same code.
#include "aura_compat.h"

// Layout probe: load an 8x8 matrix whose cell (r, c) holds 8 r + c, then every lane reports the
// two cells it holds: out[3 * (2 * lane + e) + {0, 1, 2}] = (lane, e, value).
kernel void probe_simdgroup_layout(device const float* cells [[buffer(0)]],
                                   device float* out [[buffer(1)]],
                                   uint lane [[thread_index_in_simdgroup]]) {
  simdgroup_matrix<float, 8, 8> m;
  simdgroup_load(m, cells, 8);
  for (int e = 0; e < 2; ++e) {
    const uint i = 3 * (2 * lane + e);
    out[i] = float(lane);
    out[i + 1] = float(e);
    out[i + 2] = m.thread_elements()[e];
  }
}
AURA_REGISTER(probe_simdgroup_layout)

// Numerics probe: out[f * n + i] = function f of x[i], in default, fast:: and precise:: forms,
// plus bfloat arithmetic; the host compares with fp64 and prints the worst ULP error.
kernel void probe_numerics(device const float* x [[buffer(0)]],
                           device float* out [[buffer(1)]],
                           constant uint& n [[buffer(2)]],
                           uint i [[thread_position_in_grid]]) {
  if (i >= n) return;
  const float v = x[i];
  out[0 * n + i] = exp(v);
  out[1 * n + i] = fast::exp(v);
  out[2 * n + i] = precise::exp(v);
  out[3 * n + i] = exp2(v);
  out[4 * n + i] = fast::exp2(v);
  out[5 * n + i] = precise::exp2(v);
  out[6 * n + i] = log(abs(v) + 1e-3f);
  out[7 * n + i] = fast::log(abs(v) + 1e-3f);
  out[8 * n + i] = precise::log(abs(v) + 1e-3f);
  out[9 * n + i] = tanh(v);
  out[10 * n + i] = rsqrt(abs(v) + 1e-3f);
  out[11 * n + i] = float(bfloat(v) + bfloat(0.3f * v));
  out[12 * n + i] = float(bfloat(v) * bfloat(1.7f));
}
AURA_REGISTER(probe_numerics)
