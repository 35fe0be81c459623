// attn/mha.hpp: multi-head attention (the module a transformer block calls), heads split from one projection.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "attn/mask.hpp"
#include "attn/sdpa.hpp"
#include "attn/tensor.hpp"

namespace attn {

// Letters: B batch, Tq query positions, Tk key positions, E = embed_dim, H = num_heads, G = num_kv_heads,
// Dh = head_dim = E / H. Query head h reads kv head h / (H / G) (G = H: multi-head, G = 1: multi-query).
struct MhaConfig {
    Index embed_dim = 0;                 // E (d_model)
    Index num_heads = 0;                 // H; E % H == 0
    std::optional<Index> num_kv_heads;   // G, default H; H % G == 0
    std::optional<Index> kdim, vdim;     // widths of the key / value memories, default E
    bool bias = true;                    // biases on all four projections
    double dropout = 0.0;                // on the attention weights, in [0, 1), only when MhaOptions::training
    // The dropout mask is a pure function of (seed, step, b, h, i, j), the same on every machine and thread count:
    // weight (b, h, i, j) is kept when unit_uniform(m(m(m(seed) ^ step) ^ f)) >= p, with m SplitMix64's finaliser,
    // unit_uniform the top 53 bits over 2^53 (attn/detail/splitmix64.hpp) and f = ((b H + h) Tq + i) Tk + j.
    std::uint64_t dropout_seed = 0;
    std::uint64_t init_seed = 0;         // Xavier-uniform initialisation (see MultiHeadAttention's constructor)
};

// What forward returns besides the output.
enum class MhaWeights {
    None,
    PerHead,      // (B, H, Tq, Tk)
    HeadAverage,  // (B, Tq, Tk), the mean over the H heads (nn.MultiheadAttention's average_attn_weights)
};

// Per-call options: the shared ones (AttentionOptions, attn/options.hpp: scale default 1/sqrt(head_dim), causal
// rule, window, softcap, bias, ALiBi, empty rows, finite checks, the SDPA core's backend, threads and tiled blocks),
// handed to every head's SDPA as they are, and the module's own. Masks are in the allowed convention (true = may
// attend); see forward_blocked for the other.
// The bias (PyTorch's float attn_mask, AttentionOptions::bias) takes allowed_mask's shapes (2-D (Tq, Tk), 3-D
// (B, Tq, Tk) broadcast over heads, 4-D broadcastable to (B, H, Tq, Tk); reshape PyTorch's (B*H, Tq, Tk) to
// (B, H, Tq, Tk) first); the slopes are (H) or (B, H): head h of batch element b adds -slope * |i + Tk - Tq - j|.
// check_finite covers the inputs at positions some query reads, every parameter and the projections (one that
// overflows is a ValueError).
struct MhaOptions : AttentionOptions {
    std::optional<TensorView<const bool>> key_padding_allowed;  // (B, Tk): true = a real key, false = padding
    MhaWeights weights = MhaWeights::None;
    bool training = false;            // dropout (MhaConfig::dropout) is applied only when true
    std::uint64_t dropout_step = 0;   // mixed into the dropout stream: a training loop passes its step for a fresh mask
    // PyTorch's float key_padding_mask, of the inputs' dtype, (B, Tk), read as (B, 1, 1, Tk). Given with the bias,
    // the bias is their sum in the dtype, as PyTorch merges them: fl(bias + key_padding_bias), computed in float for
    // 16-bit storage and rounded once. A -inf entry blocks its key exactly as a false in the masks (an empty row
    // follows empty_rows); NaN or +inf where a query may read is a ValueError under check_finite.
    std::optional<FloatView> key_padding_bias;
};

template <class T>
struct MhaResult {
    Tensor<T> output;                  // (B, Tq, E)
    std::optional<Tensor<T>> weights;  // per MhaOptions::weights; after dropout when dropout was applied
};

// Multi-head attention with PyTorch's parameter layouts (nn.MultiheadAttention, batch_first=True):
//   q_proj_weight (E, E), k_proj_weight (G*Dh, kdim), v_proj_weight (G*Dh, vdim), out_proj_weight (E, E),
//   biases (E), (G*Dh), (G*Dh), (E). Weights are (out_features, in_features): y = x W^T + b.
// forward: project (one BLIS gemm per projection and batch element), view the projected width as heads
// (B, T, E) -> (B, T, H, Dh) -> (B, H, T, Dh) by strides only, run scaled_dot_product_attention batched over
// (B, H), merge back in (B, T, H, Dh) order, project with out_proj. The parameter count does not depend on H.
//
// Masks (allowed convention) may be 2-D (Tq, Tk), 3-D (B, Tq, Tk) (broadcast over heads, as in the course
// module) or 4-D broadcastable to (B, H, Tq, Tk); size-1 dims broadcast. key_padding_allowed (B, Tk) is and-ed
// in as (B, 1, 1, Tk). Float masks (MhaOptions::bias, key_padding_bias) and ALiBi are added to the logits. Contracts are SDPA's: a query row with no allowed key (in some head) follows
// MhaOptions::empty_rows (Throw names batch, head and row; under Zero that head's context row is 0, so the
// output row is out_proj's bias plus the other heads' contributions); finite checks look only at input rows some
// query reads, so padding rows of the key/value memories never change the output, even when NaN or Inf.
//
// Errors: ConfigError for impossible configurations and options, ShapeError for shapes (naming the function
// and every shape), MaskError for an empty row under Throw, ValueError for a NaN/Inf that is read.
template <class T>
class MultiHeadAttention {
public:
    // Validates the configuration and initialises the parameters from config.init_seed as PyTorch does:
    // when G = H and kdim = vdim = E, Xavier-uniform over the packed (3E, E) in_proj_weight (bound sqrt(6/(4E)));
    // otherwise Xavier-uniform per projection (bound sqrt(6/(fan_in + fan_out))); out_proj_weight as nn.Linear
    // (bound 1/sqrt(E)); all biases 0. Draws: splitmix64 from init_seed, q, k, v rows then out_proj, row-major.
    explicit MultiHeadAttention(const MhaConfig& config);

