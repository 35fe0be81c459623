// Mutant: every head attends with the full d_model (all heads' q and k features) instead of its own slice, as
// when d_model is duplicated per head rather than split.
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct DModelDuplicatedPerHead {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        Steps<T> steps;
        steps.weights = [](const SdpaProblem<T>& p, Index b, const SdpaOptions&, std::vector<T>& w) {
            const Index H = p.batch_shape.empty() ? 1 : p.batch_shape.back();
            const Index first = b - b % H;  // head 0 of this batch element
            // s (Tq, Tk) = scale * sum over heads of q_h k_h^T: the (Tq, H*Dk) x (H*Dk, Tk) product.
            w.assign(static_cast<std::size_t>(p.Tq * p.Tk), T(0));
            for (Index h = 0; h < H; ++h) {
                const std::vector<T> s = scores(p, first + h, static_cast<T>(p.scale));
                for (std::size_t x = 0; x < w.size(); ++x) w[x] += s[x];
            }
            mask_scores(p, b, w);
            softmax_rows(w, p.Tq, p.Tk);
        };
        return mutant::run<T>(name, q, k, v, m, o, steps);
    }
};
}  // namespace
Implementation d_model_duplicated_per_head() {
    return make_mutant<DModelDuplicatedPerHead>("d_model_duplicated_per_head",
                                                "each head scores with the full d_model instead of its own head_dim slice");
}
}  // namespace attn::suite::mutant
