// The oracle's exact gradients (attn/oracle/backward.hpp): one batch element at a time in 261-bit arithmetic, then
// the sums over broadcast batch elements and the correct rounding to the target type.
#include "attn/oracle/backward.hpp"

#include <boost/multiprecision/mpfr.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>

#include "attn/oracle/oracle.hpp"
#include "backward_engine.hpp"
#include "storage_units.hpp"

namespace attn::oracle::detail {

template <class T>
ExactHead exact_head(const SdpaProblem<T>& p, const Readability& r, Index b, const attn::detail::SavedRows<T>& dout) {
    ExactHead h;
    h.Tq = p.Tq, h.Tk = p.Tk, h.Dk = p.Dk, h.Dv = p.Dv;
    const auto widen = [](T x) { return Mp(static_cast<double>(static_cast<compute_t<T>>(x))); };  // exact
    h.q.assign(static_cast<std::size_t>(p.Tq * p.Dk), Mp(0));
    h.dout.assign(static_cast<std::size_t>(p.Tq * p.Dv), Mp(0));
    h.k.resize(static_cast<std::size_t>(p.Tk * p.Dk));
    h.v.resize(static_cast<std::size_t>(p.Tk * p.Dv));
    h.bias.assign(static_cast<std::size_t>(p.Tq * p.Tk), Mp(0));
    h.allowed.assign(static_cast<std::size_t>(p.Tq * p.Tk), 0);
    for (Index i = 0; i < p.Tq; ++i) {
        if (!r.row_nonempty[static_cast<std::size_t>(i)]) continue;  // never read: may hold anything
        for (Index d = 0; d < p.Dk; ++d) h.q[i * p.Dk + d] = widen(p.q_row(b, i)[d * p.q.stride(-1)]);
        for (Index d = 0; d < p.Dv; ++d) h.dout[i * p.Dv + d] = widen(dout.row(b, i)[d * dout.col_stride]);
    }
    for (Index j = 0; j < p.Tk; ++j) {
        const bool read = r.key_readable[static_cast<std::size_t>(j)];
        for (Index d = 0; d < p.Dk; ++d) h.k[j * p.Dk + d] = read ? widen(p.k_row(b, j)[d * p.k.stride(-1)]) : Mp(0);
        for (Index d = 0; d < p.Dv; ++d) h.v[j * p.Dv + d] = read ? widen(p.v_row(b, j)[d * p.v.stride(-1)]) : Mp(0);
    }
    for (Index i = 0; i < p.Tq; ++i)
        for (Index j = 0; j < p.Tk; ++j) {
            if (!p.allowed(b, i, j)) continue;
            h.allowed[i * p.Tk + j] = 1;
            Mp a = p.bias ? Mp(static_cast<double>(p.explicit_bias(b, i, j))) : Mp(0);
            if (p.alibi) a -= Mp(static_cast<double>(p.alibi_slope(b))) * Mp(static_cast<double>(p.alibi_distance(i, j)));
            h.bias[i * p.Tk + j] = a;
        }
    h.scale = Mp(p.scale);
    h.cap = Mp(p.softcap);
    return h;
}

namespace {

// Row i's weights over the keys (0 where blocked), its logits (after the cap and the bias) and log-sum-exp, and with
// a cap each allowed key's 1 - tanh^2(s / cap).
struct RowWeights {
    std::vector<Mp> p, s, g, t;  // t: tanh(s / cap) with a cap
    Mp lse;
    bool any = false;
};

RowWeights row_weights(const ExactHead& h, Index i) {
    RowWeights w;
    w.p.assign(static_cast<std::size_t>(h.Tk), Mp(0));
    w.s.assign(static_cast<std::size_t>(h.Tk), Mp(0));
    w.g.assign(static_cast<std::size_t>(h.Tk), Mp(1));
    w.t.assign(static_cast<std::size_t>(h.Tk), Mp(0));
    Mp max;
    for (Index j = 0; j < h.Tk; ++j) {
        if (!h.allowed[i * h.Tk + j]) continue;
        Mp s = 0;
        for (Index d = 0; d < h.Dk; ++d) s += h.q[i * h.Dk + d] * h.k[j * h.Dk + d];
        s *= h.scale;
        if (h.cap != 0) {
            const Mp t = tanh(s / h.cap);
            w.g[j] = 1 - t * t;
            w.t[j] = t;
            s = h.cap * t;
        }
        s += h.bias[i * h.Tk + j];
        w.p[j] = s;
        w.s[j] = s;
        if (!w.any || s > max || isnan(s)) max = s;
        w.any = true;
    }
    if (!w.any) return w;
    Mp sum = 0;
    for (Index j = 0; j < h.Tk; ++j)
        if (h.allowed[i * h.Tk + j]) sum += (w.p[j] = exp(w.p[j] - max));
    for (Index j = 0; j < h.Tk; ++j)
        if (h.allowed[i * h.Tk + j]) w.p[j] /= sum;
    w.lse = max + log(sum);
    return w;
}

}  // namespace

std::vector<Mp> exact_output(const ExactHead& h) {
    std::vector<Mp> out(static_cast<std::size_t>(h.Tq * h.Dv), Mp(0));
    for (Index i = 0; i < h.Tq; ++i) {
        const RowWeights w = row_weights(h, i);
        for (Index j = 0; j < h.Tk; ++j)
            if (h.allowed[i * h.Tk + j]) {
                const Mp p = h.mult.empty() ? w.p[j] : w.p[j] * h.mult[i * h.Tk + j];
                for (Index d = 0; d < h.Dv; ++d) out[i * h.Dv + d] += p * h.v[j * h.Dv + d];
            }
    }
    return out;
}

// An MPFR magnitude converted to long double (rounded to nearest, 2^-64 relative), made an upper bound.
static long double up(long double x) { return x * (1 + 0x1p-60L); }

long double gamma(Index k, double u) {
    const long double ku = static_cast<long double>(k) * u;
    return ku < 1 ? ku / (1 - ku) : std::numeric_limits<long double>::infinity();
}

namespace {

// Section 12, steps 0 and 4: a weight or a dS rounded to the storage type, |fl_S(y) - x| <= e + u_S (|x| + e) +
// tau_S / 2 for y within e of x (round to nearest, gradual underflow in the storage type).
long double to_storage(const BoundInputs& in, long double x_abs, long double e) {
    if (!in.in_storage) return e;
    return e + static_cast<long double>(in.u_storage) * (x_abs + e) + static_cast<long double>(in.half_denorm_storage);
}

// Section 12b: a bound on |lse_hat - lse| of row i for a forward of the model's structure (section 3), lse_hat =
// fl(m_hat + fl(log l_hat)): the logits' errors (A, the largest), the sum's per-key factors theta_j weighted by the
// computed weights, the log's error and the final addition's. Infinite where it cannot be bounded.
long double lse_error(const ExactHead& h, const RowWeights& w, Index i, const BoundInputs& in) {
    using Wide = long double;
    constexpr Wide inf = std::numeric_limits<Wide>::infinity();
    if (in.split_kv) return inf;  // a split forward's combine (section 3) is not derived for the lse here
    Index n = 0;
    Wide A = 0, max_abs_s = 0;
    Mp m;
    for (Index j = 0; j < h.Tk; ++j) {
        if (!h.allowed[i * h.Tk + j]) continue;
        if (n == 0 || w.s[j] > m) m = w.s[j];
        ++n;
        A = std::max<Wide>(A, in.logits_bound[i * h.Tk + j]);
        max_abs_s = std::max(max_abs_s, up(abs(w.s[j]).convert_to<Wide>()));
    }
    if (n == 0) return 0;
    const double u = in.u;
    const Index R = in.rescalings;
    // Per key: the exponent's roundings telescoped, gamma_k (m_hat - s_hat_j) <= gamma_k (sigma_j + a_j + A), the
    // rounded-max shift's and a stale max's offsets, 1 + R exp factors, and the n - 1 + R additions and products.
    const Wide g_k = gamma(in.shift_roundings, u);
    const Wide offset = (in.rounded_max_shift ? u * (max_abs_s + A) : 0) + 2 * g_k * in.stale_max;
    const Wide exp_factor = std::pow(1 + 2 * in.exp_ulps * static_cast<Wide>(u), static_cast<Wide>(1 + R));
    // Weights rounded to storage may be what the sum adds (section 12b, charged whether or not it does).
    const Wide sums = (1 + gamma(n + R, u)) * (in.in_storage ? 1 + static_cast<Wide>(in.u_storage) : 1);
    Wide Theta = 0;
    for (Index j = 0; j < h.Tk; ++j) {
        if (!h.allowed[i * h.Tk + j]) continue;
        const Wide sigma = up((m - w.s[j]).convert_to<Wide>()), a = in.logits_bound[i * h.Tk + j];
        const Wide theta = std::exp(g_k * (sigma + a + A) + offset) * exp_factor * sums - 1;
        Theta += up(w.p[j].convert_to<Wide>()) * std::exp(2 * A) * theta;  // the computed weight <= p e^{2A}
    }
    // Underflow: every exp, rescaling, product and addition off by at most min_normal, against l* >= 1.
    Theta += 2 * static_cast<Wide>(n + R + 1) * in.min_normal;
    if (in.in_storage) Theta += static_cast<Wide>(n) * in.half_denorm_storage;  // each stored weight's absolute part
    if (!(Theta < 1)) return inf;
    const Wide e_L = -std::log1p(-Theta);                   // |log l_hat - log l*|, l* = sum exp(s_hat - m_hat)
    const Wide log_abs = std::log(static_cast<Wide>(n)) + e_L;  // >= |log l_hat|: l* in [1, n]
    const Wide e_log = 2 * in.log_ulps * u * std::max<Wide>(log_abs, 1);
    const Wide before = A + e_L + e_log;  // lse(s_hat) within A of lse(s), then the sum's and the log's errors
    return (before + u * (up(abs(w.lse).convert_to<Wide>()) + before)) * (1 + 1e-12L);
}

}  // namespace

ExactGradients exact_gradients(const ExactHead& h, const BoundInputs* bound) {
    using Wide = long double;
    ExactGradients g;
    g.dq.assign(static_cast<std::size_t>(h.Tq * h.Dk), Mp(0));
    g.dk.assign(static_cast<std::size_t>(h.Tk * h.Dk), Mp(0));
    g.dv.assign(static_cast<std::size_t>(h.Tk * h.Dv), Mp(0));
    // Section 12's sums: per dq element, per dk and dv element (over the rows that read the key), the terms with the
    // bound of each dS or weight (first) and with its magnitude plus bound (second), and the number of terms.
    std::vector<Wide> dk1(bound ? g.dk.size() : 0), dk2(dk1.size()), dv1(bound ? g.dv.size() : 0),
        dv2(dv1.size());
    std::vector<Index> key_rows(bound ? static_cast<std::size_t>(h.Tk) : 0);
    if (bound) g.dq_bound.assign(g.dq.size(), 0), g.dk_bound.assign(g.dk.size(), 0), g.dv_bound.assign(g.dv.size(), 0);
    const Wide u = bound ? bound->u : 0, eta = bound ? bound->eta_mul + bound->eta_add : 0;
    // Every term is nonnegative; a NaN can only come from 0 * inf, where an infinite forward weight bound (the forward
    // cannot bound that weight) meets an exact zero: the gradient term is then unbounded too.
    const auto unbounded_if_nan = [](Wide x) { return std::isnan(x) ? std::numeric_limits<Wide>::infinity() : x; };
    const Wide scale = abs(h.scale).convert_to<Wide>();
    for (Index i = 0; i < h.Tq; ++i) {
        const RowWeights w = row_weights(h, i);
        if (!w.any) continue;
        // The weights the output and dv take: p itself, or with multipliers (section 12c, dropout) m_ij p_ij, once
        // per row.
        std::vector<Mp> multiplied;
        if (!h.mult.empty()) {
            multiplied.assign(static_cast<std::size_t>(h.Tk), Mp(0));
            for (Index j = 0; j < h.Tk; ++j)
                if (h.allowed[i * h.Tk + j]) multiplied[static_cast<std::size_t>(j)] = h.mult[i * h.Tk + j] * w.p[j];
        }
        const std::vector<Mp>& pv = h.mult.empty() ? w.p : multiplied;
        Mp D = 0;  // dout_i . O_i, O_i = sum_j pv_ij v_j from this row's weights
        Wide e_D_out = 0, D_out_terms = 0;  // section 12b, D from the saved output: sum |dO| e_O, sum |dO| (|O| + e_O)
        for (Index d = 0; d < h.Dv; ++d) {
            Mp o = 0;
            for (Index j = 0; j < h.Tk; ++j)
                if (h.allowed[i * h.Tk + j]) o += pv[j] * h.v[j * h.Dv + d];
            D += h.dout[i * h.Dv + d] * o;
            if (bound && bound->d_from_output) {
                const Wide g_abs = abs(h.dout[i * h.Dv + d]).convert_to<Wide>();
                const Wide e_O = bound->output_bound[i * h.Dv + d];
                e_D_out += g_abs * e_O;
                D_out_terms += g_abs * (up(abs(o).convert_to<Wide>()) + e_O);
            }
        }
        const Wide e_lse = bound && bound->weights_from_lse ? lse_error(h, w, i, *bound) : 0;
        // Section 12, steps 1-2: each dP's bound, then D's.
        // Section 12b: a weight recomputed as Exp(fl(s_hat - lse_hat)) errs by P (e^{e_x} - 1) from its exponent's error
        // e_x (the forward's logit error, the lse's, the subtraction's rounding), by exp_ulps ulps of the result, and
        // below the normal range by min_normal; else the forward's weights bound (section 12, step 0).
        // With probabilities_in_storage, the weight as the products see it: rounded to the storage type.
        const auto weight_error = [&](Index j) -> Wide {
            const Wide P = w.p[j].convert_to<Wide>();
            if (!bound->weights_from_lse) return to_storage(*bound, P, bound->weights_bound[i * h.Tk + j]);
            const Wide e_s = bound->logits_bound[i * h.Tk + j];
            const Wide x = up(abs(w.s[j] - w.lse).convert_to<Wide>());
            // The lse scaled and rounded on its own (FlashAttention-2's exp2(fma(s, c, -fl(lse log2 e))), as the
            // rounded-max shift in the forward): u |lse_hat| more in the natural exponent; the subtraction's
            // underflow under flush-to-zero (eta_add).
            const Wide lse_shift = bound->rounded_max_shift ? u * (up(abs(w.lse).convert_to<Wide>()) + e_lse) : 0;
            const Wide e_in = e_s + e_lse + lse_shift;
            const Wide e_x = e_in + gamma(bound->shift_roundings, bound->u) * (x + e_in) + bound->eta_add;
            return to_storage(*bound, P,
                              P * std::expm1(e_x) + bound->exp_ulps * 2 * u * P * std::exp(e_x) + bound->min_normal);
        };
        Index n = 0;
        std::vector<Mp> dPs(static_cast<std::size_t>(h.Tk));  // dP_ij of the allowed keys
        std::vector<Wide> e_P(bound ? static_cast<std::size_t>(h.Tk) : 0);
        std::vector<Wide> e_dP(bound ? static_cast<std::size_t>(h.Tk) : 0);
        std::vector<Wide> e_Pv(bound && !h.mult.empty() ? static_cast<std::size_t>(h.Tk) : 0);  // dv's weights
        Wide e_D = 0, D_terms = 0;
        for (Index j = 0; j < h.Tk; ++j) {
            if (!h.allowed[i * h.Tk + j]) continue;
            Mp& dP = dPs[static_cast<std::size_t>(j)];
            dP = 0;
            for (Index d = 0; d < h.Dv; ++d) dP += h.dout[i * h.Dv + d] * h.v[j * h.Dv + d];
            if (!h.mult.empty()) dP *= h.mult[i * h.Tk + j];
            const Mp ds = w.p[j] * (dP - D) * w.g[j] * h.scale;  // the scale of both dq and dk
            for (Index d = 0; d < h.Dk; ++d) {
                g.dq[i * h.Dk + d] += ds * h.k[j * h.Dk + d];
                g.dk[j * h.Dk + d] += ds * h.q[i * h.Dk + d];
            }
            for (Index d = 0; d < h.Dv; ++d) g.dv[j * h.Dv + d] += pv[j] * h.dout[i * h.Dv + d];
            if (!bound) continue;
            ++n;
            Wide A = 0;
            for (Index d = 0; d < h.Dv; ++d)
                A += abs(h.dout[i * h.Dv + d]).convert_to<Wide>() * abs(h.v[j * h.Dv + d]).convert_to<Wide>();
            const auto js = static_cast<std::size_t>(j);
            e_dP[js] = gamma(h.Dv, bound->u) * A + 2 * static_cast<Wide>(h.Dv) * eta;
            const Wide dP_abs = abs(dP).convert_to<Wide>();
            if (!h.mult.empty()) {
                // Section 12c: dP_hat = fl(fl(dout . v) m) and dv's weight fl(p_hat m), one rounding each.
                const Wide M = up(abs(h.mult[i * h.Tk + j]).convert_to<Wide>()), P = w.p[j].convert_to<Wide>();
                const Wide eP = weight_error(j), dP1 = M != 0 ? dP_abs / M : 0;
                e_dP[js] = M * e_dP[js] + u * M * (dP1 + e_dP[js]) + bound->eta_mul;
                e_Pv[js] = to_storage(*bound, M * P, M * eP + u * M * (P + eP) + bound->eta_mul);
                if (M == 0) e_dP[js] = e_Pv[js] = 0;  // dropped: exactly 0
            }
            const Wide P = w.p[j].convert_to<Wide>(), eP = e_P[js] = weight_error(j);
            e_D += eP * dP_abs + P * e_dP[js] + eP * e_dP[js];
            D_terms += (P + eP) * (dP_abs + e_dP[js]);
        }
        if (!bound) continue;
        e_D += gamma(n, bound->u) * D_terms + 2 * static_cast<Wide>(n) * eta;
        // Section 12b: D_hat = fl(dout_i . out_hat_i), a dot product over Dv of the saved output, within its bound.
        if (bound->d_from_output)
            e_D = e_D_out + gamma(h.Dv, bound->u) * D_out_terms + 2 * static_cast<Wide>(h.Dv) * eta;
        // Steps 3-5: each dS's bound, and its terms in dq, dk and dv.
        std::vector<Wide> row1(static_cast<std::size_t>(h.Dk), 0), row2(row1.size(), 0);
        for (Index j = 0; j < h.Tk; ++j) {
            if (!h.allowed[i * h.Tk + j]) continue;
            const auto js = static_cast<std::size_t>(j);
            const Wide x = abs(dPs[js] - D).convert_to<Wide>();  // dP from the first pass
            // Under flush-to-zero the subtraction may lose a result below the normal range (eta_add).
            const Wide e_x = e_dP[js] + e_D + u * (x + e_dP[js] + e_D) + bound->eta_add;
            const Wide P = w.p[j].convert_to<Wide>(), eP = e_P[js];
            const Wide Pv = h.mult.empty() ? P : up(abs(pv[j]).convert_to<Wide>());  // dv's weight
            const Wide ePv = h.mult.empty() ? eP : e_Pv[js];
            Wide e_dS = eP * x + (P + eP) * e_x + u * (P + eP) * (x + e_x) + bound->eta_mul;
            Wide dS = P * x;
            if (h.cap != 0) {
                // Section 12, step 4b: dS_hat = fl(fl(p_hat x_hat) g_hat), g_hat = fl(1 - fl(t_hat^2)), t_hat within
                // e_t of t = tanh(s / cap) (the capped logit's error a over |cap|, and the rounding of t either way).
                const Wide cap = abs(h.cap).convert_to<Wide>(), t = up(abs(w.t[j]).convert_to<Wide>());
                const Wide g = up(w.g[j].convert_to<Wide>());
                const Wide a = bound->logits_bound[i * h.Tk + j];
                const Wide e_t = a / cap + 2 * u * (t + a / cap);
                const Wide e_sq = (2 * t + e_t) * e_t;
                const Wide e_g = e_sq + u * (t + e_t) * (t + e_t) + u * (g + e_sq + u * (t + e_t) * (t + e_t));
                e_dS = e_dS * (g + e_g) + dS * e_g + u * (dS + e_dS) * (g + e_g) + bound->eta_mul;
                dS *= g;
            }
            e_dS = to_storage(*bound, dS, e_dS);  // dS rounded to storage before dq and dk's products
            for (Index d = 0; d < h.Dk; ++d) {
                const Wide kd = abs(h.k[j * h.Dk + d]).convert_to<Wide>(), qd = abs(h.q[i * h.Dk + d]).convert_to<Wide>();
                row1[static_cast<std::size_t>(d)] += e_dS * kd;
                row2[static_cast<std::size_t>(d)] += (dS + e_dS) * kd;
                dk1[static_cast<std::size_t>(j * h.Dk + d)] += e_dS * qd;
                dk2[static_cast<std::size_t>(j * h.Dk + d)] += (dS + e_dS) * qd;
            }
            for (Index d = 0; d < h.Dv; ++d) {
                const Wide o = abs(h.dout[i * h.Dv + d]).convert_to<Wide>();
                dv1[static_cast<std::size_t>(j * h.Dv + d)] += ePv * o;
                dv2[static_cast<std::size_t>(j * h.Dv + d)] += (Pv + ePv) * o;
            }
            ++key_rows[js];
        }
        const Wide under = 2 * static_cast<Wide>(n + 2) * eta * std::max<Wide>(1, scale);
        for (Index d = 0; d < h.Dk; ++d)
            g.dq_bound[static_cast<std::size_t>(i * h.Dk + d)] = unbounded_if_nan(
                scale * (row1[static_cast<std::size_t>(d)] +
                         gamma(n + 1 + bound->scale_roundings, bound->u) * row2[static_cast<std::size_t>(d)]) +
                under);
    }
    if (!bound) return g;
    for (Index j = 0; j < h.Tk; ++j) {
        const Index m = key_rows[static_cast<std::size_t>(j)];
        if (m == 0) continue;  // nobody reads the key: its gradients are exactly 0
        const Wide under = 2 * static_cast<Wide>(m + 2) * eta * std::max<Wide>(1, scale);
        for (Index d = 0; d < h.Dk; ++d) {
            const auto x = static_cast<std::size_t>(j * h.Dk + d);
            g.dk_bound[x] =
                unbounded_if_nan(scale * (dk1[x] + gamma(m + 1 + bound->scale_roundings, bound->u) * dk2[x]) + under);
        }
        for (Index d = 0; d < h.Dv; ++d) {
            const auto x = static_cast<std::size_t>(j * h.Dv + d);
            g.dv_bound[x] = unbounded_if_nan(dv1[x] + gamma(m, bound->u) * dv2[x] + under);
        }
    }
    return g;
}

#define ATTN_INSTANTIATE(T)                                                                                        \
    template ExactHead exact_head<T>(const SdpaProblem<T>&, const Readability&, Index,                              \
                                     const attn::detail::SavedRows<T>&);
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

}  // namespace attn::oracle::detail

