// Internal: the MHA head path after validation (split -> SDPA over (B, H) -> merge, dropout), shared by
// MultiHeadAttention and multi_head_sdpa. The contracts it relies on are in attn/detail/mha_problem.hpp.
#pragma once

#include <optional>
#include <string>

#include "attn/detail/mha_problem.hpp"
#include "attn/mha.hpp"

namespace attn::detail {

// ConfigError unless the dropout probability is in [0, 1).
void check_dropout(const std::string& function, double p);

// The head path shared by the module and multi_head_sdpa, after validation and the contract checks:
//   q (B, Tq, H*Dk), k (B, Tk, G*Dk), v (B, Tk, G*Dv) -> context (B, Tq, H*Dv) (+ weights).
// Instantiated for float and double.
template <class T>
MhaResult<T> attend_heads(const std::string& function, TensorView<const T> q, TensorView<const T> k,
                          TensorView<const T> v, Index H, Index G, const HeadMasks& masks, const HeadBias<T>& bias,
                          const HeadReadability& readable, const MhaOptions& options, const MhaDropout& dropout);

}  // namespace attn::detail
