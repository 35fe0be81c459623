// Mutant: grouped K/V heads mapped by modulo (kv = flat query head % number of K/V heads) instead of by
// broadcasting (query head h reads K/V head h / (H/G)).
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct GqaHeadMappingWrong {
    static Tensor<T> by_modulo(TensorView<const T> x, const Shape& batch_shape, Index rows, Index cols) {
        const Tensor<T> own = Tensor<T>::copy_of(x);  // (own batch..., rows, cols), contiguous
        const Index n_own = own.numel() / std::max<Index>(rows * cols, 1);
        Shape shape = batch_shape;
        shape.push_back(rows);
        shape.push_back(cols);
        Tensor<T> full(shape);
        const Index n = numel(batch_shape);
        for (Index b = 0; b < n; ++b)
            std::copy_n(own.data() + (b % std::max<Index>(n_own, 1)) * rows * cols, rows * cols, full.data() + b * rows * cols);
        return full;
    }
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        const SdpaProblem<T> p = make_sdpa_problem<T>(name, q, k, v, m, o);  // validation and the batch shape
        const Tensor<T> k_full = by_modulo(k, p.batch_shape, p.Tk, p.Dk);
        const Tensor<T> v_full = by_modulo(v, p.batch_shape, p.Tk, p.Dv);
        return mutant::run<T>(name, q, k_full.view(), v_full.view(), m, o, {});
    }
};
}  // namespace
Implementation gqa_head_mapping_wrong() {
    return make_mutant<GqaHeadMappingWrong>("gqa_head_mapping_wrong",
                                            "query head h reads K/V head h % G instead of h / (H/G)");
}
}  // namespace attn::suite::mutant
