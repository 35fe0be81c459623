// scaled_dot_product_attention: validate, check the contracts, dispatch to a backend.
#include "attn/sdpa.hpp"

#include "attn/problem.hpp"
#include "attn/tiled.hpp"
#include "backends.hpp"

namespace attn {

const char* to_string(EmptyRowPolicy policy) {
    switch (policy) {
        case EmptyRowPolicy::Throw: return "throw";
        case EmptyRowPolicy::Zero: return "zero";
        case EmptyRowPolicy::Nan: return "nan";
    }
    return "?";
}

const char* to_string(Backend backend) {
    switch (backend) {
        case Backend::Auto: return "auto";
        case Backend::Reference: return "reference";
        case Backend::Tiled: return "tiled";
    }
    return "?";
}

namespace {

// Backend::Auto picks `tiled` from this many scores per batch element (Tq * Tk) on: one full query block by one
// full key block. Below it the work per batch element is a few tiles and the simpler `reference` costs about the
// same. Weights requested => `reference`, the only backend that materialises them.
constexpr Index auto_tiled_min_scores = tiled_query_block * tiled_key_block;

Backend resolve(Backend requested, const SdpaOptions& options, Index Tq, Index Tk) {
    if (options.return_weights) return Backend::Reference;  // tiled never forms the (Tq, Tk) weights
    if (requested != Backend::Auto) return requested;
    return Tq * Tk >= auto_tiled_min_scores ? Backend::Tiled : Backend::Reference;
}

template <class T>
SdpaResult<T> sdpa(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                   std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) {
    const SdpaProblem<T> problem = make_sdpa_problem<T>("sdpa", q, k, v, allowed_mask, options);
    const std::vector<Readability> readable = check_contracts(problem, options);
    SdpaResult<T> result{Tensor<T>(problem.output_shape()), std::nullopt};
    if (options.return_weights) result.weights = Tensor<T>(problem.weights_shape());
    T* weights = result.weights ? result.weights->data() : nullptr;
    switch (resolve(options.backend, options, problem.Tq, problem.Tk)) {
        case Backend::Auto:
        case Backend::Reference:
            detail::sdpa_reference(problem, readable, options, result.output.data(), weights);
            break;
        case Backend::Tiled:
            detail::sdpa_tiled(problem, readable, options, result.output.data());
            break;
    }
    return result;
}

}  // namespace

SdpaResult<float> scaled_dot_product_attention(TensorView<const float> q, TensorView<const float> k,
                                               TensorView<const float> v,
                                               std::optional<TensorView<const bool>> allowed_mask,
                                               const SdpaOptions& options) {
    return sdpa<float>(q, k, v, allowed_mask, options);
}

SdpaResult<double> scaled_dot_product_attention(TensorView<const double> q, TensorView<const double> k,
                                                TensorView<const double> v,
                                                std::optional<TensorView<const bool>> allowed_mask,
                                                const SdpaOptions& options) {
    return sdpa<double>(q, k, v, allowed_mask, options);
}

}  // namespace attn
