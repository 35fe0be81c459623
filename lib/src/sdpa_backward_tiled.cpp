// The tiled backward of one batch element (FlashAttention-2's algorithm, [FA2] section 3.2): the weights recomputed
// block by block from the forward's saved log-sum-exp, P = Exp(s - lse), D from the forward's saved output,
// D_i = dout_i . out_i, and never a Tq x Tk matrix. Structure and rounding: attn/tiled.hpp (TiledBackwardInfo).
//
// The five products of a tile run on packed_gemm's micro-kernels (gemm.hpp), on operands packed once: q and dout per
// batch element, k and v per key block. The tiles (s, then P; dP, then dS) are written by the micro-kernels in the
// layout of a packed B operand over keys, so the products that read P and dS with the queries as depth,
// dv^T += dout^T P and dk^T += q^T dS, read them where they were computed; only dq += dS k reads dS the other way
// round, packed from it as it is formed. Each dot product is a sequential sum, as BLIS's, so the bits are those of
// general gemms on the same blocks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attn/tiled.hpp"
#include "backends.hpp"
#include "gemm.hpp"

namespace attn::detail {

namespace {

// Packs `lanes` x `depth` values of a strided matrix as packed_gemm operand panels of `width` lanes: panel j holds
// depth p, lane l at dst[j * ps + p * width + l] = src[(j * width + l) * lane_stride + p * depth_stride], 0 for lanes
// past the last. An A operand packs its rows as lanes (width mr), a B operand its columns (width nr).
template <class T>
void pack_panels(const T* src, Index lane_stride, Index depth_stride, Index lanes, Index depth, Index width, T* dst,
                 Index ps) {
    for (Index j0 = 0; j0 < lanes; j0 += width) {
        T* d = dst + (j0 / width) * ps;
        const Index used = std::min(width, lanes - j0);
        for (Index p = 0; p < depth; ++p) {
            T* row = d + p * width;
            const T* from = src + j0 * lane_stride + p * depth_stride;
            for (Index l = 0; l < used; ++l) row[l] = from[l * lane_stride];
            std::fill(row + used, row + width, T(0));
        }
    }
}

// Whether the first `count` values of each of `panel_count` panels (`ps` apart) are all finite: x * 0 is 0 for a
// finite x and NaN otherwise, summed per position of a 16-wide block so that the loop vectorises (no reduction
// across lanes until the end).
template <class T>
bool all_finite_tile(const T* x, Index panel_count, Index ps, Index count) {
    constexpr Index W = 16;
    T acc[W] = {};
    for (Index j = 0; j < panel_count; ++j) {
        const T* v = x + j * ps;
        Index e = 0;
        for (; e + W <= count; e += W)
            for (Index l = 0; l < W; ++l) acc[l] += v[e + l] * T(0);
        for (; e < count; ++e) acc[0] += v[e] * T(0);
    }
    T sum = 0;
    for (T a : acc) sum += a;
    return sum == T(0);
}

Index panels(Index lanes, Index width) { return round_up(lanes, width) / width; }

// Sizes of one batch element's products, from the micro-tile (mr x nr) and the blocks (Bq x Bk). Panel strides are
// in elements, multiples of 16 (packed_gemm's alignment).
struct Layout {
    Index mr, nr, Bq, Bk;
    Index q_panels;  // mr panels over the queries of a block
    Index ps_q;      // q as A over queries (depth Dk)
    Index ps_do;     // dout as A over queries (depth Dv)
    Index ps_t;      // q^T and dout^T as A over Dk and Dv (depth: the queries of a block)
    Index ps_kt;     // k^T as B over keys (depth Dk)
    Index ps_vt;     // v^T as B over keys (depth Dv)
    Index ps_k;      // k as B over Dk (depth: the keys of a block)
    Index ps_s;      // a tile (s, P, dP, dS) as B over keys (depth: the queries of a block)
    Index ps_ds;     // dS as A over queries (depth: the keys of a block)
    Index dk_m, dv_m, dk_n;  // Dk and Dv in mr panels, Dk in nr panels
    Index key_n;             // a key block in nr panels
    Index q_block, do_block, qt_block, dot_block;  // elements per query block of each packed operand

