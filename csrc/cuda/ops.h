// Declarations of every CUDA op implementation; register.cpp binds them to the schemas defined in
// torch_aura/_schema.py (the only place a schema is written). Signatures mirror the schemas:
// Tensor? -> std::optional<Tensor>, float? -> std::optional<double>, int -> int64_t.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

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

// aura.cu (docs/aura-format.md)
using torch::headeronly::ScalarType;
Tensor hadamard_rotate_cuda(Tensor x, std::optional<Tensor> sign_mask, double scale, bool inverse);
std::tuple<Tensor, Tensor> aura_encode_cuda(Tensor x, Tensor codebook, Tensor boundaries, int64_t bits,
                                            std::optional<Tensor> sign_mask);
void aura_write_cache_cuda(Tensor x, Tensor codes_cache, Tensor norms_cache, Tensor slot_mapping, Tensor codebook,
                           Tensor boundaries, int64_t bits, std::optional<Tensor> sign_mask, bool paged);
void aura_append_cuda(Tensor k, Tensor v, Tensor k_codes, Tensor k_norms, Tensor v_codes, Tensor v_norms,
                      Tensor seq_lens, Tensor k_codebook, Tensor k_boundaries, Tensor v_codebook, Tensor v_boundaries,
                      int64_t key_bits, int64_t value_bits, std::optional<Tensor> k_sign_mask,
                      std::optional<Tensor> v_sign_mask, std::optional<Tensor> block_table);
Tensor aura_dequantize_cuda(Tensor codes, Tensor norms, Tensor codebook, int64_t bits, std::optional<Tensor> sign_mask,
                            std::optional<ScalarType> out_dtype);
std::tuple<Tensor, Tensor, Tensor> aura_flash_p1_cuda(Tensor q_rot, Tensor k_codes, Tensor k_norms, Tensor v_codes,
                                                      Tensor v_norms, Tensor seq_lens, Tensor k_codebook,
                                                      Tensor v_codebook, int64_t key_bits, int64_t value_bits,
                                                      std::optional<Tensor> block_table, int64_t block_size);
std::tuple<Tensor, Tensor> aura_flash_p2_cuda(Tensor o, Tensor m, Tensor l, std::optional<Tensor> v_sign_mask,
                                              std::optional<ScalarType> out_dtype);
std::tuple<Tensor, Tensor> aura_decode_cuda(Tensor q, Tensor k_codes, Tensor k_norms, Tensor v_codes, Tensor v_norms,
                                            Tensor seq_lens, Tensor k_codebook, Tensor v_codebook, Tensor k_sign_mask,
                                            Tensor v_sign_mask, int64_t key_bits, int64_t value_bits,
                                            std::optional<Tensor> block_table, std::optional<double> scale,
                                            int64_t num_splits);
}  // namespace aura
