// A bias of -inf (SdpaOptions::bias) blocks its key exactly as a false in the allowed mask: the case's mask, causal
// rule and window written out as a bias of 0 (allowed) and -inf (blocked) give bitwise the output of the mask; and
// so does the blocking split between the two, each blocked pair drawn to stay a false in a mask (its bias NaN or 0,
// never read) or to become a -inf bias under a mask that allows it.
#include <cmath>
#include <limits>

#include "../checks.hpp"

namespace attn::suite {

Property a_minus_infinite_bias_is_a_false_in_the_mask() {
    Property p;
    p.name = "a_minus_infinite_bias_is_a_false_in_the_mask";
    p.sentence = "The case's blocked (query, key) pairs written as a bias of -inf, and its allowed ones as 0, give "
                 "bitwise the output of the mask, causal rule and window they replace; so do its blocked pairs split "
                 "between a -inf bias and a false in a mask (the bias there NaN or 0).";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::Blocking, .very_long_keys = true}); };
    p.needs_bias = true;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        const Tensor<bool> allowed = expanded_allowed(c);  // (B, H, Tq, Tk): the causal rule and window folded in
        const SdpaCase biased = with_blocking_as_bias(c);  // (the generator draws no bias: 0 where allowed)
        SdpaCase split = biased;
        Tensor<bool> split_mask(allowed.shape());
        Tensor<double> split_bias(allowed.shape());
        Rng rng(c.aux_seed);
        for (Index x = 0; x < allowed.numel(); ++x) {
            const bool in_mask = !allowed[x] && rng.below(2) == 0;
            split_mask[x] = !in_mask;
            split_bias[x] = allowed[x] ? 0.0
                            : in_mask  ? (rng.below(2) == 0 ? std::nan("") : 0.0)
                                       : -std::numeric_limits<double>::infinity();
        }
        split.allowed_mask = std::move(split_mask);
        split.mask_kind = "split";
        split.bias = std::move(split_bias);
        split.bias_kind = "split";
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> expected = run_impl<T>(impl, c);
            if (Verdict v = bitwise_equal(c, expected, run_impl<T>(impl, biased), "the mask vs its -inf bias")) return v;
            return bitwise_equal(c, expected, run_impl<T>(impl, split), "the mask vs its split into a mask and a -inf bias");
        });
    };
    return p;
}

}  // namespace attn::suite
