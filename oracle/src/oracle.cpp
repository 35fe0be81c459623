// The oracle: error models, dispatch on the working precision, correct rounding to the target dtype.
#include "attn/oracle/oracle.hpp"

#include <boost/multiprecision/mpfr.hpp>
#include <cmath>

#include "attn/detail/problem.hpp"
#include "attn/tiled.hpp"
#include "engine.hpp"
#include "types.hpp"

namespace attn::oracle {

ErrorModel generic_model() {
    return ErrorModel{};  // the defaults of ErrorModel are the generic model (attn/oracle/oracle.hpp says why each is)
}

ErrorModel reference_model() {
    ErrorModel m;
    m.name = "reference";
    // glibc's exp and expf (the reference's std::exp in T) are documented in their sources at below 0.52 ulp
    // (sysdeps/ieee754/dbl-64/e_exp.c, flt-32/e_expf.c); 1 ulp leaves margin for other C libraries.
    m.exp_ulps = 1.0;
    // glibc's tanh and tanhf (the reference's std::tanh in T, SdpaOptions::softcap): 2 ulps in its table of known
    // errors for x86-64 (libm-test-ulps), which rounds its measurements; measured against the exact value here up to
    // 1.99 (float) and 2.05 (double) ulps (lib/tests/tiled_oracle_test.cpp, which checks them against this number): 3.
    m.tanh_ulps = 3.0;
    m.rescalings = 0;              // materialised scores: one max, one exp per key, one sum
    m.scale_folded_into_q = false;  // BLIS applies the scale as gemm's alpha, after the dot product
    m.key_block = 0;
    m.scale_roundings = 1;  // static_cast<T>(scale)
    m.shift_roundings = 1;  // std::exp(s - m)
    m.rounded_max_shift = false;
    m.stale_max = 0;
    m.split_kv = false;
    m.reciprocal_normalisation = false;  // p = e / sum
    m.gradual_underflow = true;          // x86-64 CPU arithmetic; the library never sets flush-to-zero
    m.inputs_flushed = false;
    return m;
}

ErrorModel tiled_model(Index key_block) {
    if (key_block <= 0)
        throw ConfigError("oracle.tiled_model: key_block must be positive, got " + std::to_string(key_block));
    ErrorModel m;
    m.name = "tiled";
    m.exp_ulps = 1.0;  // Highway's Exp: "Max Error: ULP = 1" (hwy/contrib/math/math-inl.h)
    m.rescalings = -1;
    m.key_block = key_block;  // one rescaling per key block
    m.scale_folded_into_q = true;
    m.scale_roundings = 3;  // static_cast<T>(scale), times a rounded log2(e)
    // A FlashAttention-2-style kernel: exp2(fma(s, c, -fl(m c))), rescaling by exp2(fl(fl(m_old - m_new) * c)),
    // output acc * fl(1 / l), possibly on a GPU that flushes to zero.
    m.shift_roundings = 2;
    m.rounded_max_shift = true;
    m.stale_max = 0;  // FlashAttention-2 rescales whenever the max moves
    m.split_kv = false;
    m.reciprocal_normalisation = true;
    m.gradual_underflow = false;
    m.inputs_flushed = true;
    // FlashAttention-2's backward: P = exp2(fma(s, c, -lse c)) from the saved lse, D from the saved output.
    m.backward_weights_from_lse = true;
    m.backward_d_from_output = true;
    return m;
}

ErrorModel library_tiled_model(Index key_block) {
    // The facts attn/tiled.hpp states of the kernel, each read as it is: no claim about the kernel is made here.
    const TiledKernelInfo& k = tiled_kernel_info;
    ErrorModel m = tiled_model(key_block);
    m.exp_ulps = k.exp_max_ulps;
    m.tanh_ulps = k.tanh_max_ulps;
    m.scale_folded_into_q = k.scale_folded_into_q;
    m.block_partial_sums = k.block_partial_sums;
    m.scale_roundings = k.scale_roundings;
    m.shift_roundings = k.shift_roundings;
    m.rounded_max_shift = k.rounded_max_shift;
    m.stale_max = k.stale_max;
    m.split_kv = k.split_kv;
    m.reciprocal_normalisation = k.reciprocal_normalisation;
    m.gradual_underflow = k.gradual_underflow;
    m.inputs_flushed = k.inputs_flushed;
    m.backward_weights_from_lse = tiled_backward_info.weights_from_lse;
    m.backward_d_from_output = tiled_backward_info.d_from_output;
    return m;
}

ErrorModel model_by_name(const std::string& name, Index key_block) {
    if (name == "generic") return generic_model();
    if (name == "reference") return reference_model();
    if (name == "tiled") return tiled_model(key_block);
    throw ConfigError("oracle: unknown error model '" + name + "' (generic, reference or tiled)");
}

Index effective_rescalings(const ErrorModel& model, Index Tk) {
    if (model.rescalings >= 0) return model.rescalings;
    if (model.key_block > 0) return (Tk + model.key_block - 1) / model.key_block;
    return Tk;
}

template <>
double round_to<double>(double hi, double /*lo*/) {
    return hi;  // hi is already the value rounded to nearest double
}

template <>
float round_to<float>(double hi, double lo) {
    // Rounding hi (= RN(x)) to float is RN(x) except when hi is exactly halfway between two floats: a midpoint
    // is itself a double, so no other midpoint can lie between x and hi. Then lo decides.
    const float f = static_cast<float>(hi);
    if (!std::isfinite(f) || static_cast<double>(f) == hi || lo == 0) return f;
    const float other = std::nextafter(f, hi > static_cast<double>(f) ? INFINITY : -INFINITY);
    if (!std::isfinite(other)) return f;
    const double mid = (static_cast<double>(f) + static_cast<double>(other)) / 2;  // exact
    if (hi != mid) return f;
    const bool want_larger = lo > 0;
    return (other > f) == want_larger ? other : f;
}

namespace {

// RN_S(x) for the 16-bit storage types from hi + lo (hi = RN_double(x)), by the argument round_to<float> makes: every
// midpoint of S is a double, so hi is on x's side of each, and lo decides only when hi is one. Infinity counts as the
// value after the largest finite one (2^(max_exponent)), so that x just below the overflow threshold rounds to the
// largest finite value even when hi is the threshold itself.
template <class S>
S round_to_storage(double hi, double lo) {
    const S nearest(hi);
    if (lo == 0 || !std::isfinite(hi)) return nearest;
    const double a = std::fabs(hi);
    const S s(a);
    const auto value = [](S h) {
        const float f = h;
        return std::isinf(f) ? std::ldexp(1.0, std::numeric_limits<S>::max_exponent) : static_cast<double>(f);
    };
    if (value(s) == a) return nearest;
    const S other = S::from_bits(static_cast<std::uint16_t>(a > value(s) ? s.bits + 1 : s.bits - 1));
    const double mid = (value(s) + value(other)) / 2;  // exact: both have at most 11 significant bits
    if (a != mid) return nearest;
    const bool larger_magnitude = hi > 0 ? lo > 0 : lo < 0;
    const S pick = (value(other) > value(s)) == larger_magnitude ? other : s;
    return S::from_bits(static_cast<std::uint16_t>(pick.bits | (hi < 0 ? 0x8000u : 0u)));
}

}  // namespace

template <>
float16 round_to<float16>(double hi, double lo) {
    return round_to_storage<float16>(hi, lo);
}

template <>
bfloat16 round_to<bfloat16>(double hi, double lo) {
    return round_to_storage<bfloat16>(hi, lo);
}

namespace {

template <class Real, class T>
void solve(const SdpaProblem<T>& p, const std::vector<Readability>& readable, const SdpaOptions& options,
           const ErrorModel& model, bool fast, Result<T>& result) {
    detail::Engine<Real, T> engine(p, readable, options, model, fast, std::numeric_limits<Real>::digits, result);
    engine.run();
    result.bits = std::numeric_limits<Real>::digits;
}

}  // namespace

template <class T>
Result<T> solve_with_backend(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                             std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options,
                             const OracleOptions& oracle_options, detail::Backend backend) {
    const SdpaProblem<T> p = make_sdpa_problem<T>("oracle.sdpa", q, k, v, allowed_mask, options);
    const std::vector<Readability> readable = check_contracts(p, options);
    detail::check_oracle_options("oracle.sdpa", oracle_options);
    Result<T> r;
    r.output = Tensor<T>(p.output_shape());
    r.weights = Tensor<T>(p.weights_shape());
    r.output_bound = Tensor<double>(p.output_shape());
    r.weights_bound = Tensor<double>(p.weights_shape());
    r.logits_bound = Tensor<double>(p.weights_shape());
    r.output_scale = Tensor<double>(p.output_shape());
    r.output_exact = Tensor<long double>(p.output_shape());
    r.weights_exact = Tensor<long double>(p.weights_shape());
    r.output_exact_lo = Tensor<long double>(p.output_shape());
    r.weights_exact_lo = Tensor<long double>(p.weights_shape());
    r.model = oracle_options.model;
    r.statistical = oracle_options.statistical;
    if (r.statistical) {
        r.output_stat_bound = Tensor<double>(p.output_shape());
        r.weights_stat_bound = Tensor<double>(p.weights_shape());
        Shape rows = p.output_shape();
        rows.pop_back();
        r.row_stat_det = Tensor<double>(rows);
        r.row_stat_sigma = Tensor<double>(rows);
    }
    const int bits = oracle_options.bits;
    const bool fast = bits == 0;
    if (backend == detail::Backend::CppBinFloat) {
        if (bits == 0 || bits <= 113) solve<detail::BinFloat113, T>(p, readable, options, r.model, fast, r);
        else solve<detail::BinFloat256, T>(p, readable, options, r.model, false, r);
    } else {
        if (bits <= 114) solve<detail::Mpfr114, T>(p, readable, options, r.model, fast, r);
        else if (bits <= 261) solve<detail::Mpfr261, T>(p, readable, options, r.model, false, r);
        else solve<detail::Mpfr516, T>(p, readable, options, r.model, false, r);
    }
    if (r.oracle_error_ratio > max_oracle_error_ratio)
        throw Error("oracle.sdpa: the oracle's own error reaches " + std::to_string(r.oracle_error_ratio) +
                    " of a bound (limit 1e-6) at " + std::to_string(r.bits) + " bits; raise --bits");
    return r;
}

template <class T>
Result<T> scaled_dot_product_attention(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                                       std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options,
                                       const OracleOptions& oracle_options) {
    return solve_with_backend<T>(q, k, v, allowed_mask, options, oracle_options, detail::Backend::Mpfr);
}

template Result<float> scaled_dot_product_attention<float>(TensorView<const float>, TensorView<const float>,
                                                           TensorView<const float>, std::optional<TensorView<const bool>>,
                                                           const SdpaOptions&, const OracleOptions&);
template Result<double> scaled_dot_product_attention<double>(TensorView<const double>, TensorView<const double>,
                                                             TensorView<const double>,
                                                             std::optional<TensorView<const bool>>, const SdpaOptions&,
                                                             const OracleOptions&);
template Result<float16> scaled_dot_product_attention<float16>(TensorView<const float16>, TensorView<const float16>,
                                                               TensorView<const float16>,
                                                               std::optional<TensorView<const bool>>, const SdpaOptions&,
                                                               const OracleOptions&);
template Result<bfloat16> scaled_dot_product_attention<bfloat16>(TensorView<const bfloat16>, TensorView<const bfloat16>,
                                                                 TensorView<const bfloat16>,
                                                                 std::optional<TensorView<const bool>>,
                                                                 const SdpaOptions&, const OracleOptions&);
template Result<float> solve_with_backend<float>(TensorView<const float>, TensorView<const float>, TensorView<const float>,
                                                 std::optional<TensorView<const bool>>, const SdpaOptions&,
                                                 const OracleOptions&, detail::Backend);
template Result<double> solve_with_backend<double>(TensorView<const double>, TensorView<const double>,
                                                   TensorView<const double>, std::optional<TensorView<const bool>>,
                                                   const SdpaOptions&, const OracleOptions&, detail::Backend);

}  // namespace attn::oracle
