// attn/detail/mha_problem.hpp: internal, no stability promise (not part of attn/attn.hpp). The multi-head module's
// contract: its inputs, masks, biases and slopes resolved once per call, and the checks it runs per (batch, head).
// Shared by the module (lib/src/mha*.cpp) and the oracle's MHA path, so both refuse the same calls with the same words.
#pragma once

#include "attn/detail/problem.hpp"
#include "attn/mha.hpp"

namespace attn::detail {

// The multi-head module's inputs, (B, T, features) each with widths E, kdim, vdim, one B, one Tk for key and value:
// the sizes, and the "query_states [..], key_states [..], value_states [..]" list for messages. The module and the
// oracle's MHA path both call it, so they refuse the same calls with the same words.
struct MhaStates {
    Index B = 0, Tq = 0, Tk = 0;
    std::string shapes;
};
template <class T>
MhaStates check_mha_states(const std::string& function, TensorView<const T> query_states, TensorView<const T> key_states,
                           TensorView<const T> value_states, Index E, Index kdim, Index vdim);

// Readability per (batch, head) of the MHA module: the basis of its empty-row policy, finite checks and gathers.
struct HeadReadability {
    Index B = 0, H = 0, Tq = 0, Tk = 0;
    std::vector<char> row_nonempty;  // (B, H, Tq): query row has an allowed key in this head
    std::vector<char> key_readable;  // (B, H, Tk): some query row of this head may read the key
    Index first_empty = -1;          // flat (b, h, i) of the first empty row, -1 if none

