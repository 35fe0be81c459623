// MultiHeadAttention: projections through detail::gemm (BLIS), heads as strided views, the SDPA core per (B, H).
#include "attn/mha.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attn/detail/splitmix64.hpp"
#include "backends.hpp"
#include "gemm.hpp"

namespace attn {

namespace {

std::string str(Index n) { return std::to_string(n); }

using detail::splitmix64_mix;
using detail::splitmix64_next;
using detail::unit_uniform;

// Whether dropout keeps attention weight `index` (flat over (B, H, Tq, Tk)) at draw `step`.
bool dropout_keeps(const MhaDropout& dropout, std::uint64_t step, Index index) {
    const std::uint64_t h =
        splitmix64_mix(splitmix64_mix(splitmix64_mix(dropout.seed) ^ step) ^ static_cast<std::uint64_t>(index));
    return unit_uniform(h) >= dropout.p;
}

void check_dropout(const std::string& function, double p) {
    if (!(p >= 0.0 && p < 1.0))
        throw ConfigError(function + ": dropout probability must be in [0, 1), got " + std::to_string(p));
}

// Masks resolved once per call: one allowed view broadcast to (B, H, Tq, Tk), owning storage when the caller's
// mask and key padding had to be combined.
struct HeadMasks {
    std::optional<Tensor<bool>> owned;
    std::optional<TensorView<const bool>> allowed;  // (B, H, Tq, Tk), stride 0 on broadcast dims
    std::string shapes;                             // ", allowed_mask [..], key_padding_allowed [..]" for messages
};

HeadMasks resolve_masks(const std::string& function, const std::string& input_shapes,
                        std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options, Index B,
                        Index H, Index Tq, Index Tk) {
    HeadMasks m;
    if (allowed_mask) m.shapes += ", allowed_mask " + to_string(allowed_mask->shape());
    if (options.key_padding_allowed) m.shapes += ", key_padding_allowed " + to_string(options.key_padding_allowed->shape());
    const MhaMaskViews views = mha_mask_views(function, " (" + input_shapes + m.shapes + ")", allowed_mask,
                                              options.key_padding_allowed, B, H, Tq, Tk);
    const Shape target{B, H, Tq, Tk};
    if (views.mask && views.padding) {
        m.owned = logical_and(*views.mask, *views.padding);  // (B or 1, H or 1, Tq or 1, Tk): no full-size copy
        m.allowed = m.owned->view().broadcast_to(target, function, "allowed_mask");
    } else if (views.mask) {
        m.allowed = views.mask->broadcast_to(target, function, "allowed_mask");
    } else if (views.padding) {
        m.allowed = views.padding->broadcast_to(target, function, "key_padding_allowed");
    }
    return m;
}

// Who reads what, per (batch, head): the basis of the empty-row policy, the finite checks and the gathers.
struct HeadReadability {
    Index B = 0, H = 0, Tq = 0, Tk = 0;
    std::vector<char> row_nonempty;  // (B, H, Tq): query row has an allowed key in this head
    std::vector<char> key_readable;  // (B, H, Tk): some query row of this head may read the key
    Index first_empty = -1;          // flat (b, h, i) of the first empty row, -1 if none

