// sdpa_backward: the forward's validation and contract checks, the saved tensors' own checks, the reference backward
// per batch element, and the sums of the gradients of broadcast inputs.
#include "attn/backward.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attn/detail/problem.hpp"
#include "backends.hpp"
#include "gemm.hpp"

namespace attn {
namespace {

using detail::gemm;
using detail::throw_overflow;

// The reference backward of batch element b into dq (Tq, Dk), dk (Tk, Dk), dv (Tk, Dv), contiguous, in the compute
// type T: the forward's steps 1-3 of sdpa_reference again (gather the readable keys, the logits by gemm, mask, cap,
// bias and the stable softmax), then dP = dout v^T, D = rowsum(P * dP), dS = P (dP - D) (times the cap's derivative),
// and three gemms. Only readable keys and rows with an allowed key are gathered, the others are zero, so that what
// nobody may read never enters a product. With dropout (detail::WeightDropout), dP's and dv's weights are the
// dropped-out ones: fl(x c) where kept (c = 1 / (1 - p) in T), 0 where dropped; D and dS use P itself.
template <class S, class T = compute_t<S>>
void backward_batch(const SdpaProblem<S>& p, const Readability& r, const SdpaOptions& options, Index b,
                    const detail::SavedRows<S>& dout, const detail::WeightDropout* dropout, T* dq, T* dk, T* dv) {
    const Index Tq = p.Tq, Dk = p.Dk, Dv = p.Dv;
    const auto nonempty = [&](Index i) { return r.row_nonempty[static_cast<std::size_t>(i)] != 0; };
    const std::vector<Index> keys = detail::readable_keys(r);
    const Index n = static_cast<Index>(keys.size());

    // 1. gather: qc (Tq, Dk) and go (Tq, Dv) of the rows with an allowed key, kc (n, Dk), vc (n, Dv).
    std::vector<T> qc(static_cast<std::size_t>(Tq * Dk), T(0)), go(static_cast<std::size_t>(Tq * Dv), T(0)),
        kc(static_cast<std::size_t>(n * Dk)), vc(static_cast<std::size_t>(n * Dv));
    const Index qs = p.q.stride(-1), ks = p.k.stride(-1), vs = p.v.stride(-1);
    for (Index i = 0; i < Tq; ++i) {
        if (!nonempty(i)) continue;
        for (Index d = 0; d < Dk; ++d) qc[i * Dk + d] = static_cast<T>(p.q_row(b, i)[d * qs]);
        for (Index d = 0; d < Dv; ++d) go[i * Dv + d] = static_cast<T>(dout.row(b, i)[d * dout.col_stride]);
    }
    for (Index c = 0; c < n; ++c) {
        for (Index d = 0; d < Dk; ++d) kc[c * Dk + d] = static_cast<T>(p.k_row(b, keys[c])[d * ks]);
        for (Index d = 0; d < Dv; ++d) vc[c * Dv + d] = static_cast<T>(p.v_row(b, keys[c])[d * vs]);
    }
    const auto finite = [](const std::vector<T>& x) {
        return std::all_of(x.begin(), x.end(), [](T y) { return std::isfinite(y); });
    };
    // With check_finite off a NaN or Inf may sit in a readable row: then every product runs over allowed pairs only
    // (0 * NaN in a gemm would reach rows that may not read it, as in the forward).
    const bool pairwise = !options.check_finite && !(finite(qc) && finite(go) && finite(kc) && finite(vc));

    // 2.-3. P (Tq, n): the forward's logits and softmax; with a cap, g = 1 - tanh^2 (the cap's derivative).
    std::vector<T> P(static_cast<std::size_t>(Tq * n));
    gemm<T>(false, true, Tq, n, Dk, static_cast<T>(p.scale), qc.data(), Dk, 1, kc.data(), Dk, 1, T(0), P.data(), n, 1);
    const bool capped = p.softcap != 0;
    std::vector<T> g(capped ? static_cast<std::size_t>(Tq * n) : 0);
    for (Index i = 0; i < Tq; ++i) {
        T* row = P.data() + i * n;
        if (!nonempty(i)) {
            std::fill_n(row, n, T(0));
            continue;
        }
        // No pairwise recomputation here: logit (i, c) of the gemm reads q_i and k_c only, so a NaN of another row
        // reaches only the logits of the keys holding it, which the softmax row skips where they are blocked.
        detail::reference_softmax_row(p, options, b, i, keys.data(), n, row, capped ? g.data() + i * n : nullptr);
    }

    // Dropout: keep (Tq, n), the multiplier of each weight (c or 0), and Pd = fl(P keep), the weights dv reads.
    std::vector<T> keep(dropout ? static_cast<std::size_t>(Tq * n) : 0), Pd(keep.size());
    if (dropout) {
        const T c = detail::dropout_keep_scale<T>(dropout->p);
        for (Index i = 0; i < Tq; ++i)
            for (Index x = 0; x < n; ++x) {
                const auto f = static_cast<std::size_t>(i * n + x);
                keep[f] = detail::dropout_keeps(*dropout, (b * Tq + i) * p.Tk + keys[x]) ? c : T(0);
                Pd[f] = P[f] * keep[f];
            }
    }

    // 4. dP (Tq, n) = go (Tq, Dv) @ vc^T; D_i = sum_c P_ic dP_ic; dS = P (dP - D) g, 0 where blocked.
    std::vector<T> dS(static_cast<std::size_t>(Tq * n));
    gemm<T>(false, true, Tq, n, Dv, T(1), go.data(), Dv, 1, vc.data(), Dv, 1, T(0), dS.data(), n, 1);
    for (Index i = 0; i < Tq; ++i) {
        T* row = dS.data() + i * n;
        const T* prow = P.data() + i * n;
        if (!nonempty(i)) {
            std::fill_n(row, n, T(0));
            continue;
        }
        if (pairwise)  // dP of a blocked key may hold that key's NaN, and 0 * NaN would reach D
            for (Index c = 0; c < n; ++c)
                if (!p.allowed(b, i, keys[c])) row[c] = 0;
        if (dropout)
            for (Index c = 0; c < n; ++c) row[c] *= keep[static_cast<std::size_t>(i * n + c)];
        T D = 0;
        for (Index c = 0; c < n; ++c) D += prow[c] * row[c];
        for (Index c = 0; c < n; ++c) {
            if (!p.allowed(b, i, keys[c])) {
                row[c] = 0;
                continue;
            }
            row[c] = prow[c] * (row[c] - D);
            if (capped) row[c] *= g[i * n + c];
        }
    }

    // 5. dq (Tq, Dk) = scale dS @ kc; dkc (n, Dk) = scale dS^T @ qc; dvc (n, Dv) = P^T @ go (Pd with dropout).
    const std::vector<T>& Pv = dropout ? Pd : P;
    std::vector<T> dkc(static_cast<std::size_t>(n * Dk), T(0)), dvc(static_cast<std::size_t>(n * Dv), T(0));
    std::fill_n(dq, Tq * Dk, T(0));
    const T scale = static_cast<T>(p.scale);
    if (!pairwise) {
        gemm<T>(false, false, Tq, Dk, n, scale, dS.data(), n, 1, kc.data(), Dk, 1, T(0), dq, Dk, 1);
        gemm<T>(true, false, n, Dk, Tq, scale, dS.data(), n, 1, qc.data(), Dk, 1, T(0), dkc.data(), Dk, 1);
        gemm<T>(true, false, n, Dv, Tq, T(1), Pv.data(), n, 1, go.data(), Dv, 1, T(0), dvc.data(), Dv, 1);
    } else {
        for (Index i = 0; i < Tq; ++i)
            for (Index c = 0; c < n; ++c) {
                if (!p.allowed(b, i, keys[c])) continue;
                const T ds = dS[i * n + c], pc = Pv[static_cast<std::size_t>(i * n + c)];
                for (Index d = 0; d < Dk; ++d) dq[i * Dk + d] += ds * kc[c * Dk + d];
                for (Index d = 0; d < Dk; ++d) dkc[c * Dk + d] += ds * qc[i * Dk + d];
                for (Index d = 0; d < Dv; ++d) dvc[c * Dv + d] += pc * go[i * Dv + d];
            }
        for (Index x = 0; x < Tq * Dk; ++x) dq[x] *= scale;
        for (T& x : dkc) x *= scale;
    }

    detail::finish_backward_batch(p, r, options, b, keys, dkc, dvc, dq, dk, dv);
}

}  // namespace

namespace detail {

std::vector<Index> readable_keys(const Readability& r) {
    std::vector<Index> keys;
    for (Index j = 0; j < static_cast<Index>(r.key_readable.size()); ++j)
        if (r.key_readable[static_cast<std::size_t>(j)]) keys.push_back(j);
    return keys;
}

template <class S, class T>
void finish_backward_batch(const SdpaProblem<S>& p, const Readability& r, const SdpaOptions& options, Index b,
                           const std::vector<Index>& keys, const std::vector<T>& dkc, const std::vector<T>& dvc, T* dq,
                           T* dk, T* dv) {
    const Index Tq = p.Tq, Tk = p.Tk, Dk = p.Dk, Dv = p.Dv, n = static_cast<Index>(keys.size());
    const auto nonempty = [&](Index i) { return r.row_nonempty[static_cast<std::size_t>(i)] != 0; };
    std::fill_n(dk, Tk * Dk, T(0));
    std::fill_n(dv, Tk * Dv, T(0));
    for (Index c = 0; c < n; ++c) {
        std::copy_n(dkc.data() + c * Dk, Dk, dk + keys[c] * Dk);
        std::copy_n(dvc.data() + c * Dv, Dv, dv + keys[c] * Dv);
    }
    const T empty_fill = options.empty_rows == EmptyRowPolicy::Nan ? std::numeric_limits<T>::quiet_NaN() : T(0);
    for (Index i = 0; i < Tq; ++i)
        if (!nonempty(i)) std::fill_n(dq + i * Dk, Dk, empty_fill);
    if (!options.check_finite) return;
    const auto check = [&](const T* x, Index rows, Index cols, const char* what, const char* row_name,
                           const auto& owns) {
        for (Index i = 0; i < rows; ++i)
            if (owns(i))
                for (Index d = 0; d < cols; ++d)
                    if (!std::isfinite(x[i * cols + d]))
                        throw_overflow(p.function, what, p.batch_index_string(b), i, p.shapes, row_name);
    };
    check(dq, Tq, Dk, "dq (scale dS k)", "query row", nonempty);
    const auto read = [&](Index j) { return r.key_readable[static_cast<std::size_t>(j)] != 0; };
    check(dk, Tk, Dk, "dk (scale dS^T q)", "key row", read);
    check(dv, Tk, Dv, "dv (P^T dout)", "key row", read);
}

#define ATTN_INSTANTIATE(S)                                                                                        \
    template void finish_backward_batch<S, compute_t<S>>(                                                          \
        const SdpaProblem<S>&, const Readability&, const SdpaOptions&, Index, const std::vector<Index>&,           \
        const std::vector<compute_t<S>>&, const std::vector<compute_t<S>>&, compute_t<S>*, compute_t<S>*,           \
        compute_t<S>*);
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

}  // namespace detail

namespace {

// The gradient of one input, (batch..., rows, cols) per batch element in `per_batch`, summed into a tensor of the
// input's own shape (`input`: the caller's view broadcast to the batch shape, `shape`: the caller's shape) in
// increasing batch order, then rounded to S once.
template <class S, class T = compute_t<S>>
Tensor<S> sum_over_broadcast(const std::vector<T>& per_batch, const Shape& shape, const Shape& batch_shape, Index rows,
                             Index cols, const std::string& function, const char* name) {
    std::vector<T> acc(static_cast<std::size_t>(numel(shape)), T(0));
    Shape full = batch_shape;
    full.push_back(rows);
    full.push_back(cols);
    const TensorView<const T> target =
        TensorView<const T>(acc.data(), shape).broadcast_to(full, function, name);  // stride 0 on broadcast dims
    const Index batch = numel(batch_shape);
    const std::vector<Index> offsets = detail::batch_offsets(target, static_cast<Index>(batch_shape.size()), batch_shape);
    const Index rs = target.stride(-2), cs = target.stride(-1);
    for (Index b = 0; b < batch && !acc.empty(); ++b) {  // an empty gradient has no element to point at
        const T* src = per_batch.data() + b * rows * cols;
        T* dst = acc.data() + offsets[static_cast<std::size_t>(b)];
        for (Index i = 0; i < rows; ++i)
            for (Index c = 0; c < cols; ++c) dst[i * rs + c * cs] += src[i * cols + c];
    }
    Tensor<S> out = Tensor<S>::uninitialized(shape);
    std::transform(acc.begin(), acc.end(), out.data(), [](T x) { return static_cast<S>(x); });
    return out;
}

// One input's gradient as it is formed: per-batch parts (batch, rows, cols) in the compute type, then
// sum_over_broadcast. Where the input is not broadcast (as many elements as the parts, so the same layout) and is
// stored in the compute type, the parts are its gradient and are written into the result directly.
template <class S, class T = compute_t<S>>
class Gradient {
public:
    Gradient(const Shape& shape, Index parts) : shape_(shape) {
        if (std::is_same_v<S, T> && numel(shape) == parts)
            direct_ = Tensor<S>::uninitialized(shape);
        else
            parts_.resize(static_cast<std::size_t>(parts));
    }
    T* parts() { return direct_ ? reinterpret_cast<T*>(direct_->data()) : parts_.data(); }
    Tensor<S> take(const Shape& batch_shape, Index rows, Index cols, const std::string& function, const char* name) {
        if (direct_) return std::move(*direct_);
        return sum_over_broadcast<S>(parts_, shape_, batch_shape, rows, cols, function, name);
    }

private:
    Shape shape_;
    std::optional<Tensor<S>> direct_;
    std::vector<T> parts_;
};

template <class S>
SdpaGradients<S> backward(TensorView<const S> q, TensorView<const S> k, TensorView<const S> v,
                          TensorView<const S> out, TensorView<const compute_t<S>> lse, TensorView<const S> dout,
                          std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options,
                          const detail::WeightDropout* dropout) {
    using T = compute_t<S>;
    const std::string function = "sdpa_backward";
    const SdpaProblem<S> p = make_sdpa_problem<S>(function, q, k, v, allowed_mask, options);
    const std::string shapes =
        p.shapes + ", out " + to_string(out.shape()) + ", lse " + to_string(lse.shape()) + ", dout " +
        to_string(dout.shape());
    const detail::SavedRows<S> out_rows(function, "out", out, p.output_shape(), p.batch_shape, shapes);
    const detail::SavedRows<S> dout_rows(function, "dout", dout, p.output_shape(), p.batch_shape, shapes);
    const detail::SavedRows<T> lse_rows(function, "lse", lse, p.lse_shape(), p.batch_shape, shapes);
    const std::vector<Readability> readable = check_contracts(p, options);
    if (options.check_finite) {
        detail::check_owned_rows(p, readable, "out", out_rows, p.Dv, shapes);
        detail::check_owned_rows(p, readable, "dout", dout_rows, p.Dv, shapes);
        detail::check_owned_rows(p, readable, "lse", lse_rows, 1, shapes);
    }
    const Index B = p.batch, Tq = p.Tq, Tk = p.Tk, Dk = p.Dk, Dv = p.Dv;
    // Per-batch gradients in the compute type; where an input is not broadcast and is stored in the compute type they
    // are its gradient already, written in place (no sum, no copy).
    Gradient<S> dq(q.shape(), B * Tq * Dk), dk(k.shape(), B * Tk * Dk), dv(v.shape(), B * Tk * Dv);
    const bool tiled = !dropout && (options.backend == Backend::Tiled ||
                                    (options.backend == Backend::Auto && Tq * p.Tk >= detail::auto_tiled_min_scores));
    detail::parallel_for(B, detail::thread_count(options), [&](Index b) {
        const Readability& r = readable[static_cast<std::size_t>(b)];
        T* dqb = dq.parts() + b * Tq * Dk;
        T* dkb = dk.parts() + b * Tk * Dk;
        T* dvb = dv.parts() + b * Tk * Dv;
        if (tiled && detail::sdpa_backward_tiled_batch<S, T>(p, r, options, b, out_rows, dout_rows, lse_rows, dqb, dkb,
                                                              dvb))
            return;
        backward_batch<S>(p, r, options, b, dout_rows, dropout, dqb, dkb, dvb);
    }, detail::Schedule::Dynamic);
    SdpaGradients<S> grads{dq.take(p.batch_shape, Tq, Dk, function, "q"), dk.take(p.batch_shape, Tk, Dk, function, "k"),
                           dv.take(p.batch_shape, Tk, Dv, function, "v")};
    if (options.check_finite) {
        // A sum over broadcast batch elements, or the rounding to a 16-bit type, may overflow where no batch
        // element's gradient did: to an infinity, never to a NaN (every part is finite, finish_backward_batch saw
        // to that, and a sum of finite parts that overflows stays infinite), so a NaN here is the policy's (an empty
        // row under Nan) and an infinity is the overflow.
        const auto check = [&](const Tensor<S>& g, const char* name) {
            for (Index x = 0; x < g.numel(); ++x)
                if (std::isinf(static_cast<T>(g.data()[x])))
                    throw ValueError(function + ": " + name + " overflowed at flat index " + std::to_string(x) +
                                     " although every readable input is finite (" + shapes + "); scale the inputs down");
        };
        check(grads.dq, "dq");
        check(grads.dk, "dk");
        check(grads.dv, "dv");
    }
    return grads;
}

}  // namespace

template <class S>
SdpaGradients<S> detail::sdpa_backward_with_dropout(TensorView<const S> q, TensorView<const S> k,
                                                    TensorView<const S> v, TensorView<const S> out,
                                                    TensorView<const compute_t<S>> lse, TensorView<const S> dout,
                                                    std::optional<TensorView<const bool>> allowed_mask,
                                                    const SdpaOptions& options, const WeightDropout& dropout) {
    return backward<S>(q, k, v, out, lse, dout, allowed_mask, options, &dropout);
}

#define ATTN_INSTANTIATE(S)                                                                                        \
    SdpaGradients<S> sdpa_backward(TensorView<const S> q, TensorView<const S> k, TensorView<const S> v,            \
                                   TensorView<const S> out, TensorView<const compute_t<S>> lse,                    \
                                   TensorView<const S> dout, std::optional<TensorView<const bool>> allowed_mask,   \
                                   const SdpaOptions& options) {                                                   \
        return backward<S>(q, k, v, out, lse, dout, allowed_mask, options, nullptr);                               \
    }                                                                                                              \
    template SdpaGradients<S> detail::sdpa_backward_with_dropout<S>(                                               \
        TensorView<const S>, TensorView<const S>, TensorView<const S>, TensorView<const S>,                        \
        TensorView<const compute_t<S>>, TensorView<const S>, std::optional<TensorView<const bool>>,                \
        const SdpaOptions&, const detail::WeightDropout&);
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

}  // namespace attn
