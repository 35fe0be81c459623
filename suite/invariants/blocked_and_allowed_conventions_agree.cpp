// Invariant 13: the blocked and allowed conventions agree through the adapters, and a top-left causal mask never
// hides the diagonal.
#include "../checks.hpp"
#include "attn/mask.hpp"
#include "attn/mha.hpp"

namespace attn::suite {

Property blocked_and_allowed_conventions_agree() {
    Property p;
    p.name = "blocked_and_allowed_conventions_agree";
    p.sentence = "A blocked mask converted by blocked_to_allowed gives bitwise the output of the allowed mask it came "
                 "from, and a top-left causal mask never hides the diagonal.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::Explicit}); };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        const Tensor<bool>& allowed = *c.allowed_mask;
        const Tensor<bool> blocked = allowed_to_blocked(allowed.view());
        const Tensor<bool> back = blocked_to_allowed(blocked.view());
        for (Index x = 0; x < allowed.numel(); ++x)
            if (blocked[x] == allowed[x] || back[x] != allowed[x])
                return "adapters: allowed " + std::to_string(allowed[x]) + " -> blocked " + std::to_string(blocked[x]) +
                       " -> allowed " + std::to_string(back[x]) + " at flat index " + std::to_string(x);
        SdpaCase through = c;
        through.allowed_mask = back;
        // The causal rule as an explicit allowed mask with all logits equal (q = 0): the weights are uniform over
        // the visible keys, so the diagonal weight 1/(i+1) is positive iff the diagonal is visible.
        const SdpaCase diagonal = with_identity_values([&] {
            SdpaCase d = c;
            d.Tk = c.Tq;
            d.k = Tensor<double>({c.B, c.kv_heads, c.Tq, c.Dk}, 0.5);
            d.v = Tensor<double>({c.B, c.kv_heads, c.Tq, c.Dv}, 0.0);
            d.q = Tensor<double>({c.B, c.H, c.Tq, c.Dk}, 0.0);
            drop_positional_options(d);
            d.allowed_mask = causal_allowed_mask(c.Tq, c.Tq, CausalAlignment::TopLeft);
            d.mask_stride0 = false;
            d.mask_kind = "causal-tl";
            return d;
        }());
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            if (Verdict v = bitwise_equal(c, run_impl<T>(impl, c), run_impl<T>(impl, through),
                                          "allowed mask vs blocked_to_allowed(allowed_to_blocked(mask))"))
                return v;
            const Tensor<T> w = run_impl<T>(impl, diagonal);  // (B, H, T, T) weights
            for (Index bh = 0; bh < c.B * c.H; ++bh)
                for (Index i = 0; i < c.Tq; ++i)
                    if (!(w[(bh * c.Tq + i) * c.Tq + i] > 0))
                        return "top-left causal mask hides the diagonal: weight" +
                               index_string(diagonal, (bh * c.Tq + i) * c.Tq + i, c.Tq) + " is " +
                               num(w[(bh * c.Tq + i) * c.Tq + i]);
            if constexpr (!is_half_v<T>) if (impl.name == "mha") {  // the module has no 16-bit path
                // The module: forward_blocked with the blocked mask equals forward with the allowed mask.
                MhaConfig config;
                config.embed_dim = c.H * c.Dk;
                config.num_heads = c.H;
                config.init_seed = c.aux_seed;
                const MultiHeadAttention<T> m(config);
                Tensor<T> xq({c.B, c.Tq, c.H * c.Dk}), xk({c.B, c.Tk, c.H * c.Dk});
                const Tensor<T> q = cast_tensor<T>(c.q);
                for (Index x = 0; x < xq.numel(); ++x) xq[x] = q[x % q.numel()];
                const Tensor<T> k = cast_tensor<T>(c.k);
                for (Index x = 0; x < xk.numel(); ++x) xk[x] = k[x % k.numel()];
                // The module reads a 3-D mask as (B, Tq, Tk): give it the expanded (B, H, Tq, Tk) masks.
                const Tensor<bool> full_allowed = expanded_allowed(c);
                const Tensor<bool> full_blocked = allowed_to_blocked(full_allowed.view());
                const MhaResult<T> a = m.forward(xq.view(), xk.view(), xk.view(), full_allowed.view());
                const MhaResult<T> b = m.forward_blocked(xq.view(), xk.view(), xk.view(), full_blocked.view(), std::nullopt);
                for (Index e = 0; e < a.output.numel(); ++e)
                    if (!same_bits(a.output[e], b.output[e]))
                        return "MultiHeadAttention forward(allowed) vs forward_blocked(blocked) differ at flat index " +
                               std::to_string(e) + ": " + num(a.output[e]) + " vs " + num(b.output[e]);
            }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
