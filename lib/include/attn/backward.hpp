// attn/backward.hpp: the backward pass of scaled_dot_product_attention, dq, dk and dv from the output's gradient.
#pragma once

#include <optional>

#include "attn/sdpa.hpp"

namespace attn {

template <class T>
struct SdpaGradients {
    Tensor<T> dq;  // q's shape, as the caller passed it
    Tensor<T> dk;  // k's
    Tensor<T> dv;  // v's
};

// The gradients of L = sum(dout * output) with respect to q, k and v, where
// output = scaled_dot_product_attention(q, k, v, allowed_mask, options): the same inputs, mask and options as the
// forward call that gave `out` and `lse` (options.return_lse), whose return_weights and return_lse are ignored here.
// out (batch..., Tq, Dv) and dout (the same shape) are of q's dtype, lse (batch..., Tq) of its compute type; any
// strides (a dout expanded from one value, stride 0, is fine). The bias and the ALiBi slopes are constants: no
// gradient for them.
//
// With P the weights and s the logit before the cap (scale * q.k), per query row i and allowed key j:
//   dv_j = sum_i P_ij dout_i,  dP_ij = dout_i . v_j,  D_i = sum_j P_ij dP_ij,
//   dS_ij = P_ij (dP_ij - D_i) (1 - tanh^2(s_ij / softcap) with a cap),
//   dq_i = scale sum_j dS_ij k_j,  dk_j = scale sum_i dS_ij q_i.
// The forward's contracts hold: a key no query may read gets dk = dv = 0 exactly, whatever it holds; a query row
// with no allowed key contributes nothing, its dq row is 0 under EmptyRowPolicy::Zero and NaN under Nan (Throw: the
// forward's MaskError); values nobody may read (in q, k, v, dout, out or lse) never reach a gradient. An input
// broadcast over batch elements gets the sum of their gradients (grouped-query attention: k (B, G, 1, Tk, Dk) read
// by q (B, G, R, Tq, Dk) gets dk summed over the R query heads), in increasing batch order: bitwise the same result
// for any thread count.
//
// Backend::Reference: the reference backward materialises P per batch element, recomputing the forward's softmax
// exactly as the reference forward does, and D from P and dP (it reads out and lse for their contract checks only).
// Backend::Tiled: FlashAttention-2's backward (attn/tiled.hpp, TiledBackwardInfo), P = exp(s - lse) from the saved
// lse and D_i = dout_i . out_i from the saved output, key blocks outside and query blocks inside, never a Tq x Tk
// matrix; one thread per batch element, no atomics. out and lse must be what a forward call gave (any backend): a
// wrong lse gives the gradients of another function. With check_finite off and a NaN or Inf in a readable row, that
// batch element runs the reference backward. Backend::Auto: tiled from 128 x 128 scores on, as the forward.
//
// Errors (attn::Error): the forward's, and ShapeError for out, lse or dout of another shape, ValueError for a NaN or
// Inf in a row of out, dout or lse that a query with an allowed key owns (under check_finite) and for a gradient
// that overflows although its inputs are finite.
SdpaGradients<float> sdpa_backward(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                                   TensorView<const float> out, TensorView<const float> lse,
                                   TensorView<const float> dout,
                                   std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                   const SdpaOptions& options = {});
SdpaGradients<double> sdpa_backward(TensorView<const double> q, TensorView<const double> k,
                                    TensorView<const double> v, TensorView<const double> out,
                                    TensorView<const double> lse, TensorView<const double> dout,
                                    std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                    const SdpaOptions& options = {});
// 16-bit storage: computed in float32 and rounded to the storage type once, at the end (after the batch sums).
SdpaGradients<float16> sdpa_backward(TensorView<const float16> q, TensorView<const float16> k,
                                     TensorView<const float16> v, TensorView<const float16> out,
                                     TensorView<const float> lse, TensorView<const float16> dout,
                                     std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                     const SdpaOptions& options = {});
SdpaGradients<bfloat16> sdpa_backward(TensorView<const bfloat16> q, TensorView<const bfloat16> k,
                                      TensorView<const bfloat16> v, TensorView<const bfloat16> out,
                                      TensorView<const float> lse, TensorView<const bfloat16> dout,
                                      std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                      const SdpaOptions& options = {});

}  // namespace attn
