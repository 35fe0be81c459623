// Mutant: heads merged back without transposing: (H, Tq, Dv) memory viewed as (Tq, H*Dv), then split correctly.
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct HeadsMergedWithoutTranspose {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        Steps<T> steps;
        steps.post = [](const SdpaProblem<T>& p, T* output) {
            if (p.batch_shape.empty()) return;
            const Index H = p.batch_shape.back(), Tq = p.Tq, Dv = p.Dv;
            std::vector<T> block(static_cast<std::size_t>(H * Tq * Dv));
            for (Index g = 0; g < p.batch / H; ++g) {
                T* o = output + g * H * Tq * Dv;  // (H, Tq, Dv) of one batch element
                std::copy_n(o, H * Tq * Dv, block.begin());
                // merged (Tq, H*Dv) = the same memory without the transpose; split back (H, Tq, Dv) with it.
                for (Index h = 0; h < H; ++h)
                    for (Index i = 0; i < Tq; ++i)
                        for (Index d = 0; d < Dv; ++d) o[(h * Tq + i) * Dv + d] = block[static_cast<std::size_t>(i * H * Dv + h * Dv + d)];
            }
        };
        return mutant::run<T>(name, q, k, v, m, o, steps);
    }
};
}  // namespace
Implementation heads_merged_without_transpose() {
    return make_mutant<HeadsMergedWithoutTranspose>("heads_merged_without_transpose",
                                                    "heads are merged by a view of (H, Tq, Dv) as (Tq, H*Dv) without the transpose");
}
}  // namespace attn::suite::mutant