    bool nonempty(Index b, Index h, Index i) const { return row_nonempty[static_cast<std::size_t>((b * H + h) * Tq + i)]; }
    bool readable(Index b, Index h, Index j) const { return key_readable[static_cast<std::size_t>((b * H + h) * Tk + j)]; }
};

HeadReadability head_readability(const HeadMasks& masks, const MhaOptions& options, Index B, Index H, Index Tq,
                                 Index Tk) {
    HeadReadability r;
    r.B = B, r.H = H, r.Tq = Tq, r.Tk = Tk;
    r.row_nonempty.assign(static_cast<std::size_t>(B * H * Tq), 0);
    r.key_readable.assign(static_cast<std::size_t>(B * H * Tk), 0);
    const std::optional<TensorView<const bool>>& m = masks.allowed;
    const bool same_over_b = !m || m->stride(0) == 0, same_over_h = !m || m->stride(1) == 0;
    for (Index b = 0; b < B; ++b) {
        for (Index h = 0; h < H; ++h) {
            char* rows = r.row_nonempty.data() + (b * H + h) * Tq;
            char* keys = r.key_readable.data() + (b * H + h) * Tk;
            if (b > 0 && same_over_b) {  // a mask broadcast over B (or none): copy batch element 0
                std::copy_n(r.row_nonempty.data() + h * Tq, Tq, rows);
                std::copy_n(r.key_readable.data() + h * Tk, Tk, keys);
                continue;
            }
            if (h > 0 && same_over_h) {
                std::copy_n(r.row_nonempty.data() + b * H * Tq, Tq, rows);
                std::copy_n(r.key_readable.data() + b * H * Tk, Tk, keys);
                continue;
            }
            for (Index i = 0; i < Tq; ++i) {
                Index end = Tk;  // the causal rule limits row i to the keys [0, end)
                if (options.is_causal)
                    end = causal_end(i, Tq, Tk, options.alignment);
                if (!m) {
                    rows[i] = end > 0;
                    std::fill_n(keys, end, 1);
                    continue;
                }
                const bool* row = m->data() + b * m->stride(0) + h * m->stride(1) + i * m->stride(2);
                for (Index j = 0; j < end; ++j)
                    if (row[j * m->stride(3)]) rows[i] = keys[j] = 1;
            }
        }
    }
    for (std::size_t f = 0; f < r.row_nonempty.size(); ++f)
        if (!r.row_nonempty[f]) {
            r.first_empty = static_cast<Index>(f);
            break;
        }
    return r;
}

void throw_if_empty_row(const std::string& function, const HeadReadability& r, const HeadMasks& masks,
                        const MhaOptions& options, const std::string& input_shapes) {
    if (r.first_empty < 0 || options.empty_rows != EmptyRowPolicy::Throw) return;
    const Index i = r.first_empty % r.Tq, h = (r.first_empty / r.Tq) % r.H, b = r.first_empty / (r.Tq * r.H);
    throw MaskError(no_allowed_key_message(function,
                                           "query row " + str(i) + " of batch " + str(b) + ", head " + str(h), r.Tq,
                                           r.Tk, options.is_causal, options.alignment, input_shapes + masks.shapes));
}

template <class T>
[[noreturn]] void throw_not_finite(const std::string& function, const std::string& name, const Shape& shape,
                                   const std::string& where, T value, const char* why) {
    throw ValueError(function + ": " + name + " " + to_string(shape) + " holds " + std::to_string(value) + " at " +
                     where + ", " + why);
}

// rows (B, T, W): every element of row (b, t) must be finite when read(b, t).
template <class T, class Read>
void check_rows(const std::string& function, const std::string& name, TensorView<const T> rows, Read read,
                const char* why) {
    for (Index b = 0; b < rows.dim(0); ++b)
        for (Index t = 0; t < rows.dim(1); ++t) {
            if (!read(b, t)) continue;
            const T* row = rows.data() + b * rows.stride(0) + t * rows.stride(1);
            for (Index c = 0; c < rows.dim(2); ++c)
                if (!std::isfinite(row[c * rows.stride(2)]))
                    throw_not_finite(function, name, rows.shape(),
                                     "batch " + str(b) + ", row " + str(t) + ", column " + str(c),
                                     row[c * rows.stride(2)], why);
        }
}

// Projected heads (B, T, heads * D): the D columns of head (b, head, t) must be finite when read(b, head, t).
template <class T, class Read>
void check_head_rows(const std::string& function, const std::string& name, TensorView<const T> rows, Index heads,
                     Read read, const char* why) {
    const Index D = heads > 0 ? rows.dim(2) / heads : 0;
    for (Index b = 0; b < rows.dim(0); ++b)
        for (Index t = 0; t < rows.dim(1); ++t)
            for (Index g = 0; g < heads; ++g) {
                if (!read(b, g, t)) continue;
                const T* row = rows.data() + b * rows.stride(0) + t * rows.stride(1);
                for (Index c = g * D; c < (g + 1) * D; ++c)
                    if (!std::isfinite(row[c * rows.stride(2)]))
                        throw_not_finite(function, name, rows.shape(),
                                         "batch " + str(b) + ", row " + str(t) + ", column " + str(c) + " (head " +
                                             str(g) + ")",
                                         row[c * rows.stride(2)], why);
            }
}

constexpr const char* kReadPosition = "a position some query reads (disable check_finite to allow it)";
constexpr const char* kOverflow = "although every input it reads is finite: the projection overflowed; scale the inputs down";

// Whether BLIS takes the (T, W) matrices of this (B, T, W) view as they are: row-major with non-overlapping rows.
// Anything else (column-major, broadcast stride 0, overlapping views) is copied once: BLIS picks its small-matrix
// kernels by storage, with different summation orders, and the output must not depend on the input's strides.
template <class T>
bool gemm_friendly(TensorView<const T> x) {
    const Index st = x.stride(1), sw = x.stride(2);
    return sw == 1 && st >= x.dim(2);
}

// y (B, T, out) = x (B, T, in) @ weight^T (in, out) + bias (out); weight (out, in) is PyTorch's layout.
// One gemm per batch element, batch elements spread over threads: each element's arithmetic is the same whatever
// the thread count, so the result is bitwise reproducible.
template <class T>
Tensor<T> project(TensorView<const T> x, const Tensor<T>& weight, const Tensor<T>& bias, int num_threads) {
    const Index B = x.dim(0), Tn = x.dim(1), in = x.dim(2), out = weight.dim(0);
    std::optional<Tensor<T>> contiguous;
    if (!gemm_friendly(x)) {
        contiguous = Tensor<T>::copy_of(x);
        x = contiguous->view();
    }
    const bool has_bias = bias.numel() > 0;
    Tensor<T> y({B, Tn, out});
    detail::parallel_for(B, detail::thread_count(num_threads), [&](Index b) {
        T* yb = y.data() + b * Tn * out;  // (Tn, out)
        if (has_bias)
            for (Index t = 0; t < Tn; ++t) std::copy_n(bias.data(), out, yb + t * out);
        // yb (Tn, out) = x_b (Tn, in) @ weight^T (in, out) + yb
        detail::gemm<T>(false, true, Tn, out, in, T(1), x.data() + b * x.stride(0), x.stride(1), x.stride(2),
                        weight.data(), in, 1, has_bias ? T(1) : T(0), yb, out, 1);
    });
    return y;
}

// The head path shared by the module and multi_head_sdpa, after validation and the contract checks:
//   q (B, Tq, H*Dk), k (B, Tk, G*Dk), v (B, Tk, G*Dv) -> context (B, Tq, H*Dv) (+ weights).
// Heads are views: h = g*R + r with R = H/G, so q reads as (B, G, R, Tq, Dk) and k as (B, G, 1, Tk, Dk) with a
// stride-0 R dim: every query head of group g reads kv head g = h / R, and no K/V head is ever copied.
template <class T>
MhaResult<T> attend_heads(const std::string& function, TensorView<const T> q, TensorView<const T> k,
                          TensorView<const T> v, Index H, Index G, const HeadMasks& masks,
                          const HeadReadability& readable, const MhaOptions& options, const MhaDropout& dropout) {
    const Index B = q.dim(0), Tq = q.dim(1), Tk = k.dim(1), R = H / G;
    const Index Dk = H > 0 ? q.dim(2) / H : 0, Dv = G > 0 ? v.dim(2) / G : 0;
    const bool apply_dropout = options.training && dropout.p > 0.0;

    // split: (B, Tq, H*Dk) -> (B, Tq, G, R, Dk) -> transpose -> (B, G, R, Tq, Dk), strides only.
    const TensorView<const T> q5(q.data(), {B, G, R, Tq, Dk},
                                 {q.stride(0), R * Dk * q.stride(2), Dk * q.stride(2), q.stride(1), q.stride(2)});
    // (B, Tk, G*Dk) -> (B, G, 1, Tk, Dk); the size-1 dim broadcasts over the R query heads of the group.
    const TensorView<const T> k5(k.data(), {B, G, 1, Tk, Dk}, {k.stride(0), Dk * k.stride(2), 0, k.stride(1), k.stride(2)});
    const TensorView<const T> v5(v.data(), {B, G, 1, Tk, Dv}, {v.stride(0), Dv * v.stride(2), 0, v.stride(1), v.stride(2)});
    std::optional<TensorView<const bool>> mask5;
    if (masks.allowed) {
        // allowed (B, H, Tq, Tk) -> (B, G, R, Tq, Tk): head h = g*R + r.
        const TensorView<const bool>& m = *masks.allowed;
        mask5 = TensorView<const bool>(m.data(), {B, G, R, Tq, Tk},
                                       {m.stride(0), R * m.stride(1), m.stride(1), m.stride(2), m.stride(3)});
    }

    SdpaOptions sdpa;
    sdpa.scale = options.scale;  // default 1/sqrt(Dk), SDPA's
    sdpa.is_causal = options.is_causal;
    sdpa.alignment = options.alignment;
    sdpa.empty_rows = options.empty_rows;
    sdpa.check_finite = options.check_finite;
    sdpa.return_weights = apply_dropout || options.weights != MhaWeights::None;
    sdpa.backend = options.backend;
    sdpa.num_threads = options.num_threads;
    // out (B, G, R, Tq, Dv) and weights (B, G, R, Tq, Tk): contiguous, i.e. (B, H, Tq, Dv) and (B, H, Tq, Tk).
    SdpaResult<T> attended = scaled_dot_product_attention(q5, k5, v5, mask5, sdpa);

    MhaResult<T> result{Tensor<T>({B, Tq, H * Dv}), std::nullopt};
    T* context = result.output.data();  // (B, Tq, H*Dv)
    if (!apply_dropout) {
        // merge: (B, H, Tq, Dv) -> transpose -> (B, Tq, H, Dv) -> (B, Tq, H*Dv), the concatenation of the heads.
        const T* out = attended.output.data();
        for (Index b = 0; b < B; ++b)
            for (Index h = 0; h < H; ++h)
                for (Index i = 0; i < Tq; ++i)
                    std::copy_n(out + ((b * H + h) * Tq + i) * Dv, Dv, context + (b * Tq + i) * H * Dv + h * Dv);
    } else {
        // Dropout on the weights (B, H, Tq, Tk), kept ones rescaled by 1/(1-p); then context = weights @ v per head,
        // written straight into the merged (B, Tq, H*Dv) layout. NaN * 0 stays NaN, as in PyTorch's dropout.
        T* weights = attended.weights->data();
        const T keep_scale = static_cast<T>(1.0 / (1.0 - dropout.p));
        detail::parallel_for(B * H, detail::thread_count(options.num_threads), [&](Index bh) {
            const Index b = bh / H, h = bh % H, g = h / R;
            T* w = weights + bh * Tq * Tk;  // (Tq, Tk)
            for (Index f = 0; f < Tq * Tk; ++f)
                w[f] *= dropout_keeps(dropout, options.dropout_step, bh * Tq * Tk + f) ? keep_scale : T(0);
            // Only readable keys enter the product: a padding value times weight 0 would still be NaN if it is NaN.
            std::vector<Index> keys;
            for (Index j = 0; j < Tk; ++j)
                if (readable.readable(b, h, j)) keys.push_back(j);
            const Index n = static_cast<Index>(keys.size());
            std::vector<T> wc(static_cast<std::size_t>(Tq * n)), vc(static_cast<std::size_t>(n * Dv));  // (Tq, n), (n, Dv)
            for (Index i = 0; i < Tq; ++i)
                for (Index c = 0; c < n; ++c) wc[static_cast<std::size_t>(i * n + c)] = w[i * Tk + keys[c]];
            for (Index c = 0; c < n; ++c)
                for (Index d = 0; d < Dv; ++d)
                    vc[static_cast<std::size_t>(c * Dv + d)] =
                        v.data()[b * v.stride(0) + keys[c] * v.stride(1) + (g * Dv + d) * v.stride(2)];
            T* ctx = context + b * Tq * H * Dv + h * Dv;  // (Tq, Dv) with row stride H*Dv
            // ctx (Tq, Dv) = wc (Tq, n) @ vc (n, Dv)
            if (n > 0)
                detail::gemm<T>(false, false, Tq, Dv, n, T(1), wc.data(), n, 1, vc.data(), Dv, 1, T(0), ctx, H * Dv, 1);
            for (Index i = 0; i < Tq; ++i) {
                if (!readable.nonempty(b, h, i)) {
                    detail::write_empty_row<T>(options.empty_rows, ctx + i * H * Dv, Dv, nullptr, 0);
                } else if (options.check_finite) {
                    for (Index d = 0; d < Dv; ++d)
                        if (!std::isfinite(ctx[i * H * Dv + d]))
                            detail::throw_overflow(function, "the output (dropped-out weights @ v)",
                                                   "[" + str(b) + "," + str(h) + "]", i);
                }
            }
        });
    }

    if (options.weights == MhaWeights::PerHead) {
        result.weights = std::move(*attended.weights).reshaped({B, H, Tq, Tk});
    } else if (options.weights == MhaWeights::HeadAverage) {
        // average: (B, H, Tq, Tk) -> (B, Tq, Tk), sum over heads in order then divide by H.
        Tensor<T> average({B, Tq, Tk});
        const T* w = attended.weights->data();
        for (Index b = 0; b < B; ++b)
            for (Index f = 0; f < Tq * Tk; ++f) {
                T sum = 0;
                for (Index h = 0; h < H; ++h) sum += w[(b * H + h) * Tq * Tk + f];
                average[b * Tq * Tk + f] = sum / static_cast<T>(H);
            }
        result.weights = std::move(average);
    }
    return result;
}

void check_call_options(const std::string& function, const MhaOptions& options) {
    if (options.scale && !std::isfinite(*options.scale))
        throw ConfigError(function + ": scale must be finite, got " + std::to_string(*options.scale));
    if (options.num_threads < 0)
        throw ConfigError(function + ": num_threads must be >= 0, got " + std::to_string(options.num_threads));
}

template <class T>
MhaResult<T> multi_head_sdpa_impl(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, Index H,
                                  Index G, std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options,
                                  const MhaDropout& dropout) {
    const std::string function = "multi_head_sdpa";
    const std::string shapes = "q_projected " + to_string(q.shape()) + ", k_projected " + to_string(k.shape()) +
                               ", v_projected " + to_string(v.shape());
    if (H < 1 || G < 1 || H % G != 0)
        throw ConfigError(function + ": num_heads=" + str(H) + " must be a positive multiple of num_kv_heads=" + str(G));
    if (q.rank() != 3 || k.rank() != 3 || v.rank() != 3)
        throw ShapeError(function + ": q_projected, k_projected and v_projected must be (B, T, heads*D) (" + shapes + ")");
    const Index B = q.dim(0), Tq = q.dim(1), Tk = k.dim(1);
    if (k.dim(0) != B || v.dim(0) != B)
        throw ShapeError(function + ": q_projected, k_projected and v_projected must have the same B (" + shapes + ")");
    if (v.dim(1) != Tk)
        throw ShapeError(function + ": k_projected has Tk=" + str(Tk) + " but v_projected has Tk=" + str(v.dim(1)) + " (" +
                         shapes + ")");
    if (q.dim(2) % H != 0)
        throw ShapeError(function + ": q_projected width " + str(q.dim(2)) + " is not a multiple of num_heads=" + str(H) +
                         " (" + shapes + ")");
    const Index Dk = q.dim(2) / H;
    if (k.dim(2) != G * Dk)
        throw ShapeError(function + ": k_projected width must be num_kv_heads * Dk = " + str(G) + "*" + str(Dk) + ", got " +
                         str(k.dim(2)) + " (" + shapes + ")");
    if (v.dim(2) % G != 0)
        throw ShapeError(function + ": v_projected width " + str(v.dim(2)) + " is not a multiple of num_kv_heads=" + str(G) +
                         " (" + shapes + ")");
    check_dropout(function, dropout.p);
    check_call_options(function, options);
    const HeadMasks masks = resolve_masks(function, shapes, allowed_mask, options, B, H, Tq, Tk);
    const HeadReadability readable = head_readability(masks, options, B, H, Tq, Tk);
    throw_if_empty_row(function, readable, masks, options, shapes);
    if (options.check_finite) {
        // Per head: a NaN in a head slice nobody reads must not matter, as in SDPA.
        const Index R = H / G;
        const auto kv_read = [&](Index b, Index g, Index j) {
            for (Index r = 0; r < R; ++r)
                if (readable.readable(b, g * R + r, j)) return true;
            return false;
        };
        check_head_rows(function, "q_projected", q, H, [&](Index b, Index h, Index i) { return readable.nonempty(b, h, i); },
                        kReadPosition);
        check_head_rows(function, "k_projected", k, G, kv_read, kReadPosition);
        check_head_rows(function, "v_projected", v, G, kv_read, kReadPosition);
    }
    return attend_heads<T>(function, q, k, v, H, G, masks, readable, options, dropout);
}

template <class T>
SdpaResult<T> mha_sdpa_path_impl(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                 std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) {
    const std::string function = "mha_sdpa_path";
    const auto shapes = [&] {
        std::string s = "q " + to_string(q.shape()) + ", k " + to_string(k.shape()) + ", v " + to_string(v.shape());
        if (allowed_mask) s += ", allowed_mask " + to_string(allowed_mask->shape());
        return " (" + s + ")";
    };
    if (q.rank() < 2 || k.rank() < 2 || v.rank() < 2)
        throw ShapeError(function + ": q, k and v need rank >= 2 (..., T, D)" + shapes());
    const Index Tq = q.dim(-2), Tk = k.dim(-2), Dk = q.dim(-1), Dv = v.dim(-1);
    if (k.dim(-1) != Dk) throw ShapeError(function + ": q has Dk=" + str(Dk) + " but k has Dk=" + str(k.dim(-1)) + shapes());
    if (v.dim(-2) != Tk) throw ShapeError(function + ": k has Tk=" + str(Tk) + " but v has Tk=" + str(v.dim(-2)) + shapes());

    // The last batch dim is the heads, the ones before it fold into B. Grouped kv heads (rank 4, k and v with
    // G > 1 heads, G != H) are the one form beyond NumPy broadcasting; everything else broadcasts as in SDPA.
    const bool grouped = q.rank() == 4 && k.rank() == 4 && v.rank() == 4 && k.dim(1) == v.dim(1) && k.dim(1) > 1 &&
                         k.dim(1) != q.dim(1);
    Shape batch;  // (leading..., H)
    Index G = 1;
    if (grouped) {
        if (q.dim(1) % k.dim(1) != 0)
            throw ShapeError(function + ": q has H=" + str(q.dim(1)) + " heads, not a multiple of the G=" + str(k.dim(1)) +
                             " kv heads of k" + shapes());
        const Index B = broadcast_shapes(broadcast_shapes({q.dim(0)}, {k.dim(0)}, function, "q", "k"), {v.dim(0)}, function,
                                         "q/k", "v")[0];
        batch = {B, q.dim(1)};
        G = k.dim(1);
    } else {
        const auto batch_of = [](TensorView<const T> t) { return Shape(t.shape().begin(), t.shape().end() - 2); };
        try {
            batch = broadcast_shapes(broadcast_shapes(batch_of(q), batch_of(k), function, "q", "k"), batch_of(v), function,
                                     "q/k", "v");
        } catch (const ShapeError&) {
            throw ShapeError(function + ": batch dims of q, k and v do not broadcast" + shapes());
        }
        if (batch.empty()) batch = {1};
        // One kv head serves every query head when neither k nor v has more than one head.
        const auto heads_of = [](TensorView<const T> t) { return t.rank() > 2 ? t.dim(-3) : Index(1); };
        G = heads_of(k) == 1 && heads_of(v) == 1 ? 1 : batch.back();
    }
    const Index H = batch.back();
    const Shape leading(batch.begin(), batch.end() - 1);
    const Index B = numel(leading);
    const auto with = [&](Shape s, std::initializer_list<Index> tail) {
        s.insert(s.end(), tail);
        return s;
    };
    const auto with_heads = [&](Index heads, Index a, Index b) { return with(leading, {heads, a, b}); };
    Shape output_shape = with(batch, {Tq, Dv}), weights_shape = with(batch, {Tq, Tk});
    if (q.rank() == 2 && k.rank() == 2 && v.rank() == 2) output_shape = {Tq, Dv}, weights_shape = {Tq, Tk};
    if (G > 1 && H % G != 0)
        throw ShapeError(function + ": q has H=" + str(H) + " heads, not a multiple of the G=" + str(G) + " kv heads" + shapes());
    // The mask is checked before the empty-batch answer below: a mask that does not broadcast is an error whatever
    // the batch holds, as in SDPA (found by the backends fuzzer: a [2,0,1,1] mask against scores [1,0,1,1]).
    std::optional<TensorView<const bool>> mask_full;  // broadcast to (batch..., Tq, Tk)
    if (allowed_mask) {
        const Shape target = with(batch, {Tq, Tk});
        if (allowed_mask->rank() > static_cast<Index>(target.size()))
            throw ShapeError(function + ": allowed_mask has more dims than the scores " + to_string(target) + shapes());
        try {
            mask_full = allowed_mask->broadcast_to(target, function, "allowed_mask");
        } catch (const ShapeError&) {
            throw ShapeError(function + ": allowed_mask does not broadcast to the scores " + to_string(target) + shapes());
        }
    }
    if (H == 0 || B == 0) {  // no heads or no batch: SDPA's answer is empty too
        SdpaResult<T> empty{Tensor<T>(output_shape), std::nullopt};
        if (options.return_weights) empty.weights = Tensor<T>(weights_shape);
        return empty;
    }
    std::optional<Tensor<bool>> mask4;  // (B, H, Tq, Tk), contiguous
    if (mask_full) mask4 = Tensor<bool>::copy_of(*mask_full).reshaped({B, H, Tq, Tk});
    // Lay the heads out as the module's projected width: x (B, T, heads*D), x[b, t, h*D + d] = in[b, h, t, d].
    const auto pack = [&](TensorView<const T> view, Index heads, Index Tn, Index D) {
        // (leading..., heads, Tn, D) contiguous, i.e. (B, heads, Tn, D) in memory.
        const Tensor<T> full = Tensor<T>::copy_of(view.broadcast_to(with_heads(heads, Tn, D), function, "input"));
        Tensor<T> x({B, Tn, heads * D});
        for (Index b = 0; b < B; ++b)
            for (Index h = 0; h < heads; ++h)
                for (Index t = 0; t < Tn; ++t)
                    std::copy_n(full.data() + ((b * heads + h) * Tn + t) * D, D, x.data() + (b * Tn + t) * heads * D + h * D);
        return x;
    };
    const Tensor<T> xq = pack(q, H, Tq, Dk), xk = pack(k, G, Tk, Dk), xv = pack(v, G, Tk, Dv);
    MhaOptions mha;
    mha.is_causal = options.is_causal;
    mha.alignment = options.alignment;
    mha.weights = options.return_weights ? MhaWeights::PerHead : MhaWeights::None;
    mha.scale = options.scale;  // default 1/sqrt(Dk), as in SDPA
    mha.empty_rows = options.empty_rows;
    mha.check_finite = options.check_finite;
    mha.backend = options.backend;
    mha.num_threads = options.num_threads;
    std::optional<TensorView<const bool>> mask_view;
    if (mask4) mask_view = mask4->view();
    MhaResult<T> r = multi_head_sdpa_impl<T>(xq, xk, xv, H, G, mask_view, mha, {});
    // unpack: context (B, Tq, H*Dv) -> (B, Tq, H, Dv) -> transpose -> (B, H, Tq, Dv) -> (batch..., Tq, Dv).
    const TensorView<const T> context(r.output.data(), {B, H, Tq, Dv}, {Tq * H * Dv, Dv, H * Dv, 1});
    SdpaResult<T> result{Tensor<T>::copy_of(context).reshaped(output_shape), std::nullopt};
    if (r.weights) result.weights = std::move(*r.weights).reshaped(weights_shape);
    return result;
}

}  // namespace

// ---------------------------------------------------------------------------------------------- the module

template <class T>
MultiHeadAttention<T>::MultiHeadAttention(const MhaConfig& config) {
    const std::string function = "MultiHeadAttention";
    E_ = config.embed_dim;
    H_ = config.num_heads;
    G_ = config.num_kv_heads.value_or(H_);
    kdim_ = config.kdim.value_or(E_);
    vdim_ = config.vdim.value_or(E_);
    const std::string given = " (embed_dim=" + str(E_) + ", num_heads=" + str(H_) + ", num_kv_heads=" + str(G_) +
                              ", kdim=" + str(kdim_) + ", vdim=" + str(vdim_) + ")";
    if (E_ < 1 || H_ < 1 || G_ < 1 || kdim_ < 1 || vdim_ < 1)
        throw ConfigError(function + ": every size must be >= 1" + given);
    if (E_ % H_ != 0)
        throw ConfigError(function + ": embed_dim=" + str(E_) + " is not divisible by num_heads=" + str(H_) +
                          "; heads split the width (head_dim = embed_dim / num_heads)" + given);
    if (H_ % G_ != 0)
        throw ConfigError(function + ": num_heads=" + str(H_) + " is not a multiple of num_kv_heads=" + str(G_) +
                          "; each kv head serves num_heads / num_kv_heads query heads" + given);
    check_dropout(function, config.dropout);
    Dh_ = E_ / H_;
    bias_ = config.bias;
    dropout_ = config.dropout;
    dropout_seed_ = config.dropout_seed;
    const Index kv = G_ * Dh_;
    q_weight_ = Tensor<T>({E_, E_});
    k_weight_ = Tensor<T>({kv, kdim_});
    v_weight_ = Tensor<T>({kv, vdim_});
    out_weight_ = Tensor<T>({E_, E_});
    if (bias_) {
        q_bias_ = Tensor<T>({E_});
        k_bias_ = Tensor<T>({kv});
        v_bias_ = Tensor<T>({kv});
        out_bias_ = Tensor<T>({E_});
    } else {
        q_bias_ = k_bias_ = v_bias_ = out_bias_ = Tensor<T>({0});
    }
    // Xavier-uniform (Glorot & Bengio 2010): U(-a, a), a = sqrt(6 / (fan_in + fan_out)).
    std::uint64_t state = config.init_seed;
    const auto fill = [&](Tensor<T>& w, double bound) {
        for (Index f = 0; f < w.numel(); ++f)
            w[f] = static_cast<T>((2.0 * unit_uniform(splitmix64_next(state)) - 1.0) * bound);
    };
    const auto xavier = [](Index fan_in, Index fan_out) { return std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)); };
    if (G_ == H_ && kdim_ == E_ && vdim_ == E_) {
        const double a = xavier(E_, 3 * E_);  // PyTorch: xavier_uniform_ on the packed (3E, E) in_proj_weight
        fill(q_weight_, a), fill(k_weight_, a), fill(v_weight_, a);
    } else {
        fill(q_weight_, xavier(E_, E_)), fill(k_weight_, xavier(kdim_, kv)), fill(v_weight_, xavier(vdim_, kv));
    }
    fill(out_weight_, 1.0 / std::sqrt(static_cast<double>(E_)));  // nn.Linear's default: kaiming_uniform(a=sqrt(5))
}

