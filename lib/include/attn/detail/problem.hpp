// attn/detail/problem.hpp: internal, no stability promise (not part of attn/attn.hpp). The SDPA contract: one call
// validated and resolved (shapes, broadcasting, masks, readable positions, finite values), shared by every backend,
// the MHA module and the oracle, so all apply the same contracts. The multi-head module's own checks, per (batch,
// head), are attn/detail/mha_problem.hpp.
#pragma once

#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attn/mask.hpp"
#include "attn/sdpa.hpp"

// Expands X(T) for each of the four dtypes: the explicit instantiations of the library's templates.
#define ATTN_FOR_EACH_DTYPE(X) X(float) X(double) X(float16) X(bfloat16)

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
    PositionRule positions;  // the causal rule and the sliding window
    double softcap = 0;      // SdpaOptions::softcap, checked: 0 (off) or a normal number of compute_t<T>
    std::optional<TensorView<const T>> bias;  // SdpaOptions::bias broadcast to batch_shape + (Tq, Tk)
    Index bias_row_stride = 0, bias_key_stride = 0;
    std::optional<TensorView<const T>> alibi;  // SdpaOptions::alibi_slopes broadcast to batch_shape
    std::vector<Index> q_offset, k_offset, v_offset, mask_offset, bias_offset, alibi_offset;  // per flat batch index

    const T* q_row(Index b, Index i) const { return q.data() + q_offset[b] + i * q.stride(-2); }
    const T* k_row(Index b, Index j) const { return k.data() + k_offset[b] + j * k.stride(-2); }
    const T* v_row(Index b, Index j) const { return v.data() + v_offset[b] + j * v.stride(-2); }

    // An additive term on the logits: an explicit bias, ALiBi, or both.
    bool has_bias() const { return bias || alibi; }
    // Row i of batch element b of the explicit bias (only with one; keys bias_key_stride apart) and of the allowed
    // mask (nullptr without one; keys allowed_mask->stride(-1) apart), for loops over keys.
    const T* bias_row(Index b, Index i) const { return bias->data() + bias_offset[b] + i * bias_row_stride; }
    const bool* mask_row(Index b, Index i) const {
        return allowed_mask ? allowed_mask->data() + mask_offset[b] + i * allowed_mask->stride(-2) : nullptr;
    }
    // The explicit bias of (query i, key j) of batch element b, widened exactly to the compute type (only with one).
    compute_t<T> explicit_bias(Index b, Index i, Index j) const {
        return static_cast<compute_t<T>>(bias_row(b, i)[j * bias_key_stride]);
    }
    // ALiBi's slope of batch element b (only with slopes) and its distance |i + Tk - Tq - j| (exact in the compute
    // type while below 2^24 in float).
    compute_t<T> alibi_slope(Index b) const { return static_cast<compute_t<T>>(alibi->data()[alibi_offset[b]]); }
    Index alibi_distance(Index i, Index j) const {
        const Index d = i + Tk - Tq - j;
        return d < 0 ? -d : d;
    }
    // The whole additive term of (query i, key j), in the compute type: the explicit bias, ALiBi's
    // fl(-slope * distance), or fl(bias + fl(-slope * distance)) (oracle/BOUNDS.md section 2c).
    compute_t<T> bias_at(Index b, Index i, Index j) const {
        using C = compute_t<T>;
        if (!alibi) return explicit_bias(b, i, j);
        const C a = -alibi_slope(b) * static_cast<C>(alibi_distance(i, j));
        return bias ? explicit_bias(b, i, j) + a : a;
    }
    // Whether the explicit allowed_mask (if any) lets query i of batch element b read key j.
    bool mask_allows(Index b, Index i, Index j) const {
        if (!allowed_mask) return true;
        return allowed_mask->data()[mask_offset[b] + i * allowed_mask->stride(-2) + j * allowed_mask->stride(-1)];
    }
    // Whether query i of batch element b may read key j: the causal rule and the window, the explicit mask, and a
    // bias that is not -inf, together.
    bool allowed(Index b, Index i, Index j) const {
        if (positions.restricts() && !positions.allows(i, j, Tq, Tk)) return false;
        if (!mask_allows(b, i, j)) return false;
        return !bias || explicit_bias(b, i, j) != -std::numeric_limits<compute_t<T>>::infinity();
    }

    // Shape of the output (batch..., Tq, Dv), of the weights (batch..., Tq, Tk) and of the lse (batch..., Tq).
    Shape output_shape() const;
    Shape weights_shape() const;
    Shape lse_shape() const;

    // "[b0,b1]" of a flat batch index, for messages.
    std::string batch_index_string(Index b) const;
};

