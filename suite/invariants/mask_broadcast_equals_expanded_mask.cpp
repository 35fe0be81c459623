// Invariant 9: a broadcast mask (rank 2 or 3, size-1 dims, stride-0 view) gives bitwise the result of its
// expanded contiguous copy; so do a broadcast bias and broadcast ALiBi slopes.
#include "../checks.hpp"

namespace attn::suite {

Property mask_broadcast_equals_expanded_mask() {
    Property p;
    p.name = "mask_broadcast_equals_expanded_mask";
    p.sentence = "A broadcast mask (rank 2 or 3, size-1 dims, or a stride-0 view), bias or ALiBi slopes gives bitwise "
                 "the same output as its expanded contiguous copy.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::Broadcast, .bias = true}); };
    p.required = {Regime::MaskRank2, Regime::MaskRank3, Regime::MaskRank4, Regime::MaskStride0};
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        SdpaCase expanded = c;
        drop_positional_options(expanded);
        expanded.allowed_mask = expanded_allowed(c);  // (B, H, Tq, Tk), contiguous
        expanded.mask_stride0 = false;
        if (c.bias) expanded.bias = expanded_bias(c);  // (B, H, Tq, Tk), contiguous
        if (c.alibi_slopes)  // (H) -> (B, H), contiguous
            expanded.alibi_slopes =
                Tensor<double>::copy_of(c.alibi_slopes->view().broadcast_to({c.B, c.H}, "suite", "alibi_slopes"));
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            return bitwise_equal(c, run_impl<T>(impl, c), run_impl<T>(impl, expanded), "broadcast vs expanded mask");
        });
    };
    return p;
}

}  // namespace attn::suite