template <class T>
Index MultiHeadAttention<T>::parameter_count() const {
    return q_weight_.numel() + k_weight_.numel() + v_weight_.numel() + out_weight_.numel() + q_bias_.numel() +
           k_bias_.numel() + v_bias_.numel() + out_bias_.numel();
}

namespace {
template <class T>
void set_parameter(const char* setter, const char* name, Tensor<T>& target, TensorView<const T> value) {
    if (value.shape() != target.shape())
        throw ShapeError(std::string("MultiHeadAttention::") + setter + ": " + name + " must be " +
                         to_string(target.shape()) + ", got " + to_string(value.shape()));
    target = Tensor<T>::copy_of(value);
}
}  // namespace

template <class T>
void MultiHeadAttention<T>::set_q_proj_weight(TensorView<const T> w) { set_parameter("set_q_proj_weight", "q_proj_weight", q_weight_, w); }
template <class T>
void MultiHeadAttention<T>::set_k_proj_weight(TensorView<const T> w) { set_parameter("set_k_proj_weight", "k_proj_weight", k_weight_, w); }
template <class T>
void MultiHeadAttention<T>::set_v_proj_weight(TensorView<const T> w) { set_parameter("set_v_proj_weight", "v_proj_weight", v_weight_, w); }
template <class T>
void MultiHeadAttention<T>::set_out_proj_weight(TensorView<const T> w) {
    set_parameter("set_out_proj_weight", "out_proj_weight", out_weight_, w);
}

