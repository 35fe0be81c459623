// The oracle's exact gradients (attn/oracle/backward.hpp): one batch element at a time in 261-bit arithmetic, then
// the sums over broadcast batch elements and the correct rounding to the target type.
#include "attn/oracle/backward.hpp"

#include <boost/multiprecision/mpfr.hpp>
#include <cmath>
#include <limits>
#include <string>

#include "attn/oracle/oracle.hpp"
#include "backward_engine.hpp"

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

// Row i's weights over the keys (0 where blocked) and, with a cap, each allowed key's 1 - tanh^2(s / cap).
struct RowWeights {
    std::vector<Mp> p, g;
    bool any = false;
};

RowWeights row_weights(const ExactHead& h, Index i) {
    RowWeights w;
    w.p.assign(static_cast<std::size_t>(h.Tk), Mp(0));
    w.g.assign(static_cast<std::size_t>(h.Tk), Mp(1));
    Mp max;
    for (Index j = 0; j < h.Tk; ++j) {
        if (!h.allowed[i * h.Tk + j]) continue;
        Mp s = 0;
        for (Index d = 0; d < h.Dk; ++d) s += h.q[i * h.Dk + d] * h.k[j * h.Dk + d];
        s *= h.scale;
        if (h.cap != 0) {
            const Mp t = tanh(s / h.cap);
            w.g[j] = 1 - t * t;
            s = h.cap * t;
        }
        s += h.bias[i * h.Tk + j];
        w.p[j] = s;
        if (!w.any || s > max || isnan(s)) max = s;
        w.any = true;
    }
    if (!w.any) return w;
    Mp sum = 0;
    for (Index j = 0; j < h.Tk; ++j)
        if (h.allowed[i * h.Tk + j]) sum += (w.p[j] = exp(w.p[j] - max));
    for (Index j = 0; j < h.Tk; ++j)
        if (h.allowed[i * h.Tk + j]) w.p[j] /= sum;
    return w;
}

}  // namespace

std::vector<Mp> exact_output(const ExactHead& h) {
    std::vector<Mp> out(static_cast<std::size_t>(h.Tq * h.Dv), Mp(0));
    for (Index i = 0; i < h.Tq; ++i) {
        const RowWeights w = row_weights(h, i);
        for (Index j = 0; j < h.Tk; ++j)
            if (h.allowed[i * h.Tk + j])
                for (Index d = 0; d < h.Dv; ++d) out[i * h.Dv + d] += w.p[j] * h.v[j * h.Dv + d];
    }
    return out;
}

