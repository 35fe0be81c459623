// attn/detail/mha_sdpa_path.hpp: internal test glue, no stability promise (not part of attn/attn.hpp). Plain SDPA
// inputs through the MHA module's head path, so the property suite, the fuzzers and the tests can hold that path
// to every SDPA contract. Built from the public API (multi_head_sdpa) and the contract module.
#pragma once

#include <optional>

#include "attn/mha.hpp"
#include "attn/sdpa.hpp"

namespace attn::detail {

// Accepts what scaled_dot_product_attention accepts, q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv) with NumPy
// broadcasting of the batch dims and of allowed_mask, and returns what it returns (output (..., Tq, Dv), weights
// (..., Tq, Tk)). The last batch dim is the heads H, the ones before it fold into B; k and v with one head serve
// every query head (multi-query). Beyond broadcasting, grouped kv heads are accepted in rank 4:
// q (B, H, Tq, Dk), k (B, G, Tk, Dk), v (B, G, Tk, Dv) with H % G == 0, query head h reading kv head h / (H/G).
// The heads are laid out as the module's projected width (B, T, H*D) and the module's path (multi_head_sdpa)
// runs on them: this equals MultiHeadAttention with identity projections exactly for finite inputs (x * 1 plus
// exact zeros; tested), but unlike an identity gemm it does not spread one head's NaN across the whole row
// (NaN * 0 = NaN), which would break SDPA's padding and empty-row contracts that are per head.
// options.scale defaults to 1/sqrt(Dk), as in SDPA. Errors name "mha_sdpa_path" or "multi_head_sdpa".
SdpaResult<float> mha_sdpa_path(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                                std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                const SdpaOptions& options = {});
SdpaResult<double> mha_sdpa_path(TensorView<const double> q, TensorView<const double> k, TensorView<const double> v,
                                 std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                 const SdpaOptions& options = {});
SdpaResult<float16> mha_sdpa_path(TensorView<const float16> q, TensorView<const float16> k, TensorView<const float16> v,
                                  std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                  const SdpaOptions& options = {});
SdpaResult<bfloat16> mha_sdpa_path(TensorView<const bfloat16> q, TensorView<const bfloat16> k,
                                   TensorView<const bfloat16> v,
                                   std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                   const SdpaOptions& options = {});

}  // namespace attn::detail