namespace attn::oracle {

namespace {

using detail::Mp;

// The per-batch gradients of one input summed into its own shape (stride 0 on broadcast dims), rounded to T; with
// their bounds, section 12's step 6: the batch sum's roundings and the rounding to 16-bit storage, then the margin.
template <class T>
void sum_and_round(const std::vector<detail::ExactGradients>& per_batch, std::vector<Mp> detail::ExactGradients::*grad,
                   std::vector<long double> detail::ExactGradients::*bound, const Shape& shape,
                   const SdpaProblem<T>& p, Index rows, Index cols, const char* name, double u, bool unbounded,
                   Tensor<T>& rounded, Tensor<long double>& exact, Tensor<long double>& exact_lo,
                   Tensor<double>& out_bound) {
    using Wide = long double;
    const auto size = static_cast<std::size_t>(numel(shape));
    std::vector<Mp> acc(size, Mp(0));
    std::vector<Wide> bound_sum(size, 0), magnitude_sum(size, 0);
    std::vector<Index> terms(size, 0);
    Shape full = p.batch_shape;
    full.push_back(rows);
    full.push_back(cols);
    const TensorView<const char> layout =  // only its strides: `shape` broadcast to the batch, stride 0 there
        TensorView<const char>(nullptr, shape).broadcast_to(full, p.function, name);
    const std::vector<Index> offsets =
        attn::detail::batch_offsets(layout, static_cast<Index>(p.batch_shape.size()), p.batch_shape);
    const Index rs = layout.stride(-2), cs = layout.stride(-1);
    for (Index b = 0; b < p.batch; ++b) {
        const detail::ExactGradients& g = per_batch[static_cast<std::size_t>(b)];
        for (Index i = 0; i < rows; ++i)
            for (Index c = 0; c < cols; ++c) {
                const auto to = static_cast<std::size_t>(offsets[static_cast<std::size_t>(b)] + i * rs + c * cs);
                const auto from = static_cast<std::size_t>(i * cols + c);
                acc[to] += (g.*grad)[from];
                bound_sum[to] += (g.*bound)[from];
                magnitude_sum[to] += abs((g.*grad)[from]).template convert_to<Wide>() + (g.*bound)[from];
                ++terms[to];
            }
    }
    rounded = Tensor<T>::uninitialized(shape);
    exact = Tensor<long double>::uninitialized(shape);
    exact_lo = Tensor<long double>::uninitialized(shape);
    out_bound = Tensor<double>::uninitialized(shape);
    for (std::size_t x = 0; x < acc.size(); ++x) {
        const double hi = acc[x].convert_to<double>();
        const double lo = std::isfinite(hi) ? Mp(acc[x] - Mp(hi)).convert_to<double>() : 0.0;
        rounded.data()[x] = round_to<T>(hi, lo);
        exact.data()[x] = acc[x].convert_to<long double>();
        exact_lo.data()[x] = std::isfinite(exact.data()[x]) ? Mp(acc[x] - Mp(exact.data()[x])).convert_to<long double>() : 0;
        Wide e = bound_sum[x] + (terms[x] > 1 ? detail::gamma(terms[x] - 1, u) * magnitude_sum[x] : 0);
        if constexpr (is_half_v<T>) {
            // One rounding to the storage type at the end: half its ulp, relative, and half its smallest subnormal.
            constexpr Wide u_s = detail::StorageUnits<T>::u, eta_s = detail::StorageUnits<T>::half_denorm;
            e += u_s * (std::abs(exact.data()[x]) + e) + eta_s;
        }
        e *= 1 + 1e-6L;  // section 7's margin for the bound's own roundings
        out_bound.data()[x] = unbounded && e != 0 ? std::numeric_limits<double>::infinity()
                                                  : std::nextafter(static_cast<double>(e), INFINITY);
    }
}

}  // namespace

template <class T>
Gradients<T> sdpa_backward(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                           TensorView<const T> dout, std::optional<TensorView<const bool>> allowed_mask,
                           const SdpaOptions& options, const OracleOptions& oracle_options,
                           std::optional<TensorView<const double>> weight_multipliers) {
    using C = compute_t<T>;
    const std::string function = "oracle.sdpa_backward";
    const SdpaProblem<T> p = make_sdpa_problem<T>(function, q, k, v, allowed_mask, options);
    const std::string shapes = p.shapes + ", dout " + to_string(dout.shape());
    const attn::detail::SavedRows<T> dout_rows(function, "dout", dout, p.output_shape(), p.batch_shape, shapes);
    const ErrorModel& model = oracle_options.model;
    const std::vector<Readability> readable = check_contracts(p, options);
    if (options.check_finite) attn::detail::check_owned_rows(p, readable, "dout", dout_rows, p.Dv, shapes);
    // The forward's weights bound for the model (section 12 starts from it).
    const Result<T> forward = scaled_dot_product_attention<T>(q, k, v, allowed_mask, options, oracle_options);
    detail::BoundInputs in;
    in.u = std::numeric_limits<C>::epsilon() / 2;
    in.scale_roundings = model.scale_roundings;
    in.weights_from_lse = model.backward_weights_from_lse;
    in.d_from_output = model.backward_d_from_output;
    in.exp_ulps = model.exp_ulps;
    in.log_ulps = model.log_ulps;
    in.stale_max = model.stale_max;
    in.shift_roundings = model.shift_roundings;
    in.rescalings = effective_rescalings(model, p.Tk);
    in.rounded_max_shift = model.rounded_max_shift;
    in.split_kv = model.split_kv;
    in.min_normal = static_cast<long double>(std::numeric_limits<C>::min());
    in.in_storage = model.probabilities_in_storage;
    in.u_storage = detail::StorageUnits<T>::u;
    in.half_denorm_storage = detail::StorageUnits<T>::half_denorm;
    if (model.gradual_underflow) {
        in.eta_mul = std::is_same_v<C, float> ? 0x1p-150L : 0x1p-1075L;
        in.eta_add = 0;
    } else {
        in.eta_mul = in.eta_add = static_cast<long double>(std::numeric_limits<C>::min());
    }
    // Section 12c: the multipliers broadcast to the scores (batch..., Tq, Tk), for the reference structure only.
    std::optional<TensorView<const double>> mult;
    std::vector<Index> mult_offsets;
    if (weight_multipliers) {
        if (model.backward_weights_from_lse || model.backward_d_from_output)
            throw ConfigError(function + ": weight_multipliers are bounded for a backward that keeps its weights and "
                                         "forms D from them (the reference structure), not for model " + model.name);
        Shape scores = p.batch_shape;
        scores.push_back(p.Tq);
        scores.push_back(p.Tk);
        mult = weight_multipliers->broadcast_to(scores, function, "weight_multipliers");
        mult_offsets = attn::detail::batch_offsets(*mult, static_cast<Index>(p.batch_shape.size()), p.batch_shape);
    }
    // Not covered (section 12): inputs a model may flush (denormals-are-zero).
    bool unbounded = false;
    std::vector<detail::ExactGradients> grads(static_cast<std::size_t>(p.batch));
    const Mp nan = std::numeric_limits<Mp>::quiet_NaN();
    for (Index b = 0; b < p.batch; ++b) {
        const Readability& r = readable[static_cast<std::size_t>(b)];
        detail::ExactHead h = detail::exact_head(p, r, b, dout_rows);
        if (mult) {
            h.mult.assign(static_cast<std::size_t>(p.Tq * p.Tk), Mp(0));
            const double* base = mult->data() + mult_offsets[static_cast<std::size_t>(b)];
            for (Index i = 0; i < p.Tq; ++i)
                for (Index j = 0; j < p.Tk; ++j) {
                    const double m = base[i * mult->stride(-2) + j * mult->stride(-1)];
                    if (!std::isfinite(m))
                        throw ValueError(function + ": weight_multipliers must be finite, got " + std::to_string(m) +
                                         " at batch index " + std::to_string(b) + ", query " + std::to_string(i) +
                                         ", key " + std::to_string(j));
                    h.mult[static_cast<std::size_t>(i * p.Tk + j)] = Mp(m);
                }
        }
        if (model.inputs_flushed)
            for (const auto* x : {&h.q, &h.k, &h.v, &h.dout})
                for (const Mp& y : *x)
                    if (y != 0 && abs(y) < std::numeric_limits<C>::min()) unbounded = true;
        in.weights_bound = forward.weights_bound.data() + b * p.Tq * p.Tk;
        in.logits_bound = forward.logits_bound.data() + b * p.Tq * p.Tk;
        in.output_bound = forward.output_bound.data() + b * p.Tq * p.Dv;
        detail::ExactGradients g = detail::exact_gradients(h, &in);
        if (options.empty_rows == EmptyRowPolicy::Nan)
            for (Index i = 0; i < p.Tq; ++i)
                if (!r.row_nonempty[static_cast<std::size_t>(i)])
                    std::fill_n(g.dq.begin() + i * p.Dk, p.Dk, nan);
        grads[static_cast<std::size_t>(b)] = std::move(g);
    }
    Gradients<T> result;
    result.bits = 261;
    result.model = model;
    using G = detail::ExactGradients;
    sum_and_round(grads, &G::dq, &G::dq_bound, q.shape(), p, p.Tq, p.Dk, "q", in.u, unbounded, result.dq,
                  result.dq_exact,
                  result.dq_exact_lo, result.dq_bound);
    sum_and_round(grads, &G::dk, &G::dk_bound, k.shape(), p, p.Tk, p.Dk, "k", in.u, unbounded, result.dk,
                  result.dk_exact,
                  result.dk_exact_lo, result.dk_bound);
    sum_and_round(grads, &G::dv, &G::dv_bound, v.shape(), p, p.Tk, p.Dv, "v", in.u, unbounded, result.dv,
                  result.dv_exact,
                  result.dv_exact_lo, result.dv_bound);
    return result;
}

#define ATTN_INSTANTIATE(T)                                                                                        \
    template Gradients<T> sdpa_backward<T>(TensorView<const T>, TensorView<const T>, TensorView<const T>,          \
                                           TensorView<const T>, std::optional<TensorView<const bool>>,              \
                                           const SdpaOptions&, const OracleOptions&,                                \
                                           std::optional<TensorView<const double>>);
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

}  // namespace attn::oracle
