// ALiBi (SdpaOptions::alibi_slopes) is the bias -m |i + Tk - Tq - j| bottom-right aligned: written out by the suite
// as an explicit bias tensor, it gives bitwise the same output (float and double, whose bias tensor holds the
// kernel's product exactly; in 16-bit storage, which cannot, both are within their oracle bounds).
#include <cmath>

#include "../checks.hpp"

namespace attn::suite {

Property alibi_equals_the_explicit_bias_it_describes() {
    Property p;
    p.name = "alibi_equals_the_explicit_bias_it_describes";
    p.sentence = "ALiBi slopes m give bitwise the output of the explicit bias -m |i + Tk - Tq - j| (in 16-bit "
                 "storage, which cannot hold that product, both are within their oracle bounds).";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.cross = true, .very_long_keys = true, .force_alibi = true}); };
    p.needs_bias = true;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        SdpaCase written = c;  // the generator draws no explicit bias here (CaseSpec::bias is off)
        written.alibi_slopes.reset();
        written.alibi_kind = "none";
        const Tensor<double>& m = *c.alibi_slopes;  // (H) or (B, H)
        Tensor<double> bias({c.B, c.H, c.Tq, c.Tk});
        for (Index b = 0; b < c.B; ++b)
            for (Index h = 0; h < c.H; ++h) {
                const double slope = m.rank() == 1 ? m[h] : m[b * c.H + h];
                for (Index i = 0; i < c.Tq; ++i)
                    for (Index j = 0; j < c.Tk; ++j) {
                        const double distance = std::fabs(static_cast<double>(i + c.Tk - c.Tq - j));
                        double x = -slope * distance;  // exact for a float slope; the kernel's rounding for double
                        bias[((b * c.H + h) * c.Tq + i) * c.Tk + j] = gen::round_to(c.dtype, x);
                    }
            }
        written.bias = std::move(bias);
        written.bias_kind = "alibi";
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            if constexpr (is_half_v<T>) {
                if (Verdict v = within_bound(run_impl<T>(impl, c), oracle_for<T>(impl, c), "ALiBi vs oracle")) return v;
                return within_bound(run_impl<T>(impl, written), oracle_for<T>(impl, written), "written bias vs oracle");
            } else {
                return bitwise_equal(c, run_impl<T>(impl, c), run_impl<T>(impl, written), "ALiBi vs its explicit bias");
            }
        });
    };
    return p;
}

}  // namespace attn::suite
