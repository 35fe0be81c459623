// Mutant: bottom-right causal alignment off by one (query i reads keys j <= i + Tk - Tq + 1: one future key).
#include "attn/mask.hpp"
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct BottomRightOffByOne {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        if (!o.is_causal || o.alignment != CausalAlignment::BottomRight) return mutant::run<T>(name, q, k, v, m, o, {});
        const Index Tq = q.dim(-2), Tk = k.dim(-2);
        Tensor<bool> rule({Tq, Tk});
        for (Index i = 0; i < Tq; ++i)
            for (Index j = 0; j < Tk; ++j) rule[i * Tk + j] = j <= i + Tk - Tq + 1;
        SdpaOptions wrong = o;
        wrong.is_causal = false;
        if (!m) return mutant::run<T>(name, q, k, v, rule.view(), wrong, {});
        const Tensor<bool> both = logical_and(*m, rule.view());
        return mutant::run<T>(name, q, k, v, both.view(), wrong, {});
    }
};
}  // namespace
Implementation bottom_right_off_by_one() {
    return make_mutant<BottomRightOffByOne>("bottom_right_off_by_one", "bottom-right causal alignment lets each query read one key too many");
}
}  // namespace attn::suite::mutant
