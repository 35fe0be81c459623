// Invariant 3: H heads at once equal H separate single-head attentions, concatenated; the module's parameter
// count does not depend on H.
#include "../checks.hpp"
#include "attn/mha.hpp"

namespace attn::suite {

namespace {

// Head h of the case as its own single-head case: q[:, h], k[:, kv(h)], v[:, kv(h)], the mask at head h.
SdpaCase head_slice(const SdpaCase& c, Index h) {
    SdpaCase s = c;
    s.H = 1;
    s.kv_heads = 1;
    const Index g = h / (c.H / c.kv_heads);
    s.q = Tensor<double>({c.B, 1, c.Tq, c.Dk});
    s.k = Tensor<double>({c.B, 1, c.Tk, c.Dk});
    s.v = Tensor<double>({c.B, 1, c.Tk, c.Dv});
    for (Index b = 0; b < c.B; ++b) {
        for (Index x = 0; x < c.Tq * c.Dk; ++x) s.q[b * c.Tq * c.Dk + x] = c.q[(b * c.H + h) * c.Tq * c.Dk + x];
        for (Index x = 0; x < c.Tk * c.Dk; ++x) s.k[b * c.Tk * c.Dk + x] = c.k[(b * c.kv_heads + g) * c.Tk * c.Dk + x];
        for (Index x = 0; x < c.Tk * c.Dv; ++x) s.v[b * c.Tk * c.Dv + x] = c.v[(b * c.kv_heads + g) * c.Tk * c.Dv + x];
    }
    if (c.allowed_mask) {
        // The explicit mask expanded to (B, H, Tq, Tk), head h kept as (B, 1, Tq, Tk); the positional options stay.
        SdpaCase no_causal = c;
        drop_positional_options(no_causal);
        const Tensor<bool> full = expanded_allowed(no_causal);
        Tensor<bool> m({c.B, 1, c.Tq, c.Tk});
        for (Index b = 0; b < c.B; ++b)
            for (Index x = 0; x < c.Tq * c.Tk; ++x) m[b * c.Tq * c.Tk + x] = full[(b * c.H + h) * c.Tq * c.Tk + x];
        s.allowed_mask = std::move(m);
        s.mask_stride0 = false;
    }
    if (c.bias) {  // head h of the bias expanded to (B, H, Tq, Tk), as (B, 1, Tq, Tk)
        const Tensor<double> full = expanded_bias(c);
        Tensor<double> bias({c.B, 1, c.Tq, c.Tk});
        for (Index b = 0; b < c.B; ++b)
            for (Index x = 0; x < c.Tq * c.Tk; ++x) bias[b * c.Tq * c.Tk + x] = full[(b * c.H + h) * c.Tq * c.Tk + x];
        s.bias = std::move(bias);
    }
    if (c.alibi_slopes)  // head h's slopes, (B, 1)
        s.alibi_slopes = Tensor<double>::copy_of(
            c.alibi_slopes->view().broadcast_to({c.B, c.H}, "suite", "alibi_slopes").slice(1, h, h + 1));
    return s;
}

}  // namespace

Property heads_split_equals_separate_attention() {
    Property p;
    p.name = "heads_split_equals_separate_attention";
    p.sentence = "Attention over H heads equals H separate single-head attentions on the head slices, concatenated, "
                 "and the module's parameter count does not change with H.";
    p.generator = [](Dtype d) {
        return rc::gen::suchThat(gen::sdpa_case(d, {.small = true, .bias = true}), [](const SdpaCase& c) { return c.H > 1; });
    };
    p.required = {Regime::GroupedKv};
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const Tensor<T> together = run_impl<T>(impl, c);  // (B, H, Tq, Dv)
            const oracle::Result<T> o = oracle_for<T>(impl, c);
            Tensor<T> separate({c.B, c.H, c.Tq, c.Dv});
            for (Index h = 0; h < c.H; ++h) {
                const Tensor<T> one = run_impl<T>(impl, head_slice(c, h));  // (B, 1, Tq, Dv)
                for (Index b = 0; b < c.B; ++b)
                    std::copy_n(one.data() + b * c.Tq * c.Dv, c.Tq * c.Dv, separate.data() + (b * c.H + h) * c.Tq * c.Dv);
            }
            // The oracle's bound of an element depends only on its own (batch, head, row): the same for the slice.
            if (Verdict v = within_two_bounds(c, together, o.output_bound, separate, o.output_bound,
                                              "H heads together vs one by one"))
                return v;
            if constexpr (!is_half_v<T>) if (impl.name == "mha") {  // the module has no 16-bit path
                // 4 E^2 + 4 E parameters for every H dividing E (the projections are split, not duplicated).
                const Index E = 12;
                for (Index H : {1, 2, 3, 4, 6, 12}) {
                    MhaConfig config;
                    config.embed_dim = E;
                    config.num_heads = H;
                    const MultiHeadAttention<T> m(config);
                    if (m.parameter_count() != 4 * E * E + 4 * E || m.head_dim() != E / H)
                        return "MultiHeadAttention(E=12, H=" + std::to_string(H) + ") has " +
                               std::to_string(m.parameter_count()) + " parameters and head_dim " +
                               std::to_string(m.head_dim()) + ", expected 4E^2+4E = 624 and E/H";
                }
            }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
