// Backward mutants: a correct forward (the library's reference backend) with a backward pass that has one mistake
// each, the bugs kernel writers' backward passes have had (the missing D term, the scale forgotten in dq or dk, the
// causal mask not reapplied or reapplied in the other alignment, grouped K/V gradients not summed, the lse of another
// row). Each starts from one plain-loop backward: P recomputed by the softmax of the allowed logits, dP = dout v^T,
// D = rowsum(P * dP), dS = P (dP - D), dq = scale dS k, dk = scale dS^T q, dv = P^T dout, summed over the batch
// elements a broadcast input is read by. Plain logits only (no cap, no bias): a case with them is Unsupported.
#include "naive.hpp"

#include "attn/backward.hpp"

namespace attn::suite::mutant {
namespace {

enum class Mistake {
    NoDTerm,             // dS = P dP
    DFromDoutSquared,    // D = rowsum(dout * dout)
    DsIsDp,              // dS = dP (no softmax Jacobian)
    NoScaleInDq,         // dq = dS k
    NoScaleInDk,         // dk = dS^T q
    CausalNotReapplied,  // P recomputed without the causal rule
    OtherAlignment,      // P recomputed with the other causal alignment than the forward's
    GqaNotSummed,        // a shared K/V head's gradients from one query head only (the last one written)
    LseOfWrongRow,       // P_ij = exp(s_ij - lse_{i+1}), FlashAttention-2's recomputation with a row offset
    DkDvSwapped,         // dk and dv returned in each other's place (Dk = Dv)
};

template <class T>
SdpaGradients<T> backward(const std::string& name, Mistake mistake, TensorView<const T> q, TensorView<const T> k,
                          TensorView<const T> v, TensorView<const T> dout, std::optional<TensorView<const bool>> m,
                          const SdpaOptions& o) {
    if (o.softcap != 0 || o.bias || o.alibi_slopes)
        throw Unsupported(name + " recomputes plain logits (no soft-cap, no bias)");
    const SdpaProblem<T> p = make_sdpa_problem<T>(name, q, k, v, m, o);
    const std::vector<Readability> readable = check_contracts(p, o);
    SdpaOptions recompute = o;
    if (mistake == Mistake::CausalNotReapplied) recompute.is_causal = false;
    if (mistake == Mistake::OtherAlignment)
        recompute.alignment = o.alignment == CausalAlignment::TopLeft ? CausalAlignment::BottomRight : CausalAlignment::TopLeft;
    const SdpaProblem<T> r = make_sdpa_problem<T>(name, q, k, v, m, recompute);
    if (mistake == Mistake::DkDvSwapped && p.Dk != p.Dv) throw Unsupported(name + " swaps dk and dv of equal width only");
    const Index B = p.batch, Tq = p.Tq, Tk = p.Tk, Dk = p.Dk, Dv = p.Dv;
    const T scale = static_cast<T>(p.scale);
    std::vector<T> dq(static_cast<std::size_t>(B * Tq * Dk), T(0)), dk(static_cast<std::size_t>(B * Tk * Dk), T(0)),
        dv(static_cast<std::size_t>(B * Tk * Dv), T(0));
    const attn::detail::SavedRows<T> g(name, "dout", dout, p.output_shape(), p.batch_shape, p.shapes);
    const auto at = [](const T* row, Index d, Index stride) { return row[d * stride]; };
    for (Index b = 0; b < B; ++b) {
        std::vector<T> w = scores(r, b, scale);  // the logits and, for the wrong row's lse, their lse per row
        mask_scores(r, b, w);
        std::vector<T> lse(static_cast<std::size_t>(Tq), -std::numeric_limits<T>::infinity());
        for (Index i = 0; i < Tq; ++i) {
            T mx = -std::numeric_limits<T>::infinity(), sum = 0;
            for (Index j = 0; j < Tk; ++j) mx = std::max(mx, w[static_cast<std::size_t>(i * Tk + j)]);
            if (mx == -std::numeric_limits<T>::infinity()) continue;
            for (Index j = 0; j < Tk; ++j) sum += std::exp(w[static_cast<std::size_t>(i * Tk + j)] - mx);
            lse[static_cast<std::size_t>(i)] = mx + std::log(sum);
        }
        if (mistake == Mistake::LseOfWrongRow) {
            for (Index i = 0; i < Tq; ++i) {
                const T l = lse[static_cast<std::size_t>((i + 1) % Tq)];
                for (Index j = 0; j < Tk; ++j) {
                    T& x = w[static_cast<std::size_t>(i * Tk + j)];
                    x = x == -std::numeric_limits<T>::infinity() || !std::isfinite(l) ? T(0) : std::exp(x - l);
                }
            }
        } else {
            softmax_rows(w, Tq, Tk);
        }
        for (Index i = 0; i < Tq; ++i) {
            if (!readable[static_cast<std::size_t>(b)].row_nonempty[static_cast<std::size_t>(i)]) continue;
            const T* gi = g.row(b, i);
            std::vector<T> dP(static_cast<std::size_t>(Tk), T(0));
            T D = 0;
            for (Index j = 0; j < Tk; ++j) {
                const T P = w[static_cast<std::size_t>(i * Tk + j)];
                if (P == 0) continue;
                for (Index d = 0; d < Dv; ++d) dP[static_cast<std::size_t>(j)] += at(gi, d, g.col_stride) * at(p.v_row(b, j), d, p.v.stride(-1));
                D += P * dP[static_cast<std::size_t>(j)];
            }
            if (mistake == Mistake::NoDTerm) D = 0;
            if (mistake == Mistake::DFromDoutSquared) {
                D = 0;
                for (Index d = 0; d < Dv; ++d) D += at(gi, d, g.col_stride) * at(gi, d, g.col_stride);
            }
            for (Index j = 0; j < Tk; ++j) {
                const T P = w[static_cast<std::size_t>(i * Tk + j)];
                if (P == 0) continue;
                const T dS = mistake == Mistake::DsIsDp ? dP[static_cast<std::size_t>(j)] : P * (dP[static_cast<std::size_t>(j)] - D);
                const T sq = mistake == Mistake::NoScaleInDq ? T(1) : scale, sk = mistake == Mistake::NoScaleInDk ? T(1) : scale;
                for (Index d = 0; d < Dk; ++d) {
                    dq[static_cast<std::size_t>((b * Tq + i) * Dk + d)] += sq * dS * at(p.k_row(b, j), d, p.k.stride(-1));
                    dk[static_cast<std::size_t>((b * Tk + j) * Dk + d)] += sk * dS * at(p.q_row(b, i), d, p.q.stride(-1));
                }
                for (Index d = 0; d < Dv; ++d)
                    dv[static_cast<std::size_t>((b * Tk + j) * Dv + d)] += P * at(gi, d, g.col_stride);
            }
        }
        for (Index i = 0; i < Tq; ++i)
            if (!readable[static_cast<std::size_t>(b)].row_nonempty[static_cast<std::size_t>(i)] &&
                o.empty_rows == EmptyRowPolicy::Nan)
                std::fill_n(dq.begin() + (b * Tq + i) * Dk, Dk, std::numeric_limits<T>::quiet_NaN());
    }
    if (mistake == Mistake::DkDvSwapped) std::swap(dk, dv);
    const bool assign = mistake == Mistake::GqaNotSummed;
    return {into_shape(dq, q.shape(), p.batch_shape, Tq, Dk, false), into_shape(dk, k.shape(), p.batch_shape, Tk, Dk, assign),
            into_shape(dv, v.shape(), p.batch_shape, Tk, Dv, assign)};
}

Implementation backward_mutant(const std::string& name, const std::string& description, Mistake mistake) {
    Implementation impl;
    impl.name = name;
    impl.description = description;
    impl.is_mutant = true;
    impl.error_model = oracle::reference_model();
    impl.bias_unsupported = name + " recomputes plain logits (its mistake is in the backward pass)";
    const auto forward = [](auto q, auto k, auto v, std::optional<TensorView<const bool>> m, SdpaOptions o) {
        o.backend = Backend::Reference;
        return scaled_dot_product_attention(q, k, v, m, o);
    };
    impl.run_float = [forward](TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                               std::optional<TensorView<const bool>> m, const SdpaOptions& o) { return forward(q, k, v, m, o); };
    impl.run_double = [forward](TensorView<const double> q, TensorView<const double> k, TensorView<const double> v,
                                std::optional<TensorView<const bool>> m, const SdpaOptions& o) { return forward(q, k, v, m, o); };
    impl.backward_float = [name, mistake](TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                                          TensorView<const float> dout, std::optional<TensorView<const bool>> m,
                                          const SdpaOptions& o) { return backward<float>(name, mistake, q, k, v, dout, m, o); };
    impl.backward_double = [name, mistake](TensorView<const double> q, TensorView<const double> k,
                                           TensorView<const double> v, TensorView<const double> dout,
                                           std::optional<TensorView<const bool>> m,
                                           const SdpaOptions& o) { return backward<double>(name, mistake, q, k, v, dout, m, o); };
    return impl;
}

// The MHA head path's backward that does not drop again the weights its forward dropped: the library's
// multi_head_sdpa_backward run in evaluation mode whatever the call says, so dv and dP use every weight.
Implementation dropout_not_reapplied() {
    Implementation impl;
    impl.name = "backward_dropout_not_reapplied";
    impl.description = "the head path's backward ignores the dropout mask its forward applied (evaluation-mode gradients)";
    impl.is_mutant = true;
    impl.error_model = oracle::reference_model();
    const auto head_backward = [](auto q, auto k, auto v, auto dout, Index H, Index G,
                                  std::optional<TensorView<const bool>> m, MhaOptions o, const MhaDropout& d) {
        o.training = false;
        return multi_head_sdpa_backward(q, k, v, dout, H, G, m, o, d);
    };
    impl.head_backward_float = head_backward;
    impl.head_backward_double = head_backward;
    impl.head_backward_float16 = head_backward;
    impl.head_backward_bfloat16 = head_backward;
    return impl;
}

}  // namespace

std::vector<Implementation> backward_mistakes() {
    return {
        backward_mutant("backward_no_d_term", "the backward's dS = P dP: the softmax Jacobian's D term is missing",
                        Mistake::NoDTerm),
        backward_mutant("backward_d_from_dout", "the backward's D = rowsum(dout * dout) instead of rowsum(dout * out)",
                        Mistake::DFromDoutSquared),
        backward_mutant("backward_ds_is_dp", "the backward's dS = dP: no softmax Jacobian at all", Mistake::DsIsDp),
        backward_mutant("backward_dq_unscaled", "the backward forgets the scale in dq", Mistake::NoScaleInDq),
        backward_mutant("backward_dk_unscaled", "the backward forgets the scale in dk", Mistake::NoScaleInDk),
        backward_mutant("backward_causal_not_reapplied", "the backward recomputes P without the causal rule",
                        Mistake::CausalNotReapplied),
        backward_mutant("backward_other_alignment",
                        "the backward recomputes P with the other causal alignment than the forward's",
                        Mistake::OtherAlignment),
        backward_mutant("backward_gqa_not_summed",
                        "a shared K/V head's dk and dv come from one query head, not the sum over its group",
                        Mistake::GqaNotSummed),
        backward_mutant("backward_lse_of_wrong_row", "the backward recomputes P from the next row's log-sum-exp",
                        Mistake::LseOfWrongRow),
        backward_mutant("backward_dk_dv_swapped", "the backward returns dk and dv in each other's place",
                        Mistake::DkDvSwapped),
        dropout_not_reapplied(),
    };
}

}  // namespace attn::suite::mutant