    Index embed_dim() const { return E_; }
    Index num_heads() const { return H_; }
    Index num_kv_heads() const { return G_; }
    Index head_dim() const { return Dh_; }
    Index kdim() const { return kdim_; }
    Index vdim() const { return vdim_; }
    bool has_bias() const { return bias_; }
    double dropout() const { return dropout_; }

    // Number of scalars in the parameters: 2 E^2 + G*Dh*(kdim + vdim) (+ 2E + 2 G*Dh with bias); 4 E^2 (+ 4E) for
    // G = H and kdim = vdim = E, whatever H is.
    Index parameter_count() const;

    // Setters copy (any strides) and throw ShapeError naming the parameter, the expected and the given shape.
    void set_q_proj_weight(TensorView<const T> weight);    // (E, E)
    void set_k_proj_weight(TensorView<const T> weight);    // (G*Dh, kdim)
    void set_v_proj_weight(TensorView<const T> weight);    // (G*Dh, vdim)
    void set_out_proj_weight(TensorView<const T> weight);  // (E, E)
    // nn.MultiheadAttention's packed in_proj_weight (3E, E) = [q; k; v]; ConfigError unless G = H and kdim = vdim = E.
    void set_in_proj_weight(TensorView<const T> weight);
    // Biases: ConfigError when the module was built without bias.
    void set_q_proj_bias(TensorView<const T> bias);    // (E)
    void set_k_proj_bias(TensorView<const T> bias);    // (G*Dh)
    void set_v_proj_bias(TensorView<const T> bias);    // (G*Dh)
    void set_out_proj_bias(TensorView<const T> bias);  // (E)
    // Packed (3E) = [q; k; v]; ConfigError unless G = H (kdim and vdim may differ from E, as in PyTorch).
    void set_in_proj_bias(TensorView<const T> bias);

    TensorView<const T> q_proj_weight() const { return q_weight_; }
    TensorView<const T> k_proj_weight() const { return k_weight_; }
    TensorView<const T> v_proj_weight() const { return v_weight_; }
    TensorView<const T> out_proj_weight() const { return out_weight_; }
    // Empty (numel 0) views when the module has no bias.
    TensorView<const T> q_proj_bias() const { return q_bias_; }
    TensorView<const T> k_proj_bias() const { return k_bias_; }
    TensorView<const T> v_proj_bias() const { return v_bias_; }
    TensorView<const T> out_proj_bias() const { return out_bias_; }

