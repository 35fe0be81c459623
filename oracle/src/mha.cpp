// The multi-head attention oracle: exact-input projections, per-head SDPA, merge and output projection in MPFR,
// with the per-element bound of oracle/BOUNDS.md section 9 (comments cite its steps).
#include "attn/oracle/mha.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn/mask.hpp"
#include "engine.hpp"
#include "types.hpp"

namespace attn::oracle {

namespace {

using detail::gamma;
using detail::kBoundInflation;

std::string str(Index n) { return std::to_string(n); }

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
};

template <class T>
MhaProblem resolve(const char* function, const MultiHeadAttention<T>& m, TensorView<const T> xq, TensorView<const T> xk,
                   TensorView<const T> xv, std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options) {
    const std::string f = function;
    const std::string shape_list = "query_states " + to_string(xq.shape()) + ", key_states " +
                                   to_string(xk.shape()) + ", value_states " + to_string(xv.shape());
    const std::string shapes = " (" + shape_list + ")";
    MhaProblem p;
    p.E = m.embed_dim(), p.H = m.num_heads(), p.G = m.num_kv_heads(), p.Dh = m.head_dim(), p.kdim = m.kdim(),
    p.vdim = m.vdim();
    if (options.training && m.dropout() > 0)
        throw ConfigError(f + ": dropout (training=true with dropout=" + std::to_string(m.dropout()) +
                          ") is not part of the oracle; call it with training=false");
    if (xq.rank() != 3 || xk.rank() != 3 || xv.rank() != 3)
        throw ShapeError(f + ": inputs must be (B, T, features)" + shapes);
    if (xq.dim(2) != p.E || xk.dim(2) != p.kdim || xv.dim(2) != p.vdim)
        throw ShapeError(f + ": feature widths must be query " + str(p.E) + ", key " + str(p.kdim) + ", value " +
                         str(p.vdim) + shapes);
    p.B = xq.dim(0), p.Tq = xq.dim(1), p.Tk = xk.dim(1);
    if (xk.dim(0) != p.B || xv.dim(0) != p.B) throw ShapeError(f + ": query, key and value states must have the same B" + shapes);
    if (xv.dim(1) != p.Tk) throw ShapeError(f + ": key_states and value_states must have the same Tk" + shapes);
    p.scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(p.Dh));
    if (!std::isfinite(p.scale) || !std::isfinite(static_cast<T>(p.scale)))
        throw ConfigError(f + ": scale must be finite in the input dtype, got " + std::to_string(p.scale));

    const Index B = p.B, H = p.H, Tq = p.Tq, Tk = p.Tk;
    const Shape target{B, H, Tq, Tk};
    const MhaMaskViews views = mha_mask_views(f, shapes, allowed_mask, options.key_padding_allowed, B, H, Tq, Tk);
    std::optional<TensorView<const bool>> mask4, padding4;
    if (views.mask) mask4 = views.mask->broadcast_to(target, f, "allowed_mask");
    if (views.padding) padding4 = views.padding->broadcast_to(target, f, "key_padding_allowed");
    p.allowed.assign(static_cast<std::size_t>(B * H * Tq * Tk), 0);
    p.nonempty.assign(static_cast<std::size_t>(B * H * Tq), 0);
    p.q_read.assign(static_cast<std::size_t>(B * Tq), 0);
    p.kv_read.assign(static_cast<std::size_t>(B * Tk), 0);
    for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h)
            for (Index i = 0; i < Tq; ++i)
                for (Index j = 0; j < Tk; ++j) {
                    bool ok = !options.is_causal || causal_allows(i, j, Tq, Tk, options.alignment);
                    if (ok && mask4) ok = (*mask4)({b, h, i, j});
                    if (ok && padding4) ok = (*padding4)({b, h, i, j});
                    if (!ok) continue;
                    p.allowed[static_cast<std::size_t>(((b * H + h) * Tq + i) * Tk + j)] = 1;
                    p.nonempty[static_cast<std::size_t>((b * H + h) * Tq + i)] = 1;
                    p.q_read[static_cast<std::size_t>(b * Tq + i)] = 1;
                    p.kv_read[static_cast<std::size_t>(b * Tk + j)] = 1;
                }
    if (options.empty_rows == EmptyRowPolicy::Throw)
        for (Index b = 0; b < B; ++b)
            for (Index h = 0; h < H; ++h)
                for (Index i = 0; i < Tq; ++i)
                    if (!p.nonempty[static_cast<std::size_t>((b * H + h) * Tq + i)])
                        throw MaskError(no_allowed_key_message(
                            f, "query row " + str(i) + " of batch " + str(b) + ", head " + str(h), Tq, Tk,
                            options.is_causal, options.alignment, shape_list));
    return p;
}

