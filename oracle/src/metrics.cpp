// Error metrics: ULP distance, absolute, relative, normwise, error/bound; the worst element is always reported.
#include "attn/oracle/metrics.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

namespace attn::oracle {

template <class T>
double ulp_distance(T computed, long double exact) {
    constexpr double inf = std::numeric_limits<double>::infinity();
    const bool cn = std::isnan(computed), en = std::isnan(exact);
    if (cn || en) return cn && en ? 0.0 : inf;
    const bool ci = std::isinf(computed), ei = std::isinf(exact);
    if (ci || ei) return computed == exact ? 0.0 : inf;
    if (computed == 0 && exact == 0) return 0.0;  // +0 == -0
    // Spacing of T in the binade of |exact| (the subnormal spacing below the normal range).
    int e = std::numeric_limits<T>::min_exponent;  // exact == 0: the subnormal spacing
    if (exact != 0) std::frexp(exact, &e);         // |exact| in [2^(e-1), 2^e)
    const int exponent = std::max(e - 1, std::numeric_limits<T>::min_exponent - 1);
    const long double ulp = std::ldexp(1.0L, exponent - (std::numeric_limits<T>::digits - 1));
    return static_cast<double>(std::fabs(static_cast<long double>(computed) - exact) / ulp);
}

std::string Comparison::summary() const {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s: %lld elements, %lld over the bound%s, max ULP %.3g, max abs %.3g, max rel %.3g, normwise %.3g, "
                  "max error/bound %.3g; worst %s computed %.17g exact %.17g bound %.3g",
                  pass() ? "pass" : "FAIL", static_cast<long long>(elements), static_cast<long long>(violations),
                  unbounded ? (", " + std::to_string(unbounded) + " unbounded").c_str() : "", max_ulp, max_abs, max_rel,
                  normwise_rel, max_tightness, to_string(worst_index).c_str(), worst_computed, worst_exact, worst_bound);
    return buf;
}

namespace {

Shape unflatten(Index flat, const Shape& shape) {
    Shape idx(shape.size(), 0);
    for (std::size_t d = shape.size(); d-- > 0;) {
        idx[d] = flat % shape[d];
        flat /= shape[d];
    }
    return idx;
}

// scale == nullptr: relative to |exact| (weights).
template <class T>
Comparison compare(TensorView<const T> candidate, const Shape& shape, const long double* exact,
                   const long double* exact_lo, const double* bound, const double* scale, const char* what) {
    if (candidate.shape() != shape)
        throw ShapeError(std::string("oracle.compare_") + what + ": candidate " + to_string(candidate.shape()) +
                         " but the oracle's " + what + " is " + to_string(shape));
    constexpr double inf = std::numeric_limits<double>::infinity();
    Comparison c;
    c.elements = numel(shape);
    long double diff2 = 0, norm2 = 0;
    Index flat = 0;
    double worst_key = -std::numeric_limits<double>::infinity();
    for_each_index(shape, [&](std::span<const Index> idx) {
        const Index f = flat++;
        const T x = candidate.at(idx);
        const long double ex = exact[f];
        const bool x_finite = std::isfinite(x), e_finite = std::isfinite(ex);
        double err = 0, tight = 0, rel = 0;
        if (!x_finite || !e_finite) {
            // NaN only matches NaN, Inf only the same Inf; a mismatch fails whatever the bound says.
            const bool match = (std::isnan(x) && std::isnan(ex)) || (std::isinf(x) && x == ex);
            if (!match) {
                ++c.nonfinite_mismatches;
                err = inf;
                tight = inf;
                rel = inf;
            }
        } else {
            // error = |x - (exact + exact_lo)|: x - exact is exact when they are close (Sterbenz), and otherwise
            // far beyond any bound.
            const long double d = (static_cast<long double>(x) - ex) - exact_lo[f];
            err = static_cast<double>(std::fabs(d));
            if (!std::isinf(bound[f])) {
                tight = err == 0 ? 0.0 : (bound[f] > 0 ? err / bound[f] : inf);
            } else {
                ++c.unbounded;
            }
            const double s = scale ? scale[f] : static_cast<double>(std::fabs(ex));
            rel = err == 0 ? 0.0 : (s > 0 ? err / s : inf);
            diff2 += d * d;
            norm2 += ex * ex;
        }
        if (tight > 1 || (err == inf)) ++c.violations;
        c.max_abs = std::max(c.max_abs, err);
        c.max_rel = std::max(c.max_rel, rel);
        c.max_ulp = std::max(c.max_ulp, ulp_distance<T>(x, ex));
        c.max_tightness = std::max(c.max_tightness, tight);
        // The worst element: largest error/bound, then largest error (so an all-exact case still names one).
        const double key = tight > 0 ? tight : -1.0 / (1.0 + err);
        if (key > worst_key) {
            worst_key = key;
            c.worst_flat = f;
            c.worst_computed = static_cast<double>(x);
            c.worst_exact = static_cast<double>(ex);
            c.worst_bound = bound[f];
        }
    });
    if (c.worst_flat >= 0) c.worst_index = unflatten(c.worst_flat, shape);
    c.normwise_rel = norm2 > 0 ? static_cast<double>(std::sqrt(diff2 / norm2)) : (diff2 > 0 ? inf : 0.0);
    return c;
}

}  // namespace

template <class T>
Comparison compare_output(TensorView<const T> candidate, const Result<T>& oracle) {
    return compare<T>(candidate, oracle.output_exact.shape(), oracle.output_exact.data(), oracle.output_exact_lo.data(),
                      oracle.output_bound.data(), oracle.output_scale.data(), "output");
}

