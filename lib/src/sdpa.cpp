// scaled_dot_product_attention: validate, check the contracts, dispatch to a backend.
#include "attn/sdpa.hpp"

#include <cmath>
#include <string>
#include <utility>

#include "attn/detail/problem.hpp"
#include "backends.hpp"

namespace attn {

std::vector<double> alibi_slopes(Index heads) {
    if (heads < 0) throw ConfigError("alibi_slopes: heads must be >= 0, got " + std::to_string(heads));
    std::vector<double> slopes;
    if (heads == 0) return slopes;
    Index n = 1;  // the largest power of two <= heads
    while (n * 2 <= heads) n *= 2;
    for (Index h = 1; h <= n; ++h) slopes.push_back(std::exp2(-8.0 * static_cast<double>(h) / static_cast<double>(n)));
    // The rest: slopes 1, 3, 5, ... (1-based) of 2n heads, 2^(-8 (2 h - 1) / (2 n)).
    for (Index h = 1; n + h <= heads; ++h)
        slopes.push_back(std::exp2(-8.0 * static_cast<double>(2 * h - 1) / static_cast<double>(2 * n)));
    return slopes;
}

namespace {

// Backend::Auto picks `tiled` from this many scores per batch element (Tq * Tk) on. Measured with `attn bench`
// (B=1, H=8, D=64, 1 thread): at Tq = Tk = 128 tiled already takes 0.6x (float) and 0.8x (double) of reference's
// time, and the gap grows with T; below 128 x 128 both take microseconds and the simpler reference runs.
// Weights requested => `reference`, the only backend that materialises them. An explicit `tiled` with weights is
// an error rather than a silent switch: whoever names a backend is testing that backend.
using detail::auto_tiled_min_scores;

// The backend a call runs on, once resolve has refused what it refuses.
Backend chosen(Backend requested, const SdpaOptions& options, Index Tq, Index Tk) {
    if (options.return_weights) return Backend::Reference;
    if (requested != Backend::Auto) return requested;
    return Tq * Tk >= auto_tiled_min_scores ? Backend::Tiled : Backend::Reference;
}

Backend resolve(Backend requested, const SdpaOptions& options, Index Tq, Index Tk) {
    if (requested == Backend::Tiled && options.return_weights)
        throw ConfigError("sdpa: backend 'tiled' never forms the (Tq, Tk) weights (Tq=" + std::to_string(Tq) +
                          ", Tk=" + std::to_string(Tk) + ")",
                          Remedy{"backend", {"reference", "auto"}, "to ask for the weights"});
    return chosen(requested, options, Tq, Tk);
}

// check_contracts for the backend the call will run on: the tiled kernel reads every value of q, k, v and the bias
// once anyway, so the contract passes over them are deferred to it where they can be (Readability::values_deferred):
// one read from memory instead of two.
template <class T>
std::vector<Readability> contracts_for(const SdpaProblem<T>& problem, const SdpaOptions& options) {
    const bool tiled = chosen(options.backend, options, problem.Tq, problem.Tk) == Backend::Tiled;
    return check_contracts(problem, options, tiled);
}

// The chosen backend writes the output (every element), and the weights and the lse (when asked) of a checked
// problem.
template <class T>
void run_backend(const SdpaProblem<T>& problem, const std::vector<Readability>& readable, Backend backend,
                 const SdpaOptions& options, T* output, T* weights, compute_t<T>* lse) {
    switch (backend) {
        case Backend::Auto:
        case Backend::Reference:
            detail::sdpa_reference(problem, readable, options, output, weights, lse);
            break;
        case Backend::Tiled:
            if (readable.empty() || !readable.front().values_deferred) {
                detail::sdpa_tiled(problem, readable, options, output, lse);
                break;
            }
            // The values unchecked: when the kernel meets one that is not finite, or refuses anything (which the
            // checks might have refused first), the checks with the values read decide, and the call runs again from
            // the start on what they find.
            try {
                detail::sdpa_tiled(problem, readable, options, output, lse);
                break;
            } catch (const detail::ValuesNeedChecking&) {
            } catch (const Error&) {
            }
            detail::sdpa_tiled(problem, check_contracts(problem, options), options, output, lse);
            break;
    }
}

template <class T>
SdpaResult<T> sdpa(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                   std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) {
    const SdpaProblem<T> problem = make_sdpa_problem<T>("sdpa", q, k, v, allowed_mask, options);
    const std::vector<Readability> readable = contracts_for(problem, options);
    const Backend backend = resolve(options.backend, options, problem.Tq, problem.Tk);
    // The tiled kernel writes every element of every output row (empty rows per the policy included).
    SdpaResult<T> result{backend == Backend::Tiled ? Tensor<T>::uninitialized(problem.output_shape())
                                                   : Tensor<T>(problem.output_shape()),
                         std::nullopt, std::nullopt};
    if (options.return_weights) result.weights = Tensor<T>(problem.weights_shape());
    if (options.return_lse) result.lse = Tensor<compute_t<T>>::uninitialized(problem.lse_shape());
    run_backend(problem, readable, backend, options, result.output.data(),
                result.weights ? result.weights->data() : nullptr, result.lse ? result.lse->data() : nullptr);
    return result;
}

// The bytes a view may touch, [first, last) (empty for no elements).
template <class E>
std::pair<const char*, const char*> byte_range(const TensorView<E>& x) noexcept {
    if (x.numel() == 0) return {nullptr, nullptr};
    Index lo = 0, hi = 0;
    for (Index d = 0; d < x.rank(); ++d) {
        const Index reach = (x.dim(d) - 1) * x.stride(d);
        (reach < 0 ? lo : hi) += reach;
    }
    const char* base = reinterpret_cast<const char*>(x.data());
    return {base + lo * static_cast<Index>(sizeof(E)), base + (hi + 1) * static_cast<Index>(sizeof(E))};
}

template <class A, class B>
bool overlap(const TensorView<A>& a, const TensorView<B>& b) noexcept {
    const auto [a0, a1] = byte_range(a);
    const auto [b0, b1] = byte_range(b);
    return a0 && b0 && a0 < b1 && b0 < a1;
}

template <class T>
void sdpa_into(TensorView<T> out, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
               std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) {
    const std::string function = "sdpa_into";
    const SdpaProblem<T> problem = make_sdpa_problem<T>(function, q, k, v, allowed_mask, options);
    const std::string shapes = " (out " + to_string(out.shape()) + ", " + problem.shapes + ")";
    if (options.return_weights || options.return_lse)
        throw ConfigError(function + ": writes the output only; call scaled_dot_product_attention for the weights or "
                          "the lse" + shapes);
    if (out.shape() != problem.output_shape())
        throw ShapeError(function + ": out must have the output's shape " + to_string(problem.output_shape()) + shapes);
    if (!out.is_contiguous()) throw ShapeError(function + ": out must be contiguous (C order)" + shapes);
    const TensorView<const T> written(out.data(), out.shape());
    bool aliased = overlap(written, q) || overlap(written, k) || overlap(written, v) ||
                   (allowed_mask && overlap(written, *allowed_mask));
    for (const auto* option : {&options.bias, &options.alibi_slopes})
        if (*option)
            if (const TensorView<const T>* view = (*option)->template get<T>()) aliased = aliased || overlap(written, *view);
    if (aliased)
        throw ConfigError(function + ": out overlaps an input (q, k, v, the mask, the bias or the slopes); it is "
                          "written while they are read" + shapes);
    const std::vector<Readability> readable = contracts_for(problem, options);
    const Backend backend = resolve(options.backend, options, problem.Tq, problem.Tk);
    // Both backends write every element of the output (property output_into_gives_the_bits_of_the_returned_output
    // hands them one full of NaN).
    run_backend<T>(problem, readable, backend, options, out.data(), nullptr, nullptr);
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

SdpaResult<float16> scaled_dot_product_attention(TensorView<const float16> q, TensorView<const float16> k,
                                                 TensorView<const float16> v,
                                                 std::optional<TensorView<const bool>> allowed_mask,
                                                 const SdpaOptions& options) {
    return sdpa<float16>(q, k, v, allowed_mask, options);
}

SdpaResult<bfloat16> scaled_dot_product_attention(TensorView<const bfloat16> q, TensorView<const bfloat16> k,
                                                  TensorView<const bfloat16> v,
                                                  std::optional<TensorView<const bool>> allowed_mask,
                                                  const SdpaOptions& options) {
    return sdpa<bfloat16>(q, k, v, allowed_mask, options);
}

#define ATTN_INSTANTIATE(T)                                                                                      \
    void scaled_dot_product_attention_into(TensorView<T> out, TensorView<const T> q, TensorView<const T> k,      \
                                           TensorView<const T> v,                                                \
                                           std::optional<TensorView<const bool>> allowed_mask,                  \
                                           const SdpaOptions& options) {                                         \
        sdpa_into<T>(out, q, k, v, allowed_mask, options);                                                      \
    }
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

}  // namespace attn
