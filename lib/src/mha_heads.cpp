// The MHA head path: split (B, T, heads * D) into heads by strides, SDPA over (B, H), merge; dropout on the weights.
#include "mha_heads.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "attn/detail/splitmix64.hpp"
#include "backends.hpp"
#include "gemm.hpp"

namespace attn {
namespace detail {

namespace {

std::string str(Index n) { return std::to_string(n); }

// Whether dropout keeps attention weight `index` (flat over (B, H, Tq, Tk)) at draw `step`.
bool dropout_keeps(const MhaDropout& dropout, std::uint64_t step, Index index) {
    const std::uint64_t h =
        splitmix64_mix(splitmix64_mix(splitmix64_mix(dropout.seed) ^ step) ^ static_cast<std::uint64_t>(index));
    return unit_uniform(h) >= dropout.p;
}

}  // namespace

void check_dropout(const std::string& function, double p) {
    if (!(p >= 0.0 && p < 1.0))
        throw ConfigError(function + ": dropout probability must be in [0, 1), got " + std::to_string(p));
}

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

namespace {

// split -> SDPA over (B, H): out (B, H, Tq, Dv) and weights (B, H, Tq, Tk) when asked, both contiguous.
// Heads are views: h = g*R + r with R = H/G, so q reads as (B, G, R, Tq, Dk) and k as (B, G, 1, Tk, Dk) with a
// stride-0 R dim: every query head of group g reads kv head g = h / R, and no K/V head is ever copied.
template <class T>
SdpaResult<T> attend_split_heads(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, Index H, Index G,
                                 const HeadMasks& masks, const HeadBias<T>& bias, const MhaOptions& options,
                                 bool return_weights) {
    const Index B = q.dim(0), Tq = q.dim(1), Tk = k.dim(1), R = H / G;
    const Index Dk = H > 0 ? q.dim(2) / H : 0, Dv = G > 0 ? v.dim(2) / G : 0;
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
    // The bias (B, H, Tq, Tk) and the slopes (B, H) viewed the same way, head h = g*R + r.
    std::optional<TensorView<const T>> bias5, slopes3;
    if (bias.bias) {
        const TensorView<const T>& x = *bias.bias;
        bias5 = TensorView<const T>(x.data(), {B, G, R, Tq, Tk},
                                    {x.stride(0), R * x.stride(1), x.stride(1), x.stride(2), x.stride(3)});
    }
    if (bias.slopes) {
        const TensorView<const T>& s = *bias.slopes;
        slopes3 = TensorView<const T>(s.data(), {B, G, R}, {s.stride(0), R * s.stride(1), s.stride(1)});
    }
    SdpaOptions sdpa;
    if (bias5) sdpa.bias = *bias5;
    if (slopes3) sdpa.alibi_slopes = *slopes3;
    sdpa.scale = options.scale;  // default 1/sqrt(Dk), SDPA's
    sdpa.is_causal = options.is_causal;
    sdpa.alignment = options.alignment;
    sdpa.window = options.window;
    sdpa.softcap = options.softcap;
    sdpa.empty_rows = options.empty_rows;
    sdpa.check_finite = options.check_finite;
    sdpa.return_weights = return_weights;
    sdpa.backend = options.backend;
    sdpa.num_threads = options.num_threads;
    sdpa.tiled_query_block = options.tiled_query_block;
    sdpa.tiled_key_block = options.tiled_key_block;
    // out (B, G, R, Tq, Dv) and weights (B, G, R, Tq, Tk): contiguous, i.e. (B, H, Tq, Dv) and (B, H, Tq, Tk).
    return scaled_dot_product_attention(q5, k5, v5, mask5, sdpa);
}

// merge: out (B, H, Tq, Dv) -> transpose -> (B, Tq, H, Dv) -> context (B, Tq, H*Dv), the concatenation of the heads.
template <class T>
void merge_heads(const T* out, Index B, Index H, Index Tq, Index Dv, T* context) {
    for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h)
            for (Index i = 0; i < Tq; ++i)
                std::copy_n(out + ((b * H + h) * Tq + i) * Dv, Dv, context + (b * Tq + i) * H * Dv + h * Dv);
}

// Dropout on the weights (B, H, Tq, Tk) in place, kept ones rescaled by 1/(1-p); then context = weights @ v per head,
// written straight into the merged (B, Tq, H*Dv) layout. NaN * 0 stays NaN, as in PyTorch's dropout.
template <class T>
void dropout_context(const std::string& function, T* weights, TensorView<const T> v, Index H, Index G, Index Tq,
                     const HeadReadability& readable, const MhaOptions& options, const MhaDropout& dropout,
                     T* context) {
    // On 16-bit storage the weights arrive rounded to it; the dropped-out weights are rounded again (they are
    // returned), and their product with v is formed in float32 and rounded once.
    using C = compute_t<T>;
    const Index B = v.dim(0), Tk = v.dim(1), R = H / G, Dv = G > 0 ? v.dim(2) / G : 0;
    const C keep_scale = static_cast<C>(1.0 / (1.0 - dropout.p));
    detail::parallel_for(B * H, detail::thread_count(options.num_threads), [&](Index bh) {
        const Index b = bh / H, h = bh % H, g = h / R;
        T* w = weights + bh * Tq * Tk;  // (Tq, Tk)
        for (Index f = 0; f < Tq * Tk; ++f)
            w[f] = static_cast<T>(static_cast<C>(w[f]) *
                                  (dropout_keeps(dropout, options.dropout_step, bh * Tq * Tk + f) ? keep_scale : C(0)));
        std::vector<Index> keys;
        for (Index j = 0; j < Tk; ++j)
            if (readable.readable(b, h, j)) keys.push_back(j);
        const Index n = static_cast<Index>(keys.size());
        std::vector<C> wc(static_cast<std::size_t>(Tq * n)), vc(static_cast<std::size_t>(n * Dv));  // (Tq, n), (n, Dv)
        for (Index i = 0; i < Tq; ++i)
            for (Index c = 0; c < n; ++c) wc[static_cast<std::size_t>(i * n + c)] = static_cast<C>(w[i * Tk + keys[c]]);
        for (Index c = 0; c < n; ++c)
            for (Index d = 0; d < Dv; ++d)
                vc[static_cast<std::size_t>(c * Dv + d)] =
                    static_cast<C>(v.data()[b * v.stride(0) + keys[c] * v.stride(1) + (g * Dv + d) * v.stride(2)]);
        T* ctx = context + b * Tq * H * Dv + h * Dv;  // (Tq, Dv) with row stride H*Dv
        if constexpr (std::is_same_v<C, T>) {
            if (n > 0)
                detail::gemm<T>(false, false, Tq, Dv, n, T(1), wc.data(), n, 1, vc.data(), Dv, 1, T(0), ctx, H * Dv, 1);
        } else {
            std::vector<C> product(static_cast<std::size_t>(Tq * Dv), C(0));  // (Tq, Dv)
            if (n > 0)
                detail::gemm<C>(false, false, Tq, Dv, n, C(1), wc.data(), n, 1, vc.data(), Dv, 1, C(0), product.data(),
                                Dv, 1);
            for (Index i = 0; i < Tq; ++i)
                for (Index d = 0; d < Dv; ++d)
                    ctx[i * H * Dv + d] = static_cast<T>(product[static_cast<std::size_t>(i * Dv + d)]);
        }
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

template <class T>
Tensor<T> average_over_heads(const T* w, Index B, Index H, Index Tq, Index Tk) {
    Tensor<T> average({B, Tq, Tk});
    for (Index b = 0; b < B; ++b)
        for (Index f = 0; f < Tq * Tk; ++f) {
            compute_t<T> sum = 0;  // in float32 on 16-bit storage, rounded once
            for (Index h = 0; h < H; ++h) sum += static_cast<compute_t<T>>(w[(b * H + h) * Tq * Tk + f]);
            average[b * Tq * Tk + f] = static_cast<T>(sum / static_cast<compute_t<T>>(H));
        }
    return average;
}

}  // namespace

template <class T>
MhaResult<T> attend_heads(const std::string& function, TensorView<const T> q, TensorView<const T> k,
                          TensorView<const T> v, Index H, Index G, const HeadMasks& masks, const HeadBias<T>& bias,
                          const HeadReadability& readable, const MhaOptions& options, const MhaDropout& dropout) {
    const Index B = q.dim(0), Tq = q.dim(1), Tk = k.dim(1), Dv = G > 0 ? v.dim(2) / G : 0;
    const bool apply_dropout = options.training && dropout.p > 0.0;
    SdpaResult<T> attended =
        attend_split_heads(q, k, v, H, G, masks, bias, options, apply_dropout || options.weights != MhaWeights::None);
    MhaResult<T> result{Tensor<T>({B, Tq, H * Dv}), std::nullopt};
    if (!apply_dropout)
        merge_heads(attended.output.data(), B, H, Tq, Dv, result.output.data());
    else
        dropout_context(function, attended.weights->data(), v, H, G, Tq, readable, options, dropout,
                        result.output.data());
    if (options.weights == MhaWeights::PerHead)
        result.weights = std::move(*attended.weights).reshaped({B, H, Tq, Tk});
    else if (options.weights == MhaWeights::HeadAverage)
        result.weights = average_over_heads(attended.weights->data(), B, H, Tq, Tk);
    return result;
}

#define ATTN_INSTANTIATE(T)                                                                                      \
    template MhaResult<T> attend_heads<T>(const std::string&, TensorView<const T>, TensorView<const T>,           \
                                          TensorView<const T>, Index, Index, const HeadMasks&, const HeadBias<T>&, \
                                          const HeadReadability&, const MhaOptions&, const MhaDropout&);
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

namespace {

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
    check_scale_and_threads<compute_t<T>>(function, options.scale, options.num_threads, " (" + shapes + ")");
    check_tiled_blocks(function, options.tiled_query_block, options.tiled_key_block, " (" + shapes + ")");
    check_softcap<compute_t<T>>(function, options.softcap, " (" + shapes + ")");
    HeadMasks masks = resolve_masks(function, shapes, allowed_mask, options, B, H, Tq, Tk);
    const HeadBias<T> bias = resolve_bias<T>(function, shapes, options, masks, B, H, Tq, Tk);
    const PositionRule positions = position_rule(function, options, " (" + shapes + ")");
    const HeadReadability readable = head_readability(masks.allowed, positions, B, H, Tq, Tk);
    throw_if_empty_head_row(function, readable, positions, options.empty_rows, shapes + masks.shapes);
    check_head_slopes<T>(function, bias, Tq, Tk, shapes + masks.shapes);
    if (options.check_finite) {
        check_head_bias<T>(function, bias, masks, positions, shapes + masks.shapes);
        // Per head: a NaN in a head slice nobody reads must not matter, as in SDPA.
        const auto kv_read = [&](Index b, Index g, Index j) { return readable.kv_head_read(b, g, G, j); };
        const std::string why = read_position_reason(shapes + masks.shapes);
        check_head_rows(function, "q_projected", q, H, [&](Index b, Index h, Index i) { return readable.nonempty(b, h, i); },
                        why);
        check_head_rows(function, "k_projected", k, G, kv_read, why);
        check_head_rows(function, "v_projected", v, G, kv_read, why);
    }
    return attend_heads<T>(function, q, k, v, H, G, masks, bias, readable, options, dropout);
}

}  // namespace
}  // namespace detail

MhaResult<float> multi_head_sdpa(TensorView<const float> q_projected, TensorView<const float> k_projected,
                                 TensorView<const float> v_projected, Index num_heads, Index num_kv_heads,
                                 std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options,
                                 const MhaDropout& dropout) {
    return detail::multi_head_sdpa_impl<float>(q_projected, k_projected, v_projected, num_heads, num_kv_heads,
                                               allowed_mask, options, dropout);
}
MhaResult<double> multi_head_sdpa(TensorView<const double> q_projected, TensorView<const double> k_projected,
                                  TensorView<const double> v_projected, Index num_heads, Index num_kv_heads,
                                  std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options,
                                  const MhaDropout& dropout) {
    return detail::multi_head_sdpa_impl<double>(q_projected, k_projected, v_projected, num_heads, num_kv_heads,
                                                allowed_mask, options, dropout);
}
MhaResult<float16> multi_head_sdpa(TensorView<const float16> q_projected, TensorView<const float16> k_projected,
                                   TensorView<const float16> v_projected, Index num_heads, Index num_kv_heads,
                                   std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options,
                                   const MhaDropout& dropout) {
    return detail::multi_head_sdpa_impl<float16>(q_projected, k_projected, v_projected, num_heads, num_kv_heads,
                                                 allowed_mask, options, dropout);
}
MhaResult<bfloat16> multi_head_sdpa(TensorView<const bfloat16> q_projected, TensorView<const bfloat16> k_projected,
                                    TensorView<const bfloat16> v_projected, Index num_heads, Index num_kv_heads,
                                    std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options,
                                    const MhaDropout& dropout) {
    return detail::multi_head_sdpa_impl<bfloat16>(q_projected, k_projected, v_projected, num_heads, num_kv_heads,
                                                  allowed_mask, options, dropout);
}

}  // namespace attn
