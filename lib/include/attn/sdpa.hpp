// attn/sdpa.hpp: scaled dot-product attention, softmax(scale * q k^T, masked over keys) v, for self and cross attention.
#pragma once

#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "attn/half.hpp"
#include "attn/mask.hpp"
#include "attn/tensor.hpp"

namespace attn {

// What a query row with no allowed key produces.
enum class EmptyRowPolicy {
    Throw,  // default: MaskError naming the first offending batch index and query row
    Zero,   // output row and weights row are 0
    Nan,    // output row and weights row are NaN (PyTorch's math path)
};

enum class Backend {
    Auto,       // the library picks: tiled when Tq * Tk >= 128 * 128 and no weights are asked for, else reference
    Reference,  // materialises scores per (batch, head) with BLIS gemm; clear before fast
    Tiled,      // online softmax over key blocks, never a Tq x Tk matrix (return_weights: reference runs instead)
};

// A view of a float tensor of any of the four dtypes, for the options that take a tensor (SdpaOptions::bias,
// SdpaOptions::alibi_slopes), which must have the inputs' dtype. It holds no data: the tensor must outlive the call.
class FloatView {
public:
    using View = std::variant<TensorView<const float>, TensorView<const double>, TensorView<const float16>,
                              TensorView<const bfloat16>>;
    template <class T>
    FloatView(TensorView<T> view) : view_(TensorView<const std::remove_const_t<T>>(view)) {}
    template <class T>
    FloatView(const Tensor<T>& tensor) : view_(tensor.view()) {}
    template <class T>
    FloatView(Tensor<T>&&) = delete;  // a temporary tensor would be gone before the call reads it

