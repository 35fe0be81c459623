// Invariant 12: adding a constant to every logit of a row (through an extra q feature against a constant key
// feature) changes nothing beyond the oracle's bounds.
#include <cmath>
#include <limits>

#include "../checks.hpp"

namespace attn::suite {

Property softmax_shift_invariance() {
    Property p;
    p.name = "softmax_shift_invariance";
    p.sentence = "Adding a constant to all logits of a row, through q, changes no output beyond the oracle's bounds.";
    // A bias and ALiBi are added after the shift: the shifted logits' row still differs by one constant.
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.softcap = false, .bias = true}); };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        // q' = [q, a_i] and k' = [k, 1] with the original scale: logit'_ij = logit_ij + scale * a_i. Shifts reach
        // a few times log(max finite), beyond exp's overflow threshold.
        Rng rng(c.aux_seed);
        const double scale = resolved_scale(c.options.scale, c.Dk);
        const double log_max = gen::log_max(c.dtype);
        SdpaCase s = c;
        s.Dk = c.Dk + 1;
        s.options.scale = scale;
        s.q = Tensor<double>({c.B, c.H, c.Tq, s.Dk});
        s.k = Tensor<double>({c.B, c.kv_heads, c.Tk, s.Dk});
        for (Index r = 0; r < c.B * c.H * c.Tq; ++r) {
            for (Index x = 0; x < c.Dk; ++x) s.q[r * s.Dk + x] = c.q[r * c.Dk + x];
            s.q[r * s.Dk + c.Dk] = gen::round_to(c.dtype, (rng.below(2) ? -1 : 1) * rng.uniform(0, 3 * log_max) / scale);
        }
        for (Index r = 0; r < c.B * c.kv_heads * c.Tk; ++r) {
            for (Index x = 0; x < c.Dk; ++x) s.k[r * s.Dk + x] = c.k[r * c.Dk + x];
            s.k[r * s.Dk + c.Dk] = 1.0;
        }
        SdpaCase base = c;
        base.options.scale = scale;
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> out = run_impl<T>(impl, base), shifted = run_impl<T>(impl, s);
            const oracle::Result<T> o = oracle_for<T>(impl, base), os = oracle_for<T>(impl, s);
            return within_two_bounds(c, out, o.output_bound, shifted, os.output_bound, "original vs shifted logits");
        });
    };
    return p;
}

}  // namespace attn::suite
