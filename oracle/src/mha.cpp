// The multi-head attention oracle: exact-input projections, per-head SDPA, merge and output projection in MPFR,
// with the per-element bound of oracle/BOUNDS.md section 9 (comments cite its steps).
#include "attn/oracle/mha.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn/detail/mha_problem.hpp"
#include "attn/mask.hpp"
#include "softmax_bound.hpp"
#include "types.hpp"

namespace attn::oracle {

namespace {

// softmax_bound.hpp: the row's softmax and bound, shared with the SDPA engine.
using detail::CapRounding;
using detail::cap_rounding;
using detail::capped_logit_bound;
using detail::capped_self_error;
using detail::direct_factor;
using detail::exact_softmax;
using detail::flushable;
using detail::ExactSoftmax;
using detail::exponent_perturbation;
using detail::gamma;
using detail::implementation_rounding;
using detail::kBoundInflation;
using detail::logit_bound;
using detail::logit_rounding;
using detail::LogitRounding;
using detail::additive_logit_bound;
using detail::biased_self_error;
using detail::Normalisation;
using detail::normalise;
using detail::oracle_rounding;
using detail::per_key_scale_bound;
using detail::OutputSums;
using detail::round_up;
using detail::scale_gamma;
using detail::RowRounding;
using detail::split;
using detail::storage_rounding;
using detail::store;
using detail::Underflow;
using detail::underflow_units;
using detail::UnderflowUnits;
using detail::underflow_terms;
using detail::weighted_sum;
using detail::Wide;


// The module's call resolved once: sizes, scale and who reads what.
struct MhaProblem {
    Index B = 0, Tq = 0, Tk = 0, E = 0, H = 0, G = 0, Dh = 0, kdim = 0, vdim = 0;
    double scale = 0;
    std::vector<char> allowed;   // (B, H, Tq, Tk): masks, key padding and the causal rule and-ed
    std::vector<char> nonempty;  // (B, H, Tq)
    std::vector<char> q_read;    // (B, Tq): some head of this query row has an allowed key
    std::vector<char> kv_read;   // (B, Tk): some head reads this key/value row
    bool allowed_at(Index b, Index h, Index i, Index j) const {
        return allowed[static_cast<std::size_t>(((b * H + h) * Tq + i) * Tk + j)] != 0;
    }
    // The additive terms (MhaOptions::bias + key_padding_bias as the kernel receives them, widened exactly; ALiBi).
    bool bias = false, alibi = false;
    std::vector<double> bias_values;  // (B, H, Tq, Tk) when bias
    std::vector<double> slopes;       // (B, H) when alibi
    double bias_at(Index b, Index h, Index i, Index j) const {
        return bias ? bias_values[static_cast<std::size_t>(((b * H + h) * Tq + i) * Tk + j)] : 0.0;
    }
    double slope(Index b, Index h) const { return alibi ? slopes[static_cast<std::size_t>(b * H + h)] : 0.0; }
    double alibi_distance(Index i, Index j) const { return static_cast<double>(std::abs(i + Tk - Tq - j)); }
};

template <class T>
MhaProblem resolve(const char* function, const MultiHeadAttention<T>& m, TensorView<const T> xq, TensorView<const T> xk,
                   TensorView<const T> xv, std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options) {
    const std::string f = function;
    MhaProblem p;
    p.E = m.embed_dim(), p.H = m.num_heads(), p.G = m.num_kv_heads(), p.Dh = m.head_dim(), p.kdim = m.kdim(),
    p.vdim = m.vdim();
    if (options.training && m.dropout() > 0)
        throw ConfigError(f + ": dropout (training=true with dropout=" + std::to_string(m.dropout()) +
                          ") is not part of the oracle; call it with training=false");
    // The module's own shape contract, words included.
    const attn::detail::MhaStates states = attn::detail::check_mha_states(f, xq, xk, xv, p.E, p.kdim, p.vdim);
    const std::string& shape_list = states.shapes;
    p.B = states.B, p.Tq = states.Tq, p.Tk = states.Tk;
    attn::detail::check_scale_and_threads<compute_t<T>>(f, options.scale, options.num_threads, " (" + shape_list + ")");
    p.scale = attn::resolved_scale(options.scale, p.Dh);
    attn::detail::check_softcap<compute_t<T>>(f, options.softcap, " (" + shape_list + ")");

    // The module's mask contract and readability (attn/detail/mha_problem.hpp), empty-row error included.
    const Index B = p.B, H = p.H, Tq = p.Tq, Tk = p.Tk;
    attn::detail::HeadMasks masks = attn::detail::resolve_masks(f, shape_list, allowed_mask, options, B, H, Tq, Tk);
    const attn::detail::HeadBias<T> bias = attn::detail::resolve_bias<T>(f, shape_list, options, masks, B, H, Tq, Tk);
    const PositionRule positions = attn::detail::position_rule(f, options, " (" + shape_list + ")");
    const attn::detail::HeadReadability readable = attn::detail::head_readability(masks.allowed, positions, B, H, Tq, Tk);
    attn::detail::throw_if_empty_head_row(f, readable, positions, options.empty_rows, shape_list + masks.shapes);
    attn::detail::check_head_slopes<T>(f, bias, Tq, Tk, shape_list + masks.shapes);
    // The oracle needs a finite bias wherever a query reads it, whatever check_finite says.
    attn::detail::check_head_bias<T>(f, bias, masks, positions, shape_list + masks.shapes);
    if (bias.bias) {
        p.bias = true;
        p.bias_values.resize(static_cast<std::size_t>(B * H * Tq * Tk));
        std::size_t at = 0;
        for (Index b = 0; b < B; ++b)
            for (Index h = 0; h < H; ++h)
                for (Index i = 0; i < Tq; ++i)
                    for (Index j = 0; j < Tk; ++j) p.bias_values[at++] = static_cast<double>((*bias.bias)({b, h, i, j}));
    }
    if (bias.slopes) {
        p.alibi = true;
        for (Index b = 0; b < B; ++b)
            for (Index h = 0; h < H; ++h) p.slopes.push_back(static_cast<double>((*bias.slopes)({b, h})));
    }
    p.allowed.assign(static_cast<std::size_t>(B * H * Tq * Tk), 0);
    p.nonempty = readable.row_nonempty;
    p.q_read.assign(static_cast<std::size_t>(B * Tq), 0);
    p.kv_read.assign(static_cast<std::size_t>(B * Tk), 0);
    for (Index b = 0; b < B; ++b) {
        for (Index i = 0; i < Tq; ++i) p.q_read[static_cast<std::size_t>(b * Tq + i)] = readable.some_head_reads_query(b, i);
        for (Index j = 0; j < Tk; ++j) p.kv_read[static_cast<std::size_t>(b * Tk + j)] = readable.some_head_reads_key(b, j);
        for (Index h = 0; h < H; ++h)
            for (Index i = 0; i < Tq; ++i)
                for (Index j = 0; j < Tk; ++j)
                    p.allowed[static_cast<std::size_t>(((b * H + h) * Tq + i) * Tk + j)] =
                        positions.allows(i, j, Tq, Tk) &&
                        (!masks.allowed || (*masks.allowed)({b, h, i, j}));
    }
    return p;
}

template <class T>
void require_finite(const std::string& f, const char* name, TensorView<const T> x, Index b, Index t) {
    for (Index c = 0; c < x.dim(2); ++c)
        if (!std::isfinite(x({b, t, c})))
            attn::detail::throw_not_finite(f, name, x.shape(), static_cast<double>(x({b, t, c})),
                                           attn::detail::batch_row_column(to_string(Shape{b}), t, c),
                                           {"a position some query reads (the oracle needs finite inputs there)"});
}

template <class T>
void require_finite(const std::string& f, const char* name, TensorView<const T> param) {
    bool finite = true;
    for_each_index(param.shape(), [&](std::span<const Index> idx) { finite = finite && std::isfinite(param.at(idx)); });
    if (!finite)
        throw ValueError(f + ": parameter " + name + " " + to_string(param.shape()) +
                         " is not finite everywhere (the oracle needs finite parameters)");
}

// One projection y = x W^T + b (section 9, step 1) at the rows that are read: the oracle's value (Real), the
// implementation's error bound and the oracle's own. The implementation computes in C = compute_t<T> (u and eta
// are C's) and, on 16-bit storage, rounds each element to T once (section 9, "16-bit storage").
template <class Real>
struct Projected {
    std::vector<Real> y;           // (B, T, out)
    std::vector<double> impl, self;  // per element
};

template <class Real, class T>
Projected<Real> project(TensorView<const T> x, TensorView<const T> W, TensorView<const T> bias,
                        const std::vector<char>& read, double u, const UnderflowUnits& eta, double u_mp,
                        bool inputs_flushed) {
    const Index B = x.dim(0), Tn = x.dim(1), width = x.dim(2), out = W.dim(0);
    const bool has_bias = bias.numel() > 0;
    Projected<Real> r;
    r.y.assign(static_cast<std::size_t>(B * Tn * out), Real(0));
    r.impl.assign(r.y.size(), 0.0);
    r.self.assign(r.y.size(), 0.0);
    const double g_impl = gamma(static_cast<double>(width + 1), u), g_self = gamma(static_cast<double>(width + 1), u_mp);
    for (Index b = 0; b < B; ++b)
        for (Index t = 0; t < Tn; ++t) {
            if (!read[static_cast<std::size_t>(b * Tn + t)]) continue;
            for (Index c = 0; c < out; ++c) {
                const double bc = has_bias ? static_cast<double>(bias({c})) : 0.0;
                Real acc(bc);
                double mag = std::fabs(bc);  // sum |x_i W_ci| + |b_c|
                double flushed = inputs_flushed ? flushable<compute_t<T>>(bc) : 0.0;  // subnormal inputs read as 0
                for (Index i = 0; i < width; ++i) {
                    const double xi = static_cast<double>(x({b, t, i})), wi = static_cast<double>(W({c, i}));
                    acc += Real(xi) * Real(wi);  // exact product: 53 + 53 bits < the working precision
                    mag += std::fabs(xi * wi);
                    if (inputs_flushed) {
                        const double ex = flushable<compute_t<T>>(xi), ew = flushable<compute_t<T>>(wi);
                        flushed += ex * std::fabs(wi) + std::fabs(xi) * ew + ex * ew;
                    }
                }
                const std::size_t at = static_cast<std::size_t>((b * Tn + t) * out + c);
                r.y[at] = acc;
                r.impl[at] = flushed * (1 + g_impl) + g_impl * (mag + flushed) +
                             (width + 1) * (eta.mul + eta.add) * (1 + g_impl);
                r.self[at] = 2 * g_self * mag;
                r.impl[at] = storage_rounding<T>(r.impl[at], std::fabs(static_cast<double>(acc)) + r.self[at]);
            }
        }
    return r;
}

// Section 9 steps 2-4 for every (b, h, i): the logits from the projected q and k, the shared row of
// softmax_bound.hpp, and the context (B, Tq, H*Dh) in the merged layout with both error bounds.
template <class Real, class T>
class HeadPass {
public:
    std::vector<Real> ctx;                  // (B, Tq, E) in (B, Tq, H, Dh) order: the merge is a copy
    std::vector<double> ctx_impl, ctx_self;  // the implementation's bound and the oracle's own, per element
    std::vector<char> nan_row;              // (B, Tq): EmptyRowPolicy::Nan, a NaN context spreads over the row