    // x (B, T, E): queries, keys and values all from x.
    MhaResult<T> forward_self(TensorView<const T> x, std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                              const MhaOptions& options = {}) const;
    // query_states (B, Tq, E); memory_states (B, Tk, kdim) gives keys and values (requires kdim == vdim).
    MhaResult<T> forward_cross(TensorView<const T> query_states, TensorView<const T> memory_states,
                               std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                               const MhaOptions& options = {}) const;
    // nn.MultiheadAttention's forward(query, key, value): query_states (B, Tq, E), key_states (B, Tk, kdim),
    // value_states (B, Tk, vdim).
    MhaResult<T> forward(TensorView<const T> query_states, TensorView<const T> key_states,
                         TensorView<const T> value_states,
                         std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                         const MhaOptions& options = {}) const;
    // The nn.MultiheadAttention mask convention (true = ignore), accepted only here: blocked_mask (same shapes as
    // allowed_mask above; reshape a PyTorch (B*H, Tq, Tk) mask to (B, H, Tq, Tk) first) and key_padding_blocked
    // (B, Tk) are converted once to the allowed convention. ConfigError if options.key_padding_allowed is also set.
    MhaResult<T> forward_blocked(TensorView<const T> query_states, TensorView<const T> key_states,
                                 TensorView<const T> value_states, std::optional<TensorView<const bool>> blocked_mask,
                                 std::optional<TensorView<const bool>> key_padding_blocked,
                                 const MhaOptions& options = {}) const;

private:
    MhaResult<T> run(const char* function, TensorView<const T> query_states, TensorView<const T> key_states,
                     TensorView<const T> value_states, std::optional<TensorView<const bool>> allowed_mask,
                     const MhaOptions& options) const;