template <class T>
void MultiHeadAttention<T>::set_in_proj_weight(TensorView<const T> w) {
    const std::string function = "MultiHeadAttention::set_in_proj_weight";
    if (G_ != H_ || kdim_ != E_ || vdim_ != E_)
        throw ConfigError(function + ": a packed in_proj_weight needs num_kv_heads == num_heads and kdim == vdim == "
                          "embed_dim (num_heads=" + str(H_) + ", num_kv_heads=" + str(G_) + ", kdim=" + str(kdim_) +
                          ", vdim=" + str(vdim_) + ", embed_dim=" + str(E_) + "); set q, k, v separately");
    if (w.shape() != Shape{3 * E_, E_})
        throw ShapeError(function + ": in_proj_weight must be " + to_string(Shape{3 * E_, E_}) + " = (3E, E), got " +
                         to_string(w.shape()));
    // rows [0, E) are q, [E, 2E) k, [2E, 3E) v, as nn.MultiheadAttention packs them.
    q_weight_ = Tensor<T>::copy_of(w.slice(0, 0, E_));
    k_weight_ = Tensor<T>::copy_of(w.slice(0, E_, 2 * E_));
    v_weight_ = Tensor<T>::copy_of(w.slice(0, 2 * E_, 3 * E_));
}

namespace {
void require_bias(bool bias, const char* setter) {
    if (!bias)
        throw ConfigError(std::string("MultiHeadAttention::") + setter +
                          ": the module was built with bias=false, so it has no biases to set");
}
}  // namespace

