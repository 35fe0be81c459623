// Invariant 10: cross-attention with Tq != Tk matches the oracle; self-attention equals cross-attention with
// memory = x (q, k and v one buffer vs three copies, and the module's forward_self vs forward_cross).
#include "../checks.hpp"
#include "attn/mha.hpp"

namespace attn::suite {

namespace {

// Self-attention: q, k and v are one tensor x (B, H, Tq, Dk), passed once as the same view three times and once
// as three separate copies; bitwise the same.
template <class T>
Verdict self_equals_cross(const Implementation& impl, const SdpaCase& c) {
    const Tensor<T> x = cast_tensor<T>(c.q);  // (B, H, Tq, Dk)
    const Tensor<T> k = x, v = x;
    SdpaOptions options = c.options;
    options.is_causal = false;
    const SdpaResult<T> aliased = impl.run<T>(x.view(), x.view(), x.view(), std::nullopt, options);
    const SdpaResult<T> copies = impl.run<T>(x.view(), k.view(), v.view(), std::nullopt, options);
    SdpaCase shape = c;
    shape.Dv = c.Dk;
    if (Verdict v = bitwise_equal(shape, aliased.output, copies.output, "q = k = v one buffer vs three copies")) return v;
    if (impl.name != "mha") return std::nullopt;
    if constexpr (is_half_v<T>) {
        return std::nullopt;  // the module has no 16-bit path (the runner skips mha there)
    } else {
    // The module: forward_self(x) and forward_cross(x, memory = x) are the same computation.
    MhaConfig config;
    config.embed_dim = c.H * c.Dk;
    config.num_heads = c.H;
    config.init_seed = c.aux_seed;
    const MultiHeadAttention<T> m(config);
    Tensor<T> xs({c.B, c.Tq, c.H * c.Dk});  // (B, T, E): the case's q heads side by side
    for (Index b = 0; b < c.B; ++b)
        for (Index h = 0; h < c.H; ++h)
            for (Index i = 0; i < c.Tq; ++i)
                for (Index d = 0; d < c.Dk; ++d) xs[(b * c.Tq + i) * c.H * c.Dk + h * c.Dk + d] = x[((b * c.H + h) * c.Tq + i) * c.Dk + d];
    const MhaResult<T> self = m.forward_self(xs.view());
    const MhaResult<T> cross = m.forward_cross(xs.view(), xs.view());
    for (Index e = 0; e < self.output.numel(); ++e)
        if (!same_bits(self.output[e], cross.output[e]))
            return "MultiHeadAttention forward_self vs forward_cross(x, x) differ at flat index " + std::to_string(e) +
                   ": " + num(self.output[e]) + " vs " + num(cross.output[e]);
    return std::nullopt;
    }
}

}  // namespace

Property cross_attention_matches_oracle() {
    Property p;
    p.name = "cross_attention_matches_oracle";
    p.sentence = "Cross-attention with Tq != Tk matches the oracle within its bound, and self-attention equals "
                 "cross-attention with memory = x, bitwise.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.cross = true, .bias = true}); };
    p.required = {Regime::MaskedLogit, Regime::SingleAllowedKey};
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            if (Verdict v = within_bound(run_impl<T>(impl, c), oracle_for<T>(impl, c), "cross-attention vs oracle"))
                return v;
            return self_equals_cross<T>(impl, c);
        });
    };
    return p;
}

}  // namespace attn::suite
