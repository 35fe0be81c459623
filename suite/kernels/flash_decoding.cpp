// A correct split-KV kernel in FlashDecoding's arithmetic, so that the split_kv model option is checked against the
// arithmetic it claims to cover (oracle/BOUNDS.md section 3): the keys in splits of kSplit, each split normalised on
// its own (max m_s, exp(s - m_s), sum l_s, o_s = acc_s / l_s, lse_s = m_s + log(l_s)), then the splits combined
// through the log-sum-exp: lse = M + log(sum_s exp(lse_s - M)), out = sum_s exp(lse_s - lse) o_s, with no final
// division. Plain loops in T; the suite's driver (mutants/naive.hpp) supplies validation, contracts and the
// empty-row policy.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../mutants/naive.hpp"

namespace attn::suite::kernels {
namespace {

constexpr Index kSplit = 8;  // small, so that the suite's cases have several splits

// The larger of two values, NaN when either is (a row that reads a NaN must come out NaN).
template <class T>
T nan_max(T a, T b) {
    return std::isnan(a) || std::isnan(b) ? std::numeric_limits<T>::quiet_NaN() : std::max(a, b);
}

template <class T>
void split_kv_mix(const SdpaProblem<T>& p, Index b, const SdpaOptions&, const std::vector<T>&, T* out) {
    const T scale = static_cast<T>(p.scale);
    const Index splits = (p.Tk + kSplit - 1) / kSplit;
    const std::vector<T> logits = mutant::scores(p, b, scale);  // (Tq, Tk) = scale * q k^T
    std::vector<T> lse(static_cast<std::size_t>(splits));
    std::vector<T> o(static_cast<std::size_t>(splits * p.Dv));
    std::vector<char> used(static_cast<std::size_t>(splits));
    for (Index i = 0; i < p.Tq; ++i) {
        const T* s = logits.data() + i * p.Tk;
        std::fill(used.begin(), used.end(), 0);
        for (Index sp = 0; sp < splits; ++sp) {
            const Index j0 = sp * kSplit, j1 = std::min(p.Tk, j0 + kSplit);
            T m = -std::numeric_limits<T>::infinity();
            bool any = false;
            for (Index j = j0; j < j1; ++j) {
                if (!p.allowed(b, i, j)) continue;
                m = nan_max(m, s[j]);
                any = true;
            }
            if (!any) continue;
            T l = 0;
            T* os = o.data() + sp * p.Dv;
            std::fill_n(os, p.Dv, T(0));
            for (Index j = j0; j < j1; ++j) {
                if (!p.allowed(b, i, j)) continue;
                const T e = std::exp(s[j] - m);
                l += e;
                const T* vj = p.v_row(b, j);
                for (Index d = 0; d < p.Dv; ++d) os[d] += e * vj[d * p.v.stride(-1)];
            }
            for (Index d = 0; d < p.Dv; ++d) os[d] /= l;
            lse[static_cast<std::size_t>(sp)] = m + std::log(l);
            used[static_cast<std::size_t>(sp)] = 1;
        }
        // The combine: the log-sum-exp of the splits' lse, then their outputs weighted by exp(lse_s - lse).
        T M = -std::numeric_limits<T>::infinity();
        bool any = false;
        for (Index sp = 0; sp < splits; ++sp)
            if (used[static_cast<std::size_t>(sp)]) {
                M = nan_max(M, lse[static_cast<std::size_t>(sp)]);
                any = true;
            }
        for (Index d = 0; d < p.Dv; ++d) out[i * p.Dv + d] = 0;  // rows with no allowed key: the driver's policy
        if (!any) continue;
        T E = 0;
        for (Index sp = 0; sp < splits; ++sp)
            if (used[static_cast<std::size_t>(sp)]) E += std::exp(lse[static_cast<std::size_t>(sp)] - M);
        const T total = M + std::log(E);
        for (Index sp = 0; sp < splits; ++sp) {
            if (!used[static_cast<std::size_t>(sp)]) continue;
            const T c = std::exp(lse[static_cast<std::size_t>(sp)] - total);
            for (Index d = 0; d < p.Dv; ++d) out[i * p.Dv + d] += c * o[static_cast<std::size_t>(sp * p.Dv + d)];
        }
    }
}

template <class T>
struct FlashDecoding {
    static SdpaResult<T> run(const std::string& name, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        mutant::Steps<T> steps;
        steps.mix = split_kv_mix<T>;  // the weights, when asked for, are the driver's plain softmax
        return mutant::run<T>(name, q, k, v, m, o, steps);
    }
};

}  // namespace

Implementation flash_decoding() {
    Implementation impl = mutant::make_mutant<FlashDecoding>(
        "flash_decoding", "split-KV in FlashDecoding's arithmetic: splits of 8 keys, each with its own max, sum and "
                          "lse = m + log(l), combined by exp(lse_s - lse); checked under tiled(8) with split_kv");
    impl.is_mutant = false;
    impl.error_model = oracle::tiled_model(kSplit);
    impl.error_model.split_kv = true;
    impl.error_model.log_ulps = 1.0;  // glibc's log and logf, within 1 ulp
    return impl;
}

}  // namespace attn::suite::kernels
