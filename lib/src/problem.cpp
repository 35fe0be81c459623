// The contract module: validation and resolution of one SDPA call, and the same contracts per (batch, head) for the
// MHA module (mask views, readability, empty rows, finite checks). Every backend, the module and the oracle use it.
#include "attn/detail/mha_problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <utility>

#include "attn/mha.hpp"
#include "attn/tiled.hpp"

namespace attn {

namespace {

std::string shapes_of(const TensorView<const bool>* m, const Shape& q, const Shape& k, const Shape& v,
                      const std::optional<FloatView>& bias, const std::optional<FloatView>& slopes) {
    std::string s = "q " + to_string(q) + ", k " + to_string(k) + ", v " + to_string(v);
    if (m) s += ", allowed_mask " + to_string(m->shape());
    if (bias) s += ", bias " + to_string(bias->shape());
    if (slopes) s += ", alibi_slopes " + to_string(slopes->shape());
    return s;
}

template <class T>
const char* dtype_of() {
    if constexpr (std::is_same_v<T, float>) return "float32";
    else if constexpr (std::is_same_v<T, double>) return "float64";
    else if constexpr (std::is_same_v<T, float16>) return "float16";
    else return "bfloat16";
}

template <class T>
bool finite(T x) {
    return std::isfinite(x);
}

// Whether the n values of a row, `stride` apart, are all finite: branch-free and in a form the compiler vectorises
// (|x| <= max is false for NaN and both infinities; an `ok &= isfinite(x)` loop stays scalar). The caller looks for
// the first bad value only when there is one.
template <class T>
bool all_finite(const T* row, Index n, Index stride) {
    using C = compute_t<T>;
    int bad = 0;
    for (Index d = 0; d < n; ++d) bad |= !(std::fabs(static_cast<C>(row[d * stride])) <= std::numeric_limits<C>::max());
    return !bad;
}

std::string str(Index n) { return std::to_string(n); }

}  // namespace

// ------------------------------------------------------------------------------------ the predicates, one message each

namespace detail {

void check_qkv_shapes(const std::string& function, const Shape& q, const Shape& k, const Shape& v,
                      const std::string& shapes) {
    if (q.size() < 2 || k.size() < 2 || v.size() < 2)
        throw ShapeError(function + ": q, k and v need rank >= 2 (..., T, D)" + shapes);
    const Index Dk = q.back(), Tk = k[k.size() - 2];
    if (k.back() != Dk) throw ShapeError(function + ": q has Dk=" + str(Dk) + " but k has Dk=" + str(k.back()) + shapes);
    if (v[v.size() - 2] != Tk)
        throw ShapeError(function + ": k has Tk=" + str(Tk) + " but v has Tk=" + str(v[v.size() - 2]) + shapes);
}

Shape broadcast_batch_shapes(const std::string& function, const Shape& q_batch, const Shape& k_batch,
                             const Shape& v_batch, const std::string& shapes) {
    try {
        return broadcast_shapes(broadcast_shapes(q_batch, k_batch, function, "q", "k"), v_batch, function, "q/k", "v");
    } catch (const ShapeError&) {
        throw ShapeError(function + ": batch dims of q, k and v do not broadcast" + shapes);
    }
}

TensorView<const bool> broadcast_mask_to_scores(const std::string& function, TensorView<const bool> allowed_mask,
                                                const Shape& target, const std::string& shapes) {
    if (allowed_mask.rank() > static_cast<Index>(target.size()))
        throw ShapeError(function + ": allowed_mask " + to_string(allowed_mask.shape()) +
                         " has more dims than the scores " + to_string(target) + shapes);
    try {
        return broadcast_allowed_mask(allowed_mask, target, function);
    } catch (const ShapeError&) {
        throw ShapeError(function + ": allowed_mask " + to_string(allowed_mask.shape()) +
                         " does not broadcast to the scores (batch..., Tq, Tk) = " + to_string(target) + shapes);
    }
}

template <class T>
void check_scale_and_threads(const std::string& function, std::optional<double> scale, int num_threads,
                             const std::string& shapes) {
    const auto text = [](double x) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.9g", x);
        return std::string(buf);
    };
    // T is the type the logits are scaled in: the inputs' dtype, or float for 16-bit storage.
    const std::string type = std::string(sizeof(T) == 4 ? "float" : "double") + " (the type the logits are scaled in)";
    if (scale && (!std::isfinite(*scale) || !std::isfinite(static_cast<T>(*scale))))
        throw ConfigError(function + ": scale must be finite in " + type + ", got " + text(*scale) + shapes);
    // A scale below the normal range rounds with an absolute, not a relative, error (1e-50 is 0 in float): the
    // logits would lose all accuracy and no error bound relative to the scale holds (oracle/BOUNDS.md section 2).
    constexpr double smallest = std::numeric_limits<T>::min();
    if (scale && *scale != 0 && !(std::fabs(static_cast<double>(static_cast<T>(*scale))) >= smallest))
        throw ConfigError(function + ": scale " + text(*scale) + " is below the normal range of " + type +
                          ": use 0 or a magnitude of at least " + text(smallest) + shapes);
    if (num_threads < 0)
        throw ConfigError(function + ": num_threads must be >= 0, got " + std::to_string(num_threads) + shapes);
}
template <class T>
MhaStates check_mha_states(const std::string& function, TensorView<const T> query_states, TensorView<const T> key_states,
                           TensorView<const T> value_states, Index E, Index kdim, Index vdim) {
    const auto str = [](Index n) { return std::to_string(n); };
    MhaStates s;
    s.shapes = "query_states " + to_string(query_states.shape()) + ", key_states " + to_string(key_states.shape()) +
               ", value_states " + to_string(value_states.shape());
    if (query_states.rank() != 3 || key_states.rank() != 3 || value_states.rank() != 3)
        throw ShapeError(function + ": inputs must be (B, T, features) (" + s.shapes + ")");
    if (query_states.dim(2) != E || key_states.dim(2) != kdim || value_states.dim(2) != vdim)
        throw ShapeError(function + ": feature widths must be query " + str(E) + ", key " + str(kdim) + ", value " +
                         str(vdim) + " (embed_dim=" + str(E) + ", kdim=" + str(kdim) + ", vdim=" + str(vdim) + "; " +
                         s.shapes + ")");
    s.B = query_states.dim(0), s.Tq = query_states.dim(1), s.Tk = key_states.dim(1);
    if (key_states.dim(0) != s.B || value_states.dim(0) != s.B)
        throw ShapeError(function + ": query, key and value states must have the same B (" + s.shapes + ")");
    if (value_states.dim(1) != s.Tk)
        throw ShapeError(function + ": key_states has Tk=" + str(s.Tk) + " but value_states has Tk=" +
                         str(value_states.dim(1)) + " (" + s.shapes + ")");
    return s;
}

template MhaStates check_mha_states<float>(const std::string&, TensorView<const float>, TensorView<const float>,
                                           TensorView<const float>, Index, Index, Index);
template MhaStates check_mha_states<double>(const std::string&, TensorView<const double>, TensorView<const double>,
                                            TensorView<const double>, Index, Index, Index);
template MhaStates check_mha_states<float16>(const std::string&, TensorView<const float16>, TensorView<const float16>,
                                             TensorView<const float16>, Index, Index, Index);
template MhaStates check_mha_states<bfloat16>(const std::string&, TensorView<const bfloat16>,
                                              TensorView<const bfloat16>, TensorView<const bfloat16>, Index, Index,
                                              Index);

void check_tiled_blocks(const std::string& function, Index query_block, Index key_block, const std::string& shapes) {
    if (query_block < 0 || key_block < 0)
        throw ConfigError(function + ": tiled_query_block and tiled_key_block must be >= 0 (0 = the tiled kernel's " +
                          std::to_string(tiled_query_block) + " and " + std::to_string(tiled_key_block) + "), got " +
                          std::to_string(query_block) + " and " + std::to_string(key_block) + shapes);
}

void check_window(const std::string& function, const SlidingWindow& window, const std::string& shapes) {
    if (window.left < -1 || window.right < -1)
        throw ConfigError(function + ": a sliding window's sides must be -1 (unbounded) or >= 0, got " +
                          to_string(window) + shapes);
}

namespace {

// The option's view when it has the inputs' dtype T, a ConfigError naming it otherwise.
template <class T>
const TensorView<const T>& float_option_view(const std::string& function, const char* name, const FloatView& option,
                                             const std::string& shapes) {
    const TensorView<const T>* view = option.get<T>();
    if (!view)
        throw ConfigError(function + ": " + name + " has dtype " + option.dtype_name() + " but q, k and v have dtype " +
                          dtype_of<T>() + "; give it in the inputs' dtype" + shapes);
    return *view;
}

// A float tensor option (SdpaOptions::bias, alibi_slopes): of the inputs' dtype T (ConfigError otherwise) and
// broadcastable to `target` (ShapeError otherwise, naming it as `target_name` and `target_detail`, with `hint`); the
// view broadcast to it.
template <class T>
TensorView<const T> broadcast_float_option(const std::string& function, const char* name, const FloatView& option,
                                           const Shape& target, const char* target_name, const char* target_detail,
                                           const char* hint, const std::string& shapes) {
    const TensorView<const T>* view = &float_option_view<T>(function, name, option, shapes);
    const std::string refused = function + ": " + name + " " + to_string(view->shape());
    if (view->rank() > static_cast<Index>(target.size()))
        throw ShapeError(refused + " has more dims than " + target_name + " " + to_string(target) + hint + shapes);
    try {
        return view->broadcast_to(target, function, name);
    } catch (const ShapeError&) {
        throw ShapeError(refused + " does not broadcast to " + target_name + target_detail + " " + to_string(target) +
                         hint + shapes);
    }
}

}  // namespace

template <class T>
TensorView<const T> broadcast_bias_to_scores(const std::string& function, const FloatView& bias, const Shape& target,
                                             const std::string& shapes) {
    return broadcast_float_option<T>(function, "bias", bias, target, "the scores", " (batch..., Tq, Tk) =", "", shapes);
}

template <class T>
TensorView<const T> broadcast_alibi_slopes(const std::string& function, const FloatView& slopes,
                                           const Shape& batch_shape, const std::string& shapes) {
    return broadcast_float_option<T>(function, "alibi_slopes", slopes, batch_shape, "the batch shape", "",
                                     " (one slope per batch element, e.g. (H) or (B, H) for q (B, H, Tq, Dk))", shapes);
}

#define ATTN_INSTANTIATE(T)                                                                                        \
    template TensorView<const T> broadcast_bias_to_scores<T>(const std::string&, const FloatView&, const Shape&,   \
                                                             const std::string&);                                \
    template TensorView<const T> broadcast_alibi_slopes<T>(const std::string&, const FloatView&, const Shape&,     \
                                                           const std::string&);
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

template <class T>
void check_softcap(const std::string& function, double softcap, const std::string& shapes) {
    if (softcap == 0) return;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", softcap);
    const std::string type = std::string(sizeof(T) == 4 ? "float" : "double") + " (the type the logits are computed in)";
    // Finite and positive, and a normal number once rounded to T: its rounding is then relative, as the scale's.
    const double rounded = static_cast<double>(static_cast<T>(softcap));
    if (!(softcap > 0) || !std::isfinite(rounded) || !(rounded >= std::numeric_limits<T>::min()))
        throw ConfigError(function + ": softcap must be 0 (off) or a positive number, finite and normal in " + type +
                          ", got " + buf + shapes);
}

template void check_softcap<float>(const std::string&, double, const std::string&);
template void check_softcap<double>(const std::string&, double, const std::string&);
template void check_scale_and_threads<float>(const std::string&, std::optional<double>, int, const std::string&);
template void check_scale_and_threads<double>(const std::string&, std::optional<double>, int, const std::string&);

Index row_readability(const bool* allowed, Index row_stride, Index key_stride, Index Tq, Index Tk,
                      const PositionRule& positions, char* rows, char* keys) {
    std::fill_n(rows, Tq, 0);
    std::fill_n(keys, Tk, 0);
    // Both ends of a row's key range never decrease with i (the causal end and the window's sides move with the
    // query), so without a mask the readable keys are the ranges' union, marked once each: [max(begin, marked), end).
    Index first_empty = -1, marked = 0;
    for (Index i = 0; i < Tq; ++i) {
        const KeyRange range = positions.keys(i, Tq, Tk);  // row i reads keys [begin, end) at most
        if (!allowed) {
            rows[i] = range.end > range.begin;
            for (Index j = std::max(range.begin, marked); j < range.end; ++j) keys[j] = 1;
            marked = std::max(marked, range.end);
        } else {
            const bool* row = allowed + i * row_stride;
            for (Index j = range.begin; j < range.end; ++j)
                if (row[j * key_stride]) rows[i] = keys[j] = 1;
        }
        if (!rows[i] && first_empty < 0) first_empty = i;
    }
    return first_empty;
}

HeadReadability head_readability(const std::optional<TensorView<const bool>>& allowed, const PositionRule& positions,
                                 Index B, Index H, Index Tq, Index Tk) {
    HeadReadability r;
    r.B = B, r.H = H, r.Tq = Tq, r.Tk = Tk;
    r.row_nonempty.assign(static_cast<std::size_t>(B * H * Tq), 0);
    r.key_readable.assign(static_cast<std::size_t>(B * H * Tk), 0);
    const bool same_over_b = !allowed || allowed->stride(0) == 0, same_over_h = !allowed || allowed->stride(1) == 0;
    for (Index b = 0; b < B; ++b) {
        for (Index h = 0; h < H; ++h) {
            char* rows = r.row_nonempty.data() + (b * H + h) * Tq;
            char* keys = r.key_readable.data() + (b * H + h) * Tk;
            if (b > 0 && same_over_b) {  // a mask broadcast over B (or none): copy batch element 0
                std::copy_n(r.row_nonempty.data() + h * Tq, Tq, rows);
                std::copy_n(r.key_readable.data() + h * Tk, Tk, keys);
            } else if (h > 0 && same_over_h) {
                std::copy_n(r.row_nonempty.data() + b * H * Tq, Tq, rows);
                std::copy_n(r.key_readable.data() + b * H * Tk, Tk, keys);
            } else if (allowed) {
                const TensorView<const bool>& m = *allowed;
                row_readability(m.data() + b * m.stride(0) + h * m.stride(1), m.stride(2), m.stride(3), Tq, Tk,
                                positions, rows, keys);
            } else {
                row_readability(nullptr, 0, 0, Tq, Tk, positions, rows, keys);
            }
        }
    }
    const auto empty = std::find(r.row_nonempty.begin(), r.row_nonempty.end(), 0);
    if (empty != r.row_nonempty.end()) r.first_empty = static_cast<Index>(empty - r.row_nonempty.begin());
    return r;
}

void throw_if_empty_head_row(const std::string& function, const HeadReadability& r, const PositionRule& positions,
                             EmptyRowPolicy empty_rows, const std::string& shapes) {
    if (r.first_empty < 0 || empty_rows != EmptyRowPolicy::Throw) return;
    const Index i = r.first_empty % r.Tq, h = (r.first_empty / r.Tq) % r.H, b = r.first_empty / (r.Tq * r.H);
    throw no_allowed_key_error(function, "query row " + str(i) + " of batch " + str(b) + ", head " + str(h), r.Tq, r.Tk,
                               positions, shapes);
}

void throw_not_finite(const std::string& function, const std::string& name, const Shape& shape, double value,
                      const std::string& where, const NotFiniteReason& why) {
    const std::string problem =
        function + ": " + name + " " + to_string(shape) + " holds " + std::to_string(value) + " at " + where + ", " + why.text;
    if (why.check_finite_allows) throw ValueError(problem, Remedy{"check_finite", {"false"}, "to allow it"});
    throw ValueError(problem);
}

std::string batch_row_column(const std::string& batch_index, Index row, Index column) {
    return "batch index " + batch_index + ", row " + str(row) + ", column " + str(column);
}

NotFiniteReason read_position_reason(const std::string& shapes) {
    return {"a position some query reads (" + shapes + ")", true};
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------- the SDPA problem

Shape FloatView::shape() const {
    return std::visit([](const auto& v) { return v.shape(); }, view_);
}

const char* FloatView::dtype_name() const {
    return std::visit([](const auto& v) { return dtype_of<typename std::decay_t<decltype(v)>::value_type>(); }, view_);
}

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
Shape SdpaProblem<T>::lse_shape() const {
    Shape s = batch_shape;
    s.push_back(Tq);
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
    SdpaProblem<T> p;
    p.function = function;
    p.shapes = shapes_of(allowed_mask ? &*allowed_mask : nullptr, q.shape(), k.shape(), v.shape(), options.bias, options.alibi_slopes);
    const std::string shapes = " (" + p.shapes + ")";
    detail::check_qkv_shapes(function, q.shape(), k.shape(), v.shape(), shapes);
    p.Tq = q.dim(-2);
    p.Tk = k.dim(-2);
    p.Dk = q.dim(-1);
    p.Dv = v.dim(-1);
    const Shape qb(q.shape().begin(), q.shape().end() - 2);
    const Shape kb(k.shape().begin(), k.shape().end() - 2);
    const Shape vb(v.shape().begin(), v.shape().end() - 2);
    p.batch_shape = detail::broadcast_batch_shapes(function, qb, kb, vb, shapes);
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
    if (allowed_mask) p.allowed_mask = detail::broadcast_mask_to_scores(function, *allowed_mask, with(p.Tq, p.Tk), shapes);
    if (options.bias) {
        p.bias = detail::broadcast_bias_to_scores<T>(function, *options.bias, with(p.Tq, p.Tk), shapes);
        p.bias_row_stride = p.bias->stride(-2);
        p.bias_key_stride = p.bias->stride(-1);
    }
    if (options.alibi_slopes)
        p.alibi = detail::broadcast_alibi_slopes<T>(function, *options.alibi_slopes, p.batch_shape, shapes);
    // The default 1/sqrt(Dk) is finite in every dtype; only a given scale can fail the check. The scale multiplies in
    // the compute type (float for the 16-bit storage types), so that is the type it must fit.
    detail::check_scale_and_threads<compute_t<T>>(function, options.scale, options.num_threads, shapes);
    detail::check_tiled_blocks(function, options.tiled_query_block, options.tiled_key_block, shapes);
    p.scale = resolved_scale(options.scale, p.Dk);
    p.positions = detail::position_rule(function, options, shapes);
    detail::check_softcap<compute_t<T>>(function, options.softcap, shapes);
    p.softcap = options.softcap;
    const Index br = static_cast<Index>(p.batch_shape.size());
    p.q_offset = detail::batch_offsets(p.q, br, p.batch_shape);
    p.k_offset = detail::batch_offsets(p.k, br, p.batch_shape);
    p.v_offset = detail::batch_offsets(p.v, br, p.batch_shape);
    if (p.allowed_mask) p.mask_offset = detail::batch_offsets(*p.allowed_mask, br, p.batch_shape);
    if (p.bias) p.bias_offset = detail::batch_offsets(*p.bias, br, p.batch_shape);
    if (p.alibi) p.alibi_offset = detail::batch_offsets(*p.alibi, br, p.batch_shape);
    return p;
}

namespace {

// Per batch element b, the first batch element whose explicit mask and bias are those of b (b itself when none
// before it shares them): a bias or mask broadcast over heads is looked at once, not once per head. Only with a bias.
template <class T>
std::vector<Index> first_with_same_bias(const SdpaProblem<T>& p) {
    std::vector<Index> first(static_cast<std::size_t>(p.batch));
    std::map<std::pair<Index, Index>, Index> seen;
    for (Index b = 0; b < p.batch; ++b) {
        const std::pair<Index, Index> slices{p.allowed_mask ? p.mask_offset[b] : 0, p.bias_offset[b]};
        first[static_cast<std::size_t>(b)] = seen.emplace(slices, b).first->second;
    }
    return first;
}

}  // namespace

namespace {

// The readability of the causal rule, the window and the mask alone (what a problem without a bias has).
template <class T>
Readability positions_readability(const SdpaProblem<T>& p, Index b) {
    Readability r;
    r.key_readable.assign(static_cast<std::size_t>(p.Tk), 0);
    r.row_nonempty.assign(static_cast<std::size_t>(p.Tq), 0);
    const std::optional<TensorView<const bool>>& m = p.allowed_mask;
    r.first_empty_row = detail::row_readability(m ? m->data() + p.mask_offset[b] : nullptr, m ? m->stride(-2) : 0,
                                                m ? m->stride(-1) : 0, p.Tq, p.Tk, p.positions,
                                                r.row_nonempty.data(), r.key_readable.data());
    return r;
}

// Under check_finite: a ValueError naming the first NaN/Inf that some query reads (q of the nonempty rows, k and v
// of the readable keys, the bias where the rule and the mask let a query read).
template <class T>
void check_finite_inputs(const SdpaProblem<T>& p, const std::vector<Readability>& all) {
    const auto fail = [&](const char* name, const Shape& shape, Index b, Index row, Index col, double value) {
        detail::throw_not_finite(p.function, name, shape, value, detail::batch_row_column(p.batch_index_string(b), row, col),
                                 detail::read_position_reason(p.shapes));
    };
    // Strides read once: TensorView::stride checks its argument, which keeps it out of the inner loops.
    const Index qs = p.q.stride(-1), ks = p.k.stride(-1), vs = p.v.stride(-1);
    // Row `row` of tensor `name`: n values `stride` apart, looked at one by one only when one of them is not finite.
    const auto check_row = [&](const char* name, const Shape& shape, Index b, Index row, const T* x, Index n,
                               Index stride) {
        if (all_finite(x, n, stride)) return;
        for (Index d = 0; d < n; ++d)
            if (!finite(x[d * stride])) fail(name, shape, b, row, d, x[d * stride]);
    };
    for (Index b = 0; b < p.batch; ++b) {
        const Readability& r = all[static_cast<std::size_t>(b)];
        for (Index i = 0; i < p.Tq; ++i)
            if (r.row_nonempty[static_cast<std::size_t>(i)]) check_row("q", p.q.shape(), b, i, p.q_row(b, i), p.Dk, qs);
        for (Index j = 0; j < p.Tk; ++j) {
            if (!r.key_readable[static_cast<std::size_t>(j)]) continue;
            check_row("k", p.k.shape(), b, j, p.k_row(b, j), p.Dk, ks);
            check_row("v", p.v.shape(), b, j, p.v_row(b, j), p.Dv, vs);
        }
        // The bias where the rule and the mask let a query read: -inf blocks the key, NaN and +inf are errors (found
        // by readability's pass).
        if (r.bad_bias_row >= 0)
            fail("bias", p.bias->shape(), b, r.bad_bias_row, r.bad_bias_key,
                 p.explicit_bias(b, r.bad_bias_row, r.bad_bias_key));
    }
}

}  // namespace

namespace {

// ALiBi's slopes, whatever check_finite says: a NaN slope or a term -slope * |i + Tk - Tq - j| beyond the compute
// type's range would turn every logit of its batch element into NaN or -inf.
template <class T>
void check_alibi_slopes(const SdpaProblem<T>& p) {
    if (p.alibi)
        for (Index b = 0; b < p.batch; ++b)
            detail::check_alibi_slope(p.function, p.alibi_slope(b), p.Tq, p.Tk, p.alibi->shape(),
                                      "batch index " + p.batch_index_string(b), " (" + p.shapes + ")");
}

}  // namespace

template <class T>
Readability readability(const SdpaProblem<T>& p, Index b) {
    Readability r;
    r.key_readable.assign(static_cast<std::size_t>(p.Tk), 0);
    r.row_nonempty.assign(static_cast<std::size_t>(p.Tq), 0);
    if (p.bias) {  // a -inf bias blocks its key: every position the rule and the mask allow is looked at
        const auto neg_inf = -std::numeric_limits<compute_t<T>>::infinity();
        char* const readable = r.key_readable.data();
        // Rows without a mask whose bias is finite over their whole range read every key of it: one vectorised
        // finiteness pass, the range counted here (+1 at its begin, -1 at its end) and the keys marked at the end.
        std::vector<Index> cover(static_cast<std::size_t>(p.Tk) + 1, 0);
        for (Index i = 0; i < p.Tq; ++i) {
            const KeyRange range = p.positions.keys(i, p.Tq, p.Tk);
            const BiasRow<T> row(p, b, i);
            if (!row.mask && row.bias_stride == 1 && range.end > range.begin &&
                all_finite(row.bias + range.begin, range.end - range.begin, 1)) {
                ++cover[static_cast<std::size_t>(range.begin)];
                --cover[static_cast<std::size_t>(range.end)];
                r.row_nonempty[static_cast<std::size_t>(i)] = 1;
                continue;
            }
            // Branch-free, and the key flags written through a local pointer, so that the loop vectorises (through
            // r.key_readable, each char store might change the vector's own data pointer, reloaded every time).
            char any = 0, bad = 0;
            for (Index j = range.begin; j < range.end; ++j) {
                const auto x = row.at(j);
                const char mask_allows = row.mask_allows(j);
                const char reads = mask_allows & (x != neg_inf);
                readable[j] |= reads;
                any |= reads;
                bad |= mask_allows & !(x < -neg_inf);  // NaN or +inf
            }
            if (bad && r.bad_bias_row < 0)
                for (Index j = range.begin; j < range.end && r.bad_bias_row < 0; ++j)
                    if (row.mask_allows(j) && !(row.at(j) < -neg_inf)) r.bad_bias_row = i, r.bad_bias_key = j;
            r.row_nonempty[static_cast<std::size_t>(i)] = any;
            if (!any && r.first_empty_row < 0) r.first_empty_row = i;
        }
        Index rows_reading = 0;
        for (Index j = 0; j < p.Tk; ++j) {
            rows_reading += cover[static_cast<std::size_t>(j)];
            readable[j] |= static_cast<char>(rows_reading > 0);
        }
        return r;
    }
    return positions_readability(p, b);
}

template <class T>
std::vector<Readability> check_contracts(const SdpaProblem<T>& p, const SdpaOptions& options, bool defer_values) {
    // The passes over the values deferred to the kernel (Readability::values_deferred): the rule's and the mask's
    // readability, which a finite bias leaves as it is. What they would refuse (an empty row), the checks with the
    // bias decide instead: its -inf entries may empty a row first. ALiBi's slopes are still checked here (not with an
    // explicit bias: its readability would need the bias read).
    const bool bias_deferrable = !p.bias || (!p.alibi && std::is_same_v<T, compute_t<T>>);
    if (defer_values && options.check_finite && bias_deferrable) {
        std::vector<Readability> all;
        all.reserve(static_cast<std::size_t>(p.batch));
        for (Index b = 0; b < p.batch; ++b) {
            all.push_back(positions_readability(p, b));
            all.back().values_deferred = true;
            if (all.back().first_empty_row >= 0 && options.empty_rows == EmptyRowPolicy::Throw)
                return check_contracts(p, options);
        }
        check_alibi_slopes(p);
        return all;
    }
    std::vector<Readability> all;
    all.reserve(static_cast<std::size_t>(p.batch));
    // With a bias, readability looks at every (query, key) pair: batch elements that share their mask and bias (a
    // bias broadcast over heads) share it.
    const std::vector<Index> same = p.bias ? first_with_same_bias(p) : std::vector<Index>{};
    const auto first_of = [&](Index b) { return p.bias ? same[static_cast<std::size_t>(b)] : b; };
    for (Index b = 0; b < p.batch; ++b) {
        all.push_back(first_of(b) == b ? readability(p, b) : all[static_cast<std::size_t>(first_of(b))]);
        const Readability& r = all.back();
        if (r.first_empty_row >= 0 && options.empty_rows == EmptyRowPolicy::Throw) {
            throw no_allowed_key_error(
                p.function, "query row " + std::to_string(r.first_empty_row) + " of batch index " + p.batch_index_string(b),
                p.Tq, p.Tk, p.positions, p.shapes);
        }
    }
    check_alibi_slopes(p);
    if (options.check_finite) check_finite_inputs(p, all);
    return all;
}

#define ATTN_INSTANTIATE(T)                                                                                        \
    template struct SdpaProblem<T>;                                                                                \
    template SdpaProblem<T> make_sdpa_problem<T>(const std::string&, TensorView<const T>, TensorView<const T>,     \
                                                 TensorView<const T>, std::optional<TensorView<const bool>>,      \
                                                 const SdpaOptions&);                                             \
    template Readability readability<T>(const SdpaProblem<T>&, Index);                                            \
    template std::vector<Readability> check_contracts<T>(const SdpaProblem<T>&, const SdpaOptions&, bool);
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

// ------------------------------------------------------------------------------------ the MHA module's mask contract

namespace detail {

template <class E>
TensorView<const E> mha_scores_view(const std::string& function, const std::string& shapes, const char* name,
                                    TensorView<const E> scores, Index B, Index H, Index Tq, Index Tk) {
    const Shape target{B, H, Tq, Tk};
    TensorView<const E> view = scores;
    switch (scores.rank()) {
        case 2: view = scores.unsqueeze(0).unsqueeze(0); break;
        case 3: view = scores.unsqueeze(1); break;
        case 4: break;
        default:
            throw ShapeError(function + ": " + name + " must be 2-D (Tq, Tk), 3-D (B, Tq, Tk) or 4-D (B, H, Tq, Tk), got " +
                             to_string(scores.shape()) + shapes);
    }
    try {
        (void)view.broadcast_to(target, function, name);
    } catch (const ShapeError&) {
        throw ShapeError(function + ": " + name + " " + to_string(scores.shape()) +
                         " does not broadcast to (B, H, Tq, Tk) = " + to_string(target) + shapes);
    }
    return view;
}

template <class E>
TensorView<const E> mha_key_padding_view(const std::string& function, const std::string& shapes, const char* name,
                                         TensorView<const E> padding, Index B, Index Tk) {
    if (padding.rank() != 2 || padding.dim(0) != B || padding.dim(1) != Tk)
        throw ShapeError(function + ": " + name + " must be (B, Tk) = " + to_string(Shape{B, Tk}) + ", got " +
                         to_string(padding.shape()) + shapes);
    return padding.unsqueeze(1).unsqueeze(1);  // the same keys for every head and query row
}

template <class C>
void check_alibi_slope(const std::string& function, C slope, Index Tq, Index Tk, const Shape& slopes_shape,
                       const std::string& where, const std::string& shapes) {
    const C far = static_cast<C>(std::max<Index>({Tk - 1, Tq - 1, 0}));  // the largest distance |i + Tk - Tq - j|
    if (!std::isfinite(slope) || !std::isfinite(slope * far))
        throw ValueError(function + ": alibi_slopes " + to_string(slopes_shape) + " holds " +
                         std::to_string(static_cast<double>(slope)) + " at " + where +
                         ": every slope must be finite, and slope * |i + Tk - Tq - j| too" + shapes);
}
template void check_alibi_slope<float>(const std::string&, float, Index, Index, const Shape&, const std::string&,
                                       const std::string&);
template void check_alibi_slope<double>(const std::string&, double, Index, Index, const Shape&, const std::string&,
                                        const std::string&);

namespace {

// Element (b, h, i, j) of a rank-4 view, size-1 dims read at 0.
template <class E>
const E& at4(const TensorView<const E>& x, Index b, Index h, Index i, Index j) {
    return x.data()[(x.dim(0) == 1 ? 0 : b * x.stride(0)) + (x.dim(1) == 1 ? 0 : h * x.stride(1)) +
                    (x.dim(2) == 1 ? 0 : i * x.stride(2)) + (x.dim(3) == 1 ? 0 : j * x.stride(3))];
}

// A dim of a view broadcast to the full target: 1 where it is broadcast (stride 0), else the target's size.
Index own_dim(const TensorView<const bool>& broadcast, Index d) {
    return broadcast.stride(d) == 0 ? 1 : broadcast.dim(d);
}

}  // namespace

template <class T>
HeadBias<T> resolve_bias(const std::string& function, const std::string& input_shapes, const MhaOptions& options,
                         HeadMasks& masks, Index B, Index H, Index Tq, Index Tk) {
    HeadBias<T> r;
    if (options.bias) masks.shapes += ", bias " + to_string(options.bias->shape());
    if (options.key_padding_bias) masks.shapes += ", key_padding_bias " + to_string(options.key_padding_bias->shape());
    if (options.alibi_slopes) masks.shapes += ", alibi_slopes " + to_string(options.alibi_slopes->shape());
    const std::string shapes = " (" + input_shapes + masks.shapes + ")";
    const Shape target{B, H, Tq, Tk};
    std::optional<TensorView<const T>> bias, padding, own;  // own: rank 4 with its size-1 dims
    if (options.bias)
        own = bias = mha_scores_view<T>(function, shapes, "bias", float_option_view<T>(function, "bias", *options.bias, shapes),
                                        B, H, Tq, Tk);
    if (options.key_padding_bias)
        own = padding = mha_key_padding_view<T>(
            function, shapes, "key_padding_bias",
            float_option_view<T>(function, "key_padding_bias", *options.key_padding_bias, shapes), B, Tk);
    if (bias && padding) {
        // PyTorch's merge of the two float masks, attn_mask + key_padding_mask: one addition in the dtype (in
        // compute_t<T>, rounded once).
        using C = compute_t<T>;
        const Shape shape{B, bias->dim(1), bias->dim(2), Tk};
        Tensor<T> sum(shape);
        T* out = sum.data();
        for (Index b = 0; b < shape[0]; ++b)
            for (Index h = 0; h < shape[1]; ++h)
                for (Index i = 0; i < shape[2]; ++i)
                    for (Index j = 0; j < Tk; ++j)
                        *out++ = static_cast<T>(static_cast<C>(at4(*bias, b, h, i, j)) +
                                                static_cast<C>(at4(*padding, b, 0, 0, j)));
        r.owned = std::move(sum);
        own = r.owned->view();
    }
    if (own) {
        r.name = bias && padding ? "bias + key_padding_bias" : bias ? "bias" : "key_padding_bias";
        r.shape = r.owned ? r.owned->shape() : bias ? options.bias->shape() : options.key_padding_bias->shape();
        r.bias = own->broadcast_to(target, function, "bias");
        // A -inf entry blocks its key: and-ed into the allowed mask, over the dims either of them spans.
        bool blocks = false;
        const T minus_inf = static_cast<T>(-std::numeric_limits<float>::infinity());
        for (Index b = 0; b < own->dim(0) && !blocks; ++b)
            for (Index h = 0; h < own->dim(1) && !blocks; ++h)
                for (Index i = 0; i < own->dim(2) && !blocks; ++i)
                    for (Index j = 0; j < own->dim(3) && !blocks; ++j) blocks = at4(*own, b, h, i, j) == minus_inf;
        if (blocks) {
            Shape shape(4);
            for (Index d = 0; d < 4; ++d)
                shape[static_cast<std::size_t>(d)] =
                    own->dim(d) > 1 || (masks.allowed && own_dim(*masks.allowed, d) > 1) ? target[static_cast<std::size_t>(d)] : 1;
            Tensor<bool> allowed(shape);
            bool* out = allowed.data();
            for (Index b = 0; b < shape[0]; ++b)
                for (Index h = 0; h < shape[1]; ++h)
                    for (Index i = 0; i < shape[2]; ++i)
                        for (Index j = 0; j < shape[3]; ++j)
                            *out++ = (!masks.allowed || at4(*masks.allowed, b, h, i, j)) && !(at4(*own, b, h, i, j) == minus_inf);
            masks.owned = std::move(allowed);
            masks.allowed = masks.owned->view().broadcast_to(target, function, "allowed_mask");
        }
    }
    if (options.alibi_slopes) {
        r.slopes = broadcast_alibi_slopes<T>(function, *options.alibi_slopes, {B, H}, shapes);
        r.slopes_shape = options.alibi_slopes->shape();
    }
    return r;
}

template <class T>
void check_head_slopes(const std::string& function, const HeadBias<T>& bias, Index Tq, Index Tk,
                       const std::string& shapes) {
    if (!bias.slopes) return;
    const TensorView<const T>& slopes = *bias.slopes;
    for (Index b = 0; b < slopes.dim(0); ++b)
        for (Index h = 0; h < slopes.dim(1); ++h)
            check_alibi_slope(function, static_cast<compute_t<T>>(slopes({b, h})), Tq, Tk, bias.slopes_shape,
                              "batch index " + to_string(Shape{b, h}), " (" + shapes + ")");
}

template <class T>
void check_head_bias(const std::string& function, const HeadBias<T>& bias, const HeadMasks& masks,
                     const PositionRule& positions, const std::string& shapes) {
    if (!bias.bias) return;
    const TensorView<const T>& x = *bias.bias;
    const Index B = x.dim(0), H = x.dim(1), Tq = x.dim(2), Tk = x.dim(3);
    // A slice shared by every batch element (head) is checked once.
    const bool same_b = x.stride(0) == 0 && (!masks.allowed || masks.allowed->stride(0) == 0);
    const bool same_h = x.stride(1) == 0 && (!masks.allowed || masks.allowed->stride(1) == 0);
    for (Index b = 0; b < (same_b ? std::min<Index>(B, 1) : B); ++b)
        for (Index h = 0; h < (same_h ? std::min<Index>(H, 1) : H); ++h)
            for (Index i = 0; i < Tq; ++i) {
                const KeyRange range = positions.keys(i, Tq, Tk);
                for (Index j = range.begin; j < range.end; ++j) {
                    if (masks.allowed && !at4(*masks.allowed, b, h, i, j)) continue;
                    const double value = static_cast<double>(at4(x, b, h, i, j));
                    if (std::isnan(value) || value == std::numeric_limits<double>::infinity())
                        throw_not_finite(function, bias.name, bias.shape, value,
                                         batch_row_column(to_string(Shape{b, h}), i, j), read_position_reason(shapes));
                }
            }
}

#define ATTN_INSTANTIATE(T)                                                                                         \
    template TensorView<const T> mha_scores_view<T>(const std::string&, const std::string&, const char*,            \
                                                    TensorView<const T>, Index, Index, Index, Index);              \
    template TensorView<const T> mha_key_padding_view<T>(const std::string&, const std::string&, const char*,       \
                                                         TensorView<const T>, Index, Index);                        \
    template HeadBias<T> resolve_bias<T>(const std::string&, const std::string&, const MhaOptions&, HeadMasks&,     \
                                         Index, Index, Index, Index);                                               \
    template void check_head_bias<T>(const std::string&, const HeadBias<T>&, const HeadMasks&, const PositionRule&, \
                                     const std::string&);                                                           \
    template void check_head_slopes<T>(const std::string&, const HeadBias<T>&, Index, Index, const std::string&);
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE
template TensorView<const bool> mha_scores_view<bool>(const std::string&, const std::string&, const char*,
                                                      TensorView<const bool>, Index, Index, Index, Index);
template TensorView<const bool> mha_key_padding_view<bool>(const std::string&, const std::string&, const char*,
                                                           TensorView<const bool>, Index, Index);

}  // namespace detail

MhaMaskViews mha_mask_views(const std::string& function, const std::string& shapes,
                            std::optional<TensorView<const bool>> allowed_mask,
                            std::optional<TensorView<const bool>> key_padding_allowed, Index B, Index H, Index Tq,
                            Index Tk) {
    MhaMaskViews views;
    if (allowed_mask) views.mask = detail::mha_scores_view(function, shapes, "allowed_mask", *allowed_mask, B, H, Tq, Tk);
    if (key_padding_allowed)
        views.padding = detail::mha_key_padding_view(function, shapes, "key_padding_allowed", *key_padding_allowed, B, Tk);
    return views;
}

}  // namespace attn
