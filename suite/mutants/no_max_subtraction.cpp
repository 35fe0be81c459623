// Mutant: softmax without subtracting the row maximum (exp overflows for large logits).
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct NoMaxSubtraction {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        Steps<T> steps;
        steps.weights = [](const SdpaProblem<T>& p, Index b, const SdpaOptions&, std::vector<T>& w) {
            w = scores(p, b, default_scale(p));
            mask_scores(p, b, w);
            for (Index i = 0; i < p.Tq; ++i) {
                T* row = w.data() + i * p.Tk;
                T sum = 0;
                for (Index j = 0; j < p.Tk; ++j) sum += (row[j] = std::exp(row[j]));
                for (Index j = 0; j < p.Tk; ++j) row[j] = sum == 0 && row[j] == 0 ? T(0) : row[j] / sum;
            }
        };
        return mutant::run<T>(name, q, k, v, m, o, steps);
    }
};
}  // namespace
Implementation no_max_subtraction() {
    return make_mutant<NoMaxSubtraction>("no_max_subtraction", "softmax exponentiates the raw logits (no max subtraction)");
}
}  // namespace attn::suite::mutant
