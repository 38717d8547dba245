// The tensor-core split kernel for fp16 / bf16 caches: the warp-split design of docs/decode.md §3, and
// run_split_mma, one split's work, shared by the static and the balanced schedules.
#pragma once

#include "decode_plan.cuh"
#include "decode_tiles.cuh"

namespace aura {

#ifndef AURA_DECODE_MAX_STAGES
#define AURA_DECODE_MAX_STAGES 4  // (experiments override it: tools/decode_timeline.cu)
#endif

// QK: S^T [16 tok x 8 heads] = K . Q^T; PV: O^T [D x 8 heads] += V^T . P^T. Heads on the MMA's n (8 wide):
// half the MMAs of a GQA-4/8 group, and P stays in registers.

// Row stride (floats) of the end-of-split merge buffer; merge_col swizzles a row's dims so fragment
// stores and the reduction's reads are conflict-free (split_merge_conflict_free checks it).
template <int D>
constexpr int kMergeRow = D % 32 == 0 ? D : (D + 31) / 32 * 32 + 16;

// Launch shape per head dim: warps per CTA and ring depth (steps in flight per warp), chosen so
// that ring + q fit kSmemBudget (two CTAs per SM, the CTAS_PER_SM of the split plan).
template <typename T, int D>
struct WarpSplitShape {
  static constexpr int kRow = D + 16 / static_cast<int>(sizeof(T));  // +16 B: ldmatrix rows hit disjoint banks
  static constexpr int kMaxHeads = D <= 128 ? 16 : 8;                 // heads one CTA takes (registers)
  static constexpr int kWarps = D <= 192 ? 4 : D <= 256 ? 3 : 1;
  static constexpr size_t kStepBytes = size_t(2) * 16 * kRow * sizeof(T);  // K and V of 16 tokens
  static constexpr size_t kQBytes = size_t(kMaxHeads) * kRow * sizeof(T);
  static constexpr size_t kBarBytes = 4 * AURA_DECODE_MAX_STAGES * sizeof(uint64_t);  // bulk copies: an mbarrier per slot and warp
  static constexpr int kStages =
      std::min<int>(AURA_DECODE_MAX_STAGES, int((kSmemBudget - kQBytes - kBarBytes) / (kWarps * kStepBytes)));
  static constexpr size_t kSmem = kWarps * kStages * kStepBytes + kQBytes + kBarBytes;
  static_assert(kWarps * kStages * sizeof(uint64_t) <= kBarBytes, "barrier area");
  static_assert(kStages >= 2, "a ring needs two steps to overlap loads with math");
  // the end-of-split merge of the warps' states reuses the ring: [W][16][merge row] o, [W][16] m, l
  // and weights (a one-warp CTA has nothing to merge; it stages only its partial there)
  static_assert(kWarps == 1 || size_t(kWarps) * 16 * (kMergeRow<D> + 3) * sizeof(float) <=
                                     kWarps * kStages * kStepBytes,
                "merge area");
};

__host__ __device__ constexpr int merge_col(int g, int d) { return d ^ (((g >> 1) & 3) << 3); }

// A partial staged in shared memory as [heads][D], dims swizzled by merge_col, out as 16-byte rows
// (merge_col keeps 4 aligned dims together); the calling threads are first, first + step, ...
template <int D>
__device__ __forceinline__ void store_staged_partial(const DecodeParams& p, const SplitWork& w, const float* ow,
                                                     int first, int step) {
  float* po = p.part_out + w.part_row * D;  // nh rows of D
  for (int idx = 4 * first; idx < w.nh * D; idx += 4 * step) {
    const int g = idx / D, d = idx % D;
    *reinterpret_cast<float4*>(po + idx) = *reinterpret_cast<const float4*>(ow + g * D + merge_col(g, d));
  }
}
template <int D, int NHT>
constexpr bool split_merge_conflict_free() {
  constexpr int R = kMergeRow<D>;
  for (int mt = 0; mt < D / 16; ++mt)
    for (int n = 0; n < NHT; ++n)
      for (int c = 0; c < 4; ++c)
        if (!distinct_banks(32, [&](int lane) {
              const int g = n * 8 + 2 * (lane & 3) + (c & 1), d = mt * 16 + (lane >> 2) + 8 * (c >> 1);
              return g * R + merge_col(g, d);
            }))
          return false;
  constexpr int N = 8 * NHT * D;  // reads: thread idx -> (g, d) = (idx / D, idx % D)
  for (int idx = 0; idx < N; ++idx)
    if (merge_col(idx / D, idx % D) >= R) return false;
  for (int i0 = 0; i0 < N; i0 += 32)
    if (!distinct_banks(i0 + 32 <= N ? 32 : N - i0, [&](int i) {
          const int g = (i0 + i) / D;
          return g * R + merge_col(g, (i0 + i) % D);
        }))
      return false;
  return true;
}

// Shared memory of the tensor-core kernels: [W][NS][K, V][16][ROW] rings, [kMaxHeads][ROW] q, and
// [W][NS] bulk-copy barriers (one per ring slot of each warp).
template <typename T, int D>
struct MmaSmem {
  using Shape = WarpSplitShape<T, D>;
  static constexpr int kTile = 16 * Shape::kRow;  // elements of one 16-token K or V tile
  T* ring;
  T* tiles;  // the tile-copy ring, [W][NS][K, V][16 * D] swizzled, 1024-byte aligned inside `ring`'s bytes
  T* qs;
  uint64_t* bars;
  __device__ explicit MmaSmem(unsigned char* raw)
      : ring(reinterpret_cast<T*>(raw)),
        tiles(reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023))),
        qs(ring + Shape::kWarps * Shape::kStages * 2 * kTile),
        bars(reinterpret_cast<uint64_t*>(qs + Shape::kMaxHeads * Shape::kRow)) {}
};