template <class T>
void MultiHeadAttention<T>::set_q_proj_bias(TensorView<const T> b) {
    require_bias(bias_, "set_q_proj_bias");
    set_parameter("set_q_proj_bias", "q_proj_bias", q_bias_, b);
}
template <class T>
void MultiHeadAttention<T>::set_k_proj_bias(TensorView<const T> b) {
    require_bias(bias_, "set_k_proj_bias");
    set_parameter("set_k_proj_bias", "k_proj_bias", k_bias_, b);
}
template <class T>
void MultiHeadAttention<T>::set_v_proj_bias(TensorView<const T> b) {
    require_bias(bias_, "set_v_proj_bias");
    set_parameter("set_v_proj_bias", "v_proj_bias", v_bias_, b);
}
template <class T>
void MultiHeadAttention<T>::set_out_proj_bias(TensorView<const T> b) {
    require_bias(bias_, "set_out_proj_bias");
    set_parameter("set_out_proj_bias", "out_proj_bias", out_bias_, b);
}

template <class T>
void MultiHeadAttention<T>::set_in_proj_bias(TensorView<const T> b) {
    const std::string function = "MultiHeadAttention::set_in_proj_bias";
    require_bias(bias_, "set_in_proj_bias");
    // Unlike the weight, the packed bias exists whatever kdim and vdim are (nn.MultiheadAttention keeps it then too).
    if (G_ != H_)
        throw ConfigError(function + ": a packed in_proj_bias needs num_kv_heads == num_heads (num_heads=" + str(H_) +
                          ", num_kv_heads=" + str(G_) + "); set q, k, v biases separately");
    if (b.shape() != Shape{3 * E_})
        throw ShapeError(function + ": in_proj_bias must be " + to_string(Shape{3 * E_}) + " = (3E), got " +
                         to_string(b.shape()));
    q_bias_ = Tensor<T>::copy_of(b.slice(0, 0, E_));
    k_bias_ = Tensor<T>::copy_of(b.slice(0, E_, 2 * E_));
    v_bias_ = Tensor<T>::copy_of(b.slice(0, 2 * E_, 3 * E_));
}

