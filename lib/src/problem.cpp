// Validation and resolution of one SDPA call: the contracts every backend and the oracle share.
#include "attn/detail/problem.hpp"

#include <algorithm>
#include <cmath>

namespace attn {

namespace {

std::string shapes_of(const TensorView<const bool>* m, const Shape& q, const Shape& k, const Shape& v) {
    std::string s = "q " + to_string(q) + ", k " + to_string(k) + ", v " + to_string(v);
    if (m) s += ", allowed_mask " + to_string(m->shape());
    return s;
}

template <class V>
std::vector<Index> batch_offsets(const V& view, Index batch_rank, const Shape& batch_shape) {
    std::vector<Index> offsets;
    offsets.reserve(static_cast<std::size_t>(numel(batch_shape)));
    for_each_index(batch_shape, [&](std::span<const Index> idx) {
        Index off = 0;
        for (Index d = 0; d < batch_rank; ++d) off += idx[static_cast<std::size_t>(d)] * view.stride(d);
        offsets.push_back(off);
    });
    return offsets;
}

template <class T>
bool finite(T x) {
    return std::isfinite(x);
}

}  // namespace

template <class T>
Shape SdpaProblem<T>::output_shape() const {
    Shape s = batch_shape;
    s.push_back(Tq);
    s.push_back(Dv);
    return s;
}

template <class T>
Shape SdpaProblem<T>::weights_shape() const {
    Shape s = batch_shape;
    s.push_back(Tq);
    s.push_back(Tk);
    return s;
}

template <class T>
std::string SdpaProblem<T>::batch_index_string(Index b) const {
    Shape idx(batch_shape.size(), 0);
    for (std::size_t d = batch_shape.size(); d-- > 0;) {
        idx[d] = b % batch_shape[d];
        b /= batch_shape[d];
    }
    return to_string(idx);
}

template <class T>
SdpaProblem<T> make_sdpa_problem(const std::string& function, TensorView<const T> q, TensorView<const T> k,
                                 TensorView<const T> v, std::optional<TensorView<const bool>> allowed_mask,
                                 const SdpaOptions& options) {
    const auto shapes = [&] {
        return " (" + shapes_of(allowed_mask ? &*allowed_mask : nullptr, q.shape(), k.shape(), v.shape()) + ")";
    };
    if (q.rank() < 2 || k.rank() < 2 || v.rank() < 2)
        throw ShapeError(function + ": q, k and v need rank >= 2 (..., T, D)" + shapes());
    SdpaProblem<T> p;
    p.function = function;
    p.shapes = shapes_of(allowed_mask ? &*allowed_mask : nullptr, q.shape(), k.shape(), v.shape());
    p.Tq = q.dim(-2);
    p.Tk = k.dim(-2);
    p.Dk = q.dim(-1);
    p.Dv = v.dim(-1);
    if (k.dim(-1) != p.Dk)
        throw ShapeError(function + ": q has Dk=" + std::to_string(p.Dk) + " but k has Dk=" + std::to_string(k.dim(-1)) +
                         shapes());
    if (v.dim(-2) != p.Tk)
        throw ShapeError(function + ": k has Tk=" + std::to_string(p.Tk) + " but v has Tk=" + std::to_string(v.dim(-2)) +
                         shapes());
    const Shape qb(q.shape().begin(), q.shape().end() - 2);
    const Shape kb(k.shape().begin(), k.shape().end() - 2);
    const Shape vb(v.shape().begin(), v.shape().end() - 2);
    try {
        p.batch_shape = broadcast_shapes(broadcast_shapes(qb, kb, function, "q", "k"), vb, function, "q/k", "v");
    } catch (const ShapeError&) {
        throw ShapeError(function + ": batch dims of q, k and v do not broadcast" + shapes());
    }
    p.batch = numel(p.batch_shape);
    const auto with = [&](Index a, Index b) {
        Shape s = p.batch_shape;
        s.push_back(a);
        s.push_back(b);
        return s;
    };
    p.q = q.broadcast_to(with(p.Tq, p.Dk), function, "q");
    p.k = k.broadcast_to(with(p.Tk, p.Dk), function, "k");
    p.v = v.broadcast_to(with(p.Tk, p.Dv), function, "v");
    if (allowed_mask) {
        const Shape target = with(p.Tq, p.Tk);
        if (allowed_mask->rank() > static_cast<Index>(target.size()))
            throw ShapeError(function + ": allowed_mask " + to_string(allowed_mask->shape()) +
                             " has more dims than the scores " + to_string(target) + shapes());
        try {
            p.allowed_mask = broadcast_allowed_mask(*allowed_mask, target, function);
        } catch (const ShapeError&) {
            throw ShapeError(function + ": allowed_mask " + to_string(allowed_mask->shape()) +
                             " does not broadcast to the scores (batch..., Tq, Tk) = " + to_string(target) + shapes());
        }
    }
    p.scale = options.scale ? *options.scale : (p.Dk > 0 ? 1.0 / std::sqrt(static_cast<double>(p.Dk)) : 1.0);
    if (!std::isfinite(p.scale) || !std::isfinite(static_cast<T>(p.scale)))
        throw ConfigError(function + ": scale must be finite in the input dtype, got " + std::to_string(p.scale) +
                          shapes());
    if (options.num_threads < 0)
        throw ConfigError(function + ": num_threads must be >= 0, got " + std::to_string(options.num_threads) +
                          shapes());
    p.is_causal = options.is_causal;
    p.alignment = options.alignment;
    const Index br = static_cast<Index>(p.batch_shape.size());
    p.q_offset = batch_offsets(p.q, br, p.batch_shape);
    p.k_offset = batch_offsets(p.k, br, p.batch_shape);
    p.v_offset = batch_offsets(p.v, br, p.batch_shape);
    if (p.allowed_mask) p.mask_offset = batch_offsets(*p.allowed_mask, br, p.batch_shape);
    return p;
}

template <class T>
Readability readability(const SdpaProblem<T>& p, Index b) {
    Readability r;
    r.key_readable.assign(static_cast<std::size_t>(p.Tk), 0);
    r.row_nonempty.assign(static_cast<std::size_t>(p.Tq), 0);
    Index readable_end = 0;  // without an explicit mask the readable keys are [0, max over rows of end)
    for (Index i = 0; i < p.Tq; ++i) {
        Index end = p.Tk;  // the causal rule limits row i to the keys [0, end)
        if (p.is_causal)
            end = causal_end(i, p.Tq, p.Tk, p.alignment);
        bool any = false;
        if (!p.allowed_mask) {
            any = end > 0;
            readable_end = std::max(readable_end, end);
        } else {
            const bool* row = p.allowed_mask->data() + p.mask_offset[b] + i * p.allowed_mask->stride(-2);
            const Index s = p.allowed_mask->stride(-1);
            for (Index j = 0; j < end; ++j)
                if (row[j * s]) {
                    r.key_readable[static_cast<std::size_t>(j)] = 1;
                    any = true;
                }
        }
        r.row_nonempty[static_cast<std::size_t>(i)] = any;
        if (!any && r.first_empty_row < 0) r.first_empty_row = i;
    }
    if (!p.allowed_mask) std::fill_n(r.key_readable.begin(), readable_end, 1);
    return r;
}

template <class T>
std::vector<Readability> check_contracts(const SdpaProblem<T>& p, const SdpaOptions& options) {
    std::vector<Readability> all;
    all.reserve(static_cast<std::size_t>(p.batch));
    for (Index b = 0; b < p.batch; ++b) {
        all.push_back(readability(p, b));
        const Readability& r = all.back();
        if (r.first_empty_row >= 0 && options.empty_rows == EmptyRowPolicy::Throw) {
            throw MaskError(no_allowed_key_message(
                p.function, "query row " + std::to_string(r.first_empty_row) + " of batch index " + p.batch_index_string(b),
                p.Tq, p.Tk, p.is_causal, p.alignment, p.shapes));
        }
    }
    if (!options.check_finite) return all;
    const auto fail = [&](const char* name, const Shape& shape, Index b, Index row, Index col, double value) {
        throw ValueError(p.function + ": " + name + " " + to_string(shape) + " holds " + std::to_string(value) +
                         " at batch index " + p.batch_index_string(b) + ", row " + std::to_string(row) + ", column " +
                         std::to_string(col) + ", a position some query reads (" + p.shapes +
                         "; disable check_finite to allow it)");
    };
    // Strides read once: TensorView::stride checks its argument, which keeps it out of the inner loops.
    const Index qs = p.q.stride(-1), ks = p.k.stride(-1), vs = p.v.stride(-1);
    for (Index b = 0; b < p.batch; ++b) {
        const Readability& r = all[static_cast<std::size_t>(b)];
        for (Index i = 0; i < p.Tq; ++i) {
            if (!r.row_nonempty[static_cast<std::size_t>(i)]) continue;
            const T* row = p.q_row(b, i);
            for (Index d = 0; d < p.Dk; ++d)
                if (!finite(row[d * qs])) fail("q", p.q.shape(), b, i, d, row[d * qs]);
        }
        for (Index j = 0; j < p.Tk; ++j) {
            if (!r.key_readable[static_cast<std::size_t>(j)]) continue;
            const T* krow = p.k_row(b, j);
            for (Index d = 0; d < p.Dk; ++d)
                if (!finite(krow[d * ks])) fail("k", p.k.shape(), b, j, d, krow[d * ks]);
            const T* vrow = p.v_row(b, j);
            for (Index d = 0; d < p.Dv; ++d)
                if (!finite(vrow[d * vs])) fail("v", p.v.shape(), b, j, d, vrow[d * vs]);
        }
    }
    return all;
}

#define ATTN_INSTANTIATE(T)                                                                                        \
    template struct SdpaProblem<T>;                                                                                \
    template SdpaProblem<T> make_sdpa_problem<T>(const std::string&, TensorView<const T>, TensorView<const T>,     \
                                                 TensorView<const T>, std::optional<TensorView<const bool>>,      \
                                                 const SdpaOptions&);                                             \
    template Readability readability<T>(const SdpaProblem<T>&, Index);                                            \
    template std::vector<Readability> check_contracts<T>(const SdpaProblem<T>&, const SdpaOptions&);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
#undef ATTN_INSTANTIATE

}  // namespace attn
