// Invariant: the batch dims of q, k and v are only a layout: the case's (B, H, T, D) tensors flattened to
// (B * H, T, D) (rank 3), or, when B = H = 1, given as plain (T, D) matrices (rank 2, unbatched), give bitwise the
// output of the 4-D call, in the output shape that matches the inputs' ((B * H, Tq, Dv) or (Tq, Dv)), and the same
// weights where the case returns them. The mask and the bias go along, expanded to (B, H, Tq, Tk) and flattened
// the same way. The generators build 4-D (or grouped 5-D) cases only, so without this property the shape handling
// of the lower ranks (the output's shape, the batch of a rank-2 call) would be unchecked.
//
// Skipped: grouped-query cases (their layout is 5-D by construction) and ALiBi (its slopes name the heads, which a
// flattened batch no longer has).
#include "../checks.hpp"

namespace attn::suite {

namespace {

// `t` (broadcastable to (B, H, R, C)) expanded to that shape, copied contiguous and viewed as `flat`.
template <class T>
Tensor<T> flattened(TensorView<const T> t, const Shape& full, const Shape& flat) {
    return Tensor<T>::copy_of(t.broadcast_to(full, "batch_dims_are_only_a_layout", "a case tensor")).reshaped(flat);
}

}  // namespace

Property batch_dims_are_only_a_layout() {
    Property p;
    p.name = "batch_dims_are_only_a_layout";
    p.sentence = "q, k and v with their batch dims flattened to one (rank 3), or dropped when B = H = 1 (rank 2), "
                 "give bitwise the output (and weights) of the 4-D call, in the matching shape.";
    // Small shapes: the shape handling is what is checked, and the case runs twice.
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.grouped_kv = false, .small = true, .bias = true}); };
    // The library's calls: a test kernel or a user's kernel may take 4-D inputs only.
    p.applies = is_library_path;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        if (c.kv_heads != c.H || c.alibi_slopes) return std::nullopt;  // (grouped cases are not generated)
        Rng rng(c.aux_seed);
        const bool unbatched = c.B * c.H == 1 && rng.below(2) == 0;
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            const CaseInputs<T> in = make_inputs<T>(c);
            const auto lead = [&](Shape tail) {
                if (!unbatched) tail.insert(tail.begin(), c.B * c.H);
                return tail;
            };
            const Tensor<T> q = flattened(in.q_view, {c.B, c.H, c.Tq, c.Dk}, lead({c.Tq, c.Dk}));
            const Tensor<T> k = flattened(in.k_view, {c.B, c.H, c.Tk, c.Dk}, lead({c.Tk, c.Dk}));
            const Tensor<T> v = flattened(in.v_view, {c.B, c.H, c.Tk, c.Dv}, lead({c.Tk, c.Dv}));
            const Shape scores = {c.B, c.H, c.Tq, c.Tk};
            std::optional<Tensor<bool>> mask;
            std::optional<Tensor<T>> bias;
            if (in.allowed_view) mask = flattened(*in.allowed_view, scores, lead({c.Tq, c.Tk}));
            if (in.bias_view) bias = flattened(*in.bias_view, scores, lead({c.Tq, c.Tk}));
            SdpaOptions options = c.options;
            if (bias) options.bias = TensorView<const T>(bias->view());
            std::optional<TensorView<const bool>> mask_view;
            if (mask) mask_view = mask->view();
            const std::string what = unbatched ? "q, k, v as (T, D) matrices" : "q, k, v as (B * H, T, D)";
            std::optional<SdpaResult<T>> flat, full;
            const std::string flat_error = thrown_message([&] { flat = impl.run<T>(q.view(), k.view(), v.view(), mask_view, options); });
            const std::string full_error = thrown_message([&] {
                full = impl.run<T>(in.q_view, in.k_view, in.v_view, in.allowed_view, in.with_bias(c.options));
            });
            if (!full_error.empty() || !flat_error.empty()) {
                // Both refused (an empty row under Throw, a NaN under check_finite): the messages name different
                // shapes, so only the refusal itself is compared.
                if (full_error.empty() != flat_error.empty())
                    return what + ": " + (flat_error.empty() ? "accepted" : "refused (" + flat_error + ")") +
                           ", but the 4-D call " + (full_error.empty() ? "was accepted" : "refused: " + full_error);
                return std::nullopt;
            }
            if (flat->output.shape() != lead({c.Tq, c.Dv}))
                return what + ": the output has shape " + to_string(flat->output.shape()) + ", not " +
                       to_string(lead({c.Tq, c.Dv}));
            if (Verdict v = bitwise_equal(c, Tensor<T>(flat->output).reshaped({c.B, c.H, c.Tq, c.Dv}), full->output,
                                          what + " vs 4-D"))
                return v;
            if (flat->weights.has_value() != full->weights.has_value())
                return what + ": weights returned by one call and not the other";
            if (flat->weights) {
                if (flat->weights->shape() != lead({c.Tq, c.Tk}))
                    return what + ": the weights have shape " + to_string(flat->weights->shape()) + ", not " +
                           to_string(lead({c.Tq, c.Tk}));
                return bitwise_equal(c, Tensor<T>(*flat->weights).reshaped({c.B, c.H, c.Tq, c.Tk}), *full->weights,
                                     what + " vs 4-D, the weights");
            }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
