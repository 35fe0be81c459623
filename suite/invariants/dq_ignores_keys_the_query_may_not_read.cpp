// Invariant: a query's dq does not depend on the keys and values it may not read (causal: on future keys).
#include "../checks.hpp"

namespace attn::suite {

Property dq_ignores_keys_the_query_may_not_read() {
    Property p;
    p.name = "dq_ignores_keys_the_query_may_not_read";
    p.sentence = "Changing k and v at key positions from some position on leaves dq of every query that may read none "
                 "of them (by the mask, the causal rule, the window or a -inf bias) exactly as it was.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.masks = gen::Masks::Blocking, .bias = true}); };
    p.applies = [](const Implementation& impl) { return impl.has_backward(); };
    p.cost = 2;
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        Rng rng(c.aux_seed ^ 0x5bd1e995u);
        const Index cut = static_cast<Index>(rng.below(static_cast<std::uint64_t>(c.Tk)));
        SdpaCase changed = c;
        const Index G = c.kv_heads;
        for (Index bg = 0; bg < c.B * G; ++bg)
            for (Index j = cut; j < c.Tk; ++j) {
                for (Index d = 0; d < c.Dk; ++d) changed.k[(bg * c.Tk + j) * c.Dk + d] += 1.5;
                for (Index d = 0; d < c.Dv; ++d) changed.v[(bg * c.Tk + j) * c.Dv + d] -= 2.0;
            }
        const Tensor<bool> allowed = expanded_allowed(c);  // (B, H, Tq, Tk)
        return with_dtype(c.dtype, [&]<class T>() -> Verdict {
            // The changed k and v are whatever the shifted values round to in T: any change of them is the statement's.
            const std::optional<BackwardRun<T>> before = run_backward_unless_overflow<T>(impl, c, c.options);
            const std::optional<BackwardRun<T>> after = run_backward_unless_overflow<T>(impl, changed, c.options);
            if (!before || !after) return std::nullopt;
            const Tensor<T>&a = before->grads.dq, &b = after->grads.dq;
            for (Index bh = 0; bh < c.B * c.H; ++bh)
                for (Index i = 0; i < c.Tq; ++i) {
                    bool reads_changed = false;
                    for (Index j = cut; j < c.Tk && !reads_changed; ++j) reads_changed = allowed[(bh * c.Tq + i) * c.Tk + j];
                    if (reads_changed) continue;
                    for (Index d = 0; d < c.Dk; ++d) {
                        const Index x = (bh * c.Tq + i) * c.Dk + d;
                        const double ax = static_cast<double>(a[x]), bx = static_cast<double>(b[x]);
                        if (ax == bx || (std::isnan(ax) && std::isnan(bx))) continue;
                        return "dq" + index_string(c, x, c.Dk) + " of a query that reads no key from " +
                               std::to_string(cut) + " on changed from " + num(ax) + " to " + num(bx) +
                               " when those keys and values changed";
                    }
                }
            return std::nullopt;
        });
    };
    return p;
}

}  // namespace attn::suite