    HeadPass(const MhaProblem& p, const Projected<Real>& q, const Projected<Real>& k, const Projected<Real>& v,
             const MhaOptions& options, const ErrorModel& model)
        : p_(p), q_(q), k_(k), v_(v), options_(options), model_(model) {
        Rs_ = static_cast<double>(effective_rescalings(model, p.Tk));
        eta_ = underflow_units<C>(model);
        lr_ = logit_rounding(p.Dh, p.scale, u_, eta_);
        g_logit_self_ = gamma(static_cast<double>(p.Dh + 1), u_mp_);
        const std::size_t size = idx(p.B * p.Tq * p.E);
        ctx.assign(size, Real(0));
        ctx_impl.assign(size, 0.0);
        ctx_self.assign(size, 0.0);
        nan_row.assign(idx(p.B * p.Tq), 0);
    }

    void run() {
        std::vector<Index> keys;
        for (Index b = 0; b < p_.B; ++b)
            for (Index h = 0; h < p_.H; ++h)
                for (Index i = 0; i < p_.Tq; ++i) {
                    keys.clear();
                    for (Index j = 0; j < p_.Tk; ++j)
                        if (p_.allowed_at(b, h, i, j)) keys.push_back(j);
                    if (keys.empty()) {  // EmptyRowPolicy::Zero leaves this head's context 0 (exact, bound 0)
                        if (options_.empty_rows == EmptyRowPolicy::Nan) nan_row[idx(b * p_.Tq + i)] = 1;
                        continue;
                    }
                    row(b, h, i, keys);
                }
    }

private:
    using C = compute_t<T>;  // the type the core computes in; its context is rounded to T once
    static constexpr double u_ = std::numeric_limits<C>::epsilon() / 2;  // the computation's unit roundoff
    UnderflowUnits eta_;  // the model's underflow (flush-to-zero or gradual), BOUNDS.md sections 0 and 4
    static std::size_t idx(Index a) { return static_cast<std::size_t>(a); }

