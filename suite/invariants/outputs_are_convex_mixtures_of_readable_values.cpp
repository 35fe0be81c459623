// Invariant 11: each output row lies inside the per-column range of the value rows it may read (a convex
// mixture), widened by the oracle's bound.
#include <algorithm>
#include <limits>

#include "../checks.hpp"

namespace attn::suite {

Property outputs_are_convex_mixtures_of_readable_values() {
    Property p;
    p.name = "outputs_are_convex_mixtures_of_readable_values";
    p.sentence = "Each output row lies inside the per-column range of the value rows it may read, widened by the "
                 "oracle's bound.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.bias = true}); };
    p.required = {Regime::MaskedLogit, Regime::TieForRowMax, Regime::ExpOverflowLogits};
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> out = run_impl<T>(impl, c);  // (B, H, Tq, Dv)
            const oracle::Result<T> o = oracle_for<T>(impl, c);
            const Tensor<bool> allowed = expanded_allowed(c);
            const Index group = c.H / c.kv_heads;
            for (Index b = 0; b < c.B; ++b)
                for (Index h = 0; h < c.H; ++h)
                    for (Index i = 0; i < c.Tq; ++i) {
                        const Index row = (b * c.H + h) * c.Tq + i;
                        for (Index d = 0; d < c.Dv; ++d) {
                            double lo = std::numeric_limits<double>::infinity(), hi = -lo;
                            for (Index j = 0; j < c.Tk; ++j)
                                if (allowed[row * c.Tk + j]) {
                                    const double vj = c.v[((b * c.kv_heads + h / group) * c.Tk + j) * c.Dv + d];
                                    lo = std::min(lo, vj), hi = std::max(hi, vj);
                                }
                            if (lo > hi) continue;  // a row with no allowed key: the policy's property checks it
                            const double x = out[row * c.Dv + d], bound = o.output_bound[row * c.Dv + d];
                            if (!(x >= lo - bound && x <= hi + bound))
                                return "output" + index_string(c, row * c.Dv + d, c.Dv) + " = " + num(x) +
                                       " outside the readable value range [" + num(lo) + ", " + num(hi) + "] +- bound " + num(bound);
                        }
                    }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
