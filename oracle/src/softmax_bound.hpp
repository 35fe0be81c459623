// Internal: one attention row's exact softmax and weighted sum, and the pieces of its per-element bound
// (oracle/BOUNDS.md sections 1-5 and 7), shared by the SDPA engine (engine.hpp) and the MHA path (mha.cpp).
// Each function names the section it implements; the callers add only what their problem has on top
// (the SDPA engine: the oracle's own error of its logits and storage; the MHA path: section 9's projection errors).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/oracle/oracle.hpp"
#include "dd.hpp"
#include "storage_units.hpp"
#include "simd.hpp"

namespace attn::oracle::detail {

// ---- the options every oracle entry point checks ---------------------------------------------------------------------

// bits in [0, 516]; an error model with exp_ulps >= 0, scale_roundings >= 0, shift_roundings >= 1 (a difference
// of two logits rounds at least once) and a stale max below exp's range.
inline void check_oracle_options(const std::string& function, const OracleOptions& o) {
    if (o.bits < 0 || o.bits > 516)
        throw ConfigError(function + ": bits must be in [0, 516] (0 = default), got " + std::to_string(o.bits));
    if (!(o.model.exp_ulps >= 0) || o.model.scale_roundings < 0 || o.model.shift_roundings < 1 ||
        !(o.model.stale_max >= 0 && o.model.stale_max < 700) || !(o.model.log_ulps >= 0) ||
        !(o.model.tanh_ulps >= 0 && o.model.tanh_ulps < 1e6))
        throw ConfigError(function + ": error model '" + o.model.name +
                          "' needs exp_ulps >= 0, log_ulps >= 0, 0 <= tanh_ulps < 1e6, scale_roundings >= 0, "
                          "shift_roundings >= 1 and 0 <= stale_max < 700");
}

// ---- section 1: gamma_n -----------------------------------------------------------------------------------------

inline double gamma(double n, double u) {
    const double nu = n * u;
    return nu < 1 ? nu / (1 - nu) : std::numeric_limits<double>::infinity();
}

// Section 10: the probabilistic gamma of Higham and Mary (2019), tilde-gamma_n(lambda) = exp(lambda sqrt(n) u +
// n u^2 / (1 - u)) - 1, which bounds a product of n factors (1 + delta_t), mean-independent and |delta_t| <= u, with
// probability at least 1 - 2 exp(-lambda^2 (1 - u)^2 / 2). Never above the rigorous gamma_n (which always holds);
// lambda = 0 selects the rigorous one.
inline double gamma_stat(double n, double u, double lambda) {
    const double rigorous = gamma(n, u);
    if (lambda <= 0 || n <= 0) return rigorous;
    // expm1 within an ulp, the argument's roundings a few ulps of it: the factor 1 + 2^-50 covers both.
    return std::min(rigorous, std::expm1((lambda * std::sqrt(n) * u + n * u * u / (1 - u)) * (1 + 0x1p-50)) * (1 + 0x1p-50));
}

// The lambda of section 10 for a row of n keys and dot products of length Dk in a call whose verdict compares
// `elements` elements: each element's bound uses the tilde-gamma of at most n (Dk + 2) products of rounding factors
// (each logit's Dk terms, each key's terms of the sum and of the weighted sum), so a failure probability of
// 2 exp(-lambda^2 (1 - u)^2 / 2) each, summed over them and over the call's elements, is half of
// statistical_false_alarm (the other half is the row statistic's).
inline double statistical_lambda(double n, double Dk, double u, double elements) {
    const double chains = n * (Dk + 2) * std::max(1.0, elements);
    return std::sqrt(2 * std::log(2 * chains / (statistical_false_alarm / 2))) / (1 - u) * (1 + 0x1p-50);
}

// ---- section 5: error-free transformations in double, and storing an exact value ---------------------------------

// hi and lo of a Real: hi = the value rounded to double, lo = the rest rounded to double.
template <class Real>
void split(const Real& x, double& hi, double& lo) {
    hi = static_cast<double>(x);
    lo = std::isfinite(hi) ? static_cast<double>(Real(x - Real(hi))) : 0.0;
}

// Every exact value is stored from hi + lo (106 bits, far below any bound): rounded once to T, and as long double
// plus a long double residual.
template <class T>
void store(double hi, double lo, T& rounded, long double& exact, long double& exact_lo) {
    rounded = round_to<T>(hi, lo);
    exact = static_cast<long double>(hi) + static_cast<long double>(lo);
    // hi - exact is exact (Sterbenz); exact + exact_lo = hi + lo to ~2^-117 relative.
    exact_lo = std::isfinite(hi) ? (static_cast<long double>(hi) - exact) + static_cast<long double>(lo) : 0.0L;
}

// The same from a Real beyond double-double (the all-MPFR path): exact = RN_longdouble(x) and the rest, so
// exact + exact_lo = x to 2^-127 relative at any magnitude, subnormal doubles included (a double-double's lo
// underflows there). rounded = RN_T(x): hi = RN_double(x) (MPFR's conversion rounds to nearest, into the subnormal
// range too), and round_to<float> settles hi's midpoints with lo.
template <class T, class Real>
void store_wide(const Real& x, T& rounded, long double& exact, long double& exact_lo) {
    double hi, lo;
    split(x, hi, lo);
    rounded = round_to<T>(hi, lo);
    exact = static_cast<long double>(x);
    exact_lo = std::isfinite(exact) ? static_cast<long double>(Real(x - Real(exact))) : 0.0L;
}

// ---- section 7: the bound's own rounding ---------------------------------------------------------------------------

// Rigorous bounds are computed from nonnegative terms; their own rounding (relative, at most ~(Tk + Dk + 20) * 2^-53)
// is covered by this factor for Tk + Dk < 10^9.
inline constexpr double kBoundInflation = 1 + 1e-6;

// The arithmetic of every term that scales with the values or the logits' magnitudes (x86-64's 80-bit long double:
// a 64-bit significand and exponents from 2^-16445 to 2^16384). No such term of a bound for float or double inputs
// overflows or underflows in it: sum_j |v_j| for |v_j| near DBL_MAX, |q.k| for q = k = 1e200, a double's gradual
// underflow unit 2^-1075 times a subnormal value (section 7).
using Wide = long double;
static_assert(std::numeric_limits<Wide>::max_exponent >= 16384 && std::numeric_limits<Wide>::digits >= 64,
              "the bound's arithmetic needs x86-64's extended precision (section 7)");

// The next double above x >= 0 (finite): an upper bound of the exact value of a rounded nonnegative result.
inline double next_up(double x) { return std::bit_cast<double>(std::bit_cast<std::uint64_t>(x) + 1); }
// Upper bounds of a b and a + b for a, b >= 0, in double (one ulp above the rounded result; never below the exact).
inline double mul_up(double a, double b) { return next_up(a * b); }
inline double add_up(double a, double b) { return next_up(a + b); }

// A bound stored as double: x rounded up (to +inf beyond double's range), so the stored bound never shrinks.
inline double round_up(Wide x) {
    double d = static_cast<double>(x);
    if (!(static_cast<Wide>(d) < x)) return d;  // exact, rounded up, or NaN
    // The next double up (d is finite: a conversion that rounded down stays below +inf).
    if (d == 0) return std::numeric_limits<double>::denorm_min();
    const auto bits = std::bit_cast<std::uint64_t>(d);
    return std::bit_cast<double>(d > 0 ? bits + 1 : bits - 1);
}

// BOUNDS.md section 11: a result computed in compute_t<T> within `bound` of an exact value of magnitude
// |e| <= |hi| (1 + 2^-53) and then rounded to the storage type T errs by at most
// bound + u_T (|e| + bound) + denorm_min_T / 2, as long as |e| + bound stays below T's overflow threshold (beyond
// it the rounding may give inf: no bound, +inf). The identity when T is its own compute type (the one rounding to T
// is then already the computation's last). Callers whose |hi| is only an approximation pass an upper value.
template <class T>
double storage_rounding(double bound, double hi) {
    if constexpr (std::is_same_v<T, compute_t<T>>) {
        return bound;
    } else {
        if (!std::isfinite(hi) || !std::isfinite(bound)) return bound;  // NaN rows, unbounded elements
        using L = std::numeric_limits<T>;
        constexpr Wide u_T = static_cast<Wide>(static_cast<float>(L::epsilon())) / 2;
        constexpr Wide half_denorm = static_cast<Wide>(static_cast<float>(L::denorm_min())) / 2;
        const Wide overflow =
            static_cast<Wide>(static_cast<float>(L::max())) + std::ldexp(Wide(1), L::max_exponent - 1 - L::digits);
        const Wide y = static_cast<Wide>(std::fabs(hi)) * (1 + 0x1p-52L) + bound;
        if (!(y < overflow)) return std::numeric_limits<double>::infinity();
        return round_up((bound + u_T * y + half_denorm) * (1 + 0x1p-60L));
    }
}

// ---- sections 0 and 4: the absolute error of one operation below the normal range ------------------------------------

// mul: a product, quotient or the scale's multiplication; add: a sum; exp: an exp result. With flush-to-zero every
// one may lose up to the smallest normal number eta of T. With gradual underflow a product errs by at most half the
// smallest subnormal and a sum is exact; an exp may still flush (Highway's Exp below the normal range), so it keeps eta.
struct UnderflowUnits {
    Wide mul = 0, add = 0, exp = 0;
};

// wide_storage: the caller computes and stores its exact values beyond double-double (the SDPA engine's all-MPFR
// path). Without it, a double target's gradual units (2^-1075) would be as small as the double-double values' own
// underflow, and the flush-to-zero units stand for double (still rigorous: every gradual error is within them).
template <class T>
UnderflowUnits underflow_units(const ErrorModel& model, bool wide_storage = false) {
    const Wide eta = std::numeric_limits<T>::min();
    if (!model.gradual_underflow || (!std::is_same_v<T, float> && !wide_storage)) return {eta, eta, eta};
    return {static_cast<Wide>(std::numeric_limits<T>::denorm_min()) / 2, 0, eta};  // 2^-150 or 2^-1075
}

// Assumption 2's exception (ErrorModel::inputs_flushed): |x| when a kernel that flushes subnormal inputs may read x
// as 0 (x below T's normal range), else 0.
template <class T>
double flushable(double x) {
    const double a = std::fabs(x);
    return a < static_cast<double>(std::numeric_limits<T>::min()) ? a : 0.0;
}

// ---- section 2: the implementation's logit error a_j ---------------------------------------------------------------

// The per-row constants of section 2 for a dot product of length Dk (Dh for a head). The scale's own roundings are
// not here: they are common to every key of a row and enter the exponents (section 3, RowRounding::k_sigma).
struct LogitRounding {
    double abs_scale = 0;
    double gamma_logit = 0;  // gamma_{Dk+1}: Dk products, Dk - 1 additions, the multiplication by the scale
    double gamma_under = 0;  // gamma_{Dk+2}, on the underflow terms
    Wide ops = 0;            // (Dk + 1) (eta_mul + eta_add): the operations that may underflow
    Wide eta_mul = 0;        // a product's: fl(scale * q_d) times |k_jd| (or |q_d|)
};

// lambda > 0: the statistical bound's gamma_logit (section 10).
inline LogitRounding logit_rounding(Index Dk, double scale, double u, const UnderflowUnits& eta, double lambda = 0) {
    LogitRounding L;
    L.abs_scale = std::fabs(scale);
    L.gamma_logit = gamma_stat(static_cast<double>(Dk + 1), u, lambda);
    L.gamma_under = gamma(Dk + 2.0, u);
    L.ops = (Dk + 1.0) * (eta.mul + eta.add);
    L.eta_mul = eta.mul;
    return L;
}

// a_j = |scale| perturbation + gamma_{Dk+1} |scale| abs_dot + (ops (1 + |scale|) + eta_mul abs_sum)(1 + gamma_{Dk+2}).
// abs_dot = sum_d |q_d k_jd|, abs_sum = sum_d (|q_d| + |k_jd|). perturbation is section 9 step 2's
// sum_d (e_qd |k_jd| + |q_d| e_kjd + e_qd e_kjd) for perturbed q and k, 0 for SDPA (exact inputs).
inline double logit_bound(const LogitRounding& L, Wide perturbation, Wide abs_dot, Wide abs_sum) {
    return round_up(L.abs_scale * perturbation + L.gamma_logit * L.abs_scale * abs_dot +
                    (L.ops * (1 + L.abs_scale) + L.eta_mul * abs_sum) * (1 + L.gamma_under));
}

// Section 10, stagnation: an addition whose smaller operand `a` is below kStagnationOperand u |t| of its result `t`
// rounds as a deterministic function of where `a` falls within the last few ulps of `t` (below half an ulp it is
// lost entirely), so its error is not mean-independent. The statistical bound charges it at its worst, |a|, which
// for a sum of n terms x_j in any order is at most (1 + gamma) sum_j |x_j| L_j over the terms that can lie in such an
// operand, L_j the number of such additions on term j's path (BOUNDS.md section 10, "Stagnation").
inline constexpr double kStagnationOperand = 64;

struct StagnationRule {
    Wide lim = 0;       // a term whose lower value is at or above it is never part of a stagnating operand
    int e_total = 0;    // the exponent of total (ilogb), total >= sum_j |x_j|
    int g = 1;          // floor(log2 G), G = (1 - gamma) / (c (1 + gamma)): the growth per stagnating addition
    Wide cap = 0;       // n - 1: no path has more additions
    Wide factor = 1;    // 1 + gamma, with the bound's own rounding (kBoundInflation)
    bool all = false;   // gamma too large for the growth argument: every term charged n - 1 times

