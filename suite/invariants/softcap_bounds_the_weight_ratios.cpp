// Soft-capping (SdpaOptions::softcap) keeps every capped logit in (-c, c), so no two keys a query reads get weights
// further apart than a factor e^(2c), however large the logits. Observed through any implementation with v = the
// identity (the output row is the weights row), each weight widened by the oracle's bound of it: a computed pair
// (w_hi, w_lo) fails only if w_hi - e_hi > e^(2c) (w_lo + e_lo), which no exact pair of capped weights allows.
#include <cmath>

#include "../checks.hpp"

namespace attn::suite {

Property softcap_bounds_the_weight_ratios() {
    Property p;
    p.name = "softcap_bounds_the_weight_ratios";
    p.sentence = "With a softcap c, the weights of any two keys a query reads differ by a factor of at most e^(2c), "
                 "beyond the oracle's bounds on them, whatever the logits.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.force_softcap = true}); };
    p.check = [](const Implementation& impl, const SdpaCase& original) -> Verdict {
        const SdpaCase c = with_identity_values(original);  // output row = weights row
        const double limit = std::exp(2 * c.options.softcap);  // +inf for a cap beyond ~354: nothing to check
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> w = run_impl<T>(impl, c);  // (B, H, Tq, Tk)
            const oracle::Result<T> o = oracle_for<T>(impl, c);
            const Tensor<bool> allowed = expanded_allowed(c);
            for (Index row = 0; row < c.B * c.H * c.Tq; ++row) {
                Index hi = -1, lo = -1;  // the largest lower end and the smallest upper end of the row's weights
                double hi_value = -1, lo_value = INFINITY;
                for (Index j = 0; j < c.Tk; ++j) {
                    const Index x = row * c.Tk + j;
                    if (!allowed[x]) continue;
                    const double e = o.output_bound[x];
                    const double down = static_cast<double>(w[x]) - e, up = static_cast<double>(w[x]) + e;
                    if (down > hi_value) hi_value = down, hi = x;
                    if (up < lo_value) lo_value = up, lo = x;
                }
                if (hi < 0 || !std::isfinite(limit)) continue;
                if (hi_value > limit * lo_value)
                    return "weights" + index_string(c, hi, c.Tk) + " = " + num(w[hi]) + " and" +
                           index_string(c, lo, c.Tk) + " = " + num(w[lo]) + " differ by more than e^(2 softcap) = " +
                           num(limit) + " beyond their bounds (" + num(o.output_bound[hi]) + ", " +
                           num(o.output_bound[lo]) + ")";
            }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
