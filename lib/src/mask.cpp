// Mask constructors and the adapters between the allowed and blocked conventions.
#include "attn/mask.hpp"

#include "attn/detail/problem.hpp"

namespace attn {

std::string to_string(const SlidingWindow& window) {
    return "window (" + std::to_string(window.left) + ", " + std::to_string(window.right) + ") " +
           to_string(window.alignment);
}

std::string PositionRule::describe() const {
    std::string s;
    if (is_causal) s += std::string(", causal ") + to_string(alignment);
    if (window) s += ", " + to_string(*window);
    return s;
}

MaskError no_allowed_key_error(const std::string& function, const std::string& row, Index Tq, Index Tk,
                               const PositionRule& positions, const std::string& shapes) {
    return MaskError(function + ": " + row + " has no allowed key (Tq=" + std::to_string(Tq) + ", Tk=" +
                         std::to_string(Tk) + positions.describe() + "; " + shapes + ")",
                     Remedy{"empty_rows", {"zero", "nan"}, "to allow empty rows"});
}

Tensor<bool> causal_allowed_mask(Index Tq, Index Tk, CausalAlignment alignment) {
    if (Tq < 0 || Tk < 0)
        throw ShapeError("causal_allowed_mask: negative size Tq=" + std::to_string(Tq) + ", Tk=" + std::to_string(Tk));
    // allowed: (Tq, Tk), true at and below the (aligned) diagonal.
    Tensor<bool> allowed({Tq, Tk}, false);
    for (Index i = 0; i < Tq; ++i)
        for (Index j = 0; j < Tk; ++j) allowed[i * Tk + j] = causal_allows(i, j, Tq, Tk, alignment);
    return allowed;
}

Tensor<bool> sliding_window_allowed_mask(Index Tq, Index Tk, const SlidingWindow& window) {
    if (Tq < 0 || Tk < 0)
        throw ShapeError("sliding_window_allowed_mask: negative size Tq=" + std::to_string(Tq) +
                         ", Tk=" + std::to_string(Tk));
    detail::check_window("sliding_window_allowed_mask", window, "");
    Tensor<bool> allowed({Tq, Tk}, false);
    for (Index i = 0; i < Tq; ++i) {
        const KeyRange r = window_keys(i, Tq, Tk, window);
        for (Index j = r.begin; j < r.end; ++j) allowed[i * Tk + j] = true;
    }
    return allowed;
}

Tensor<bool> key_padding_allowed_mask(TensorView<const std::int64_t> token_ids, std::int64_t pad_id) {
    if (token_ids.rank() != 2)
        throw ShapeError("key_padding_allowed_mask: token_ids must be (B, Tk), got " + to_string(token_ids.shape()));
    const Index B = token_ids.dim(0), Tk = token_ids.dim(1);
    // allowed: (B, 1, 1, Tk), broadcast over heads and query rows.
    Tensor<bool> allowed({B, 1, 1, Tk}, false);
    for (Index b = 0; b < B; ++b)
        for (Index j = 0; j < Tk; ++j) allowed[b * Tk + j] = token_ids({b, j}) != pad_id;
    return allowed;
}

namespace {
template <class F>
Tensor<bool> map_mask(TensorView<const bool> m, F f) {
    Tensor<bool> out(m.shape());
    Index i = 0;
    for_each_index(m.shape(), [&](std::span<const Index> idx) { out[i++] = f(m.at(idx)); });
    return out;
}
}  // namespace

Tensor<bool> logical_and(TensorView<const bool> a, TensorView<const bool> b) {
    const Shape shape = broadcast_shapes(a.shape(), b.shape(), "logical_and", "a", "b");
    const auto ab = a.broadcast_to(shape, "logical_and", "a");
    const auto bb = b.broadcast_to(shape, "logical_and", "b");
    Tensor<bool> out(shape);
    Index i = 0;
    for_each_index(shape, [&](std::span<const Index> idx) { out[i++] = ab.at(idx) && bb.at(idx); });
    return out;
}

Tensor<bool> blocked_to_allowed(TensorView<const bool> blocked_mask) {
    return map_mask(blocked_mask, [](bool blocked) { return !blocked; });
}

Tensor<bool> allowed_to_blocked(TensorView<const bool> allowed_mask) {
    return map_mask(allowed_mask, [](bool allowed) { return !allowed; });
}

TensorView<const bool> broadcast_allowed_mask(TensorView<const bool> allowed_mask, const Shape& target,
                                              const std::string& context) {
    return allowed_mask.broadcast_to(target, context, "allowed_mask");
}

}  // namespace attn
