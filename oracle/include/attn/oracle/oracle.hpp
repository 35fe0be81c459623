// attn/oracle/oracle.hpp: exact-input, high-precision attention with a rigorous per-element forward error bound.
#pragma once

#include <optional>
#include <string>

#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn::oracle {

// How an implementation computes, as far as its rounding errors are concerned. Enters the bound.
struct ErrorModel {
    std::string name = "generic";  // "generic", "reference", "tiled", ...
    double exp_ulps = 4.0;         // max error of the implementation's exp, in ulps of the result
    Index rescalings = -1;         // online-softmax rescalings per row (one per key block); -1 = unknown, assume Tk
    bool scale_folded_into_q = true;  // the scale may be applied to q before the dot product (one more rounding)
};

// A conservative model for a kernel whose structure is unknown (any summation order, folded scale, rescaling
// after every key, exp within 4 ulps).
ErrorModel generic_model();
// The library's backends, as documented in lib/ (reference: BLIS dot products, scale after, glibc exp).
ErrorModel reference_model();
ErrorModel tiled_model(Index key_block);

struct OracleOptions {
    int bits = 0;  // working precision in bits; 0 = the default for the target dtype
    ErrorModel model = generic_model();
};

// The oracle's answer for a target dtype T (float or double).
template <class T>
struct Result {
    Tensor<T> output;                 // (batch..., Tq, Dv), exact result correctly rounded to T
    Tensor<T> weights;                // (batch..., Tq, Tk), idem
    Tensor<double> output_bound;      // per element: rigorous bound on |computed - exact| for a T implementation
    Tensor<double> weights_bound;     // idem for the weights
    Tensor<double> output_scale;      // per element: sum_k p_k |V_k|, the condition-aware scale for relative errors
    Tensor<long double> output_exact; // exact result to ~64 bits, for error measurement (no rounding to T)
    Tensor<long double> weights_exact;
};

// Same contracts as attn::scaled_dot_product_attention (validation, masks, causal alignments, empty-row policies,
// unreachable positions ignored), computed from the exact inputs in high precision.
template <class T>
Result<T> scaled_dot_product_attention(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                       std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options,
                                       const OracleOptions& oracle_options = {});

}  // namespace attn::oracle
