// Invariant 21: key_padding_allowed_mask(token_ids, pad_id) is the (B, 1, 1, Tk) allowed mask that is true exactly
// where the token is not pad_id (the course's padding mask), and attention under it equals attention under the same
// mask written out by hand, bitwise; and the multi-head path given the same padding as MhaOptions::key_padding_allowed
// (B, Tk) gives the bits it gives with the mask as its allowed_mask. The generators build their padding masks by hand,
// so without this property the library's own constructor would be unchecked.
#include "../checks.hpp"
#include "attn/mha.hpp"

namespace attn::suite {

Property key_padding_mask_allows_exactly_the_tokens_that_are_not_pad() {
    Property p;
    p.name = "key_padding_mask_allows_exactly_the_tokens_that_are_not_pad";
    p.sentence = "key_padding_allowed_mask gives the (B, 1, 1, Tk) mask that allows exactly the tokens that are not "
                 "the pad id, and attention under it equals attention under that mask written out by hand; token ids "
                 "of another rank are refused.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::None, .small = true}); };
    p.applies = [](const Implementation& impl) { return impl.name == "reference"; };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        Rng rng(c.aux_seed);
        // Token ids from a small vocabulary so that pads are common; the pad id is one of them, or none of them.
        const std::int64_t pad = static_cast<std::int64_t>(rng.below(4));
        Tensor<std::int64_t> ids({c.B, c.Tk});
        for (Index f = 0; f < ids.numel(); ++f) ids[f] = static_cast<std::int64_t>(rng.below(5));
        const Tensor<bool> got = key_padding_allowed_mask(ids.view(), pad);
        const std::string what = "key_padding_allowed_mask(token_ids (" + std::to_string(c.B) + ", " + std::to_string(c.Tk) +
                                 "), pad_id " + std::to_string(pad) + ")";
        if (got.shape() != Shape{c.B, 1, 1, c.Tk}) return what + ": shape " + to_string(got.shape()) + ", expected (B, 1, 1, Tk)";
        Tensor<bool> by_hand({c.B, 1, 1, c.Tk}, false);
        for (Index b = 0; b < c.B; ++b)
            for (Index j = 0; j < c.Tk; ++j) {
                by_hand[b * c.Tk + j] = ids[b * c.Tk + j] != pad;
                if (got[b * c.Tk + j] != by_hand[b * c.Tk + j])
                    return what + ": token " + std::to_string(ids[b * c.Tk + j]) + " at (" + std::to_string(b) + ", " +
                           std::to_string(j) + ") is " + (got[b * c.Tk + j] ? "allowed" : "blocked");
            }
        // Token ids of another rank than (B, Tk) are refused.
        const Tensor<std::int64_t> flat({c.B * c.Tk}, std::int64_t(0));
        if (Verdict v = refused_with([&] { (void)key_padding_allowed_mask(flat.view(), pad); },
                                     "key_padding_allowed_mask of 1-D token ids", "ShapeError", "must be (B, Tk)"))
            return v;
        // Attention under it (rows left empty by an all-pad sequence follow the zero policy).
        SdpaCase library = c, hand = c;
        library.allowed_mask = got;
        hand.allowed_mask = by_hand;
        library.options.empty_rows = hand.options.empty_rows = EmptyRowPolicy::Zero;
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            if (Verdict v = bitwise_equal(c, run_impl<T>(impl, library), run_impl<T>(impl, hand),
                                          what + " vs the same mask by hand"))
                return v;
            // The head path (projected inputs of H heads), padding as the module's option vs as its allowed mask.
            Rng draws(c.aux_seed ^ 0x9ad);
            const Tensor<T> qp = normal_tensor<T>({c.B, c.Tq, c.H * c.Dk}, draws);
            const Tensor<T> kp = normal_tensor<T>({c.B, c.Tk, c.H * c.Dk}, draws);
            const Tensor<T> vp = normal_tensor<T>({c.B, c.Tk, c.H * c.Dv}, draws);
            Tensor<bool> real({c.B, c.Tk});
            for (Index f = 0; f < real.numel(); ++f) real[f] = got[f];
            MhaOptions as_option, as_mask;
            as_option.empty_rows = as_mask.empty_rows = EmptyRowPolicy::Zero;
            as_option.key_padding_allowed = real.view();
            const MhaResult<T> a = multi_head_sdpa(qp.view(), kp.view(), vp.view(), c.H, c.H, std::nullopt, as_option);
            const MhaResult<T> b = multi_head_sdpa(qp.view(), kp.view(), vp.view(), c.H, c.H, got.view(), as_mask);
            for (Index e = 0; e < a.output.numel(); ++e)
                if (!same_bits(a.output[e], b.output[e]))
                    return what + ", multi_head_sdpa: key_padding_allowed (B, Tk) and the same mask as allowed_mask differ "
                                  "at flat index " + std::to_string(e) + ": " + num(static_cast<double>(a.output[e])) +
                           " vs " + num(static_cast<double>(b.output[e]));
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
