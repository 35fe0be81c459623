// Internal: the SDPA oracle's engine, templated on the multiprecision type so the benchmark can compare backends.
// Every number and formula here is derived in oracle/BOUNDS.md (section numbers in the comments); the row's
// softmax and bound are softmax_bound.hpp's, shared with the MHA path.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/oracle/oracle.hpp"
#include "attn/detail/problem.hpp"
#include "simd.hpp"
#include "softmax_bound.hpp"

namespace attn::oracle::detail {

// ---- the logits' error-free dot product (BOUNDS.md section 5) ------------------------------------------------

// The logits' dot products on the default path are Dot2 of Ogita, Rump and Oishi (2005) without its final rounding,
// dot2_keys_simd (simd.hpp): |hi + lo - x.y| <= 2 gamma_n(2^-53)^2 |x|.|y| (plus underflow, excluded by the caller's
// range check). abs_dot receives |x|.|y| summed in double, to nearest (not rounded up: its relative error, below
// (n + 1) 2^-53, is covered by kBoundInflation, BOUNDS.md section 7).

// Whether |x| lies in [2^-450, 2^450] or is 0: products of two such doubles neither overflow nor underflow, and
// nor does a product with a weight in [2^-400, 1] (the fast path's range condition).
inline bool in_safe_range(double x) {
    const double a = std::fabs(x);
    return a == 0 || (a >= 0x1p-450 && a <= 0x1p450);
}

// ---- the engine ---------------------------------------------------------------------------------------------------

template <class Real, class T>
class Engine {
public:
    Engine(const SdpaProblem<T>& p, const std::vector<Readability>& readable, const SdpaOptions& options,
           const ErrorModel& model, bool fast, int precision_bits, Result<T>& out)
        : p_(p), readable_(readable), options_(options), model_(model), fast_(fast), out_(out) {
        u_mp_ = std::ldexp(1.0, -(precision_bits - 1));  // unit roundoff of Real, 2^-(P-1) to be safe
        R_ = effective_rescalings(model, p.Tk);
        eta_fast_ = underflow_units<C>(model);
        eta_plain_ = underflow_units<C>(model, true);
        stat_ = out.statistical;  // OracleOptions::statistical
    }

    void run() {
        for (Index b = 0; b < p_.batch; ++b) run_batch(b);
    }

private:
    // T is the target dtype the results are rounded to and the kernel stores; C is the type the kernel computes in
    // (T itself, float for the 16-bit storage types). Every rounding of the computation is one of C's (its unit
    // roundoff, its underflow, its subnormal inputs); the last one, of the result to T, is storage_rounding's.
    using C = compute_t<T>;
    static constexpr double u_ = std::numeric_limits<C>::epsilon() / 2;  // unit roundoff of the computation
    // The storage type's unit roundoff and half its smallest subnormal: the roundings to it inside the computation
    // that the model names (ErrorModel::logit_storage_roundings, probabilities_in_storage; section 11).
    static constexpr double u_storage_ = StorageUnits<T>::u;
    static constexpr double tau_storage_ = StorageUnits<T>::half_denorm;
    // a_j with the logit rounded to storage k times (section 11): + gamma_k (|s_j| + a_j) + k tau max(1, |scale_hat|)
    // (1 + gamma_k): a rounding of q k^T before the scale has its absolute (subnormal) part multiplied by the scale.
    double storage_logit(double a, double abs_s) const {
        const Index k = model_.logit_storage_roundings;
        if (k <= 0) return a;
        const double g = gamma(static_cast<double>(k), u_storage_);
        const Wide scaled = std::max(Wide(1), std::fabs(static_cast<Wide>(p_.scale)) * (1 + scale_gamma(model_, u_, u_storage_)));
        return round_up((static_cast<Wide>(a) + g * (static_cast<Wide>(abs_s) + a) +
                         static_cast<Wide>(k) * tau_storage_ * scaled * (1 + g)) * (1 + 0x1p-60L));
    }

    const SdpaProblem<T>& p_;
    const std::vector<Readability>& readable_;
    const SdpaOptions& options_;
    const ErrorModel& model_;
    bool fast_;
    Result<T>& out_;
    double u_mp_ = 0;
    Index R_ = 0;
    bool stat_ = false;  // also the statistical bound (section 10)
    std::vector<char> key_structured_;  // per key of the batch element: its k row has many near-equal entries
    // The model's underflow (flush-to-zero or gradual), BOUNDS.md sections 0 and 4: on the double-double path and
    // on the all-MPFR path, which stores its values beyond double-double (a double target's gradual units need it).
    UnderflowUnits eta_fast_, eta_plain_;
    bool k_flushable_ = false;  // this batch element's readable keys hold a subnormal (ErrorModel::inputs_flushed)
    std::vector<char> key_finite_;    // per key of the batch element: its k and v rows are finite
    std::vector<DoubleDouble> exps_;  // one row's exps on the double-double path (scratch)
    double row_ratio_ = 0;            // the current row's max self-error / bound, committed when the row is kept
    std::vector<double> col_hi_, col_lo_;  // one row's outputs, per column (scratch)
    std::vector<const double*> row_ptrs_;  // one row's value rows (scratch)
    std::vector<double> sums_;             // one row's sums over keys per column, output_row (scratch)
    // output_row's sums of one column, in Wide (scratch, per column)
    struct ColumnSums {
        Wide scale = 0, abs_v = 0, abs_v_impl = 0, abs_self = 0, spread_self = 0;
        OutputSums<Wide> impl, stat;  // stat: under the statistical normalisation (section 10)
    };
    std::vector<ColumnSums> col_sums_;
    std::vector<double> kT_;  // the batch element's keys transposed, (Dk, Tk), for dot2_keys_simd
    std::vector<Wide> abs_k_;  // sum_d |k_jd| per key
    bool k_in_range_ = false;  // every element of kd_ is in_safe_range
    mutable std::vector<double> all_hi_, all_lo_, all_abs_;  // one query's q.k_j for every key (scratch)

    // Per batch element, contiguous copies in double (exact for float and double inputs).
    std::vector<double> qd_, kd_, vd_;

