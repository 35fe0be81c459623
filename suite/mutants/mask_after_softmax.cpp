// Mutant: the mask is applied after the softmax (blocked weights zeroed afterwards, rows no longer sum to one).
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct MaskAfterSoftmax {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        Steps<T> steps;
        steps.weights = [](const SdpaProblem<T>& p, Index b, const SdpaOptions&, std::vector<T>& w) {
            w = scores(p, b, default_scale(p));
            softmax_rows(w, p.Tq, p.Tk);  // blocked keys still in the denominator
            for (Index i = 0; i < p.Tq; ++i)
                for (Index j = 0; j < p.Tk; ++j)
                    if (!p.allowed(b, i, j)) w[static_cast<std::size_t>(i * p.Tk + j)] = 0;
        };
        return mutant::run<T>(name, q, k, v, m, o, steps);
    }
};
}  // namespace
Implementation mask_after_softmax() {
    return make_mutant<MaskAfterSoftmax>("mask_after_softmax", "blocked weights are zeroed after the softmax, not -inf before it");
}
}  // namespace attn::suite::mutant
