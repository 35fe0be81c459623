// Mutant: the value mix is split into one partial sum per thread and the partials added at the end, so the
// summation order (and the last bits) depend on the thread count.
#include <algorithm>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "naive.hpp"

namespace attn::suite::mutant {
namespace {
template <class T>
struct ThreadDependentSum {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        Steps<T> steps;
        steps.mix = [](const SdpaProblem<T>& p, Index b, const SdpaOptions& options, const std::vector<T>& w, T* out) {
#ifdef _OPENMP
            const Index threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
#else
            const Index threads = std::max(options.num_threads, 1);
#endif
            const Index chunk = (p.Tk + threads - 1) / threads;
            for (Index i = 0; i < p.Tq; ++i)
                for (Index d = 0; d < p.Dv; ++d) {
                    T total = 0;
                    for (Index start = 0; start < p.Tk; start += chunk) {
                        T partial = 0;
                        for (Index j = start; j < std::min(p.Tk, start + chunk); ++j)
                            if (p.allowed(b, i, j)) partial += w[static_cast<std::size_t>(i * p.Tk + j)] * p.v_row(b, j)[d * p.v.stride(-1)];
                        total += partial;
                    }
                    out[i * p.Dv + d] = total;
                }
        };
        return mutant::run<T>(name, q, k, v, m, o, steps);
    }
};
}  // namespace
Implementation thread_dependent_sum() {
    return make_mutant<ThreadDependentSum>("thread_dependent_sum", "the value mix is summed in one chunk per thread, so bits depend on the thread count");
}
}  // namespace attn::suite::mutant
