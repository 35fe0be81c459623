// mha_reference.hpp (tests only): a straightforward long-double multi-head attention and its forward error bound.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "attn/mha.hpp"

namespace attn::testing {

using LD = long double;

// Letters as in attn/mha.hpp. All arrays are row-major std::vector<LD>.
struct RefModule {
    Index E = 0, H = 0, G = 0, Dh = 0, kdim = 0, vdim = 0;
    std::vector<LD> Wq, Wk, Wv, Wo, bq, bk, bv, bo;  // PyTorch layouts; biases all-zero when the module has none
};

template <class T>
std::vector<LD> to_ld(TensorView<const T> view) {
    std::vector<LD> out;
    out.reserve(static_cast<std::size_t>(view.numel()));
    for_each_index(view.shape(), [&](std::span<const Index> idx) { out.push_back(static_cast<LD>(view.at(idx))); });
    return out;
}

template <class T>
RefModule ref_module(const MultiHeadAttention<T>& m) {
    RefModule r;
    r.E = m.embed_dim(), r.H = m.num_heads(), r.G = m.num_kv_heads(), r.Dh = m.head_dim(), r.kdim = m.kdim(),
    r.vdim = m.vdim();
    r.Wq = to_ld(m.q_proj_weight()), r.Wk = to_ld(m.k_proj_weight()), r.Wv = to_ld(m.v_proj_weight());
    r.Wo = to_ld(m.out_proj_weight());
    const auto bias = [&](TensorView<const T> b, Index n) {
        return b.numel() ? to_ld(b) : std::vector<LD>(static_cast<std::size_t>(n), 0);
    };
    r.bq = bias(m.q_proj_bias(), r.E), r.bk = bias(m.k_proj_bias(), r.G * r.Dh);
    r.bv = bias(m.v_proj_bias(), r.G * r.Dh), r.bo = bias(m.out_proj_bias(), r.E);
    return r;
}

struct RefInputs {
    Index B = 0, Tq = 0, Tk = 0;
    std::vector<LD> xq, xk, xv;  // (B, Tq, E), (B, Tk, kdim), (B, Tk, vdim)
    std::vector<char> allowed;   // (B, H, Tq, Tk): masks, key padding and the causal rule already combined
};

struct RefResult {
    std::vector<LD> output, output_bound;    // (B, Tq, E)
    std::vector<LD> weights, weights_bound;  // (B, H, Tq, Tk); after dropout when given
    std::vector<LD> average, average_bound;  // (B, Tq, Tk)
};

// gamma_n = n u / (1 - n u) (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Lemma 3.1).
inline LD gamma(Index n, LD u) { return static_cast<LD>(n) * u / (1 - static_cast<LD>(n) * u); }

// Exact-input value of the module (in long double) and, per element, a bound on |computed - exact| for an
// implementation in a floating type of unit roundoff u that follows the library's structure. Derivation (every
// magnitude below is evaluated in long double from the exact values):
//  1. Projection y = x W^T + b, dot length n plus the bias (BLIS accumulates in any order, with or without FMA):
//       |dy| <= gamma_{n+1} (sum |x||W| + |b|)                                        (Higham eq. 3.5)
//  2. Logit s_j = c sum_d q_d k_jd with c = fl(1/sqrt(Dh)) (rounded twice: 2u) and gemm's alpha multiply (u):
//       |ds_j| <= c [sum (|dq||k| + |q||dk| + |dq||dk|) + gamma_{Dh+3} sum (|q|+|dq|)(|k|+|dk|)]
//  3. Softmax over the n allowed keys, computed as exp(s_j - m) / sum: the subtraction adds u|s_j - m|, so every
//     exponent is off by at most D = max_j (|ds_j| + u (|s_j - m| + 2 max_k |ds_k|)); the shift cancels in the
//     ratio, which therefore lies in p_j [e^{-2D}, e^{2D}]. exp is within 1 ulp (<= 2u relative; glibc's
//     documented maximum for exp/expf on x86_64), the sum of n positive terms within gamma_{n-1}, the division u:
//       |dp_j| <= p_j rho,  rho = max(e^{2D}(1+2u)(1+u) / ((1-2u)(1-gamma_{n-1})) - 1,
//                                    1 - e^{-2D}(1-2u)(1-u) / ((1+2u)(1+gamma_{n-1})))
//  4. Context o = sum_j p_j v_j over the n allowed keys (blocked keys add exact zeros):
//       |do| <= sum_j p_j [rho (|v_j|+|dv_j|) + |dv_j| + gamma_n (1+rho)(|v_j|+|dv_j|)]
//  5. Merge is a copy. Output = o Wo^T + bo:  |dout| <= sum |Wo||do| + gamma_{E+1} (sum |Wo|(|o|+|do|) + |bo|).
//  Head average: |d avg| <= (1/H) sum_h p_h rho_h + gamma_H (1/H) sum_h p_h (1 + rho_h).
// Steps 1, 2, 4 and 5 are exact bounds, step 3 is exact given the exponent bound; nothing is first-order only.
// The comparison target is itself long double: the bound is increasing and convex in u with value 0 at u = 0,
// so bound(u_T) + bound(u_LD) <= bound(u_T + u_LD): callers pass u = u_T + 2^-64.
// A query row with no allowed key (EmptyRowPolicy::Zero) contributes a zero context with bound 0.
// When `given_weights` (B, H, Tq, Tk) is passed (dropout), steps 2-3 are skipped: those exact weights are used and
// only the errors of steps 1, 4, 5 remain (rho = 0 in step 4).
inline RefResult ref_mha(const RefModule& m, const RefInputs& in, LD u, std::optional<LD> scale = std::nullopt,
                         const std::vector<LD>* given_weights = nullptr) {
    const Index B = in.B, Tq = in.Tq, Tk = in.Tk, E = m.E, H = m.H, Dh = m.Dh, R = m.H / m.G;
    const Index KV = m.G * m.Dh;
    const auto project = [&](const std::vector<LD>& x, Index rows, Index width, const std::vector<LD>& W,
                             const std::vector<LD>& b, Index out, std::vector<LD>& y, std::vector<LD>& e) {
        y.assign(static_cast<std::size_t>(rows * out), 0);
        e.assign(static_cast<std::size_t>(rows * out), 0);
        for (Index t = 0; t < rows; ++t)
            for (Index c = 0; c < out; ++c) {
                LD s = b[c], mag = std::fabs(b[c]);
                for (Index i = 0; i < width; ++i) {
                    s += x[t * width + i] * W[c * width + i];
                    mag += std::fabs(x[t * width + i] * W[c * width + i]);
                }
                y[t * out + c] = s;
                e[t * out + c] = gamma(width + 1, u) * mag;
            }
    };
    std::vector<LD> q, eq, k, ek, v, ev;
    project(in.xq, B * Tq, E, m.Wq, m.bq, E, q, eq);
    project(in.xk, B * Tk, m.kdim, m.Wk, m.bk, KV, k, ek);
    project(in.xv, B * Tk, m.vdim, m.Wv, m.bv, KV, v, ev);

    RefResult r;
    r.weights.assign(static_cast<std::size_t>(B * H * Tq * Tk), 0);
    r.weights_bound.assign(r.weights.size(), 0);
    std::vector<LD> o(static_cast<std::size_t>(B * Tq * E), 0), eo(o.size(), 0), rho_of(static_cast<std::size_t>(B * H * Tq), 0);
    const LD c = scale ? *scale : 1 / std::sqrt(static_cast<LD>(Dh));
    for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h) {
            const Index g = h / R;
            for (Index i = 0; i < Tq; ++i) {
                const char* allowed = in.allowed.data() + ((b * H + h) * Tq + i) * Tk;
                const LD* qi = q.data() + (b * Tq + i) * E + h * Dh;
                const LD* eqi = eq.data() + (b * Tq + i) * E + h * Dh;
                LD* p = r.weights.data() + ((b * H + h) * Tq + i) * Tk;
                LD* pb = r.weights_bound.data() + ((b * H + h) * Tq + i) * Tk;
                Index n = 0;
                for (Index j = 0; j < Tk; ++j) n += allowed[j] != 0;
                if (n == 0) continue;  // Zero policy: context row 0, weights 0
                LD rho = 0;
                if (given_weights) {
                    for (Index j = 0; j < Tk; ++j) p[j] = (*given_weights)[((b * H + h) * Tq + i) * Tk + j];
                } else {
                    std::vector<LD> s(static_cast<std::size_t>(Tk), 0), ds(s.size(), 0);
                    LD smax = -INFINITY, dsmax = 0;
                    for (Index j = 0; j < Tk; ++j) {
                        if (!allowed[j]) continue;
                        const LD* kj = k.data() + (b * Tk + j) * KV + g * Dh;
                        const LD* ekj = ek.data() + (b * Tk + j) * KV + g * Dh;
                        LD dot = 0, mixed = 0, mag = 0;
                        for (Index d = 0; d < Dh; ++d) {
                            dot += qi[d] * kj[d];
                            mixed += eqi[d] * std::fabs(kj[d]) + std::fabs(qi[d]) * ekj[d] + eqi[d] * ekj[d];
                            mag += (std::fabs(qi[d]) + eqi[d]) * (std::fabs(kj[d]) + ekj[d]);
                        }
                        s[j] = c * dot;
                        ds[j] = c * (mixed + gamma(Dh + 3, u) * mag);
                        smax = std::max(smax, s[j]);
                        dsmax = std::max(dsmax, ds[j]);
                    }
                    LD sum = 0, D = 0;
                    for (Index j = 0; j < Tk; ++j) {
                        if (!allowed[j]) continue;
                        p[j] = std::exp(s[j] - smax);
                        sum += p[j];
                        D = std::max(D, ds[j] + u * (std::fabs(s[j] - smax) + 2 * dsmax));
                    }
                    for (Index j = 0; j < Tk; ++j) p[j] /= sum;
                    const LD gs = gamma(n - 1, u);
                    rho = std::max(std::exp(2 * D) * (1 + 2 * u) * (1 + u) / ((1 - 2 * u) * (1 - gs)) - 1,
                                   1 - std::exp(-2 * D) * (1 - 2 * u) * (1 - u) / ((1 + 2 * u) * (1 + gs)));
                    for (Index j = 0; j < Tk; ++j) pb[j] = p[j] * rho;
                }
                rho_of[static_cast<std::size_t>((b * H + h) * Tq + i)] = rho;
                for (Index d = 0; d < Dh; ++d) {
                    LD acc = 0, err = 0;
                    for (Index j = 0; j < Tk; ++j) {
                        if (!allowed[j]) continue;
                        const LD vj = v[(b * Tk + j) * KV + g * Dh + d], evj = ev[(b * Tk + j) * KV + g * Dh + d];
                        const LD pj = std::fabs(p[j]);
                        acc += p[j] * vj;
                        err += pj * (rho * (std::fabs(vj) + evj) + evj + gamma(n, u) * (1 + rho) * (std::fabs(vj) + evj));
                    }
                    o[(b * Tq + i) * E + h * Dh + d] = acc;
                    eo[(b * Tq + i) * E + h * Dh + d] = err;
                }
            }
        }
    r.output.assign(static_cast<std::size_t>(B * Tq * E), 0);
    r.output_bound.assign(r.output.size(), 0);
    for (Index t = 0; t < B * Tq; ++t)
        for (Index e = 0; e < E; ++e) {
            LD s = m.bo[e], mag = std::fabs(m.bo[e]), prop = 0;
            for (Index cc = 0; cc < E; ++cc) {
                const LD w = m.Wo[e * E + cc];
                s += w * o[t * E + cc];
                mag += std::fabs(w) * (std::fabs(o[t * E + cc]) + eo[t * E + cc]);
                prop += std::fabs(w) * eo[t * E + cc];
            }
            r.output[t * E + e] = s;
            r.output_bound[t * E + e] = prop + gamma(E + 1, u) * mag;
        }
    r.average.assign(static_cast<std::size_t>(B * Tq * Tk), 0);
    r.average_bound.assign(r.average.size(), 0);
    for (Index b = 0; b < B; ++b)
        for (Index i = 0; i < Tq; ++i)
            for (Index j = 0; j < Tk; ++j) {
                LD s = 0, e = 0, mag = 0;
                for (Index h = 0; h < H; ++h) {
                    const LD p = r.weights[((b * H + h) * Tq + i) * Tk + j];
                    const LD rho = rho_of[static_cast<std::size_t>((b * H + h) * Tq + i)];
                    s += p, e += std::fabs(p) * rho, mag += std::fabs(p) * (1 + rho);
                }
                r.average[(b * Tq + i) * Tk + j] = s / static_cast<LD>(H);
                r.average_bound[(b * Tq + i) * Tk + j] = (e + gamma(H, u) * mag) / static_cast<LD>(H);
            }
    return r;
}

