// Correct kernels in FlashAttention-2's arithmetic (and with FlashAttention-4's lazy rescaling), so that the tiled(key_block) error model is checked against
// what it claims to cover (oracle/BOUNDS.md sections 3 and 6): raw dot products s (the scale is not applied to
// them), keys in blocks of kKeyBlock, per block m_new = the running max of s, the shift as one FMA against a
// separately rounded max, exp2(fma(s, c, -fl(m_new c))) with c = fl(fl(scale) log2(e)), rescaling by
// exp2(fl(fl(m_old - m_new) c)), and the output acc * fl(1 / l). Plain loops in T; the suite's driver
// (mutants/naive.hpp) supplies validation, contracts and the empty-row policy, as for the mutants.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../mutants/naive.hpp"

namespace attn::suite::kernels {
namespace {

constexpr Index kKeyBlock = 16;  // small, so that the suite's cases span several blocks

// lazy_log2 > 0: lazy rescaling as in FlashAttention-4: the running max moves only when a block's max exceeds it by
// more than lazy_log2 in the base-2 exponent; until then keys above it get exp2 of a positive argument.
template <class T, int lazy_log2>
void fa2_mix(const SdpaProblem<T>& p, Index b, const SdpaOptions&, const std::vector<T>&, T* out) {
    constexpr T inf = std::numeric_limits<T>::infinity();
    const T c = static_cast<T>(p.scale) * static_cast<T>(1.4426950408889634);  // scale * log2(e), rounded twice
    // With a negative scale the largest logit has the smallest raw dot product: track the max of s * sign(c).
    const bool flip = c < 0;
    const auto above = [flip](T a, T b) { return flip ? a < b : a > b; };
    const std::vector<T> raw = mutant::scores(p, b, T(1));  // raw dot products (Tq, Tk): the scale is not applied
    std::vector<T> acc(static_cast<std::size_t>(p.Dv));
    for (Index i = 0; i < p.Tq; ++i) {
        const T* s = raw.data() + i * p.Tk;
        T m = flip ? inf : -inf, l = 0;
        bool started = false;
        std::fill(acc.begin(), acc.end(), T(0));
        for (Index j0 = 0; j0 < p.Tk; j0 += kKeyBlock) {
            const Index j1 = std::min(p.Tk, j0 + kKeyBlock);
            T m_new = m;
            bool any = false;
            for (Index j = j0; j < j1; ++j) {
                if (!p.allowed(b, i, j)) continue;
                if (std::isnan(s[j]) || above(s[j], m_new)) m_new = s[j];  // a NaN stays: the row comes out NaN
                any = true;
            }
            if (!any) continue;
            // Lazy: keep the stale max while the block's max is within lazy_log2 of it (a NaN max moves it).
            if (started && lazy_log2 > 0 && !std::isnan(m_new) && (m_new - m) * c <= T(lazy_log2)) m_new = m;
            if (started && m_new != m) {
                const T alpha = std::exp2((m - m_new) * c);  // fl(fl(m_old - m_new) c), then exp2
                l *= alpha;
                for (T& a : acc) a *= alpha;
            }
            const T max_scaled = m_new * c;  // rounded on its own: the rounded-max shift
            // Where fl(m c) has lost the exponent's units (|m c| >= 2^17 in float, 2^46 in double), the FMA form's
            // error u |m c| would overflow exp2 (FlashAttention-2 returns inf and NaN there); such rows take the
            // difference form exp2(fl(fl(s - m) c)), which the same model covers (two roundings per shift).
            const bool rounded_max = std::fabs(max_scaled) < T(1) / (64 * std::numeric_limits<T>::epsilon());
            for (Index j = j0; j < j1; ++j) {
                if (!p.allowed(b, i, j)) continue;
                const T sj = s[j];
                const T e = std::exp2(rounded_max ? std::fma(sj, c, -max_scaled) : (sj - m_new) * c);
                l += e;
                const T* vj = p.v_row(b, j);
                for (Index d = 0; d < p.Dv; ++d) acc[static_cast<std::size_t>(d)] += e * vj[d * p.v.stride(-1)];
            }
            m = m_new;
            started = true;
        }
        // Rows with no allowed key (l = 0): the driver writes the policy's value over them.
        const T inv = started ? T(1) / l : T(0);
        for (Index d = 0; d < p.Dv; ++d) out[i * p.Dv + d] = acc[static_cast<std::size_t>(d)] * inv;
    }
}

template <int lazy_log2>
struct Fa2Style {
    template <class T>
    struct Kernel {
        static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k,
                                 TensorView<const T> v, std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
            mutant::Steps<T> steps;
            steps.mix = fa2_mix<T, lazy_log2>;  // the weights, when asked for, are the driver's plain softmax
            return mutant::run<T>(name, q, k, v, m, o, steps);
        }
    };
};

}  // namespace

Implementation fa2_style() {
    Implementation impl = mutant::make_mutant<Fa2Style<0>::Kernel>(
        "fa2_style", "FlashAttention-2's arithmetic: raw dots, exp2(fma(s, c, -fl(m c))) per key block of 16, "
                     "exp2 rescaling, acc * fl(1 / l); checked under tiled(16)");
    impl.is_mutant = false;
    impl.error_model = oracle::tiled_model(kKeyBlock);
    return impl;
}

Implementation fa2_lazy() {
    Implementation impl = mutant::make_mutant<Fa2Style<8>::Kernel>(
        "fa2_lazy", "fa2_style with FlashAttention-4's lazy rescaling (the max moves only when exceeded by more than 8 "
                    "in base 2); checked under tiled(16) with stale_max = 8 ln 2");
    impl.is_mutant = false;
    impl.error_model = oracle::tiled_model(kKeyBlock);
    // 8 ln 2 = 5.545 in the natural exponent, and a little more for the rounding of the kernel's own test.
    impl.error_model.stale_max = 5.6;
    return impl;
}

}  // namespace attn::suite::kernels