// Row i of batch element b of a problem's explicit bias and allowed mask, their key strides read once, for the loops
// over keys of the contract checks and the tiled kernel. Only with a bias.
template <class T>
struct BiasRow {
    const T* bias;
    const bool* mask;  // nullptr: no explicit mask
    Index bias_stride, mask_stride;
    BiasRow(const SdpaProblem<T>& p, Index b, Index i)
        : bias(p.bias_row(b, i)), mask(p.mask_row(b, i)), bias_stride(p.bias_key_stride),
          mask_stride(p.allowed_mask ? p.allowed_mask->stride(-1) : 0) {}
    bool mask_allows(Index j) const { return !mask || mask[j * mask_stride]; }
    compute_t<T> at(Index j) const { return static_cast<compute_t<T>>(bias[j * bias_stride]); }
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
    // With a bias: the first (row, key) in C order where the rule and the mask let a query read a NaN or +inf bias
    // (-1 when none), found in the same pass; check_contracts reports it under check_finite.
    Index bad_bias_row = -1, bad_bias_key = -1;
    // The values of q, k, v and the bias were not looked at (check_contracts' defer_values): the sets above are those
    // of the causal rule, the window and the mask alone, which a bias changes only where a query reads a non-finite
    // entry of it. The kernel that runs on them must look at every value it reads (the rows of q, k and v it packs,
    // the bias entries it adds) and hand the call back when one is not finite.
    bool values_deferred = false;
};

template <class T>
Readability readability(const SdpaProblem<T>& problem, Index b);

// The contract checks every backend runs before computing: under EmptyRowPolicy::Throw a MaskError naming the
// first empty row; under check_finite a ValueError naming the tensor and index of the first NaN/Inf that some
// query reads. Returns the readability of every batch element for the kernel to reuse.
// With defer_values, for the tiled kernel, which reads every value anyway (check_finite on; no bias, or a float or
// double bias without ALiBi): the passes over the values are left out when the rule and the mask alone leave nothing
// to refuse (Readability::values_deferred); the caller reruns the checks without defer_values when the kernel hands
// the call back.
template <class T>
std::vector<Readability> check_contracts(const SdpaProblem<T>& problem, const SdpaOptions& options,
                                         bool defer_values = false);

}  // namespace attn

// The predicates behind make_sdpa_problem and check_contracts, each with its one message, for the callers that
// hold their problem in another layout (the MHA module's (B, T, heads * D) projections, the head-path glue).
namespace attn::detail {

// Per flat batch index (C order over batch_shape), the offset of its first element in `view`, a view whose first
// batch_rank dims are batch_shape (broadcast views have stride 0 there).
template <class V>
std::vector<Index> batch_offsets(const V& view, Index batch_rank, const Shape& batch_shape) {
    std::vector<Index> offsets;
    offsets.reserve(static_cast<std::size_t>(numel(batch_shape)));
    for_each_index(batch_shape, [&](std::span<const Index> idx) {
        Index off = 0;
        for (Index d = 0; d < batch_rank; ++d) off += idx[static_cast<std::size_t>(d)] * view.stride(d);
        offsets.push_back(off);
    });
    return offsets;
}

// A tensor of one row per query (the forward's out and lse, the output's gradient dout), of the shape the forward
// gives it: (batch..., Tq, cols) or (batch..., Tq). ShapeError naming it otherwise. Row i of batch element b at row(b,
// i), its elements col_stride apart; any strides (stride 0 too).
template <class E>
struct SavedRows {
    TensorView<const E> view;
    std::vector<Index> offset;
    Index row_stride = 0, col_stride = 0;

