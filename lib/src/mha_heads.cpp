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

// split: the heads as SDPA's batch. Heads are views: h = g*R + r with R = H/G, so q reads as (B, G, R, Tq, Dk) and k as
// (B, G, 1, Tk, Dk) with a stride-0 R dim: every query head of group g reads kv head g = h / R, and no K/V head is
// ever copied. The SDPA options are the call's (AttentionOptions); the flat batch index of head (b, h) is b H + h.
template <class T>
struct SplitHeads {
    TensorView<const T> q, k, v;
    std::optional<TensorView<const bool>> mask;
    SdpaOptions sdpa;  // the bias and the slopes viewed the same way in it
};

template <class T>
SplitHeads<T> split_heads(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, Index H, Index G,
                          const HeadMasks& masks, const HeadBias<T>& bias, const MhaOptions& options) {
    const Index B = q.dim(0), Tq = q.dim(1), Tk = k.dim(1), R = H / G;
    const Index Dk = H > 0 ? q.dim(2) / H : 0, Dv = G > 0 ? v.dim(2) / G : 0;
    // (B, Tq, H*Dk) -> (B, Tq, G, R, Dk) -> transpose -> (B, G, R, Tq, Dk), strides only.
    SplitHeads<T> s{TensorView<const T>(q.data(), {B, G, R, Tq, Dk},
                                        {q.stride(0), R * Dk * q.stride(2), Dk * q.stride(2), q.stride(1), q.stride(2)}),
                    // (B, Tk, G*Dk) -> (B, G, 1, Tk, Dk); the size-1 dim broadcasts over the R query heads of the group.
                    TensorView<const T>(k.data(), {B, G, 1, Tk, Dk},
                                        {k.stride(0), Dk * k.stride(2), 0, k.stride(1), k.stride(2)}),
                    TensorView<const T>(v.data(), {B, G, 1, Tk, Dv},
                                        {v.stride(0), Dv * v.stride(2), 0, v.stride(1), v.stride(2)}),
                    std::nullopt, SdpaOptions{}};
    // The shared options are the call's as they are; the bias and the slopes are the module's shapes, viewed below.
    static_cast<AttentionOptions&>(s.sdpa) = options;
    s.sdpa.bias.reset();
    s.sdpa.alibi_slopes.reset();
    if (masks.allowed) {
        // allowed (B, H, Tq, Tk) -> (B, G, R, Tq, Tk): head h = g*R + r.
        const TensorView<const bool>& m = *masks.allowed;
        s.mask = TensorView<const bool>(m.data(), {B, G, R, Tq, Tk},
                                        {m.stride(0), R * m.stride(1), m.stride(1), m.stride(2), m.stride(3)});
    }
    // The bias (B, H, Tq, Tk) and the slopes (B, H) viewed the same way, head h = g*R + r.
    if (bias.bias) {
        const TensorView<const T>& x = *bias.bias;
        s.sdpa.bias = TensorView<const T>(x.data(), {B, G, R, Tq, Tk},
                                          {x.stride(0), R * x.stride(1), x.stride(1), x.stride(2), x.stride(3)});
    }
    if (bias.slopes) {
        const TensorView<const T>& x = *bias.slopes;
        s.sdpa.alibi_slopes = TensorView<const T>(x.data(), {B, G, R}, {x.stride(0), R * x.stride(1), x.stride(1)});
    }
    return s;
}

