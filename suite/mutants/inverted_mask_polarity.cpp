// Mutant: the boolean mask is read in the blocked convention (true = ignore), as nn.MultiheadAttention's masks.
#include "attn/mask.hpp"
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct InvertedMaskPolarity {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        if (!m) return mutant::run<T>(name, q, k, v, m, o, {});
        const Tensor<bool> inverted = allowed_to_blocked(*m);  // used as if it were the allowed mask
        return mutant::run<T>(name, q, k, v, inverted.view(), o, {});
    }
};
}  // namespace
Implementation inverted_mask_polarity() {
    return make_mutant<InvertedMaskPolarity>("inverted_mask_polarity", "true in the mask is read as blocked instead of allowed");
}
}  // namespace attn::suite::mutant