template <class T>
MhaResult<T> MultiHeadAttention<T>::forward_self(TensorView<const T> x, std::optional<TensorView<const bool>> allowed_mask,
                                                 const MhaOptions& options) const {
    return run("MultiHeadAttention::forward_self", x, x, x, allowed_mask, options);
}

template <class T>
MhaResult<T> MultiHeadAttention<T>::forward_cross(TensorView<const T> query_states, TensorView<const T> memory_states,
                                                  std::optional<TensorView<const bool>> allowed_mask,
                                                  const MhaOptions& options) const {
    if (kdim_ != vdim_)
        throw ConfigError("MultiHeadAttention::forward_cross: memory_states gives keys and values, but kdim=" + str(kdim_) +
                          " != vdim=" + str(vdim_) + "; use forward(query_states, key_states, value_states)");
    return run("MultiHeadAttention::forward_cross", query_states, memory_states, memory_states, allowed_mask, options);
}

template <class T>
MhaResult<T> MultiHeadAttention<T>::forward(TensorView<const T> query_states, TensorView<const T> key_states,
                                            TensorView<const T> value_states,
                                            std::optional<TensorView<const bool>> allowed_mask,
                                            const MhaOptions& options) const {
    return run("MultiHeadAttention::forward", query_states, key_states, value_states, allowed_mask, options);
}

