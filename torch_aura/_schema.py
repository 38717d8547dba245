"""The one table of every ``torch.ops.aura.*`` schema.

``torch_aura/__init__.py`` defines each entry through ``torch.library.Library("aura", "DEF")``
before any extension loads. C++, Objective-C++ and Triton code only ever add implementations
(``*_IMPL`` blocks or ``Library.impl``): a schema is written here and nowhere else.

Why ``Library.define`` and not ``torch.library.custom_op``: the per-call Python overhead of a
``custom_op`` (~10 us) is as large as a whole batch-1 decode kernel; ``define`` + ``impl`` costs
~3 us (see ``docs/style.md`` of the project and vLLM's ``direct_register_custom_op``).

Each entry: name -> ``OpDef(family, schema, doc)``. ``family`` selects the check module
(``torch_aura/_checks/<family>.py``), the reference (``torch_aura/reference/<family>.py``) and
which GPU backend is expected to serve it (``CUDA_PROVIDER``). Argument order and defaults here are
the contract; the public wrappers in ``torch_aura.ops`` mirror them exactly (a test checks that).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OpDef:
    family: str  # "decode" | "aura" | "gdn"
    schema: str  # the schema without the "aura::" prefix
    doc: str  # one line: what the op computes

    @property
    def name(self) -> str:
        return self.schema.split("(", 1)[0]

    @property
    def mutates(self) -> bool:
        return "!)" in self.schema


# Every op claims to work under PT2 (opcheck proves it in tests/registration).
TAGS = (torch.Tag.pt2_compliant_tag,)

# Which implementation serves the CUDA key, per family (ops.md: Triton for GDN, CUDA C++ else).
CUDA_PROVIDER = {"decode": "cuda", "aura": "cuda", "gdn": "triton"}

_OPS = [
    # ---------------------------------------------------------------- 1. dense decode (decode.md)
    # One query token per sequence against a contiguous or paged KV cache, split-K + merge.
    OpDef("decode", "flash_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seq_lens, "
          "Tensor? block_table=None, float? scale=None, int num_splits=0) -> (Tensor out, Tensor lse)",
          "decode attention, one query per sequence; returns (out [B,Hq,D], lse [B,Hq] fp32)"),
    # Same launcher writing caller-owned buffers (serving engines, fixed addresses in CUDA graphs).
    OpDef("decode", "flash_decode_out(Tensor q, Tensor k_cache, Tensor v_cache, Tensor seq_lens, "
          "Tensor? block_table, float? scale, int num_splits, Tensor(a!) out, Tensor(b!) lse) -> ()",
          "flash_decode writing into caller-owned out [B,Hq,D] and lse [B,Hq]"),
    # Log-sum-exp merge of split partials; splits with lse = -inf are skipped, never multiplied.
    OpDef("decode", "merge_attn_states(Tensor partial_out, Tensor partial_lse) -> (Tensor out, Tensor lse)",
          "merge partials [S,B,Hq,D] + lse [S,B,Hq] into (out [B,Hq,D], lse [B,Hq])"),
    # ------------------------------------------------------- 2. AURA compressed KV (aura-format.md)
    # y = scale * H diag(s) x / sqrt(D) over the last dim (fast Walsh-Hadamard), or its inverse.
    OpDef("aura", "hadamard_rotate(Tensor x, Tensor? sign_mask=None, float scale=1., "
          "bool inverse=False) -> Tensor",
          "signed Hadamard rotation of the last dim (or its inverse), x's dtype out"),
    # Norm/direction split, rotation, Lloyd-Max quantization, bit packing (aura-format.md 5-6).
    OpDef("aura", "aura_encode(Tensor x, Tensor codebook, Tensor boundaries, int bits, "
          "Tensor? sign_mask=None) -> (Tensor codes, Tensor norms)",
          "x [...,D] -> (codes int32 [...,PW], corrected norms fp32 [...])"),
    # Encode x [N,Hkv,D] straight into cache slots; slot < 0 skips the row (padding).
    OpDef("aura", "aura_write_cache(Tensor x, Tensor(a!) codes_cache, Tensor(b!) norms_cache, "
          "Tensor slot_mapping, Tensor codebook, Tensor boundaries, int bits, "
          "Tensor? sign_mask=None, bool paged=False) -> ()",
          "encode x [N,Hkv,D] in place into contiguous or paged cache slots"),
    # One launch per cache write (AuraCache.append): token i of row b encoded into position
    # seq_lens[b] + i of the K and V caches (positions past the capacity skipped), seq_lens += L.
    OpDef("aura", "aura_append(Tensor k, Tensor v, Tensor(a!) k_codes, Tensor(b!) k_norms, "
          "Tensor(c!) v_codes, Tensor(d!) v_norms, Tensor(e!) seq_lens, Tensor k_codebook, "
          "Tensor k_boundaries, Tensor v_codebook, Tensor v_boundaries, int key_bits, int value_bits, "
          "Tensor? k_sign_mask=None, Tensor? v_sign_mask=None, Tensor? block_table=None) -> ()",
          "encode k, v [B,L,Hkv,D] at each row's seq_lens into a contiguous or paged cache; seq_lens += L"),
    # codes + norms -> vectors; rotated domain, or original domain when the sign mask is given.
    OpDef("aura", "aura_dequantize(Tensor codes, Tensor norms, Tensor codebook, int bits, "
          "Tensor? sign_mask=None, ScalarType? out_dtype=None) -> Tensor",
          "codes [...,PW] + norms [...] -> vectors [...,D] (rotated unless sign_mask is given)"),
    # Split-K pass 1 in the compressed domain; q [B,Hq,D] or causal [B,L,Hq,D], already rotated.
    OpDef("aura", "aura_flash_p1(Tensor q_rot, Tensor k_codes, Tensor k_norms, Tensor v_codes, "
          "Tensor v_norms, Tensor seq_lens, Tensor k_codebook, Tensor v_codebook, int key_bits, "
          "int value_bits, Tensor? block_table=None, int block_size=64) -> (Tensor o, Tensor m, Tensor l)",
          "per-block partials o [B,(L,)Hq,NB,D], m and l [B,(L,)Hq,NB], fp32, rotated domain"),
    # Merge of pass-1 partials; with the V sign mask also the inverse Hadamard + sign undo.
    OpDef("aura", "aura_flash_p2(Tensor o, Tensor m, Tensor l, Tensor? v_sign_mask=None, "
          "ScalarType? out_dtype=None) -> (Tensor out, Tensor lse)",
          "merge partials into (out [B,(L,)Hq,D], lse [B,(L,)Hq]); un-rotates given v_sign_mask"),
    # Whole compressed decode: rotate q (scale folded in), pass 1, fused pass 2.
    OpDef("aura", "aura_decode(Tensor q, Tensor k_codes, Tensor k_norms, Tensor v_codes, "
          "Tensor v_norms, Tensor seq_lens, Tensor k_codebook, Tensor v_codebook, "
          "Tensor k_sign_mask, Tensor v_sign_mask, int key_bits, int value_bits, "
          "Tensor? block_table=None, float? scale=None, int num_splits=0) -> (Tensor out, Tensor lse)",
          "attention over an AURA cache; q [B,Hq,D] or causal [B,L,Hq,D]; returns (out, lse)"),
    # ------------------------------------------------------------------ 3. Gated DeltaNet (gdn.md)
    # Whole chunked forward (BT = 64): l2norm?, cumsum, kkt+solve, w/u, state pass, outputs.
    OpDef("gdn", "gdn_chunk(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, float? scale=None, "
          "Tensor? initial_state=None, Tensor? cu_seqlens=None, Tensor? chunk_indices=None, "
          "bool use_qk_l2norm=False, bool state_v_first=False) -> (Tensor o, Tensor final_state)",
          "chunked gated delta rule; returns (o [B,T,HV,V], final_state [N,HV,K,V] fp32)"),
    # Inclusive cumsum of the log decay, reset at every 64-token chunk start.
    OpDef("gdn", "gdn_chunk_cumsum(Tensor g, Tensor? cu_seqlens=None, Tensor? chunk_indices=None) -> Tensor",
          "chunk-local inclusive cumsum of g [B,T,HV] -> g_cum fp32 [B,T,HV]"),
    # Per chunk: (I + A)^-1 of the gated, strictly lower beta * K K^T.
    OpDef("gdn", "gdn_kkt_solve(Tensor k, Tensor g_cum, Tensor beta, Tensor? cu_seqlens=None, "
          "Tensor? chunk_indices=None) -> Tensor",
          "Ai [B,T,HV,64] in k's dtype: row t holds row t%64 of its chunk's (I+A)^-1"),
    # WY representation: w = Ai (beta e^G k), u = Ai (beta v).
    OpDef("gdn", "gdn_recompute_w_u(Tensor k, Tensor v, Tensor beta, Tensor Ai, Tensor g_cum, "
          "Tensor? cu_seqlens=None, Tensor? chunk_indices=None) -> (Tensor w, Tensor u)",
          "w [B,T,HV,K] and u [B,T,HV,V]"),
    # The only sequential stage: states entering each chunk, per-token deltas, final state.
    OpDef("gdn", "gdn_fwd_h(Tensor k, Tensor w, Tensor u, Tensor g_cum, Tensor? initial_state=None, "
          "Tensor? cu_seqlens=None, Tensor? chunk_indices=None, bool state_v_first=False) "
          "-> (Tensor h, Tensor v_new, Tensor final_state)",
          "h [B,NT,HV,K,V], v_new [B,T,HV,V], final_state [N,HV,K,V] fp32"),
    # Chunk outputs from the entering states and the intra-chunk causal part.
    OpDef("gdn", "gdn_fwd_o(Tensor q, Tensor k, Tensor v_new, Tensor h, Tensor g_cum, float? scale=None, "
          "Tensor? cu_seqlens=None, Tensor? chunk_indices=None, bool state_v_first=False) -> Tensor",
          "o [B,T,HV,V] in q's dtype"),
    # The front end (ops.md §3b): depthwise causal conv over time, bias and SiLU fused; x token-major,
    # so the q / k / v channel slices of y are unit-stride views gdn_chunk takes without a copy.
    OpDef("gdn", "causal_conv1d(Tensor x, Tensor weight, Tensor? bias=None, Tensor(a!)? conv_state=None, "
          "Tensor? cu_seqlens=None, str? activation=None) -> Tensor",
          "y [B,T,C] = act(bias + causal conv of x [B,T,C] with weight [C,W]); conv_state read and rewritten"),
    # Its decode step: conv_state [P,C,S] (S >= W-1) continues each sequence and is rolled in place.
    OpDef("gdn", "causal_conv1d_update(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias=None, "
          "str? activation=None, Tensor? state_indices=None) -> Tensor",
          "y like x [N,(L,)C]; conv_state[state_indices] updated in place, index -1 skips"),
    # Token-by-token recurrence over an in-place fp32 state pool; index -1 skips a sequence.
    OpDef("gdn", "gdn_recurrent(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor(a!) state, "
          "Tensor? state_indices=None, Tensor? cu_seqlens=None, float? scale=None, "
          "bool use_qk_l2norm=False, bool state_v_first=False) -> Tensor",
          "recurrent (decode) step; updates state[state_indices] in place; returns o [B,T,HV,V]"),
]

OPS: dict[str, OpDef] = {op.name: op for op in _OPS}
assert len(OPS) == len(_OPS), "duplicate op name in the schema table"


def ops_of(family: str) -> list[str]:
    """Names of the ops of one family, in table order."""
    return [name for name, op in OPS.items() if op.family == family]
