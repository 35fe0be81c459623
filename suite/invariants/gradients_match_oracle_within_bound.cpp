// Invariant: the backward pass's dq, dk and dv are within the oracle's gradient bound (oracle/BOUNDS.md sections
// 12, 12b) of the exact gradients of sum(dout * output).
#include "../checks.hpp"
#include "attn/oracle/backward.hpp"

namespace attn::suite {

Property gradients_match_oracle_within_bound() {
    Property p;
    p.name = "gradients_match_oracle_within_bound";
    p.sentence = "For a random dout, the backward pass's dq, dk and dv are within the oracle's rigorous per-element "
                 "bound of the exact gradients of sum(dout * output), for the structure the implementation's model "
                 "declares; grouped K/V heads get the sum over the query heads that read them.";
    // Small shapes (the oracle's gradients cost Tq Tk (Dk + Dv) 261-bit operations), every mask kind, grouped K/V
    // heads, soft-capped logits, biases and ALiBi.
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.small = true, .bias = true}); };
    p.applies = [](const Implementation& impl) { return impl.has_backward(); };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const std::optional<BackwardRun<T>> run = run_backward_unless_overflow<T>(impl, c, c.options);
            if (!run) return std::nullopt;
            const BackwardRun<T>& r = *run;
            oracle::OracleOptions oo;
            oo.model = impl.error_model;
            const oracle::Gradients<T> exact = oracle::sdpa_backward<T>(
                r.in.q_view, r.in.k_view, r.in.v_view, r.dout.view(), r.in.allowed_view, r.options, oo);
            for (const auto which : {oracle::Gradient::Dq, oracle::Gradient::Dk, oracle::Gradient::Dv}) {
                const Tensor<T>& got = which == oracle::Gradient::Dq   ? r.grads.dq
                                       : which == oracle::Gradient::Dk ? r.grads.dk
                                                                       : r.grads.dv;
                const oracle::Comparison cmp = oracle::compare_gradient<T>(got.view(), exact, which);
                if (!cmp.pass()) return std::string(oracle::gradient_name(which)) + ": " + cmp.summary();
            }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
