// Mutant: the default scale is 1/Dk instead of 1/sqrt(Dk).
#include <cmath>

#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct ScaleByDk {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        SdpaOptions wrong = o;
        if (!wrong.scale && q.rank() >= 1 && q.dim(-1) > 0) wrong.scale = 1.0 / static_cast<double>(q.dim(-1));
        return mutant::run<T>(name, q, k, v, m, wrong, {});
    }
};
}  // namespace
Implementation scale_by_dk() { return make_mutant<ScaleByDk>("scale_by_dk", "the default scale is 1/Dk instead of 1/sqrt(Dk)"); }
}  // namespace attn::suite::mutant
