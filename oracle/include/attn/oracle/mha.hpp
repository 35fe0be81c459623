// attn/oracle/mha.hpp: the high-precision counterpart of attn::MultiHeadAttention, with a per-element error bound.
#pragma once

#include <optional>

#include "attn/mha.hpp"
#include "attn/oracle/oracle.hpp"

namespace attn::oracle {

// The module's forward(query_states, key_states, value_states, allowed_mask, options) computed from the exact
// inputs and parameters (read through the module's getters) in high precision: projections, per-head SDPA (query
// head h reads kv head h / (H/G)), merge, output projection. Same masks and contracts as the module: allowed_mask
// 2-D (Tq, Tk), 3-D (B, Tq, Tk) or 4-D broadcastable to (B, H, Tq, Tk), options.key_padding_allowed (B, Tk),
// is_causal with either alignment, options.scale (default 1/sqrt(head_dim)), the empty-row policies per head.
//
// Returns, with the SDPA oracle's Result so compare_output applies unchanged:
//   output (B, Tq, E) correctly rounded to T, output_exact + output_exact_lo the exact value, output_bound a
//   rigorous bound on |computed - exact| for a T implementation with the module's structure whose SDPA core
//   follows oracle_options.model (oracle/BOUNDS.md section 9), output_scale = sum_c |Wo_ec| |context_c| + |bo_e|,
//   oracle_error_ratio as for SDPA (the call throws beyond max_oracle_error_ratio).
// The weights tensors are left empty: only the output is covered.
//
// Not covered, each a ConfigError: dropout (options.training with a module built with dropout > 0; the oracle is
// for inference only). Unlike the module, inputs and parameters must be finite wherever they are read (ValueError
// otherwise, whatever options.check_finite says); rows nobody reads may hold anything.
template <class T>
Result<T> multi_head_attention(const MultiHeadAttention<T>& module, TensorView<const T> query_states,
                               TensorView<const T> key_states, TensorView<const T> value_states,
                               std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options,
                               const OracleOptions& oracle_options = {});

}  // namespace attn::oracle