template <class T>
MhaResult<T> MultiHeadAttention<T>::forward_blocked(TensorView<const T> query_states, TensorView<const T> key_states,
                                                    TensorView<const T> value_states,
                                                    std::optional<TensorView<const bool>> blocked_mask,
                                                    std::optional<TensorView<const bool>> key_padding_blocked,
                                                    const MhaOptions& options) const {
    const std::string function = "MultiHeadAttention::forward_blocked";
    if (key_padding_blocked && options.key_padding_allowed)
        throw ConfigError(function + ": key padding given twice (key_padding_blocked and options.key_padding_allowed); "
                          "give it in one convention");
    // The one conversion of the blocked convention (true = ignore) to the library's allowed convention.
    std::optional<Tensor<bool>> allowed, padding_allowed;
    if (blocked_mask) allowed = blocked_to_allowed(*blocked_mask);
    if (key_padding_blocked) padding_allowed = blocked_to_allowed(*key_padding_blocked);
    MhaOptions converted = options;
    if (padding_allowed) converted.key_padding_allowed = padding_allowed->view();
    std::optional<TensorView<const bool>> allowed_view;
    if (allowed) allowed_view = allowed->view();
    return run(function.c_str(), query_states, key_states, value_states, allowed_view, converted);
}

template <class T>
MhaResult<T> MultiHeadAttention<T>::run(const char* function_name, TensorView<const T> query_states,
                                        TensorView<const T> key_states, TensorView<const T> value_states,
                                        std::optional<TensorView<const bool>> allowed_mask,
                                        const MhaOptions& options) const {
    const std::string function = function_name;
    const std::string shapes = "query_states " + to_string(query_states.shape()) + ", key_states " +
                               to_string(key_states.shape()) + ", value_states " + to_string(value_states.shape());
    const std::string config = "embed_dim=" + str(E_) + ", kdim=" + str(kdim_) + ", vdim=" + str(vdim_);
    if (query_states.rank() != 3 || key_states.rank() != 3 || value_states.rank() != 3)
        throw ShapeError(function + ": inputs must be (B, T, features) (" + shapes + ")");
    if (query_states.dim(2) != E_ || key_states.dim(2) != kdim_ || value_states.dim(2) != vdim_)
        throw ShapeError(function + ": feature widths must be query " + str(E_) + ", key " + str(kdim_) + ", value " +
                         str(vdim_) + " (" + config + "; " + shapes + ")");
    const Index B = query_states.dim(0), Tq = query_states.dim(1), Tk = key_states.dim(1);
    if (key_states.dim(0) != B || value_states.dim(0) != B)
        throw ShapeError(function + ": query, key and value states must have the same B (" + shapes + ")");
    if (value_states.dim(1) != Tk)
        throw ShapeError(function + ": key_states has Tk=" + str(Tk) + " but value_states has Tk=" +
                         str(value_states.dim(1)) + " (" + shapes + ")");
    check_call_options(function, options);
    const HeadMasks masks = resolve_masks(function, shapes, allowed_mask, options, B, H_, Tq, Tk);
    const HeadReadability readable = head_readability(masks, options, B, H_, Tq, Tk);
    throw_if_empty_row(function, readable, masks, options, shapes);

    const auto query_read = [&](Index b, Index i) {
        for (Index h = 0; h < H_; ++h)
            if (readable.nonempty(b, h, i)) return true;
        return false;
    };
    const auto key_read = [&](Index b, Index j) {
        for (Index h = 0; h < H_; ++h)
            if (readable.readable(b, h, j)) return true;
        return false;
    };
    if (options.check_finite) {
        const auto check_parameter = [&](const char* name, const Tensor<T>& p) {
            const Index cols = p.rank() == 2 ? p.dim(1) : p.numel();
            for (Index f = 0; f < p.numel(); ++f)
                if (!std::isfinite(p[f]))
                    throw_not_finite(function, name, p.shape(),
                                     p.rank() == 2 ? "row " + str(f / cols) + ", column " + str(f % cols) : "index " + str(f),
                                     p[f], "and every parameter is read (disable check_finite to allow it)");
        };
        check_parameter("q_proj_weight", q_weight_), check_parameter("k_proj_weight", k_weight_);
        check_parameter("v_proj_weight", v_weight_), check_parameter("out_proj_weight", out_weight_);
        check_parameter("q_proj_bias", q_bias_), check_parameter("k_proj_bias", k_bias_);
        check_parameter("v_proj_bias", v_bias_), check_parameter("out_proj_bias", out_bias_);
        check_rows<T>(function, "query_states", query_states, query_read, kReadPosition);
        check_rows<T>(function, "key_states", key_states, key_read, kReadPosition);
        check_rows<T>(function, "value_states", value_states, key_read, kReadPosition);
    }

    // 1. projections: q (B, Tq, E), k (B, Tk, G*Dh), v (B, Tk, G*Dh).
    const Tensor<T> q = project<T>(query_states, q_weight_, q_bias_, options.num_threads);
    const Tensor<T> k = project<T>(key_states, k_weight_, k_bias_, options.num_threads);
    const Tensor<T> v = project<T>(value_states, v_weight_, v_bias_, options.num_threads);
    if (options.check_finite) {
        const Index R = H_ / G_;
        const auto kv_read = [&](Index b, Index g, Index j) {
            for (Index r = 0; r < R; ++r)
                if (readable.readable(b, g * R + r, j)) return true;
            return false;
        };
        check_head_rows<T>(function, "q (projected)", q, H_, [&](Index b, Index h, Index i) { return readable.nonempty(b, h, i); },
                           kOverflow);
        check_head_rows<T>(function, "k (projected)", k, G_, kv_read, kOverflow);
        check_head_rows<T>(function, "v (projected)", v, G_, kv_read, kOverflow);
    }

    // 2. heads: split, SDPA over (B, H), merge -> context (B, Tq, E).
    MhaResult<T> result = attend_heads<T>(function, q, k, v, H_, G_, masks, readable, options, {dropout_, dropout_seed_});

    // 3. output projection: (B, Tq, E) @ out_proj_weight^T (E, E) + out_proj_bias.
    result.output = project<T>(result.output.view(), out_weight_, out_bias_, options.num_threads);
    if (options.check_finite) {
        const auto complete = [&](Index b, Index i) {  // rows untouched by the empty-row policy
            for (Index h = 0; h < H_; ++h)
                if (!readable.nonempty(b, h, i)) return false;
            return true;
        };
        check_rows<T>(function, "output", result.output.view(), complete, kOverflow);
    }
    return result;
}