    SavedRows(const std::string& function, const char* name, TensorView<const E> x, const Shape& expected,
              const Shape& batch_shape, const std::string& shapes)
        : view(x) {
        if (x.shape() != expected)
            throw ShapeError(function + ": " + name + " must have the forward's shape " + to_string(expected) +
                             ", got " + to_string(x.shape()) + " (" + shapes + ")");
        const Index rows_dim = static_cast<Index>(batch_shape.size());
        offset = batch_offsets(x, rows_dim, batch_shape);
        row_stride = x.stride(rows_dim);
        col_stride = x.rank() > rows_dim + 1 ? x.stride(rows_dim + 1) : 0;
    }
    const E* row(Index b, Index i) const { return view.data() + offset[static_cast<std::size_t>(b)] + i * row_stride; }
};

// q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv): rank >= 2, k's Dk equals q's, v's Tk equals k's.
// `shapes` ends every message: " (q [..], k [..], v [..], ...)".
void check_qkv_shapes(const std::string& function, const Shape& q, const Shape& k, const Shape& v,
                      const std::string& shapes);

// The batch shape q, k and v broadcast to (NumPy rules), from their batch dims.
Shape broadcast_batch_shapes(const std::string& function, const Shape& q_batch, const Shape& k_batch,
                             const Shape& v_batch, const std::string& shapes);

// allowed_mask broadcast to the scores `target` = (batch..., Tq, Tk), or a ShapeError (more dims than the scores,
// or not broadcastable).
TensorView<const bool> broadcast_mask_to_scores(const std::string& function, TensorView<const bool> allowed_mask,
                                                const Shape& target, const std::string& shapes);

// The per-call options every layer shares: scale (when given) finite in the dtype T and 0 or in T's normal range,
// num_threads >= 0.
template <class T>
void check_scale_and_threads(const std::string& function, std::optional<double> scale, int num_threads,
                             const std::string& shapes);
// SdpaOptions::tiled_query_block and tiled_key_block (or MhaOptions'): ConfigError naming them when negative.
void check_tiled_blocks(const std::string& function, Index query_block, Index key_block, const std::string& shapes);
// SdpaOptions::softcap: 0, or finite, positive and (rounded to T, the type the logits are computed in) at least T's
// smallest normal number, so that its rounding is relative (oracle/BOUNDS.md section 2): ConfigError otherwise.
template <class T>
void check_softcap(const std::string& function, double softcap, const std::string& shapes);
// SdpaOptions::bias: of the inputs' dtype T (ConfigError otherwise) and broadcastable to the scores `target` =
// (batch..., Tq, Tk) (ShapeError otherwise); the view broadcast to them.
template <class T>
TensorView<const T> broadcast_bias_to_scores(const std::string& function, const FloatView& bias, const Shape& target,
                                             const std::string& shapes);
// SdpaOptions::alibi_slopes: of the inputs' dtype T (ConfigError otherwise) and broadcastable to the batch shape
// (ShapeError otherwise); the view broadcast to it.
template <class T>
TensorView<const T> broadcast_alibi_slopes(const std::string& function, const FloatView& slopes,
                                           const Shape& batch_shape, const std::string& shapes);
// A sliding window's sides are -1 (unbounded) or >= 0: ConfigError naming the window otherwise.
void check_window(const std::string& function, const SlidingWindow& window, const std::string& shapes);
// The positional rule of the options (SdpaOptions, MhaOptions), its window checked.
template <class Options>
PositionRule position_rule(const std::string& function, const Options& options, const std::string& shapes) {
    if (options.window) check_window(function, *options.window, shapes);
    return PositionRule{options.is_causal, options.alignment, options.window};
}

// Readability of one (Tq, Tk) score matrix under the positional rule and an optional allowed mask (row i at
// allowed + i * row_stride, key j at + j * key_stride): rows[i] = query i has an allowed key, keys[j] = some
// query reads key j (both zeroed first). Returns the first empty row, -1 if none.
Index row_readability(const bool* allowed, Index row_stride, Index key_stride, Index Tq, Index Tk,
                      const PositionRule& positions, char* rows, char* keys);

// ALiBi's slope of one batch element, whatever check_finite says: finite, and its largest term slope * max(Tq - 1,
// Tk - 1) too (a ValueError naming `slopes_shape`, `where` and `shapes` otherwise). C: the type the logits are in.
template <class C>
void check_alibi_slope(const std::string& function, C slope, Index Tq, Index Tk, const Shape& slopes_shape,
                       const std::string& where, const std::string& shapes);

// Why a non-finite value is refused, and whether turning check_finite off would allow it (the error's remedy).
struct NotFiniteReason {
    std::string text;
    bool check_finite_allows = false;
};
// The one wording of a non-finite value: "<function>: <name> <shape> holds <value> at <where>, <why>".
[[noreturn]] void throw_not_finite(const std::string& function, const std::string& name, const Shape& shape,
                                   double value, const std::string& where, const NotFiniteReason& why);
// `where` of an element of an input read per batch element: "batch index [..], row r, column c".
std::string batch_row_column(const std::string& batch_index, Index row, Index column);
// `why` of an input some query reads; `shapes` names the call's tensors.
NotFiniteReason read_position_reason(const std::string& shapes);

// rows (B, T, W): every element of row (b, t) must be finite when read(b, t).
template <class T, class Read>
void check_rows(const std::string& function, const std::string& name, TensorView<const T> rows, Read read,
                const NotFiniteReason& why) {
    for (Index b = 0; b < rows.dim(0); ++b)
        for (Index t = 0; t < rows.dim(1); ++t) {
            if (!read(b, t)) continue;
            const T* row = rows.data() + b * rows.stride(0) + t * rows.stride(1);
            for (Index c = 0; c < rows.dim(2); ++c)
                if (!std::isfinite(row[c * rows.stride(2)]))
                    throw_not_finite(function, name, rows.shape(), row[c * rows.stride(2)],
                                     batch_row_column(to_string(Shape{b}), t, c), why);
        }
}

// Under check_finite, before a backward pass: a ValueError naming `name` and the position when a row of `rows` (cols
// elements, SavedRows) that a query with an allowed key owns holds a NaN or Inf; the other rows are never read.
template <class T, class E>
void check_owned_rows(const SdpaProblem<T>& p, const std::vector<Readability>& readable, const char* name,
                      const SavedRows<E>& rows, Index cols, const std::string& shapes) {
    for (Index b = 0; b < p.batch; ++b) {
        const Readability& r = readable[static_cast<std::size_t>(b)];
        for (Index i = 0; i < p.Tq; ++i) {
            if (!r.row_nonempty[static_cast<std::size_t>(i)]) continue;
            for (Index c = 0; c < cols; ++c) {
                const auto x = static_cast<compute_t<E>>(rows.row(b, i)[c * rows.col_stride]);
                if (!std::isfinite(x))
                    throw_not_finite(p.function, name, rows.view.shape(), static_cast<double>(x),
                                     batch_row_column(p.batch_index_string(b), i, c),
                                     NotFiniteReason{"a row of a query with an allowed key (" + shapes + ")", true});
            }
        }
    }
}

}  // namespace attn::detail
