// Internal: the oracle's engine, templated on the multiprecision type so the benchmark can compare backends.
// Every number and formula here is derived in oracle/BOUNDS.md (section numbers in the comments).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/oracle/oracle.hpp"
#include "attn/detail/problem.hpp"

namespace attn::oracle::detail {

// ---- error-free transformations in double (BOUNDS.md section 5) -----------------------------------------------

struct DoubleDouble {
    double hi = 0, lo = 0;
};

// s + e == a + b exactly (Knuth's TwoSum; no branch, any magnitudes).
inline void two_sum(double a, double b, double& s, double& e) {
    s = a + b;
    const double bb = s - a;
    e = (a - (s - bb)) + (b - bb);
}

// p + e == a * b exactly, provided the product neither overflows nor underflows.
inline void two_prod(double a, double b, double& p, double& e) {
    p = a * b;
    e = std::fma(a, b, -p);
}

// Dot2 of Ogita, Rump and Oishi (2005) without its final rounding: |hi + lo - x.y| <= 2 gamma_n(2^-53)^2 |x|.|y|
// (plus underflow, excluded by the caller's range check). abs_dot receives |x|.|y| rounded up.
inline DoubleDouble dot2(const double* x, const double* y, Index n, double& abs_dot) {
    double s = 0, c = 0, a = 0;
    for (Index d = 0; d < n; ++d) {
        double p, e, t, q;
        two_prod(x[d], y[d], p, e);
        two_sum(s, p, t, q);
        s = t;
        c += q + e;
        a += std::fabs(p);
    }
    abs_dot = a;
    return {s, c};
}

inline double gamma(double n, double u) {
    const double nu = n * u;
    return nu < 1 ? nu / (1 - nu) : std::numeric_limits<double>::infinity();
}

// Whether |x| lies in [2^-450, 2^450] or is 0: products of two such doubles neither overflow nor underflow, and
// nor does a product with a weight in [2^-400, 1] (the fast path's range condition).
inline bool in_safe_range(double x) {
    const double a = std::fabs(x);
    return a == 0 || (a >= 0x1p-450 && a <= 0x1p450);
}

// ---- the engine ---------------------------------------------------------------------------------------------------

// Rigorous bounds are computed in double from nonnegative terms; their own rounding (relative, at most
// ~(Tk + Dk + 20) * 2^-53) is covered by this factor for Tk + Dk < 10^9 (BOUNDS.md section 7).
inline constexpr double kBoundInflation = 1 + 1e-6;

template <class Real, class T>
class Engine {
public:
    Engine(const SdpaProblem<T>& p, const std::vector<Readability>& readable, const SdpaOptions& options,
           const ErrorModel& model, bool fast, int precision_bits, Result<T>& out)
        : p_(p), readable_(readable), options_(options), model_(model), fast_(fast), out_(out) {
        u_mp_ = std::ldexp(1.0, -(precision_bits - 1));  // unit roundoff of Real, 2^-(P-1) to be safe
        R_ = effective_rescalings(model, p.Tk);
    }

    void run() {
        for (Index b = 0; b < p_.batch; ++b) run_batch(b);
    }

private:
    static constexpr double u_ = std::numeric_limits<T>::epsilon() / 2;  // unit roundoff of the target
    static constexpr double eta_ = std::numeric_limits<T>::min();        // underflow term, covers flush-to-zero

    const SdpaProblem<T>& p_;
    const std::vector<Readability>& readable_;
    const SdpaOptions& options_;
    const ErrorModel& model_;
    bool fast_;
    Result<T>& out_;
    double u_mp_ = 0;
    Index R_ = 0;

    // Per batch element, contiguous copies in double (exact for float and double inputs).
    std::vector<double> qd_, kd_, vd_;