// q of the CTA's heads as one cp.async group, the CTA's first request: issued later, it queues behind
// the whole grid's prefetch (decode.md §13). Other q views: stage_q_elementwise.
template <typename T, int D, int NHT, int THREADS = WarpSplitShape<T, D>::kWarps * 32>
__device__ __forceinline__ void stage_q_async(const DecodeParams& p, const SplitWork& w, T* qs) {
  using Shape = WarpSplitShape<T, D>;
  constexpr int ROW = Shape::kRow, CPR = D * int(sizeof(T)) / 16, VEC = 16 / int(sizeof(T));
  if (!p.q_vec16) return;
  const T* qg = static_cast<const T*>(p.q);
  for (int i = threadIdx.x; i < 8 * NHT * CPR; i += THREADS) {
    const int g = i / CPR, c = (i % CPR) * VEC;
    cp_async16(qs + g * ROW + c, g < w.nh ? qg + w.b * p.q_sb + (w.hq0 + g) * p.q_sh + c : qg, g < w.nh);
  }
  cp_async_commit();
}

// q of the CTA's heads element by element, for a q view the 16-byte copies cannot move.
template <typename T, int D, int NHT, int THREADS>
__device__ __forceinline__ void stage_q_elementwise(const DecodeParams& p, const SplitWork& w, T* qs) {
  constexpr int ROW = WarpSplitShape<T, D>::kRow;
  const T* qg = static_cast<const T*>(p.q);
  for (int i = threadIdx.x; i < 8 * NHT * D; i += THREADS) {
    const int g = i / D, d = i % D;
    qs[g * ROW + d] = g < w.nh ? qg[w.b * p.q_sb + (w.hq0 + g) * p.q_sh + d] : from_float<T>(0.f);
  }
}

// Bulk copies complete on one mbarrier per ring slot and warp, initialised once per CTA: phases carry
// over from one split to the next (run_split_mma's `uses`), so a barrier is never re-initialised.
template <typename T, int D, bool BULK>
__device__ __forceinline__ void init_ring_barriers(uint64_t* bars) {
  if constexpr (BULK) {
    constexpr int NS = WarpSplitShape<T, D>::kStages;
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
      for (int j = 0; j < NS; ++j) mbar_init(bars + (threadIdx.x >> 5) * NS + j, 1);
      mbar_init_fence();
    }
    __syncwarp();
  }
}

