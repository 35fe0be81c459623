// Invariant: dk sums to zero over the keys, the softmax's shift invariance seen from the backward pass.
#include "../checks.hpp"
#include "attn/oracle/backward.hpp"

namespace attn::suite {

Property dk_sums_to_zero_over_the_keys() {
    Property p;
    p.name = "dk_sums_to_zero_over_the_keys";
    p.sentence = "Without a soft-cap, the dk rows of each K/V head sum to zero over its keys, within the sum of their "
                 "oracle bounds: moving every key by the same vector shifts each query's logits by one constant, which "
                 "the softmax ignores (each row of dS sums to zero).";
    // The cap's derivative weighs each logit differently: the statement is about plain (biased) logits.
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.small = true, .softcap = false, .bias = true}); };
    p.applies = [](const Implementation& impl) { return impl.has_backward(); };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const std::optional<BackwardRun<T>> run = run_backward_unless_overflow<T>(impl, c, c.options);
            if (!run) return std::nullopt;
            oracle::OracleOptions oo;
            oo.model = impl.error_model;
            const oracle::Gradients<T> e = oracle::sdpa_backward<T>(run->in.q_view, run->in.k_view, run->in.v_view,
                                                                    run->dout.view(), run->in.allowed_view, run->options, oo);
            const Tensor<T>& dk = run->grads.dk;
            const Index heads = dk.numel() / (c.Tk * c.Dk);  // (batch, K/V head) pairs, whatever k's layout
            for (Index bg = 0; bg < heads; ++bg)
                for (Index d = 0; d < c.Dk; ++d) {
                    long double sum = 0, bound = 0;
                    for (Index j = 0; j < c.Tk; ++j) {
                        const Index x = (bg * c.Tk + j) * c.Dk + d;
                        sum += static_cast<double>(dk[x]);
                        bound += e.dk_bound[x];
                    }
                    if (!(std::fabs(sum) <= bound * (1 + 1e-12L)))
                        return "dk of K/V head " + std::to_string(bg) + " (flat over batch), dimension " +
                               std::to_string(d) + ", sums to " + num(static_cast<double>(sum)) +
                               " over the keys, more than its bounds' sum " + num(static_cast<double>(bound));
                }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
