// attn/oracle/backward.hpp: the exact gradients of scaled dot-product attention, for checking a backward pass.
#pragma once

#include <optional>

#include "attn/oracle/oracle.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn::oracle {

template <class T>
struct Gradients {
    Tensor<T> dq, dk, dv;  // the exact gradients correctly rounded to T, of q's, k's and v's shapes
    Tensor<long double> dq_exact, dk_exact, dv_exact;  // the exact gradients to ~64 bits, for error measurement
    Tensor<long double> dq_exact_lo, dk_exact_lo, dv_exact_lo;  // exact = exact + exact_lo (Result's reason)
    // Per element, a rigorous bound on |computed - exact| for an implementation of the backward structure `model`
    // declares (oracle/BOUNDS.md section 12; 12b for weights from the lse and D from the output) whose forward part
    // follows `model` (a soft-cap's derivative included); infinite (claims nothing) when the model may flush a
    // subnormal input. 0 where the gradient is exactly 0 by the contracts.
    Tensor<double> dq_bound, dk_bound, dv_bound;
    ErrorModel model;
    int bits = 0;  // working precision
};

// The gradients of L = sum(dout * output) with respect to q, k and v, output = attn::scaled_dot_product_attention(q,
// k, v, allowed_mask, options), computed from the exact inputs and the exact dout (batch..., Tq, Dv) in 261-bit
// arithmetic: the exact output O, dP = dout v^T, D = rowsum(dout * O), dS = P (dP - D) (times the soft-cap's
// derivative 1 - tanh^2(s / softcap)), dq = scale dS k, dk = scale dS^T q, dv = P^T dout, summed over the batch
// elements a broadcast input is read by. The scale is options.scale (or 1/sqrt(Dk)) as a double; the bias and the
// ALiBi term -slope * |i + Tk - Tq - j| are exact. Same contracts as attn::sdpa_backward (the forward's, dout's
// shape and finite rows; a row with no allowed key has dq 0 under Zero, NaN under Nan; keys nobody may read get
// dk = dv = 0). With check_finite off a NaN or Inf a query reads spreads as exact arithmetic spreads it.
// Its own error (a few units of 2^-261 relative to the sums' magnitudes) is far below any float or double result's
// rounding; the correctly rounded values are exact unless a gradient lies within that of a rounding boundary.
// oracle_options.model: the forward part of the implementation checked (the weights it recomputes), e.g.
// reference_model() for attn::sdpa_backward's reference backend, library_tiled_model(key_block) for its tiled one,
// whose weights come from the forward's saved lse and D from its saved output (section 12b: both bounded as a forward
// of the model computes them, so a backward handed a wrong lse or output fails); its bits are ignored (always 261).
// weight_multipliers (broadcastable to (batch..., Tq, Tk), finite): the output is then sum_j m_ij P_ij v_j, the
// forward whose weights dropout multiplied by 0 or 1/(1-p) (attn::multi_head_sdpa in training mode), and these are
// its gradients (dP_ij = m_ij dout_i . v_j, dv = (m P)^T dout, D and dS from P); the bound (section 12c) is for the
// reference structure with dP and dv's weights each multiplied once in the compute type (ConfigError for a model
// whose weights come from the lse or D from the output).
template <class T>
Gradients<T> sdpa_backward(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                           TensorView<const T> dout, std::optional<TensorView<const bool>> allowed_mask,
                           const SdpaOptions& options, const OracleOptions& oracle_options = {},
                           std::optional<TensorView<const double>> weight_multipliers = std::nullopt);

}  // namespace attn::oracle
