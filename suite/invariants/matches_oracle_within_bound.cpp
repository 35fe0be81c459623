// Invariant 5: every output element is within the oracle's rigorous bound of the exact result.
#include "../checks.hpp"

namespace attn::suite {

Property matches_oracle_within_bound() {
    Property p;
    p.name = "matches_oracle_within_bound";
    p.sentence = "Every output element is within the oracle's rigorous error bound of the exact-input result.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.very_long_keys = true, .bias = true}); };
    p.required = numeric_regimes();
    for (Regime r : broadcast_regimes()) p.required.insert(r);
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            return within_bound(run_impl<T>(impl, c), oracle_for<T>(impl, c), "output vs oracle");
        });
    };
    return p;
}

}  // namespace attn::suite
