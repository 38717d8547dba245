// D = 512 across four warps that split the dims (docs/decode.md §7), for tile-copy layouts.
#pragma once

#include "decode_mma.cuh"

namespace aura {

// Warp w owns dims [128 w, 128 w + 128); the partial logits meet in shared memory, so every warp runs the
// same softmax and nothing merges at the end. Warp 0 refills step i - 1's slot after step i's barrier,
// which every warp passes only after reading it (decode.md §7).
template <typename T>
struct DimSplitShape {
  static constexpr int kDim = 512, kWarps = 4, kWarpDims = kDim / kWarps;
  static constexpr int kTile = 16 * kDim;                      // elements of one K or V tile
  static constexpr size_t kStepBytes = size_t(2) * kTile * sizeof(T);
  static constexpr int kRow = WarpSplitShape<T, kDim>::kRow;   // q rows, as stage_q_async lays them
  static constexpr int kStages = 3;
  static constexpr size_t kQBytes = size_t(8) * kRow * sizeof(T);
  static constexpr size_t kLogitBytes = size_t(2) * kWarps * 32 * sizeof(float4);  // [2][W][32 lanes]
  static constexpr size_t kSmem = 1024 + kStages * kStepBytes + kQBytes + kLogitBytes + kStages * sizeof(uint64_t);
  static_assert(kSmem <= kSmemBudget, "two CTAs per SM");
  static_assert(size_t(8) * kDim * sizeof(float) <= kStages * kStepBytes, "partial staging area");
};

// Warp 0: step i of the split into ring slot i % NS, one tile box of K or V per lane (lanes [0, BOXES)
// K's, [BOXES, 2 BOXES) V's); the slot is free (see DimSplitShape).
template <typename T>
__device__ __forceinline__ void dims_issue(const DecodeParams& p, const SplitWork& w, const TileMaps& maps, T* tiles,
                                           uint64_t* full, int n_steps, bool paged, int lane, int i) {
  using Shape = DimSplitShape<T>;
  constexpr int NS = Shape::kStages, TILE = Shape::kTile, BOXES = Shape::kDim / 64;
  if (n_steps <= i) return;
  const int slot = i % NS, t0 = w.start + 16 * i;
  int c1 = t0, c2 = w.kvh, c3 = w.b;  // box coordinates, innermost first: contiguous (d, t, h, b)
  if (paged) {                        // paged (d, h, row in page, page)
    const int page = min(max(p.block_table[w.b * p.bt_sb + t0 / p.page_size], 0), p.num_blocks - 1);
    c1 = w.kvh, c2 = t0 % p.page_size, c3 = page;
  }
  if (lane == 0) mbar_arrive_expect_tx(full + slot, unsigned(2 * TILE * sizeof(T)));
  __syncwarp();  // the barrier expects the bytes before any box can complete
  if (lane < 2 * BOXES) {
    const int c = lane % BOXES;
    const bool v_box = lane >= BOXES;
    tensor_copy_g2s_4d(tiles + slot * 2 * TILE + (v_box ? TILE : 0) + c * 16 * 64, v_box ? &maps.v : &maps.k,
                       c * 64, c1, c2, c3, full + slot);
  }
}

// This warp's share of one step's QK: S^T [16 tokens x 8 heads] over its dims, two accumulator chains.
template <typename T, int KS>
__device__ __forceinline__ void dims_partial_scores(const T* kt, const uint32_t (&qreg)[KS][2], int a_row, int a_col,
                                                    int dim0, float (&s)[2][4]) {
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t a[4];
    ldmatrix_x4(a, kt + tile_off(a_row, dim0 + ks * 16 + a_col));
    mma_16816<T>(s[ks & 1], a, qreg[ks][0], qreg[ks][1]);
  }
}

