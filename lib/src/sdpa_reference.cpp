// Backend `reference`: per batch element, scores with BLIS gemm, stable softmax over keys, BLIS gemm with v.
#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backends.hpp"
#include "gemm.hpp"

namespace attn::detail {

template <class T>
void write_empty_row(EmptyRowPolicy policy, T* output_row, Index Dv, T* weights_row, Index Tk) {
    const T fill = static_cast<T>(policy == EmptyRowPolicy::Nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
    std::fill_n(output_row, Dv, fill);
    if (weights_row) std::fill_n(weights_row, Tk, fill);
}

void throw_overflow(const std::string& function, const char* what, const std::string& batch_index, Index row,
                    const std::string& shapes, const char* row_name) {
    throw ValueError(function + ": " + what + " overflowed at batch index " + batch_index + ", " + row_name + " " +
                     std::to_string(row) + " although every readable input is finite" +
                     (shapes.empty() ? std::string() : " (" + shapes + ")") + "; scale the inputs down");
}

int thread_count(int requested) {
#ifdef _OPENMP
    return requested > 0 ? requested : omp_get_max_threads();
#else
    (void)requested;
    return 1;
#endif
}

void parallel_for(Index count, int threads, const std::function<void(Index)>& body, Schedule schedule) {
    // Exceptions cannot leave an OpenMP region: keep the one of the lowest index (what a serial loop would throw).
    std::exception_ptr first_error;
    Index first_index = count;
    // A single item gains nothing from a team, and idle OpenMP workers spin-wait on a loaded machine. No OpenMP
    // construct at all then, not even a serialized region (`if (false)`): built with clang's libomp next to
    // Debian's OpenMP BLIS (libgomp), every BLIS call inside a serialized region leaked ~200 bytes (the mha fuzzer
    // reached its 4 GB limit; plain loops of bli_sgemm_ex inside `omp parallel for if (false)` reproduce it).
    if (count <= 1 || threads <= 1) {
        for (Index i = 0; i < count; ++i) body(i);  // the lowest failing item throws first, as below
        return;
    }
    const auto run = [&](Index i) {
        try {
            body(i);
        } catch (...) {
#pragma omp critical(attn_parallel_for_error)
            if (i < first_index) {
                first_index = i;
                first_error = std::current_exception();
            }
        }
    };
    if (schedule == Schedule::Dynamic) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
        for (Index i = 0; i < count; ++i) run(i);
    } else {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (Index i = 0; i < count; ++i) run(i);
    }
    if (first_error) std::rethrow_exception(first_error);
}

template <class S, class T>
T reference_softmax_row(const SdpaProblem<S>& p, const SdpaOptions& options, Index b, Index i, const Index* keys,
                        Index n, T* row, T* cap_derivative) {
    // The cap, softcap * tanh(s / softcap) with std::tanh in T, and then the bias (one addition in T) apply to allowed
    // logits only: blocked ones (a -inf bias included) stay -inf.
    const T cap = static_cast<T>(p.softcap);
    T row_max = -std::numeric_limits<T>::infinity();
    for (Index c = 0; c < n; ++c) {
        if (!p.allowed(b, i, keys[c])) {
            row[c] = -std::numeric_limits<T>::infinity();  // blocked: exactly zero weight after exp
            continue;
        }
        if (options.check_finite && !std::isfinite(row[c]))
            throw_overflow(p.function, "a logit (scale * q k^T)", p.batch_index_string(b), i, p.shapes);
        if (cap != 0) {
            const T t = std::tanh(row[c] / cap);
            if (cap_derivative) cap_derivative[c] = T(1) - t * t;
            row[c] = cap * t;
        }
        if (p.has_bias()) {
            row[c] += p.bias_at(b, i, keys[c]);
            if (options.check_finite && !std::isfinite(row[c]))
                throw_overflow(p.function, "a logit plus its bias", p.batch_index_string(b), i, p.shapes);
        }
        row_max = std::max(row_max, row[c]);
    }
    T sum = 0;
    for (Index c = 0; c < n; ++c) {
        row[c] = std::exp(row[c] - row_max);  // exp(-inf) = 0 for blocked keys
        sum += row[c];
    }
    for (Index c = 0; c < n; ++c) row[c] /= sum;
    return row_max + std::log(sum);
}

// q (Tq, Dk), k (Tk, Dk), v (Tk, Dv) per batch element b; only the readable keys (n of them) are gathered, so
// values nobody may read never enter a product (0 * NaN would still be NaN). S is the storage type, T the type the
// kernel computes in (float for the 16-bit types): the gather converts (exactly), the output and the weights are
// computed in T and rounded to S once, before the checks of step 5.
template <class S>
void sdpa_reference(const SdpaProblem<S>& p, const std::vector<Readability>& readable, const SdpaOptions& options,
                    S* output, S* weights, compute_t<S>* lse) {
    using T = compute_t<S>;
    const Index Tq = p.Tq, Tk = p.Tk, Dk = p.Dk, Dv = p.Dv;
    parallel_for(p.batch, thread_count(options), [&](Index b) {
        const Readability& r = readable[static_cast<std::size_t>(b)];
        S* out_s = output + b * Tq * Dv;  // (Tq, Dv)
        S* w_s = weights ? weights + b * Tq * Tk : nullptr;  // (Tq, Tk)
        // Where the kernel writes in T: the storage itself, or buffers rounded to S at the end.
        std::vector<T> out_store, w_store;
        T* out;
        T* w;
        if constexpr (std::is_same_v<S, T>) {
            out = out_s;
            w = w_s;
        } else {
            out_store.resize(static_cast<std::size_t>(Tq * Dv));
            out = out_store.data();
            if (w_s) w_store.resize(static_cast<std::size_t>(Tq * Tk));
            w = w_s ? w_store.data() : nullptr;
        }
        std::vector<Index> keys;  // readable key positions, ascending
        for (Index j = 0; j < Tk; ++j)
            if (r.key_readable[static_cast<std::size_t>(j)]) keys.push_back(j);
        const Index n = static_cast<Index>(keys.size());

        // 1. gather: qc (Tq, Dk), kc (n, Dk), vc (n, Dv), contiguous.
        std::vector<T> qc(static_cast<std::size_t>(Tq * Dk)), kc(static_cast<std::size_t>(n * Dk)),
            vc(static_cast<std::size_t>(n * Dv));
        for (Index i = 0; i < Tq; ++i)
            for (Index d = 0; d < Dk; ++d) qc[i * Dk + d] = static_cast<T>(p.q_row(b, i)[d * p.q.stride(-1)]);
        for (Index c = 0; c < n; ++c) {
            for (Index d = 0; d < Dk; ++d) kc[c * Dk + d] = static_cast<T>(p.k_row(b, keys[c])[d * p.k.stride(-1)]);
            for (Index d = 0; d < Dv; ++d) vc[c * Dv + d] = static_cast<T>(p.v_row(b, keys[c])[d * p.v.stride(-1)]);
        }

        // 2. scores: s (Tq, n) = scale * qc (Tq, Dk) @ kc^T (Dk, n).
        std::vector<T> s(static_cast<std::size_t>(Tq * n));
        gemm<T>(false, true, Tq, n, Dk, static_cast<T>(p.scale), qc.data(), Dk, 1, kc.data(), Dk, 1, T(0), s.data(), n,
                1);

        // 3. mask, soft-cap, bias, max, exp, sum, normalise, per query row; s becomes the weights over readable keys.
        for (Index i = 0; i < Tq; ++i) {
            T* row = s.data() + i * n;
            if (!r.row_nonempty[static_cast<std::size_t>(i)]) {
                std::fill_n(row, n, T(0));
                if (lse) lse[b * Tq + i] = -std::numeric_limits<T>::infinity();
                continue;
            }
            const T row_lse = reference_softmax_row(p, options, b, i, keys.data(), n, row, static_cast<T*>(nullptr));
            if (lse) lse[b * Tq + i] = row_lse;
        }

        // 4. output: out (Tq, Dv) = s (Tq, n) @ vc (n, Dv).
        if (n == 0) std::fill_n(out, Tq * Dv, T(0));
        gemm<T>(false, false, Tq, Dv, n, T(1), s.data(), n, 1, vc.data(), Dv, 1, T(0), out, Dv, 1);
        // With check_finite off, a NaN/Inf value row that some query reads would reach, through 0 * NaN in the gemm,
        // the rows of queries that may not read it (pytorch#101967): those rows are summed over their own keys only.
        if (!options.check_finite &&
            std::any_of(vc.begin(), vc.end(), [](T x) { return !std::isfinite(x); })) {
            for (Index i = 0; i < Tq; ++i) {
                // out[i] (Dv) = sum over keys c allowed for query i of s[i, c] * vc[c] (Dv)
                T* out_row = out + i * Dv;
                std::fill_n(out_row, Dv, T(0));
                for (Index c = 0; c < n; ++c)
                    if (p.allowed(b, i, keys[c]))
                        for (Index d = 0; d < Dv; ++d) out_row[d] += s[i * n + c] * vc[c * Dv + d];
            }
        }

        // 5. weights (Tq, Tk): zero at unreadable keys; the one rounding to S; empty rows and overflow checks.
        if (w) {
            std::fill_n(w, Tq * Tk, T(0));
            for (Index i = 0; i < Tq; ++i)
                for (Index c = 0; c < n; ++c) w[i * Tk + keys[c]] = s[i * n + c];
        }
        if constexpr (!std::is_same_v<S, T>) {
            std::transform(out_store.begin(), out_store.end(), out_s, [](T x) { return S(x); });
            std::transform(w_store.begin(), w_store.end(), w_s, [](T x) { return S(x); });
        }
        for (Index i = 0; i < Tq; ++i) {
            if (!r.row_nonempty[static_cast<std::size_t>(i)]) {
                write_empty_row(options.empty_rows, out_s + i * Dv, Dv, w_s ? w_s + i * Tk : nullptr, Tk);
            } else if (options.check_finite) {
                for (Index d = 0; d < Dv; ++d)
                    if (!std::isfinite(out_s[i * Dv + d]))
                        throw_overflow(p.function, "the output (weights @ v)", p.batch_index_string(b), i, p.shapes);
            }
        }
    });
}

#define ATTN_INSTANTIATE(S)                                                                                        \
    template void write_empty_row<S>(EmptyRowPolicy, S*, Index, S*, Index);                                        \
    template compute_t<S> reference_softmax_row<S>(const SdpaProblem<S>&, const SdpaOptions&, Index, Index,        \
                                                   const Index*, Index, compute_t<S>*, compute_t<S>*);             \
    template void sdpa_reference<S>(const SdpaProblem<S>&, const std::vector<Readability>&, const SdpaOptions&, S*, \
                                    S*, compute_t<S>*);
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

}  // namespace attn::detail