    // Every value is stored from hi + lo: hi = the value rounded to double, lo = the rest rounded to double
    // (106 bits, far below any bound; see BOUNDS.md section 5).
    void put_output(Index flat, double hi, double lo, double bound, double scale, double self_error) {
        store(hi, lo, out_.output.data()[flat], out_.output_exact.data()[flat], out_.output_exact_lo.data()[flat]);
        out_.output_bound.data()[flat] = bound;
        out_.output_scale.data()[flat] = scale;
        note_self_error(self_error, bound);
    }
    void put_weight(Index flat, double hi, double lo, double bound, double self_error) {
        store(hi, lo, out_.weights.data()[flat], out_.weights_exact.data()[flat], out_.weights_exact_lo.data()[flat]);
        out_.weights_bound.data()[flat] = bound;
        note_self_error(self_error, bound);
    }
    void note_self_error(double self_error, double bound) {
        if (self_error == 0) return;
        const double ratio = bound > 0 ? self_error / bound : std::numeric_limits<double>::infinity();
        out_.oracle_error_ratio = std::max(out_.oracle_error_ratio, ratio);
    }
    static void store(double hi, double lo, T& rounded, long double& exact, long double& exact_lo) {
        rounded = round_to<T>(hi, lo);
        exact = static_cast<long double>(hi) + static_cast<long double>(lo);
        // hi - exact is exact (Sterbenz); exact + exact_lo = hi + lo to ~2^-117 relative.
        exact_lo = std::isfinite(hi) ? (static_cast<long double>(hi) - exact) + static_cast<long double>(lo) : 0.0L;
    }
    // hi and lo of a Real.
    static void split(const Real& x, double& hi, double& lo) {
        hi = static_cast<double>(x);
        lo = std::isfinite(hi) ? static_cast<double>(Real(x - Real(hi))) : 0.0;
    }
    void fill_row(Index b, Index i, double value) {
        for (Index c = 0; c < p_.Dv; ++c) put_output((b * p_.Tq + i) * p_.Dv + c, value, 0, 0, 0, 0);
        for (Index j = 0; j < p_.Tk; ++j) put_weight((b * p_.Tq + i) * p_.Tk + j, value, 0, 0, 0);
    }

    void gather(Index b, const Readability& r) {
        const Index Tq = p_.Tq, Tk = p_.Tk, Dk = p_.Dk, Dv = p_.Dv;
        qd_.assign(static_cast<std::size_t>(Tq * Dk), 0.0);
        kd_.assign(static_cast<std::size_t>(Tk * Dk), 0.0);
        vd_.assign(static_cast<std::size_t>(Tk * Dv), 0.0);
        for (Index i = 0; i < Tq; ++i)
            for (Index d = 0; d < Dk; ++d) qd_[i * Dk + d] = p_.q_row(b, i)[d * p_.q.stride(-1)];
        // Unreadable key/value rows stay 0: whatever they hold is never read.
        for (Index j = 0; j < Tk; ++j) {
            if (!r.key_readable[static_cast<std::size_t>(j)]) continue;
            for (Index d = 0; d < Dk; ++d) kd_[j * Dk + d] = p_.k_row(b, j)[d * p_.k.stride(-1)];
            for (Index d = 0; d < Dv; ++d) vd_[j * Dv + d] = p_.v_row(b, j)[d * p_.v.stride(-1)];
        }
    }

    void run_batch(Index b) {
        const Readability& r = readable_[static_cast<std::size_t>(b)];
        gather(b, r);
        // The double-double kernels need every product in range; otherwise this batch element goes the plain way.
        bool fast = fast_;
        if (fast && std::is_same_v<T, double>) {
            fast = std::all_of(qd_.begin(), qd_.end(), in_safe_range) &&
                   std::all_of(kd_.begin(), kd_.end(), in_safe_range) &&
                   std::all_of(vd_.begin(), vd_.end(), in_safe_range);
        }
        std::vector<Index> keys;
        for (Index i = 0; i < p_.Tq; ++i) {
            if (!r.row_nonempty[static_cast<std::size_t>(i)]) {
                // Only reached under Zero or Nan (check_contracts threw under Throw).
                fill_row(b, i, options_.empty_rows == EmptyRowPolicy::Nan ? std::numeric_limits<double>::quiet_NaN() : 0.0);
                continue;
            }
            keys.clear();
            for (Index j = 0; j < p_.Tk; ++j)
                if (r.key_readable[static_cast<std::size_t>(j)] && p_.allowed(b, i, j)) keys.push_back(j);
            run_row(b, i, keys, fast);
        }
    }

