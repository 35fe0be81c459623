// Mutant: rows with no allowed key are not handled: softmax of all -inf is 0/0 = NaN, which spreads.
#include <limits>

#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct EmptyRowsIgnored {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        Steps<T> steps;
        steps.write_empty_rows = false;
        steps.weights = [](const SdpaProblem<T>& p, Index b, const SdpaOptions&, std::vector<T>& w) {
            w = scores(p, b, default_scale(p));
            mask_scores(p, b, w);
            for (Index i = 0; i < p.Tq; ++i) {  // textbook softmax, no empty-row guard
                T* row = w.data() + i * p.Tk;
                T row_max = -std::numeric_limits<T>::infinity();
                for (Index j = 0; j < p.Tk; ++j) row_max = std::max(row_max, row[j]);
                T sum = 0;
                for (Index j = 0; j < p.Tk; ++j) sum += (row[j] = std::exp(row[j] - row_max));
                for (Index j = 0; j < p.Tk; ++j) row[j] /= sum;
            }
        };
        steps.mix = [](const SdpaProblem<T>& p, Index b, const SdpaOptions&, const std::vector<T>& w, T* out) {
            for (Index i = 0; i < p.Tq; ++i) {
                bool any = false;
                for (Index j = 0; j < p.Tk; ++j) any |= p.allowed(b, i, j);
                for (Index d = 0; d < p.Dv; ++d) {
                    T acc = 0;
                    for (Index j = 0; j < p.Tk; ++j)
                        if (p.allowed(b, i, j) || !any) acc += w[static_cast<std::size_t>(i * p.Tk + j)] * p.v_row(b, j)[d * p.v.stride(-1)];
                    out[i * p.Dv + d] = acc;
                }
            }
        };
        return mutant::run<T>(name, q, k, v, m, o, steps);
    }
};
}  // namespace
Implementation empty_rows_ignored() {
    return make_mutant<EmptyRowsIgnored>("empty_rows_ignored", "rows with no allowed key are not handled (0/0 gives NaN)");
}
}  // namespace attn::suite::mutant
