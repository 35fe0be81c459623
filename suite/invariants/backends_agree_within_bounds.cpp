// Invariant 17: every implementation agrees with `reference` within the sum of their oracle bounds (tiled vs
// reference, the module path vs reference).
#include "../checks.hpp"

namespace attn::suite {

Property backends_agree_within_bounds() {
    Property p;
    p.name = "backends_agree_within_bounds";
    p.sentence = "Every implementation agrees with the reference backend within the sum of their oracle bounds.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.very_long_keys = true, .bias = true}); };
    p.applies = [](const Implementation& impl) { return impl.name != "reference"; };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        const Implementation& reference = implementation("reference");
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> a = run_impl<T>(impl, c), b = run_impl<T>(reference, c);
            const oracle::Result<T> oa = oracle_for<T>(impl, c), ob = oracle_for<T>(reference, c);
            return within_two_bounds(c, a, oa.output_bound, b, ob.output_bound, impl.name + " vs reference");
        });
    };
    return p;
}

}  // namespace attn::suite
