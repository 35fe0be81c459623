// MultiHeadAttention: parameters, projections through detail::gemm (BLIS), and forward: validation, the contract
// checks (attn/detail/mha_problem.hpp), the head path (mha_heads.cpp), the output projection.
#include "attn/mha.hpp"

#include <cmath>
#include <string>
#include <utility>

#include "attn/detail/mha_problem.hpp"
#include "attn/detail/splitmix64.hpp"
#include "backends.hpp"
#include "gemm.hpp"
#include "mha_heads.hpp"

namespace attn {

namespace {

std::string str(Index n) { return std::to_string(n); }

const detail::NotFiniteReason kOverflow{
    "although every input it reads is finite: the projection overflowed; scale the inputs down"};

// Every element of a parameter is read, so all must be finite.
template <class T>
void check_parameter_finite(const std::string& function, const char* name, const Tensor<T>& p) {
    const Index cols = p.rank() == 2 ? p.dim(1) : p.numel();
    for (Index f = 0; f < p.numel(); ++f)
        if (!std::isfinite(p[f]))
            detail::throw_not_finite(function, name, p.shape(), p[f],
                                     p.rank() == 2 ? "row " + str(f / cols) + ", column " + str(f % cols) : "index " + str(f),
                                     detail::NotFiniteReason{"and every parameter is read", true});
}

// Whether BLIS takes the (T, W) matrices of this (B, T, W) view as they are: row-major with non-overlapping rows.
// Anything else (column-major, broadcast stride 0, overlapping views) is copied once: BLIS picks its small-matrix
// kernels by storage, with different summation orders, and the output must not depend on the input's strides.
template <class T>
bool gemm_friendly(TensorView<const T> x) {
    const Index st = x.stride(1), sw = x.stride(2);
    return sw == 1 && st >= x.dim(2);
}

// A contiguous copy of v in another element type (exact from 16 bits to float; rounded once the other way).
template <class To, class From>
Tensor<To> converted(TensorView<const From> v) {
    const Tensor<From> c = Tensor<From>::copy_of(v);
    Tensor<To> t(c.shape());
    for (Index f = 0; f < c.numel(); ++f) t[f] = static_cast<To>(c[f]);
    return t;
}

// y = x @ weight^T + bias in T itself (float or double), through BLIS.
template <class T>
Tensor<T> project_blas(TensorView<const T> x, const Tensor<T>& weight, const Tensor<T>& bias, int num_threads) {
    const Index B = x.dim(0), Tn = x.dim(1), in = x.dim(2), out = weight.dim(0);
    std::optional<Tensor<T>> contiguous;
    if (!gemm_friendly(x)) {
        contiguous = Tensor<T>::copy_of(x);
        x = contiguous->view();
    }
    const bool has_bias = bias.numel() > 0;
    Tensor<T> y({B, Tn, out});
    detail::parallel_for(B, detail::thread_count(num_threads), [&](Index b) {
        T* yb = y.data() + b * Tn * out;  // (Tn, out)
        if (has_bias)
            for (Index t = 0; t < Tn; ++t) std::copy_n(bias.data(), out, yb + t * out);
        // yb (Tn, out) = x_b (Tn, in) @ weight^T (in, out) + yb
        detail::gemm<T>(false, true, Tn, out, in, T(1), x.data() + b * x.stride(0), x.stride(1), x.stride(2),
                        weight.data(), in, 1, has_bias ? T(1) : T(0), yb, out, 1);
    });
    return y;
}

// y (B, T, out) = x (B, T, in) @ weight^T (in, out) + bias (out); weight (out, in) is PyTorch's layout.
// One gemm per batch element, batch elements spread over threads: each element's arithmetic is the same whatever
// the thread count, so the result is bitwise reproducible. On 16-bit storage the product and the bias are formed
// in float32 and each element is rounded to the storage type once (a 16-bit Linear accumulating in float, as
// PyTorch's are): the float32 projection of the same values, rounded.
template <class T>
Tensor<T> project(TensorView<const T> x, const Tensor<T>& weight, const Tensor<T>& bias, int num_threads) {
    if constexpr (is_half_v<T>) {
        const Tensor<float> y = project<float>(converted<float>(x).view(), converted<float>(weight.view()),
                                               converted<float>(bias.view()), num_threads);
        return converted<T>(y.view());
    } else {
        return project_blas<T>(x, weight, bias, num_threads);
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------- the module

template <class T>
MultiHeadAttention<T>::MultiHeadAttention(const MhaConfig& config) {
    const std::string function = "MultiHeadAttention";
    E_ = config.embed_dim;
    H_ = config.num_heads;
    G_ = config.num_kv_heads.value_or(H_);
    kdim_ = config.kdim.value_or(E_);
    vdim_ = config.vdim.value_or(E_);
    const std::string given = " (embed_dim=" + str(E_) + ", num_heads=" + str(H_) + ", num_kv_heads=" + str(G_) +
                              ", kdim=" + str(kdim_) + ", vdim=" + str(vdim_) + ")";
    if (E_ < 1 || H_ < 1 || G_ < 1 || kdim_ < 1 || vdim_ < 1)
        throw ConfigError(function + ": every size must be >= 1" + given);
    if (E_ % H_ != 0)
        throw ConfigError(function + ": embed_dim=" + str(E_) + " is not divisible by num_heads=" + str(H_) +
                          "; heads split the width (head_dim = embed_dim / num_heads)" + given);
    if (H_ % G_ != 0)
        throw ConfigError(function + ": num_heads=" + str(H_) + " is not a multiple of num_kv_heads=" + str(G_) +
                          "; each kv head serves num_heads / num_kv_heads query heads" + given);
    detail::check_dropout(function, config.dropout);
    Dh_ = E_ / H_;
    bias_ = config.bias;
    dropout_ = config.dropout;
    dropout_seed_ = config.dropout_seed;
    const Index kv = G_ * Dh_;
    q_weight_ = Tensor<T>({E_, E_});
    k_weight_ = Tensor<T>({kv, kdim_});
    v_weight_ = Tensor<T>({kv, vdim_});
    out_weight_ = Tensor<T>({E_, E_});
    if (bias_) {
        q_bias_ = Tensor<T>({E_});
        k_bias_ = Tensor<T>({kv});
        v_bias_ = Tensor<T>({kv});
        out_bias_ = Tensor<T>({E_});
    } else {
        q_bias_ = k_bias_ = v_bias_ = out_bias_ = Tensor<T>({0});
    }
    // Xavier-uniform (Glorot & Bengio 2010): U(-a, a), a = sqrt(6 / (fan_in + fan_out)).
    std::uint64_t state = config.init_seed;
    const auto fill = [&](Tensor<T>& w, double bound) {
        for (Index f = 0; f < w.numel(); ++f)
            w[f] = static_cast<T>((2.0 * detail::unit_uniform(detail::splitmix64_next(state)) - 1.0) * bound);
    };
    const auto xavier = [](Index fan_in, Index fan_out) { return std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)); };
    if (G_ == H_ && kdim_ == E_ && vdim_ == E_) {
        const double a = xavier(E_, 3 * E_);  // PyTorch: xavier_uniform_ on the packed (3E, E) in_proj_weight
        fill(q_weight_, a), fill(k_weight_, a), fill(v_weight_, a);
    } else {
        fill(q_weight_, xavier(E_, E_)), fill(k_weight_, xavier(kdim_, kv)), fill(v_weight_, xavier(vdim_, kv));
    }
    fill(out_weight_, 1.0 / std::sqrt(static_cast<double>(E_)));  // nn.Linear's default: kaiming_uniform(a=sqrt(5))
}

template <class T>
Index MultiHeadAttention<T>::parameter_count() const {
    return q_weight_.numel() + k_weight_.numel() + v_weight_.numel() + out_weight_.numel() + q_bias_.numel() +
           k_bias_.numel() + v_bias_.numel() + out_bias_.numel();
}

namespace {
template <class T>
void set_parameter(const char* setter, const char* name, Tensor<T>& target, TensorView<const T> value) {
    if (value.shape() != target.shape())
        throw ShapeError(std::string("MultiHeadAttention::") + setter + ": " + name + " must be " +
                         to_string(target.shape()) + ", got " + to_string(value.shape()));
    target = Tensor<T>::copy_of(value);
}
}  // namespace

template <class T>
void MultiHeadAttention<T>::set_q_proj_weight(TensorView<const T> w) { set_parameter("set_q_proj_weight", "q_proj_weight", q_weight_, w); }
template <class T>
void MultiHeadAttention<T>::set_k_proj_weight(TensorView<const T> w) { set_parameter("set_k_proj_weight", "k_proj_weight", k_weight_, w); }
template <class T>
void MultiHeadAttention<T>::set_v_proj_weight(TensorView<const T> w) { set_parameter("set_v_proj_weight", "v_proj_weight", v_weight_, w); }
template <class T>
void MultiHeadAttention<T>::set_out_proj_weight(TensorView<const T> w) {
    set_parameter("set_out_proj_weight", "out_proj_weight", out_weight_, w);
}

template <class T>
void MultiHeadAttention<T>::set_in_proj_weight(TensorView<const T> w) {
    const std::string function = "MultiHeadAttention::set_in_proj_weight";
    if (G_ != H_ || kdim_ != E_ || vdim_ != E_)
        throw ConfigError(function + ": a packed in_proj_weight needs num_kv_heads == num_heads and kdim == vdim == "
                          "embed_dim (num_heads=" + str(H_) + ", num_kv_heads=" + str(G_) + ", kdim=" + str(kdim_) +
                          ", vdim=" + str(vdim_) + ", embed_dim=" + str(E_) + "); set q, k, v separately");
    if (w.shape() != Shape{3 * E_, E_})
        throw ShapeError(function + ": in_proj_weight must be " + to_string(Shape{3 * E_, E_}) + " = (3E, E), got " +
                         to_string(w.shape()));
    // rows [0, E) are q, [E, 2E) k, [2E, 3E) v, as nn.MultiheadAttention packs them.
    q_weight_ = Tensor<T>::copy_of(w.slice(0, 0, E_));
    k_weight_ = Tensor<T>::copy_of(w.slice(0, E_, 2 * E_));
    v_weight_ = Tensor<T>::copy_of(w.slice(0, 2 * E_, 3 * E_));
}

namespace {
void require_bias(bool bias, const char* setter) {
    if (!bias)
        throw ConfigError(std::string("MultiHeadAttention::") + setter +
                          ": the module was built with bias=false, so it has no biases to set");
}
}  // namespace

template <class T>
void MultiHeadAttention<T>::set_q_proj_bias(TensorView<const T> b) {
    require_bias(bias_, "set_q_proj_bias");
    set_parameter("set_q_proj_bias", "q_proj_bias", q_bias_, b);
}
template <class T>
void MultiHeadAttention<T>::set_k_proj_bias(TensorView<const T> b) {
    require_bias(bias_, "set_k_proj_bias");
    set_parameter("set_k_proj_bias", "k_proj_bias", k_bias_, b);
}
template <class T>
void MultiHeadAttention<T>::set_v_proj_bias(TensorView<const T> b) {
    require_bias(bias_, "set_v_proj_bias");
    set_parameter("set_v_proj_bias", "v_proj_bias", v_bias_, b);
}
template <class T>
void MultiHeadAttention<T>::set_out_proj_bias(TensorView<const T> b) {
    require_bias(bias_, "set_out_proj_bias");
    set_parameter("set_out_proj_bias", "out_proj_bias", out_bias_, b);
}

template <class T>
void MultiHeadAttention<T>::set_in_proj_bias(TensorView<const T> b) {
    const std::string function = "MultiHeadAttention::set_in_proj_bias";
    require_bias(bias_, "set_in_proj_bias");
    // Unlike the weight, the packed bias exists whatever kdim and vdim are (nn.MultiheadAttention keeps it then too).
    if (G_ != H_)
        throw ConfigError(function + ": a packed in_proj_bias needs num_kv_heads == num_heads (num_heads=" + str(H_) +
                          ", num_kv_heads=" + str(G_) + "); set q, k, v biases separately");
    if (b.shape() != Shape{3 * E_})
        throw ShapeError(function + ": in_proj_bias must be " + to_string(Shape{3 * E_}) + " = (3E), got " +
                         to_string(b.shape()));
    q_bias_ = Tensor<T>::copy_of(b.slice(0, 0, E_));
    k_bias_ = Tensor<T>::copy_of(b.slice(0, E_, 2 * E_));
    v_bias_ = Tensor<T>::copy_of(b.slice(0, 2 * E_, 3 * E_));
}

template <class T>
MhaResult<T> MultiHeadAttention<T>::forward_self(TensorView<const T> x, std::optional<TensorView<const bool>> allowed_mask,
                                                 const MhaOptions& options) const {
    return run("MultiHeadAttention::forward_self", x, x, x, allowed_mask, options);
}

template <class T>
MhaResult<T> MultiHeadAttention<T>::forward_cross(TensorView<const T> query_states, TensorView<const T> memory_states,
                                                  std::optional<TensorView<const bool>> allowed_mask,
                                                  const MhaOptions& options) const {
    if (kdim_ != vdim_)
        throw ConfigError("MultiHeadAttention::forward_cross: memory_states gives keys and values, but kdim=" + str(kdim_) +
                          " != vdim=" + str(vdim_) + "; use forward(query_states, key_states, value_states)");
    return run("MultiHeadAttention::forward_cross", query_states, memory_states, memory_states, allowed_mask, options);
}

template <class T>
MhaResult<T> MultiHeadAttention<T>::forward(TensorView<const T> query_states, TensorView<const T> key_states,
                                            TensorView<const T> value_states,
                                            std::optional<TensorView<const bool>> allowed_mask,
                                            const MhaOptions& options) const {
    return run("MultiHeadAttention::forward", query_states, key_states, value_states, allowed_mask, options);
}

template <class T>
MhaResult<T> MultiHeadAttention<T>::forward_blocked(TensorView<const T> query_states, TensorView<const T> key_states,
                                                    TensorView<const T> value_states,
                                                    std::optional<TensorView<const bool>> blocked_mask,
                                                    std::optional<TensorView<const bool>> key_padding_blocked,
                                                    const MhaOptions& options) const {
    const std::string function = "MultiHeadAttention::forward_blocked";
    if (key_padding_blocked && options.key_padding_allowed)
        throw ConfigError(function + ": key padding given twice (key_padding_blocked and options.key_padding_allowed); "
                          "give it in one convention");
    // The one conversion of the blocked convention (true = ignore) to the library's allowed convention.
    std::optional<Tensor<bool>> allowed, padding_allowed;
    if (blocked_mask) allowed = blocked_to_allowed(*blocked_mask);
    if (key_padding_blocked) padding_allowed = blocked_to_allowed(*key_padding_blocked);
    MhaOptions converted = options;
    if (padding_allowed) converted.key_padding_allowed = padding_allowed->view();
    std::optional<TensorView<const bool>> allowed_view;
    if (allowed) allowed_view = allowed->view();
    return run(function.c_str(), query_states, key_states, value_states, allowed_view, converted);
}

template <class T>
MhaResult<T> MultiHeadAttention<T>::run(const char* function_name, TensorView<const T> query_states,
                                        TensorView<const T> key_states, TensorView<const T> value_states,
                                        std::optional<TensorView<const bool>> allowed_mask,
                                        const MhaOptions& options) const {
    const std::string function = function_name;
    const detail::MhaStates states =
        detail::check_mha_states(function, query_states, key_states, value_states, E_, kdim_, vdim_);
    const std::string& shapes = states.shapes;
    const Index B = states.B, Tq = states.Tq, Tk = states.Tk;
    detail::check_scale_and_threads<compute_t<T>>(function, options.scale, options.num_threads, " (" + shapes + ")");
    detail::check_softcap<compute_t<T>>(function, options.softcap, " (" + shapes + ")");
    detail::HeadMasks masks = detail::resolve_masks(function, shapes, allowed_mask, options, B, H_, Tq, Tk);
    const detail::HeadBias<T> bias = detail::resolve_bias<T>(function, shapes, options, masks, B, H_, Tq, Tk);
    const PositionRule positions = detail::position_rule(function, options, " (" + shapes + ")");
    const detail::HeadReadability readable = detail::head_readability(masks.allowed, positions, B, H_, Tq, Tk);
    detail::throw_if_empty_head_row(function, readable, positions, options.empty_rows, shapes + masks.shapes);
    detail::check_head_slopes<T>(function, bias, Tq, Tk, shapes + masks.shapes);
    if (options.check_finite) {
        detail::check_head_bias<T>(function, bias, masks, positions, shapes + masks.shapes);
        for (const auto& [name, p] : {std::pair<const char*, const Tensor<T>*>{"q_proj_weight", &q_weight_},
                                      {"k_proj_weight", &k_weight_}, {"v_proj_weight", &v_weight_},
                                      {"out_proj_weight", &out_weight_}, {"q_proj_bias", &q_bias_},
                                      {"k_proj_bias", &k_bias_}, {"v_proj_bias", &v_bias_}, {"out_proj_bias", &out_bias_}})
            check_parameter_finite(function, name, *p);
        const detail::NotFiniteReason why = detail::read_position_reason(shapes + masks.shapes);
        const auto query_read = [&](Index b, Index i) { return readable.some_head_reads_query(b, i); };
        const auto key_read = [&](Index b, Index j) { return readable.some_head_reads_key(b, j); };
        detail::check_rows<T>(function, "query_states", query_states, query_read, why);
        detail::check_rows<T>(function, "key_states", key_states, key_read, why);
        detail::check_rows<T>(function, "value_states", value_states, key_read, why);
    }

    // 1. projections: q (B, Tq, E), k (B, Tk, G*Dh), v (B, Tk, G*Dh).
    const Tensor<T> q = project<T>(query_states, q_weight_, q_bias_, options.num_threads);
    const Tensor<T> k = project<T>(key_states, k_weight_, k_bias_, options.num_threads);
    const Tensor<T> v = project<T>(value_states, v_weight_, v_bias_, options.num_threads);
    if (options.check_finite) {
        const auto q_read = [&](Index b, Index h, Index i) { return readable.nonempty(b, h, i); };
        const auto kv_read = [&](Index b, Index g, Index j) { return readable.kv_head_read(b, g, G_, j); };
        detail::check_head_rows<T>(function, "q (projected)", q, H_, q_read, kOverflow);
        detail::check_head_rows<T>(function, "k (projected)", k, G_, kv_read, kOverflow);
        detail::check_head_rows<T>(function, "v (projected)", v, G_, kv_read, kOverflow);
    }

    // 2. heads: split, SDPA over (B, H), merge -> context (B, Tq, E).
    MhaResult<T> result =
        detail::attend_heads<T>(function, q, k, v, H_, G_, masks, bias, readable, options, {dropout_, dropout_seed_});

    // 3. output projection: (B, Tq, E) @ out_proj_weight^T (E, E) + out_proj_bias.
    result.output = project<T>(result.output.view(), out_weight_, out_bias_, options.num_threads);
    if (options.check_finite) {
        const auto complete = [&](Index b, Index i) { return readable.every_head_reads_query(b, i); };  // policy-free rows
        detail::check_rows<T>(function, "output", result.output.view(), complete, kOverflow);
    }
    return result;
}

template class MultiHeadAttention<float>;
template class MultiHeadAttention<double>;
template class MultiHeadAttention<float16>;
template class MultiHeadAttention<bfloat16>;

}  // namespace attn