// Element offset of (token row r, dim c) in a K or V tile of the ring: swizzled tile copies, or padded rows.
template <int ROW, bool TILES>
__device__ __forceinline__ int ring_elem(int r, int c) { return TILES ? tile_off(r, c) : r * ROW + c; }

// B fragments of q for the whole split (rows = heads, 16 k-values of D per step), where they fit in
// registers (QREGS); otherwise compute_scores reads them per step.
template <typename T, int D, int NHT, bool QREGS>
__device__ __forceinline__ void load_q_fragments(const T* qs, int qb_row, int qb_col,
                                                 uint32_t (&qreg)[QREGS ? NHT : 1][QREGS ? D / 16 : 1][2]) {
  constexpr int ROW = WarpSplitShape<T, D>::kRow;
  if constexpr (QREGS) {
#pragma unroll
    for (int n = 0; n < NHT; ++n)
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t b[2];
        ldmatrix_x2(b, qs + (n * 8 + qb_row) * ROW + ks * 16 + qb_col);
        qreg[n][ks][0] = b[0], qreg[n][ks][1] = b[1];
      }
  }
}

// QK of one step: S^T [16 tokens x 8 heads] per head tile, two accumulator chains so consecutive MMAs
// do not wait on each other.
template <typename T, int D, int NHT, bool TILES, bool QREGS>
__device__ __forceinline__ void compute_scores(const T* kt, const T* qs,
                                               const uint32_t (&qreg)[QREGS ? NHT : 1][QREGS ? D / 16 : 1][2],
                                               int a_row, int a_col, int qb_row, int qb_col, float (&s)[NHT][2][4]) {
  constexpr int ROW = WarpSplitShape<T, D>::kRow;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t a[4];
    ldmatrix_x4(a, kt + ring_elem<ROW, TILES>(a_row, ks * 16 + a_col));
#pragma unroll
    for (int n = 0; n < NHT; ++n) {
      uint32_t b0, b1;
      if constexpr (QREGS) {
        b0 = qreg[n][ks][0], b1 = qreg[n][ks][1];
      } else {
        uint32_t b[2];
        ldmatrix_x2(b, qs + (n * 8 + qb_row) * ROW + ks * 16 + qb_col);
        b0 = b[0], b1 = b[1];
      }
      mma_16816<T>(s[n][ks & 1], a, b0, b1);
    }
  }
}

// O *= each head column's alpha (called only when some running max moved).
template <int KS, int NHT>
__device__ __forceinline__ void rescale_output(float (&o)[KS][NHT][4], const float (&alpha)[NHT][2]) {
#pragma unroll
  for (int mt = 0; mt < KS; ++mt)
#pragma unroll
    for (int n = 0; n < NHT; ++n) {
      o[mt][n][0] *= alpha[n][0], o[mt][n][1] *= alpha[n][1];
      o[mt][n][2] *= alpha[n][0], o[mt][n][3] *= alpha[n][1];
    }
}

// PV of one step: O^T [D x 8 heads] += V^T [D x 16 tokens] . P^T.
template <typename T, int D, int NHT, bool TILES>
__device__ __forceinline__ void accumulate_pv(const T* vt, const uint32_t (&pb)[NHT][2], int v_row, int v_col,
                                              float (&o)[D / 16][NHT][4]) {
  constexpr int ROW = WarpSplitShape<T, D>::kRow;
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt) {
    uint32_t a[4];
    ldmatrix_x4_trans(a, vt + ring_elem<ROW, TILES>(v_row, mt * 16 + v_col));
#pragma unroll
    for (int n = 0; n < NHT; ++n) mma_16816<T>(o[mt][n], a, pb[n][0], pb[n][1]);
  }
}

