// attn/sdpa.hpp: scaled dot-product attention, softmax(scale * q k^T, masked over keys) v, for self and cross attention.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attn/half.hpp"
#include "attn/mask.hpp"
#include "attn/options.hpp"
#include "attn/tensor.hpp"

namespace attn {

// The options of one call: the shared ones (AttentionOptions, attn/options.hpp) and what only SDPA returns.
struct SdpaOptions : AttentionOptions {
    bool return_weights = false;
    // Also return each query row's log-sum-exp, lse = log(sum over allowed keys j of exp(s'_j)) with s' the final
    // logit (scaled, soft-capped, biased), in the compute type (float for the 16-bit types): what the backward pass
    // (attn/backward.hpp) recomputes the weights from, p_j = exp(s'_j - lse). -inf for a row with no allowed key.
    bool return_lse = false;
};

// The standard ALiBi slopes of `heads` heads (Press et al.): 2^(-8 h / H) for h = 1..H when H is a power of two;
// otherwise those of the power of two n below H, then every other slope of 2n (2^(-4 (2 h - 1) / n)) for the
// remaining H - n heads. Round them to the inputs' dtype to pass them as SdpaOptions::alibi_slopes.
std::vector<double> alibi_slopes(Index heads);

template <class T>
struct SdpaResult {
    Tensor<T> output;                  // (..., Tq, Dv)
    std::optional<Tensor<T>> weights;  // (..., Tq, Tk) when options.return_weights
    std::optional<Tensor<compute_t<T>>> lse = std::nullopt;  // (..., Tq) when options.return_lse
};

// q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv); leading dims broadcast (NumPy rules) to the batch shape.
// allowed_mask: bool, broadcastable to (batch..., Tq, Tk); true = may attend. Masks apply to logits (-inf) before
// the softmax over keys. Values in key/value rows that no query may read never change the output.
// Errors (attn::Error): ShapeError for ranks, sizes and broadcasting; MaskError for an empty row under Throw;
// ValueError for a NaN/Inf at a readable position while check_finite is on; ConfigError for a bad option.
SdpaResult<float> scaled_dot_product_attention(TensorView<const float> q, TensorView<const float> k,
                                               TensorView<const float> v,
                                               std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                               const SdpaOptions& options = {});
SdpaResult<double> scaled_dot_product_attention(TensorView<const double> q, TensorView<const double> k,
                                                TensorView<const double> v,
                                                std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                                const SdpaOptions& options = {});
// 16-bit storage (attn/half.hpp): q, k and v are read exactly into float32, the logits, the softmax and the weighted
// sum are computed and accumulated in float32 by the same kernels, and the output (and the weights) are rounded to
// the storage type once, at the end. No intermediate is rounded to 16 bits (oracle::ErrorModel's storage fields
// describe kernels that do, e.g. FlashAttention's P rounded before the P V product).
SdpaResult<float16> scaled_dot_product_attention(TensorView<const float16> q, TensorView<const float16> k,
                                                 TensorView<const float16> v,
                                                 std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                                 const SdpaOptions& options = {});
SdpaResult<bfloat16> scaled_dot_product_attention(TensorView<const bfloat16> q, TensorView<const bfloat16> k,
                                                  TensorView<const bfloat16> v,
                                                  std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                                  const SdpaOptions& options = {});

// The same call writing the output into `out`, a contiguous tensor of the output's shape that the caller owns and
// may reuse from call to call: no allocation, and no first touch of fresh pages, which costs as much as the kernel
// on a large output. Bitwise the output of scaled_dot_product_attention. ShapeError for another shape or a strided
// `out`, ConfigError when it overlaps an input or options.return_weights or return_lse is set (they need the other
// call).
void scaled_dot_product_attention_into(TensorView<float> out, TensorView<const float> q, TensorView<const float> k,
                                       TensorView<const float> v,
                                       std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                       const SdpaOptions& options = {});
void scaled_dot_product_attention_into(TensorView<double> out, TensorView<const double> q, TensorView<const double> k,
                                       TensorView<const double> v,
                                       std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                       const SdpaOptions& options = {});
void scaled_dot_product_attention_into(TensorView<float16> out, TensorView<const float16> q,
                                       TensorView<const float16> k, TensorView<const float16> v,
                                       std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                       const SdpaOptions& options = {});
void scaled_dot_product_attention_into(TensorView<bfloat16> out, TensorView<const bfloat16> q,
                                       TensorView<const bfloat16> k, TensorView<const bfloat16> v,
                                       std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                       const SdpaOptions& options = {});

}  // namespace attn