// split -> SDPA over (B, H): out (B, H, Tq, Dv) and weights (B, H, Tq, Tk) when asked, both contiguous.
template <class T>
SdpaResult<T> attend_split_heads(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, Index H, Index G,
                                 const HeadMasks& masks, const HeadBias<T>& bias, const MhaOptions& options,
                                 bool return_weights) {
    SplitHeads<T> s = split_heads(q, k, v, H, G, masks, bias, options);
    s.sdpa.return_weights = return_weights;
    // out (B, G, R, Tq, Dv) and weights (B, G, R, Tq, Tk): contiguous, i.e. (B, H, Tq, Dv) and (B, H, Tq, Tk).
    return scaled_dot_product_attention(s.q, s.k, s.v, s.mask, s.sdpa);
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
    const C keep_scale = dropout_keep_scale<C>(dropout.p);
    const WeightDropout rule{dropout.p, dropout.seed, options.dropout_step};
    detail::parallel_for(B * H, detail::thread_count(options.num_threads), [&](Index bh) {
        const Index b = bh / H, h = bh % H, g = h / R;
        T* w = weights + bh * Tq * Tk;  // (Tq, Tk)
        for (Index f = 0; f < Tq * Tk; ++f)
            w[f] = static_cast<T>(static_cast<C>(w[f]) *
                                  (dropout_keeps(rule, bh * Tq * Tk + f) ? keep_scale : C(0)));
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

// f(): the split heads' SDPA calls of `function`. The inputs were checked before, so a ValueError from them is an
// overflow, whose message names sdpa or sdpa_backward and the split shapes: prefixed with the function the caller
// called.
template <class F>
auto in_split_heads(const std::string& function, F&& f) {
    try {
        return f();
    } catch (const ValueError& e) {
        throw ValueError(function + ": in the split heads' attention, " + e.what());
    }
}

}  // namespace

template <class T>
MhaResult<T> attend_heads(const std::string& function, TensorView<const T> q, TensorView<const T> k,
                          TensorView<const T> v, Index H, Index G, const HeadMasks& masks, const HeadBias<T>& bias,
                          const HeadReadability& readable, const MhaOptions& options, const MhaDropout& dropout) {
    const Index B = q.dim(0), Tq = q.dim(1), Tk = k.dim(1), Dv = G > 0 ? v.dim(2) / G : 0;
    const bool apply_dropout = options.training && dropout.p > 0.0;
    SdpaResult<T> attended = in_split_heads(function, [&] {
        return attend_split_heads(q, k, v, H, G, masks, bias, options, apply_dropout || options.weights != MhaWeights::None);
    });
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

template <class T>
MhaGradients<T> head_gradients(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                               TensorView<const T> dout, Index H, Index G, const HeadMasks& masks,
                               const HeadBias<T>& bias, const MhaOptions& options, const MhaDropout& dropout) {
    const Index B = q.dim(0), Tq = q.dim(1), Tk = k.dim(1), R = H / G;
    const Index Dk = q.dim(2) / H, Dv = v.dim(2) / G;
    SplitHeads<T> s = split_heads(q, k, v, H, G, masks, bias, options);
    const bool apply_dropout = options.training && dropout.p > 0.0;
    if (apply_dropout) s.sdpa.backend = Backend::Reference;  // the one backward with dropout (its forward: shapes)
    // dout (B, Tq, H*Dv) viewed as the output of the split heads, (B, G, R, Tq, Dv).
    const TensorView<const T> dout5(dout.data(), {B, G, R, Tq, Dv},
                                    {dout.stride(0), R * Dv * dout.stride(2), Dv * dout.stride(2), dout.stride(1),
                                     dout.stride(2)});
    const SdpaGradients<T> g = in_split_heads("multi_head_sdpa_backward", [&] {
        s.sdpa.return_lse = true;
        const SdpaResult<T> forward = scaled_dot_product_attention(s.q, s.k, s.v, s.mask, s.sdpa);
        s.sdpa.return_lse = false;
        const TensorView<const T> out = forward.output.view();
        return apply_dropout ? sdpa_backward_with_dropout<T>(s.q, s.k, s.v, out, forward.lse->view(), dout5, s.mask,
                                                             s.sdpa, WeightDropout{dropout.p, dropout.seed, options.dropout_step})
                             : sdpa_backward(s.q, s.k, s.v, out, forward.lse->view(), dout5, s.mask, s.sdpa);
    });
    // The gradients of the split views, (B, G, R, Tq, Dk) = (B, H, Tq, Dk) and (B, G, 1, Tk, D), merged back.
    MhaGradients<T> result{Tensor<T>::uninitialized({B, Tq, H * Dk}), Tensor<T>::uninitialized({B, Tk, G * Dk}),
                           Tensor<T>::uninitialized({B, Tk, G * Dv})};
    merge_heads(g.dq.data(), B, H, Tq, Dk, result.dq_projected.data());
    merge_heads(g.dk.data(), B, G, Tk, Dk, result.dk_projected.data());
    merge_heads(g.dv.data(), B, G, Tk, Dv, result.dv_projected.data());
    return result;
}

#define ATTN_INSTANTIATE(T)                                                                                      \
    template MhaResult<T> attend_heads<T>(const std::string&, TensorView<const T>, TensorView<const T>,           \
                                          TensorView<const T>, Index, Index, const HeadMasks&, const HeadBias<T>&, \
                                          const HeadReadability&, const MhaOptions&, const MhaDropout&);
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

namespace {

// multi_head_sdpa's and multi_head_sdpa_backward's validation and contract checks (dout: the backward's, of the
// context's shape (B, Tq, H*Dv), read where a query reads), then run(masks, bias, readable).
template <class T, class Run>
auto validated_head_call(const std::string& function, TensorView<const T> q, TensorView<const T> k,
                         TensorView<const T> v, std::optional<TensorView<const T>> dout, Index H, Index G,
                         std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options,
                         const MhaDropout& dropout, const Run& run) {
    std::string shapes = "q_projected " + to_string(q.shape()) + ", k_projected " + to_string(k.shape()) +
                         ", v_projected " + to_string(v.shape());
    if (dout) shapes += ", dout " + to_string(dout->shape());
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
    if (dout && dout->shape() != Shape{B, Tq, H * (v.dim(2) / G)})
        throw ShapeError(function + ": dout must have the context's shape (B, Tq, num_heads*Dv) = " +
                         to_string(Shape{B, Tq, H * (v.dim(2) / G)}) + " (" + shapes + ")");
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
        const auto row_read = [&](Index b, Index h, Index i) { return readable.nonempty(b, h, i); };
        const NotFiniteReason why = read_position_reason(shapes + masks.shapes);
        check_head_rows(function, "q_projected", q, H, row_read, why);
        check_head_rows(function, "k_projected", k, G, kv_read, why);
        check_head_rows(function, "v_projected", v, G, kv_read, why);
        if (dout) check_head_rows(function, "dout", *dout, H, row_read, why);
    }
    return run(masks, bias, readable);
}

template <class T>
MhaResult<T> multi_head_sdpa_impl(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, Index H,
                                  Index G, std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options,
                                  const MhaDropout& dropout) {
    const std::string function = "multi_head_sdpa";
    return validated_head_call<T>(function, q, k, v, std::nullopt, H, G, allowed_mask, options, dropout,
                                  [&](const HeadMasks& masks, const HeadBias<T>& bias, const HeadReadability& readable) {
                                      return attend_heads<T>(function, q, k, v, H, G, masks, bias, readable, options,
                                                             dropout);
                                  });
}

template <class T>
MhaGradients<T> multi_head_sdpa_backward_impl(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                              TensorView<const T> dout, Index H, Index G,
                                              std::optional<TensorView<const bool>> allowed_mask,
                                              const MhaOptions& options, const MhaDropout& dropout) {
    return validated_head_call<T>("multi_head_sdpa_backward", q, k, v, dout, H, G, allowed_mask, options, dropout,
                                  [&](const HeadMasks& masks, const HeadBias<T>& bias, const HeadReadability&) {
                                      return head_gradients<T>(q, k, v, dout, H, G, masks, bias, options, dropout);
                                  });
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

#define ATTN_INSTANTIATE(T)                                                                                        \
    MhaGradients<T> multi_head_sdpa_backward(TensorView<const T> q_projected, TensorView<const T> k_projected,     \
                                             TensorView<const T> v_projected, TensorView<const T> dout,           \
                                             Index num_heads, Index num_kv_heads,                                 \
                                             std::optional<TensorView<const bool>> allowed_mask,                  \
                                             const MhaOptions& options, const MhaDropout& dropout) {              \
        return detail::multi_head_sdpa_backward_impl<T>(q_projected, k_projected, v_projected, dout, num_heads,   \
                                                        num_kv_heads, allowed_mask, options, dropout);            \
    }
ATTN_FOR_EACH_DTYPE(ATTN_INSTANTIATE)
#undef ATTN_INSTANTIATE

}  // namespace attn