    // total >= sum_j |x_j| (upper value), n terms, gamma >= the relative error of every computed partial sum
    // (the sum's rigorous gamma), u the unit roundoff.
    StagnationRule(Wide total, double n, double gamma, double u) {
        cap = std::max(0.0, n - 1);
        factor = (1 + static_cast<Wide>(gamma)) * kBoundInflation;
        const Wide c = static_cast<Wide>(kStagnationOperand) * u;
        if (!(gamma < 0.25) || !(total > 0) || !std::isfinite(static_cast<double>(total))) {
            all = true;
            return;
        }
        lim = c * (1 + gamma) * total / (1 - gamma) * (1 + 0x1p-50L);
        const Wide G = (1 - gamma) / (c * (1 + gamma));
        g = std::max(1, static_cast<int>(std::floor(std::log2(static_cast<double>(G)) * (1 - 0x1p-40))));
        e_total = std::ilogb(total);
    }
    // One term's charge before `factor`: x_up >= |x_j| (the computed term included), x_lo <= the computed |x_j|.
    // L_j <= 1 + log(total / |x_j|) / log G (each stagnating addition on the path multiplies the sum of |terms| of
    // the operand holding j by at least G), and log2(total / x_lo) < e_total - ilogb(x_lo) + 1.
    Wide charge(Wide x_up, Wide x_lo) const {
        if (!(x_up > 0)) return 0;
        if (all) return x_up * cap;
        if (!(x_lo < lim)) return 0;
        const double lo = static_cast<double>(x_lo);
        if (!(lo >= std::numeric_limits<double>::min())) return x_up * cap;  // tiny: its x_up is negligible anyway
        const auto bits = std::bit_cast<std::uint64_t>(lo);
        const int e_lo = static_cast<int>((bits >> 52) & 0x7ff) - 1023;
        const Wide L = 1 + static_cast<Wide>((e_total - e_lo + 1) / g);
        return x_up * std::min(L, cap);
    }
};

// ---- section 2b: soft-capping (SdpaOptions::softcap) ----------------------------------------------------------------

// The roundings of the scale common to a row (section 2): the model's scale_roundings in T and its logit storage
// roundings (section 11), as one relative gamma_r.
inline double scale_gamma(const ErrorModel& model, double u, double u_storage) {
    const double gamma_scale = gamma(static_cast<double>(model.scale_roundings), u);
    const double gamma_l = gamma(static_cast<double>(model.logit_storage_roundings), u_storage);
    return gamma_scale + gamma_l * (1 + gamma_scale);
}

// The per-row constants of section 2b for a kernel that caps its logits as fl(c_hat tanh_hat(fl(s_hat / c_hat))),
// c_hat = fl(cap) (a division, or a product by fl(1 / c_hat): gamma_2), its tanh within model.tanh_ulps.
struct CapRounding {
    double cap = 0;        // the exact cap c (SdpaProblem::softcap), > 0
    double phi = 0;        // (1 + gamma_r)(1 + gamma_2) - 1: the scale's and the quotient's roundings on s'_j
    double cap_round = 0;  // u (1 + 2u): c rounded to T, |d/dc c tanh(s / c)| <= min(1, |s| / c)
    double tail = 0;       // (eps_tanh + u + eps_tanh u)(1 + u): tanh's error and the product by c_hat
    double under = 0;      // 3 c eta + eta: the quotient, tanh and product below T's normal range
    double u = 0;
};

inline CapRounding cap_rounding(double cap, const ErrorModel& model, double u, double u_storage, double eta) {
    CapRounding C;
    C.cap = cap;
    C.u = u;
    C.phi = (1 + scale_gamma(model, u, u_storage)) * (1 + gamma(2, u)) - 1;
    C.cap_round = u * (1 + 2 * u);
    const double eps_tanh = 2 * model.tanh_ulps * u * (1 + 2 * model.tanh_ulps * u);
    C.tail = (eps_tanh + u + eps_tanh * u) * (1 + u);
    C.under = 3 * cap * eta + eta;
    return C;
}

// a'_j, the error of a capped logit, from a_j (section 2's, before the scale's roundings) and |s_j| in
// [s_lo, s_up]: S_j d_j + u (1 + 2u) min(c, |s_j|) + tail min(c, |s_j| + d_j) + under, d_j = a_j + phi (|s_j| + a_j),
// S_j = sech^2((|s_j| - d_j) / (c (1 + u))), the largest derivative of tanh where the computed quotient may lie.
// An upper bound of sech^2 z = tanh'(z) over |z| >= z_lo >= 0 (sech^2 decreases in |z|; long double's cosh is
// within a few of its ulps, far inside the factor 1 + 2^-50).
inline Wide sech2_up(Wide z_lo) {
    const Wide ch = std::cosh(std::max(Wide(0), z_lo));
    return std::isfinite(ch) ? std::min(Wide(1), (1 + 0x1p-50L) / (ch * ch)) : Wide(0);
}

inline double capped_logit_bound(const CapRounding& C, double a, double s_lo, double s_up) {
    const Wide d = static_cast<Wide>(a) + C.phi * (static_cast<Wide>(s_up) + a);
    const Wide S = sech2_up((static_cast<Wide>(s_lo) - d) / (static_cast<Wide>(C.cap) * (1 + 2 * C.u)));
    const Wide cap = C.cap;
    return round_up((S * d + C.cap_round * std::min(cap, static_cast<Wide>(s_up)) +
                     C.tail * std::min(cap, static_cast<Wide>(s_up) + d) + C.under) * kBoundInflation);
}

// The oracle's own error of a capped logit (section 2b): its logit error `self` and the quotient's rounding
// (u_div relative, |s_j| in [s_lo, s_up]) through tanh's largest slope where the quotient may lie, plus `rest`,
// the absolute error of its tanh and product.
inline double capped_self_error(double self, double s_lo, double s_up, double cap, double u_div, Wide rest) {
    const Wide dy = static_cast<Wide>(self) + 2 * u_div * static_cast<Wide>(s_up);
    return round_up(sech2_up((static_cast<Wide>(s_lo) - dy) / cap) * dy + rest);
}

// ---- section 2c: additive bias (SdpaOptions::bias) ----------------------------------------------------------------

// d_j of a logit without a cap that a bias is added to: section 2's a_j (|s_j| <= s_up) with the scale's roundings
// gamma_r (scale_gamma) charged per key, since they no longer factor out of the row: a_j + gamma_r (|s_j| + a_j).
inline double per_key_scale_bound(double a, double s_up, double gamma_r) {
    return round_up((static_cast<Wide>(a) + gamma_r * (static_cast<Wide>(s_up) + a)) * kBoundInflation);
}

// a''_j, the error of a biased logit fl(x_hat_j + b_j): d_j (the error of x_hat_j) plus one addition in T, u relative
// to the computed sum, |t_j| <= t_up, plus eta (the smallest normal number of T) for a kernel that flushes a
// subnormal sum: d_j + u (t_up + d_j) + eta.
inline double biased_logit_bound(double d, double t_up, double u, double eta) {
    return round_up((static_cast<Wide>(d) + u * (static_cast<Wide>(t_up) + d) + eta) * kBoundInflation);
}

// a''_j with ALiBi: the kernel's term fl(-m_hat d_j) errs by e_a = u |m d_j| + eta (one product; d_j is exact),
// and the logit x_hat_j, the explicit bias (if any) and that term are summed by `sums` additions in any order, within
// gamma_sums of the sum of their magnitudes (|x_j| <= x_up): d_j + e_a + gamma_sums (x_up + d_j + |b_j| + |m d_j| +
// e_a) + eta.
inline double alibi_logit_bound(double d, double x_up, double b_abs, double a_abs, int sums, double u, double eta) {
    const Wide e_a = static_cast<Wide>(u) * a_abs + eta;
    const Wide terms = static_cast<Wide>(x_up) + d + b_abs + a_abs + e_a;
    return round_up((static_cast<Wide>(d) + e_a + gamma(static_cast<double>(sums), u) * terms + eta) * kBoundInflation);
}

// a''_j of a logit with an additive term, either form: `d` the error of the logit before it (|x_j| <= x_up), `t_up`
// >= |t_j| of the biased logit; with ALiBi (alibi_abs >= |m d_j|) its product and one or two additions, else the
// one addition of the explicit bias.
inline double additive_logit_bound(double d, double x_up, double t_up, bool bias, double bias_abs, bool alibi,
                                   double alibi_abs, double u, double eta) {
    if (!alibi) return biased_logit_bound(d, t_up, u, eta);
    return alibi_logit_bound(d, x_up, bias_abs, alibi_abs, bias ? 2 : 1, u, eta);
}

// The oracle's own error of a biased logit t_j in MPFR (u_mp per sum; the product m d_j exact): self + u_mp (sums |t_j|
// + the first of two sums' extra |m d_j|), rounded up.
inline double biased_self_error(double self, double abs_t, bool bias, bool alibi, double alibi_abs, double u_mp) {
    const int sums = bias && alibi ? 2 : 1;
    const Wide first_extra = sums == 2 ? alibi_abs : 0.0;
    return round_up(self + u_mp * (sums * static_cast<Wide>(abs_t) + first_extra) * (1 + 0x1p-50L));
}

// ---- sections 0 and 5: the row's exact softmax and weighted sum, in Real ------------------------------------------

// Weights p_j = exp(s_j - m) / W over the row's n keys, with what the bound needs of them.
template <class Real>
struct ExactSoftmax {
    std::vector<Real> p;             // (n) p_j
    std::vector<double> p_hi, p_lo;  // (n) p_j = p_hi + p_lo to 106 bits
    std::vector<double> sigma;       // (n) m - s_j >= 0, rounded to double
    double log_W = 0;                // log W, W = sum_j exp(s_j - m) >= 1
    Index pivot = 0;                 // a key with the max logit (sigma_j = 0)
};

// logits (n >= 1) -> the shifted softmax (MPFR's exp is correctly rounded).
template <class Real>
void exact_softmax(const std::vector<Real>& logits, ExactSoftmax<Real>& out) {
    const std::size_t n = logits.size();
    Real m = logits[0];
    for (std::size_t c = 1; c < n; ++c)
        if (logits[c] > m) m = logits[c];
    std::vector<Real> e(n);
    out.sigma.assign(n, 0.0);
    Real W(0);
    for (std::size_t c = 0; c < n; ++c) {
        const Real x = logits[c] - m;
        out.sigma[c] = -static_cast<double>(x);
        e[c] = exp(x);
        W += e[c];
    }
    out.p.assign(n, Real(0));
    out.p_hi.assign(n, 0.0);
    out.p_lo.assign(n, 0.0);
    out.pivot = 0;
    for (std::size_t c = 0; c < n; ++c) {
        out.p[c] = e[c] / W;
        out.p_hi[c] = static_cast<double>(out.p[c]);
        out.p_lo[c] = static_cast<double>(Real(out.p[c] - Real(out.p_hi[c])));
        if (out.sigma[c] == 0 && out.sigma[static_cast<std::size_t>(out.pivot)] != 0) out.pivot = static_cast<Index>(c);
    }
    out.log_W = std::log(static_cast<double>(W));
}

// The same from double-double logits, in double-double (BOUNDS.md section 5, the default path): p_j = e_j / W with
// e_j = dd_exp_nonpositive(s_j - m) and W their sum; out.p stays empty. Every operation is within kDdOp (the exps
// within kDdExp), which the caller's self-bound charges (oracle_rounding).
template <class Real>
void exact_softmax_dd(const std::vector<DoubleDouble>& logits, std::vector<DoubleDouble>& e, ExactSoftmax<Real>& out) {
    const std::size_t n = logits.size();
    DoubleDouble m = logits[0];
    for (std::size_t c = 1; c < n; ++c)
        if (dd_less(m, logits[c])) m = logits[c];
    e.resize(n);
    out.sigma.assign(n, 0.0);
    out.pivot = 0;
    // x_j = s_j - m <= 0 (exactly 0 for a key with the max logit), then every exp at once (SIMD, bitwise the scalar).
    std::vector<double>& x_hi = out.p_hi;  // scratch until the weights overwrite it
    std::vector<double>& x_lo = out.p_lo;
    x_hi.resize(n);
    x_lo.resize(n);
    for (std::size_t c = 0; c < n; ++c) {
        const DoubleDouble x = dd_add(logits[c], dd_neg(m));
        x_hi[c] = x.hi, x_lo[c] = x.lo;
        out.sigma[c] = -x.hi;
        if (out.sigma[c] == 0 && out.sigma[static_cast<std::size_t>(out.pivot)] != 0) out.pivot = static_cast<Index>(c);
    }
    std::vector<double> e_hi(n), e_lo(n);
    dd_exp_nonpositive_simd(x_hi.data(), x_lo.data(), n, e_hi.data(), e_lo.data());
    DoubleDouble W;
    for (std::size_t c = 0; c < n; ++c) {
        e[c] = {e_hi[c], e_lo[c]};
        W = dd_add(W, e[c]);
    }
    out.p.clear();
    for (std::size_t c = 0; c < n; ++c) {
        const DoubleDouble p = dd_div(e[c], W);
        out.p_hi[c] = p.hi;
        out.p_lo[c] = p.lo;
    }
    out.log_W = std::log(W.hi);
}

// o = sum_j p_j value(j) in Real (value(j) returns the Real value of key j's element).
template <class Real, class ValueAt>
Real weighted_sum(const std::vector<Real>& p, ValueAt value) {
    Real o(0);
    for (std::size_t c = 0; c < p.size(); ++c) o += p[c] * value(c);
    return o;
}

// ---- section 3: rounding parameters of one computation of a row, and the normalisations ----------------------------

// The implementation's (unit roundoff u of T) or, in the same form, the oracle's own (u_mp, section 5).
struct RowRounding {
    double k_sigma = 0;               // per unit of sigma_j + a_j + A: the shifts and rescalings, telescoped, and the
                                      // scale's own roundings (common to the row)
    double offset = 0;                // per key, whatever sigma_j: the rounded-max shift's u (max_j |s_j| + A)
    double log_up = 0, log_down = 0;  // log of the max / min product of the exp's relative error factors
    double gamma_S = 0;               // the sum over keys, per term
    double gamma_O = 0;               // the weighted sum over keys including the final division, per term
    double u_div = 0;                 // the division e_j / S (or product e_j * fl(1 / S)) for the weights
    // Split-KV (section 3): the combine's numerator and denominator exps of a split differ, a per-key relative
    // perturbation Phi_j of the denominator with log(1 + Phi_j) <= theta_D + k_D (sigma_j + a_j) (k_D a_j added by
    // the caller), and lse's own error, a factor e^{+-lse_common} on the whole output.
    bool split = false;
    double k_D = 0, theta_D = 0, lse_common = 0;
};

// Sections 3-4 for an implementation in T with R rescalings and the model's exp over n keys. max_abs_logit >=
// max_j |s_j| and A >= max_j a_j enter only the rounded-max shift. lambda > 0: the statistical bound's gamma_S and
// gamma_O (section 10); the short chains (shifts, scale, division) keep their rigorous gamma, which is smaller.
// u_storage: the unit roundoff of the storage type, for the model's roundings to it inside the computation (section
// 11): a scale rounded to storage joins the scale's common roundings, and P rounded before P V the weighted sum's
// per-term factor.
inline RowRounding implementation_rounding(const ErrorModel& model, double n, double R, double u, double max_abs_logit,
                                           double A, double lambda = 0, double u_storage = 0) {
    RowRounding P;
    const double gamma_r = scale_gamma(model, u, u_storage);
    const double gamma_k = gamma(static_cast<double>(model.shift_roundings), u);
    P.k_sigma = gamma_k * (1 + gamma_r) + gamma_r;
    // The rounded-max shift's u |m| per key, and lazy rescaling's 2 gamma_k stale_max (a key above a stale max).
    P.offset = (model.rounded_max_shift ? u * (1 + gamma_r) * (max_abs_logit + A) : 0.0) +
               2 * gamma_k * (1 + gamma_r) * model.stale_max;
    // k ulps are at most 2 k u relative to the exact value, or to the computed one, which is within (1 + 2 k u) of it.
    const double eps_exp = 2 * model.exp_ulps * u * (1 + 2 * model.exp_ulps * u);
    P.log_up = (1 + R) * std::log1p(eps_exp);  // the key's own exp and one per rescaling
    P.log_down = (1 + R) * std::log1p(-eps_exp);
    const double recip = model.reciprocal_normalisation ? 1 : 0;
    // Additions a term meets in the sum over keys: n - 1 in any order; with blocked partial sums at most
    // key_block - 1 in its own block and one per block from there on, R blocks (section 3, "Blocked sums").
    double additions = n - 1;
    if (model.block_partial_sums && model.key_block > 0 && model.rescalings < 0)
        additions = std::min(additions, static_cast<double>(model.key_block) + std::max(R, 1.0) - 2);
    P.gamma_S = gamma_stat(additions + R, u, lambda);
    P.gamma_O = gamma_stat(additions + 2 + recip + R, u, lambda);
    P.u_div = gamma(1 + recip, u);
    // P rounded before P V: a factor in the weighted sum, and in the sum of exps when it is formed from the rounded
    // values (charged either way: section 11).
    const auto p_storage = [&] {
        if (!model.probabilities_in_storage) return;
        P.gamma_O += u_storage * (1 + P.gamma_O);
        P.gamma_S += u_storage * (1 + P.gamma_S);
    };
    p_storage();
    if (model.split_kv) {
        // At most n splits. Within one: everything above. The combine (section 3, split-KV): lse_s = fl(m_s +
        // fl(log l_s)), lse = fl(M + fl(log sum_s exp(fl(lse_s - M)))), out = sum_s fl(exp(fl(lse_s - lse)) o_s).
        const double L = std::log(n) + model.stale_max + 1;       // |log l_s| and |log E| are at most this
        const double e_log = 2 * model.log_ulps * u * (1 + 2 * model.log_ulps * u) * (L + 1);
        const double lse_max = max_abs_logit + A + L + 1;          // |lse_s|, |lse| (computed) are at most this
        const double lambda_s = e_log + u * lse_max;               // each split's lse_s, per key
        P.offset += lambda_s;
        P.log_up = (2 + R) * std::log1p(eps_exp);                 // one more exp: the split's combine weight
        P.log_down = (2 + R) * std::log1p(-eps_exp);
        P.gamma_O = gamma_stat(2 * n + 1 + recip + R, u, lambda);  // + the product c_s o_s and n - 1 additions
        P.gamma_S = gamma_stat(2 * n - 2 + R, u, lambda);          // + the n - 1 additions of E
        p_storage();
        P.split = true;
        P.k_D = 2 * gamma_k;  // fl(lse_s - lse) and fl(lse_s - M): gamma_k |lse_s - lse| each
        P.theta_D = 2 * gamma_k * (A + L + 1 + lambda_s) + std::log1p(eps_exp) - std::log1p(-eps_exp);
        P.lse_common = lambda_s;  // the same bound: |log E| <= L and |lse| <= lse_max
    }
    return P;
}

// Section 5: the oracle itself (R = 0), each operation within u_op (MPFR's u_mp, or kDdOp on the double-double
// path), its exp within exp_error (MPFR's is correctly rounded: u_mp); gamma_O depends on how it forms the weighted sum.
inline RowRounding oracle_rounding(double n, double u_op, double gamma_O, double exp_error) {
    RowRounding P;
    P.k_sigma = u_op;
    P.log_up = std::log1p(exp_error);
    P.log_down = std::log1p(-exp_error);
    P.gamma_S = gamma(n - 1, u_op);
    P.gamma_O = gamma_O;
    P.u_div = u_op;
    return P;
}

// Theta_j = a_j + k_sigma (sigma_j + a_j + A) + offset, evaluated as written (the MHA path).
inline double exponent_perturbation(double a, double sigma, double A, const RowRounding& P) {
    return a + P.k_sigma * (sigma + a + A) + P.offset;
}

// The same Theta_j as theta_rest_j + k_sigma sigma_j, kept apart so that sigma_j = inf gives p_j B_j = 0
// (the SDPA path, whose logits may be huge). The two forms round differently in the last bit; each path keeps its own.
inline double exponent_perturbation_rest(double a, double A, const RowRounding& P) {
    return a + P.k_sigma * (a + A) + P.offset;
}

// Upper bounds of e^x - 1 and of 1 - e^x, cheap where |x| <= 2^-12 (most exponent perturbations): there
// e^x - 1 <= x + x^2 and 1 - e^x <= -x (e^x >= 1 + x everywhere). Elsewhere the library's expm1, whose error is far
// inside kBoundInflation.
inline double expm1_up(double x) { return std::fabs(x) <= 0x1p-12 ? x + x * x : std::expm1(x); }
inline double one_minus_exp_up(double x) { return std::fabs(x) <= 0x1p-12 ? -x : -std::expm1(x); }

// Direct normalisation: B_j = max(e^{Theta_j} (1+eps)^{1+R} - 1, 1 - e^{-Theta_j} (1-eps)^{1+R}).
inline double direct_factor(double theta, const RowRounding& P) {
    return std::max(expm1_up(theta + P.log_up), one_minus_exp_up(-theta + P.log_down));
}

// The sums of (*) for one output column, over the row's keys.
// A = double where every value is within [2^-450, 2^450] (no such sum overflows, and what underflows is far below
// the bound), Wide otherwise.
template <class A = Wide>
struct OutputSums {
    A spread = 0;   // sum_j p_j B_j |v_jc - o_c|
    A dv = 0;       // sum_j (p_j + p_j B_j) e_vjc: section 9's perturbed values (0 for SDPA)
    A absterm = 0;  // sum_j (p_j + p_j B_j) (|v_jc| + e_vjc)
    A stag = 0;     // section 10: the weighted sum's stagnating additions (StagnationRule), statistical bound only
};

// One normalisation of the computed exps: w-hat_j = w_j (1 + beta_j), |beta_j| <= B_j, with p_j B_j, their sum and
// the denominator's Delta = sum_j p_j B_j + gamma_S (1 + sum_j p_j B_j).
struct Normalisation {
    std::vector<double> B;       // B_j
    std::vector<double> pB, w;   // p_j B_j (in log space when B_j is large), p_j + p_j B_j: both rounded up
    Wide sum_pB = 0, delta = 0;
    double gamma_S = 0, gamma_O = 0;
    Wide sum_pD = 0;        // split-KV: sum_j p_j ((1 + B_j)(1 + Phi_j) - 1) >= sum_j (p_j + p_j B_j) Phi_j
    double lse_common = 0;  // split-KV: lse's own error
    Wide stag_S = 0;        // section 10: the sum's stagnating additions, per unit of W (statistical bound only)
    // 1 / (1 - Delta) and e^lse_common - 1, once per row (their rounding, 2^-64 relative, is within kBoundInflation)
    Wide inv_one_minus_delta = 1;
    double delta_up = 0, inv_one_minus_delta_up = 1;  // the same rounded up to double
    double lse_factor = 0;
    bool bounded = false;  // Delta < 1/2 and gamma_O < 1/2

