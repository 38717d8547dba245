// The stream-K schedule (docs/decode.md §4): every CTA of one wave runs the same number of 16-token steps,
// across unit and sequence boundaries, so the grid ends together whatever B x Hkv is; the merge then
// combines each unit's pieces. No plan kernel and no atomics: the cut follows from seq_lens alone.
#pragma once

#include "decode_mma.cuh"

namespace aura {

// CTA blockIdx.x of gridDim.x: its steps (decode_plan.cuh's StreamK), piece by piece through run_split_mma.
// Bounded for two CTAs per SM (TORCH_AURA_DECODE_STREAMK_CTAS_PER_SM), as the balanced kernel: without it
// ptxas spilled at D = 256.
template <typename T, int D, int NHT, bool BULK, bool TILES>
__global__ void __launch_bounds__(WarpSplitShape<T, D>::kWarps * 32, 2)
    flash_decode_streamk_mma_kernel(const DecodeParams p, const __grid_constant__ TileMaps maps) {
  AURA_PHASE(0);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const MmaSmem<T, D> sm(smem_raw);
  __shared__ long long steps_before[kStreamKMaxBatch + 1];
  streamk_step_prefix(p.seq_lens, p.B, p.capacity, steps_before);
  const int units = p.Hkv * p.head_tiles;
  const StreamK sk{steps_before[p.B] * units, int(gridDim.x)};
  const int c = blockIdx.x;
  long long x = sk.first_step(c);
  const long long end = sk.first_step(c + 1);
  if (x >= sk.steps) return;  // nothing left to run, and no unit's merge reads row c + u of it
  init_ring_barriers<T, D, BULK>(sm.bars);
  int uses = 0;
  // An empty range (more CTAs than steps) still writes lse = -inf to row c + u of the unit its first step
  // falls in: the merge of that unit counts CTA c among its pieces.
  do {
    const StreamKUnit u = streamk_unit_of(steps_before, p.B, units, x);
    const long long piece_end = min(end, u.first + u.steps);
    SplitWork w;
    w.s = 0;
    w.b = u.b;
    set_unit_heads(p, u.unit, w);
    const int T_b = live_tokens(p.seq_lens, w.b, p.capacity);
    w.start = int(x - u.first) * 16;  // a multiple of 16 inside the unit: no step crosses a page
    w.end = min(int(piece_end - u.first) * 16, T_b);
    w.part_row = (int64_t(c) + int64_t(u.b) * units + u.unit) * p.heads_per_cta;
    if (w.start < w.end) {
      stage_q_async<T, D, NHT>(p, w, sm.qs);
      run_split_mma<T, D, NHT, BULK, TILES>(p, w, smem_raw, uses, piece_end == end, &maps);
      if constexpr (BULK) fence_proxy_async_shared();  // the epilogue's generic writes to the ring, before refills
      __syncthreads();  // the next piece's copies overwrite the ring and q
    } else {
      for (int g = threadIdx.x; g < w.nh; g += blockDim.x) p.part_lse[w.part_row + g] = -INFINITY;
    }
    x = piece_end;
  } while (x < end);
}

}  // namespace aura