template <class T>
void require_finite(const std::string& f, const char* name, TensorView<const T> x, Index b, Index t) {
    for (Index c = 0; c < x.dim(2); ++c)
        if (!std::isfinite(x({b, t, c})))
            throw ValueError(f + ": " + name + " " + to_string(x.shape()) + " holds " + std::to_string(x({b, t, c})) +
                             " at batch " + str(b) + ", row " + str(t) + ", column " + str(c) +
                             ", a position some query reads (the oracle needs finite inputs there)");
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
// implementation's error bound and the oracle's own.
template <class Real>
struct Projected {
    std::vector<Real> y;           // (B, T, out)
    std::vector<double> impl, self;  // per element
};

template <class Real, class T>
Projected<Real> project(TensorView<const T> x, TensorView<const T> W, TensorView<const T> bias,
                        const std::vector<char>& read, double u, double eta, double u_mp) {
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
                for (Index i = 0; i < width; ++i) {
                    const double xi = static_cast<double>(x({b, t, i})), wi = static_cast<double>(W({c, i}));
                    acc += Real(xi) * Real(wi);  // exact product: 53 + 53 bits < the working precision
                    mag += std::fabs(xi * wi);
                }
                const std::size_t at = static_cast<std::size_t>((b * Tn + t) * out + c);
                r.y[at] = acc;
                r.impl[at] = g_impl * mag + (2 * width + 2) * eta * (1 + g_impl);
                r.self[at] = 2 * g_self * mag;
            }
        }
    return r;
}

template <class T>
void store(double hi, double lo, T& rounded, long double& exact, long double& exact_lo) {
    rounded = round_to<T>(hi, lo);
    exact = static_cast<long double>(hi) + static_cast<long double>(lo);
    exact_lo = std::isfinite(hi) ? (static_cast<long double>(hi) - exact) + static_cast<long double>(lo) : 0.0L;
}

