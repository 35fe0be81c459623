// Invariant 15: grouped-query attention (K/V heads shared by groups of query heads) equals multi-head attention
// with the K/V heads repeated.
#include "../checks.hpp"

namespace attn::suite {

Property gqa_equals_mha_with_repeated_kv_heads() {
    Property p;
    p.name = "gqa_equals_mha_with_repeated_kv_heads";
    p.sentence = "Attention with G shared K/V heads equals attention with each K/V head repeated for its H/G query "
                 "heads, within the oracle's bound.";
    // A bias and ALiBi are per query head: repeating the K/V heads leaves them as they are.
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.force_grouped = true, .bias = true}); };
    p.required = {Regime::GroupedKv};
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        const SdpaCase repeated = with_repeated_kv_heads(c);
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> grouped = run_impl<T>(impl, c), full = run_impl<T>(impl, repeated);
            const oracle::Result<T> o = oracle_for<T>(impl, repeated);
            return within_two_bounds(c, grouped, o.output_bound, full, o.output_bound, "grouped vs repeated K/V heads");
        });
    };
    return p;
}

}  // namespace attn::suite
