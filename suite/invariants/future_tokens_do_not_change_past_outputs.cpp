// Invariant 6: under a causal mask, changing future tokens (their keys, values and queries) leaves the outputs of
// earlier positions bitwise unchanged.
#include "../checks.hpp"

namespace attn::suite {

Property future_tokens_do_not_change_past_outputs() {
    Property p;
    p.name = "future_tokens_do_not_change_past_outputs";
    p.sentence = "Under a causal mask, perturbing future keys, values and queries leaves the outputs of earlier "
                 "positions bitwise unchanged.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::Causal, .bias = true}); };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        // Cut t: keys after t change; query rows that may read a key after t (in some head) change too.
        Rng rng(c.aux_seed);
        const Index t = static_cast<Index>(rng.below(static_cast<std::uint64_t>(c.Tk)));
        const Tensor<bool> allowed = expanded_allowed(c);
        std::vector<char> past(static_cast<std::size_t>(c.Tq), 1);
        for (Index bh = 0; bh < c.B * c.H; ++bh)
            for (Index i = 0; i < c.Tq; ++i)
                for (Index j = t + 1; j < c.Tk; ++j)
                    if (allowed[(bh * c.Tq + i) * c.Tk + j]) past[static_cast<std::size_t>(i)] = 0;
        SdpaCase changed = c;
        const double magnitude = std::pow(10.0, rng.uniform(-3, 3));
        const auto perturb = [&](double) { return gen::round_to(c.dtype, magnitude * rng.normal()); };
        for (Index r = 0; r < c.B * c.kv_heads; ++r)
            for (Index j = t + 1; j < c.Tk; ++j) {
                for (Index x = 0; x < c.Dk; ++x) changed.k[(r * c.Tk + j) * c.Dk + x] = perturb(0);
                for (Index x = 0; x < c.Dv; ++x) changed.v[(r * c.Tk + j) * c.Dv + x] = perturb(0);
            }
        for (Index bh = 0; bh < c.B * c.H; ++bh)
            for (Index i = 0; i < c.Tq; ++i)
                if (!past[static_cast<std::size_t>(i)])
                    for (Index x = 0; x < c.Dk; ++x) changed.q[(bh * c.Tq + i) * c.Dk + x] = perturb(0);
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> before = run_impl<T>(impl, c), after = run_impl<T>(impl, changed);  // (B, H, Tq, Dv)
            for (Index x = 0; x < before.numel(); ++x) {
                const Index i = (x / c.Dv) % c.Tq;
                if (past[static_cast<std::size_t>(i)] && !same_bits(before[x], after[x]))
                    return "past output" + index_string(c, x, c.Dv) + " changed from " + num(before[x]) + " to " +
                           num(after[x]) + " when tokens after key " + std::to_string(t) + " changed";
            }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
