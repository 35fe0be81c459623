// Backend `tiled`: FlashAttention-style online softmax over key blocks; never holds a Tq x Tk matrix.
//
// Shapes per batch element b: q (Tq, Dk), k (Tk, Dk), v (Tk, Dv), output (Tq, Dv). Work items are
// (b, block of query rows); each thread keeps its own workspace: the readable keys of the batch element it is
// on, gathered (kc (n, Dk), vc (n, Dv)), and for its query block the scores s (Bq, Bk), the accumulator
// acc (Bq, Dv), the running max m and sum l. Memory per thread: O((Bq + n) * D + Bq * Bk).
// The numbered passes and their rounding structure are documented in attn/tiled.hpp (TiledKernelInfo).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "attn/tiled.hpp"
#include "backends.hpp"
#include "gemm.hpp"

namespace attn::detail {

namespace hn = hwy::HWY_NAMESPACE;

namespace {

// max over s[0, n) (-inf when n == 0 or all -inf).
template <class T>
T block_max(const T* s, Index n) {
    const hn::ScalableTag<T> d;
    const Index N = static_cast<Index>(hn::Lanes(d));
    auto vmax = hn::Set(d, -std::numeric_limits<T>::infinity());
    Index j = 0;
    for (; j + N <= n; j += N) vmax = hn::Max(vmax, hn::LoadU(d, s + j));
    T m = hn::GetLane(hn::MaxOfLanes(d, vmax));
    for (; j < n; ++j) m = std::max(m, s[j]);
    return m;
}

// Whether every s[0, n) is finite (a logit that overflowed is Inf or NaN).
template <class T>
bool block_finite(const T* s, Index n) {
    const hn::ScalableTag<T> d;
    const Index N = static_cast<Index>(hn::Lanes(d));
    auto ok = hn::IsFinite(hn::Set(d, T(0)));
    Index j = 0;
    for (; j + N <= n; j += N) ok = hn::And(ok, hn::IsFinite(hn::LoadU(d, s + j)));
    if (!hn::AllTrue(d, ok)) return false;
    for (; j < n; ++j)
        if (!std::isfinite(s[j])) return false;
    return true;
}

// Exp that passes NaN through without handing it to hwy::Exp, whose float -> int step is undefined for NaN
// (UBSan, emu128 target; a NaN logit reaches here only with check_finite off).
template <class D, class V>
V exp_or_nan(D d, V x) {
    const auto nan = hn::IsNaN(x);
    return hn::IfThenElse(nan, x, hn::Exp(d, hn::IfThenZeroElse(nan, x)));
}

// s[j] = Exp(s[j] - row_max) for j in [0, n); returns their sum: lane-wise partial sums, then over lanes.
// The tail goes through the same vector Exp (padded with -inf, which gives 0), so every element sees one exp.
template <class T>
T block_exp_sum(T* s, Index n, T row_max) {
    const hn::ScalableTag<T> d;
    const Index N = static_cast<Index>(hn::Lanes(d));
    const auto vm = hn::Set(d, row_max);
    auto vsum0 = hn::Zero(d), vsum1 = hn::Zero(d);
    Index j = 0;
    for (; j + 2 * N <= n; j += 2 * N) {
        const auto p0 = exp_or_nan(d, hn::Sub(hn::LoadU(d, s + j), vm));
        const auto p1 = exp_or_nan(d, hn::Sub(hn::LoadU(d, s + j + N), vm));
        hn::StoreU(p0, d, s + j);
        hn::StoreU(p1, d, s + j + N);
        vsum0 = hn::Add(vsum0, p0);
        vsum1 = hn::Add(vsum1, p1);
    }
    for (; j < n; j += N) {
        HWY_ALIGN T tail[hn::MaxLanes(d)];
        const Index r = std::min(N, n - j);
        std::fill_n(tail, N, -std::numeric_limits<T>::infinity());
        std::copy_n(s + j, r, tail);
        const auto p = exp_or_nan(d, hn::Sub(hn::Load(d, tail), vm));
        hn::Store(p, d, tail);
        std::copy_n(tail, r, s + j);
        vsum0 = hn::Add(vsum0, p);
    }
    return hn::GetLane(hn::SumOfLanes(d, hn::Add(vsum0, vsum1)));
}

// The keys a row may read end at `end` (exclusive, in original key positions); causal_end gives it per row.
Index causal_end(Index i, Index Tq, Index Tk, CausalAlignment alignment) {
    return std::clamp<Index>(alignment == CausalAlignment::TopLeft ? i + 1 : i + 1 + Tk - Tq, 0, Tk);
}

// One thread's buffers, reused across its work items (the gathered keys are reused while b does not change).
template <class T>
struct Workspace {
    Index b = -1;
    std::vector<Index> keys;    // readable key positions of batch element b, ascending
    std::vector<T> kc, vc;      // (n, Dk), (n, Dv): the readable rows only, so unread NaN/Inf never enter a product
    std::vector<T> qc;          // (Bq, Dk)
    std::vector<T> s;           // (Bq, Bk)
    std::vector<T> acc;         // (Bq, Dv)
    std::vector<T> row_max, row_sum;
    std::vector<Index> row_end;  // per query row: readable keys [0, row_end) pass the causal rule
};

template <class T>
void gather_keys(const SdpaProblem<T>& p, const Readability& r, Index b, Workspace<T>& w) {
    w.b = b;
    w.keys.clear();
    for (Index j = 0; j < p.Tk; ++j)
        if (r.key_readable[static_cast<std::size_t>(j)]) w.keys.push_back(j);
    const Index n = static_cast<Index>(w.keys.size());
    w.kc.resize(static_cast<std::size_t>(n * p.Dk));
    w.vc.resize(static_cast<std::size_t>(n * p.Dv));
    const Index ks = p.k.stride(-1), vs = p.v.stride(-1);
    for (Index c = 0; c < n; ++c) {
        const T* krow = p.k_row(b, w.keys[c]);
        const T* vrow = p.v_row(b, w.keys[c]);
        T* kdst = w.kc.data() + c * p.Dk;
        T* vdst = w.vc.data() + c * p.Dv;
        for (Index d = 0; d < p.Dk; ++d) kdst[d] = krow[d * ks];
        for (Index d = 0; d < p.Dv; ++d) vdst[d] = vrow[d * vs];
    }
}

// Query rows [i0, i1) of batch element b; writes output rows (i1 - i0, Dv).
template <class T>
void tile(const SdpaProblem<T>& p, const Readability& r, const SdpaOptions& options, Index b, Index i0, Index i1,
          Workspace<T>& w, T* out) {
    const Index Dk = p.Dk, Dv = p.Dv, Bk = tiled_key_block;
    const Index rows = i1 - i0;
    const Index n = static_cast<Index>(w.keys.size());
    const T neg_inf = -std::numeric_limits<T>::infinity();

    // 1. gather the q block: qc (rows, Dk), contiguous.
    const Index qs = p.q.stride(-1);
    for (Index i = 0; i < rows; ++i) {
        const T* qrow = p.q_row(b, i0 + i);
        for (Index d = 0; d < Dk; ++d) w.qc[i * Dk + d] = qrow[d * qs];
    }
    std::fill_n(w.acc.begin(), rows * Dv, T(0));
    std::fill_n(w.row_max.begin(), rows, neg_inf);
    std::fill_n(w.row_sum.begin(), rows, T(0));

    // Causal limits in readable-key positions; the block's key range ends where its last row's does.
    Index keys_end = n, all_see = n;  // every row may read [0, all_see) as far as the causal rule goes
    if (p.is_causal) {
        for (Index i = 0; i < rows; ++i) {
            const Index end = causal_end(i0 + i, p.Tq, p.Tk, p.alignment);
            w.row_end[i] = std::lower_bound(w.keys.begin(), w.keys.end(), end) - w.keys.begin();
        }
        keys_end = *std::max_element(w.row_end.begin(), w.row_end.begin() + rows);
        all_see = *std::min_element(w.row_end.begin(), w.row_end.begin() + rows);
    }

    for (Index c0 = 0; c0 < keys_end; c0 += Bk) {
        const Index nb = std::min(Bk, n - c0);  // keys [c0, c0 + nb) of kc / vc
        const bool causal_block = p.is_causal && c0 + nb > all_see;  // the diagonal: some row stops inside
        const bool masked = causal_block || p.allowed_mask.has_value();

        // 2. scores: s (rows, nb) = scale * qc (rows, Dk) @ kc[c0:c0+nb]^T (Dk, nb).
        gemm<T>(false, true, rows, nb, Dk, static_cast<T>(p.scale), w.qc.data(), Dk, 1, w.kc.data() + c0 * Dk, Dk, 1,
                T(0), w.s.data(), Bk, 1);

        for (Index i = 0; i < rows; ++i) {
            T* srow = w.s.data() + i * Bk;
            // 3. mask (allowed -> logit, blocked -> -inf), only where a mask can block something.
            if (masked) {
                const Index end = causal_block ? std::min(nb, w.row_end[i] - c0) : nb;
                for (Index c = 0; c < nb; ++c) {
                    const bool ok = c < end && (!p.allowed_mask || p.allowed(b, i0 + i, w.keys[c0 + c]));
                    if (!ok) {
                        srow[c] = neg_inf;
                    } else if (options.check_finite && !std::isfinite(srow[c])) {
                        throw_overflow(p.function, "a logit (scale * q k^T)", p.batch_index_string(b), i0 + i);
                    }
                }
            } else if (options.check_finite && !block_finite(srow, nb)) {
                throw_overflow(p.function, "a logit (scale * q k^T)", p.batch_index_string(b), i0 + i);
            }
            // 4. online softmax: new max, p = exp(s - max), rescale the running sum and the accumulator row.
            const T m_old = w.row_max[i];
            const T m_new = std::max(m_old, block_max(srow, nb));
            if (m_new == neg_inf) {  // nothing allowed so far: p = 0, no exp(-inf - -inf)
                std::fill_n(srow, nb, T(0));
                continue;
            }
            const T block_sum = block_exp_sum(srow, nb, m_new);
            if (m_new != m_old) {
                const T c = std::exp(m_old - m_new);  // 0 when m_old = -inf (acc and l are still 0)
                w.row_sum[i] *= c;
                T* arow = w.acc.data() + i * Dv;
                for (Index d = 0; d < Dv; ++d) arow[d] *= c;
                w.row_max[i] = m_new;
            }
            w.row_sum[i] += block_sum;
        }

        // 5. acc (rows, Dv) += p (rows, nb) @ vc[c0:c0+nb] (nb, Dv).
        const T* vblock = w.vc.data() + c0 * Dv;
        if (options.check_finite || std::all_of(vblock, vblock + nb * Dv, [](T x) { return std::isfinite(x); })) {
            gemm<T>(false, false, rows, Dv, nb, T(1), w.s.data(), Bk, 1, vblock, Dv, 1, T(1), w.acc.data(), Dv, 1);
        } else {
            // A NaN/Inf value row that some query reads must not reach, through 0 * NaN in the gemm, the rows of
            // queries that may not read it (pytorch#101967): each row sums over its own allowed keys only.
            for (Index i = 0; i < rows; ++i) {
                const T* srow = w.s.data() + i * Bk;
                T* arow = w.acc.data() + i * Dv;  // (Dv) += p[i, c] * vc[c0 + c] (Dv) over allowed c
                const Index end = causal_block ? std::min(nb, w.row_end[i] - c0) : nb;
                for (Index c = 0; c < end; ++c)
                    if (!masked || !p.allowed_mask || p.allowed(b, i0 + i, w.keys[c0 + c]))
                        for (Index d = 0; d < Dv; ++d) arow[d] += srow[c] * vblock[c * Dv + d];
            }
        }
    }

    // 6. normalise; empty rows per policy; an output that overflowed is an error, not an Inf.
    for (Index i = 0; i < rows; ++i) {
        T* orow = out + i * Dv;
        if (!r.row_nonempty[static_cast<std::size_t>(i0 + i)]) {
            write_empty_row(options.empty_rows, orow, Dv, static_cast<T*>(nullptr), 0);
            continue;
        }
        const T* arow = w.acc.data() + i * Dv;
        for (Index d = 0; d < Dv; ++d) orow[d] = arow[d] / w.row_sum[i];
        if (options.check_finite)
            for (Index d = 0; d < Dv; ++d)
                if (!std::isfinite(orow[d]))
                    throw_overflow(p.function, "the output (weights @ v)", p.batch_index_string(b), i0 + i);
    }
}

}  // namespace

template <class T>
void sdpa_tiled(const SdpaProblem<T>& p, const std::vector<Readability>& readable, const SdpaOptions& options,
                T* output) {
    const Index Bq = tiled_query_block;
    const Index q_blocks = (p.Tq + Bq - 1) / Bq;
    const int threads = thread_count(options);
    std::vector<Workspace<T>> workspaces(static_cast<std::size_t>(threads));
    // Items (b, query block) in C order: the static schedule gives each thread a contiguous run, so it gathers
    // the keys of each batch element about once.
    parallel_for(p.batch * q_blocks, options, [&](Index item) {
#ifdef _OPENMP
        Workspace<T>& w = workspaces[static_cast<std::size_t>(omp_get_thread_num())];
#else
        Workspace<T>& w = workspaces[0];
#endif
        const Index b = item / q_blocks, i0 = (item % q_blocks) * Bq, i1 = std::min(p.Tq, i0 + Bq);
        const Readability& r = readable[static_cast<std::size_t>(b)];
        if (w.qc.empty()) {
            w.qc.resize(static_cast<std::size_t>(Bq * std::max<Index>(p.Dk, 1)));
            w.s.resize(static_cast<std::size_t>(Bq * tiled_key_block));
            w.acc.resize(static_cast<std::size_t>(Bq * std::max<Index>(p.Dv, 1)));
            w.row_max.resize(static_cast<std::size_t>(Bq));
            w.row_sum.resize(static_cast<std::size_t>(Bq));
            w.row_end.resize(static_cast<std::size_t>(Bq));
        }
        if (w.b != b) gather_keys(p, r, b, w);
        tile(p, r, options, b, i0, i1, w, output + b * p.Tq * p.Dv + i0 * p.Dv);
    });
}

template void sdpa_tiled<float>(const SdpaProblem<float>&, const std::vector<Readability>&, const SdpaOptions&,
                                float*);
template void sdpa_tiled<double>(const SdpaProblem<double>&, const std::vector<Readability>&, const SdpaOptions&,
                                 double*);

}  // namespace attn::detail
