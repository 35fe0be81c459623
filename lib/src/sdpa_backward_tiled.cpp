// The tiled backward of one batch element (FlashAttention-2's algorithm, [FA2] section 3.2): the weights recomputed
// block by block from the forward's saved log-sum-exp, P = Exp(s - lse), D from the forward's saved output,
// D_i = dout_i . out_i, and never a Tq x Tk matrix. Structure and rounding: attn/tiled.hpp (TiledBackwardInfo).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/tiled.hpp"
#include "backends.hpp"
#include "gemm.hpp"

namespace attn::detail {

namespace {

// One thread's buffers, kept from call to call (as the tiled forward's workspace): allocating and paging in a few MB
// per batch element on every call measured a tenth of the 2-thread time at T = 4096.
template <class T>
struct BackwardWorkspace {
    std::vector<T> qc, go, D, L, kc, vc, dkc, dvc, s, dp, g;
    std::vector<Index> begin, end, lo, hi, all_lo, all_hi;
};

template <class T>
BackwardWorkspace<T>& backward_workspace() {
    thread_local BackwardWorkspace<T> w;
    return w;
}

}  // namespace

template <class S, class T>
bool sdpa_backward_tiled_batch(const SdpaProblem<S>& p, const Readability& r, const SdpaOptions& options, Index b,
                               const SavedRows<S>& out, const SavedRows<S>& dout, const SavedRows<T>& lse, T* dq,
                               T* dk, T* dv) {
    const Index Tq = p.Tq, Dk = p.Dk, Dv = p.Dv;
    const T neg_inf = -std::numeric_limits<T>::infinity();
    const auto nonempty = [&](Index i) { return r.row_nonempty[static_cast<std::size_t>(i)] != 0; };
    const std::vector<Index> keys = readable_keys(r);
    const Index n = static_cast<Index>(keys.size());

    // 1. gather in the compute type: q and dout of the rows with an allowed key (the others 0), each such row's D
    // (dout . out, sequential over Dv) and lse (0 for the others: their logits are all -inf, so P = 0), and the
    // readable keys' k and v.
    BackwardWorkspace<T>& w = backward_workspace<T>();
    std::vector<T>&qc = w.qc, &go = w.go, &D = w.D, &L = w.L, &kc = w.kc, &vc = w.vc;
    qc.assign(static_cast<std::size_t>(Tq * Dk), T(0));
    go.assign(static_cast<std::size_t>(Tq * Dv), T(0));
    D.assign(static_cast<std::size_t>(Tq), T(0));
    L.assign(static_cast<std::size_t>(Tq), T(0));
    kc.resize(static_cast<std::size_t>(n * Dk));
    vc.resize(static_cast<std::size_t>(n * Dv));
    bool finite = true;
    const Index qs = p.q.stride(-1), ks = p.k.stride(-1), vs = p.v.stride(-1);
    for (Index i = 0; i < Tq; ++i) {
        if (!nonempty(i)) continue;
        for (Index d = 0; d < Dk; ++d) qc[i * Dk + d] = static_cast<T>(p.q_row(b, i)[d * qs]);
        T sum = 0;
        for (Index d = 0; d < Dv; ++d) {
            const T g = go[i * Dv + d] = static_cast<T>(dout.row(b, i)[d * dout.col_stride]);
            sum += g * static_cast<T>(out.row(b, i)[d * out.col_stride]);
        }
        D[static_cast<std::size_t>(i)] = sum;
        L[static_cast<std::size_t>(i)] = *lse.row(b, i);
        finite = finite && std::isfinite(sum) && std::isfinite(L[static_cast<std::size_t>(i)]);
    }
    for (Index c = 0; c < n; ++c) {
        for (Index d = 0; d < Dk; ++d) kc[c * Dk + d] = static_cast<T>(p.k_row(b, keys[c])[d * ks]);
        for (Index d = 0; d < Dv; ++d) vc[c * Dv + d] = static_cast<T>(p.v_row(b, keys[c])[d * vs]);
    }
    // With check_finite off a NaN or Inf may sit in a readable row (under check_finite none does): then the caller
    // runs the reference backward, whose products run over allowed pairs only, as the forward's do.
    const auto all_finite = [](const std::vector<T>& x) {
        return std::all_of(x.begin(), x.end(), [](T y) { return std::isfinite(y); });
    };
    if (!options.check_finite && !(finite && all_finite(qc) && all_finite(go) && all_finite(kc) && all_finite(vc)))
        return false;

    // Positional limits per row in readable-key indices, [begin, end); a row with no allowed key reads nothing.
    std::vector<Index>&begin = w.begin, &end = w.end;
    begin.assign(static_cast<std::size_t>(Tq), 0);
    end.assign(static_cast<std::size_t>(Tq), n);
    for (Index i = 0; i < Tq; ++i) {
        const auto x = static_cast<std::size_t>(i);
        if (!nonempty(i)) {
            begin[x] = end[x] = 0;
        } else if (p.positions.restricts()) {
            const KeyRange range = p.positions.keys(i, p.Tq, p.Tk);
            begin[x] = std::lower_bound(keys.begin(), keys.end(), range.begin) - keys.begin();
            end[x] = std::lower_bound(keys.begin(), keys.end(), range.end) - keys.begin();
        }
    }
    const Index Bq = options.tiled_query_block > 0 ? options.tiled_query_block : tiled_backward_info.query_block;
    const Index Bk = options.tiled_key_block > 0 ? options.tiled_key_block : tiled_backward_info.key_block;
    const Index q_blocks = (Tq + Bq - 1) / Bq;
    // Per query block: the union [lo, hi) of its rows' ranges and the intersection [all_lo, all_hi).
    std::vector<Index>&lo = w.lo, &hi = w.hi, &all_lo = w.all_lo, &all_hi = w.all_hi;
    lo.assign(static_cast<std::size_t>(q_blocks), n);
    hi.assign(lo.size(), 0);
    all_lo.assign(lo.size(), 0);
    all_hi.assign(lo.size(), n);
    for (Index i = 0; i < Tq; ++i) {
        const auto x = static_cast<std::size_t>(i), I = static_cast<std::size_t>(i / Bq);
        if (end[x] > begin[x]) lo[I] = std::min(lo[I], begin[x]), hi[I] = std::max(hi[I], end[x]);
        all_lo[I] = std::max(all_lo[I], begin[x]);
        all_hi[I] = std::min(all_hi[I], end[x]);
    }
    // Each logit needs a look of its own with an explicit mask or bias (a false or a -inf blocks a key), a cap or a
    // bias (applied per allowed logit); otherwise only on tiles a row's range cuts.
    const bool per_logit = p.allowed_mask || p.has_bias() || p.softcap != 0;
    const bool capped = p.softcap != 0;
    const T cap = static_cast<T>(p.softcap);

    std::vector<T>&dkc = w.dkc, &dvc = w.dvc, &s = w.s, &dp = w.dp, &g = w.g;
    dkc.assign(static_cast<std::size_t>(n * Dk), T(0));
    dvc.assign(static_cast<std::size_t>(n * Dv), T(0));
    std::fill_n(dq, Tq * Dk, T(0));
    s.resize(static_cast<std::size_t>(Bq * Bk));
    dp.resize(s.size());
    g.resize(capped ? s.size() : 0);
    // 2. key blocks outside, query blocks inside: dk and dv of a key block accumulate while it is in cache, dq of every
    // query block in dq; one thread per batch element, a fixed order: the same bits for any thread count.
    for (Index c0 = 0; c0 < n; c0 += Bk) {
        const Index nb = std::min(Bk, n - c0);
        for (Index I = 0; I < q_blocks; ++I) {
            const auto Ix = static_cast<std::size_t>(I);
            if (hi[Ix] <= c0 || lo[Ix] >= c0 + nb) continue;  // no row of the block reads a key of this block
            const Index i0 = I * Bq, rows = std::min(Bq, Tq - i0);
            // s (rows, nb) = scale q_I k_J^T
            gemm<T>(false, true, rows, nb, Dk, static_cast<T>(p.scale), qc.data() + i0 * Dk, Dk, 1,
                    kc.data() + c0 * Dk, Dk, 1, T(0), s.data(), nb, 1);
            // 3. blocked logits -inf, allowed ones finite (check_finite), capped, biased: the forward's logits.
            const bool cut = all_lo[Ix] > c0 || all_hi[Ix] < c0 + nb;
            if (cut || per_logit) {
                for (Index rr = 0; rr < rows; ++rr) {
                    const Index i = i0 + rr;
                    T* row = s.data() + rr * nb;
                    const Index cb = std::clamp<Index>(begin[static_cast<std::size_t>(i)] - c0, 0, nb);
                    const Index ce = std::clamp<Index>(end[static_cast<std::size_t>(i)] - c0, cb, nb);
                    std::fill_n(row, cb, neg_inf);
                    std::fill(row + ce, row + nb, neg_inf);
                    for (Index c = cb; c < ce; ++c) {
                        if ((p.allowed_mask || p.bias) && !p.allowed(b, i, keys[c0 + c])) {
                            row[c] = neg_inf;
                        } else if (options.check_finite && !std::isfinite(row[c])) {
                            throw_overflow(p.function, "a logit (scale * q k^T)", p.batch_index_string(b), i, p.shapes);
                        }
                    }
                }
            } else if (options.check_finite) {
                for (Index x = 0; x < rows * nb; ++x)
                    if (!std::isfinite(s[static_cast<std::size_t>(x)]))
                        throw_overflow(p.function, "a logit (scale * q k^T)", p.batch_index_string(b), i0 + x / nb,
                                       p.shapes);
            }
            if (capped) {
                tiled_softcap<T>(s.data(), rows * nb, cap);  // -inf passes
                for (Index x = 0; x < rows * nb; ++x) {
                    const T t = s[static_cast<std::size_t>(x)] / cap;
                    g[static_cast<std::size_t>(x)] = s[static_cast<std::size_t>(x)] == neg_inf ? T(0) : T(1) - t * t;
                }
            }
            if (p.has_bias())
                for (Index rr = 0; rr < rows; ++rr)
                    for (Index c = 0; c < nb; ++c) {
                        T& x = s[static_cast<std::size_t>(rr * nb + c)];
                        if (x == neg_inf) continue;  // blocked
                        x += p.bias_at(b, i0 + rr, keys[c0 + c]);
                        if (options.check_finite && !std::isfinite(x))
                            throw_overflow(p.function, "a logit plus its bias", p.batch_index_string(b), i0 + rr,
                                           p.shapes);
                    }
            // 4. P = Exp(fl(s - lse)) in place (blocked: Exp(-inf) = 0).
            for (Index rr = 0; rr < rows; ++rr) {
                const T l = L[static_cast<std::size_t>(i0 + rr)];
                T* row = s.data() + rr * nb;
                for (Index c = 0; c < nb; ++c) row[c] -= l;
            }
            tiled_exp<T>(s.data(), rows * nb);
            // 5. dv_J += P^T dout_I; dP = dout_I v_J^T; dS = P (dP - D) (times the cap's derivative);
            // dk_J += dS^T q_I; dq_I += dS k_J (the scale of dq and dk once, at the end).
            gemm<T>(true, false, nb, Dv, rows, T(1), s.data(), nb, 1, go.data() + i0 * Dv, Dv, 1, T(1),
                    dvc.data() + c0 * Dv, Dv, 1);
            gemm<T>(false, true, rows, nb, Dv, T(1), go.data() + i0 * Dv, Dv, 1, vc.data() + c0 * Dv, Dv, 1, T(0),
                    dp.data(), nb, 1);
            for (Index rr = 0; rr < rows; ++rr) {
                const T Di = D[static_cast<std::size_t>(i0 + rr)];
                T* x = dp.data() + rr * nb;
                const T* P = s.data() + rr * nb;
                for (Index c = 0; c < nb; ++c) x[c] = P[c] * (x[c] - Di);
                if (capped)
                    for (Index c = 0; c < nb; ++c) x[c] *= g[static_cast<std::size_t>(rr * nb + c)];
            }
            gemm<T>(true, false, nb, Dk, rows, T(1), dp.data(), nb, 1, qc.data() + i0 * Dk, Dk, 1, T(1),
                    dkc.data() + c0 * Dk, Dk, 1);
            gemm<T>(false, false, rows, Dk, nb, T(1), dp.data(), nb, 1, kc.data() + c0 * Dk, Dk, 1, T(1),
                    dq + i0 * Dk, Dk, 1);
        }
    }
    const T scale = static_cast<T>(p.scale);
    for (Index x = 0; x < Tq * Dk; ++x) dq[x] *= scale;
    for (T& x : dkc) x *= scale;
    finish_backward_batch(p, r, options, b, keys, dkc, dvc, dq, dk, dv);
    return true;
}

#define ATTN_INSTANTIATE(S)                                                                                        \
    template bool sdpa_backward_tiled_batch<S, compute_t<S>>(                                                      \
        const SdpaProblem<S>&, const Readability&, const SdpaOptions&, Index, const SavedRows<S>&,                 \
        const SavedRows<S>&, const SavedRows<compute_t<S>>&, compute_t<S>*, compute_t<S>*, compute_t<S>*);
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

}  // namespace attn::detail