    const MhaProblem& p_;
    const Projected<Real>& q_;
    const Projected<Real>& k_;
    const Projected<Real>& v_;
    const MhaOptions& options_;
    const ErrorModel& model_;
    double u_mp_ = std::ldexp(1.0, -(std::numeric_limits<Real>::digits - 1));  // 2^-(P-1), as the SDPA engine
    double Rs_ = 0;  // online-softmax rescalings of the SDPA core
    LogitRounding lr_;
    double g_logit_self_ = 0;

    // Step 2's logits and their perturbation bounds, for the implementation (a_j) and the oracle (a_self_j).
    struct HeadLogits {
        std::vector<Real> s;
        std::vector<double> a, a_self;
        double A = 0, A_self = 0;
    };
    // The row's two normalisations (section 3, direct) and the upper bounds p_up_j >= p_j they are weighted by.
    struct HeadBound {
        std::vector<double> p_up;
        Normalisation impl, self;
        Underflow under;
    };

    void row(Index b, Index h, Index i, const std::vector<Index>& keys) {
        const Index g = h / (p_.H / p_.G);
        const HeadLogits L = logits(b, h, g, i, keys);  // step 2
        ExactSoftmax<Real> sm;
        exact_softmax(L.s, sm);                          // sections 3-4's row, in Real
        const HeadBound hb = bound(L, sm);               // step 3
        for (Index d = 0; d < p_.Dh; ++d) context(b, h, g, i, d, keys, sm, hb);  // steps 3-4
    }

