// Invariant: the gradients of grouped K/V heads are the sums over their query heads of the gradients of the same
// attention with each K/V head repeated (multi-head attention).
#include "../checks.hpp"
#include "attn/oracle/backward.hpp"

namespace attn::suite {

Property gqa_gradients_are_the_group_sums() {
    Property p;
    p.name = "gqa_gradients_are_the_group_sums";
    p.sentence = "With G shared K/V heads, dk and dv of each K/V head equal the sums over its H/G query heads of dk and "
                 "dv of the same attention with every K/V head repeated, and dq is the same, within the two runs' "
                 "oracle bounds.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.small = true, .force_grouped = true, .bias = true}); };
    p.required = {Regime::GroupedKv};
    p.applies = [](const Implementation& impl) { return impl.has_backward(); };
    p.cost = 2;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        const SdpaCase repeated = with_repeated_kv_heads(c);
        const Index G = c.kv_heads, R = c.H / G;
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            // The same dout for both: the repeated case's layout (B, H, Tq, Dv) has the grouped one's memory order.
            const std::optional<BackwardRun<T>> grouped = run_backward_unless_overflow<T>(impl, c, c.options);
            const std::optional<BackwardRun<T>> full = run_backward_unless_overflow<T>(impl, repeated, c.options);
            if (!grouped || !full) return std::nullopt;
            oracle::OracleOptions oo;
            oo.model = impl.error_model;
            const auto bounds = [&](const BackwardRun<T>& r) {
                return oracle::sdpa_backward<T>(r.in.q_view, r.in.k_view, r.in.v_view, r.dout.view(), r.in.allowed_view,
                                                r.options, oo);
            };
            const oracle::Gradients<T> eg = bounds(*grouped), ef = bounds(*full);
            // |grouped - sum_h full_h| <= bound_grouped + sum_h bound_h (both within their bounds of exact values whose
            // sums agree exactly), the sum formed in long double (its rounding far below either bound).
            const auto compare = [&](const Tensor<T>& g, const Tensor<double>& gb, const Tensor<T>& f,
                                     const Tensor<double>& fb, Index width, const char* name) -> Verdict {
                for (Index b = 0; b < c.B; ++b)
                    for (Index kh = 0; kh < G; ++kh)
                        for (Index x = 0; x < c.Tk * width; ++x) {
                            const Index at = (b * G + kh) * c.Tk * width + x;
                            long double sum = 0, bound = gb[at];
                            for (Index h = kh * R; h < (kh + 1) * R; ++h) {
                                const Index from = (b * c.H + h) * c.Tk * width + x;
                                sum += static_cast<long double>(static_cast<double>(f[from]));
                                bound += fb[from];
                            }
                            const long double diff = std::fabs(static_cast<long double>(static_cast<double>(g[at])) - sum);
                            if (!(diff <= bound * (1 + 1e-12L)))
                                return std::string(name) + " of K/V head " + std::to_string(kh) + " (batch " +
                                       std::to_string(b) + ", element " + std::to_string(x) + ") is " +
                                       num(static_cast<double>(g[at])) + ", the sum over its query heads " +
                                       num(static_cast<double>(sum)) + ", apart by " + num(static_cast<double>(diff)) +
                                       " > the bounds' sum " + num(static_cast<double>(bound));
                        }
                return std::nullopt;
            };
            if (Verdict v = compare(grouped->grads.dk, eg.dk_bound, full->grads.dk, ef.dk_bound, c.Dk, "dk")) return v;
            if (Verdict v = compare(grouped->grads.dv, eg.dv_bound, full->grads.dv, ef.dv_bound, c.Dv, "dv")) return v;
            // dq: the same rows (NaN in both for a row with no allowed key under EmptyRowPolicy::Nan).
            const Tensor<T>&a = grouped->grads.dq, &f = full->grads.dq;
            for (Index x = 0; x < a.numel(); ++x) {
                const double ax = static_cast<double>(a[x]), fx = static_cast<double>(f[x]);
                if (std::isnan(ax) && std::isnan(fx)) continue;
                if (!(std::abs(ax - fx) <= eg.dq_bound[x] + ef.dq_bound[x]))
                    return "dq" + index_string(c, x, c.Dk) + " is " + num(ax) + " grouped vs " + num(fx) +
                           " repeated, more apart than the two bounds";
            }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
