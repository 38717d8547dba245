// cu_seqlens as every GDN kernel reads it, through any parameter struct P with the fields varlen,
// cu_is_i64 and tokens.
#pragma once

#include "aura_compat.h"

// Offset i of cu_seqlens, clamped to [0, T]: a bad offset (the reference rejects it, a direct
// call does not) must not send a kernel outside the tensors.
template <class P>
inline int gdn_cu(device const int* cu, constant P& p, int i) {
  return clamp(p.cu_is_i64 ? cu[2 * i] : cu[i], 0, p.tokens);  // int64: the low little-endian word
}

// Token range of a sequence: (batch row, bos, eos) of sequence n.
template <class P>
inline void gdn_sequence(device const int* cu, constant P& p, int n, thread int& b, thread int& bos, thread int& eos) {
  b = p.varlen ? 0 : n;
  bos = p.varlen ? gdn_cu(cu, p, n) : 0;
  eos = p.varlen ? gdn_cu(cu, p, n + 1) : p.tokens;
}
