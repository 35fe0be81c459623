// Invariant: the MHA head path's backward (multi_head_sdpa_backward) gives the gradients of the forward it ran, within
// the oracle's bound: in training mode with dropout, those of the dropped-out forward (the oracle's weight multipliers,
// oracle/BOUNDS.md section 12c: each weight times 0 or 1/(1-p) by the documented mask of MhaConfig::dropout_seed,
// written out here), in evaluation mode those of plain attention on the split heads (reference or tiled backward).
// A backward that does not drop the weights the forward dropped fails here, as does any head split or merge of the
// gradients that puts a head's rows in another's columns. The case gives the sizes, the heads, the mask (causal rule
// and window folded in) and the cap; the projected inputs and dout are drawn here from its aux seed.
#include "../checks.hpp"
#include "attn/oracle/backward.hpp"

namespace attn::suite {

namespace {

// x (B, T, groups*per*D) as (B, groups, per, T, D), head h = g*per + r; `shared`: x has `groups` heads, read as
// (B, groups, 1, T, D) by the `per` query heads of each group.
template <class T>
TensorView<const T> split(const Tensor<T>& x, Index groups, Index per, Index D, bool shared) {
    const Index B = x.dim(0), Tn = x.dim(1), W = x.dim(2), r = shared ? 1 : per;
    return TensorView<const T>(x.data(), {B, groups, r, Tn, D}, {Tn * W, r * D, D, W, 1});
}

template <class T>
Verdict dropout_gradient_check(const Implementation& impl, const SdpaCase& c) {
    Rng rng(c.aux_seed);
    const double probabilities[] = {0.1, 0.5, 0.9};
    const MhaDropout dropout{probabilities[rng.below(3)], rng.next()};
    const std::uint64_t step = rng.below(1000);
    const bool training = rng.below(4) != 0;
    const Index H = c.H, G = c.kv_heads, R = H / G, Dk = c.Dk, Dv = c.Dv, Tq = c.Tq, Tk = c.Tk, B = c.B;
    MhaOptions options;
    options.training = training;
    options.dropout_step = step;
    options.softcap = c.options.softcap;
    options.num_threads = c.options.num_threads;
    options.empty_rows = c.has_empty_rows() ? (rng.below(2) ? EmptyRowPolicy::Zero : EmptyRowPolicy::Nan)
                                                     : c.options.empty_rows;
    // Training mode always runs the reference backward; evaluation mode either.
    const bool tiled = !training && rng.below(2) != 0;
    options.backend = tiled ? Backend::Tiled : Backend::Reference;
    const std::string what = std::string(training ? "training" : "evaluation") + " mode, dropout p=" +
                             num(dropout.p) + ", seed " + std::to_string(dropout.seed) + ", step " +
                             std::to_string(step) + (tiled ? ", tiled" : ", reference");
    const Tensor<bool> allowed = expanded_allowed(c);  // (B, H, Tq, Tk): mask, causal rule, window
    const Tensor<T> qp = normal_tensor<T>({B, Tq, H * Dk}, rng), kp = normal_tensor<T>({B, Tk, G * Dk}, rng),
                    vp = normal_tensor<T>({B, Tk, G * Dv}, rng), dout = normal_tensor<T>({B, Tq, H * Dv}, rng);
    const MhaGradients<T> got =
        impl.head_backward<T>(qp.view(), kp.view(), vp.view(), dout.view(), H, G, allowed.view(), options, dropout);

    // The oracle on the split heads: q (B, G, R, Tq, Dk), k and v (B, G, 1, Tk, D), mask and multipliers
    // (B, G, R, Tq, Tk) (contiguous (B, H, Tq, Tk)).
    SdpaOptions sdpa;
    sdpa.softcap = options.softcap;
    sdpa.empty_rows = options.empty_rows;
    const TensorView<const bool> mask5(allowed.data(), {B, G, R, Tq, Tk},
                                       {H * Tq * Tk, R * Tq * Tk, Tq * Tk, Tk, 1});
    std::optional<Tensor<double>> mult;
    if (training) {
        const double keep = static_cast<double>(static_cast<compute_t<T>>(1.0 / (1.0 - dropout.p)));
        mult = Tensor<double>({B, G, R, Tq, Tk});
        for (Index f = 0; f < mult->numel(); ++f)
            (*mult)[f] = documented_dropout_keep(dropout, step, f) ? keep : 0.0;
    }
    std::optional<TensorView<const double>> mult_view;
    if (mult) mult_view = mult->view();
    oracle::OracleOptions oo;
    oo.model = tiled ? oracle::library_tiled_model() : oracle::reference_model();
    const oracle::Gradients<T> exact =
        oracle::sdpa_backward<T>(split(qp, G, R, Dk, false), split(kp, G, R, Dk, true), split(vp, G, R, Dv, true),
                                 split(dout, G, R, Dv, false), mask5, sdpa, oo, mult_view);
    // The candidate's gradients in the oracle's layouts.
    const Tensor<T> dq = Tensor<T>::copy_of(split(got.dq_projected, G, R, Dk, false));
    const Tensor<T> dk = Tensor<T>::copy_of(split(got.dk_projected, G, 1, Dk, false));
    const Tensor<T> dv = Tensor<T>::copy_of(split(got.dv_projected, G, 1, Dv, false));
    for (const auto which : {oracle::Gradient::Dq, oracle::Gradient::Dk, oracle::Gradient::Dv}) {
        const Tensor<T>& g = which == oracle::Gradient::Dq ? dq : which == oracle::Gradient::Dk ? dk : dv;
        const oracle::Comparison cmp = oracle::compare_gradient<T>(g.view(), exact, which);
        if (!cmp.pass()) return what + ": " + oracle::gradient_name(which) + ": " + cmp.summary();
    }
    return std::nullopt;
}

}  // namespace

Property dropout_gradients_match_oracle_within_bound() {
    Property p;
    p.name = "dropout_gradients_match_oracle_within_bound";
    p.sentence = "The MHA head path's backward gives the gradients of the forward it ran within the oracle's bound: in "
                 "training mode those of the dropped-out weights (the same documented mask, each weight times 0 or "
                 "1/(1-p)), in evaluation mode those of plain attention on the split heads.";
    p.generator = [](Dtype d) {
        return rc::gen::weightedOneOf<SdpaCase>({{3, gen::sdpa_case(d, {.small = true})},
                                                 {1, gen::sdpa_case(d, {.masks = gen::Masks::EmptyRows, .small = true})}});
    };
    p.applies = [](const Implementation& impl) { return impl.has_head_backward(); };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        return with_dtype(c.dtype, [&]<class T>() -> Verdict { return dropout_gradient_check<T>(impl, c); });
    };
    return p;
}

}  // namespace attn::suite
