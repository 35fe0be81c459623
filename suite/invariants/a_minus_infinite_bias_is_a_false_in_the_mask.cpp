// A bias of -inf (SdpaOptions::bias) blocks its key exactly as a false in the allowed mask: the case's mask, causal
// rule and window written out as a bias of 0 (allowed) and -inf (blocked) give bitwise the output of the mask.
#include <limits>

#include "../checks.hpp"

namespace attn::suite {

Property a_minus_infinite_bias_is_a_false_in_the_mask() {
    Property p;
    p.name = "a_minus_infinite_bias_is_a_false_in_the_mask";
    p.sentence = "The case's blocked (query, key) pairs written as a bias of -inf, and its allowed ones as 0, give "
                 "bitwise the output of the mask, causal rule and window they replace.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::Blocking, .very_long_keys = true}); };
    p.needs_bias = true;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        const Tensor<bool> allowed = expanded_allowed(c);  // (B, H, Tq, Tk): the causal rule and window folded in
        SdpaCase biased = c;
        biased.allowed_mask.reset();
        biased.mask_stride0 = false;
        biased.mask_kind = "none";
        drop_positional_options(biased);
        Tensor<double> bias(allowed.shape());
        for (Index x = 0; x < bias.numel(); ++x) bias[x] = allowed[x] ? 0.0 : -std::numeric_limits<double>::infinity();
        biased.bias = std::move(bias);
        biased.bias_kind = "mask";
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            return bitwise_equal(c, run_impl<T>(impl, c), run_impl<T>(impl, biased), "the mask vs its -inf bias");
        });
    };
    return p;
}

}  // namespace attn::suite
