// Invariant 2: blocked (query, key) pairs get exactly zero weight, for causal, padding, combined and random masks.
#include "../checks.hpp"

namespace attn::suite {

Property masked_keys_get_zero_weight() {
    Property p;
    p.name = "masked_keys_get_zero_weight";
    p.sentence = "Every blocked (query, key) pair gets exactly zero weight, for causal, padding, combined and random masks.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::Blocking, .bias = true}); };
    p.required = {Regime::MaskedLogit, Regime::SingleAllowedKey, Regime::MaskRank2, Regime::MaskRank4};
    p.check = [](const Implementation& impl, const SdpaCase& original) -> Verdict {
        const SdpaCase c = with_identity_values(original);  // output row = weights row
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> w = run_impl<T>(impl, c);  // (B, H, Tq, Tk)
            const Tensor<bool> allowed = expanded_allowed(c);
            for (Index x = 0; x < w.numel(); ++x)
                if (!allowed[x] && w[x] != 0)
                    return "blocked weight" + index_string(c, x, c.Tk) + " is " + num(w[x]) + ", not 0";
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
