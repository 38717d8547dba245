// AURA compressed KV cache kernels (docs/aura-format.md): the signed Walsh-Hadamard rotation, encode
// (+ the in-place cache write), dequantize, and the compressed-domain split-K decode, pass 1 over
// the packed codes and pass 2 merging the block partials with the inverse rotation fused.
//
// Design: docs/aura-format.md §13. The rotation keeps the reference's stage order (bitwise equal);
// a pass-1 CTA owns every query row of its KV head, so each packed word is read and unpacked once;
// the exact pass 1 splits fp32 into bf16 hi + lo so tensor cores give fp32-grade logits.
//
// By concern: aura_common.cuh (dtypes, row indexer, code layout), aura_rotate.cuh, aura_codec.cuh
// (encode, dequantize), aura_append.cuh (the fused append), aura_pass1_plan.cuh (what both pass-1
// kernels share), aura_pass1_exact.cuh (fp32 queries), aura_pass1_warp.cuh (fp16 / bf16 queries),
// aura_pass1.cuh (dispatch), aura_pass2.cuh.
#pragma once

#include "aura_common.cuh"
#include "aura_rotate.cuh"
#include "aura_codec.cuh"
#include "aura_append.cuh"
#include "aura_pass1.cuh"
#include "aura_pass2.cuh"