ExactGradients exact_gradients(const ExactHead& h) {
    ExactGradients g;
    g.dq.assign(static_cast<std::size_t>(h.Tq * h.Dk), Mp(0));
    g.dk.assign(static_cast<std::size_t>(h.Tk * h.Dk), Mp(0));
    g.dv.assign(static_cast<std::size_t>(h.Tk * h.Dv), Mp(0));
    const std::vector<Mp> out = exact_output(h);
    std::vector<Mp> dS(static_cast<std::size_t>(h.Tk));
    for (Index i = 0; i < h.Tq; ++i) {
        const RowWeights w = row_weights(h, i);
        if (!w.any) continue;
        Mp D = 0;  // dout_i . O_i
        for (Index d = 0; d < h.Dv; ++d) D += h.dout[i * h.Dv + d] * out[i * h.Dv + d];
        for (Index j = 0; j < h.Tk; ++j) {
            if (!h.allowed[i * h.Tk + j]) continue;
            Mp dP = 0;
            for (Index d = 0; d < h.Dv; ++d) dP += h.dout[i * h.Dv + d] * h.v[j * h.Dv + d];
            const Mp ds = w.p[j] * (dP - D) * w.g[j] * h.scale;  // the scale of both dq and dk
            for (Index d = 0; d < h.Dk; ++d) {
                g.dq[i * h.Dk + d] += ds * h.k[j * h.Dk + d];
                g.dk[j * h.Dk + d] += ds * h.q[i * h.Dk + d];
            }
            for (Index d = 0; d < h.Dv; ++d) g.dv[j * h.Dv + d] += w.p[j] * h.dout[i * h.Dv + d];
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

// The per-batch gradients of one input summed into its own shape (stride 0 on broadcast dims), then rounded.
template <class T>
void sum_and_round(const std::vector<std::vector<Mp>>& per_batch, const Shape& shape, const SdpaProblem<T>& p,
                   Index rows, Index cols, const char* name, Tensor<T>& rounded, Tensor<long double>& exact) {
    std::vector<Mp> acc(static_cast<std::size_t>(numel(shape)), Mp(0));
    Shape full = p.batch_shape;
    full.push_back(rows);
    full.push_back(cols);
    const TensorView<const char> layout =  // only its strides: `shape` broadcast to the batch, stride 0 there
        TensorView<const char>(nullptr, shape).broadcast_to(full, p.function, name);
    const std::vector<Index> offsets =
        attn::detail::batch_offsets(layout, static_cast<Index>(p.batch_shape.size()), p.batch_shape);
    const Index rs = layout.stride(-2), cs = layout.stride(-1);
    for (Index b = 0; b < p.batch; ++b)
        for (Index i = 0; i < rows; ++i)
            for (Index c = 0; c < cols; ++c)
                acc[static_cast<std::size_t>(offsets[static_cast<std::size_t>(b)] + i * rs + c * cs)] +=
                    per_batch[static_cast<std::size_t>(b)][static_cast<std::size_t>(i * cols + c)];
    rounded = Tensor<T>::uninitialized(shape);
    exact = Tensor<long double>::uninitialized(shape);
    for (std::size_t x = 0; x < acc.size(); ++x) {
        const double hi = acc[x].convert_to<double>();
        const double lo = std::isfinite(hi) ? Mp(acc[x] - Mp(hi)).convert_to<double>() : 0.0;
        rounded.data()[x] = round_to<T>(hi, lo);
        exact.data()[x] = acc[x].convert_to<long double>();
    }
}

}  // namespace

template <class T>
Gradients<T> sdpa_backward(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                           TensorView<const T> dout, std::optional<TensorView<const bool>> allowed_mask,
                           const SdpaOptions& options) {
    const std::string function = "oracle.sdpa_backward";
    const SdpaProblem<T> p = make_sdpa_problem<T>(function, q, k, v, allowed_mask, options);
    const std::string shapes = p.shapes + ", dout " + to_string(dout.shape());
    const attn::detail::SavedRows<T> dout_rows(function, "dout", dout, p.output_shape(), p.batch_shape, shapes);
    const std::vector<Readability> readable = check_contracts(p, options);
    if (options.check_finite) attn::detail::check_owned_rows(p, readable, "dout", dout_rows, p.Dv, shapes);
    std::vector<std::vector<Mp>> dq(static_cast<std::size_t>(p.batch)), dk(dq.size()), dv(dq.size());
    const Mp nan = std::numeric_limits<Mp>::quiet_NaN();
    for (Index b = 0; b < p.batch; ++b) {
        const Readability& r = readable[static_cast<std::size_t>(b)];
        detail::ExactGradients g = detail::exact_gradients(detail::exact_head(p, r, b, dout_rows));
        if (options.empty_rows == EmptyRowPolicy::Nan)
            for (Index i = 0; i < p.Tq; ++i)
                if (!r.row_nonempty[static_cast<std::size_t>(i)])
                    std::fill_n(g.dq.begin() + i * p.Dk, p.Dk, nan);
        dq[static_cast<std::size_t>(b)] = std::move(g.dq);
        dk[static_cast<std::size_t>(b)] = std::move(g.dk);
        dv[static_cast<std::size_t>(b)] = std::move(g.dv);
    }
    Gradients<T> result;
    result.bits = 261;
    sum_and_round(dq, q.shape(), p, p.Tq, p.Dk, "q", result.dq, result.dq_exact);
    sum_and_round(dk, k.shape(), p, p.Tk, p.Dk, "k", result.dk, result.dk_exact);
    sum_and_round(dv, v.shape(), p, p.Tk, p.Dv, "v", result.dv, result.dv_exact);
    return result;
}

#define ATTN_INSTANTIATE(T)                                                                                        \
    template Gradients<T> sdpa_backward<T>(TensorView<const T>, TensorView<const T>, TensorView<const T>,          \
                                           TensorView<const T>, std::optional<TensorView<const bool>>,              \
                                           const SdpaOptions&);
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

}  // namespace attn::oracle
