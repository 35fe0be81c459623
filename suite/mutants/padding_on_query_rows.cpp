// Mutant: a key-padding mask (..., 1, Tk) is unsqueezed on the wrong axis, (..., Tk, 1), and so blocks query rows
// instead of key columns (the wrong unsqueeze that creates fully masked rows).
#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct PaddingOnQueryRows {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        if (!m || m->rank() < 2 || m->dim(-2) != 1 || m->dim(-1) == 1) return mutant::run<T>(name, q, k, v, m, o, {});
        return mutant::run<T>(name, q, k, v, m->transpose(-2, -1), o, {});
    }
};
}  // namespace
Implementation padding_on_query_rows() {
    return make_mutant<PaddingOnQueryRows>("padding_on_query_rows", "key padding is applied to query rows instead of key columns");
}
}  // namespace attn::suite::mutant