// Unit roundoff of T plus long double's (the reference's own rounding, see ref_mha).
template <class T>
LD comparison_unit_roundoff() {
    return static_cast<LD>(std::numeric_limits<T>::epsilon()) / 2 + std::ldexp(LD(1), -64);
}

// The allowed flags (B, H, Tq, Tk) of a mask view broadcast to that shape, and-ed with the causal rule.
inline std::vector<char> expand_allowed(std::optional<TensorView<const bool>> allowed4, Index B, Index H, Index Tq,
                                        Index Tk, bool is_causal, CausalAlignment alignment) {
    std::vector<char> out(static_cast<std::size_t>(B * H * Tq * Tk), 1);
    std::optional<TensorView<const bool>> full;
    if (allowed4) full = allowed4->broadcast_to({B, H, Tq, Tk}, "expand_allowed", "allowed");
    for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h)
            for (Index i = 0; i < Tq; ++i)
                for (Index j = 0; j < Tk; ++j) {
                    bool ok = !is_causal || causal_allows(i, j, Tq, Tk, alignment);
                    if (full) ok = ok && (*full)({b, h, i, j});
                    out[static_cast<std::size_t>(((b * H + h) * Tq + i) * Tk + j)] = ok;
                }
    return out;
}

// Largest |computed - reference| / bound over all elements (0/0 counts as 0); NaN or Inf in `computed` fails
// outright by returning +inf.
template <class T>
LD max_error_ratio(const T* computed, const std::vector<LD>& reference, const std::vector<LD>& bound) {
    LD worst = 0;
    for (std::size_t f = 0; f < reference.size(); ++f) {
        if (!std::isfinite(computed[f])) return INFINITY;
        const LD err = std::fabs(static_cast<LD>(computed[f]) - reference[f]);
        if (err == 0) continue;
        worst = std::max(worst, bound[f] > 0 ? err / bound[f] : LD(INFINITY));
    }
    return worst;
}

}  // namespace attn::testing
