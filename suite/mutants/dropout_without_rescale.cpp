// Mutant: dropout (p = 0.1, fixed seed) left on the weights without the 1/(1-p) rescale of the survivors, so the
// expected row sum is 0.9 instead of 1. The library's SDPA has no dropout; this models a kernel that applies
// its training-mode dropout in evaluation and forgets the rescale.
#include <cstdint>

#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct DropoutWithoutRescale {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        Steps<T> steps;
        steps.weights = [](const SdpaProblem<T>& p, Index b, const SdpaOptions& options, std::vector<T>& w) {
            correct_weights(p, b, options, w);
            for (std::size_t x = 0; x < w.size(); ++x) {
                std::uint64_t h = (static_cast<std::uint64_t>(b) << 32) ^ x ^ 0x9e3779b97f4a7c15ULL;
                h = (h ^ (h >> 31)) * 0xbf58476d1ce4e5b9ULL;
                h ^= h >> 29;
                if (h % 10 == 0) w[x] = 0;  // dropped; survivors keep their weight (no / (1 - p))
            }
        };
        return mutant::run<T>(name, q, k, v, m, o, steps);
    }
};
}  // namespace
Implementation dropout_without_rescale() {
    return make_mutant<DropoutWithoutRescale>("dropout_without_rescale",
                                              "weights are dropped with p = 0.1 and the survivors are not rescaled");
}
}  // namespace attn::suite::mutant
