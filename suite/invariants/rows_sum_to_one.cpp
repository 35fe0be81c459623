// Invariant 1: attention rows are non-negative and sum to one over the keys (row-stochasticity).
#include <cmath>

#include "../checks.hpp"

namespace attn::suite {

Property rows_sum_to_one() {
    Property p;
    p.name = "rows_sum_to_one";
    p.sentence = "Every attention row with an allowed key is non-negative and sums to one over the keys, within the oracle's bound.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.bias = true}); };
    p.required = numeric_regimes();
    p.check = [](const Implementation& impl, const SdpaCase& original) -> Verdict {
        // With v = identity the output row is the weights row, for any implementation.
        const SdpaCase c = with_identity_values(original);
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> w = run_impl<T>(impl, c);  // (B, H, Tq, Tk)
            const oracle::Result<T> o = oracle_for<T>(impl, c);
            const Tensor<bool> allowed = expanded_allowed(c);
            for (Index r = 0; r < c.B * c.H * c.Tq; ++r) {
                bool nonempty = false;
                for (Index j = 0; j < c.Tk; ++j) nonempty |= allowed[r * c.Tk + j];
                if (!nonempty) continue;
                long double sum = 0, bound = 0;
                for (Index j = 0; j < c.Tk; ++j) {
                    const T x = w[r * c.Tk + j];
                    if (!(x >= 0)) return "weight" + index_string(c, r * c.Tk + j, c.Tk) + " is " + num(x) + ", not >= 0";
                    sum += x;
                    bound += o.output_bound[r * c.Tk + j];
                }
                // The exact weights sum to 1, so |sum_j w^_j - 1| <= sum_j |w^_j - w_j| <= sum_j bound_j; summing in
                // long double adds at most Tk * 2^-64 * sum.
                const long double slack = bound + static_cast<long double>(c.Tk) * 0x1p-64L * sum;
                if (std::fabs(sum - 1.0L) > slack)
                    return "row" + index_string(c, r * c.Tk, c.Tk) + " sums to " + num(static_cast<double>(sum)) +
                           ", further from 1 than the summed bound " + num(static_cast<double>(slack));
            }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