    // Key j's terms of (*).
    template <class A>
    void add(OutputSums<A>& s, std::size_t c, std::type_identity_t<A> spread_j, std::type_identity_t<A> abs_v) const {
        s.spread += pB[c] * spread_j;
        s.absterm += w[c] * abs_v;
    }
    // The same with section 9's value perturbation e_v.
    template <class A>
    void add(OutputSums<A>& s, std::size_t c, std::type_identity_t<A> spread_j, std::type_identity_t<A> abs_v,
             std::type_identity_t<A> e_v) const {
        s.spread += pB[c] * spread_j;
        s.dv += w[c] * e_v;
        s.absterm += w[c] * (abs_v + e_v);
    }
    // Section 7: |v_j - o| is formed with o rounded to double, which adds sum_j p_j B_j |o| 2^-52.
    // R: the arithmetic, Wide unless the caller knows every term is far inside double's range (section 7).
    template <class R = Wide>
    R o_rounding(std::type_identity_t<R> o) const { return static_cast<R>(sum_pB) * std::fabs(o) * R(0x1p-52); }
    // The numerator of (*), plus o_rounding; o_up >= |o_c|.
    template <class R = Wide, class A>
    R output_numerator(const OutputSums<A>& s, std::type_identity_t<R> o_round, std::type_identity_t<R> o_up) const {
        const R pB = static_cast<R>(sum_pB), pD = static_cast<R>(sum_pD);
        return static_cast<R>(s.spread) + static_cast<R>(s.dv) + o_round + gamma_O * static_cast<R>(s.absterm) +
               gamma_S * o_up * (1 + pB) + (1 + gamma_S) * o_up * pD + static_cast<R>(s.stag) +
               static_cast<R>(stag_S) * o_up;
    }
    // (*): rel_c, +inf when the normalisation does not bound the row; split-KV's common lse error on top.
    template <class R = Wide, class A>
    R output_rel(const OutputSums<A>& s, std::type_identity_t<R> o_round, std::type_identity_t<R> o_up) const {
        if (!bounded) return std::numeric_limits<R>::infinity();
        const R rel = output_numerator<R>(s, o_round, o_up) * static_cast<R>(inv_one_minus_delta);
        return rel + lse_factor * (o_up + rel);
    }
    // Section 4, the weights' relative part: [p_j B_j + u (p_j + p_j B_j) + p_j Delta] / (1 - Delta).
    // In double, each step rounded up (weights and their terms lie in [0, 2]: nothing overflows, and underflow only
    // rounds up).
    double weight_rel(std::size_t c, double p, double u_div) const {
        if (!bounded) return std::numeric_limits<double>::infinity();
        const double rel =
            mul_up(add_up(add_up(pB[c], mul_up(u_div, add_up(p, pB[c]))), mul_up(p, delta_up)), inv_one_minus_delta_up);
        return lse_factor == 0 ? rel : add_up(rel, mul_up(lse_factor, add_up(p, rel)));
    }
    // The same divided by p_j (the caller checks Delta).
    double weight_rel_factor(std::size_t c, double u_div) const {
        return round_up((B[c] + u_div * (1 + B[c]) + delta) * inv_one_minus_delta);
    }
};

// Delta and whether the normalisation bounds the row, from its p_j B_j.
inline void finish(Normalisation& N, const RowRounding& P) {
    N.gamma_S = P.gamma_S;
    N.gamma_O = P.gamma_O;
    N.lse_common = P.lse_common;
    N.delta = N.sum_pB + P.gamma_S * (1 + N.sum_pB) + (1 + P.gamma_S) * N.sum_pD + N.stag_S;
    N.bounded = N.delta < 0.5 && P.gamma_O < 0.5 && P.lse_common < 0.5;  // false for NaN too
    N.inv_one_minus_delta = N.bounded ? 1 / (1 - N.delta) : Wide(0);  // unused when not bounded
    N.delta_up = round_up(N.delta);
    N.inv_one_minus_delta_up = round_up(N.inv_one_minus_delta * (1 + 0x1p-62L));
    N.lse_factor = std::expm1(P.lse_common);
}

// Direct normalisation from given B_j and upper bounds p_j (the MHA path): p_j B_j = p_j B_j, p_j (1 + B_j).
inline Normalisation normalise(const std::vector<double>& B, const std::vector<double>& p, const RowRounding& P) {
    Normalisation N;
    N.B = B;
    N.pB.resize(B.size());
    N.w.resize(B.size());
    for (std::size_t c = 0; c < B.size(); ++c) {
        N.pB[c] = round_up(static_cast<Wide>(p[c]) * B[c]);
        N.w[c] = round_up(static_cast<Wide>(p[c]) * (1 + B[c]));
        N.sum_pB += N.pB[c];
    }
    finish(N, P);
    return N;
}

// Direct or pivot normalisation from Theta_j = theta_rest_j + k_sigma sigma_j (the SDPA path):
//   direct: B_j = direct_factor(Theta_j), its upper side evaluated as (theta_rest_j + log_up) + k_sigma sigma_j;
//   pivot:  relative to the max key's own perturbation, which then cancels (beta_pivot = 0); wins when the max
//           key's logit error is large but the row is nearly one-hot.
// p_j B_j < exp(-sigma_j - log W + log(1 + B_j)) when B_j is large (0 for sigma_j = inf). The arguments are upper
// values of p_j and sigma_j and lower values of sigma_j and log W (section 7: the oracle's own values, widened by
// its own error; for the oracle's self-bound, its values as they are).
inline Normalisation normalise(const RowRounding& P, const std::vector<double>& theta_rest, const std::vector<double>& p,
                               const std::vector<double>& sigma, const std::vector<double>& sigma_lo, double log_W_lo,
                               Index pivot, bool pivoted, const std::vector<double>& theta_D_rest = {}) {
    const std::size_t n = p.size();
    Normalisation N;
    N.B.resize(n);
    N.pB.resize(n);
    N.w.resize(n);
    const auto piv = static_cast<std::size_t>(pivot);
    if (!(P.k_sigma + P.k_D < 0.5)) return N;  // not bounded
    const double theta_pivot = theta_rest[piv] + P.k_sigma * sigma[piv];
    for (std::size_t c = 0; c < n; ++c) {
        double up_rest = 0;  // log(1 + B_j) = up_rest + k_sigma sigma_j
        if (!pivoted) {
            up_rest = theta_rest[c] + P.log_up;
            N.B[c] = std::max(expm1_up(up_rest + P.k_sigma * sigma[c]),
                              one_minus_exp_up(-(theta_rest[c] + P.k_sigma * sigma[c]) + P.log_down));
        } else if (c != piv) {
            up_rest = theta_rest[c] + theta_pivot + P.log_up - P.log_down;
            N.B[c] = expm1_up(up_rest + P.k_sigma * sigma[c]);
        } else {
            N.B[c] = 0;
        }
        const double up = up_rest + P.k_sigma * sigma[c];
        // log p_j <= -sigma_lo_j - log W_lo, and log(1 + B_j) = up_rest + k_sigma sigma_j.
        const bool vanishes = std::isinf(sigma_lo[c]);  // p_j < e^-DBL_MAX: p_j (1 + B_j) = 0 in any format
        const Wide log_p = -static_cast<Wide>(sigma_lo[c]) - log_W_lo;
        N.pB[c] = up < 1      ? mul_up(p[c], N.B[c])
                  : vanishes ? 0.0
                             : round_up(std::exp(log_p + up_rest + P.k_sigma * sigma[c]));
        N.w[c] = add_up(p[c], N.pB[c]);
        N.sum_pB += N.pB[c];
        if (P.split) {
            // log(1 + Phi_j) <= theta_D_j + k_D sigma_j, theta_D_j = theta_D + k_D a_j (in theta_D_rest); then
            // (1 + B_j)(1 + Phi_j) - 1 on both sides, in log space when large.
            const double d_rest = P.theta_D + (theta_D_rest.empty() ? 0.0 : theta_D_rest[c]);
            const double upd = up + d_rest + P.k_D * sigma[c];
            const double lower = pivoted ? one_minus_exp_up(-(d_rest + P.k_D * sigma[c]))
                                         : one_minus_exp_up(-(theta_rest[c] + P.k_sigma * sigma[c]) + P.log_down -
                                                       (d_rest + P.k_D * sigma[c]));
            N.sum_pD += upd < 1    ? static_cast<Wide>(p[c]) * std::max(expm1_up(upd), lower)
                        : vanishes ? 0
                                   : std::exp(log_p + up_rest + d_rest + (P.k_sigma + P.k_D) * sigma[c]);
        }
    }
    finish(N, P);
    return N;
}

// ---- section 4: the underflow terms --------------------------------------------------------------------------------

// The implementation's absolute terms, in the scale of its computed sum, which is >= S_min.
struct Underflow {
    double S_min = 0, n = 0, R = 0, gamma_O = 0;
    Wide H0 = 0, Z = 0;
    UnderflowUnits eta;
    bool split = false;  // split-KV: the combine's products, additions and exps (each split's o_s is at most max|v|)
    // Section 11: P rounded to a storage type before P V, half its smallest subnormal per term (absolute, in the scale
    // of the computed exps or of the normalised weights): p_abs sum_j |v_jc| (1 / S_min + 1). 0 otherwise.
    Wide p_abs = 0;
    bool ok = false;  // S_min > 1/4
    Wide inv_S_min = 0;  // 1 / S_min (its rounding within kBoundInflation)