// Each lane summed its own token rows: a head column's l over the warp.
template <int D, int NHT>
__device__ __forceinline__ void sum_row_shares(float (&l_run)[NHT][2]) {
#pragma unroll
  for (int n = 0; n < NHT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      l_run[n][e] += __shfl_xor_sync(0xffffffffu, l_run[n][e], 4);
      l_run[n][e] += __shfl_xor_sync(0xffffffffu, l_run[n][e], 8);
      l_run[n][e] += __shfl_xor_sync(0xffffffffu, l_run[n][e], 16);
    }
}

// f(head g, dim d, value, l of head g) for every accumulator of this lane's O^T fragments.
template <int D, int NHT, typename F>
__device__ __forceinline__ void each_fragment(const float (&o)[D / 16][NHT][4], const float (&l_run)[NHT][2], int lane,
                                              F&& f) {
#pragma unroll
  for (int mt = 0; mt < D / 16; ++mt)
#pragma unroll
    for (int n = 0; n < NHT; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        f(n * 8 + 2 * (lane & 3) + (c & 1), mt * 16 + (lane >> 2) + 8 * (c >> 1), o[mt][n][c], l_run[n][c & 1]);
}
// f(head g, m, l) for the head columns this lane's quad holds (lanes 0-3 speak for the warp).
template <int NHT, typename F>
__device__ __forceinline__ void each_head_state(const float (&m_run)[NHT][2], const float (&l_run)[NHT][2], int lane,
                                                F&& f) {
  if (lane < 4) {
#pragma unroll
    for (int n = 0; n < NHT; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) f(n * 8 + 2 * lane + e, m_run[n][e], l_run[n][e]);
  }
}

// The split's result from a one-warp CTA (D = 512; l >= 1, the split is live). A partial is staged in
// the drained ring and stored as 16-byte rows, faster than fragment stores (decode.md §13).
template <typename T, int D, int NHT>
__device__ __forceinline__ void write_warp_result(const DecodeParams& p, const SplitWork& w, unsigned char* smem_raw,
                                                  const float (&m_run)[NHT][2], const float (&l_run)[NHT][2],
                                                  const float (&o)[D / 16][NHT][4], int lane) {
  constexpr int NS = WarpSplitShape<T, D>::kStages, TILE = MmaSmem<T, D>::kTile;
  const int nh = w.nh;
  if (p.S != 1) {
    static_assert(D % 32 == 0 && 8 * NHT * D * sizeof(float) <= NS * 2 * TILE * sizeof(T), "staging area");
    float* ow = reinterpret_cast<float*>(smem_raw);  // [8 NHT][D]
    __syncwarp();  // every lane's last ldmatrix reads of the ring come before the staging writes
    each_fragment<D, NHT>(o, l_run, lane, [&](int g, int d, float v, float l) { ow[g * D + merge_col(g, d)] = v / l; });
    __syncwarp();
    store_staged_partial<D>(p, w, ow, lane, 32);
  } else {
    each_fragment<D, NHT>(o, l_run, lane, [&](int g, int d, float v, float l) {
      if (g < nh) store_value<T>(p, w, g, d, v / l);
    });
  }
  AURA_PHASE(5);
  each_head_state<NHT>(m_run, l_run, lane, [&](int g, float m, float l) {
    if (g < nh) store_head_lse(p, w, g, m, l);
  });
}

// The split's result from W > 1 warps: their states merge (decode.md §5 within the CTA) through the
// drained ring, [W][16][kMergeRow] o (dims swizzled by merge_col), then m, l and weights.
template <typename T, int D, int NHT>
__device__ __forceinline__ void merge_warp_results(const DecodeParams& p, const SplitWork& w, unsigned char* smem_raw,
                                                   const float (&m_run)[NHT][2], const float (&l_run)[NHT][2],
                                                   const float (&o)[D / 16][NHT][4], int lane, int warp) {
  constexpr int W = WarpSplitShape<T, D>::kWarps;
  const int nh = w.nh;
  __syncthreads();  // every warp is done with the ring
  constexpr int OROW = kMergeRow<D>;
  static_assert(split_merge_conflict_free<D, NHT>(), "end-of-split merge layout");
  float* ow = reinterpret_cast<float*>(smem_raw);
  const WarpStates<W, 16> st{ow + W * 16 * OROW, ow + W * 16 * OROW + W * 16, ow + W * 16 * OROW + 2 * W * 16};
  each_head_state<NHT>(m_run, l_run, lane, [&](int g, float m, float l) { st.m[warp * 16 + g] = m, st.l[warp * 16 + g] = l; });
  each_fragment<D, NHT>(o, l_run, lane, [&](int g, int d, float v, float) { ow[(warp * 16 + g) * OROW + merge_col(g, d)] = v; });
  __syncthreads();
  AURA_PHASE(5);
  st.weigh();
  __syncthreads();
  for (int idx = threadIdx.x; idx < nh * D; idx += W * 32) {
    const int g = idx / D, d = idx % D;
    float acc = 0.f;
#pragma unroll
    for (int wi = 0; wi < W; ++wi) acc += st.weight(wi, g) * ow[(wi * 16 + g) * OROW + merge_col(g, d)];
    store_value<T>(p, w, g, d, acc / st.row_sum(g));
  }
  for (int g = threadIdx.x; g < nh; g += W * 32) store_head_lse(p, w, g, st.row_max(g), st.row_sum(g));
}

// One split: tokens [w.start, w.end) (>= 1) of sequence w.b, KV head w.kvh, query heads
// [w.hq0, w.hq0 + w.nh), whose q copies stage_q_async issued. Writes out and lse (S == 1) or the
// heads' partial rows w.part_row + g. `uses`: this warp's ring steps before this split (bulk barrier
// phases); `trigger`: release the programmatic dependent (the merge) at the end of the main loop.
template <typename T, int D, int NHT, bool BULK, bool TILES = false>
__device__ __forceinline__ void run_split_mma(const DecodeParams& p, const SplitWork& w, unsigned char* smem_raw,
                                              int& uses, bool trigger, const TileMaps* maps = nullptr) {
  using Shape = WarpSplitShape<T, D>;
  constexpr int W = Shape::kWarps, NS = Shape::kStages, ROW = Shape::kRow;
  constexpr int KS = D / 16;                          // QK k-steps = PV m-tiles
  constexpr int CPR = D * int(sizeof(T)) / 16;        // 16-byte chunks per row
  constexpr int CPL = 16 * CPR / 32;                  // chunks per lane per 16-row tile
  constexpr int VEC = 16 / int(sizeof(T));            // elements per 16-byte chunk
  constexpr int TILE = MmaSmem<T, D>::kTile;
  constexpr bool kQInRegs = KS * NHT <= 16;           // B fragments of q held for the whole split
  static_assert(D % 16 == 0 && (16 * CPR) % 32 == 0, "tile shapes");
  static_assert(8 * NHT <= Shape::kMaxHeads, "head tile");
  static_assert(!TILES || (BULK && D % 64 == 0 && size_t(W) * NS * 2 * 16 * D * sizeof(T) + 1024 <=
                                                       size_t(W) * NS * 2 * TILE * sizeof(T)),
                "tile copies: whole 64-dim boxes, and the aligned tile ring inside the padded ring's bytes");
  constexpr int STILE = TILES ? 16 * D : TILE;      // elements of one K or V tile in the ring

  const MmaSmem<T, D> sm(smem_raw);
  T* ring = sm.ring;
  T* qs = sm.qs;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nh = w.nh;
  AURA_PHASE(1);
  T* my_ring = (TILES ? sm.tiles : ring) + warp * NS * 2 * STILE;

  // ---- this warp's steps: s = warp, warp + W, ... of the split's ceil(len / 16)
  const int n_steps = ceil_div(w.end - w.start, 16);
  const int my_n = n_steps > warp ? ceil_div(n_steps - warp, W) : 0;
  auto step_t0 = [&](int i) { return w.start + (warp + W * i) * 16; };

  // ---- copies, by the engine the host picked (launch_split): TILES (tensor-map boxes), BULK (a bulk copy
  // per row: fewest issue instructions for long splits) or cp.async (lowest latency for short ones).
  // Rows past the end are zero-filled: P = 0 must meet finite V. (The ring stays in closures here: as a
  // struct it compiled to slower code, decode.md §13.)
  const bool paged = p.block_table != nullptr;
  const bool linear = !paged || p.page_size % 16 == 0;  // a step's rows are consecutive in memory
  const T* kg = static_cast<const T*>(p.k);
  const T* vg = static_cast<const T*>(p.v);
  const int64_t k_head = paged ? w.kvh * p.k_s2 : w.b * p.k_s0 + w.kvh * p.k_s1;
  const int64_t v_head = paged ? w.kvh * p.v_s2 : w.b * p.v_s0 + w.kvh * p.v_s1;
  const int k_rs = int(paged ? p.k_s1 : p.k_s2), v_rs = int(paged ? p.v_s1 : p.v_s2);  // row strides (host: fit int32)
  // Paged: the page (and row in page) of a step's first row (pages of 16k tokens) or of this lane's
  // row (any page size), resolved one step before its copies: off their issue path.
  const bool per_row = !linear;
  auto locate = [&](int i, int& page, int& row) {
    page = 0, row = 0;
    const int t = step_t0(i) + (per_row ? (lane & 15) : 0);
    if (paged && i < my_n && t < w.end) {
      page = min(max(p.block_table[w.b * p.bt_sb + t / p.page_size], 0), p.num_blocks - 1);  // never outside
      row = t % p.page_size;
    }
  };
  int next_page, next_row;
  locate(0, next_page, next_row);
  uint64_t* bars = sm.bars + warp * NS;  // this warp's, BULK
  const int u0 = uses;  // bulk barriers: step i of this split is the warp's step u0 + i through its ring
  auto slot = [&](int i) { return (u0 + i) % NS; };
  auto issue = [&](int i) {  // step i into ring slot slot(i)
    if (i < my_n) {
      const int t0 = step_t0(i), n_rows = w.end - t0;
      const int page = next_page, row = next_row;
      locate(i + 1, next_page, next_row);
      T* kd = my_ring + slot(i) * 2 * STILE;
      T* vd = kd + STILE;
      if constexpr (TILES) {
        // whole boxes: rows past T_cap land as zeros, rows in [w.end, T_cap) are zeroed in V after
        // they land (the main loop): P = 0 must meet finite V
        fence_proxy_async_shared();
        __syncwarp();
        if (lane == 0) {
          mbar_arrive_expect_tx(bars + slot(i), unsigned(2 * 16 * D * sizeof(T)));
          // box coordinates, innermost first: contiguous (d, t, h, b), paged (d, h, row in page, page)
          const int c1 = paged ? w.kvh : t0, c2 = paged ? row : w.kvh, c3 = paged ? page : w.b;
#pragma unroll
          for (int c = 0; c < D / 64; ++c) {
            tensor_copy_g2s_4d(kd + c * 16 * 64, &maps->k, c * 64, c1, c2, c3, bars + slot(i));
            tensor_copy_g2s_4d(vd + c * 16 * 64, &maps->v, c * 64, c1, c2, c3, bars + slot(i));
          }
        }
      } else if constexpr (BULK) {
        const bool is_v = lane >= 16, ok = (lane & 15) < n_rows;
        const int r = lane & 15;
        // contiguous caches only (the launcher never pairs BULK with a block table)
        const int64_t off = is_v ? int64_t(t0 + r) * p.v_s2 + v_head : int64_t(t0 + r) * p.k_s2 + k_head;
        T* dst = (is_v ? vd : kd) + r * ROW;
        fence_proxy_async_shared();  // this lane's ldmatrix reads of the slot come before the refill
        __syncwarp();
        if (lane == 0) mbar_arrive_expect_tx(bars + slot(i), unsigned(2 * min(16, n_rows) * D * sizeof(T)));
        __syncwarp();  // the expected bytes are posted before any copy can complete
        if (ok) {
          bulk_copy_g2s(dst, (is_v ? vg : kg) + off, unsigned(D * sizeof(T)), bars + slot(i));
        } else {
#pragma unroll
          for (int c = 0; c < CPR; ++c) reinterpret_cast<uint4*>(dst)[c] = make_uint4(0, 0, 0, 0);
        }
      } else if (linear) {
        const T* ks = kg + k_head + (paged ? page * p.k_s0 + row * p.k_s1 : int64_t(t0) * p.k_s2);
        const T* vs = vg + v_head + (paged ? page * p.v_s0 + row * p.v_s1 : int64_t(t0) * p.v_s2);
#pragma unroll
        for (int j = 0; j < CPL; ++j) {
          const int idx = lane + 32 * j, r = idx / CPR, c = (idx % CPR) * VEC;
          const bool ok = r < n_rows;
          cp_async16(kd + r * ROW + c, ok ? ks + r * k_rs + c : kg, ok);
          cp_async16(vd + r * ROW + c, ok ? vs + r * v_rs + c : vg, ok);
        }
      } else {
#pragma unroll
        for (int j = 0; j < CPL; ++j) {
          const int idx = lane + 32 * j, r = idx / CPR, c = (idx % CPR) * VEC;
          const bool ok = r < n_rows;
          const int pg = __shfl_sync(0xffffffffu, page, r), rw = __shfl_sync(0xffffffffu, row, r);
          cp_async16(kd + r * ROW + c, ok ? kg + k_head + pg * p.k_s0 + rw * p.k_s1 + c : kg, ok);
          cp_async16(vd + r * ROW + c, ok ? vg + v_head + pg * p.v_s0 + rw * p.v_s1 + c : vg, ok);
        }
      }
    }
    if constexpr (!BULK) cp_async_commit();  // one group per step (empty past the end)
  };
#pragma unroll
  for (int i = 0; i < NS - 1; ++i) issue(i);  // the ring fills while q is staged

  if (p.q_vec16) {  // q's group is older than the ring's NS - 1 (cp.async) or the only one (bulk)
    if constexpr (BULK) cp_async_wait<0>();
    else cp_async_wait<NS - 1>();
  } else {
    stage_q_elementwise<T, D, NHT, W * 32>(p, w, qs);
  }
  __syncthreads();  // the only CTA barrier before the end: q visible to every warp
  AURA_PHASE(2);

  const int qb_row = lane & 7, qb_col = 8 * ((lane >> 3) & 1);  // q: B tiles, rows = heads
  uint32_t qreg[kQInRegs ? NHT : 1][kQInRegs ? KS : 1][2];
  load_q_fragments<T, D, NHT, kQInRegs>(qs, qb_row, qb_col, qreg);

  // Per head column (tile n, column e = head n*8 + 2*(lane%4) + e): running max (warp-uniform
  // per column), this lane's share of the sum, and O^T fragments [m-tile][n][4].
  float m_run[NHT][2], l_run[NHT][2], o[KS][NHT][4];
#pragma unroll
  for (int n = 0; n < NHT; ++n) m_run[n][0] = m_run[n][1] = -INFINITY, l_run[n][0] = l_run[n][1] = 0.f;
#pragma unroll
  for (int mt = 0; mt < KS; ++mt)
#pragma unroll
    for (int n = 0; n < NHT; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  const int a_row = (lane & 7) + 8 * ((lane >> 3) & 1), a_col = 8 * (lane >> 4);  // K: A tiles, rows = tokens
  const int v_row = (lane & 7) + 8 * (lane >> 4), v_col = 8 * ((lane >> 3) & 1);  // V^T: A tiles via .trans

  for (int i = 0; i < my_n; ++i) {
    __syncwarp();  // every lane is done reading the slot the next copy overwrites
    issue(i + NS - 1);
    if constexpr (BULK) {
      mbar_wait(bars + slot(i), ((u0 + i) / NS) & 1);  // step i's copies have landed
    } else {
      cp_async_wait<NS - 1>();  // step i's group has landed (for this lane)
    }
    const int t0 = step_t0(i);
    if constexpr (TILES) {
      const int n_rows = w.end - t0;
      if (n_rows < 16) {  // the split's last step: V rows past the end hold other tokens (or garbage)
        T* vz = my_ring + slot(i) * 2 * STILE + STILE;
        for (int idx = lane; idx < (16 - n_rows) * (D / 8); idx += 32) {
          const int r = n_rows + idx / (D / 8), c = (idx % (D / 8)) * 8;
          *reinterpret_cast<uint4*>(vz + tile_off(r, c)) = make_uint4(0, 0, 0, 0);
        }
      }
    }
    __syncwarp();  // ... and for the whole warp, with its zeroed tail rows
    const T* kt = my_ring + slot(i) * 2 * STILE;
    const T* vt = kt + STILE;

    float s[NHT][2][4] = {};
    compute_scores<T, D, NHT, TILES, kQInRegs>(kt, qs, qreg, a_row, a_col, qb_row, qb_col, s);
    // softmax: rows of S^T are tokens lane/4 (c0, c1) and lane/4 + 8 (c2, c3)
    const bool ok_lo = t0 + (lane >> 2) < w.end, ok_hi = t0 + (lane >> 2) + 8 < w.end;
    uint32_t pb[NHT][2];
    float alpha[NHT][2];
    bool grew = false;
#pragma unroll
    for (int n = 0; n < NHT; ++n) {
      float x[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const bool ok = c < 2 ? ok_lo : ok_hi;
        x[c] = ok ? (s[n][0][c] + s[n][1][c]) * p.scale_log2 : -INFINITY;
      }
      float pr[4];
      grew |= online_softmax_tile(x, m_run[n], l_run[n], pr, alpha[n]);
      // P^T as the B operand (k = tokens, n = heads): transpose both 8x8 halves in registers
      pb[n][0] = movmatrix_trans(pack2<T>(pr[0], pr[1]));  // tokens 0-7
      pb[n][1] = movmatrix_trans(pack2<T>(pr[2], pr[3]));  // tokens 8-15
    }
    // rescale O only when some running max moved (rarely, after the first steps): a warp-uniform branch
    if (__any_sync(0xffffffffu, grew)) {
      rescale_output(o, alpha);
    }
    accumulate_pv<T, D, NHT, TILES>(vt, pb, v_row, v_col, o);
  }
  AURA_PHASE(4);
  if constexpr (!BULK) cp_async_wait<0>();  // only empty groups remain; drain before the ring is reused
  uses = u0 + my_n;
  if (trigger) grid_dependents_launch();  // the merge (programmatic dependent launch) may start its prologue

  sum_row_shares<D, NHT>(l_run);
  if constexpr (W == 1) {
    write_warp_result<T, D, NHT>(p, w, smem_raw, m_run, l_run, o, lane);
  } else {
    merge_warp_results<T, D, NHT>(p, w, smem_raw, m_run, l_run, o, lane, warp);
  }
  AURA_PHASE(6);
}

// The static schedule: grid (S, Hkv * head_tiles, B), one split per CTA (decode.md §4).
template <typename T, int D, int NHT, bool BULK, bool TILES = false>
__global__ void __launch_bounds__(WarpSplitShape<T, D>::kWarps * 32)
    flash_decode_split_mma_kernel(const DecodeParams p, const __grid_constant__ TileMaps maps) {
  AURA_PHASE(0);
  SplitWork w;
  plan_split_heads(p, w);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const MmaSmem<T, D> sm(smem_raw);
  stage_q_async<T, D, NHT>(p, w, sm.qs);  // before seq_lens: q is the first request
  if (!plan_split_tokens<T>(p, w)) {
    cp_async_wait<0>();  // q's copies land before the shared memory is handed on
    return;
  }
  init_ring_barriers<T, D, BULK>(sm.bars);
  int uses = 0;
  run_split_mma<T, D, NHT, BULK, TILES>(p, w, smem_raw, uses, true, &maps);
}

}  // namespace aura