    Index E_ = 0, H_ = 0, G_ = 0, Dh_ = 0, kdim_ = 0, vdim_ = 0;
    bool bias_ = true;
    double dropout_ = 0.0;
    std::uint64_t dropout_seed_ = 0;
    Tensor<T> q_weight_, k_weight_, v_weight_, out_weight_;
    Tensor<T> q_bias_, k_bias_, v_bias_, out_bias_;
};

extern template class MultiHeadAttention<float>;
extern template class MultiHeadAttention<double>;
// 16-bit storage (parameters, inputs, output): every projection and the attention compute in float32 and round
// their results to the storage type once (the projected q, k, v, the context, the output; weights when asked).
extern template class MultiHeadAttention<float16>;
extern template class MultiHeadAttention<bfloat16>;

// The module's mask contract, shared by MultiHeadAttention, multi_head_sdpa and the oracle: allowed_mask 2-D
// (Tq, Tk) is read as (1, 1, Tq, Tk), 3-D (B, Tq, Tk) as (B, 1, Tq, Tk) (broadcast over heads, as in the course
// module), 4-D as is, and it must broadcast to (B, H, Tq, Tk); key_padding_allowed must be (B, Tk) and is read as
// (B, 1, 1, Tk). The views keep their size-1 dims (broadcast_to(B, H, Tq, Tk) gives the full view). ShapeErrors
// name `function`, the offending mask with its shape, the target, and end with `shapes` (the caller's
// " (query_states [..], ...)").
struct MhaMaskViews {
    std::optional<TensorView<const bool>> mask;     // rank 4, broadcastable to (B, H, Tq, Tk)
    std::optional<TensorView<const bool>> padding;  // (B, 1, 1, Tk)
};
MhaMaskViews mha_mask_views(const std::string& function, const std::string& shapes,
                            std::optional<TensorView<const bool>> allowed_mask,
                            std::optional<TensorView<const bool>> key_padding_allowed, Index B, Index H, Index Tq,
                            Index Tk);

// Dropout of MultiHeadAttention, for callers of multi_head_sdpa: probability in [0, 1) and seed.
struct MhaDropout {
    double p = 0.0;
    std::uint64_t seed = 0;
};

// The module's head path without the projections: split -> SDPA over (B, H) -> merge.
//   q_projected (B, Tq, H*Dk), k_projected (B, Tk, G*Dk), v_projected (B, Tk, G*Dv) -> output (B, Tq, H*Dv),
//   weights (B, H, Tq, Tk) or (B, Tq, Tk). Head h is columns [h*Dk, (h+1)*Dk) of q_projected and reads kv head
//   h / (H/G). Masks, options and contracts as MultiHeadAttention::forward (function name "multi_head_sdpa").
MhaResult<float> multi_head_sdpa(TensorView<const float> q_projected, TensorView<const float> k_projected,
                                 TensorView<const float> v_projected, Index num_heads, Index num_kv_heads,
                                 std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                 const MhaOptions& options = {}, const MhaDropout& dropout = {});
MhaResult<double> multi_head_sdpa(TensorView<const double> q_projected, TensorView<const double> k_projected,
                                  TensorView<const double> v_projected, Index num_heads, Index num_kv_heads,
                                  std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                  const MhaOptions& options = {}, const MhaDropout& dropout = {});
// 16-bit storage: the SDPA core computes in float32 and rounds the context (and the weights) to it once.
MhaResult<float16> multi_head_sdpa(TensorView<const float16> q_projected, TensorView<const float16> k_projected,
                                   TensorView<const float16> v_projected, Index num_heads, Index num_kv_heads,
                                   std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                   const MhaOptions& options = {}, const MhaDropout& dropout = {});
MhaResult<bfloat16> multi_head_sdpa(TensorView<const bfloat16> q_projected, TensorView<const bfloat16> k_projected,
                                    TensorView<const bfloat16> v_projected, Index num_heads, Index num_kv_heads,
                                    std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                    const MhaOptions& options = {}, const MhaDropout& dropout = {});

// The gradients of the head path (multi_head_sdpa): of q_projected, k_projected and v_projected, in their shapes.
template <class T>
struct MhaGradients {
    Tensor<T> dq_projected;  // (B, Tq, H*Dk)
    Tensor<T> dk_projected;  // (B, Tk, G*Dk): a kv head's gradient is the sum over the H/G query heads that read it
    Tensor<T> dv_projected;  // (B, Tk, G*Dv)
};

// The backward pass of multi_head_sdpa: the gradients of L = sum(dout * context), context = multi_head_sdpa(the same
// inputs, masks, options and dropout), dout (B, Tq, H*Dv) of any strides. It recomputes the forward (its output and
// lse) and runs sdpa_backward (attn/backward.hpp: its formulas and contracts, per head) on the split heads, so the
// backend, thread count and tiled blocks are options' as in the forward; errors name "multi_head_sdpa_backward".
// Training mode with dropout.p > 0: the weights the forward dropped are dropped again, from the same seed and
// options.dropout_step (MhaConfig::dropout_seed's rule), so the gradients are those of the dropped-out forward:
// dv = dropped(P)^T dout and dP = dropped(dout v^T), dropped(x) = x times 1/(1-p) (rounded to the compute type) where
// kept and 0 where dropped,
// D_i = sum_j P_ij dP_ij = dout_i . context_i, dS = P (dP - D). That backward is the reference one (P materialised
// per head, whatever options.backend says).
MhaGradients<float> multi_head_sdpa_backward(TensorView<const float> q_projected, TensorView<const float> k_projected,
                                             TensorView<const float> v_projected, TensorView<const float> dout,
                                             Index num_heads, Index num_kv_heads,
                                             std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                             const MhaOptions& options = {}, const MhaDropout& dropout = {});
MhaGradients<double> multi_head_sdpa_backward(TensorView<const double> q_projected,
                                              TensorView<const double> k_projected,
                                              TensorView<const double> v_projected, TensorView<const double> dout,
                                              Index num_heads, Index num_kv_heads,
                                              std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                              const MhaOptions& options = {}, const MhaDropout& dropout = {});
// 16-bit storage: sdpa_backward's (float32 inside, rounded once).
MhaGradients<float16> multi_head_sdpa_backward(TensorView<const float16> q_projected,
                                               TensorView<const float16> k_projected,
                                               TensorView<const float16> v_projected, TensorView<const float16> dout,
                                               Index num_heads, Index num_kv_heads,
                                               std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                               const MhaOptions& options = {}, const MhaDropout& dropout = {});
MhaGradients<bfloat16> multi_head_sdpa_backward(TensorView<const bfloat16> q_projected,
                                                TensorView<const bfloat16> k_projected,
                                                TensorView<const bfloat16> v_projected,
                                                TensorView<const bfloat16> dout, Index num_heads, Index num_kv_heads,
                                                std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                                const MhaOptions& options = {}, const MhaDropout& dropout = {});

}  // namespace attn