    // bound_c = rel_c + (Xi_c + (|o_c| + rel_c) Z) / S_min + the normalise-first form's underflow; abs_v =
    // sum_j |v_jc| (plus e_vjc for section 9), o_up >= |o_c|. +inf when S_min is too small.
    // R as in Normalisation::output_rel: double only where the units (at least 2^-150 there) and the values are
    // far inside double's range.
    template <class R = Wide>
    R output(std::type_identity_t<R> rel, std::type_identity_t<R> abs_v, std::type_identity_t<R> o_up) const {
        if (!ok) return std::numeric_limits<R>::infinity();
        const R mul = static_cast<R>(eta.mul), add = static_cast<R>(eta.add), ex = static_cast<R>(eta.exp);
        const R h0 = static_cast<R>(H0), z = static_cast<R>(Z), inv = static_cast<R>(inv_S_min);
        // n products e_j v_j, R rescalings and the division (or reciprocal and product) each eta_mul; n additions.
        const R Xi = (h0 * abs_v + (n + this->R + 2) * mul + n * add) * (1 + gamma_O) * 2;
        // normalise-first: each weight fl(e_j / S) (eta_mul |v_jc|), n products and n additions.
        const R direct_abs = (mul * abs_v + n * (mul + add)) * (1 + gamma_O);
        // Split-KV: each part's own absolute error has |o_s| <= max_j |v_jc| where a single pass has |o_c|.
        const R combine_abs = split ? (n * (mul + add) + ex * abs_v) * (1 + gamma_O) + z * abs_v * inv : R(0);
        const R storage_abs = static_cast<R>(p_abs) * abs_v * (inv + 1) * (1 + gamma_O);
        return rel + (Xi + (o_up + rel) * z) * inv + direct_abs + combine_abs + storage_abs;
    }
    // The weight p_j's: rel_j + (H0 (1 + u) + (p_j + rel_j) Z) / S_min + eta_mul.
    template <class R = Wide>
    R weight(std::type_identity_t<R> rel, double p, double u) const {
        if (!ok) return std::numeric_limits<R>::infinity();
        return rel + (static_cast<R>(H0) * (1 + u) + (p + rel) * static_cast<R>(Z)) * static_cast<R>(inv_S_min) +
               static_cast<R>(eta.mul);
    }
};

// S_min: the computed argmax's exp is at least exp(-offset) (1 - eps_exp) (its argument is 0, or the rounded-max
// shift's offset), times R rescalings of at least (1 - eps_exp)(1 - u), less the sum's rounding.
// p_abs: Underflow::p_abs (section 11), which enters the computed sum too.
inline Underflow underflow_terms(const RowRounding& impl, double n, double R, double u, const UnderflowUnits& eta,
                                 Wide p_abs = 0) {
    Underflow U;
    U.S_min = std::exp(impl.log_down - impl.offset + R * std::log1p(-u)) * (1 - impl.gamma_S);
    U.H0 = (1 + R) * (eta.exp + eta.mul);                         // each computed exp, after rescalings
    U.Z = (n * (U.H0 + p_abs) + n * eta.add + R * eta.mul) * (1 + impl.gamma_S) * 2;  // the computed sum
    U.p_abs = p_abs;
    U.n = n;
    U.R = R;
    U.eta = eta;
    U.gamma_O = impl.gamma_O;
    U.split = impl.split;
    U.ok = U.S_min > 0.25;
    U.inv_S_min = U.ok ? 1 / static_cast<Wide>(U.S_min) : Wide(0);  // unused when not ok
    return U;
}

}  // namespace attn::oracle::detail
