// Mutant: the value mix runs over every key, blocked ones included with weight 0, so a NaN or Inf at a position
// nobody may read still poisons the output (0 * NaN = NaN).
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct MaskedNanPoisonsOutput {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        Steps<T> steps;
        steps.mix = [](const SdpaProblem<T>& p, Index b, const SdpaOptions&, const std::vector<T>& w, T* out) {
            for (Index i = 0; i < p.Tq; ++i)
                for (Index d = 0; d < p.Dv; ++d) {
                    T acc = 0;
                    for (Index j = 0; j < p.Tk; ++j) acc += w[static_cast<std::size_t>(i * p.Tk + j)] * p.v_row(b, j)[d * p.v.stride(-1)];
                    out[i * p.Dv + d] = acc;
                }
        };
        return mutant::run<T>(name, q, k, v, m, o, steps);
    }
};
}  // namespace
Implementation masked_nan_poisons_output() {
    return make_mutant<MaskedNanPoisonsOutput>("masked_nan_poisons_output",
                                               "blocked value rows enter the mix with weight 0, so their NaN/Inf leaks");
}
}  // namespace attn::suite::mutant
