// Mutant: the causal rule is built with triu instead of tril (queries read the future, not the past).
#include "attn/mask.hpp"
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct CausalMaskTransposed {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        if (!o.is_causal) return mutant::run<T>(name, q, k, v, m, o, {});
        const Index Tq = q.dim(-2), Tk = k.dim(-2);
        // triu: key j visible to query i iff j >= i (+ Tk - Tq for bottom-right).
        Tensor<bool> triu({Tq, Tk});
        for (Index i = 0; i < Tq; ++i)
            for (Index j = 0; j < Tk; ++j)
                triu[i * Tk + j] = j >= i + (o.alignment == CausalAlignment::BottomRight ? Tk - Tq : 0);
        SdpaOptions wrong = o;
        wrong.is_causal = false;
        if (!m) return mutant::run<T>(name, q, k, v, triu.view(), wrong, {});
        const Tensor<bool> both = logical_and(*m, triu.view());
        return mutant::run<T>(name, q, k, v, both.view(), wrong, {});
    }
};
}  // namespace
Implementation causal_mask_transposed() {
    return make_mutant<CausalMaskTransposed>("causal_mask_transposed", "the causal mask is upper triangular (triu) instead of lower");
}
}  // namespace attn::suite::mutant
