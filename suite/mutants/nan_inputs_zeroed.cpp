// Mutant: under EmptyRowPolicy::Zero, every output row holding a NaN is treated as an empty row and zeroed, so
// NaN inputs silently become zeros.
#include <cmath>

#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct NanInputsZeroed {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        Steps<T> steps;
        if (o.empty_rows == EmptyRowPolicy::Zero)
            steps.post = [](const SdpaProblem<T>& p, T* output) {
                for (Index r = 0; r < p.batch * p.Tq; ++r) {
                    T* row = output + r * p.Dv;
                    bool nan = false;
                    for (Index d = 0; d < p.Dv; ++d) nan |= std::isnan(row[d]);
                    if (nan) std::fill_n(row, p.Dv, T(0));
                }
            };
        return mutant::run<T>(name, q, k, v, m, o, steps);
    }
};
}  // namespace
Implementation nan_inputs_zeroed() {
    return make_mutant<NanInputsZeroed>("nan_inputs_zeroed", "under the Zero policy, rows with a NaN are zeroed like empty rows");
}
}  // namespace attn::suite::mutant