    bool row_is_finite(Index i, const std::vector<Index>& keys) const {
        const Index Dk = p_.Dk, Dv = p_.Dv;
        for (Index d = 0; d < Dk; ++d)
            if (!std::isfinite(qd_[i * Dk + d])) return false;
        for (Index j : keys) {
            for (Index d = 0; d < Dk; ++d)
                if (!std::isfinite(kd_[j * Dk + d])) return false;
            for (Index d = 0; d < Dv; ++d)
                if (!std::isfinite(vd_[j * Dv + d])) return false;
        }
        return true;
    }

    // One query row i of batch element b over its allowed keys (n of them, n >= 1).
    void run_row(Index b, Index i, const std::vector<Index>& keys, bool fast) {
        const Index Dk = p_.Dk, Dv = p_.Dv, Tk = p_.Tk;
        const Index n = static_cast<Index>(keys.size());
        if (!row_is_finite(i, keys)) {
            fill_row(b, i, std::numeric_limits<double>::quiet_NaN());  // NaN/Inf inputs propagate (check_finite off)
            return;
        }
        const double scale = p_.scale;
        const double abs_scale = std::fabs(scale);
        const double* qi = qd_.data() + i * Dk;

        // 1. logits s_j = scale * q_i . k_j (exact inputs; BOUNDS.md section 5 for the oracle's own error).
        std::vector<Real> s(static_cast<std::size_t>(n));
        std::vector<double> abs_dot(static_cast<std::size_t>(n));  // sum_d |q_d k_jd|
        std::vector<double> abs_sum(static_cast<std::size_t>(n));  // sum_d (|q_d| + |k_jd|), for underflow terms
        std::vector<double> logit_self(static_cast<std::size_t>(n));
        double abs_q = 0;
        for (Index d = 0; d < Dk; ++d) abs_q += std::fabs(qi[d]);
        const Real scale_mp(scale);
        for (Index c = 0; c < n; ++c) {
            const double* kj = kd_.data() + keys[c] * Dk;
            double abs_k = 0;
            for (Index d = 0; d < Dk; ++d) abs_k += std::fabs(kj[d]);
            abs_sum[c] = abs_q + abs_k;
            if (fast) {
                const DoubleDouble dd = dot2(qi, kj, Dk, abs_dot[c]);
                s[c] = scale_mp * (Real(dd.hi) + Real(dd.lo));
                // Dot2 without its final rounding: gamma_Dk(2^-53)^2 |q|.|k| (Ogita, Rump, Oishi 2005, Prop. 5.5);
                // doubled, plus the sum hi + lo and the scale in Real.
                const double g = gamma(static_cast<double>(Dk), 0x1p-53);
                logit_self[c] = (2 * g * g + 3 * u_mp_) * abs_scale * abs_dot[c];
            } else {
                Real acc(0);
                double a = 0;
                for (Index d = 0; d < Dk; ++d) {
                    acc += Real(qi[d]) * Real(kj[d]);
                    a += std::fabs(qi[d] * kj[d]);
                }
                abs_dot[c] = a;
                s[c] = scale_mp * acc;
                logit_self[c] = gamma(2.0 * Dk + 2, u_mp_) * abs_scale * a;
            }
        }

        // 2. max shift, exp, sum, normalise (in Real; MPFR's exp is correctly rounded).
        Real m = s[0];
        for (Index c = 1; c < n; ++c)
            if (s[c] > m) m = s[c];
        std::vector<Real> e(static_cast<std::size_t>(n));
        std::vector<double> sigma(static_cast<std::size_t>(n));  // m - s_j >= 0
        Real W(0);
        for (Index c = 0; c < n; ++c) {
            const Real x = s[c] - m;
            sigma[c] = -static_cast<double>(x);
            e[c] = exp(x);
            W += e[c];
        }
        std::vector<Real> pr(static_cast<std::size_t>(n));
        std::vector<double> pw(static_cast<std::size_t>(n));  // p_j in double
        for (Index c = 0; c < n; ++c) {
            pr[c] = e[c] / W;
            pw[c] = static_cast<double>(pr[c]);
        }
        const double Wd = static_cast<double>(W);
        const double log_W = std::log(Wd);

        // 3. the bound's parameters (BOUNDS.md sections 2-4): for the implementation (unit roundoff u of T) and,
        // in the same form, for the oracle itself (u_mp, correctly rounded exp, no rescaling; section 5).
        const double R = static_cast<double>(R_);
        const double nd = static_cast<double>(n);
        const double gamma_logit = gamma(static_cast<double>(Dk + 1 + model_.scale_roundings), u_);
        std::vector<double> a(static_cast<std::size_t>(n));
        double A = 0;
        Index pivot = 0;  // a key with the exact max logit
        for (Index c = 0; c < n; ++c) {
            a[c] = gamma_logit * abs_scale * abs_dot[c] +
                   eta_ * ((2.0 * Dk + 2) * (1 + abs_scale) + abs_sum[c]) * (1 + gamma(Dk + 2.0, u_));
            A = std::max(A, a[c]);
            if (sigma[c] == 0 && sigma[pivot] != 0) pivot = c;
        }
        Params impl;
        impl.theta_rest.resize(static_cast<std::size_t>(n));
        impl.k_sigma = (1 + R) * u_;
        for (Index c = 0; c < n; ++c) impl.theta_rest[c] = a[c] + impl.k_sigma * (a[c] + A);
        const double eps_exp = 2 * model_.exp_ulps * u_;
        impl.log_up = (1 + R) * std::log1p(eps_exp);  // the key's own exp and one per rescaling
        impl.log_down = (1 + R) * std::log1p(-eps_exp);
        impl.gamma_S = gamma(nd - 1 + R, u_);
        impl.gamma_O = gamma(nd + 1 + R, u_);
        impl.u_div = u_;

        Params self;
        self.theta_rest = logit_self;
        self.k_sigma = u_mp_;
        self.log_up = std::log1p(u_mp_);
        self.log_down = std::log1p(-u_mp_);
        self.gamma_S = gamma(nd - 1, u_mp_);
        // The weighted sum: double-double (p_j to 2^-106, then Dot2) or Real; plus the division's rounding.
        // 2n terms (p_hi v_j exactly via TwoProd, p_lo v_j rounded) through Dot2, and p_j to 2^-106 as hi + lo.
        const double g2n = gamma(2.0 * nd, 0x1p-53);
        self.gamma_O = (fast ? 2 * g2n * g2n + 4 * 0x1p-106 : gamma(nd, u_mp_)) + 2 * u_mp_;
        self.u_div = u_mp_;

        const Normalisation nz[4] = {normalise(impl, pw, sigma, log_W, pivot, false),
                                     normalise(impl, pw, sigma, log_W, pivot, true),
                                     normalise(self, pw, sigma, log_W, pivot, false),
                                     normalise(self, pw, sigma, log_W, pivot, true)};
        // Absolute (underflow) terms of the implementation, in the scale of its computed sum, which is >= S_min.
        const double S_min = std::exp(impl.log_down + R * std::log1p(-u_)) * (1 - impl.gamma_S);
        const double H0 = 2 * (1 + R) * eta_;                                  // each computed exp, after rescalings
        const double Z = (nd * H0 + (nd + R) * eta_) * (1 + impl.gamma_S) * 2;  // the computed sum
        const bool abs_ok = S_min > 0.25;
        const double inf = std::numeric_limits<double>::infinity();

        // 4. weights p_j = e_j / W (BOUNDS.md section 4); p_j = pw + p_lo to 106 bits.
        std::vector<double> p_lo(static_cast<std::size_t>(n));
        for (Index c = 0; c < n; ++c) p_lo[c] = static_cast<double>(Real(pr[c] - Real(pw[c])));
        // Blocked and unreadable keys keep weight 0 with bound 0: the result tensors start zero-filled.
        for (Index c = 0; c < n; ++c) {
            const double rel_impl = std::min(nz[0].weight_rel(c, pw[c], impl.u_div), nz[1].weight_rel(c, pw[c], impl.u_div));
            const double bound =
                abs_ok ? (rel_impl + (H0 * (1 + u_) + (pw[c] + rel_impl) * Z) / S_min + eta_) * kBoundInflation : inf;
            const double self_error =
                std::min(nz[2].weight_rel(c, pw[c], self.u_div), nz[3].weight_rel(c, pw[c], self.u_div)) +
                0x1p-105 * pw[c] + 0x1p-1070;  // + storing p_j as pw + p_lo
            put_weight((b * p_.Tq + i) * Tk + keys[c], pw[c], p_lo[c], bound, self_error);
        }

        // 5. output o_c = sum_j p_j v_jc, and its bound (BOUNDS.md section 3).
        for (Index col = 0; col < Dv; ++col) {
            double od = 0, o_lo = 0;  // o = od + o_lo
            if (fast) {
                double sh = 0, sl = 0;
                for (Index c = 0; c < n; ++c) {
                    const double vj = vd_[keys[c] * Dv + col];
                    double ph, pe, t, q2;
                    two_prod(pw[c], vj, ph, pe);
                    two_sum(sh, ph, t, q2);
                    sh = t;
                    sl += q2 + (pe + p_lo[c] * vj);
                }
                two_sum(sh, sl, od, o_lo);  // exact: od = RN(sh + sl), o_lo the rest
            } else {
                Real o(0);
                for (Index c = 0; c < n; ++c) o += pr[c] * Real(vd_[keys[c] * Dv + col]);
                split(o, od, o_lo);
            }
            double scale_c = 0, abs_v = 0;
            double dev[4] = {0, 0, 0, 0}, absterm[4] = {0, 0, 0, 0};  // sum pB_j |v_j - o|, sum (p_j + pB_j) |v_j|
            for (Index c = 0; c < n; ++c) {
                const double vj = vd_[keys[c] * Dv + col];
                const double av = std::fabs(vj);
                const double d = std::fabs(vj - od);  // |v_j - o| <= d + |od| 2^-52 (added in output_rel)
                scale_c += pw[c] * av;
                abs_v += av;
                for (int z = 0; z < 4; ++z) {
                    dev[z] += nz[z].pB[c] * d;
                    absterm[z] += (pw[c] + nz[z].pB[c]) * av;
                }
            }
            double rel[4];
            for (int z = 0; z < 4; ++z) rel[z] = nz[z].output_rel(dev[z], absterm[z], od, z < 2 ? impl : self);
            const double rel_impl = std::min(rel[0], rel[1]);
            const double Xi = (H0 * abs_v + (2 * nd + R + 2) * eta_) * (1 + impl.gamma_O) * 2;
            const double direct_abs = (eta_ * abs_v + 2 * nd * eta_) * (1 + impl.gamma_O);  // normalise-first underflow
            const double bound =
                abs_ok ? (rel_impl + (Xi + (std::fabs(od) + rel_impl) * Z) / S_min + direct_abs) * kBoundInflation : inf;
            // + underflow in double: p_j below the normal range (2^-1074 |v_j| each) and the double-double sums.
            // + storing o as od + o_lo (exact on the fast path, 2^-106 relative otherwise).
            const double self_error = std::min(rel[2], rel[3]) + 0x1p-1074 * (abs_v + 4 * nd) + 0x1p-105 * std::fabs(od);
            put_output((b * p_.Tq + i) * Dv + col, od, o_lo, bound, scale_c, self_error);
        }
    }

