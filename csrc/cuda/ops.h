// Declarations of every CUDA op implementation; register.cpp binds them to the schemas defined in
// torch_aura/_schema.py (the only place a schema is written). Signatures mirror the schemas:
// Tensor? -> std::optional<Tensor>, float? -> std::optional<double>, int -> int64_t.
#pragma once

#include <torch/csrc/stable/tensor.h>

#include <optional>
#include <tuple>

namespace aura {
using torch::stable::Tensor;

// decode.cu (docs/decode.md)
std::tuple<Tensor, Tensor> flash_decode_cuda(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seq_lens,
                                             std::optional<Tensor> block_table, std::optional<double> scale,
                                             int64_t num_splits);
void flash_decode_out_cuda(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seq_lens,
                           std::optional<Tensor> block_table, std::optional<double> scale, int64_t num_splits,
                           Tensor out, Tensor lse);
std::tuple<Tensor, Tensor> merge_attn_states_cuda(Tensor partial_out, Tensor partial_lse);
}  // namespace aura
