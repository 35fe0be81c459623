// The causal rule together with a window of the same alignment is that window with its right side 0.
#include "../checks.hpp"

namespace attn::suite {

Property causal_window_is_the_window_with_right_zero() {
    Property p;
    p.name = "causal_window_is_the_window_with_right_zero";
    p.sentence = "is_causal with a sliding window (left, right) of the same alignment gives bitwise the output of the "
                 "window (left, 0) alone.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::Window, .very_long_keys = true, .bias = true}); };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        SdpaCase causal = c, cut = c;
        causal.options.is_causal = true;
        causal.options.alignment = c.options.window->alignment;
        cut.options.is_causal = false;
        cut.options.window->right = 0;
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            return bitwise_equal(c, run_impl<T>(impl, causal), run_impl<T>(impl, cut),
                                 "causal with " + to_string(*c.options.window) + " vs " + to_string(*cut.options.window));
        });
    };
    return p;
}

}  // namespace attn::suite