// The step's logits: the warps' partial sums, added in warp order, so every warp gets the same values.
template <int W>
__device__ __forceinline__ float4 sum_warp_logits(const float4* xb, int lane) {
  float4 tot = xb[lane];
#pragma unroll
  for (int wi = 1; wi < W; ++wi) {
    const float4 x = xb[wi * 32 + lane];
    tot.x += x.x, tot.y += x.y, tot.z += x.z, tot.w += x.w;
  }
  return tot;
}

// PV of one step over this warp's dims: O^T [128 dims x 8 heads] += V^T P^T, after the rescale (when
// some running max moved: a warp-uniform branch).
template <typename T, int KS>
__device__ __forceinline__ void dims_accumulate_pv(const T* vt, uint32_t pb0, uint32_t pb1, bool grew,
                                                   const float (&alpha)[2], int v_row, int v_col, int dim0,
                                                   float (&o)[KS][4]) {
  if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
    for (int mt = 0; mt < KS; ++mt)
      o[mt][0] *= alpha[0], o[mt][1] *= alpha[1], o[mt][2] *= alpha[0], o[mt][3] *= alpha[1];
  }
#pragma unroll
  for (int mt = 0; mt < KS; ++mt) {
    uint32_t a[4];
    ldmatrix_x4_trans(a, vt + tile_off(v_row, dim0 + mt * 16 + v_col));
    mma_16816<T>(o[mt], a, pb0, pb1);
  }
}

