// Mutant: softmax over queries (dim=-2) instead of keys; columns sum to one, rows do not.
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct SoftmaxOverQueries {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        Steps<T> steps;
        steps.weights = [](const SdpaProblem<T>& p, Index b, const SdpaOptions&, std::vector<T>& w) {
            w = scores(p, b, default_scale(p));
            mask_scores(p, b, w);
            // w (Tq, Tk) -> transposed (Tk, Tq), softmax over its rows (= over queries), transposed back.
            std::vector<T> wt(w.size());
            for (Index i = 0; i < p.Tq; ++i)
                for (Index j = 0; j < p.Tk; ++j) wt[static_cast<std::size_t>(j * p.Tq + i)] = w[static_cast<std::size_t>(i * p.Tk + j)];
            softmax_rows(wt, p.Tk, p.Tq);
            for (Index i = 0; i < p.Tq; ++i)
                for (Index j = 0; j < p.Tk; ++j) w[static_cast<std::size_t>(i * p.Tk + j)] = wt[static_cast<std::size_t>(j * p.Tq + i)];
        };
        return mutant::run<T>(name, q, k, v, m, o, steps);
    }
};
}  // namespace
Implementation softmax_over_queries() {
    return make_mutant<SoftmaxOverQueries>("softmax_over_queries",
                                           "softmax normalises over queries (dim=-2) instead of keys");
}
}  // namespace attn::suite::mutant