template <class T>
Comparison compare_weights(TensorView<const T> candidate, const Result<T>& oracle) {
    return compare<T>(candidate, oracle.weights_exact.shape(), oracle.weights_exact.data(),
                      oracle.weights_exact_lo.data(), oracle.weights_bound.data(), nullptr, "weights");
}

template <class T>
Comparison compare_output_statistical(TensorView<const T> candidate, const Result<T>& oracle) {
    if (!oracle.statistical)
        throw ConfigError("oracle.compare_output_statistical: the oracle ran without OracleOptions::statistical");
    return compare<T>(candidate, oracle.output_exact.shape(), oracle.output_exact.data(), oracle.output_exact_lo.data(),
                      oracle.output_stat_bound.data(), oracle.output_scale.data(), "output");
}

template <class T>
Comparison compare_weights_statistical(TensorView<const T> candidate, const Result<T>& oracle) {
    if (!oracle.statistical)
        throw ConfigError("oracle.compare_weights_statistical: the oracle ran without OracleOptions::statistical");
    return compare<T>(candidate, oracle.weights_exact.shape(), oracle.weights_exact.data(),
                      oracle.weights_exact_lo.data(), oracle.weights_stat_bound.data(), nullptr, "weights");
}

template <class T>
RowStatistic row_statistic(TensorView<const T> candidate, const Result<T>& oracle) {
    if (!oracle.statistical)
        throw ConfigError("oracle.row_statistic: the oracle ran without OracleOptions::statistical");
    const Shape& shape = oracle.output_exact.shape();
    if (candidate.shape() != shape)
        throw ShapeError("oracle.row_statistic: candidate " + to_string(candidate.shape()) +
                         " but the oracle's output is " + to_string(shape));
    RowStatistic st;
    const Index Dv = shape.back();
    const Index rows = oracle.row_stat_sigma.numel();
    for (Index r = 0; r < rows && Dv > 0; ++r) {
        const double sigma = oracle.row_stat_sigma.data()[r];
        if (!(sigma > 0)) continue;
        const Index flat = r * Dv + r % Dv;
        const T x = candidate.at(unflatten(flat, shape));
        const long double d = (static_cast<long double>(x) - oracle.output_exact.data()[flat]) - oracle.output_exact_lo.data()[flat];
        const double excess = std::max(0.0, static_cast<double>(std::fabs(d)) - oracle.row_stat_det.data()[r]);
        const double z = std::isfinite(static_cast<double>(x)) ? excess / sigma : std::numeric_limits<double>::infinity();
        st.sum_squares += z * z;
        ++st.rows;
    }
    const double t = std::log(2 / statistical_false_alarm);  // half the call's rate (the elements have the rest)
    const double n = static_cast<double>(st.rows);
    st.threshold = n + 2 * std::sqrt(n * t) + 2 * t;
    return st;
}

template <class T>
CheckVerdict check_candidate(TensorView<const T> candidate_output, const Result<T>& oracle,
                             std::optional<TensorView<const T>> candidate_weights) {
    CheckVerdict verdict{compare_output<T>(candidate_output, oracle), std::nullopt, std::nullopt, std::nullopt, std::nullopt};
    if (candidate_weights) verdict.weights = compare_weights<T>(*candidate_weights, oracle);
    if (oracle.statistical) {
        verdict.statistical_output = compare_output_statistical<T>(candidate_output, oracle);
        verdict.statistical_rows = row_statistic<T>(candidate_output, oracle);
        if (candidate_weights) verdict.statistical_weights = compare_weights_statistical<T>(*candidate_weights, oracle);
    }
    return verdict;
}

const char* gradient_name(Gradient which) {
    switch (which) {
        case Gradient::Dq: return "dq";
        case Gradient::Dk: return "dk";
        case Gradient::Dv: return "dv";
    }
    return "?";
}

template <class T>
Comparison compare_gradient(TensorView<const T> candidate, const Gradients<T>& oracle, Gradient which) {
    const auto pick = [&](const Tensor<long double>& q, const Tensor<long double>& k, const Tensor<long double>& v) {
        return which == Gradient::Dq ? &q : which == Gradient::Dk ? &k : &v;
    };
    const Tensor<long double>* exact = pick(oracle.dq_exact, oracle.dk_exact, oracle.dv_exact);
    const Tensor<long double>* exact_lo = pick(oracle.dq_exact_lo, oracle.dk_exact_lo, oracle.dv_exact_lo);
    const Tensor<double>& bound =
        which == Gradient::Dq ? oracle.dq_bound : which == Gradient::Dk ? oracle.dk_bound : oracle.dv_bound;
    return compare<T>(candidate, exact->shape(), exact->data(), exact_lo->data(), bound.data(), nullptr,
                      gradient_name(which));
}

#define ATTN_INSTANTIATE(T)                                                                                        \
    template double ulp_distance<T>(T, long double);                                                               \
    template Comparison compare_output<T>(TensorView<const T>, const Result<T>&);                                  \
    template Comparison compare_weights<T>(TensorView<const T>, const Result<T>&);                                 \
    template Comparison compare_output_statistical<T>(TensorView<const T>, const Result<T>&);                      \
    template Comparison compare_weights_statistical<T>(TensorView<const T>, const Result<T>&);                     \
    template RowStatistic row_statistic<T>(TensorView<const T>, const Result<T>&);                                 \
    template CheckVerdict check_candidate<T>(TensorView<const T>, const Result<T>&, std::optional<TensorView<const T>>); \
    template Comparison compare_gradient<T>(TensorView<const T>, const Gradients<T>&, Gradient);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
ATTN_INSTANTIATE(float16)
ATTN_INSTANTIATE(bfloat16)
#undef ATTN_INSTANTIATE

}  // namespace attn::oracle