    // Every value is stored from hi + lo: hi = the value rounded to double, lo = the rest rounded to double
    // (106 bits, far below any bound; see BOUNDS.md section 5).
    // `bound` is the computation's (in C); the value stored is the final one, storage_rounding's, for a result of
    // magnitude about |hi|.
    void put_output(Index flat, double hi, double lo, double bound, double scale, Wide self_error) {
        store<T>(hi, lo, out_.output.data()[flat], out_.output_exact.data()[flat], out_.output_exact_lo.data()[flat]);
        put_output_bound(flat, storage_rounding(bound, hi), scale, self_error);
    }
    void put_weight(Index flat, double hi, double lo, double bound, Wide self_error) {
        store<T>(hi, lo, out_.weights.data()[flat], out_.weights_exact.data()[flat], out_.weights_exact_lo.data()[flat]);
        put_weight_bound(flat, storage_rounding(bound, hi), self_error);
    }
    // The all-MPFR path stores from Real itself (store_wide: 2^-127 relative at any magnitude, subnormal doubles too).
    void put_output(Index flat, const Real& x, double bound, double scale, Wide self_error) {
        store_wide<T>(x, out_.output.data()[flat], out_.output_exact.data()[flat], out_.output_exact_lo.data()[flat]);
        put_output_bound(flat, storage_rounding(bound, static_cast<double>(x)), scale, self_error);
    }
    void put_weight(Index flat, const Real& x, double bound, Wide self_error) {
        store_wide<T>(x, out_.weights.data()[flat], out_.weights_exact.data()[flat], out_.weights_exact_lo.data()[flat]);
        put_weight_bound(flat, storage_rounding(bound, static_cast<double>(x)), self_error);
    }
    // BOUNDS.md section 11 (softmax_bound.hpp): the final rounding of a result computed in C to the storage T.
    static double storage_rounding(double bound, double hi) { return detail::storage_rounding<T>(bound, hi); }
    void put_output_bound(Index flat, double bound, double scale, Wide self_error) {
        out_.output_bound.data()[flat] = bound;
        out_.output_scale.data()[flat] = scale;
        if (stat_) out_.output_stat_bound.data()[flat] = bound;  // until put_stat_bound says otherwise
        note_self_error(self_error, bound);
    }
    void put_weight_bound(Index flat, double bound, Wide self_error) {
        out_.weights_bound.data()[flat] = bound;
        if (stat_) out_.weights_stat_bound.data()[flat] = bound;
        note_self_error(self_error, bound);
    }
    // Section 10: the statistical bound, never above the rigorous one (which always holds); the oracle's own error
    // is far below both (section 7 widens the statistical bound's arguments as the rigorous one's).
    static void put_stat_bound(Tensor<double>& stat, Index flat, double bound) {
        stat.data()[flat] = std::min(stat.data()[flat], bound);
    }
    // self_error in Wide: rounded to double, an error far below 2^-1074 would become 2^-1074.
    void note_self_error(Wide self_error, double bound) {
        if (self_error == 0) return;
        // An upper value of self_error / bound: in double (no x87 division) the quotient of upper values, rounded
        // up, where self_error is a normal double; in Wide below (rounded to double, an error far below 2^-1074
        // would become 2^-1074).
        double ratio;
        if (self_error >= 0x1p-1000L) {
            const double q = bound > 0 ? round_up(self_error) / bound : std::numeric_limits<double>::infinity();
            ratio = q < std::numeric_limits<double>::infinity() ? next_up(q) : q;  // next_up(inf) is a NaN
        } else {
            ratio = round_up(bound > 0 ? self_error / bound : std::numeric_limits<Wide>::infinity());
        }
        row_ratio_ = std::max(row_ratio_, ratio);
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
        // Whether a flushing kernel may read some key as 0 at all: most batch elements hold no subnormal key, and
        // then only the query row's own elements can be flushed.
        const auto has_flushable = [](const std::vector<double>& x) {
            return std::any_of(x.begin(), x.end(), [](double e) { return flushable<C>(e) > 0; });
        };
        k_flushable_ = model_.inputs_flushed && has_flushable(kd_);
        // sum_d |k_jd| per key, once per batch element: in double where every input is within [2^-450, 2^450] or 0
        // (the double-double path), else in Wide.
        abs_k_.assign(static_cast<std::size_t>(Tk), 0);
        k_in_range_ = std::all_of(kd_.begin(), kd_.end(), in_safe_range);
        const bool double_sums = std::is_same_v<C, float> || k_in_range_;
        for (Index j = 0; j < Tk; ++j) {
            const double* kj = kd_.data() + j * Dk;
            if (double_sums) {
                double a = 0;
                for (Index d = 0; d < Dk; ++d) a += std::fabs(kj[d]);
                abs_k_[static_cast<std::size_t>(j)] = a;
            } else {
                Wide a = 0;
                for (Index d = 0; d < Dk; ++d) a += std::fabs(kj[d]);
                abs_k_[static_cast<std::size_t>(j)] = a;
            }
        }
        kT_.resize(static_cast<std::size_t>(Tk * Dk));
        for (Index j = 0; j < Tk; ++j)
            for (Index d = 0; d < Dk; ++d) kT_[static_cast<std::size_t>(d * Tk + j)] = kd_[static_cast<std::size_t>(j * Dk + d)];
        if (stat_) {
            key_structured_.assign(static_cast<std::size_t>(Tk), 0);
            for (Index j = 0; j < Tk; ++j)
                key_structured_[static_cast<std::size_t>(j)] = many_near_equal(kd_.data() + j * Dk, Dk);
        }
        // Whether each key's k and v rows are finite, once per batch element (every row of b reads them).
        key_finite_.assign(static_cast<std::size_t>(Tk), 1);
        for (Index j = 0; j < Tk; ++j) {
            const auto finite = [](const double* x, Index m) { return std::all_of(x, x + m, [](double e) { return std::isfinite(e); }); };
            key_finite_[static_cast<std::size_t>(j)] = finite(kd_.data() + j * Dk, Dk) && finite(vd_.data() + j * Dv, Dv);
        }
    }

