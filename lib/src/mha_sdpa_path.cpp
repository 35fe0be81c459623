// Test glue (attn/detail/mha_sdpa_path.hpp): SDPA inputs laid out as the module's projected width, through
// multi_head_sdpa, and the result laid back out as SDPA's.
#include "attn/detail/mha_sdpa_path.hpp"

#include <algorithm>
#include <string>

#include "attn/detail/problem.hpp"

namespace attn::detail {

namespace {

std::string str(Index n) { return std::to_string(n); }

// The batch dims (leading..., H) and the kv heads G of a head-path call.
struct PathHeads {
    Shape batch;
    Index G = 1;
};

// The last batch dim is the heads, the ones before it fold into B. Grouped kv heads (rank 4, k and v with
// G > 1 heads, G != H) are the one form beyond NumPy broadcasting; everything else broadcasts as in SDPA.
template <class T>
PathHeads path_heads(const std::string& function, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                     const std::string& shapes) {
    PathHeads p;
    const bool grouped = q.rank() == 4 && k.rank() == 4 && v.rank() == 4 && k.dim(1) == v.dim(1) && k.dim(1) > 1 &&
                         k.dim(1) != q.dim(1);
    if (grouped) {
        if (q.dim(1) % k.dim(1) != 0)
            throw ShapeError(function + ": q has H=" + str(q.dim(1)) + " heads, not a multiple of the G=" + str(k.dim(1)) +
                             " kv heads of k" + shapes);
        const Index B = broadcast_shapes(broadcast_shapes({q.dim(0)}, {k.dim(0)}, function, "q", "k"), {v.dim(0)}, function,
                                         "q/k", "v")[0];
        p.batch = {B, q.dim(1)};
        p.G = k.dim(1);
        return p;
    }
    const auto batch_of = [](TensorView<const T> t) { return Shape(t.shape().begin(), t.shape().end() - 2); };
    p.batch = broadcast_batch_shapes(function, batch_of(q), batch_of(k), batch_of(v), shapes);
    if (p.batch.empty()) p.batch = {1};
    // One kv head serves every query head when neither k nor v has more than one head; otherwise each query head
    // has its own (G = H: the heads broadcast like any batch dim, so no multiple to check).
    const auto heads_of = [](TensorView<const T> t) { return t.rank() > 2 ? t.dim(-3) : Index(1); };
    p.G = heads_of(k) == 1 && heads_of(v) == 1 ? 1 : p.batch.back();
    return p;
}

Shape with(Shape s, std::initializer_list<Index> tail) {
    s.insert(s.end(), tail);
    return s;
}

// Lay the heads out as the module's projected width: x (B, T, heads*D), x[b, t, h*D + d] = in[b, h, t, d].
template <class T>
Tensor<T> pack_heads(const std::string& function, TensorView<const T> view, const Shape& leading, Index heads,
                     Index Tn, Index D) {
    const Index B = numel(leading);
    // (leading..., heads, Tn, D) contiguous, i.e. (B, heads, Tn, D) in memory.
    const Tensor<T> full = Tensor<T>::copy_of(view.broadcast_to(with(leading, {heads, Tn, D}), function, "input"));
    Tensor<T> x({B, Tn, heads * D});
    for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < heads; ++h)
            for (Index t = 0; t < Tn; ++t)
                std::copy_n(full.data() + ((b * heads + h) * Tn + t) * D, D, x.data() + (b * Tn + t) * heads * D + h * D);
    return x;
}

template <class T>
SdpaResult<T> mha_sdpa_path_impl(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                 std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) {
    const std::string function = "mha_sdpa_path";
    std::string shapes = "q " + to_string(q.shape()) + ", k " + to_string(k.shape()) + ", v " + to_string(v.shape());
    if (allowed_mask) shapes += ", allowed_mask " + to_string(allowed_mask->shape());
    shapes = " (" + shapes + ")";
    check_qkv_shapes(function, q.shape(), k.shape(), v.shape(), shapes);
    if (options.return_lse)
        throw ConfigError(function + ": the module's path returns no lse; call scaled_dot_product_attention" + shapes);
    const Index Tq = q.dim(-2), Tk = k.dim(-2), Dk = q.dim(-1), Dv = v.dim(-1);
    const PathHeads heads = path_heads(function, q, k, v, shapes);
    const Shape& batch = heads.batch;
    const Index H = batch.back(), G = heads.G;
    const Shape leading(batch.begin(), batch.end() - 1);
    const Index B = numel(leading);
    Shape output_shape = with(batch, {Tq, Dv}), weights_shape = with(batch, {Tq, Tk});
    if (q.rank() == 2 && k.rank() == 2 && v.rank() == 2) output_shape = {Tq, Dv}, weights_shape = {Tq, Tk};
    // The mask is checked before the empty-batch answer below: a mask that does not broadcast is an error whatever
    // the batch holds, as in SDPA (found by the backends fuzzer: a [2,0,1,1] mask against scores [1,0,1,1]).
    std::optional<TensorView<const bool>> mask_full;  // broadcast to (batch..., Tq, Tk)
    if (allowed_mask) mask_full = broadcast_mask_to_scores(function, *allowed_mask, with(batch, {Tq, Tk}), shapes);
    // So are the options: SDPA refuses a bad scale, thread count or block size for an empty batch too.
    check_scale_and_threads<compute_t<T>>(function, options.scale, options.num_threads, shapes);
    check_tiled_blocks(function, options.tiled_query_block, options.tiled_key_block, shapes);
    if (options.window) check_window(function, *options.window, shapes);
    check_softcap<compute_t<T>>(function, options.softcap, shapes);
    // The bias broadcast to (batch..., Tq, Tk) and the slopes to the batch shape, as SDPA reads them.
    std::optional<TensorView<const T>> bias_full, slopes_full;
    if (options.bias) bias_full = broadcast_bias_to_scores<T>(function, *options.bias, with(batch, {Tq, Tk}), shapes);
    if (options.alibi_slopes) slopes_full = broadcast_alibi_slopes<T>(function, *options.alibi_slopes, batch, shapes);
    if (H == 0 || B == 0) {  // no heads or no batch: SDPA's answer is empty too
        SdpaResult<T> empty{Tensor<T>(output_shape), std::nullopt, std::nullopt};
        if (options.return_weights) empty.weights = Tensor<T>(weights_shape);
        return empty;
    }
    std::optional<Tensor<bool>> mask4;  // (B, H, Tq, Tk), contiguous
    if (mask_full) mask4 = Tensor<bool>::copy_of(*mask_full).reshaped({B, H, Tq, Tk});
    const Tensor<T> xq = pack_heads(function, q, leading, H, Tq, Dk), xk = pack_heads(function, k, leading, G, Tk, Dk),
                    xv = pack_heads(function, v, leading, G, Tk, Dv);
    // The module's (B, H, Tq, Tk) bias and (B, H) slopes, contiguous.
    std::optional<Tensor<T>> bias4, slopes2;
    if (bias_full) bias4 = Tensor<T>::copy_of(*bias_full).reshaped({B, H, Tq, Tk});
    if (slopes_full) slopes2 = Tensor<T>::copy_of(*slopes_full).reshaped({B, H});
    // The shared options as they are; the bias and the slopes in the module's shapes.
    MhaOptions mha;
    static_cast<AttentionOptions&>(mha) = options;
    mha.bias.reset();
    mha.alibi_slopes.reset();
    if (bias4) mha.bias = *bias4;
    if (slopes2) mha.alibi_slopes = *slopes2;
    mha.weights = options.return_weights ? MhaWeights::PerHead : MhaWeights::None;
    std::optional<TensorView<const bool>> mask_view;
    if (mask4) mask_view = mask4->view();
    MhaResult<T> r = multi_head_sdpa(xq.view(), xk.view(), xv.view(), H, G, mask_view, mha, {});
    // unpack: context (B, Tq, H*Dv) -> (B, Tq, H, Dv) -> transpose -> (B, H, Tq, Dv) -> (batch..., Tq, Dv).
    const TensorView<const T> context(r.output.data(), {B, H, Tq, Dv}, {Tq * H * Dv, Dv, H * Dv, 1});
    SdpaResult<T> result{Tensor<T>::copy_of(context).reshaped(output_shape), std::nullopt, std::nullopt};
    if (r.weights) result.weights = std::move(*r.weights).reshaped(weights_shape);
    return result;
}

}  // namespace

SdpaResult<float> mha_sdpa_path(TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                                std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) {
    return mha_sdpa_path_impl<float>(q, k, v, allowed_mask, options);
}
SdpaResult<double> mha_sdpa_path(TensorView<const double> q, TensorView<const double> k, TensorView<const double> v,
                                 std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) {
    return mha_sdpa_path_impl<double>(q, k, v, allowed_mask, options);
}
SdpaResult<float16> mha_sdpa_path(TensorView<const float16> q, TensorView<const float16> k, TensorView<const float16> v,
                                  std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) {
    return mha_sdpa_path_impl<float16>(q, k, v, allowed_mask, options);
}
SdpaResult<bfloat16> mha_sdpa_path(TensorView<const bfloat16> q, TensorView<const bfloat16> k,
                                   TensorView<const bfloat16> v, std::optional<TensorView<const bool>> allowed_mask,
                                   const SdpaOptions& options) {
    return mha_sdpa_path_impl<bfloat16>(q, k, v, allowed_mask, options);
}

}  // namespace attn::detail