    const View& view() const { return view_; }
    // The view when its dtype is T, else nullptr.
    template <class T>
    const TensorView<const T>* get() const { return std::get_if<TensorView<const T>>(&view_); }
    Shape shape() const;
    const char* dtype_name() const;  // "float32", "float64", "float16", "bfloat16"

private:
    View view_;
};

const char* to_string(EmptyRowPolicy policy);
const char* to_string(Backend backend);

struct SdpaOptions {
    std::optional<double> scale;  // default 1/sqrt(Dk)
    bool is_causal = false;       // and-ed with allowed_mask when both are given
    CausalAlignment alignment = CausalAlignment::TopLeft;
    // Sliding window (attn/mask.hpp, SlidingWindow: FlashAttention's window_size, either alignment), and-ed with the
    // causal rule and allowed_mask. Backend tiled never computes the key blocks a window excludes: the cost of a
    // window of width w grows like Tq w, not Tq Tk.
    std::optional<SlidingWindow> window;
    // Logit soft-capping (Gemma 2, FlashAttention's softcap): every logit s = scale * q.k becomes
    // softcap * tanh(s / softcap), after the scaling and before any mask (a blocked key stays blocked: weight exactly
    // 0). 0 = off. It must be 0 or finite and, in the type the logits are computed in, at least its smallest normal
    // number: ConfigError otherwise.
    double softcap = 0;
    // Additive bias (PyTorch's float attn_mask, of q's dtype, broadcastable to (batch..., Tq, Tk)): added to every
    // logit after the scaling and the soft-capping, before the masks: s' = softcap * tanh(s / softcap) + bias (or
    // s + bias without a cap). A -inf entry blocks its key exactly like a false in allowed_mask (weight exactly 0; a
    // row blocked everywhere is an empty row); both may be given. Every other entry a query reads must be finite
    // (ValueError under check_finite). Another dtype is a ConfigError, a shape that does not broadcast a ShapeError.
    std::optional<FloatView> bias;
    // ALiBi (FlashAttention's alibi_slopes): slopes of q's dtype broadcastable to the batch shape ((H) or (B, H) for q
    // (B, H, Tq, Dk)); the logit of query i and key j gets -slope * |i + Tk - Tq - j| (bottom-right aligned), added
    // with the bias. attn::alibi_slopes gives the standard slopes. A slope must be finite and small enough that no
    // such term overflows (ValueError otherwise); a shape that does not broadcast is a ShapeError.
    std::optional<FloatView> alibi_slopes;
    EmptyRowPolicy empty_rows = EmptyRowPolicy::Throw;
    bool check_finite = true;     // ValueError on a NaN/Inf at a readable position
    bool return_weights = false;
    // Also return each query row's log-sum-exp, lse = log(sum over allowed keys j of exp(s'_j)) with s' the final
    // logit (scaled, soft-capped, biased), in the compute type (float for the 16-bit types): what the backward pass
    // (attn/backward.hpp) recomputes the weights from, p_j = exp(s'_j - lse). -inf for a row with no allowed key.
    bool return_lse = false;
    Backend backend = Backend::Auto;
    int num_threads = 0;          // 0: OpenMP's default; the result is bitwise the same for any count
    // Backend tiled only: query rows per task and keys per online-softmax step (0: attn::tiled_kernel_info's). Small
    // blocks make every step between blocks happen at sizes a test can afford; oracle::library_tiled_model(key_block)
    // is the matching error model.
    Index tiled_query_block = 0, tiled_key_block = 0;
};

// The standard ALiBi slopes of `heads` heads (Press et al.): 2^(-8 h / H) for h = 1..H when H is a power of two;
// otherwise those of the power of two n below H, then every other slope of 2n (2^(-4 (2 h - 1) / n)) for the
// remaining H - n heads. Round them to the inputs' dtype to pass them as SdpaOptions::alibi_slopes.
std::vector<double> alibi_slopes(Index heads);

template <class T>
struct SdpaResult {
    Tensor<T> output;                  // (..., Tq, Dv)
    std::optional<Tensor<T>> weights;  // (..., Tq, Tk) when options.return_weights
    std::optional<Tensor<compute_t<T>>> lse = std::nullopt;  // (..., Tq) when options.return_lse
};

// q (..., Tq, Dk), k (..., Tk, Dk), v (..., Tk, Dv); leading dims broadcast (NumPy rules) to the batch shape.
// allowed_mask: bool, broadcastable to (batch..., Tq, Tk); true = may attend. Masks apply to logits (-inf) before
// the softmax over keys. Values in key/value rows that no query may read never change the output.
// Errors (attn::Error): ShapeError for ranks, sizes and broadcasting; MaskError for an empty row under Throw;
// ValueError for a NaN/Inf at a readable position while check_finite is on; ConfigError for a bad option.
SdpaResult<float> scaled_dot_product_attention(TensorView<const float> q, TensorView<const float> k,
                                               TensorView<const float> v,
                                               std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                               const SdpaOptions& options = {});
SdpaResult<double> scaled_dot_product_attention(TensorView<const double> q, TensorView<const double> k,
                                                TensorView<const double> v,
                                                std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                                const SdpaOptions& options = {});
// 16-bit storage (attn/half.hpp): q, k and v are read exactly into float32, the logits, the softmax and the weighted
// sum are computed and accumulated in float32 by the same kernels, and the output (and the weights) are rounded to
// the storage type once, at the end. No intermediate is rounded to 16 bits (oracle::ErrorModel's storage fields
// describe kernels that do, e.g. FlashAttention's P rounded before the P V product).
SdpaResult<float16> scaled_dot_product_attention(TensorView<const float16> q, TensorView<const float16> k,
                                                 TensorView<const float16> v,
                                                 std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                                 const SdpaOptions& options = {});
SdpaResult<bfloat16> scaled_dot_product_attention(TensorView<const bfloat16> q, TensorView<const bfloat16> k,
                                                  TensorView<const bfloat16> v,
                                                  std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                                  const SdpaOptions& options = {});

// The same call writing the output into `out`, a contiguous tensor of the output's shape that the caller owns and
// may reuse from call to call: no allocation, and no first touch of fresh pages, which costs as much as the kernel
// on a large output. Bitwise the output of scaled_dot_product_attention. ShapeError for another shape or a strided
// `out`, ConfigError when it overlaps an input or options.return_weights or return_lse is set (they need the other
// call).
void scaled_dot_product_attention_into(TensorView<float> out, TensorView<const float> q, TensorView<const float> k,
                                       TensorView<const float> v,
                                       std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                       const SdpaOptions& options = {});
void scaled_dot_product_attention_into(TensorView<double> out, TensorView<const double> q, TensorView<const double> k,
                                       TensorView<const double> v,
                                       std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                       const SdpaOptions& options = {});
void scaled_dot_product_attention_into(TensorView<float16> out, TensorView<const float16> q,
                                       TensorView<const float16> k, TensorView<const float16> v,
                                       std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                       const SdpaOptions& options = {});
void scaled_dot_product_attention_into(TensorView<bfloat16> out, TensorView<const bfloat16> q,
                                       TensorView<const bfloat16> k, TensorView<const bfloat16> v,
                                       std::optional<TensorView<const bool>> allowed_mask = std::nullopt,
                                       const SdpaOptions& options = {});

}  // namespace attn