// The split's result: normalised output (a partial staged in the drained ring, dims swizzled, and
// stored as 16-byte rows; or out directly when S == 1) and the heads' lse.
template <typename T, int KS>
__device__ __forceinline__ void write_dims_result(const DecodeParams& p, const SplitWork& w, T* tiles,
                                                  const float (&m_run)[2], float (&l_run)[2], const float (&o)[KS][4],
                                                  int lane, int warp, int dim0) {
  constexpr int D = DimSplitShape<T>::kDim, W = DimSplitShape<T>::kWarps;
  const int nh = w.nh;
#pragma unroll
  for (int e = 0; e < 2; ++e) {  // each lane summed its own token rows: the column's l over the quads
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 4);
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 8);
    l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 16);
  }
  // f(head g, dim d, value) for this lane's O^T fragments of the warp's dims
  auto each_fragment = [&](auto&& f) {
#pragma unroll
    for (int mt = 0; mt < KS; ++mt)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        f(2 * (lane & 3) + (c & 1), dim0 + mt * 16 + (lane >> 2) + 8 * (c >> 1), o[mt][c] / l_run[c & 1]);
  };
  if (p.S != 1) {
    __syncthreads();  // every warp is done with the ring
    float* ow = reinterpret_cast<float*>(tiles);  // [8][D]
    each_fragment([&](int g, int d, float v) { ow[g * D + merge_col(g, d)] = v; });
    __syncthreads();
    store_staged_partial<D>(p, w, ow, threadIdx.x, W * 32);
  } else {
    each_fragment([&](int g, int d, float v) {
      if (g < nh) store_value<T>(p, w, g, d, v);
    });
  }
  if (warp == 0 && lane < 4) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (2 * lane + e < nh) store_head_lse(p, w, 2 * lane + e, m_run[e], l_run[e]);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(DimSplitShape<T>::kWarps * 32, 2)
    flash_decode_split_dims_kernel(const DecodeParams p, const __grid_constant__ TileMaps maps) {
  using Shape = DimSplitShape<T>;
  constexpr int D = Shape::kDim, W = Shape::kWarps, NS = Shape::kStages, ROW = Shape::kRow, TILE = Shape::kTile;
  constexpr int KS = Shape::kWarpDims / 16;  // this warp's QK k-steps = its PV m-tiles
  SplitWork w;
  plan_split_heads(p, w);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* tiles = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  T* qs = tiles + NS * 2 * TILE;
  float4* logits = reinterpret_cast<float4*>(qs + 8 * ROW);
  uint64_t* full = reinterpret_cast<uint64_t*>(logits + 2 * W * 32);
  stage_q_async<T, D, 1, W * 32>(p, w, qs);  // before seq_lens: q is the first request
  if (!plan_split_tokens<T>(p, w)) {
    cp_async_wait<0>();
    return;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, dim0 = warp * Shape::kWarpDims;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int j = 0; j < NS; ++j) mbar_init(full + j, 1);
    mbar_init_fence();
  }
  __syncthreads();  // the barriers are initialised before any thread waits on them

  const int n_steps = ceil_div(w.end - w.start, 16);
  const bool paged = p.block_table != nullptr;
  if (warp == 0) {
#pragma unroll
    for (int i = 0; i < NS; ++i) dims_issue<T>(p, w, maps, tiles, full, n_steps, paged, lane, i);
  }
  if (p.q_vec16) {
    cp_async_wait<0>();
  } else {
    stage_q_elementwise<T, D, 1, W * 32>(p, w, qs);
  }
  __syncthreads();  // q visible to every warp

  const int qb_row = lane & 7, qb_col = 8 * ((lane >> 3) & 1);
  uint32_t qreg[KS][2];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t b[2];
    ldmatrix_x2(b, qs + qb_row * ROW + dim0 + ks * 16 + qb_col);
    qreg[ks][0] = b[0], qreg[ks][1] = b[1];
  }
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, o[KS][4];
#pragma unroll
  for (int mt = 0; mt < KS; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
  const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_col = 8 * (lane >> 4);  // K: A tiles, rows = tokens
  const int v_row = (lane & 7) + 8 * (lane >> 4), v_col = 8 * ((lane >> 3) & 1);  // V^T: A tiles via .trans

  for (int i = 0; i < n_steps; ++i) {
    const int slot = i % NS, t0 = w.start + 16 * i, n_rows = w.end - t0;
    mbar_wait(full + slot, (i / NS) & 1);
    const T* kt = tiles + slot * 2 * TILE;
    T* vt = tiles + slot * 2 * TILE + TILE;
    if (n_rows < 16) {  // the split's last step: V rows past the end hold other tokens (or NaN)
      zero_tile_rows<Shape::kWarpDims>(vt, n_rows, dim0, lane);
      __syncwarp();
    }
    float s[2][4] = {};
    dims_partial_scores<T, KS>(kt, qreg, a_row, a_col, dim0, s);
    float4* xb = logits + (i & 1) * W * 32;  // double-buffered: one barrier per step suffices
    xb[warp * 32 + lane] = make_float4(s[0][0] + s[1][0], s[0][1] + s[1][1], s[0][2] + s[1][2], s[0][3] + s[1][3]);
    __syncthreads();  // also: every warp is done with step i - 1's slot
    if (warp == 0 && i > 0) dims_issue<T>(p, w, maps, tiles, full, n_steps, paged, lane, i - 1 + NS);
    const float4 tot = sum_warp_logits<W>(xb, lane);
    const bool ok_lo = t0 + (lane >> 2) < w.end, ok_hi = t0 + (lane >> 2) + 8 < w.end;
    const float x[4] = {ok_lo ? tot.x * p.scale_log2 : -INFINITY, ok_lo ? tot.y * p.scale_log2 : -INFINITY,
                        ok_hi ? tot.z * p.scale_log2 : -INFINITY, ok_hi ? tot.w * p.scale_log2 : -INFINITY};
    float pr[4], alpha[2];
    const bool grew = online_softmax_tile(x, m_run, l_run, pr, alpha);
    const uint32_t pb0 = movmatrix_trans(pack2<T>(pr[0], pr[1])), pb1 = movmatrix_trans(pack2<T>(pr[2], pr[3]));
    dims_accumulate_pv<T, KS>(vt, pb0, pb1, grew, alpha, v_row, v_col, dim0, o);
  }
  grid_dependents_launch();  // the merge (programmatic dependent launch) may start its prologue
  write_dims_result<T, KS>(p, w, tiles, m_run, l_run, o, lane, warp, dim0);
}

}  // namespace aura