template <class Real, class T>
void solve(const MultiHeadAttention<T>& m, const MhaProblem& p, TensorView<const T> xq, TensorView<const T> xk,
           TensorView<const T> xv, const MhaOptions& options, const ErrorModel& model, Result<T>& r) {
    constexpr double u = std::numeric_limits<T>::epsilon() / 2;  // the target's unit roundoff
    constexpr double eta = std::numeric_limits<T>::min();        // underflow term, covers flush-to-zero
    const double u_mp = std::ldexp(1.0, -(std::numeric_limits<Real>::digits - 1));
    const double inf = std::numeric_limits<double>::infinity();
    const Index B = p.B, Tq = p.Tq, Tk = p.Tk, E = p.E, H = p.H, Dh = p.Dh, KV = p.G * p.Dh, Rg = p.H / p.G;
    const Index Rs = effective_rescalings(model, Tk);  // online-softmax rescalings of the SDPA core
    const auto idx = [](Index a) { return static_cast<std::size_t>(a); };

    // 1. projections: q (B, Tq, E), k and v (B, Tk, G*Dh).
    const Projected<Real> q = project<Real, T>(xq, m.q_proj_weight(), m.q_proj_bias(), p.q_read, u, eta, u_mp);
    const Projected<Real> k = project<Real, T>(xk, m.k_proj_weight(), m.k_proj_bias(), p.kv_read, u, eta, u_mp);
    const Projected<Real> v = project<Real, T>(xv, m.v_proj_weight(), m.v_proj_bias(), p.kv_read, u, eta, u_mp);

    // 2-4. per head: logits, softmax, context (B, Tq, H*Dh) in the merged layout, with both error bounds.
    std::vector<Real> ctx(idx(B * Tq * E), Real(0));
    std::vector<double> ctx_impl(ctx.size(), 0.0), ctx_self(ctx.size(), 0.0);
    std::vector<char> nan_row(idx(B * Tq), 0);  // EmptyRowPolicy::Nan: a NaN context spreads over the output row
    const double c_abs = std::fabs(p.scale);
    const Real c_real(p.scale);
    const double g_logit = gamma(static_cast<double>(Dh + 1 + model.scale_roundings), u);
    const double g_logit2 = gamma(static_cast<double>(Dh + 2), u);
    const double g_logit_self = gamma(static_cast<double>(Dh + 1), u_mp);
    const double eps_exp = 2 * model.exp_ulps * u;
    const double log_up = (1 + Rs) * std::log1p(eps_exp), log_down = (1 + Rs) * std::log1p(-eps_exp);
    const double log_up_s = std::log1p(u_mp), log_down_s = std::log1p(-u_mp);
    std::vector<Index> keys;
    std::vector<Real> s, e, pr;
    std::vector<double> a, a_s, sigma, pu, B_impl, B_self;
    for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h) {
            const Index g = h / Rg;
            for (Index i = 0; i < Tq; ++i) {
                keys.clear();
                for (Index j = 0; j < Tk; ++j)
                    if (p.allowed_at(b, h, i, j)) keys.push_back(j);
                const Index n = static_cast<Index>(keys.size());
                if (n == 0) {  // EmptyRowPolicy::Zero leaves this head's context 0 (exact, bound 0)
                    if (options.empty_rows == EmptyRowPolicy::Nan) nan_row[idx(b * Tq + i)] = 1;
                    continue;
                }
                const double nd = static_cast<double>(n);
                const std::size_t q0 = idx((b * Tq + i) * E + h * Dh);
                // Step 2: logits s_j = scale * q . k_j and their perturbation bounds a_j (impl) and a_s_j (oracle).
                s.assign(idx(n), Real(0)), a.assign(idx(n), 0.0), a_s.assign(idx(n), 0.0);
                for (Index c = 0; c < n; ++c) {
                    const std::size_t k0 = idx((b * Tk + keys[c]) * KV + g * Dh);
                    Real dot(0);
                    double mixed = 0, mag = 0, abs_sum = 0, mixed_s = 0, mag_s = 0;
                    for (Index d = 0; d < Dh; ++d) {
                        const Real& qd = q.y[q0 + idx(d)];
                        const Real& kd = k.y[k0 + idx(d)];
                        dot += qd * kd;
                        // |exact| <= |oracle's value| + its own error bound.
                        const double sq = q.self[q0 + idx(d)], sk = k.self[k0 + idx(d)];
                        const double qa = std::fabs(static_cast<double>(qd)) + sq, ka = std::fabs(static_cast<double>(kd)) + sk;
                        const double eq = q.impl[q0 + idx(d)], ek = k.impl[k0 + idx(d)];
                        mixed += eq * ka + qa * ek + eq * ek;
                        mag += (qa + eq) * (ka + ek);
                        abs_sum += qa + eq + ka + ek;
                        mixed_s += sq * ka + qa * sk + sq * sk;
                        mag_s += (qa + sq) * (ka + sk);
                    }
                    s[idx(c)] = c_real * dot;
                    a[idx(c)] = c_abs * mixed + g_logit * c_abs * mag +
                                eta * ((2 * Dh + 2) * (1 + c_abs) + abs_sum) * (1 + g_logit2);
                    a_s[idx(c)] = 2 * (c_abs * mixed_s + g_logit_self * c_abs * mag_s);
                }
                const double A = *std::max_element(a.begin(), a.end());
                const double A_s = *std::max_element(a_s.begin(), a_s.end());
                Real smax = s[0];
                for (Index c = 1; c < n; ++c) smax = std::max(smax, s[idx(c)]);
                // Step 3: shifted softmax; sigma_j >= the exact m - s_j (the oracle's is within 2 A_s of it).
                e.assign(idx(n), Real(0)), pr.assign(idx(n), Real(0)), sigma.assign(idx(n), 0.0);
                Real S(0);
                for (Index c = 0; c < n; ++c) {
                    const Real shift = smax - s[idx(c)];
                    e[idx(c)] = exp(-shift);
                    S += e[idx(c)];
                    sigma[idx(c)] = static_cast<double>(shift) * (1 + 0x1p-50) + 2 * A_s;
                }
                for (Index c = 0; c < n; ++c) pr[idx(c)] = e[idx(c)] / S;
                // The oracle's own softmax (R = 0, exp correctly rounded): B_self, then an upper bound pu_j >= p_j.
                B_self.assign(idx(n), 0.0), B_impl.assign(idx(n), 0.0), pu.assign(idx(n), 0.0);
                double sum_pB_s = 0;
                for (Index c = 0; c < n; ++c) {
                    const double theta = a_s[idx(c)] + u_mp * (sigma[idx(c)] + a_s[idx(c)] + A_s);
                    B_self[idx(c)] = std::max(std::expm1(theta + log_up_s), -std::expm1(-theta + log_down_s));
                    sum_pB_s += static_cast<double>(pr[idx(c)]) * (1 + 0x1p-50) * B_self[idx(c)];
                }
                const double gS_s = gamma(nd - 1, u_mp), gO_s = gamma(nd + 1, u_mp);
                const double Delta_s = sum_pB_s + gS_s * (1 + sum_pB_s);
                if (!(Delta_s < 1.0 / 3))
                    throw Error("oracle.mha: the oracle's own softmax error is not bounded at " +
                                std::to_string(std::numeric_limits<Real>::digits) + " bits; raise bits");
                for (Index c = 0; c < n; ++c) {
                    const double rel = (B_self[idx(c)] + u_mp * (1 + B_self[idx(c)]) + Delta_s) / (1 - Delta_s);
                    pu[idx(c)] = static_cast<double>(pr[idx(c)]) * (1 + 0x1p-52) * (1 + rel);
                }
                // The implementation's: direct normalisation (BOUNDS.md section 3) with the exponent perturbation
                // Theta_j = a_j + (1 + R) u (sigma_j + a_j + A).
                double sum_pB = 0, sum_pB_self = 0;
                for (Index c = 0; c < n; ++c) {
                    const double theta = a[idx(c)] + (1 + Rs) * u * (sigma[idx(c)] + a[idx(c)] + A);
                    B_impl[idx(c)] = std::max(std::expm1(theta + log_up), -std::expm1(-theta + log_down));
                    sum_pB += pu[idx(c)] * B_impl[idx(c)];
                    sum_pB_self += pu[idx(c)] * B_self[idx(c)];
                }
                const double gS = gamma(nd - 1 + Rs, u), gO = gamma(nd + 1 + Rs, u);
                const double Delta = sum_pB + gS * (1 + sum_pB);
                const double Delta_self = sum_pB_self + gS_s * (1 + sum_pB_self);
                const bool bounded = Delta < 0.5 && gO < 0.5;  // false for NaN too
                const double S_min = std::exp(log_down + Rs * std::log1p(-u)) * (1 - gS);
                const double H0 = 2 * (1 + Rs) * eta;
                const double Z = (nd * H0 + (nd + Rs) * eta) * (1 + gS) * 2;
                // Step 4: context o_d = sum_j p_j v_jd with the value perturbations dv (impl) and sv (oracle).
                for (Index d = 0; d < Dh; ++d) {
                    Real o(0);
                    for (Index c = 0; c < n; ++c) o += pr[idx(c)] * v.y[idx((b * Tk + keys[c]) * KV + g * Dh + d)];
                    const double od = std::fabs(static_cast<double>(o));
                    double dev_s = 0, sv_term = 0, abs_s = 0;
                    for (Index c = 0; c < n; ++c) {
                        const std::size_t at = idx((b * Tk + keys[c]) * KV + g * Dh + d);
                        const double sv = v.self[at];
                        const double dev = static_cast<double>(Real(v.y[at] - o)), va = std::fabs(static_cast<double>(v.y[at]));
                        dev_s += pu[idx(c)] * B_self[idx(c)] * (std::fabs(dev) + sv);
                        sv_term += pu[idx(c)] * (1 + B_self[idx(c)]) * sv;
                        abs_s += pu[idx(c)] * (1 + B_self[idx(c)]) * (va + sv);
                    }
                    // Self bound: (*) with dv = sv; |v - o| for the exact o adds so itself, a term that the factor
                    // 2 absorbs because sum p B_self / (1 - Delta) <= 1/2 (BOUNDS.md section 9).
                    const double so = 2 * (dev_s + sv_term + gO_s * abs_s + gS_s * od * (1 + sum_pB_self)) / (1 - Delta_self);
                    double dev_i = 0, ev_term = 0, abs_i = 0, abs_v = 0;
                    for (Index c = 0; c < n; ++c) {
                        const std::size_t at = idx((b * Tk + keys[c]) * KV + g * Dh + d);
                        const double sv = v.self[at], ev = v.impl[at];
                        const double dev = std::fabs(static_cast<double>(Real(v.y[at] - o))) + sv + so;
                        const double va = std::fabs(static_cast<double>(v.y[at])) + sv;
                        const double w = pu[idx(c)] * (1 + B_impl[idx(c)]);
                        dev_i += pu[idx(c)] * B_impl[idx(c)] * dev;
                        ev_term += w * ev;
                        abs_i += w * (va + ev);
                        abs_v += va + ev;
                    }
                    double bound = inf;
                    if (bounded && S_min > 0.25) {
                        const double rel = (dev_i + ev_term + gO * abs_i + gS * (od + so) * (1 + sum_pB)) / (1 - Delta);
                        const double Xi = (H0 * abs_v + (2 * nd + Rs + 2) * eta) * (1 + gO) * 2;
                        const double direct_abs = (eta * abs_v + 2 * nd * eta) * (1 + gO);
                        bound = rel + (Xi + (od + so + rel) * Z) / S_min + direct_abs;
                    }
                    const std::size_t at = idx((b * Tq + i) * E + h * Dh + d);  // merge: (B, Tq, H, Dh) order
                    ctx[at] = o;
                    ctx_impl[at] = bound;
                    ctx_self[at] = so;
                }
            }
        }

    // 5. output = context (B, Tq, E) @ out_proj_weight^T (E, E) + out_proj_bias.
    const TensorView<const T> Wo = m.out_proj_weight(), bo = m.out_proj_bias();
    const bool has_bias = bo.numel() > 0;
    const double gE = gamma(static_cast<double>(E + 1), u), gE_s = gamma(static_cast<double>(E + 1), u_mp);
    for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < Tq; ++i)
            for (Index col = 0; col < E; ++col) {
                const std::size_t at = idx((b * Tq + i) * E + col);
                if (nan_row[idx(b * Tq + i)]) {
                    const double nan = std::numeric_limits<double>::quiet_NaN();
                    store<T>(nan, 0, r.output.data()[at], r.output_exact.data()[at], r.output_exact_lo.data()[at]);
                    continue;
                }
                const double bc = has_bias ? static_cast<double>(bo({col})) : 0.0;
                Real acc(bc);
                double prop = 0, mag = std::fabs(bc), prop_s = 0, mag_s = std::fabs(bc), scale_c = std::fabs(bc);
                for (Index c = 0; c < E; ++c) {
                    const std::size_t oc = idx((b * Tq + i) * E + c);
                    const double w = static_cast<double>(Wo({col, c})), wa = std::fabs(w);
                    acc += Real(w) * ctx[oc];
                    const double oa = std::fabs(static_cast<double>(ctx[oc])) + ctx_self[oc];
                    prop += wa * ctx_impl[oc];
                    mag += wa * (oa + ctx_impl[oc]);
                    prop_s += wa * ctx_self[oc];
                    mag_s += wa * oa;
                    scale_c += wa * std::fabs(static_cast<double>(ctx[oc]));
                }
                const double bound = (prop + gE * mag + (2 * E + 2) * eta * (1 + gE)) * kBoundInflation;
                const double self = 2 * (prop_s + gE_s * mag_s);
                double hi = static_cast<double>(acc);
                double lo = std::isfinite(hi) ? static_cast<double>(Real(acc - Real(hi))) : 0.0;
                store<T>(hi, lo, r.output.data()[at], r.output_exact.data()[at], r.output_exact_lo.data()[at]);
                r.output_bound.data()[at] = std::isnan(bound) ? inf : bound;
                r.output_scale.data()[at] = scale_c;
                // + storing the value as hi + lo (2^-106 relative).
                const double self_total = self + 0x1p-105 * std::fabs(hi);
                if (self_total > 0)
                    r.oracle_error_ratio = std::max(r.oracle_error_ratio, bound > 0 ? self_total / bound : inf);
            }
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
    if (oracle_options.bits < 0 || oracle_options.bits > 516)
        throw ConfigError(std::string(function) + ": bits must be in [0, 516] (0 = default), got " +
                          std::to_string(oracle_options.bits));
    if (!(oracle_options.model.exp_ulps >= 0) || oracle_options.model.scale_roundings < 0)
        throw ConfigError(std::string(function) + ": error model '" + oracle_options.model.name +
                          "' has a negative exp_ulps or scale_roundings");
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

}  // namespace attn::oracle
