// attn/mask.hpp: boolean attention masks in the allowed convention (true = this query may read this key).
#pragma once

#include <algorithm>
#include <cstdint>
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

// The one wording of the empty-row MaskError for every layer (SDPA, the MHA module, the oracle): `row` names the row
// in the caller's terms ("query row 2 of batch index [0]", "query row 2 of batch 1, head 1"), `shapes` the tensors
// and their shapes. Ends with how to allow empty rows.
std::string no_allowed_key_message(const std::string& function, const std::string& row, Index Tq, Index Tk,
                                   bool is_causal, CausalAlignment alignment, const std::string& shapes);

// (Tq, Tk) allowed mask of a causal rule.
Tensor<bool> causal_allowed_mask(Index Tq, Index Tk, CausalAlignment alignment);

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
