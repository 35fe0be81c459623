// Mutant: the logits are not scaled (q k^T instead of q k^T / sqrt(Dk)).
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct NoScale {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        Steps<T> steps;
        steps.weights = [](const SdpaProblem<T>& p, Index b, const SdpaOptions&, std::vector<T>& w) {
            w = scores(p, b, T(1));
            mask_scores(p, b, w);
            softmax_rows(w, p.Tq, p.Tk);
        };
        return mutant::run<T>(name, q, k, v, m, o, steps);
    }
};
}  // namespace
Implementation no_scale() { return make_mutant<NoScale>("no_scale", "logits are q k^T, never multiplied by the scale"); }
}  // namespace attn::suite::mutant
