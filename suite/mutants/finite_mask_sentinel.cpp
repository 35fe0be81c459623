// Mutant: blocked logits are set to the finite sentinel -1e9 instead of -inf.
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct FiniteMaskSentinel {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        Steps<T> steps;
        steps.weights = [](const SdpaProblem<T>& p, Index b, const SdpaOptions&, std::vector<T>& w) {
            w = scores(p, b, default_scale(p));
            mask_scores(p, b, w, T(-1e9));
            softmax_rows(w, p.Tq, p.Tk);
        };
        // The sentinel's weight is exp(-1e9 - max): mixing reads every key it gave a weight to.
        steps.mix = [](const SdpaProblem<T>& p, Index b, const SdpaOptions&, const std::vector<T>& w, T* out) {
            for (Index i = 0; i < p.Tq; ++i)
                for (Index d = 0; d < p.Dv; ++d) {
                    T acc = 0;
                    for (Index j = 0; j < p.Tk; ++j) {
                        const T wij = w[static_cast<std::size_t>(i * p.Tk + j)];
                        if (wij != 0) acc += wij * p.v_row(b, j)[d * p.v.stride(-1)];
                    }
                    out[i * p.Dv + d] = acc;
                }
        };
        return mutant::run<T>(name, q, k, v, m, o, steps);
    }
};
}  // namespace
Implementation finite_mask_sentinel() {
    return make_mutant<FiniteMaskSentinel>("finite_mask_sentinel", "blocked logits get the finite sentinel -1e9 instead of -inf");
}
}  // namespace attn::suite::mutant