    // Step 2: s_j = scale * q . k_j from the projected (Real) q and k; a_j is section 2's logit bound with the
    // perturbation by e_q, e_k on top, every magnitude an upper value |oracle's value| + its own error bound.
    HeadLogits logits(Index b, Index h, Index g, Index i, const std::vector<Index>& keys) const {
        const Index Dh = p_.Dh, KV = p_.G * p_.Dh;
        const std::size_t n = keys.size(), q0 = idx((b * p_.Tq + i) * p_.E + h * Dh);
        const double c_abs = std::fabs(p_.scale);
        const Real c_real(p_.scale);
        HeadLogits L;
        L.s.assign(n, Real(0)), L.a.assign(n, 0.0), L.a_self.assign(n, 0.0);
        for (std::size_t c = 0; c < n; ++c) {
            const std::size_t k0 = idx((b * p_.Tk + keys[c]) * KV + g * Dh);
            Real dot(0);
            double mixed = 0, mag = 0, abs_sum = 0, mixed_s = 0, mag_s = 0;
            for (Index d = 0; d < Dh; ++d) {
                const Real& qd = q_.y[q0 + idx(d)];
                const Real& kd = k_.y[k0 + idx(d)];
                dot += qd * kd;
                const double sq = q_.self[q0 + idx(d)], sk = k_.self[k0 + idx(d)];
                const double qa = std::fabs(static_cast<double>(qd)) + sq, ka = std::fabs(static_cast<double>(kd)) + sk;
                const double eq = q_.impl[q0 + idx(d)], ek = k_.impl[k0 + idx(d)];
                mixed += eq * ka + qa * ek + eq * ek;
                mag += (qa + eq) * (ka + ek);
                abs_sum += qa + eq + ka + ek;
                mixed_s += sq * ka + qa * sk + sq * sk;
                mag_s += (qa + sq) * (ka + sk);
            }
            L.s[c] = c_real * dot;
            L.a[c] = logit_bound(lr_, mixed, mag, abs_sum);
            L.a_self[c] = 2 * (c_abs * mixed_s + g_logit_self_ * c_abs * mag_s);
            if (options_.softcap != 0) cap(L, c);
            if (p_.bias || p_.alibi) add_bias(L, c, b, h, i, keys[c]);
        }
        L.A = *std::max_element(L.a.begin(), L.a.end());
        L.A_self = *std::max_element(L.a_self.begin(), L.a_self.end());
        return L;
    }

