// Softmax is invariant to a shift of each row: a bias constant along every query row (shape (B, H, Tq, 1)) leaves
// every output within the oracle's bound of the biased call of the exact output without the bias.
#include "../checks.hpp"

namespace attn::suite {

Property a_row_constant_bias_changes_nothing() {
    Property p;
    p.name = "a_row_constant_bias_changes_nothing";
    p.sentence = "With a bias constant along every query row, every output element is within the oracle's bound "
                 "(of the biased call) of the exact output without the bias.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d); };
    p.needs_bias = true;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        SdpaCase biased = c;
        Rng rng(c.aux_seed);
        Tensor<double> bias({c.B, c.H, c.Tq, 1});
        // Offsets from small to far beyond the logits (the exps are taken relative to each row's max).
        for (Index x = 0; x < bias.numel(); ++x)
            bias[x] = gen::round_to(c.dtype, std::ldexp(rng.normal(), static_cast<int>(rng.below(12))));
        biased.bias = std::move(bias);
        biased.bias_kind = "rows";
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            oracle::Result<T> expected = oracle_for<T>(impl, biased);  // the bound of the biased call
            const oracle::Result<T> plain = oracle_for<T>(impl, c);   // the exact values without the bias
            expected.output = plain.output;
            expected.output_exact = plain.output_exact;
            expected.output_exact_lo = plain.output_exact_lo;
            return within_bound(run_impl<T>(impl, biased), expected, "biased output vs the exact unbiased output");
        });
    };
    return p;
}

}  // namespace attn::suite