    Layout(const MicroTile& t, Index Bq_, Index Bk_, Index Dk, Index Dv) : mr(t.mr), nr(t.nr), Bq(Bq_), Bk(Bk_) {
        q_panels = panels(Bq, mr);
        ps_q = round_up(Dk * mr, 16), ps_do = round_up(Dv * mr, 16), ps_t = round_up(Bq * mr, 16);
        ps_kt = round_up(Dk * nr, 16), ps_vt = round_up(Dv * nr, 16), ps_k = round_up(Bk * nr, 16);
        ps_s = round_up(q_panels * mr * nr, 16), ps_ds = round_up(Bk * mr, 16);
        dk_m = panels(Dk, mr), dv_m = panels(Dv, mr), dk_n = panels(Dk, nr), key_n = panels(Bk, nr);
        q_block = q_panels * ps_q, do_block = q_panels * ps_do, qt_block = dk_m * ps_t, dot_block = dv_m * ps_t;
    }
};

// One thread's buffers, kept from call to call (as the tiled forward's workspace): allocating and paging in a few MB
// per batch element on every call measured a tenth of the 2-thread time at T = 4096.
template <class T>
struct BackwardWorkspace {
    std::vector<T> D, L, kc, vc, dkc, dvc;
    PackedBuffer<T> qa, doa, qt, dot;   // per query block: q, dout (A over queries), q^T, dout^T (A over dims)
    PackedBuffer<T> kt, vt, kb;         // the current key block: k^T, v^T (B over keys), k (B over Dk)
    PackedBuffer<T> s, dp, g, ds;       // one tile: s then P, dP then dS, the cap's derivative, dS as A
    PackedBuffer<T> dkt, dvt, dqa;      // dk^T and dv^T of the key block (dims x keys), dq of every query block
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

    const Index Bq = options.tiled_query_block > 0 ? options.tiled_query_block : tiled_backward_info.query_block;
    const Index Bk = options.tiled_key_block > 0 ? options.tiled_key_block : tiled_backward_info.key_block;
    const Index q_blocks = (Tq + Bq - 1) / Bq;
    const Layout Y(micro_tile<T>(), Bq, Bk, Dk, Dv);
    const Index mr = Y.mr, nr = Y.nr;

