// The balanced schedule (docs/decode.md §4): a plan kernel cuts the batch into equal work items, a
// persistent grid claims them.
#pragma once

#include "decode_mma.cuh"

namespace aura {

// Each item writes its own partial rows (item * heads_per_cta + g), so which CTA ran it changes nothing:
// the result is deterministic and a graph replay is bitwise eager (decode.md §4).

// One CTA. chunk = round_up(max(min_chunk, ceil(tokens * units / target_items)), tile), at most the
// capacity rounded up to a tile; so items <= target_items + B * units (the host's buffer bound).
__global__ void __launch_bounds__(kPlanThreads)
    decode_balance_plan_kernel(const int* seq_lens, int B, int capacity, int tile, int units, int target_items,
                               int min_chunk, int* plan) {
  grid_dependents_launch();  // the split kernel may launch; it reads the plan after grid_dependency_wait()
  __shared__ long long part[kPlanThreads / 32];
  __shared__ int warp_tot[kPlanThreads / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  auto len = [&](int b) { return live_tokens(seq_lens, b, capacity); };
  long long tokens = 0;
  for (int b = tid; b < B; b += kPlanThreads) tokens += len(b);
  for (int o = 16; o > 0; o >>= 1) tokens += __shfl_xor_sync(0xffffffffu, tokens, o);
  if (lane == 0) part[warp] = tokens;
  __syncthreads();
  tokens = 0;
  for (int i = 0; i < kPlanThreads / 32; ++i) tokens += part[i];
  const long long want = (tokens * units + target_items - 1) / target_items;
  const long long cap = (static_cast<long long>(max(capacity, 1)) + tile - 1) / tile * tile;
  const long long c = min(cap, max(static_cast<long long>(min_chunk), want));
  const int chunk = static_cast<int>((c + tile - 1) / tile * tile);
  int carry = 0;  // chunks of the sequences before this round
  for (int b0 = 0; b0 < B; b0 += kPlanThreads) {
    const int b = b0 + tid;
    const int n = b < B ? ceil_div(len(b), chunk) : 0;
    int x = n;  // inclusive scan: warps, then the warps' totals
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    if (lane == 31) warp_tot[warp] = x;
    __syncthreads();
    int before = carry;
    for (int i = 0; i < warp; ++i) before += warp_tot[i];
    if (b < B) plan[kPlanPrefix + b] = before + x - n;
    int round = 0;
    for (int i = 0; i < kPlanThreads / 32; ++i) round += warp_tot[i];
    carry += round;
    __syncthreads();  // warp_tot is rewritten by the next round
  }
  if (tid == 0) {
    plan[kPlanPrefix + B] = carry;
    plan[kPlanCounter] = 0;
    plan[kPlanChunk] = chunk;
    plan[kPlanItems] = carry * units;
  }
}

// Item -> work. Items run sequence by sequence, then unit (KV head, head tile), then chunk: sequence b
// owns items [units * P[b], units * P[b + 1]).
__device__ __forceinline__ SplitWork balanced_item(const DecodeParams& p, int item, int chunk) {
  const int* P = p.plan + kPlanPrefix;
  const int units = p.Hkv * p.head_tiles, x = item / units;
  int lo = 0, hi = p.B;  // the last b with P[b] <= x (a sequence without chunks has P[b] == P[b + 1])
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (P[mid] <= x) lo = mid;
    else hi = mid;
  }
  SplitWork w;
  w.b = lo;
  const int n_b = P[lo + 1] - P[lo], r = item - units * P[lo];
  w.s = r % n_b;
  set_unit_heads(p, r / n_b, w);
  w.start = w.s * chunk;
  w.end = min(w.start + chunk, live_tokens(p.seq_lens, w.b, p.capacity));
  w.part_row = int64_t(item) * p.heads_per_cta;
  return w;
}

// A persistent CTA per slot, launched behind the plan kernel: claim an item, run it, repeat. Two CTAs
// per SM, as kSmemBudget plans: without the bound ptxas kept D = 256 at 168 registers and spilled.
template <typename T, int D, int NHT, bool BULK, bool TILES>
__global__ void __launch_bounds__(WarpSplitShape<T, D>::kWarps * 32, 2)
    flash_decode_balanced_mma_kernel(const DecodeParams p, const __grid_constant__ TileMaps maps) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const MmaSmem<T, D> sm(smem_raw);
  __shared__ int claimed;
  init_ring_barriers<T, D, BULK>(sm.bars);
  int uses = 0;
  grid_dependency_wait();  // the plan and its zeroed counter
  for (;;) {
    if (threadIdx.x == 0) claimed = atomicAdd(p.plan + kPlanCounter, 1);
    __syncthreads();
    const int item = claimed;  // read by all before run_split_mma's barrier lets thread 0 claim again
    // the plan's totals are re-read per item (cached loads) rather than held across it: at D >= 192
    // the main loop needs every register
    if (item >= p.plan[kPlanItems]) break;
    const SplitWork w = balanced_item(p, item, p.plan[kPlanChunk]);
    stage_q_async<T, D, NHT>(p, w, sm.qs);
    run_split_mma<T, D, NHT, BULK, TILES>(p, w, smem_raw, uses, false, &maps);
    if constexpr (BULK) fence_proxy_async_shared();  // the epilogue's generic writes to the ring, before bulk refills
    __syncthreads();  // the next item's copies overwrite the ring and q
  }
  grid_dependents_launch();
}

}  // namespace aura