    // Section 2b on the head's logit c: the capped logit in Real, the implementation's error through
    // capped_logit_bound and the oracle's own (MPFR: the quotient, tanh and the product each within u_mp).
    void cap(HeadLogits& L, std::size_t c) const {
        const double cap = options_.softcap, s = std::fabs(static_cast<double>(L.s[c]));
        const double s_up = round_up(static_cast<Wide>(s) * (1 + 0x1p-52L) + L.a_self[c]);
        const double s_lo = std::max(0.0, s * (1 - 0x1p-52) - L.a_self[c]);
        const CapRounding cr = cap_rounding(cap, model_, u_, 0, std::numeric_limits<C>::min());
        L.a[c] = capped_logit_bound(cr, L.a[c], s_lo, s_up);
        L.a_self[c] = capped_self_error(L.a_self[c], s_lo, s_up, cap, u_mp_, 4 * u_mp_ * static_cast<Wide>(cap));
        const Real cap_real(cap);
        L.s[c] = cap_real * tanh(L.s[c] / cap_real);
    }

    // Section 2c on the head's logit c (after the cap, if any): the bias b_j and ALiBi's -m |i + Tk - Tq - j| added
    // in Real (the product exact, each sum within u_mp), and the implementation's error of the biased logit: d_j, the
    // error of the logit before the bias (without a cap, the scale's roundings charged per key), then one addition
    // (biased_logit_bound) or, with ALiBi, its product and one or two additions (alibi_logit_bound).
    void add_bias(HeadLogits& L, std::size_t c, Index b, Index h, Index i, Index j) const {
        const double pre_up = round_up(std::fabs(static_cast<Wide>(static_cast<double>(L.s[c]))) * (1 + 0x1p-52L) +
                                       L.a_self[c]);
        const double d = options_.softcap != 0 ? L.a[c] : per_key_scale_bound(L.a[c], pre_up, scale_gamma(model_, u_, 0.0));
        const double bias = p_.bias_at(b, h, i, j), slope = p_.slope(b, h), distance = p_.alibi_distance(i, j);
        const double a_abs = p_.alibi ? round_up(std::fabs(static_cast<Wide>(slope) * distance) * (1 + 0x1p-52L)) : 0.0;
        if (p_.bias) L.s[c] += Real(bias);
        if (p_.alibi) L.s[c] += Real(-slope) * Real(distance);
        const double abs_biased = std::fabs(static_cast<double>(L.s[c]));
        L.a_self[c] = biased_self_error(L.a_self[c], abs_biased, p_.bias, p_.alibi, a_abs, u_mp_);
        const double abs_s = round_up(static_cast<Wide>(abs_biased) * (1 + 0x1p-52L) + L.a_self[c]);
        constexpr double eta = std::numeric_limits<C>::min();  // a flushed subnormal sum
        L.a[c] = additive_logit_bound(d, pre_up, abs_s, p_.bias, std::fabs(bias), p_.alibi, a_abs, u_, eta);
    }

    // Step 3 from the oracle's values: sigma_j >= the exact m - s_j (the oracle's is within 2 A_self of it); the
    // oracle's own softmax (R = 0, exp correctly rounded) gives p_up_j >= p_j (section 4's weight bound); then
    // the implementation's direct normalisation with Theta_j = a_j + k_sigma (sigma_j + a_j + A) + offset.
    HeadBound bound(const HeadLogits& L, const ExactSoftmax<Real>& sm) const {
        const std::size_t n = L.s.size();
        const double nd = static_cast<double>(n);
        std::vector<double> sigma(n), B_self(n), B_impl(n), p_first(n);
        const RowRounding self = oracle_rounding(nd, u_mp_, gamma(nd + 1, u_mp_), u_mp_);
        for (std::size_t c = 0; c < n; ++c) {
            sigma[c] = sm.sigma[c] * (1 + 0x1p-50) + 2 * L.A_self;
            B_self[c] = direct_factor(exponent_perturbation(L.a_self[c], sigma[c], L.A_self, self), self);
            p_first[c] = sm.p_hi[c] * (1 + 0x1p-50);
        }
        const Normalisation first = normalise(B_self, p_first, self);
        if (!(first.delta < 1.0 / 3))
            throw Error("oracle.mha: the oracle's own softmax error is not bounded at " +
                        std::to_string(std::numeric_limits<Real>::digits) + " bits; raise bits");
        HeadBound hb;
        hb.p_up.resize(n);
        for (std::size_t c = 0; c < n; ++c)
            hb.p_up[c] = sm.p_hi[c] * (1 + 0x1p-52) * (1 + first.weight_rel_factor(c, self.u_div));
        hb.self = normalise(B_self, hb.p_up, self);
        double max_abs_logit = 0;  // max_j |s_j|, rounded up (the oracle's own logit error included)
        for (std::size_t c = 0; c < n; ++c)
            max_abs_logit = std::max(max_abs_logit, std::fabs(static_cast<double>(L.s[c])) * (1 + 0x1p-52) + L.a_self[c]);
        const RowRounding impl = implementation_rounding(model_, nd, Rs_, u_, max_abs_logit, L.A);
        for (std::size_t c = 0; c < n; ++c)
            B_impl[c] = direct_factor(exponent_perturbation(L.a[c], sigma[c], L.A, impl), impl);
        hb.impl = normalise(B_impl, hb.p_up, impl);
        hb.under = underflow_terms(impl, nd, Rs_, u_, eta_);
        return hb;
    }