    // 1. gather in the compute type: q and dout of the rows with an allowed key (the others 0), packed per query
    // block both ways round (rows as lanes with the dims as depth, and the dims as lanes with the rows as depth),
    // each such row's D (dout . out, sequential over Dv) and lse (0 for the others: their logits are all -inf, so
    // P = 0), and the readable keys' k and v.
    BackwardWorkspace<T>& w = backward_workspace<T>();
    std::vector<T>&D = w.D, &L = w.L, &kc = w.kc, &vc = w.vc;
    T* qa = w.qa.get(q_blocks * Y.q_block);
    T* doa = w.doa.get(q_blocks * Y.do_block);
    T* qt = w.qt.get(q_blocks * Y.qt_block);
    T* dot = w.dot.get(q_blocks * Y.dot_block);
    std::fill_n(qa, q_blocks * Y.q_block, T(0));
    std::fill_n(doa, q_blocks * Y.do_block, T(0));
    std::fill_n(qt, q_blocks * Y.qt_block, T(0));
    std::fill_n(dot, q_blocks * Y.dot_block, T(0));
    D.assign(static_cast<std::size_t>(Tq), T(0));
    L.assign(static_cast<std::size_t>(Tq), T(0));
    kc.resize(static_cast<std::size_t>(n * Dk));
    vc.resize(static_cast<std::size_t>(n * Dv));
    T nonfinite = 0;  // x * 0 summed: NaN once a value read is not finite
    const Index qs = p.q.stride(-1), ks = p.k.stride(-1), vs = p.v.stride(-1);
    for (Index i = 0; i < Tq; ++i) {
        if (!nonempty(i)) continue;
        const Index I = i / Bq, rr = i % Bq;
        // (row rr, dim d) at *_rows[d * mr] (A over queries) and *_dims[(d / mr) * ps_t + d % mr] (A over dims)
        T* q_rows = qa + I * Y.q_block + (rr / mr) * Y.ps_q + rr % mr;
        T* q_dims = qt + I * Y.qt_block + rr * mr;
        for (Index d0 = 0; d0 < Dk; d0 += mr)
            for (Index d = d0; d < std::min(Dk, d0 + mr); ++d) {
                const T x = static_cast<T>(p.q_row(b, i)[d * qs]);
                q_rows[d * mr] = q_dims[(d0 / mr) * Y.ps_t + d - d0] = x;
                nonfinite += x * T(0);
            }
        T* g_rows = doa + I * Y.do_block + (rr / mr) * Y.ps_do + rr % mr;
        T* g_dims = dot + I * Y.dot_block + rr * mr;
        T sum = 0;
        for (Index d0 = 0; d0 < Dv; d0 += mr)
            for (Index d = d0; d < std::min(Dv, d0 + mr); ++d) {
                const T x = static_cast<T>(dout.row(b, i)[d * dout.col_stride]);
                g_rows[d * mr] = g_dims[(d0 / mr) * Y.ps_t + d - d0] = x;
                sum += x * static_cast<T>(out.row(b, i)[d * out.col_stride]);
                nonfinite += x * T(0);
            }
        D[static_cast<std::size_t>(i)] = sum;
        L[static_cast<std::size_t>(i)] = *lse.row(b, i);
        nonfinite += (sum + L[static_cast<std::size_t>(i)]) * T(0);
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
    if (!options.check_finite && !(nonfinite == T(0) && all_finite(kc) && all_finite(vc))) return false;

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

    const Index dq_ld = Y.dk_n * nr;  // dq of query block I: rows of dq_ld at dqa + I * q_panels * mr * dq_ld
    T* dqa = w.dqa.get(std::max<Index>(q_blocks * Y.q_panels * mr * dq_ld, 1));
    std::fill_n(dqa, q_blocks * Y.q_panels * mr * dq_ld, T(0));
    T* kt = w.kt.get(Y.key_n * Y.ps_kt);
    T* vt = w.vt.get(Y.key_n * Y.ps_vt);
    T* kb = w.kb.get(std::max<Index>(Y.dk_n * Y.ps_k, 1));
    T* s = w.s.get(Y.key_n * Y.ps_s);
    T* dp = w.dp.get(Y.key_n * Y.ps_s);
    T* g = capped ? w.g.get(Y.key_n * Y.ps_s) : nullptr;
    T* ds = w.ds.get(Y.q_panels * Y.ps_ds);
    const Index key_ld = Y.key_n * nr;  // dk^T, dv^T: rows of key_ld
    T* dkt = w.dkt.get(std::max<Index>(Y.dk_m * mr * key_ld, 1));
    T* dvt = w.dvt.get(std::max<Index>(Y.dv_m * mr * key_ld, 1));

    std::vector<T>&dkc = w.dkc, &dvc = w.dvc;
    dkc.assign(static_cast<std::size_t>(n * Dk), T(0));
    dvc.assign(static_cast<std::size_t>(n * Dv), T(0));
    // 2. key blocks outside, query blocks inside: dk and dv of a key block accumulate while it is in cache, dq of every
    // query block in dqa; one thread per batch element, a fixed order: the same bits for any thread count.
    for (Index c0 = 0; c0 < n; c0 += Bk) {
        const Index nb = std::min(Bk, n - c0), key_panels = panels(nb, nr);
        pack_panels(kc.data() + c0 * Dk, Dk, 1, nb, Dk, nr, kt, Y.ps_kt);
        pack_panels(vc.data() + c0 * Dv, Dv, 1, nb, Dv, nr, vt, Y.ps_vt);
        pack_panels(kc.data() + c0 * Dk, 1, Dk, Dk, nb, nr, kb, Y.ps_k);
        std::fill_n(dkt, Y.dk_m * mr * key_ld, T(0));
        std::fill_n(dvt, Y.dv_m * mr * key_ld, T(0));
        for (Index I = 0; I < q_blocks; ++I) {
            const auto Ix = static_cast<std::size_t>(I);
            if (hi[Ix] <= c0 || lo[Ix] >= c0 + nb) continue;  // no row of the block reads a key of this block
            const Index i0 = I * Bq, rows = std::min(Bq, Tq - i0), row_panels = panels(rows, mr);
            // The tile's element (row rr, key c) sits at tile + (c / nr) * ps_s + rr * nr + c % nr; for_each_key
            // walks a row's keys panel by panel.
            const auto for_each_key = [&](T* tile, Index rr, auto&& f) {
                for (Index j0 = 0; j0 < nb; j0 += nr) {
                    T* seg = tile + (j0 / nr) * Y.ps_s + rr * nr;
                    const Index used = std::min(nr, nb - j0);
                    for (Index l = 0; l < used; ++l) f(j0 + l, seg[l]);
                }
            };
            // s (rows, nb) = scale q_I k_J^T
            packed_gemm<T>(row_panels, key_panels, Dk, static_cast<T>(p.scale), qa + I * Y.q_block, Y.ps_q, kt, Y.ps_kt,
                           T(0), s, nr, 1, mr * nr, Y.ps_s);
            // 3. blocked logits -inf, allowed ones finite (check_finite), capped, biased: the forward's logits. Keys
            // past nb in the last panel -inf too (P = 0 there), after the finite check, which reads whole panels.
            const bool cut = all_lo[Ix] > c0 || all_hi[Ix] < c0 + nb;
            const auto logit_overflowed = [&](Index i) {
                throw_overflow(p.function, "a logit (scale * q k^T)", p.batch_index_string(b), i, p.shapes);
            };
            if (cut || per_logit) {
                for (Index rr = 0; rr < rows; ++rr) {
                    const Index i = i0 + rr;
                    const Index cb = std::clamp<Index>(begin[static_cast<std::size_t>(i)] - c0, 0, nb);
                    const Index ce = std::clamp<Index>(end[static_cast<std::size_t>(i)] - c0, cb, nb);
                    for_each_key(s, rr, [&](Index c, T& x) {
                        if (c < cb || c >= ce || ((p.allowed_mask || p.bias) && !p.allowed(b, i, keys[c0 + c])))
                            x = neg_inf;
                        else if (options.check_finite && !std::isfinite(x))
                            logit_overflowed(i);
                    });
                }
            } else if (options.check_finite && !all_finite_tile(s, key_panels, Y.ps_s, rows * nr)) {
                for (Index rr = 0; rr < rows; ++rr)
                    for_each_key(s, rr, [&](Index, T& x) {
                        if (!std::isfinite(x)) logit_overflowed(i0 + rr);
                    });
            }
            if (nb % nr != 0)
                for (Index rr = 0; rr < rows; ++rr)
                    std::fill_n(s + (key_panels - 1) * Y.ps_s + rr * nr + nb % nr, nr - nb % nr, neg_inf);
            if (capped)
                for (Index j = 0; j < key_panels; ++j) {
                    T* x = s + j * Y.ps_s;
                    tiled_softcap<T>(x, rows * nr, cap);  // -inf passes
                    for (Index e = 0; e < rows * nr; ++e) {
                        const T t = x[e] / cap;
                        g[j * Y.ps_s + e] = x[e] == neg_inf ? T(0) : T(1) - t * t;
                    }
                }
            if (p.has_bias())
                for (Index rr = 0; rr < rows; ++rr)
                    for_each_key(s, rr, [&](Index c, T& x) {
                        if (x == neg_inf) return;  // blocked
                        x += p.bias_at(b, i0 + rr, keys[c0 + c]);
                        if (options.check_finite && !std::isfinite(x))
                            throw_overflow(p.function, "a logit plus its bias", p.batch_index_string(b), i0 + rr,
                                           p.shapes);
                    });
            // 4. P = Exp(fl(s - lse)) in place (blocked: Exp(-inf) = 0); rows past `rows` stay 0 (q's padding).
            for (Index j = 0; j < key_panels; ++j) {
                T* x = s + j * Y.ps_s;
                for (Index rr = 0; rr < rows; ++rr) {
                    const T l = L[static_cast<std::size_t>(i0 + rr)];
                    for (Index c = 0; c < nr; ++c) x[rr * nr + c] -= l;
                }
                tiled_exp<T>(x, rows * nr);
            }
            // 5. dv_J^T += dout_I^T P; dP = dout_I v_J^T; dS = P (dP - D) (times the cap's derivative), also packed
            // as A over queries; dk_J^T += q_I^T dS; dq_I += dS k_J (the scale of dq and dk once, at the end).
            packed_gemm<T>(Y.dv_m, key_panels, rows, T(1), dot + I * Y.dot_block, Y.ps_t, s, Y.ps_s, T(1), dvt, key_ld,
                           1, mr * key_ld, nr);
            packed_gemm<T>(row_panels, key_panels, Dv, T(1), doa + I * Y.do_block, Y.ps_do, vt, Y.ps_vt, T(0), dp, nr,
                           1, mr * nr, Y.ps_s);
            for (Index j = 0; j < key_panels; ++j) {
                const Index e0 = j * Y.ps_s;
                for (Index rr = 0; rr < rows; ++rr) {
                    const T Di = D[static_cast<std::size_t>(i0 + rr)];
                    T* x = dp + e0 + rr * nr;
                    const T* P = s + e0 + rr * nr;
                    for (Index l = 0; l < nr; ++l) x[l] = P[l] * (x[l] - Di);
                    if (capped)
                        for (Index l = 0; l < nr; ++l) x[l] *= g[e0 + rr * nr + l];
                }
            }
            // dS as A over queries (panel of mr rows: key c at c * mr), from dp's panels; rows past `rows` are 0 in
            // dp (dout's padding), and so in ds.
            for (Index a = 0; a < row_panels; ++a)
                for (Index j0 = 0; j0 < nb; j0 += nr) {
                    const T* from = dp + (j0 / nr) * Y.ps_s + a * mr * nr;
                    T* to = ds + a * Y.ps_ds + j0 * mr;
                    const Index used = std::min(nr, nb - j0);
                    for (Index l = 0; l < used; ++l)
                        for (Index r2 = 0; r2 < mr; ++r2) to[l * mr + r2] = from[r2 * nr + l];
                }
            packed_gemm<T>(Y.dk_m, key_panels, rows, T(1), qt + I * Y.qt_block, Y.ps_t, dp, Y.ps_s, T(1), dkt, key_ld,
                           1, mr * key_ld, nr);
            packed_gemm<T>(row_panels, Y.dk_n, nb, T(1), ds, Y.ps_ds, kb, Y.ps_k, T(1),
                           dqa + I * Y.q_panels * mr * dq_ld, dq_ld, 1, mr * dq_ld, nr);
        }
        for (Index c = 0; c < nb; ++c) {
            for (Index d = 0; d < Dk; ++d) dkc[(c0 + c) * Dk + d] = dkt[d * key_ld + c];
            for (Index d = 0; d < Dv; ++d) dvc[(c0 + c) * Dv + d] = dvt[d * key_ld + c];
        }
    }
    const T scale = static_cast<T>(p.scale);
    for (Index i = 0; i < Tq; ++i) {
        const T* row = dqa + ((i / Bq) * Y.q_panels * mr + i % Bq) * dq_ld;
        for (Index d = 0; d < Dk; ++d) dq[i * Dk + d] = row[d] * scale;
    }
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
