// Split-K flash decoding kernels (docs/decode.md): one query token per sequence against a dense
// KV cache, contiguous [B, Hkv, T_cap, D] or paged [num_blocks, page_size, Hkv, D].
//
// A CTA owns (split, KV head, sequence) and the group's query heads, so each K/V byte of a split
// crosses HBM once for the group (decode.md §3). fp16/bf16 take the tensor-core kernel, fp32 the CUDA-core
// one (exact fp32 products). The split rule runs on the device from seq_lens, bit for bit the
// reference's split_chunk, so the host fixes S from static values only (decode.md §4, §8).
//
// The kernels by concern: decode_plan.cuh (parameters, split rule, epilogue stores), decode_simt.cuh
// (fp32), decode_tiles.cuh (tensor-map copies), decode_mma.cuh (fp16/bf16 warp-split), decode_dims.cuh
// (D = 512 across warps), decode_balanced.cuh and decode_streamk.cuh (the two schedules past the static
// splits), decode_merge.cuh (the merge).
#pragma once

#include "decode_plan.cuh"
#include "decode_simt.cuh"
#include "decode_tiles.cuh"
#include "decode_mma.cuh"
#include "decode_dims.cuh"
#include "decode_balanced.cuh"
#include "decode_streamk.cuh"
#include "decode_merge.cuh"
