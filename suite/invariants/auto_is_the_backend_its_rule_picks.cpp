// Backend::Auto is a documented rule, not a third backend (attn/sdpa.hpp, attn/backward.hpp): `tiled` from
// Tq * Tk = 128 * 128 scores per batch element on, `reference` below, and `reference` whenever the weights are asked
// for. So a call with Auto gives bitwise what the call naming the picked backend gives, forward and backward. The
// case's sizes are moved to either side of the threshold (Tq * Tk = 16384, or Tq fewer), where a rule off by one
// row or column would pick the other backend (whose bits differ in general: another summation order).
#include "../checks.hpp"

namespace attn::suite {

Property auto_is_the_backend_its_rule_picks() {
    Property p;
    p.name = "auto_is_the_backend_its_rule_picks";
    p.sentence = "Backend::Auto gives bitwise the output (and gradients) of the backend its rule picks: tiled from "
                 "Tq * Tk = 128 * 128 on, reference below it and whenever the weights are asked for.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::None, .small = true}); };
    p.applies = [](const Implementation& impl) { return impl.name == "reference"; };
    p.check = [](const Implementation&, const SdpaCase& drawn) -> Verdict {
        Rng rng(drawn.aux_seed);
        // One batch element and head, Tq a power of two up to 128, Tk = 16384 / Tq or one less: the threshold or
        // just below it.
        SdpaCase c = drawn;
        c.B = c.H = c.kv_heads = 1;
        c.Tq = Index(1) << rng.below(8);
        c.Tk = 16384 / c.Tq - static_cast<Index>(rng.below(2));
        c.q = Tensor<double>({1, 1, c.Tq, c.Dk});
        c.k = Tensor<double>({1, 1, c.Tk, c.Dk});
        c.v = Tensor<double>({1, 1, c.Tk, c.Dv});
        for (Tensor<double>* t : {&c.q, &c.k, &c.v})
            for (Index f = 0; f < t->numel(); ++f) (*t)[f] = rng.normal();
        c.allowed_mask.reset(), c.mask_kind = "none", c.mask_stride0 = false;
        c.bias.reset(), c.bias_kind = "none", c.alibi_slopes.reset(), c.alibi_kind = "none";
        c.seed.reset();
        const bool weights = rng.below(4) == 0;
        const Backend picked = !weights && c.Tq * c.Tk >= 128 * 128 ? Backend::Tiled : Backend::Reference;
        const std::string what = std::string("Tq * Tk = ") + std::to_string(c.Tq * c.Tk) + (weights ? ", weights asked" : "") +
                                 ": auto vs " + to_string(picked);
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const CaseInputs<T> in = make_inputs<T>(c);
            SdpaOptions o = in.with_bias(c.options);
            o.return_weights = weights;
            o.return_lse = false;
            const auto run = [&](Backend b) {
                SdpaOptions ob = o;
                ob.backend = b;
                return scaled_dot_product_attention(in.q_view, in.k_view, in.v_view, in.allowed_view, ob);
            };
            std::optional<SdpaResult<T>> automatic, named;
            const std::string auto_error = thrown_message([&] { automatic = run(Backend::Auto); });
            const std::string named_error = thrown_message([&] { named = run(picked); });
            if (auto_error != named_error)
                return what + ": auto " + (auto_error.empty() ? "accepted the case" : "refused it: " + auto_error) +
                       ", " + to_string(picked) + " " + (named_error.empty() ? "accepted it" : "refused it: " + named_error);
            if (!automatic) return std::nullopt;
            if (Verdict v = bitwise_equal(c, automatic->output, named->output, what)) return v;
            if (weights != automatic->weights.has_value()) return what + ": the weights are " + (weights ? "missing" : "returned unasked");
            if (weights) return std::nullopt;
            // The backward's Auto, on the output and lse of the forward it pairs with.
            SdpaOptions forward = o;
            forward.backend = picked;
            forward.return_lse = true;
            const SdpaResult<T> f = scaled_dot_product_attention(in.q_view, in.k_view, in.v_view, in.allowed_view, forward);
            const Tensor<T> dout = normal_tensor<T>(f.output.shape(), rng);
            const auto backward = [&](Backend b) {
                SdpaOptions ob = o;
                ob.backend = b;
                return sdpa_backward(in.q_view, in.k_view, in.v_view, f.output.view(), f.lse->view(), dout.view(),
                                     in.allowed_view, ob);
            };
            const SdpaGradients<T> ga = backward(Backend::Auto), gp = backward(picked);
            if (Verdict v = bitwise_equal(c, ga.dq, gp.dq, what + ", dq")) return v;
            if (Verdict v = bitwise_equal(c, ga.dk, gp.dk, what + ", dk")) return v;
            return bitwise_equal(c, ga.dv, gp.dv, what + ", dv");
        });
    };
    return p;
}

}  // namespace attn::suite