    bool nonempty(Index b, Index h, Index i) const { return row_nonempty[static_cast<std::size_t>((b * H + h) * Tq + i)]; }
    bool readable(Index b, Index h, Index j) const { return key_readable[static_cast<std::size_t>((b * H + h) * Tk + j)]; }
    // Over the heads of batch element b: some head's row i has an allowed key / every head's row i has one.
    bool some_head_reads_query(Index b, Index i) const {
        for (Index h = 0; h < H; ++h)
            if (nonempty(b, h, i)) return true;
        return false;
    }
    bool every_head_reads_query(Index b, Index i) const {
        for (Index h = 0; h < H; ++h)
            if (!nonempty(b, h, i)) return false;
        return true;
    }
    // Some head reads key j of batch element b.
    bool some_head_reads_key(Index b, Index j) const {
        for (Index h = 0; h < H; ++h)
            if (readable(b, h, j)) return true;
        return false;
    }
    // Some query head of kv head g (of G; heads g*R .. g*R + R-1, R = H/G) reads key j of batch element b.
    bool kv_head_read(Index b, Index g, Index G, Index j) const {
        const Index R = H / G;
        for (Index r = 0; r < R; ++r)
            if (readable(b, g * R + r, j)) return true;
        return false;
    }
};

// allowed: none, or the resolved mask broadcast to (B, H, Tq, Tk) (stride 0 on broadcast dims, which are computed
// once and copied).
HeadReadability head_readability(const std::optional<TensorView<const bool>>& allowed, const PositionRule& positions,
                                 Index B, Index H, Index Tq, Index Tk);

// The MHA module's masks (the module and the oracle's MHA path) resolved once per call: one allowed view broadcast to (B, H, Tq, Tk), owning storage when the caller's
// mask and key padding had to be combined.
struct HeadMasks {
    std::optional<Tensor<bool>> owned;
    std::optional<TensorView<const bool>> allowed;  // (B, H, Tq, Tk), stride 0 on broadcast dims
    std::string shapes;                             // ", allowed_mask [..], key_padding_allowed [..]" for messages
};

// The mask contract (mha_mask_views) applied and the masks combined; `input_shapes` names the inputs in messages.
HeadMasks resolve_masks(const std::string& function, const std::string& input_shapes,
                        std::optional<TensorView<const bool>> allowed_mask, const MhaOptions& options, Index B,
                        Index H, Index Tq, Index Tk);

// The module's score-shaped tensors (allowed_mask, MhaOptions::bias): 2-D (Tq, Tk) read as (1, 1, Tq, Tk), 3-D
// (B, Tq, Tk) as (B, 1, Tq, Tk) (broadcast over heads), 4-D as is; it must broadcast to (B, H, Tq, Tk). The view keeps
// its size-1 dims. ShapeErrors name `function`, `name` with its shape, the target, and end with `shapes`.
template <class E>
TensorView<const E> mha_scores_view(const std::string& function, const std::string& shapes, const char* name,
                                    TensorView<const E> scores, Index B, Index H, Index Tq, Index Tk);
// The module's key padding (key_padding_allowed, MhaOptions::key_padding_bias): (B, Tk), read as (B, 1, 1, Tk).
template <class E>
TensorView<const E> mha_key_padding_view(const std::string& function, const std::string& shapes, const char* name,
                                         TensorView<const E> padding, Index B, Index Tk);

// The module's additive terms (MhaOptions::bias, key_padding_bias, alibi_slopes) resolved once per call.
template <class T>
struct HeadBias {
    std::optional<Tensor<T>> owned;             // fl(bias + key_padding_bias) when both are given
    std::optional<TensorView<const T>> bias;    // (B, H, Tq, Tk), stride 0 on broadcast dims
    std::optional<TensorView<const T>> slopes;  // (B, H)
    std::string name;                           // of the bias in messages: "bias", "key_padding_bias" or their sum
    Shape shape;                                // the caller's shape (the sum's when both are given)
    Shape slopes_shape;                         // the caller's
};
// Their contracts (dtype T, the shapes above, (H) or (B, H) slopes): ConfigError or ShapeError naming them; their
// names are appended to masks.shapes. A -inf entry of the bias blocks its key: it is and-ed into masks.allowed
// (masks.owned then holds the combined mask).
template <class T>
HeadBias<T> resolve_bias(const std::string& function, const std::string& input_shapes, const MhaOptions& options,
                         HeadMasks& masks, Index B, Index H, Index Tq, Index Tk);
// Under check_finite: a ValueError naming the bias, its batch element, head, row and key when a query may read a NaN
// or +inf entry (the positional rule and masks.allowed allow it; -inf entries are blocked there already).
template <class T>
void check_head_bias(const std::string& function, const HeadBias<T>& bias, const HeadMasks& masks,
                     const PositionRule& positions, const std::string& shapes);
// After the empty-row check, as SDPA orders them, and whatever check_finite says: each slope finite, with a finite
// largest term (check_alibi_slope). `shapes`: the call's, without parentheses.
template <class T>
void check_head_slopes(const std::string& function, const HeadBias<T>& bias, Index Tq, Index Tk,
                       const std::string& shapes);

// Under EmptyRowPolicy::Throw, a MaskError naming batch, head and row of the first empty row.
void throw_if_empty_head_row(const std::string& function, const HeadReadability& readable,
                             const PositionRule& positions, EmptyRowPolicy empty_rows, const std::string& shapes);

// Projected heads (B, T, heads * D): the D columns of head (b, head, t) must be finite when read(b, head, t).
template <class T, class Read>
void check_head_rows(const std::string& function, const std::string& name, TensorView<const T> rows, Index heads,
                     Read read, const NotFiniteReason& why) {
    const Index D = heads > 0 ? rows.dim(2) / heads : 0;
    for (Index b = 0; b < rows.dim(0); ++b)
        for (Index t = 0; t < rows.dim(1); ++t)
            for (Index g = 0; g < heads; ++g) {
                if (!read(b, g, t)) continue;
                const T* row = rows.data() + b * rows.stride(0) + t * rows.stride(1);
                for (Index c = g * D; c < (g + 1) * D; ++c)
                    if (!std::isfinite(row[c * rows.stride(2)]))
                        throw_not_finite(function, name, rows.shape(), row[c * rows.stride(2)],
                                         batch_row_column(to_string(Shape{b}), t, c) + " (head " +
                                             std::to_string(g) + ")",
                                         why);
            }
}

}  // namespace attn::detail
