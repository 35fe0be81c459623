// attn/mask.hpp: boolean attention masks in the allowed convention (true = this query may read this key).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "attn/tensor.hpp"

namespace attn {

// Which keys a causal query sees when Tq != Tk.
//   TopLeft:     key j visible to query i iff j <= i            (training, PyTorch's is_causal)
//   BottomRight: key j visible to query i iff j <= i + Tk - Tq  (KV-cache decoding: the last query sees every key)
enum class CausalAlignment { TopLeft, BottomRight };

const char* to_string(CausalAlignment alignment);

// The causal rule in one place: query i (of Tq) may read exactly the keys [0, causal_end) of Tk, the end clamped
// to [0, Tk] (a bottom-right row with i + Tk - Tq < 0 reads nothing).
inline Index causal_end(Index i, Index Tq, Index Tk, CausalAlignment alignment) {
    return std::clamp<Index>(alignment == CausalAlignment::TopLeft ? i + 1 : i + 1 + Tk - Tq, 0, Tk);
}

// Whether causal query i may read key j (0 <= j < Tk).
inline bool causal_allows(Index i, Index j, Index Tq, Index Tk, CausalAlignment alignment) {
    return j < causal_end(i, Tq, Tk, alignment);
}

// Sliding window (FlashAttention's window_size = (left, right); -1 = unbounded on that side). With d = Tk - Tq
// (BottomRight, FlashAttention's) or d = 0 (TopLeft, JAX's), key j is visible to query i iff
//   i + d - left <= j <= i + d + right.
// Causal with a window is the window with right = 0 (when both have the same alignment).
struct SlidingWindow {
    Index left = -1, right = -1;
    CausalAlignment alignment = CausalAlignment::BottomRight;
    bool operator==(const SlidingWindow&) const = default;
};

// "window (256, 0) bottom-right", for messages and config strings.
std::string to_string(const SlidingWindow& window);

// The keys [begin, end) of Tk a query may read by position; begin <= end, both in [0, Tk].
struct KeyRange {
    Index begin = 0, end = 0;
};

// The window's keys of query i, clamped to [0, Tk] (empty when the window lies outside the keys).
inline KeyRange window_keys(Index i, Index Tq, Index Tk, const SlidingWindow& w) {
    const Index d = w.alignment == CausalAlignment::TopLeft ? i : i + Tk - Tq;
    const Index begin = w.left < 0 ? 0 : std::clamp<Index>(d - w.left, 0, Tk);
    const Index end = w.right < 0 ? Tk : std::clamp<Index>(d + w.right + 1, 0, Tk);
    return {begin, std::max(begin, end)};
}

// The positional rules of one call together (the causal rule when is_causal, the window when given), the one place
// every backend, the module and the oracle ask which keys a query may read by position. An explicit mask is and-ed
// on top of it.
struct PositionRule {
    bool is_causal = false;
    CausalAlignment alignment = CausalAlignment::TopLeft;
    std::optional<SlidingWindow> window;

    bool restricts() const { return is_causal || window.has_value(); }
    KeyRange keys(Index i, Index Tq, Index Tk) const {
        KeyRange r{0, is_causal ? causal_end(i, Tq, Tk, alignment) : Tk};
        if (window) {
            const KeyRange w = window_keys(i, Tq, Tk, *window);
            r.begin = std::max(r.begin, w.begin);
            r.end = std::min(r.end, w.end);
        }
        r.end = std::max(r.begin, r.end);
        return r;
    }
    bool allows(Index i, Index j, Index Tq, Index Tk) const {
        const KeyRange r = keys(i, Tq, Tk);
        return r.begin <= j && j < r.end;
    }
    // ", causal top-left, window (4, 0) bottom-right" (empty when nothing restricts), for messages.
    std::string describe() const;
};

// The one empty-row MaskError for every layer (SDPA, the MHA module, the oracle): `row` names the row in the caller's
// terms ("query row 2 of batch index [0]", "query row 2 of batch 1, head 1"), `shapes` the tensors and their shapes.
// Its remedy is the empty_rows option.
MaskError no_allowed_key_error(const std::string& function, const std::string& row, Index Tq, Index Tk,
                               const PositionRule& positions, const std::string& shapes);

// (Tq, Tk) allowed mask of a causal rule.
Tensor<bool> causal_allowed_mask(Index Tq, Index Tk, CausalAlignment alignment);

// (Tq, Tk) allowed mask of a sliding window; ConfigError when a side is below -1.
Tensor<bool> sliding_window_allowed_mask(Index Tq, Index Tk, const SlidingWindow& window);

// Key padding from token ids: token_ids (B, Tk) -> allowed mask (B, 1, 1, Tk), true where token != pad_id.
Tensor<bool> key_padding_allowed_mask(TensorView<const std::int64_t> token_ids, std::int64_t pad_id);

// A key may be read only if both masks allow it; result has the broadcast shape of a and b.
Tensor<bool> logical_and(TensorView<const bool> a, TensorView<const bool> b);

// The only bridges to the blocked convention (true = ignore, as nn.MultiheadAttention's masks).
Tensor<bool> blocked_to_allowed(TensorView<const bool> blocked_mask);
Tensor<bool> allowed_to_blocked(TensorView<const bool> allowed_mask);

// View of an allowed mask broadcast (NumPy rules) to `target` = (..., Tq, Tk), or ShapeError naming both shapes.
TensorView<const bool> broadcast_allowed_mask(TensorView<const bool> allowed_mask, const Shape& target,
                                              const std::string& context);

}  // namespace attn
