// A sliding window (SdpaOptions::window) gives bitwise the output of the explicit allowed mask its inequalities
// describe (written out by the suite, not by the library's rule). The library's own constructor of that mask,
// attn::sliding_window_allowed_mask, must give it too, and refuse a negative size as causal_allowed_mask does.
#include "../checks.hpp"

namespace attn::suite {

Property window_equals_the_mask_it_describes() {
    Property p;
    p.name = "window_equals_the_mask_it_describes";
    p.sentence = "A sliding window of either alignment, with or without the causal rule, gives bitwise the output of "
                 "the explicit allowed mask i + d - left <= j <= i + d + right (d = Tk - Tq bottom-right, 0 top-left) "
                 "describes; attn::sliding_window_allowed_mask builds exactly that mask and, like "
                 "causal_allowed_mask, refuses a negative size.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::Window, .very_long_keys = true, .bias = true}); };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        SdpaCase explicit_mask = c;
        explicit_mask.allowed_mask = expanded_allowed(c);  // (B, H, Tq, Tk): window and causal rule folded in
        explicit_mask.mask_stride0 = false;
        drop_positional_options(explicit_mask);
        // The library's constructor of the (Tq, Tk) window mask against the suite's statement, element by element.
        const SlidingWindow& w = *c.options.window;
        const Tensor<bool> built = sliding_window_allowed_mask(c.Tq, c.Tk, w);
        if (built.shape() != Shape{c.Tq, c.Tk})
            return "sliding_window_allowed_mask(" + to_string(w) + ") has shape " + to_string(built.shape());
        for (Index i = 0; i < c.Tq; ++i)
            for (Index j = 0; j < c.Tk; ++j)
                if (built[i * c.Tk + j] != window_allows(w, i, j, c.Tq, c.Tk))
                    return "sliding_window_allowed_mask(" + to_string(w) + ") at query " + std::to_string(i) + ", key " +
                           std::to_string(j) + " is " + (built[i * c.Tk + j] ? "true" : "false");
        const bool negative_q = c.aux_seed % 2 == 0;  // which size is negative: drawn
        const Index Tq = negative_q ? -c.Tq : c.Tq, Tk = negative_q ? c.Tk : -c.Tk;
        if (Verdict v = refused_with([&] { (void)sliding_window_allowed_mask(Tq, Tk, w); },
                                     "sliding_window_allowed_mask of a negative size", "ShapeError", "negative size"))
            return v;
        if (Verdict v = refused_with([&] { (void)causal_allowed_mask(Tq, Tk, w.alignment); },
                                     "causal_allowed_mask of a negative size", "ShapeError", "negative size"))
            return v;
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            return bitwise_equal(c, run_impl<T>(impl, c), run_impl<T>(impl, explicit_mask),
                                 to_string(*c.options.window) + " vs its explicit mask");
        });
    };
    return p;
}

}  // namespace attn::suite