    // Steps 3-4: context o_d = sum_j p_j v_jd of head h, with (*) for the perturbed values v + dv (impl, e_v) and,
    // for the oracle's own bound, v + sv. |v - o| for the exact o adds s_o itself to the self bound, a term that
    // the factor 2 absorbs because sum p B_self / (1 - Delta) <= 1/2 (BOUNDS.md section 9).
    void context(Index b, Index h, Index g, Index i, Index d, const std::vector<Index>& keys,
                 const ExactSoftmax<Real>& sm, const HeadBound& hb) {
        const Index KV = p_.G * p_.Dh;
        const std::size_t n = keys.size();
        const auto at = [&](std::size_t c) { return idx((b * p_.Tk + keys[c]) * KV + g * p_.Dh + d); };
        const Real o = weighted_sum(sm.p, [&](std::size_t c) { return v_.y[at(c)]; });
        const double od = std::fabs(static_cast<double>(o));
        OutputSums self_sums;
        for (std::size_t c = 0; c < n; ++c) {
            const double sv = v_.self[at(c)];
            const double dev = static_cast<double>(Real(v_.y[at(c)] - o)), va = std::fabs(static_cast<double>(v_.y[at(c)]));
            hb.self.add(self_sums, c, std::fabs(dev) + sv, va, sv);
        }
        const double so = 2 * hb.self.output_numerator(self_sums, 0.0, od) / (1 - hb.self.delta);
        OutputSums sums;
        double abs_v = 0;
        for (std::size_t c = 0; c < n; ++c) {
            const double sv = v_.self[at(c)], ev = v_.impl[at(c)];
            const double dev = std::fabs(static_cast<double>(Real(v_.y[at(c)] - o))) + sv + so;
            const double va = std::fabs(static_cast<double>(v_.y[at(c)])) + sv;
            hb.impl.add(sums, c, dev, va, ev);
            abs_v += va + ev;
        }
        const double rel = hb.impl.output_rel(sums, 0.0, od + so);
        const std::size_t out = idx((b * p_.Tq + i) * p_.E + h * p_.Dh + d);  // merge: (B, Tq, H, Dh) order
        ctx[out] = o;
        ctx_impl[out] = storage_rounding<T>(hb.under.output(rel, abs_v, od + so), od + so);
        ctx_self[out] = so;
    }
};

// Step 5: output = context (B, Tq, E) @ out_proj_weight^T (E, E) + out_proj_bias, from the perturbed context.
template <class Real, class T>
void output_projection(const MultiHeadAttention<T>& m, const MhaProblem& p, const HeadPass<Real, T>& heads,
                       const UnderflowUnits& eta, const ErrorModel& model, Result<T>& r) {
    using C = compute_t<T>;  // the product in C, rounded to T once on 16-bit storage
    constexpr double u = std::numeric_limits<C>::epsilon() / 2;
    const double u_mp = std::ldexp(1.0, -(std::numeric_limits<Real>::digits - 1));
    const double inf = std::numeric_limits<double>::infinity();
    const Index Tq = p.Tq, E = p.E;
    const auto idx = [](Index a) { return static_cast<std::size_t>(a); };
    const TensorView<const T> Wo = m.out_proj_weight(), bo = m.out_proj_bias();
    const bool has_bias = bo.numel() > 0;
    const double gE = gamma(static_cast<double>(E + 1), u), gE_s = gamma(static_cast<double>(E + 1), u_mp);
    for (Index b = 0; b < p.B; ++b)
        for (Index i = 0; i < Tq; ++i)
            for (Index col = 0; col < E; ++col) {
                const std::size_t at = idx((b * Tq + i) * E + col);
                if (heads.nan_row[idx(b * Tq + i)]) {
                    const double nan = std::numeric_limits<double>::quiet_NaN();
                    store<T>(nan, 0, r.output.data()[at], r.output_exact.data()[at], r.output_exact_lo.data()[at]);
                    continue;
                }
                const double bc = has_bias ? static_cast<double>(bo({col})) : 0.0;
                Real acc(bc);
                double prop = 0, mag = std::fabs(bc), prop_s = 0, mag_s = std::fabs(bc), scale_c = std::fabs(bc);
                // Subnormal weights and bias a flushing kernel reads as 0 (the context is computed, not an input).
                double flushed = model.inputs_flushed ? flushable<C>(bc) : 0.0;
                for (Index c = 0; c < E; ++c) {
                    const std::size_t oc = idx((b * Tq + i) * E + c);
                    const double w = static_cast<double>(Wo({col, c})), wa = std::fabs(w);
                    acc += Real(w) * heads.ctx[oc];
                    const double oa = std::fabs(static_cast<double>(heads.ctx[oc])) + heads.ctx_self[oc];
                    prop += wa * heads.ctx_impl[oc];
                    mag += wa * (oa + heads.ctx_impl[oc]);
                    prop_s += wa * heads.ctx_self[oc];
                    mag_s += wa * oa;
                    scale_c += wa * std::fabs(static_cast<double>(heads.ctx[oc]));
                    if (model.inputs_flushed) flushed += flushable<C>(w) * (oa + heads.ctx_impl[oc]);
                }
                const double self = 2 * (prop_s + gE_s * mag_s);
                double hi, lo;
                split(acc, hi, lo);
                const double computed = storage_rounding<T>((prop + flushed * (1 + gE) + gE * (mag + flushed) +
                                                             (E + 1) * (eta.mul + eta.add) * (1 + gE)) * kBoundInflation,
                                                            std::fabs(hi) + self);
                // NaN when a context bound is infinite (0 * inf in the flushed term): no claim, as inf. The oracle's
                // own error is then no fraction of it (found by module_matches_oracle_within_bound: bfloat16 with
                // scale 2, where the context's bound is infinite and the ratio below was inf, so the call threw).
                const double bound = std::isnan(computed) ? inf : computed;
                store<T>(hi, lo, r.output.data()[at], r.output_exact.data()[at], r.output_exact_lo.data()[at]);
                r.output_bound.data()[at] = bound;
                r.output_scale.data()[at] = scale_c;
                // + storing the value as hi + lo (2^-106 relative).
                const double self_total = self + 0x1p-105 * std::fabs(hi);
                if (self_total > 0)
                    r.oracle_error_ratio = std::max(r.oracle_error_ratio, bound > 0 ? self_total / bound : inf);
            }
}

// Section 9: step 1, the three projections; steps 2-4 per head; step 5.
template <class Real, class T>
void solve(const MultiHeadAttention<T>& m, const MhaProblem& p, TensorView<const T> xq, TensorView<const T> xk,
           TensorView<const T> xv, const MhaOptions& options, const ErrorModel& model, Result<T>& r) {
    using C = compute_t<T>;  // the type the module computes in (float on 16-bit storage)
    constexpr double u = std::numeric_limits<C>::epsilon() / 2;  // the computation's unit roundoff
    const UnderflowUnits eta = underflow_units<C>(model);  // BOUNDS.md sections 0 and 4
    const double u_mp = std::ldexp(1.0, -(std::numeric_limits<Real>::digits - 1));
    // 1. projections: q (B, Tq, E), k and v (B, Tk, G*Dh).
    const Projected<Real> q = project<Real, T>(xq, m.q_proj_weight(), m.q_proj_bias(), p.q_read, u, eta, u_mp, model.inputs_flushed);
    const Projected<Real> k = project<Real, T>(xk, m.k_proj_weight(), m.k_proj_bias(), p.kv_read, u, eta, u_mp, model.inputs_flushed);
    const Projected<Real> v = project<Real, T>(xv, m.v_proj_weight(), m.v_proj_bias(), p.kv_read, u, eta, u_mp, model.inputs_flushed);
    // 2-4. per head: logits, softmax, context.
    HeadPass<Real, T> heads(p, q, k, v, options, model);
    heads.run();
    // 5. the output projection.
    output_projection<Real, T>(m, p, heads, eta, model, r);
    r.bits = std::numeric_limits<Real>::digits;
}

}  // namespace

template <class T>
Result<T> multi_head_attention(const MultiHeadAttention<T>& module, TensorView<const T> query_states,
                               TensorView<const T> key_states, TensorView<const T> value_states,
                               std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options,
                               const OracleOptions& oracle_options) {
    const char* function = "oracle.mha";
    const MhaProblem p = resolve<T>(function, module, query_states, key_states, value_states, allowed_mask, options);
    detail::check_oracle_options(function, oracle_options);
    if (oracle_options.model.logit_storage_roundings != 0 || oracle_options.model.probabilities_in_storage)
        throw ConfigError(std::string(function) + ": the model's roundings to storage inside the SDPA core "
                          "(logit_storage_roundings, probabilities_in_storage) are derived for SDPA only; the "
                          "module's core rounds its context alone (BOUNDS.md section 9)");
    require_finite<T>(function, "q_proj_weight", module.q_proj_weight());
    require_finite<T>(function, "k_proj_weight", module.k_proj_weight());
    require_finite<T>(function, "v_proj_weight", module.v_proj_weight());
    require_finite<T>(function, "out_proj_weight", module.out_proj_weight());
    require_finite<T>(function, "q_proj_bias", module.q_proj_bias());
    require_finite<T>(function, "k_proj_bias", module.k_proj_bias());
    require_finite<T>(function, "v_proj_bias", module.v_proj_bias());
    require_finite<T>(function, "out_proj_bias", module.out_proj_bias());
    for (Index b = 0; b < p.B; ++b) {
        for (Index i = 0; i < p.Tq; ++i)
            if (p.q_read[static_cast<std::size_t>(b * p.Tq + i)]) require_finite<T>(function, "query_states", query_states, b, i);
        for (Index j = 0; j < p.Tk; ++j)
            if (p.kv_read[static_cast<std::size_t>(b * p.Tk + j)]) {
                require_finite<T>(function, "key_states", key_states, b, j);
                require_finite<T>(function, "value_states", value_states, b, j);
            }
    }
    const Shape out_shape{p.B, p.Tq, p.E};
    Result<T> r;
    r.output = Tensor<T>(out_shape);
    r.output_bound = Tensor<double>(out_shape);
    r.output_scale = Tensor<double>(out_shape);
    r.output_exact = Tensor<long double>(out_shape);
    r.output_exact_lo = Tensor<long double>(out_shape);
    r.model = oracle_options.model;
    // The module's head path never splits the keys and section 9 derives no split-KV combine: the bound is for the
    // model without it, and the result says so.
    r.model.split_kv = false;
    const int bits = oracle_options.bits;
    if (bits <= 114) solve<detail::Mpfr114, T>(module, p, query_states, key_states, value_states, options, r.model, r);
    else if (bits <= 261) solve<detail::Mpfr261, T>(module, p, query_states, key_states, value_states, options, r.model, r);
    else solve<detail::Mpfr516, T>(module, p, query_states, key_states, value_states, options, r.model, r);
    if (r.oracle_error_ratio > max_oracle_error_ratio)
        throw Error(std::string(function) + ": the oracle's own error reaches " + std::to_string(r.oracle_error_ratio) +
                    " of a bound (limit 1e-6) at " + std::to_string(r.bits) + " bits; raise bits");
    return r;
}

template Result<float> multi_head_attention<float>(const MultiHeadAttention<float>&, TensorView<const float>,
                                                   TensorView<const float>, TensorView<const float>,
                                                   std::optional<TensorView<const bool>>, const MhaOptions&,
                                                   const OracleOptions&);
template Result<double> multi_head_attention<double>(const MultiHeadAttention<double>&, TensorView<const double>,
                                                     TensorView<const double>, TensorView<const double>,
                                                     std::optional<TensorView<const bool>>, const MhaOptions&,
                                                     const OracleOptions&);
template Result<float16> multi_head_attention<float16>(const MultiHeadAttention<float16>&, TensorView<const float16>,
                                                       TensorView<const float16>, TensorView<const float16>,
                                                       std::optional<TensorView<const bool>>, const MhaOptions&,
                                                       const OracleOptions&);
template Result<bfloat16> multi_head_attention<bfloat16>(const MultiHeadAttention<bfloat16>&,
                                                         TensorView<const bfloat16>, TensorView<const bfloat16>,
                                                         TensorView<const bfloat16>,
                                                         std::optional<TensorView<const bool>>, const MhaOptions&,
                                                         const OracleOptions&);

}  // namespace attn::oracle
