// attn/detail/problem.hpp: internal, no stability promise (not part of attn/attn.hpp). One SDPA call validated and
// resolved (shapes, broadcasting, masks, readable positions). Shared by every backend and by the oracle, so all of
// them apply the same contracts.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attn/sdpa.hpp"

namespace attn {

// Shapes: q (batch..., Tq, Dk), k (batch..., Tk, Dk), v (batch..., Tk, Dv), allowed (batch..., Tq, Tk).
// Every view is broadcast to the full batch shape; batch element b (flat, C order) starts at offsets[b].
template <class T>
struct SdpaProblem {
    std::string function;  // for messages: "sdpa", "mha", "oracle.sdpa", ...
    std::string shapes;    // for messages: "q [..], k [..], v [..], allowed_mask [..]" as the caller passed them
    Shape batch_shape;
    Index batch = 1;  // numel(batch_shape)
    Index Tq = 0, Tk = 0, Dk = 0, Dv = 0;
    double scale = 1.0;
    TensorView<const T> q, k, v;                       // broadcast to batch_shape + their matrix dims
    std::optional<TensorView<const bool>> allowed_mask;  // broadcast to batch_shape + (Tq, Tk)
    bool is_causal = false;
    CausalAlignment alignment = CausalAlignment::TopLeft;
    std::vector<Index> q_offset, k_offset, v_offset, mask_offset;  // per flat batch index

    const T* q_row(Index b, Index i) const { return q.data() + q_offset[b] + i * q.stride(-2); }
    const T* k_row(Index b, Index j) const { return k.data() + k_offset[b] + j * k.stride(-2); }
    const T* v_row(Index b, Index j) const { return v.data() + v_offset[b] + j * v.stride(-2); }

    // Whether query i of batch element b may read key j (explicit mask and causal rule together).
    bool allowed(Index b, Index i, Index j) const {
        if (is_causal && !causal_allows(i, j, Tq, Tk, alignment)) return false;
        if (!allowed_mask) return true;
        return allowed_mask->data()[mask_offset[b] + i * allowed_mask->stride(-2) + j * allowed_mask->stride(-1)];
    }

    // Shape of the output (batch..., Tq, Dv) and of the weights (batch..., Tq, Tk).
    Shape output_shape() const;
    Shape weights_shape() const;

    // "[b0,b1]" of a flat batch index, for messages.
    std::string batch_index_string(Index b) const;
};

// Validates shapes and options and resolves broadcasting. Throws ShapeError/ConfigError naming `function`,
// the tensors and their shapes.
template <class T>
SdpaProblem<T> make_sdpa_problem(const std::string& function, TensorView<const T> q, TensorView<const T> k,
                                 TensorView<const T> v, std::optional<TensorView<const bool>> allowed_mask,
                                 const SdpaOptions& options);

// Per batch element: which keys some query may read (the rest are never read, whatever they hold)
// and which query rows have at least one allowed key.
struct Readability {
    std::vector<char> key_readable;  // [Tk]
    std::vector<char> row_nonempty;  // [Tq]
    Index first_empty_row = -1;      // -1 when every row has an allowed key
};

template <class T>
Readability readability(const SdpaProblem<T>& problem, Index b);

// The contract checks every backend runs before computing: under EmptyRowPolicy::Throw a MaskError naming the
// first empty row; under check_finite a ValueError naming the tensor and index of the first NaN/Inf that some
// query reads. Returns the readability of every batch element for the kernel to reuse.
template <class T>
std::vector<Readability> check_contracts(const SdpaProblem<T>& problem, const SdpaOptions& options);

}  // namespace attn