template class MultiHeadAttention<float>;
template class MultiHeadAttention<double>;

MhaResult<float> multi_head_sdpa(TensorView<const float> q_projected, TensorView<const float> k_projected,
                                 TensorView<const float> v_projected, Index num_heads, Index num_kv_heads,
                                 std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options,
                                 const MhaDropout& dropout) {
    return multi_head_sdpa_impl<float>(q_projected, k_projected, v_projected, num_heads, num_kv_heads, allowed_mask,
                                       options, dropout);
}
MhaResult<double> multi_head_sdpa(TensorView<const double> q_projected, TensorView<const double> k_projected,
                                  TensorView<const double> v_projected, Index num_heads, Index num_kv_heads,
                                  std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options,
                                  const MhaDropout& dropout) {
    return multi_head_sdpa_impl<double>(q_projected, k_projected, v_projected, num_heads, num_kv_heads, allowed_mask,
                                        options, dropout);
}

SdpaResult<float> mha_sdpa_path(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                                std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) {
    return mha_sdpa_path_impl<float>(q, k, v, allowed_mask, options);
}
SdpaResult<double> mha_sdpa_path(TensorView<const double> q, TensorView<const double> k, TensorView<const double> v,
                                 std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) {
    return mha_sdpa_path_impl<double>(q, k, v, allowed_mask, options);
}

MhaMaskViews mha_mask_views(const std::string& function, const std::string& shapes,
                            std::optional<TensorView<const bool>> allowed_mask,
                            std::optional<TensorView<const bool>> key_padding_allowed, Index B, Index H, Index Tq,
                            Index Tk) {
    MhaMaskViews views;
    const Shape target{B, H, Tq, Tk};
    if (allowed_mask) {
        switch (allowed_mask->rank()) {
            case 2: views.mask = allowed_mask->unsqueeze(0).unsqueeze(0); break;
            case 3: views.mask = allowed_mask->unsqueeze(1); break;
            case 4: views.mask = *allowed_mask; break;
            default:
                throw ShapeError(function + ": allowed_mask must be 2-D (Tq, Tk), 3-D (B, Tq, Tk) or 4-D (B, H, Tq, Tk), got " +
                                 to_string(allowed_mask->shape()) + shapes);
        }
        try {
            (void)views.mask->broadcast_to(target, function, "allowed_mask");
        } catch (const ShapeError&) {
            throw ShapeError(function + ": allowed_mask " + to_string(allowed_mask->shape()) +
                             " does not broadcast to (B, H, Tq, Tk) = " + to_string(target) + shapes);
        }
    }
    if (key_padding_allowed) {
        const TensorView<const bool>& kp = *key_padding_allowed;
        if (kp.rank() != 2 || kp.dim(0) != B || kp.dim(1) != Tk)
            throw ShapeError(function + ": key_padding_allowed must be (B, Tk) = " + to_string(Shape{B, Tk}) + ", got " +
                             to_string(kp.shape()) + shapes);
        views.padding = kp.unsqueeze(1).unsqueeze(1);  // the same keys for every head and query row
    }
    return views;
}

}  // namespace attn
