// The mistakes of 16-bit kernels, each in an otherwise correct float32 computation on float16 or bfloat16 storage
// that claims the library's reference model (float32 throughout, one rounding to storage at the end):
//   logits_stored_in_16_bits       the logits rounded to storage before the softmax
//   row_sum_accumulated_in_16_bits  the sum of the exps kept in storage, rounded at every addition
//   output_truncated               the result converted by truncation (the top half of a float) instead of rounding
//   output_rounded_twice           the accumulator rounded to storage, then the quotient rounded again
// Per batch element and query row, over its allowed keys: s_j = scale q.k_j, m = max s_j, e_j = exp(s_j - m),
// l = sum e_j, out_c = sum_j e_j v_jc / l, weights e_j / l.
#include <cmath>
#include <limits>

#include "naive.hpp"

namespace attn::suite::mutant {

namespace {

enum class Bug { LogitsInStorage, RowSumInStorage, OutputTruncated, OutputRoundedTwice };

// x to S toward zero: the nearest S, or its neighbour toward zero when rounding went away from it.
template <class S>
S truncated(float x) {
    const S nearest(x);
    const float n = nearest;
    if (!std::isfinite(x) || n == 0 || std::fabs(n) <= std::fabs(x)) return nearest;
    return S::from_bits(static_cast<std::uint16_t>(nearest.bits - 1));  // one step down in magnitude
}

template <class S>
SdpaResult<S> run(Bug bug, const std::string& name, TensorView<const S> q, TensorView<const S> k, TensorView<const S> v,
                  std::optional<TensorView<const bool>> mask, const SdpaOptions& options) {
    const SdpaProblem<S> p = make_sdpa_problem<S>(name, q, k, v, mask, options);
    const std::vector<Readability> readable = check_contracts(p, options);
    SdpaResult<S> r{Tensor<S>(p.output_shape()), std::nullopt};
    if (options.return_weights) r.weights = Tensor<S>(p.weights_shape(), S(0));
    const float scale = static_cast<float>(p.scale);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> s(static_cast<std::size_t>(p.Tk)), e(static_cast<std::size_t>(p.Tk));
    for (Index b = 0; b < p.batch; ++b)
        for (Index i = 0; i < p.Tq; ++i) {
            S* out = r.output.data() + (b * p.Tq + i) * p.Dv;
            S* w = r.weights ? r.weights->data() + (b * p.Tq + i) * p.Tk : nullptr;
            if (!readable[static_cast<std::size_t>(b)].row_nonempty[static_cast<std::size_t>(i)]) {
                const S fill(options.empty_rows == EmptyRowPolicy::Nan ? nan : 0.0f);
                std::fill_n(out, p.Dv, fill);
                if (w) std::fill_n(w, p.Tk, fill);
                continue;
            }
            float m = -std::numeric_limits<float>::infinity();
            for (Index j = 0; j < p.Tk; ++j) {
                if (!p.allowed(b, i, j)) continue;
                float dot = 0;
                for (Index d = 0; d < p.Dk; ++d)
                    dot += static_cast<float>(p.q_row(b, i)[d * p.q.stride(-1)]) *
                           static_cast<float>(p.k_row(b, j)[d * p.k.stride(-1)]);
                float x = scale * dot;
                if (bug == Bug::LogitsInStorage) x = static_cast<float>(S(x));
                s[static_cast<std::size_t>(j)] = x;
                m = std::max(m, x);
            }
            float l = 0;
            for (Index j = 0; j < p.Tk; ++j) {
                const auto jj = static_cast<std::size_t>(j);
                e[jj] = p.allowed(b, i, j) ? std::exp(s[jj] - m) : 0.0f;
                l = bug == Bug::RowSumInStorage ? static_cast<float>(S(l + e[jj])) : l + e[jj];
            }
            for (Index c = 0; c < p.Dv; ++c) {
                float acc = 0;
                for (Index j = 0; j < p.Tk; ++j)
                    if (p.allowed(b, i, j))
                        acc += e[static_cast<std::size_t>(j)] * static_cast<float>(p.v_row(b, j)[c * p.v.stride(-1)]);
                out[c] = bug == Bug::OutputTruncated      ? truncated<S>(acc / l)
                         : bug == Bug::OutputRoundedTwice ? S(static_cast<float>(S(acc)) / l)
                                                          : S(acc / l);
            }
            if (w)
                for (Index j = 0; j < p.Tk; ++j) w[j] = S(e[static_cast<std::size_t>(j)] / l);
        }
    return r;
}

Implementation sixteen_bit_mutant(Bug bug, const std::string& name, const std::string& description) {
    Implementation impl;
    impl.name = name;
    impl.description = description;
    impl.is_mutant = true;
    impl.error_model = oracle::reference_model();  // what it claims: float32 throughout, one rounding to storage
    impl.run_float16 = [bug, name](TensorView<const float16> q, TensorView<const float16> k, TensorView<const float16> v,
                                   std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        return run<float16>(bug, name, q, k, v, m, o);
    };
    impl.run_bfloat16 = [bug, name](TensorView<const bfloat16> q, TensorView<const bfloat16> k,
                                    TensorView<const bfloat16> v, std::optional<TensorView<const bool>> m,
                                    const SdpaOptions& o) { return run<bfloat16>(bug, name, q, k, v, m, o); };
    return impl;
}

}  // namespace

std::vector<Implementation> sixteen_bit() {
    return {sixteen_bit_mutant(Bug::LogitsInStorage, "logits_stored_in_16_bits",
                               "16-bit storage: the logits are rounded to the storage type before the softmax"),
            sixteen_bit_mutant(Bug::RowSumInStorage, "row_sum_accumulated_in_16_bits",
                               "16-bit storage: the sum of the exps is kept in the storage type"),
            sixteen_bit_mutant(Bug::OutputTruncated, "output_truncated",
                               "16-bit storage: the output is converted by truncation instead of rounding"),
            sixteen_bit_mutant(Bug::OutputRoundedTwice, "output_rounded_twice",
                               "16-bit storage: the accumulator is rounded to storage, then the quotient again")};
}

}  // namespace attn::suite::mutant