    // The rounding parameters of one computation of a row (the implementation's or the oracle's own).
    struct Params {
        // Per key: the bound on the perturbation of its exponent (logit error + shift roundings) is
        // theta_j = theta_rest_j + k_sigma * sigma_j, kept apart so that sigma_j = inf gives p_j B_j = 0.
        std::vector<double> theta_rest;
        double k_sigma = 0;
        double theta(std::size_t c, const std::vector<double>& sigma) const { return theta_rest[c] + k_sigma * sigma[c]; }
        double log_up = 0, log_down = 0;  // log of the max / min product of the exp's relative error factors
        double gamma_S = 0;  // relative error of the sum over keys (per term)
        double gamma_O = 0;  // relative error of the weighted sum over keys including the final division (per term)
        double u_div = 0;    // rounding of the division e_j / S for the weights
    };

    // One normalisation of the computed exps (BOUNDS.md section 3): w-hat_j = w_j (1 + beta_j), |beta_j| <= B_j.
    //   direct: beta_j from theta_j and the exp errors of key j;
    //   pivot:  relative to the max key's own perturbation, which then cancels (beta_pivot = 0); wins when the max
    //           key's logit error is large but the row is nearly one-hot.
    struct Normalisation {
        std::vector<double> B, pB;  // B_j and p_j B_j (the latter in log space when B_j is large)
        double sum_pB = 0, deltaD = 0, gamma_S = 0;
        bool bounded = false;

