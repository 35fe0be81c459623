// Invariant: the gradients are linear in dout (the backward pass is the transpose of a linear map).
#include "../checks.hpp"
#include "attn/oracle/backward.hpp"

namespace attn::suite {

Property gradients_are_linear_in_dout() {
    Property p;
    p.name = "gradients_are_linear_in_dout";
    p.sentence = "Splitting dout into its even and its odd query rows (two douts that sum to it exactly), the gradients "
                 "for dout are the sums of the gradients for the two parts, within the three runs' oracle bounds.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.small = true, .bias = true}); };
    p.applies = [](const Implementation& impl) { return impl.has_backward(); };
    p.cost = 3;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const std::optional<BackwardRun<T>> whole = run_backward_unless_overflow<T>(impl, c, c.options);
            if (!whole) return std::nullopt;
            const BackwardRun<T>& w = *whole;
            Tensor<T> even = Tensor<T>::copy_of(w.dout.view()), odd = Tensor<T>::copy_of(w.dout.view());
            for (Index x = 0; x < w.dout.numel(); ++x) ((x / c.Dv) % c.Tq % 2 == 0 ? odd : even)[x] = T(0);
            oracle::OracleOptions oo;
            oo.model = impl.error_model;
            struct Part {
                SdpaGradients<T> g;
                oracle::Gradients<T> e;
            };
            const auto part = [&](const Tensor<T>& dout) -> std::optional<Part> {
                std::optional<BackwardRun<T>> r = run_backward_unless_overflow<T>(impl, c, c.options, &dout);
                if (!r) return std::nullopt;
                oracle::Gradients<T> e = oracle::sdpa_backward<T>(w.in.q_view, w.in.k_view, w.in.v_view, dout.view(),
                                                                  w.in.allowed_view, w.options, oo);
                return Part{std::move(r->grads), std::move(e)};
            };
            const std::optional<Part> all = part(w.dout), a = part(even), b = part(odd);
            if (!all || !a || !b) return std::nullopt;
            const auto compare = [&](const Tensor<T>& g, const Tensor<double>& gb, const Tensor<T>& ga,
                                     const Tensor<double>& ab, const Tensor<T>& gc, const Tensor<double>& cb,
                                     const char* name) -> Verdict {
                for (Index x = 0; x < g.numel(); ++x) {
                    const long double whole_x = static_cast<double>(g[x]);
                    const long double sum = static_cast<long double>(static_cast<double>(ga[x])) + static_cast<double>(gc[x]);
                    if (std::isnan(static_cast<double>(whole_x)) && std::isnan(static_cast<double>(sum))) continue;
                    const long double bound = static_cast<long double>(gb[x]) + ab[x] + cb[x];
                    if (!(std::fabs(whole_x - sum) <= bound * (1 + 1e-12L)))
                        return std::string(name) + " element " + std::to_string(x) + ": " + num(static_cast<double>(whole_x)) +
                               " for dout, " + num(static_cast<double>(sum)) + " as the sum for its even and odd rows, apart by more "
                               "than the three bounds' sum " + num(static_cast<double>(bound));
                }
                return std::nullopt;
            };
            if (Verdict v = compare(all->g.dq, all->e.dq_bound, a->g.dq, a->e.dq_bound, b->g.dq, b->e.dq_bound, "dq")) return v;
            if (Verdict v = compare(all->g.dk, all->e.dk_bound, a->g.dk, a->e.dk_bound, b->g.dk, b->e.dk_bound, "dk")) return v;
            return compare(all->g.dv, all->e.dv_bound, a->g.dv, a->e.dv_bound, b->g.dv, b->e.dv_bound, "dv");
        });
    };
    return p;
}

}  // namespace attn::suite
