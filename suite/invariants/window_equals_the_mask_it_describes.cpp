// A sliding window (SdpaOptions::window) gives bitwise the output of the explicit allowed mask its inequalities
// describe (written out by the suite, not by the library's rule).
#include "../checks.hpp"

namespace attn::suite {

Property window_equals_the_mask_it_describes() {
    Property p;
    p.name = "window_equals_the_mask_it_describes";
    p.sentence = "A sliding window of either alignment, with or without the causal rule, gives bitwise the output of "
                 "the explicit allowed mask i + d - left <= j <= i + d + right (d = Tk - Tq bottom-right, 0 top-left) "
                 "describes.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::Window, .very_long_keys = true, .bias = true}); };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        SdpaCase explicit_mask = c;
        explicit_mask.allowed_mask = expanded_allowed(c);  // (B, H, Tq, Tk): window and causal rule folded in
        explicit_mask.mask_stride0 = false;
        drop_positional_options(explicit_mask);
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            return bitwise_equal(c, run_impl<T>(impl, c), run_impl<T>(impl, explicit_mask),
                                 to_string(*c.options.window) + " vs its explicit mask");
        });
    };
    return p;
}

}  // namespace attn::suite