        double weight_rel(Index c, double p, double u_div) const {
            if (!bounded) return std::numeric_limits<double>::infinity();
            return (pB[c] + u_div * (p + pB[c]) + p * deltaD) / (1 - deltaD);
        }
        double output_rel(double dev, double absterm, double od, const Params& P) const {
            if (!bounded) return std::numeric_limits<double>::infinity();
            return (dev + sum_pB * std::fabs(od) * 0x1p-52 + P.gamma_O * absterm + std::fabs(od) * P.gamma_S * (1 + sum_pB)) /
                   (1 - deltaD);
        }
    };

    static Normalisation normalise(const Params& P, const std::vector<double>& pw, const std::vector<double>& sigma,
                                   double log_W, Index pivot, bool pivoted) {
        const std::size_t n = pw.size();
        Normalisation N;
        N.B.resize(n);
        N.pB.resize(n);
        const auto piv = static_cast<std::size_t>(pivot);
        if (!(P.k_sigma < 0.5)) return N;  // not bounded
        for (std::size_t c = 0; c < n; ++c) {
            double up_rest = 0;  // log(1 + B_j) = up_rest + k_sigma sigma_j
            if (!pivoted) {
                up_rest = P.theta_rest[c] + P.log_up;
                N.B[c] = std::max(std::expm1(up_rest + P.k_sigma * sigma[c]), -std::expm1(-P.theta(c, sigma) + P.log_down));
            } else if (c != piv) {
                up_rest = P.theta_rest[c] + P.theta(piv, sigma) + P.log_up - P.log_down;
                N.B[c] = std::expm1(up_rest + P.k_sigma * sigma[c]);
            } else {
                N.B[c] = 0;
            }
            // p_j B_j < exp(-sigma_j (1 - k_sigma) - log W + up_rest) when B_j is large (and 0 for sigma_j = inf).
            const double up = up_rest + P.k_sigma * sigma[c];
            N.pB[c] = up < 1 ? pw[c] * N.B[c] : std::exp(-sigma[c] * (1 - P.k_sigma) - log_W + up_rest);
            N.sum_pB += N.pB[c];
        }
        N.gamma_S = P.gamma_S;
        N.deltaD = N.sum_pB + P.gamma_S * (1 + N.sum_pB);
        N.bounded = N.deltaD < 0.5 && P.gamma_O < 0.5;  // false for NaN too
        return N;
    }
};

}  // namespace attn::oracle::detail