    void run_batch(Index b) {
        const Readability& r = readable_[static_cast<std::size_t>(b)];
        gather(b, r);
        // The double-double kernels need every product in range; otherwise this batch element goes the plain way.
        bool fast = fast_;
        if (fast && std::is_same_v<C, double>) {
            fast = std::all_of(qd_.begin(), qd_.end(), in_safe_range) &&
                   k_in_range_ &&
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

    bool row_is_finite(Index b, Index i, const std::vector<Index>& keys) const {
        const Index Dk = p_.Dk;
        for (Index d = 0; d < Dk; ++d)
            if (!std::isfinite(qd_[i * Dk + d])) return false;
        if (p_.bias)  // the keys' bias is not -inf (they are allowed): NaN and +inf propagate
            for (Index j : keys)
                if (!std::isfinite(p_.explicit_bias(b, i, j))) return false;
        return std::all_of(keys.begin(), keys.end(), [&](Index j) { return key_finite_[static_cast<std::size_t>(j)] != 0; });
    }

    // Section 2 and, for the oracle itself, section 5: the row's logits and what their bounds need.
    struct RowLogits {
        std::vector<Real> s;             // (n) s_j = scale * q_i . k_j from the exact inputs (the MPFR path)
        std::vector<DoubleDouble> s_dd;  // (n) the same in double-double (the double-double path)
        std::vector<Wide> abs_dot;       // (n) sum_d |q_d k_jd| (Wide: 1e400 for q = k = 1e200, section 7)
        std::vector<Wide> abs_sum;       // (n) sum_d (|q_d| + |k_jd|), for the underflow terms
        std::vector<double> logit_self;  // (n) the oracle's own error of s_j
        std::vector<Wide> flushed;       // (n) sum_d (e_qd |k_jd| + |q_d| e_kjd + e_qd e_kjd), e = |x| for subnormal
                                         // inputs a kernel may read as 0 (ErrorModel::inputs_flushed), else 0
        // With SdpaProblem::softcap (section 2b): s, s_dd and logit_self are of the capped logits c tanh(s_j / c);
        // raw_lo <= |s_j| <= raw_up bound the logits before the cap (empty without one). raw_in_range: false when
        // a logit before the cap leaves the double-double path's [-2^1000, 2^1000] (the row is then done in MPFR).
        std::vector<double> raw_lo, raw_up;
        bool raw_in_range = true;
        // With SdpaProblem::bias or ALiBi (section 2c): s, s_dd and logit_self are of the biased logits; pre_up
        // bounds the logit before the bias, |x_j| (capped with a cap), bias_abs |b_j| and alibi_abs |m d_j| (both
        // 0 without them); all three empty without a bias.
        std::vector<double> pre_up, bias_abs, alibi_abs;
    };

    // Section 2c: the explicit bias b_j (exactly as the kernel's input holds it, widened exactly to double) and
    // ALiBi's -m |i + Tk - Tq - j| (exact, by two_prod) added to the (capped) logit: in double-double (each sum within
    // kDdOp of itself and 2^-1070) or MPFR (within u_mp; the product exact at 106 bits). The first of two sums is
    // at most |t_j| + |m d_j|.
    void add_bias(RowLogits& L, Index b, Index i, const std::vector<Index>& keys, bool fast) const {
        const std::size_t n = keys.size();
        L.pre_up.resize(n);
        L.bias_abs.assign(n, 0.0);
        L.alibi_abs.assign(n, 0.0);
        const double slope = p_.alibi ? static_cast<double>(p_.alibi_slope(b)) : 0.0;
        for (std::size_t c = 0; c < n; ++c) {
            const double bias = p_.bias ? static_cast<double>(p_.explicit_bias(b, i, keys[c])) : 0.0;
            const double distance = static_cast<double>(p_.alibi_distance(i, keys[c]));  // exact below 2^53
            double a_hi = 0, a_lo = 0;
            if (p_.alibi) two_prod(-slope, distance, a_hi, a_lo);  // -m d = a_hi + a_lo (2^-1070 if a_lo underflows)
            const double x_hi = fast ? L.s_dd[c].hi : static_cast<double>(L.s[c]);
            L.pre_up[c] = round_up(std::fabs(static_cast<Wide>(x_hi)) * (1 + 0x1p-52L) + L.logit_self[c]);
            L.bias_abs[c] = std::fabs(bias);
            L.alibi_abs[c] = round_up(std::fabs(static_cast<Wide>(a_hi)) * (1 + 0x1p-52L));
            const Wide sums = p_.bias && p_.alibi ? 2 : 1, first_extra = p_.bias && p_.alibi ? L.alibi_abs[c] : 0.0;
            if (fast) {
                if (p_.bias) L.s_dd[c] = dd_add(L.s_dd[c], {bias, 0.0});
                if (p_.alibi) L.s_dd[c] = dd_add(L.s_dd[c], {a_hi, a_lo});
                L.logit_self[c] = round_up(L.logit_self[c] +
                                           kDdOp * (sums * std::fabs(static_cast<Wide>(L.s_dd[c].hi)) + first_extra) *
                                               (1 + 0x1p-50L) +
                                           (sums + 1) * 0x1p-1070L);
            } else {
                if (p_.bias) L.s[c] += Real(bias);
                if (p_.alibi) L.s[c] += Real(-slope) * Real(distance);
                L.logit_self[c] = biased_self_error(L.logit_self[c], std::fabs(static_cast<double>(L.s[c])),
                                                    bool(p_.bias), bool(p_.alibi), L.alibi_abs[c], u_mp_);
            }
        }
    }

    // Section 2b: the capped logits c tanh(s_j / c) in place of s_j, and the oracle's own error of them: that of the
    // quotient y_j = s_j / c (s_j's own and the division's, u_mp or kDdOp relative) times tanh's largest slope where
    // y_j may lie (sech2_up), plus the rest of the cap's operations (MPFR: tanh and the product, each within u_mp;
    // double-double: tanh as (1 - e) / (1 + e) with e = exp(-2 |y|) within kDdExp and 2^-1073, three operations
    // within kDdOp, and the product).
    void cap_logits(RowLogits& L, bool fast) const {
        const double c = p_.softcap;
        const std::size_t n = L.logit_self.size();
        L.raw_lo.resize(n);
        L.raw_up.resize(n);
        const Real cap_mp(c);
        if (fast && !std::all_of(L.s_dd.begin(), L.s_dd.end(), [](const DoubleDouble& x) { return std::fabs(x.hi) <= 0x1p1000; })) {
            L.raw_in_range = false;  // false for NaN too
            return;
        }
        for (std::size_t j = 0; j < n; ++j) {
            const double s_hi = fast ? L.s_dd[j].hi : static_cast<double>(L.s[j]);
            L.raw_up[j] = round_up(std::fabs(static_cast<Wide>(s_hi)) * (1 + 0x1p-52L) + L.logit_self[j]);
            L.raw_lo[j] = std::max(0.0, std::fabs(s_hi) * (1 - 0x1p-52) - L.logit_self[j]);
            if (fast) {
                const DoubleDouble y = dd_div(L.s_dd[j], {c, 0.0});
                const bool negative = y.hi < 0;
                const DoubleDouble ay = negative ? dd_neg(y) : y;
                // Beyond |y| = 40, tanh is 1 within 2 e^-80 < kDdOp (and exp(-2 |y|) is never evaluated at -inf).
                const DoubleDouble e = ay.hi > 40 ? DoubleDouble{} : dd_exp_nonpositive({-2 * ay.hi, -2 * ay.lo});
                const DoubleDouble t =
                    ay.hi > 40 ? DoubleDouble{1.0, 0.0} : dd_div(dd_add({1.0, 0.0}, dd_neg(e)), dd_add({1.0, 0.0}, e));
                L.s_dd[j] = dd_mul({c, 0.0}, negative ? dd_neg(t) : t);
                L.logit_self[j] = capped_self_error(L.logit_self[j], L.raw_lo[j], L.raw_up[j], c, kDdOp,
                                                    c * (2 * static_cast<Wide>(kDdExp) + 8 * kDdOp + 0x1p-1070L));
            } else {
                L.s[j] = cap_mp * tanh(L.s[j] / cap_mp);
                L.logit_self[j] = capped_self_error(L.logit_self[j], L.raw_lo[j], L.raw_up[j], c, u_mp_,
                                                    4 * u_mp_ * static_cast<Wide>(c));
            }
        }
    }

    // Sections 2, 2b, 2c and 11: the implementation's error a_j of logit c of the row, and an upper bound of |s_j| (the
    // capped and biased logit's with a cap and a bias), from the section-2 rounding constants lr.
    double implementation_logit(const LogitRounding& lr, const RowLogits& L, std::size_t c, bool fast,
                                double& abs_s) const {
        const double s_c = fast ? L.s_dd[c].hi : static_cast<double>(L.s[c]);
        abs_s = std::fabs(s_c) * (1 + 0x1p-52) + L.logit_self[c];
        const double a = logit_bound(lr, L.flushed[c], L.abs_dot[c], L.abs_sum[c]);
        if (L.raw_up.empty() && L.pre_up.empty()) return storage_logit(a, abs_s);
        // d: the error of the logit before the bias, the scale's roundings charged per key (sections 2b, 2c). The
        // kernel may round its logit to storage before the cap or the bias, after them, or both (section 11): all
        // charged.
        double d;
        if (!L.raw_up.empty()) {
            const CapRounding cr = cap_rounding(p_.softcap, model_, u_, u_storage_, std::numeric_limits<C>::min());
            d = capped_logit_bound(cr, storage_logit(a, L.raw_up[c]), L.raw_lo[c], L.raw_up[c]);
        } else {
            d = per_key_scale_bound(storage_logit(a, L.pre_up[c]), L.pre_up[c], scale_gamma(model_, u_, u_storage_));
        }
        if (L.pre_up.empty()) return storage_logit(d, abs_s);
        const double d_pre = storage_logit(d, L.pre_up[c]);
        constexpr double eta = std::numeric_limits<C>::min();
        return storage_logit(additive_logit_bound(d_pre, L.pre_up[c], abs_s, bool(p_.bias), L.bias_abs[c],
                                                  bool(p_.alibi), L.alibi_abs[c], u_, eta),
                             abs_s);
    }

    // The bound's parameters for one row (sections 3-4): the implementation's and the oracle's own.
    struct RowBound {
        RowRounding impl, self;
        Normalisation nz[4];  // impl direct, impl pivot, self direct, self pivot
        Underflow under;
        std::vector<double> p_up;  // p_j rounded up past the oracle's own error (section 7)
        std::vector<Wide> self_w;  // the oracle's own error of p_j (weight_self_error)
        std::vector<double> logit_error;  // the implementation's error of each logit, the scale's roundings included
        // The normalisation the row's outputs use, the implementation's (0 direct, 1 pivot) and the oracle's own (2, 3):
        // the one with the smaller Delta (both are rigorous; the weights take the smaller bound per key).
        int impl_choice = 0, self_choice = 2;
        bool fast = false;         // the double-double path (else all-MPFR)
        // Section 10: the statistical bound's normalisations (direct, pivot) and choice; stat false on a structured
        // row (or without OracleOptions::statistical), whose statistical bound stays the rigorous one.
        bool stat = false;
        RowRounding stat_impl;
        Normalisation nz_stat[2];
        int stat_choice = 0;
        double m_S = 0, m_O = 0;  // the row statistic's roundings in the sum and in each weighted sum (section 10)
        Wide stag_S_rigorous = 0;  // the sum's stagnation charge under the row's own normalisation (the row statistic)
    };

    // Section 10, stagnation: a lower value of key c's computed term in the sums, per unit of W, when its
    // normalisation gives it p_j B_j (p_j (1 - B_j), less the partial sums' gamma, which the caller's gamma bounds).
    static Wide term_lower(double p_hi, double pB, double gamma) {
        return std::max(Wide(0), (static_cast<Wide>(p_hi) * (1 - 0x1p-40L) - pB) * (1 - 2 * static_cast<Wide>(gamma)));
    }
    // The sum of the exps' stagnation charge (StagnationRule) under normalisation z, per unit of W: terms p_j + p_j B_j.
    static Wide sum_stagnation(const Normalisation& z, const ExactSoftmax<Real>& sm, double gamma_S) {
        Wide total = 0;
        for (double w : z.w) total += w;
        const StagnationRule rule(total * (1 + 0x1p-50L), static_cast<double>(z.w.size()), gamma_S, u_);
        Wide charge = 0;
        for (std::size_t c = 0; c < z.w.size(); ++c) charge += rule.charge(z.w[c], term_lower(sm.p_hi[c], z.pB[c], gamma_S));
        return charge * rule.factor;
    }
    // The weighted sum's over column col (values v_jc at row_at(c)[col]): terms (p_j + p_j B_j) |v_jc|, whose sum
    // of magnitudes is at most `total` (OutputSums::absterm).
    template <class RowAt>
    static Wide weighted_stagnation(const Normalisation& z, const ExactSoftmax<Real>& sm, double gamma_O, Wide total,
                                    std::size_t n, std::size_t col, RowAt row_at) {
        const StagnationRule rule(total * (1 + 0x1p-50L), static_cast<double>(n), gamma_O, u_);
        Wide charge = 0;
        for (std::size_t c = 0; c < n; ++c) {
            const Wide av = std::fabs(static_cast<Wide>(row_at(c)[col]));
            charge += rule.charge(z.w[c] * av, term_lower(sm.p_hi[c], z.pB[c], gamma_O) * av);
        }
        return charge * rule.factor;
    }

    // Section 10: whether more than sqrt(m) of the m values x share one magnitude to within a relative 2 m u (T's
    // u): their products or terms would enter a sum as near-equal terms, whose roundings are correlated.
    static bool many_near_equal(const double* x, Index m) {
        if (m < 4) return false;
        std::vector<double> a(x, x + m);
        for (double& e : a) e = std::fabs(e);
        return many_within(a, [&](double lo, double hi) { return hi - lo <= 2 * static_cast<double>(m) * u_ * hi; },
                           std::sqrt(static_cast<double>(m)));
    }
    // Whether more than `limit` of the values lie in one window [lo, hi] for which close(lo, hi) holds (sorts a).
    template <class Close>
    static bool many_within(std::vector<double>& a, Close close, double limit) {
        std::sort(a.begin(), a.end());
        std::size_t lo = 0;
        for (std::size_t hi = 0; hi < a.size(); ++hi) {
            while (lo < hi && !close(a[lo], a[hi])) ++lo;  // lo < hi: close(inf, inf) is false
            if (static_cast<double>(hi - lo + 1) > limit) return true;
        }
        return false;
    }
    // Section 10: a row is structured when its query, or one of its keys, has many near-equal entries (the dot
    // products' terms), or more than sqrt(n) of its n logits lie within 2 n u of one another (the sums' terms).
    bool row_is_structured(Index i, const std::vector<Index>& keys, const ExactSoftmax<Real>& sm) const {
        if (many_near_equal(qd_.data() + i * p_.Dk, p_.Dk)) return true;
        for (Index j : keys)
            if (key_structured_[static_cast<std::size_t>(j)]) return true;
        const double n = static_cast<double>(keys.size());
        if (n < 4) return false;
        std::vector<double> sigma(sm.sigma.begin(), sm.sigma.end());
        return many_within(sigma, [&](double lo, double hi) { return hi - lo <= 2 * n * u_; }, std::sqrt(n));
    }

    // One query row i of batch element b over its allowed keys (n of them, n >= 1). On the double-double path a
    // row whose logits leave [-2^1000, 2^1000], or one of whose results lies too close to a rounding boundary of T
    // to be rounded with certainty from its enclosure (Ziv's strategy), is done again in MPFR (section 5).
    void run_row(Index b, Index i, const std::vector<Index>& keys, bool fast) {
        row_ratio_ = 0;
        if (stat_) out_.row_stat_sigma.data()[b * p_.Tq + i] = 0;  // until output_row says otherwise (a redone row too)
        if (!row_is_finite(b, i, keys)) {
            fill_row(b, i, std::numeric_limits<double>::quiet_NaN());  // NaN/Inf inputs propagate (check_finite off)
            return;
        }
        const RowLogits L = logits(b, i, keys, fast);                   // section 2 (and 5)
        ExactSoftmax<Real> sm;
        if (fast) {
            const auto in_range = [](const DoubleDouble& s) { return std::fabs(s.hi) <= 0x1p1000; };  // false for NaN
            if (!L.raw_in_range || !std::all_of(L.s_dd.begin(), L.s_dd.end(), in_range)) return redo_in_mpfr(b, i, keys);
            exact_softmax_dd(L.s_dd, exps_, sm);                      // section 5
        } else {
            exact_softmax(L.s, sm);                                   // sections 0 and 5
        }
        const bool structured = stat_ && row_is_structured(i, keys, sm);  // section 10
        const RowBound rb = row_bound(L, sm, fast, stat_ && !structured);  // sections 2-4 (and 10)
        if (out_.logits_bound.data() != nullptr)
            for (std::size_t c = 0; c < keys.size(); ++c)
                out_.logits_bound.data()[(b * p_.Tq + i) * p_.Tk + keys[c]] = rb.logit_error[c];
        bool certain = row_weights(b, i, keys, sm, rb);              // section 4, weights
        certain = output_row(b, i, keys, sm, rb, fast) && certain;  // sections 3-4, 7
        // The double-double path's own error is at most 2^-89 relative per step, MPFR's 2^-113: where that is not
        // far enough below the bound (huge logits, whose error kDdOp |s| enters the exponents), MPFR decides.
        if (fast && (!certain || row_ratio_ > kDdSelfRatioLimit)) return redo_in_mpfr(b, i, keys);
        out_.oracle_error_ratio = std::max(out_.oracle_error_ratio, row_ratio_);
        if (structured) ++out_.structured_rows;
    }
    static constexpr double kDdSelfRatioLimit = max_oracle_error_ratio / 100;
    void redo_in_mpfr(Index b, Index i, const std::vector<Index>& keys) {
        ++out_.rows_redone_in_mpfr;
        run_row(b, i, keys, false);
    }

    // Whether RN_T of every value within radius of hi + lo is the same T (sign of zero included), so that it is
    // RN_T of the exact value and of the all-MPFR path's, whose own error is far below 2^-96 of it (section 5).
    // nonnegative: the exact value is known to be >= 0 (a weight), so the enclosure starts at 0 at the lowest.
    static bool rounding_is_certain(double hi, double lo, Wide radius, bool nonnegative = false) {
        if (radius == 0) return true;
        // Widened for the rounding of lo -+ r, which is at most 2^-53 (r + |lo|), |lo| <= 2^-53 |hi|.
        const double r = round_up(radius * (1 + 0x1p-50L) + 0x1p-104L * std::fabs(hi));
        // Usually the enclosure lies far inside the rounding interval of t = RN_T(hi): within a quarter of t's ulp
        // (the interval reaches at least half of the smaller ulp on either side, and the ulp below is at least
        // half the ulp above). hi - t is exact (Sterbenz) and the sum's rounding is far inside the margin.
        const T t = static_cast<T>(hi);
        if (std::isnormal(t) && std::fabs(t) > std::numeric_limits<T>::min()) {
            // 2^(exponent of t - digits - 1), from the bits of t widened to double (exact)
            const auto e = static_cast<int>((std::bit_cast<std::uint64_t>(static_cast<double>(t)) >> 52) & 0x7ff) - 1023 -
                           std::numeric_limits<T>::digits - 1;
            const double quarter_ulp = e >= -1022 ? std::bit_cast<double>(static_cast<std::uint64_t>(e + 1023) << 52) : 0.0;
            if (std::fabs(hi - static_cast<double>(t)) + std::fabs(lo) + r < quarter_ulp * (1 - 0x1p-40)) return true;
        }
        double h1, l1, h2, l2;
        two_sum(hi, lo - r, h1, l1);
        two_sum(hi, lo + r, h2, l2);
        if (nonnegative && (h1 < 0 || (h1 == 0 && l1 <= 0))) h1 = 0, l1 = 0;
        const T a = round_to<T>(h1, l1), c = round_to<T>(h2, l2);
        return a == c && std::signbit(a) == std::signbit(c);
    }

    // Logits of row i from the exact inputs, with the oracle's own error (section 5): Dot2 on the fast path
    // (Ogita, Rump, Oishi 2005, Prop. 5.5, doubled, plus the product by the scale in double-double and its
    // underflow), MPFR otherwise.
    RowLogits logits(Index b, Index i, const std::vector<Index>& keys, bool fast) const {
        const Index Dk = p_.Dk;
        const std::size_t n = keys.size();
        const double abs_scale = std::fabs(p_.scale);
        const double* qi = qd_.data() + i * Dk;
        RowLogits L;
        if (fast)
            L.s_dd.resize(n);
        else
            L.s.resize(n);
        L.abs_dot.resize(n);
        L.abs_sum.resize(n);
        L.logit_self.resize(n);
        L.flushed.assign(n, 0.0);
        Wide abs_q = 0;
        bool q_flushable = false;  // the row's query holds a subnormal a flushing kernel may read as 0
        for (Index d = 0; d < Dk; ++d) {
            abs_q += std::fabs(qi[d]);
            q_flushable = q_flushable || (model_.inputs_flushed && flushable<C>(qi[d]) > 0);
        }
        const Real scale_mp(p_.scale);  // the MPFR path's
        if (fast) {  // every key of the batch element at once, in SIMD lanes; then the row's
            const std::size_t Tk = static_cast<std::size_t>(p_.Tk);
            all_hi_.resize(Tk);
            all_lo_.resize(Tk);
            all_abs_.resize(Tk);
            dot2_keys_simd(qi, kT_.data(), static_cast<std::size_t>(Dk), Tk, std::is_same_v<C, float>, all_hi_.data(),
                           all_lo_.data(), all_abs_.data());
        }
        for (std::size_t c = 0; c < n; ++c) {
            const double* kj = kd_.data() + keys[c] * Dk;
            const Wide abs_k = abs_k_[static_cast<std::size_t>(keys[c])];
            L.abs_sum[c] = abs_q + abs_k;
            if (q_flushable || k_flushable_)
                for (Index d = 0; d < Dk; ++d) {
                    const Wide eq = flushable<C>(qi[d]), ek = flushable<C>(kj[d]);
                    L.flushed[c] += eq * std::fabs(kj[d]) + std::fabs(qi[d]) * ek + eq * ek;
                }
            if (fast) {
                const auto j = static_cast<std::size_t>(keys[c]);
                L.abs_dot[c] = all_abs_[j];
                L.s_dd[c] = dd_mul({p_.scale, 0.0}, {all_hi_[j], all_lo_[j]});
                const double g = gamma(static_cast<double>(Dk), 0x1p-53);
                L.logit_self[c] = round_up((2 * g * g + 2 * kDdOp) * abs_scale * L.abs_dot[c] + 0x1p-1070L);
            } else {
                Real acc(0);
                Wide a = 0;
                for (Index d = 0; d < Dk; ++d) {
                    acc += Real(qi[d]) * Real(kj[d]);
                    a += std::fabs(static_cast<Wide>(qi[d]) * kj[d]);
                }
                L.abs_dot[c] = a;
                L.s[c] = scale_mp * acc;
                L.logit_self[c] = round_up(gamma(2.0 * Dk + 2, u_mp_) * abs_scale * a);
            }
        }
        if (p_.softcap != 0) cap_logits(L, fast);
        if (p_.has_bias()) add_bias(L, b, i, keys, fast);  // section 2c
        return L;
    }

    // Sections 2-4: the implementation's logit errors a_j and exponent perturbations, both normalisations, the
    // underflow terms; and the same form for the oracle itself (u_mp, correctly rounded exp, no rescaling; section 5).
    // The oracle's self-bound is evaluated at its own values; the implementation's at upper values of the exact
    // p_j and sigma_j and lower ones of sigma_j and log W, widened by twice that self-bound (section 7).
    RowBound row_bound(const RowLogits& L, const ExactSoftmax<Real>& sm, bool fast, bool stat) const {
        const std::size_t n = L.logit_self.size();
        const double R = static_cast<double>(R_);
        const double nd = static_cast<double>(n);
        const UnderflowUnits& eta = fast ? eta_fast_ : eta_plain_;
        const LogitRounding lr = logit_rounding(p_.Dk, p_.scale, u_, eta);
        std::vector<double> a(n), logit_error(n);
        double A = 0, max_abs_logit = 0;  // max_j |s_j|, rounded up (the oracle's own logit error included)
        for (std::size_t c = 0; c < n; ++c) {
            double abs_s = 0;
            a[c] = implementation_logit(lr, L, c, fast, abs_s);
            A = std::max(A, a[c]);
            max_abs_logit = std::max(max_abs_logit, abs_s);
            // Without a cap or a bias the scale's roundings are the row's (section 3 takes them there); per logit
            // they are charged as section 2c does.
            logit_error[c] = L.raw_up.empty() && L.pre_up.empty()
                                 ? per_key_scale_bound(a[c], abs_s, scale_gamma(model_, u_, u_storage_))
                                 : a[c];
        }
        RowBound rb;
        rb.logit_error = std::move(logit_error);
        rb.fast = fast;
        rb.impl = implementation_rounding(model_, nd, R, u_, max_abs_logit, A, 0, u_storage_);
        // The oracle's softmax: double-double operations and exp (kDdOp, kDdExp) or MPFR (u_mp, correctly rounded);
        // its weighted sum: Dot2 over the 2n terms p_hi v_j, p_lo v_j, or Real; plus the division's rounding.
        const double g2n = gamma(2.0 * nd, 0x1p-53);
        rb.self = fast ? oracle_rounding(nd, kDdOp, 2 * g2n * g2n + 4 * 0x1p-106 + 2 * kDdOp, kDdExp)
                       : oracle_rounding(nd, u_mp_, gamma(nd, u_mp_) + 2 * u_mp_, u_mp_);
        // The oracle's own exponents: Theta_self_j = logit_self_j + u_mp (sigma_j + logit_self_j + A_self) (section 5).
        const double A_self = *std::max_element(L.logit_self.begin(), L.logit_self.end());
        std::vector<double> theta_self(n);
        for (std::size_t c = 0; c < n; ++c) theta_self[c] = exponent_perturbation_rest(L.logit_self[c], A_self, rb.self);
        rb.nz[2] = normalise(rb.self, theta_self, sm.p_hi, sm.sigma, sm.sigma, sm.log_W, sm.pivot, false);
        rb.nz[3] = normalise(rb.self, theta_self, sm.p_hi, sm.sigma, sm.sigma, sm.log_W, sm.pivot, true);
        // Section 7: the exact sigma_j is within 2 A_self of the oracle's (each logit and their max within A_self)
        // and 2^-53 relative of its rounding to double; W within e^{+-2 A_self}; p_j within its self-bound, doubled.
        std::vector<double> sigma_up(n), sigma_lo(n);
        rb.p_up.resize(n);
        rb.self_w.resize(n);
        const double log_W_lo = sm.log_W * (1 - 0x1p-51) - 2 * A_self;
        for (std::size_t c = 0; c < n; ++c) {
            sigma_up[c] = sm.sigma[c] * (1 + 0x1p-52) + 2 * A_self;
            sigma_lo[c] = std::max(0.0, sm.sigma[c] * (1 - 0x1p-52) - 2 * A_self);
            rb.self_w[c] = weight_self_error(rb, c, sm.p_hi[c]);
            rb.p_up[c] = std::min(1.0, round_up(sm.p_hi[c] * (1 + 0x1p-52L) + 2 * rb.self_w[c]));
        }
        std::vector<double> theta_rest(n);
        for (std::size_t c = 0; c < n; ++c) theta_rest[c] = exponent_perturbation_rest(a[c], A, rb.impl);
        std::vector<double> theta_D_rest;  // split-KV: k_D a_j, the per-key part of the combine's mismatch
        if (rb.impl.split)
            for (std::size_t c = 0; c < n; ++c) theta_D_rest.push_back(rb.impl.k_D * a[c]);
        rb.nz[0] = normalise(rb.impl, theta_rest, rb.p_up, sigma_up, sigma_lo, log_W_lo, sm.pivot, false, theta_D_rest);
        rb.nz[1] = normalise(rb.impl, theta_rest, rb.p_up, sigma_up, sigma_lo, log_W_lo, sm.pivot, true, theta_D_rest);
        rb.under = underflow_terms(rb.impl, nd, R, u_, eta, model_.probabilities_in_storage ? tau_storage_ : 0.0);
        const auto better = [&](int pivot, int direct) {
            return rb.nz[pivot].bounded && (!rb.nz[direct].bounded || rb.nz[pivot].delta < rb.nz[direct].delta) ? pivot
                                                                                                           : direct;
        };
        rb.impl_choice = better(1, 0);
        rb.self_choice = better(3, 2);
        if (stat) {
            // Section 10: the same with the probabilistic gammas of the logits' dot products and the sums over keys,
            // at the lambda whose union over the element's n (Dk + 2) chains and the call's elements gives half of
            // statistical_false_alarm.
            rb.stat = true;
            const double lambda = statistical_lambda(nd, static_cast<double>(p_.Dk), u_,
                                                     static_cast<double>(out_.output.numel() + out_.weights.numel()));
            const LogitRounding ls = logit_rounding(p_.Dk, p_.scale, u_, eta, lambda);
            double A_s = 0;
            std::vector<double> a_s(n);
            for (std::size_t c = 0; c < n; ++c) {
                double abs_s = 0;
                a_s[c] = implementation_logit(ls, L, c, fast, abs_s);
                A_s = std::max(A_s, a_s[c]);
            }
            rb.stat_impl = implementation_rounding(model_, nd, R, u_, max_abs_logit, A_s, lambda, u_storage_);
            for (std::size_t c = 0; c < n; ++c) theta_rest[c] = exponent_perturbation_rest(a_s[c], A_s, rb.stat_impl);
            theta_D_rest.clear();
            if (rb.stat_impl.split)
                for (std::size_t c = 0; c < n; ++c) theta_D_rest.push_back(rb.stat_impl.k_D * a_s[c]);
            rb.nz_stat[0] =
                normalise(rb.stat_impl, theta_rest, rb.p_up, sigma_up, sigma_lo, log_W_lo, sm.pivot, false, theta_D_rest);
            rb.nz_stat[1] =
                normalise(rb.stat_impl, theta_rest, rb.p_up, sigma_up, sigma_lo, log_W_lo, sm.pivot, true, theta_D_rest);
            // Section 10, stagnation: the sum of the exps' additions whose smaller operand is too small for its
            // rounding to be mean-independent, charged at their worst; then Delta again with that charge.
            for (Normalisation& z : rb.nz_stat) {
                z.stag_S = sum_stagnation(z, sm, rb.impl.gamma_S);
                finish(z, rb.stat_impl);
            }
            rb.stag_S_rigorous = sum_stagnation(rb.nz[rb.impl_choice], sm, rb.impl.gamma_S);
            const Normalisation* z = rb.nz_stat;
            rb.stat_choice = z[1].bounded && (!z[0].bounded || z[1].delta < z[0].delta) ? 1 : 0;
            // Every rounding of the sums, in any order and blocking: n - 1 additions (2n - 2 with split-KV's
            // combine), R rescalings; the weighted sum also its n products (counted as one: their increments are at
            // most u |term_j|, whose squares sum to at most the sum of |terms| squared), as many divisions of the
            // weights when normalising first (one more), the division or reciprocal and product, and split-KV's n
            // combine products and n - 1 additions.
            const double recip = model_.reciprocal_normalisation ? 1 : 0;
            rb.m_S = (model_.split_kv ? 2 * nd - 2 : nd - 1) + R;
            rb.m_O = (model_.split_kv ? 2 * nd + 1 : nd + 1) + 1 + recip + R;  // + a division per weight
        }
        return rb;
    }

    // The oracle's own error of p_j (section 5, from the self normalisations), plus storing it: p_hi + p_lo on the
    // double-double path (2^-105 relative, 2^-1070 below double's range), from Real beyond double-double otherwise.
    Wide weight_self_error(const RowBound& rb, std::size_t c, double p) const {
        const Normalisation* nz = rb.nz;
        const Wide rel = std::min(nz[2].weight_rel(c, p, rb.self.u_div), nz[3].weight_rel(c, p, rb.self.u_div));
        return rel + (rb.fast ? 0x1p-105L * p + 0x1p-1070L : 0x1p-120L * p);
    }

    // Section 4, weights: p_j = p_hi + p_lo; blocked and unreadable keys keep weight 0 with bound 0 (the result
    // tensors start zero-filled). The implementation's bound at p_up (section 7). false: a weight of the
    // double-double path could not be rounded with certainty.
    bool row_weights(Index b, Index i, const std::vector<Index>& keys, const ExactSoftmax<Real>& sm,
                     const RowBound& rb) {
        const Normalisation* nz = rb.nz;
        bool certain = true;
        for (std::size_t c = 0; c < keys.size(); ++c) {
            const double p = rb.p_up[c];
            const double rel_impl = std::min(nz[0].weight_rel(c, p, rb.impl.u_div), nz[1].weight_rel(c, p, rb.impl.u_div));
            // In double on the double-double path, whose units (at least 2^-150 there) and weights are far inside
            // double's range, as output_row does (its few roundings are within kBoundInflation); else in Wide.
            const double bound = rb.fast ? mul_up(rb.under.template weight<double>(rel_impl, p, u_), kBoundInflation)
                                         : round_up(rb.under.weight(rel_impl, p, u_) * kBoundInflation);
            const Wide self_error = rb.self_w[c];
            const Index flat = (b * p_.Tq + i) * p_.Tk + keys[c];
            if (rb.fast) {
                put_weight(flat, sm.p_hi[c], sm.p_lo[c], bound, self_error);
                certain = certain && rounding_is_certain(sm.p_hi[c], sm.p_lo[c], 2 * self_error + 0x1p-96L * sm.p_hi[c], true);
            } else {
                put_weight(flat, sm.p[c], bound, self_error);
            }
            if (rb.stat) {
                const Normalisation* z = rb.nz_stat;
                const Wide rel_stat = std::min(z[0].weight_rel(c, p, rb.stat_impl.u_div), z[1].weight_rel(c, p, rb.stat_impl.u_div));
                put_stat_bound(out_.weights_stat_bound, flat,
                               storage_rounding(round_up(rb.under.weight(rel_stat, p, u_) * kBoundInflation), p));
            }
        }
        return certain;
    }

    // Section 10, ErrorModel::sequential_sums: the row statistic's variance proxy (per u^2) from the exact partial
    // sums in key order. The k-th addition's increment is at most u |t_k|, t_k the computed partial sum, which is
    // within |P_k| + sum_{i<=k} p_i B_i |v_i| + gamma (sum_{i<=k} (p_i + p_i B_i) |v_i|) of 0 (P_k = sum_{i<=k} p_i v_i,
    // summed here in double with its own error, k 2^-52 of the same sum of |terms|, added); each product and
    // each division of a weight at most u |term_j|; the final division (and reciprocal) and every rescaling at most
    // u full_O. The sum of the exps likewise with v = 1, times |o| <= o_up. full_O, full_S: the sums of |terms|,
    // gamma included (t_O and t_S / o_up of the order-free proxy).
    Wide sequential_variance(const std::vector<Index>& keys, std::size_t col, const RowBound& rb,
                             const Normalisation& ni, Wide full_O, Wide full_S, Wide o_up) const {
        const std::size_t n = keys.size();
        const Wide g = static_cast<Wide>(std::max(ni.gamma_O, ni.gamma_S));
        Wide var_O = 0, var_S = 0, P_O = 0, abs_O = 0, pB_O = 0, P_S = 0, pB_S = 0;
        for (std::size_t c = 0; c < n; ++c) {
            const Wide v = static_cast<Wide>(vd_[static_cast<std::size_t>(keys[c] * p_.Dv) + col]);
            const Wide p = rb.p_up[c], pB = ni.pB[c];
            P_O += p * v;
            abs_O += p * std::fabs(v);
            pB_O += pB * std::fabs(v);
            P_S += p;
            pB_S += pB;
            const Wide term = (p + pB) * std::fabs(v);
            var_O += 2 * term * term;  // its product and, normalising first, its division
            var_S += (p + pB) * (p + pB);  // normalising first: the division of each weight
            if (c == 0) continue;  // 0 + the first term is exact
            const Wide k = static_cast<Wide>(c + 1);
            const Wide t_O = std::fabs(P_O) + pB_O + (g + k * 0x1p-52L) * (abs_O + pB_O);
            const Wide t_S = P_S + pB_S + (g + k * 0x1p-52L) * (P_S + pB_S);
            var_O += t_O * t_O;
            var_S += t_S * t_S;
        }
        const Wide whole = 2 + static_cast<Wide>(R_);  // the division and a reciprocal, and the rescalings
        var_O += whole * full_O * full_O;
        var_S += static_cast<Wide>(R_) * full_S * full_S;
        return var_O + o_up * o_up * var_S;
    }

    // One key's terms of every column's sums (output_row) in Wide: accumulate_row_simd's operations (simd.hpp),
    // for values beyond double's comfortable range (section 7).
    static void accumulate_key(const double* v, const double* od, std::size_t Dv, double flush_below, Wide p, Wide pB,
                               Wide w, Wide pB_self, Wide* sc, Wide* av_sum, Wide* av_self, Wide* spread_self,
                               Wide* av_impl, Wide* spread, Wide* dv, Wide* absterm) {
        for (std::size_t col = 0; col < Dv; ++col) {
            const Wide av = std::fabs(static_cast<Wide>(v[col]));
            const Wide d = std::fabs(static_cast<Wide>(v[col]) - static_cast<Wide>(od[col]));
            const Wide ev = av < flush_below ? av : Wide(0);
            sc[col] += p * av;
            av_sum[col] += av;
            av_self[col] += pB_self * av;
            spread_self[col] += pB_self * d;
            av_impl[col] += ev;
            spread[col] += pB * (d + ev);
            dv[col] += w * ev;
            absterm[col] += w * (av + ev);
        }
    }

    // Sections 3-4 and 7, outputs o_c = sum_j p_j v_jc of every column of the row and their bounds (*) under the
    // row's normalisation; section 5 for the oracle's own error, which section 7 then adds to |v_j - o| and |o|.
    // One pass over the keys with a set of sums per column. false: an output of the double-double path could not be
    // rounded with certainty.
    bool output_row(Index b, Index i, const std::vector<Index>& keys, const ExactSoftmax<Real>& sm, const RowBound& rb,
                    bool fast) {
        const std::size_t Dv = static_cast<std::size_t>(p_.Dv);
        const std::size_t n = keys.size();
        const auto row_at = [&](std::size_t c) { return vd_.data() + keys[c] * p_.Dv; };
        // o_c = od_c + olo_c (the double-double path) or o_mp_c (all-MPFR), od_c = RN(o_c)
        std::vector<double>& od = col_hi_;
        std::vector<double>& olo = col_lo_;
        std::vector<Real> o_mp;
        if (fast) {
            // Per column: 2n terms p_hi v_jc exactly by TwoProduct and p_lo v_jc rounded, through Dot2 (section 5).
            row_ptrs_.resize(n);
            for (std::size_t c = 0; c < n; ++c) row_ptrs_[c] = row_at(c);
            od.resize(Dv);
            olo.resize(Dv);
            weighted_sums_dd_simd(sm.p_hi.data(), sm.p_lo.data(), row_ptrs_.data(), n, Dv, od.data(), olo.data());
        } else {
            o_mp.resize(Dv);
            od.resize(Dv);
            olo.resize(Dv);
            for (std::size_t col = 0; col < Dv; ++col) {
                o_mp[col] = weighted_sum(sm.p, [&](std::size_t c) { return Real(row_at(c)[col]); });
                split(o_mp[col], od[col], olo[col]);
            }
        }
        // The sums over keys, in A = double when every value is within [2^-450, 2^450] (or 0; nothing overflows
        // and what underflows is far below the bound), else in Wide (|v_j| near DBL_MAX, subnormal v_j; section 7).
        // The implementation's (*) under the row's normalisation (RowBound::impl_choice); the oracle's own under
        // its own (self_choice), with sum_j (p_j + p_j B_self_j) |v_j| = scale_c + sum_j p_j B_self_j |v_j|.
        const Normalisation& ni = rb.nz[rb.impl_choice];
        const Normalisation& ns = rb.nz[rb.self_choice];
        const bool flushing = model_.inputs_flushed;
        std::vector<ColumnSums>& cs = col_sums_;
        cs.resize(Dv);  // every column's sums are assigned below
        const Normalisation& nt = rb.nz_stat[rb.stat_choice];
        const auto accumulate = [&](auto zero) {
            using A = decltype(zero);
            // One array per sum, so that the loop over columns vectorises; 14 of Dv in one zeroed buffer (the
            // double-double path's is kept from row to row): 8 sums, and 6 the statistical pass does not use.
            std::vector<A> wide_buffer;
            A* base = nullptr;
            if constexpr (std::is_same_v<A, double>) {
                sums_.assign(14 * Dv, 0.0);
                base = sums_.data();
            } else {
                wide_buffer.assign(14 * Dv, A(0));
                base = wide_buffer.data();
            }
            A *sc = base, *av_sum = base + Dv, *av_impl = base + 2 * Dv, *av_self = base + 3 * Dv,
              *spread_self = base + 4 * Dv, *spread = base + 5 * Dv, *dv = base + 6 * Dv, *absterm = base + 7 * Dv;
            const double flush_below = flushing ? static_cast<double>(std::numeric_limits<C>::min()) : 0.0;
            if constexpr (std::is_same_v<A, double>) {
                row_ptrs_.resize(n);
                for (std::size_t c = 0; c < n; ++c) row_ptrs_[c] = row_at(c);
                accumulate_row_simd(row_ptrs_.data(), n, od.data(), Dv, flush_below, sm.p_hi.data(), ni.pB.data(),
                                    ni.w.data(), ns.pB.data(), sc, av_sum, av_self, spread_self, av_impl, spread, dv,
                                    absterm);
            } else {
                for (std::size_t c = 0; c < n; ++c)
                    accumulate_key(row_at(c), od.data(), Dv, flush_below, sm.p_hi[c], ni.pB[c], ni.w[c], ns.pB[c], sc,
                                   av_sum, av_self, spread_self, av_impl, spread, dv, absterm);
            }
            for (std::size_t col = 0; col < Dv; ++col)
                cs[col] = {sc[col], av_sum[col], static_cast<Wide>(av_sum[col]) + av_impl[col], av_self[col],
                           spread_self[col], {spread[col], dv[col], absterm[col]}, {}};
            if (!rb.stat) return;
            // The statistical normalisation's spread and absterm: the same pass with its p_j B_j and p_j + p_j B_j
            // (the other sums it recomputes are the same and unused).
            std::fill(spread, spread + Dv, A(0));
            std::fill(dv, dv + Dv, A(0));
            std::fill(absterm, absterm + Dv, A(0));
            A* x = base + 8 * Dv;
            if constexpr (std::is_same_v<A, double>) {
                accumulate_row_simd(row_ptrs_.data(), n, od.data(), Dv, flush_below, sm.p_hi.data(), nt.pB.data(),
                                    nt.w.data(), ns.pB.data(), x, x + Dv, x + 2 * Dv, x + 3 * Dv, x + 4 * Dv, spread,
                                    dv, absterm);
            } else {
                for (std::size_t c = 0; c < n; ++c)
                    accumulate_key(row_at(c), od.data(), Dv, flush_below, sm.p_hi[c], nt.pB[c], nt.w[c], ns.pB[c], x,
                                   x + Dv, x + 2 * Dv, x + 3 * Dv, x + 4 * Dv, spread, dv, absterm);
            }
            for (std::size_t col = 0; col < Dv; ++col) cs[col].stat = {spread[col], dv[col], absterm[col]};
        };
        if (fast)
            accumulate(0.0);
        else
            accumulate(Wide(0));
        if (rb.stat)  // section 10, stagnation: every column's weighted sum under the statistical normalisation
            for (std::size_t col = 0; col < Dv; ++col)
                cs[col].stat.stag = weighted_stagnation(nt, sm, rb.impl.gamma_O, static_cast<Wide>(cs[col].stat.absterm),
                                                        n, col, row_at);
        bool certain = true;
        const Wide nd = static_cast<Wide>(n);
        for (std::size_t col = 0; col < Dv; ++col) {
            const ColumnSums& c = cs[col];
            const Wide o_abs = std::fabs(static_cast<Wide>(od[col]));
            const OutputSums<Wide> self_sums{c.spread_self, 0, c.scale + c.abs_self};
            const Wide rel_self = ns.output_rel(self_sums, ns.o_rounding(od[col]), o_abs);
            // The oracle's own error of o: on the double-double path also the underflow of p_j below the normal
            // range (2^-1072 |v_j| each: its exp's, quotient's and parts') and of the double-double sums (4 * 2^-1074
            // per key, none when every v_jc is 0: then every term is an exact 0); on the all-MPFR path o is stored
            // beyond double-double.
            const Wide dd_under = c.abs_v > 0 ? 0x1p-1072L * (c.abs_v + nd) : Wide(0);
            const Wide self_error = rel_self + (fast ? dd_under + 0x1p-105L * o_abs : 0x1p-120L * o_abs);
            // Section 7: the exact o is within 2 self_error of od (doubled: the self-bound is itself evaluated at the
            // oracle's values), which each |v_j - o| and |o| gain.
            const Wide o_up = o_abs * (1 + 0x1p-52L) + 2 * self_error;
            const Wide o_round = ni.o_rounding(od[col]) + ni.sum_pB * 2 * self_error;
            // The implementation's (*) and underflow terms under a normalisation and its sums: in double on the
            // double-double path, whose values and units (at least 2^-150) are far inside double's range, from upper
            // values; else in Wide.
            const auto implementation_bound = [&](const Normalisation& nz, const OutputSums<Wide>& sums) -> double {
                const Wide rounding = nz.o_rounding(od[col]) + nz.sum_pB * 2 * self_error;
                if (fast) {
                    const double rel = nz.output_rel<double>(sums, round_up(rounding), round_up(o_up));
                    return rb.under.template output<double>(rel, round_up(c.abs_v_impl), round_up(o_up)) * kBoundInflation;
                }
                return round_up(rb.under.output(nz.output_rel(sums, rounding, o_up), c.abs_v_impl, o_up) * kBoundInflation);
            };
            const double bound = implementation_bound(ni, c.impl);
            const Index flat = (b * p_.Tq + i) * p_.Dv + static_cast<Index>(col);
            // Section 10: the same in the statistical normalisation.
            const double stat_bound = rb.stat ? implementation_bound(nt, c.stat) : bound;
            const Index row = b * p_.Tq + i;
            if (rb.stat && static_cast<Index>(col) == row % p_.Dv && ni.bounded && rb.under.ok) {
                // Section 10, the row statistic: the error is the deterministic part of (*) (everything but the
                // two sums' roundings, which keep their gammas only in Delta) plus M / S-hat, M the sums'
                // rounding errors, a martingale whose increments are at most u (1 + gamma) times the sum of |terms|
                // of its sum: m_O roundings in the weighted sum, m_S in the sum, each per unit of (1 - Delta).
                // Stagnating additions (StagnationRule) are deterministic: charged in full, in both sums.
                const Wide stag = weighted_stagnation(ni, sm, rb.impl.gamma_O, c.impl.absterm, n, col, row_at) +
                                  rb.stag_S_rigorous * o_up;
                const Wide t_O = (1 + static_cast<Wide>(ni.gamma_O)) * c.impl.absterm;
                const Wide t_S = (1 + static_cast<Wide>(ni.gamma_S)) * o_up * (1 + ni.sum_pB);
                // The weights rounded to storage (probabilities_in_storage): one rounding of each term of both sums,
                // charged in full (as the per-element statistical bound does): a row of equal weights rounds them
                // all alike, which no martingale describes.
                const Wide storage = model_.probabilities_in_storage ? u_storage_ * (t_O + t_S) : Wide(0);
                const Wide d_num =
                    c.impl.spread + c.impl.dv + o_round + (1 + ni.gamma_S) * o_up * ni.sum_pD + stag + storage;
                const Wide d_rel = d_num * ni.inv_one_minus_delta + ni.lse_factor * (o_up + bound);
                const double det = storage_rounding(
                    round_up(rb.under.output(d_rel, c.abs_v_impl, o_up) * kBoundInflation), static_cast<double>(o_up));
                const Wide var = model_.sequential_sums ? sequential_variance(keys, col, rb, ni, t_O, t_S / o_up, o_up)
                                                        : rb.m_O * t_O * t_O + rb.m_S * t_S * t_S;
                const double sigma = round_up(u_ * std::sqrt(var) * ni.inv_one_minus_delta * kBoundInflation);
                if (std::isfinite(det) && std::isfinite(sigma) && sigma > 0) {
                    out_.row_stat_det.data()[row] = det;
                    out_.row_stat_sigma.data()[row] = sigma;
                }
            }
            if (!fast) {
                put_output(flat, o_mp[col], bound, round_up(c.scale), self_error);
                if (rb.stat)
                    put_stat_bound(out_.output_stat_bound, flat, storage_rounding(stat_bound, static_cast<double>(o_mp[col])));
                continue;
            }
            put_output(flat, od[col], olo[col], bound, round_up(c.scale), self_error);
            if (rb.stat) put_stat_bound(out_.output_stat_bound, flat, storage_rounding(stat_bound, od[col]));
            certain = certain && rounding_is_certain(od[col], olo[col], 2 * self_error + 0x1p-96L * o_abs);
        }
        return certain;
    }
};

}  // namespace attn::oracle::detail
